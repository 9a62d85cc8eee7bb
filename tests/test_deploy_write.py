"""`export-model -o` writes its three files (the model, model.json, parity.json) by the one
rule of userfiles.py: an existing file replaced only with --force, and then whole or not
at all; never through a link nor into a system folder; a refusal changes nothing, and the
three are checked before anything is exported. The default output, inside the run's own
export folder, is replaced on a re-export as it always was."""

from __future__ import annotations

import os
import shutil

import pytest
from test_deploy import invoke, make_run
from tmpfs_kit import fill, mounted

NAMES = ("model.json", "model.pt2", "parity.json")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("root"), "spirals", "written")


def export(folder, out, *extra):
    result = invoke("export-model", str(folder), "--format", "pt2", "--batches", "1",
                    "-o", str(out), *extra)
    return result.exit_code, result.output


def test_an_existing_file_is_replaced_only_with_force(folder, tmp_path):
    out = tmp_path / "model.pt2"
    out.write_bytes(b"mine")
    code, text = export(folder, out)
    assert code == 2 and text.strip() == f"{out} exists; add --force to replace it"
    assert out.read_bytes() == b"mine" and os.listdir(tmp_path) == ["model.pt2"]  # nothing beside
    code, text = export(folder, out, "--force")
    assert code == 0, text
    assert out.read_bytes() != b"mine" and sorted(os.listdir(tmp_path)) == list(NAMES)


def test_the_files_beside_the_model_are_checked_before_exporting(folder, tmp_path):
    (tmp_path / "model.json").write_text("{}")  # another export's card
    code, text = export(folder, tmp_path / "other.pt2")
    assert code == 2 and text.strip() == f"{tmp_path / 'model.json'} exists; add --force to replace it"
    assert os.listdir(tmp_path) == ["model.json"] and (tmp_path / "model.json").read_text() == "{}"


def test_a_link_is_refused_even_with_force(folder, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    link = tmp_path / "model.pt2"
    link.symlink_to(victim)
    beside = tmp_path / "beside"
    beside.mkdir()
    (beside / "parity.json").symlink_to(victim)
    for out in (link, beside / "model.pt2"):
        for extra in ([], ["--force"]):
            code, text = export(folder, out, *extra)
            assert code == 2 and "symbolic link" in text, text
            assert len(text.strip().splitlines()) == 1 and "Traceback" not in text
    assert victim.read_bytes() == b"precious" and link.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["beside", "model.pt2", "victim"]
    assert os.listdir(beside) == ["parity.json"]


@pytest.mark.parametrize("where", ["/etc/gridrun-export-test/model.pt2",
                                   "/usr/gridrun-export-test.pt2", "/model.pt2"])
def test_a_system_folder_is_never_written(folder, where):
    made = [where, *(os.path.join(os.path.dirname(where), n) for n in ("model.json", "parity.json"))]
    existed = {p for p in made if os.path.lexists(p)}
    try:
        code, text = export(folder, where, "--force")
        assert code == 2 and "system folder" in text, text
        assert len(text.strip().splitlines()) == 1
        assert {p for p in made if os.path.lexists(p)} == existed
        assert not os.path.lexists("/etc/gridrun-export-test")  # nor a folder made there
    finally:  # what an unfixed gridrun wrote
        for p in set(made) - existed:
            if os.path.lexists(p):
                os.unlink(p)
        shutil.rmtree("/etc/gridrun-export-test", ignore_errors=True)


def test_a_full_disk_leaves_the_old_files_whole_and_says_so_in_one_line(folder, tmp_path):
    with mounted(tmp_path / "small", "2m") as small:
        old = {name: f"the old {name}\n".encode() * 100 for name in NAMES}
        for name, data in old.items():
            (small / name).write_bytes(data)
        fill(small)
        code, text = export(folder, small / "model.pt2", "--force")
        assert code == 2 and "Traceback" not in text, text
        last = text.strip().splitlines()[-1]
        assert last.startswith(f"cannot write {small}/") and "the disk is full" in last, text
        assert {n: (small / n).read_bytes() for n in NAMES} == old
        assert sorted(os.listdir(small)) == ["filler", *NAMES]  # no temporary left


def test_the_default_output_is_replaced_on_a_re_export(folder):
    for _ in range(2):
        result = invoke("export-model", str(folder), "--format", "pt2", "--batches", "1")
        assert result.exit_code == 0, result.output
    assert sorted(os.listdir(folder / "export" / "best")) == list(NAMES)
