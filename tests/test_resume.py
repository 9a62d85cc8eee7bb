"""Exact resume: a worker killed with SIGKILL after a checkpoint and resumed ends
exactly where an uninterrupted run ends: weights, optimizer state, later metrics."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import patience
import pytest
import torch

from gridrun.runs import layout, records, runlog, states
from gridrun.spec import TRAINER_KEYS, RunSpec, write_run_config
from gridrun.train import checkpoint
from gridrun.train.loop.trainer import train

TIMING = records.TIMING  # what differs between identical replays


def make_run(tmp_path: Path, name: str, task_args: dict, **trainer) -> tuple[RunSpec, Path]:
    cfg = {k: key.default for k, key in TRAINER_KEYS.items()}
    cfg.update(epochs=3, batch_size=32, lr=3e-3, log_every=2, warmup=0.1)
    cfg.update(trainer)
    run = RunSpec(id=name, experiment="resume", variant="", seed=3, task="helper_tasks:slow",
                  trainer=cfg, task_args=task_args, axes={})
    run_dir = layout.make_private_dir(tmp_path / name)
    write_run_config(run_dir / layout.CONFIG, run)
    return run, run_dir


def metrics_without_timing(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING}
            for r in runlog.read_all(run_dir / layout.METRICS)]


def start_worker(run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gridrun.train.worker", str(run_dir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_for_checkpoint(proc: subprocess.Popen, run_dir: Path, min_step: int, timeout=60.0) -> int:
    path = run_dir / layout.CHECKPOINTS / "last.pt"
    deadline = patience.Deadline(timeout)
    while not deadline.passed():
        if proc.poll() is not None:
            pytest.fail(f"worker ended early ({proc.returncode}): {proc.stderr.read().decode()}")
        # None: last.pt was renamed to prev.pt between the look and the read (a save
        # keeps the previous one), the new one not yet in place: look again
        saved = checkpoint.load(path) if path.exists() else None
        if saved is not None and saved["step"] >= min_step:
            return saved["step"]
        time.sleep(0.01)
    proc.kill()
    pytest.fail("no checkpoint in time")


def assert_same_end(a: Path, b: Path) -> None:
    ca = checkpoint.load(a / layout.CHECKPOINTS / "last.pt")
    cb = checkpoint.load(b / layout.CHECKPOINTS / "last.pt")
    for key in ca["model"]:
        assert torch.equal(ca["model"][key], cb["model"][key]), key
    for sa, sb in zip(ca["optimizer"]["state"].values(), cb["optimizer"]["state"].values(), strict=True):
        for key in sa:
            assert torch.equal(sa[key], sb[key]), key
    assert (ca["step"], ca["epoch"]) == (cb["step"], cb["epoch"])
    assert metrics_without_timing(a) == metrics_without_timing(b)


CASES = {
    # name: (task args, trainer keys, kill once a checkpoint reaches this step)
    "epoch-end": ({"step_sleep": 0.03, "train_size": 512, "val_size": 128}, {}, 16),
    "mid-epoch": ({"step_sleep": 0.03, "train_size": 512, "val_size": 128}, {"checkpoint_every": 5}, 5),
    # step 15 of a 16-step epoch: only the last batch of the epoch is left
    "last-batch": ({"step_sleep": 0.03, "train_size": 512, "val_size": 128}, {"checkpoint_every": 15}, 15),
    "workers": ({"step_sleep": 0.03, "train_size": 512, "val_size": 128},
                {"checkpoint_every": 5, "num_workers": 2}, 5),
    "bf16": ({"step_sleep": 0.03, "train_size": 512, "val_size": 128},
             {"checkpoint_every": 5, "precision": "bf16"}, 5),
    "shapes": ({"inner_task": "shapes", "step_sleep": 0.03, "train_size": 256, "val_size": 64},
               {"checkpoint_every": 3}, 3),
    "accumulate": ({"step_sleep": 0.02, "train_size": 512, "val_size": 128},
                   {"checkpoint_every": 3, "batch_size": 16, "accumulate": 2}, 3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sigkill_then_resume_matches_uninterrupted(tmp_path, case):
    task_args, trainer, kill_at = CASES[case]
    # sleeping changes nothing but timing, so the reference run need not sleep
    run, straight = make_run(tmp_path, "straight", {**task_args, "step_sleep": 0.0}, **trainer)
    assert train(run, straight, log=lambda s: None)["status"] == states.COMPLETED

    run, killed = make_run(tmp_path, "killed", task_args, **trainer)
    proc = start_worker(killed)
    step = wait_for_checkpoint(proc, killed, kill_at)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    summary = train(run, killed, log=lambda s: None)
    assert summary["status"] == states.COMPLETED
    assert summary["resumed_from_step"] >= step
    assert summary["resumed_from_step"] < summary["total_steps"]
    assert_same_end(straight, killed)


def test_sigterm_checkpoints_and_exits_interrupted_then_resumes(tmp_path):
    task_args = {"step_sleep": 0.03, "train_size": 512, "val_size": 128}
    run, straight = make_run(tmp_path, "straight", {**task_args, "step_sleep": 0.0})
    train(run, straight, log=lambda s: None)
    run, stopped = make_run(tmp_path, "stopped", task_args, checkpoint_every=4)
    proc = start_worker(stopped)
    wait_for_checkpoint(proc, stopped, 4)
    proc.send_signal(signal.SIGTERM)
    assert patience.wait(proc, 30) == states.EXIT_CODES[states.INTERRUPTED]
    import json

    summary = json.loads((stopped / layout.SUMMARY).read_text())
    assert summary["status"] == states.INTERRUPTED
    assert train(run, stopped, log=lambda s: None)["status"] == states.COMPLETED
    assert_same_end(straight, stopped)
