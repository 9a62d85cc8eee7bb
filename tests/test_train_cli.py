"""`gridrun train`: one cell in the foreground, resumable, with telling exit codes."""

import json

import pytest
from typer.testing import CliRunner

from gridrun.cli import app

ONE_RUN = """
[experiments.solo]
task = "spirals"
train_size = 256
val_size = 64
epochs = 2
batch_size = 32
"""

TWO_SEEDS = ONE_RUN + "seeds = 2\n"


def test_train_runs_the_only_cell_and_resumes(tmp_path):
    file = tmp_path / "exp.toml"
    file.write_text(ONE_RUN)
    root = tmp_path / "runs"
    result = CliRunner().invoke(app, ["train", str(file), "--root", str(root)])
    assert result.exit_code == 0, result.output
    (run_dir,) = (root / "solo").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["step"] == summary["total_steps"] == 14
    assert (run_dir / "config.toml").exists() and (run_dir / "checkpoints" / "last.pt").exists()
    before = (run_dir / "summary.json").read_bytes()
    again = CliRunner().invoke(app, ["train", str(file), "--root", str(root)])
    # a completed cell trained again keeps what it recorded, timings included (issue 24)
    assert again.exit_code == 0 and "completed before" in again.output, again.output
    assert (run_dir / "summary.json").read_bytes() == before
    fresh = CliRunner().invoke(app, ["train", str(file), "--root", str(root), "--fresh"])
    assert fresh.exit_code == 0 and "resumed" not in fresh.output


def test_runs_get_expandable_cuda_segments_unless_the_user_chose(tmp_path, monkeypatch):
    # a GPU check found an OOM retry at half the batch failing on a fragmented cache
    file = tmp_path / "exp.toml"
    file.write_text(ONE_RUN.replace("epochs = 2", "epochs = 1"))
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    root = tmp_path / "a"
    assert CliRunner().invoke(app, ["train", str(file), "--root", str(root)]).exit_code == 0
    (run_dir,) = (root / "solo").iterdir()
    env = json.loads((run_dir / "summary.json").read_text())["environment"]
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    root = tmp_path / "b"
    assert CliRunner().invoke(app, ["train", str(file), "--root", str(root)]).exit_code == 0
    (run_dir,) = (root / "solo").iterdir()
    env = json.loads((run_dir / "summary.json").read_text())["environment"]
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64"


def test_train_needs_a_run_when_the_file_has_several(tmp_path):
    file = tmp_path / "exp.toml"
    file.write_text(TWO_SEEDS)
    result = CliRunner().invoke(app, ["train", str(file), "--root", str(tmp_path / "r")])
    assert result.exit_code == 2 and "has 2 runs" in result.output
    result = CliRunner().invoke(app, ["train", str(file), "nope", "--root", str(tmp_path / "r")])
    assert result.exit_code == 2 and "no run of the file" in result.output
    assert not (tmp_path / "r").exists()


def test_diverged_run_exits_3(tmp_path):
    file = tmp_path / "exp.toml"
    file.write_text(ONE_RUN + 'optimizer = "sgd"\nlr = 1e6\nwarmup = 0\nschedule = "constant"\n')
    with pytest.warns(UserWarning, match="Error detected in"):  # the divergence replay, in anomaly mode
        result = CliRunner().invoke(app, ["train", str(file), "--root", str(tmp_path / "r")])
    assert result.exit_code == 3, result.output
    assert "diverged" in result.output


def test_train_never_writes_through_a_symlink_in_the_root(tmp_path):
    file = tmp_path / "exp.toml"
    file.write_text(ONE_RUN)
    root = tmp_path / "runs"
    root.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "solo").symlink_to(elsewhere)
    result = CliRunner().invoke(app, ["train", str(file), "--root", str(root)])
    assert result.exit_code == 2, result.output
    assert f"{root / 'solo'} is a symlink" in result.stderr
    assert list(elsewhere.iterdir()) == []  # nothing written through it
