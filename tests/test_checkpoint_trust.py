"""Checkpoints that can be trusted: the previous good checkpoint is kept until
the new one is durable; a damaged last.pt is named in one line and the run
falls back to prev.pt (and resumes exactly from it); if nothing loads it starts
over with a warning; leftover temporaries are removed; `retry --fresh`."""

from __future__ import annotations

import json
import signal

import pytest
import torch
from test_resume import assert_same_end, make_run, start_worker, wait_for_checkpoint

from gridrun.runs import layout, states
from gridrun.train import checkpoint
from gridrun.train.loop.trainer import train

TASK = {"step_sleep": 0.03, "train_size": 512, "val_size": 128}
TRAINER = {"checkpoint_every": 3}


def killed_run(tmp_path, name="killed"):
    """A run SIGKILLed once its last.pt is at step >= 6 (so prev.pt holds an earlier one)."""
    run, run_dir = make_run(tmp_path, name, TASK, **TRAINER)
    proc = start_worker(run_dir)
    wait_for_checkpoint(proc, run_dir, 6)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return run, run_dir


@pytest.fixture
def straight(tmp_path):
    run, run_dir = make_run(tmp_path, "straight", {**TASK, "step_sleep": 0.0}, **TRAINER)
    assert train(run, run_dir, log=lambda s: None)["status"] == states.COMPLETED
    return run_dir


def test_save_keeps_the_previous_checkpoint(tmp_path):
    for step in (1, 2, 3):
        checkpoint.save({"step": step}, tmp_path / "last.pt", keep_previous=True)
    assert checkpoint.load(tmp_path / "last.pt")["step"] == 3
    assert checkpoint.load(tmp_path / "prev.pt")["step"] == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "missing-keys"])
def test_damaged_last_falls_back_to_prev_and_resumes_exactly(tmp_path, straight, damage):
    run, run_dir = killed_run(tmp_path)
    ckpt = run_dir / layout.CHECKPOINTS
    prev_step = checkpoint.load(ckpt / "prev.pt")["step"]
    last = ckpt / "last.pt"
    if damage == "garbage":
        last.write_bytes(b"\x00not a checkpoint" * 100)
    elif damage == "truncated":
        data = last.read_bytes()
        last.write_bytes(data[: len(data) // 2])
    else:
        checkpoint.save({"step": 99}, last)
    lines: list[str] = []
    summary = train(run, run_dir, log=lines.append)
    assert summary["status"] == states.COMPLETED, summary["error"]
    assert summary["resumed_from_step"] == prev_step
    warning = next(w for w in summary["warnings"] if "last.pt" in w)
    assert "\n" not in warning and "prev.pt" in warning
    assert "weights_only=False" not in warning  # torch's advice to load untrusted pickles
    assert any("last.pt" in line for line in lines)
    # the damaged file is kept aside, never rotated into prev.pt by the next save
    assert (ckpt / "last.pt.damaged").exists() and "last.pt.damaged" in warning
    assert checkpoint.load(ckpt / "prev.pt") is not None
    assert_same_end(straight, run_dir)


def test_nothing_loads_starts_over_with_a_warning(tmp_path, straight):
    run, run_dir = killed_run(tmp_path)
    ckpt = run_dir / layout.CHECKPOINTS
    for name in ("last.pt", "prev.pt"):
        (ckpt / name).write_bytes(b"garbage")
    summary = train(run, run_dir, log=lambda s: None)
    assert summary["status"] == states.COMPLETED
    assert summary["resumed_from_step"] is None
    assert any("starting over" in w for w in summary["warnings"])
    assert_same_end(straight, run_dir)  # from scratch is deterministic too


def test_leftover_temporaries_are_removed_at_start(tmp_path):
    run, run_dir = make_run(tmp_path, "tmp", {**TASK, "step_sleep": 0.0}, epochs=1)
    ckpt = layout.make_private_dir(run_dir / layout.CHECKPOINTS)
    leftover = ckpt / ".last.pt.abc123.tmp"
    leftover.write_bytes(b"half a checkpoint")
    assert train(run, run_dir, log=lambda s: None)["status"] == states.COMPLETED
    assert not leftover.exists()


def test_fresh_discards_old_checkpoints(tmp_path):
    run, run_dir = killed_run(tmp_path)
    summary = train(run, run_dir, fresh=True, log=lambda s: None)
    assert summary["resumed_from_step"] is None
    # prev.pt now holds this attempt's checkpoint, never the old attempt's
    prev = checkpoint.load(run_dir / layout.CHECKPOINTS / "prev.pt")
    assert prev["step"] < summary["step"]
    assert (torch.load(run_dir / layout.CHECKPOINTS / "last.pt", weights_only=True)["step"]
            == summary["step"])


def test_retry_fresh_from_the_cli(tmp_path):
    from typer.testing import CliRunner

    from gridrun.cli import app
    from gridrun.runs.store import Store
    from gridrun.spec import load_runs

    file = tmp_path / "e.toml"
    file.write_text('[experiments.a]\ntask = "spirals"\nepochs = 1\n')
    root = tmp_path / "runs"
    [spec] = load_runs(file)
    with Store(root) as store:
        store.enqueue([spec])
        store.transition(spec.id, states.QUEUED, states.RUNNING)
        store.transition(spec.id, states.RUNNING, states.FAILED, error="x")
    result = CliRunner().invoke(app, ["retry", "--fresh", spec.id, "--root", str(root)])
    assert result.exit_code == 0, result.output
    assert "from scratch" in result.output
    with Store(root) as store:
        run = store.get_run(spec.id)
        assert run.status == states.QUEUED and run.fresh
    json.dumps(run.to_dict(), default=str)


def test_a_plain_retry_keeps_a_pending_fresh_start(tmp_path):
    """retry --fresh, cancel before it launched, retry: it still starts over."""
    from gridrun.runs.store import Store
    from gridrun.spec import load_runs

    file = tmp_path / "e.toml"
    file.write_text('[experiments.a]\ntask = "spirals"\nepochs = 1\n')
    [spec] = load_runs(file)
    with Store(tmp_path / "runs") as store:
        store.enqueue([spec])
        store.transition(spec.id, states.QUEUED, states.RUNNING)
        store.transition(spec.id, states.RUNNING, states.FAILED, error="x")
        store.retry([spec.id], fresh=True)
        store.cancel([spec.id])
        assert store.retry([spec.id]) == {spec.id: "queued"}
        assert store.get_run(spec.id).fresh
