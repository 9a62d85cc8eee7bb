"""`export -o` writes atomically, never over an existing file without --force and never
through a symlink; refused `cancel`/`retry` exit 2 while the valid ones still apply."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from test_analysis import make_run
from test_engine_kit import make_run as make_spec
from typer.testing import CliRunner

from gridrun.analysis import export
from gridrun.cli import app
from gridrun.runs import states
from gridrun.runs.store import Store


def gridrun(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture
def root(tmp_path):
    for seed in range(2):
        make_run(tmp_path / "runs", "e", seed, best={"loss": 0.3 + seed, "accuracy": 0.9})
    return tmp_path / "runs"


@pytest.mark.parametrize("what", ["runs", "ablation", "metrics"])
def test_export_refuses_an_existing_file_without_force(tmp_path, root, what):
    out = tmp_path / "out.csv"
    out.write_text("precious\n")
    code, text = gridrun("export", "--what", what, "-o", out, "--root", root)
    assert code == 2 and f"{out} exists; add --force to replace it" in text
    assert out.read_text() == "precious\n"
    code, text = gridrun("export", "--what", what, "-o", out, "--force", "--root", root)
    assert code == 0 and out.read_text() != "precious\n"
    assert sorted(os.listdir(tmp_path)) == ["out.csv", "runs"]  # no temporary left


@pytest.mark.parametrize("what", ["runs", "metrics"])
def test_export_never_writes_through_a_symlink(tmp_path, root, what):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "out.csv"
    link.symlink_to(victim)
    for extra in ([], ["--force"]):
        code, text = gridrun("export", "--what", what, "-o", link, *extra, "--root", root)
        assert code == 2 and text.strip().startswith(f"refusing to write {link}: it is a symbolic link")
    assert victim.read_text() == "precious\n" and link.is_symlink()
    dangling = tmp_path / "dangling.csv"
    dangling.symlink_to(tmp_path / "nowhere.csv")
    code, text = gridrun("export", "-o", dangling, "--root", root)
    assert code == 2 and not (tmp_path / "nowhere.csv").exists()


def test_an_export_killed_midway_leaves_no_half_file(tmp_path, monkeypatch):
    out = tmp_path / "out.csv"
    frame = pd.DataFrame({"a": range(100_000)})
    real = pd.DataFrame.to_csv

    def dies_midway(self, target, *args, **kwargs):
        f = open(target, "w") if isinstance(target, str | os.PathLike) else target  # noqa: SIM115
        f.write("a\n0\n1\n")  # what a killed writer leaves behind
        f.flush()
        raise KeyboardInterrupt
    monkeypatch.setattr(pd.DataFrame, "to_csv", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        export.write_frame(frame, out)
    assert os.listdir(tmp_path) == []
    out.write_text("old\n")
    with pytest.raises(KeyboardInterrupt):
        export.write_frame(frame, out, force=True)
    assert out.read_text() == "old\n" and os.listdir(tmp_path) == ["out.csv"]
    monkeypatch.setattr(pd.DataFrame, "to_csv", real)
    assert export.write_frame(frame, out, force=True) == 100_000
    assert out.read_text().count("\n") == 100_001 and os.listdir(tmp_path) == ["out.csv"]


def test_refused_cancel_and_retry_exit_2_and_apply_the_rest(tmp_path):
    root = tmp_path / "runs"
    specs = [make_spec(seed=s) for s in range(3)]
    with Store(root) as store:
        store.enqueue(specs)
        store.cancel([specs[2].id])
    a, b, c = (s.id for s in specs)
    code, text = gridrun("cancel", a, "zzz", b[:6], "--root", root)
    assert code == 2
    assert f"{a}: cancelled" in text and f"{b}: cancelled" in text
    assert "zzz: no run matches 'zzz'" in text
    code, text = gridrun("cancel", a, "--root", root)  # already ended
    assert code == 2 and f"{a}: not cancelled: it is cancelled" in text
    code, text = gridrun("retry", c, "zzz", "--root", root)
    assert code == 2 and f"{c}: queued" in text and "zzz: no run matches" in text
    code, text = gridrun("retry", c, "--root", root)  # queued: nothing to retry
    assert code == 2 and f"{c}: not retried: it is queued" in text
    with Store(root) as store:
        assert {r.id: r.status for r in store.list_runs()} == {
            a: states.CANCELLED, b: states.CANCELLED, c: states.QUEUED}
    code, text = gridrun("cancel", c, "--root", root)
    assert code == 0 and f"{c}: cancelled" in text
