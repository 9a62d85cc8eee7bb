"""`--root` everywhere: a command's own `--root`, else `gridrun --root DIR CMD`,
else $GRIDRUN_ROOT, else ./runs."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gridrun.cli import app

ONE_RUN = """
[experiments.solo]
task = "spirals"
train_size = 64
val_size = 32
epochs = 1
batch_size = 32
"""


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GRIDRUN_ROOT", raising=False)
    return tmp_path


def test_top_level_root_reaches_train_and_ls(here):
    (here / "exp.toml").write_text(ONE_RUN)
    result = CliRunner().invoke(app, ["--root", "x", "train", "exp.toml"])
    assert result.exit_code == 0, result.output
    assert (here / "x" / "solo").is_dir() and not (here / "runs").exists()
    listed = CliRunner().invoke(app, ["--root", "x", "ls", "--json"])
    assert [r["status"] for r in json.loads(listed.output)] == ["completed"]
    nested = CliRunner().invoke(app, ["--root", "x", "engine", "status"])  # a group's command too
    assert nested.exit_code == 0 and "root x" in nested.output


def test_gridrun_root_variable_and_who_wins(here):
    runner = CliRunner()
    # a reader creates nothing (issue 24): the roots exist first
    assert runner.invoke(app, ["ls"], env={"GRIDRUN_ROOT": "y"}).output == "no such root: y\n"
    assert not (here / "y").exists()
    for name in ("y", "z", "w", "runs"):
        (here / name).mkdir(mode=0o700)
    assert runner.invoke(app, ["ls"], env={"GRIDRUN_ROOT": "y"}).exit_code == 0
    assert not (here / "y" / "gridrun.db").exists()
    # the top-level option beats the variable; a command's own option beats both
    out = runner.invoke(app, ["--root", "z", "engine", "status"], env={"GRIDRUN_ROOT": "y"})
    assert "root z" in out.output
    out = runner.invoke(app, ["--root", "z", "engine", "status", "--root", "w"],
                        env={"GRIDRUN_ROOT": "y"})
    assert "root w" in out.output
    assert "root runs" in runner.invoke(app, ["engine", "status"]).output
