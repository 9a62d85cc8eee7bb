"""Random streams follow the data, not the process: a task that augments with
python's, NumPy's and torch's global RNGs gets the same numbers whatever
num_workers, persistent_workers or prefetch_factor are, and wherever a resume
started (SIGKILL and SIGTERM mid-epoch, with workers)."""

from __future__ import annotations

import json
import signal

import patience
import pytest
import torch
from test_resume import (
    assert_same_end,
    make_run,
    metrics_without_timing,
    start_worker,
    wait_for_checkpoint,
)

from gridrun.runs import layout, states
from gridrun.train import checkpoint
from gridrun.train.loop.trainer import train

TASK_ARGS = {"inner_task": "helper_tasks:augmented", "step_sleep": 0.0, "train_size": 256,
             "val_size": 64}
LOADERS = {
    "w0": {"num_workers": 0},
    "w1": {"num_workers": 1},
    "w3": {"num_workers": 3},
    "w3-persistent": {"num_workers": 3, "persistent_workers": True},
    "w1-persistent-prefetch5": {"num_workers": 1, "persistent_workers": True, "prefetch_factor": 5},
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run, run_dir = make_run(tmp_path_factory.mktemp("ref"), "ref", TASK_ARGS, epochs=2,
                            batch_size=16)
    assert train(run, run_dir, log=lambda s: None)["status"] == states.COMPLETED
    return run_dir


# 3 workers on a machine with fewer cores: torch warns (on this 2-core machine, not on CI's)
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("loader", [k for k in LOADERS if k != "w0"])
def test_loader_settings_never_change_results(tmp_path, reference, loader):
    run, run_dir = make_run(tmp_path, loader, TASK_ARGS, epochs=2, batch_size=16, **LOADERS[loader])
    assert train(run, run_dir, log=lambda s: None)["status"] == states.COMPLETED
    assert_same_end(reference, run_dir)


def test_augmentation_differs_between_epochs_and_seeds(tmp_path):
    """The streams are per batch, not one fixed view: epochs and seeds see other draws."""
    from helper_tasks import augmented

    from gridrun.train.data import start_epoch, train_loader

    cfg = {"batch_size": 16, "num_workers": 0, "pin_memory": False, "prefetch_factor": 2,
           "persistent_workers": False}
    task = augmented()
    batches = {}
    for seed in (0, 1):
        loader = train_loader(task.train_data, cfg, seed=seed, collate_fn=task.collate_fn, cuda=False)
        for epoch in (0, 1):
            start_epoch(loader, seed, epoch, 0)
            batches[seed, epoch] = next(iter(loader))["x"]
    assert not torch.equal(batches[0, 0], batches[0, 1])
    assert not torch.equal(batches[0, 0], batches[1, 0])
    # the same (seed, epoch) gives the same batch again
    loader = train_loader(task.train_data, cfg, seed=0, collate_fn=task.collate_fn, cuda=False)
    start_epoch(loader, 0, 1, 0)
    assert torch.equal(next(iter(loader))["x"], batches[0, 1])


def test_fetching_a_batch_leaves_the_main_stream_alone():
    """Dropout draws from the main stream; fetching batches in the main process
    (num_workers = 0) must not move it."""
    import random

    import numpy as np
    from helper_tasks import augmented

    from gridrun.train.data import start_epoch, train_loader

    cfg = {"batch_size": 16, "num_workers": 0, "pin_memory": False, "prefetch_factor": 2,
           "persistent_workers": False}
    task = augmented()
    loader = train_loader(task.train_data, cfg, seed=0, collate_fn=task.collate_fn, cuda=False)
    start_epoch(loader, 0, 0, 0)
    torch.manual_seed(5), np.random.seed(5), random.seed(5)
    for _ in loader:
        pass
    after = (torch.rand(1).item(), np.random.rand(), random.random())
    torch.manual_seed(5), np.random.seed(5), random.seed(5)
    assert after == (torch.rand(1).item(), np.random.rand(), random.random())


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_mid_epoch_stop_with_workers_resumes_exactly(tmp_path, how):
    trainer = {"epochs": 2, "batch_size": 16, "checkpoint_every": 5, "num_workers": 2}
    run, straight = make_run(tmp_path, "straight", TASK_ARGS, **trainer)
    assert train(run, straight, log=lambda s: None)["status"] == states.COMPLETED

    run, stopped = make_run(tmp_path, "stopped", {**TASK_ARGS, "step_sleep": 0.03}, **trainer)
    proc = start_worker(stopped)
    step = wait_for_checkpoint(proc, stopped, 5)
    if how == "sigkill":
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    else:
        proc.send_signal(signal.SIGTERM)
        assert patience.wait(proc, 30) == states.EXIT_CODES[states.INTERRUPTED]
        step = checkpoint.load(stopped / layout.CHECKPOINTS / "last.pt")["step"]
    assert step % 16, "the stop must land mid-epoch (16 steps an epoch)"
    summary = train(run, stopped, log=lambda s: None)
    assert summary["status"] == states.COMPLETED
    assert summary["resumed_from_step"] >= step
    assert_same_end(straight, stopped)
    assert metrics_without_timing(straight) == metrics_without_timing(stopped)


@pytest.mark.slow
def test_engine_stop_mid_epoch_with_workers_resumes_exactly(tmp_path):
    """`gridrun engine stop` (SIGTERM to the run through the real engine) while a
    user-style task trains with 2 workers; the restarted engine resumes it."""
    from test_engine_kit import finished, kill_quietly, wait_for
    from test_engine_kit import make_run as engine_run
    from test_engine_kit import metrics_without_timing as engine_metrics

    from gridrun.engine import daemon
    from gridrun.runs.store import Store

    args = {**TASK_ARGS, "train_size": 512, "step_sleep": 0.03}
    trainer = {"epochs": 2, "batch_size": 16, "checkpoint_every": 5, "num_workers": 2}
    run, straight = make_run(tmp_path, "straight", {**args, "step_sleep": 0.0}, **trainer)
    assert train(run, straight, log=lambda s: None)["status"] == states.COMPLETED

    root = tmp_path / "runs"
    queued = engine_run("helper_tasks:slow", seed=run.seed, task_args=args, **run.trainer)
    ckpt = layout.run_dir(root, queued.experiment, queued.id) / layout.CHECKPOINTS / "last.pt"
    try:
        with Store(root) as store:
            store.enqueue([queued])
            daemon.start(root)
            wait_for(lambda: ckpt.exists() and checkpoint.load(ckpt)["step"] >= 5, timeout=120)
            assert daemon.stop(root)
            step = checkpoint.load(ckpt)["step"]
            assert step % 32, "the stop must land mid-epoch (32 steps an epoch)"
            assert store.get_run(queued.id).status == states.QUEUED
            daemon.start(root)
            wait_for(lambda: finished(store, [queued.id]), timeout=180)
            assert store.get_run(queued.id).status == states.COMPLETED
            daemon.stop(root)
    finally:
        kill_quietly(daemon.status(root).pid)
    run_dir = layout.run_dir(root, queued.experiment, queued.id)
    assert json.loads((run_dir / layout.SUMMARY).read_text())["resumed_from_step"] == step
    assert engine_metrics(root, queued) == metrics_without_timing(straight)
    assert_same_end(straight, run_dir)


def test_evaluating_more_often_leaves_training_alone(tmp_path):
    """Evaluation draws nothing from the training stream (its loader has its own
    generator and streams): with dropout, the train lines are the same whether a
    run evaluates at each epoch end or every 5 steps."""
    args = {**TASK_ARGS, "inner_task": "spirals", "train_size": 512, "val_size": 128}
    lines = {}
    for every in (0, 5):
        run, run_dir = make_run(tmp_path, f"eval{every}", args, epochs=2, eval_every=every)
        assert train(run, run_dir, log=lambda s: None)["status"] == states.COMPLETED
        lines[every] = [r for r in metrics_without_timing(run_dir) if r["split"] == "train"]
    assert lines[0] == lines[5] and len(lines[0]) > 4
