"""Readers never follow a link inside a root (issue 24, finding 4): whoever can write
in a run folder must not make another user's gridrun read and print a file that
user can read. A link is said in one line and skipped; `doctor` flags it."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from gridrun.checks import verdict
from gridrun.cli import app
from gridrun.runs import layout, nofollow, outputlog, runlog

ONE_RUN = """
[experiments.solo]
task = "spirals"
train_size = 64
val_size = 32
epochs = 1
batch_size = 32
"""
SECRET = "root:$6$not-for-your-eyes:19000:0:99999:7:::"


def gridrun(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A root with one completed run (trained once for the module), copied per test."""
    base = tmp_path_factory.mktemp("trained")
    (base / "exp.toml").write_text(ONE_RUN)
    code, out = gridrun("train", str(base / "exp.toml"), "--root", str(base / "runs"))
    assert code == 0, out
    return base / "runs"


@pytest.fixture
def root(trained, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(trained, root, symlinks=True)
    return root


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "shadow"
    path.write_text("\n".join([SECRET] * 27) + "\n")
    return path


def run_dir(root):
    (folder,) = (root / "solo").iterdir()
    return folder


def test_logs_through_a_linked_output_log_prints_no_byte_of_the_target(root, secret):
    folder = run_dir(root)
    (folder / layout.OUTPUT).unlink(missing_ok=True)
    (folder / layout.OUTPUT).symlink_to(secret)
    for follow in ([], ["-f"]):
        code, out = gridrun("logs", folder.name, "--root", str(root), *follow)
        assert code == 2 and "is a symbolic link" in out, out
        assert SECRET not in out and "not-for-your-eyes" not in out
        assert len(out.strip().splitlines()) == 1


def test_logs_through_a_linked_run_folder_prints_nothing_of_it(root, tmp_path, secret):
    folder = run_dir(root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / layout.OUTPUT).write_text(SECRET + "\n")
    shutil.rmtree(folder)
    folder.symlink_to(elsewhere)
    code, out = gridrun("logs", folder.name, "--root", str(root))
    assert code == 2 and "is a symbolic link" in out and SECRET not in out, out


def test_export_of_a_linked_metrics_log_reads_none_of_it(root, tmp_path, secret):
    folder = run_dir(root)
    (folder / layout.METRICS).unlink()
    (folder / layout.METRICS).symlink_to(secret)
    out_csv = tmp_path / "m.csv"
    code, out = gridrun("export", "--what", "metrics", "-o", str(out_csv), "--root", str(root))
    assert code == 0, out
    assert "is a symbolic link" in out and "unreadable line" not in out, out
    assert out.count("symbolic link") == 1
    assert "not-for-your-eyes" not in out_csv.read_text()
    assert "wrote 0 rows" in out


def test_compare_notes_a_linked_metrics_log_of_a_live_run_once(root, secret):
    folder = run_dir(root)
    (folder / layout.SUMMARY).unlink()  # as if it still ran: read from its metrics log
    (folder / layout.METRICS).unlink()
    (folder / layout.METRICS).symlink_to(secret)
    from gridrun.analysis import frames

    rows = frames.run_rows(root)  # from the folders
    assert any("is a symbolic link" in n for n in rows.attrs["notes"])
    assert not any("unreadable line" in n for n in rows.attrs["notes"])


def test_the_readers_themselves_refuse_links(root, secret):
    folder = run_dir(root)
    for name in (layout.METRICS, layout.SUMMARY, layout.VERIFY):
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(secret)
    got = runlog.read(folder / layout.METRICS)
    assert got.records == [] and got.skipped == 0 and "symbolic link" in got.refused
    assert runlog.read_summary(folder / layout.SUMMARY) is None
    assert verdict.read(folder) is None
    with pytest.raises(layout.UnsafePath, match="symbolic link"):
        list(runlog.iter_chunks(folder / layout.METRICS))
    (folder / layout.OUTPUT).unlink(missing_ok=True)
    (folder / layout.OUTPUT).symlink_to(secret)
    with pytest.raises(layout.UnsafePath):
        outputlog.tail_lines(folder / layout.OUTPUT, 5)
    assert outputlog.output_tail(folder) == ""
    from gridrun.tui.store_source import StoreSource

    source = StoreSource(root)
    try:
        shown = source.output_tail(folder.name)
        assert "symbolic link" in shown and SECRET not in shown
    finally:
        source.store.close()


def test_a_fifo_in_a_run_folder_never_blocks_a_reader(root):
    folder = run_dir(root)
    (folder / layout.METRICS).unlink()
    os.mkfifo(folder / layout.METRICS)
    with pytest.raises(layout.UnsafePath, match="not a regular file"):
        nofollow.read_bytes(folder / layout.METRICS)
    assert "not a regular file" in runlog.read(folder / layout.METRICS).refused


def test_doctor_still_flags_the_links(root, secret):
    folder = run_dir(root)
    (folder / layout.OUTPUT).unlink(missing_ok=True)
    (folder / layout.OUTPUT).symlink_to(secret)
    _code, out = gridrun("doctor", "--root", str(root), "--json")
    checks = {c["check"]: c for c in json.loads(out[out.index("["):])}
    assert checks["root"]["status"] == "FAIL" and "symlink" in checks["root"]["message"]
