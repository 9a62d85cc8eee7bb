"""Shared helpers for the engine, daemon and backend tests (no tests here).

Runs are built directly as RunSpecs with tiny data so a whole queue trains in
seconds on a shared CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import patience

from gridrun.runs import layout, records, runlog, states
from gridrun.spec import TRAINER_KEYS, RunSpec, run_id, write_run_config

TIMING_KEYS = records.TIMING
TINY = {"train_size": 256, "val_size": 64, "hidden": 16, "depth": 1}


def make_run(task: str = "spirals", seed: int = 0, experiment: str = "e", variant: str = "",
             task_args: dict | None = None, **trainer) -> RunSpec:
    resolved = {k: key.default for k, key in TRAINER_KEYS.items()}
    resolved.update({"epochs": 2, "batch_size": 64, "log_every": 2, **trainer})
    if task_args is None:
        task_args = dict(TINY) if task in ("spirals", "helper_tasks:slow_spirals") else {}
    rid = run_id(experiment, task, resolved, task_args, seed)
    return RunSpec(rid, experiment, variant or f"{task} s{seed}", seed, task, resolved, task_args, {})


def slow_run(seed: int = 0, sleep: float = 0.02, epochs: int = 3, **trainer) -> RunSpec:
    """About 8 steps an epoch at `sleep` s a step; checkpoints every 2 steps."""
    return make_run("helper_tasks:slow_spirals", seed, epochs=epochs, checkpoint_every=2,
                    task_args={**TINY, "step_sleep": sleep}, **trainer)


def metrics_without_timing(root: Path, run: RunSpec) -> list[dict]:
    path = layout.run_dir(root, run.experiment, run.id) / layout.METRICS
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in runlog.read_all(path)]


def summary(root: Path, run: RunSpec) -> dict:
    return json.loads((layout.run_dir(root, run.experiment, run.id) / layout.SUMMARY).read_text())


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.05):
    """`predicate()` once true; `timeout` is in quiet seconds (tests/patience.py): a busy
    machine stretches it, so only a hang fails."""
    return patience.wait_for(predicate, timeout, interval)


def drain(engine, timeout: float = 120.0) -> None:
    """Step an in-process engine until nothing is queued or running (`timeout` in quiet
    seconds: a guard against a hang, never a race with a loaded machine)."""
    deadline = patience.Deadline(timeout)
    while not engine.idle():
        assert not deadline.passed(), f"the queue did not drain in {deadline}"
        engine.step()


def kill_quietly(pid: int | None, sig: int = signal.SIGKILL) -> None:
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def finished(store, ids) -> bool:
    return all(r.status in states.FINISHED for r in store.list_runs(ids=ids))


def prepare(root, run: RunSpec) -> Path:
    """A run folder with its config.toml, as the engine writes it before a launch."""
    run_dir = layout.make_private_dir(layout.run_dir(root, run.experiment, run.id))
    write_run_config(run_dir / layout.CONFIG, run)
    return run_dir


def wait_exit(backend, timeout: float = 90.0) -> list:
    """The first events a backend reports: some run ended (`timeout` in quiet seconds)."""
    deadline = patience.Deadline(timeout)
    while not deadline.passed():
        events = backend.poll(0.2)
        if events:
            return events
    raise AssertionError(f"no run ended in {deadline}")


def engine_for(root, backend, slots: int = 2, **kw):
    """An in-process engine on `slots` CPU slots, retrying fast."""
    from gridrun.engine.backends.base import Slot
    from gridrun.engine.scheduler import Engine

    return Engine(root, backend, [Slot(f"cpu{i}") for i in range(slots)], backoff=0.05, **kw)
