"""The training loop: determinism, accumulation, schedules, divergence, eval mode,
failures, crash-safe checkpoints, and no host sync per step."""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from gridrun.runs import layout, records, runlog, states
from gridrun.spec import TRAINER_KEYS, RunSpec
from gridrun.tasks.spirals import spirals
from gridrun.train import checkpoint
from gridrun.train.loop.trainer import evaluate, train
from gridrun.train.optim import lr_at

TIMING = records.TIMING  # what differs between identical replays
QUIET = {"log": lambda s: None}


def spec(task="spirals", task_args=None, seed=0, **trainer) -> RunSpec:
    cfg = {k: key.default for k, key in TRAINER_KEYS.items()}
    cfg.update(epochs=2, batch_size=64, log_every=4)
    cfg.update(trainer)
    args = {"train_size": 512, "val_size": 128} if task_args is None else task_args
    return RunSpec(id="r", experiment="t", variant="", seed=seed, task=task, trainer=cfg,
                   task_args=args, axes={})


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load(run_dir / layout.CHECKPOINTS / "last.pt")["model"]


def metrics(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING}
            for r in runlog.read_all(run_dir / layout.METRICS)]


def test_same_cell_twice_is_identical_and_another_seed_differs(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d, seed in ((a, 0), (b, 0), (c, 1)):
        assert train(spec(seed=seed), d, **QUIET)["status"] == states.COMPLETED
    assert metrics(a) == metrics(b)
    assert all(torch.equal(weights(a)[k], weights(b)[k]) for k in weights(a))
    assert metrics(a) != metrics(c)
    assert {r["split"] for r in metrics(a)} == {"start", "train", "val"}
    start = metrics(a)[0]  # the length is known before the first step
    last_train = [r for r in metrics(a) if r["split"] == "train"][-1]
    assert start["split"] == "start" and start["total_steps"] == last_train["step"]


@pytest.mark.parametrize("task", ["shapes", "sort"])
def test_builtin_tasks_learn_and_are_deterministic(tmp_path, task):
    args = {"train_size": 256, "val_size": 64}
    s1 = train(spec(task, args, epochs=3, batch_size=32, lr=3e-3), tmp_path / "a", **QUIET)
    train(spec(task, args, epochs=3, batch_size=32, lr=3e-3), tmp_path / "b", **QUIET)
    assert s1["status"] == states.COMPLETED, s1["error"]
    assert metrics(tmp_path / "a") == metrics(tmp_path / "b")
    first_val = next(r for r in metrics(tmp_path / "a") if r["split"] == "val")
    assert s1["final"]["loss"] < first_val["loss"] or s1["final"]["accuracy"] > 0.4
    if task == "sort":
        assert s1["tokens_per_s"] > 0
        assert all("tokens_per_s" in r for r in runlog.read_all(tmp_path / "a" / layout.METRICS)
                   if r["split"] == "train")


def test_accumulation_matches_a_big_batch(tmp_path):
    common = dict(epochs=2, optimizer="sgd", momentum=0.0, lr=0.05, warmup=0, schedule="constant")
    train(spec("helper_tasks:linear", {}, batch_size=64, accumulate=1, **common), tmp_path / "a", **QUIET)
    train(spec("helper_tasks:linear", {}, batch_size=16, accumulate=4, **common), tmp_path / "b", **QUIET)
    wa, wb = weights(tmp_path / "a"), weights(tmp_path / "b")
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-12)


def test_lr_schedules_at_known_steps():
    cfg = {k: key.default for k, key in TRAINER_KEYS.items()}
    cfg.update(lr=1.0, min_lr=0.0, warmup=10)
    cos = {**cfg, "schedule": "cosine"}
    assert lr_at(0, cos, 110) == pytest.approx(0.1)
    assert lr_at(9, cos, 110) == pytest.approx(1.0)
    assert lr_at(10, cos, 110) == pytest.approx(1.0)
    assert lr_at(60, cos, 110) == pytest.approx(0.5)
    assert lr_at(110, cos, 110) == pytest.approx(0.0, abs=1e-12)
    assert lr_at(35, {**cfg, "schedule": "linear"}, 110) == pytest.approx(0.75)
    assert lr_at(35, {**cfg, "schedule": "step", "step_size": 20, "gamma": 0.5}, 110) == pytest.approx(0.5)
    assert lr_at(50, {**cfg, "schedule": "constant"}, 110) == 1.0
    frac = {**cfg, "warmup": 0.1, "schedule": "cosine"}
    assert lr_at(4, frac, 100) == pytest.approx(0.5)
    one = {**cfg, "warmup": 0.0, "schedule": "onecycle"}  # 30% rise from lr/25
    assert lr_at(0, one, 100) == pytest.approx(1 / 25)
    assert lr_at(30, one, 100) == pytest.approx(1.0)
    assert lr_at(15, one, 100) == pytest.approx((1 / 25 + 1) / 2)
    assert lr_at(99, one, 100) == pytest.approx(1 / 25e4)


def test_huge_lr_diverges_quickly_without_a_bad_checkpoint(tmp_path):
    s = train(spec(optimizer="sgd", lr=1e6, warmup=0, schedule="constant", checkpoint_every=1,
                   log_every=50), tmp_path, **QUIET)
    assert s["status"] == states.DIVERGED
    assert isinstance(s["diverged_step"], int) and 1 <= s["diverged_step"] <= 8
    last = checkpoint.load(tmp_path / layout.CHECKPOINTS / "last.pt")
    if last is not None:
        assert last["step"] < s["diverged_step"]
        assert all(torch.isfinite(v).all() for v in last["model"].values())


def test_evaluation_is_in_eval_mode_and_restores_train_mode():
    task = spirals(hidden=32, dropout=0.5, train_size=64, val_size=256)
    loader = torch.utils.data.DataLoader(task.val_data, batch_size=64)
    task.model.train()
    first = evaluate(task.model, task, loader, torch.device("cpu"), torch.autocast("cpu", enabled=False))
    second = evaluate(task.model, task, loader, torch.device("cpu"), torch.autocast("cpu", enabled=False))
    assert first == second
    assert task.model.training


def test_task_exception_fails_with_traceback(tmp_path):
    s = train(spec("helper_tasks:crash", {"at_step": 3}), tmp_path, **QUIET)
    assert s["status"] == states.FAILED
    assert "injected crash" in s["error"] and "Traceback" in s["traceback"]


def test_out_of_memory_is_its_own_status(tmp_path):
    s = train(spec("helper_tasks:oom_above", {"max_batch": 16}, batch_size=32), tmp_path, **QUIET)
    assert s["status"] == states.OOM and s["peak_memory_bytes"] > 0
    s = train(spec("helper_tasks:oom_above", {"max_batch": 16}, batch_size=16), tmp_path / "ok", **QUIET)
    assert s["status"] == states.COMPLETED


def test_early_stopping_honours_direction_and_keeps_best(tmp_path):
    s = train(spec(epochs=30, lr=0.05, early_stop_metric="accuracy", early_stop_patience=2,
                   eval_every=4), tmp_path, **QUIET)
    assert s["status"] == states.COMPLETED
    assert s["step"] < s["total_steps"]
    vals = [r["accuracy"] for r in metrics(tmp_path) if r["split"] == "val"]
    assert s["best"]["accuracy"] == max(vals)
    assert checkpoint.load(tmp_path / layout.CHECKPOINTS / "best.pt")["step"] == s["best_step"]


def test_crash_while_writing_a_checkpoint_leaves_the_previous_one(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    checkpoint.save({"step": 1, "w": torch.ones(3)}, path)

    def torn_save(obj, f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save({"step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert checkpoint.load(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def count_host_reads(monkeypatch) -> Counter:
    """Reads of tensor values (item, tolist, float(), ...) made by gridrun's own
    modules, by module name: torch's own calls are not counted, wherever the
    virtualenv lives (a clone named gridrun holding .venv-ci, say)."""
    reads: Counter = Counter()
    for name in ("item", "tolist", "__float__", "__bool__", "__int__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, **k):
            module = sys._getframe(1).f_globals.get("__name__", "")
            if module.startswith("gridrun.") and not module.startswith("gridrun.tasks"):
                reads[module] += 1
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


def test_at_most_one_round_of_host_reads_per_log_point(tmp_path, monkeypatch):
    reads = count_host_reads(monkeypatch)
    s = train(spec(epochs=3, log_every=7), tmp_path, **QUIET)
    monkeypatch.undo()
    steps = s["total_steps"]  # 7 steps an epoch: a log point, an eval and a checkpoint each
    assert steps == 21
    log_points, evals, checkpoints, epochs = math.ceil(steps / 7), 3, 3, 3
    # the sampler lists its CPU permutation once an epoch
    assert reads.pop("gridrun.train.data", 0) <= epochs
    assert sum(reads.values()) <= log_points + evals + checkpoints, reads
    assert sum(reads.values()) < steps


def test_host_read_count_sees_a_per_step_sync(tmp_path, monkeypatch):
    """The count above fails when the loop reads a value every step: here a
    `.item()` per batch, in a function that runs as part of trainer.py."""
    import types

    from gridrun.train.loop import trainer

    real = trainer.to_device

    def sync_every_step(batch, device, non_blocking=False):
        moved = real(batch, device, non_blocking)
        moved[0].sum().item()
        return moved

    as_trainer_code = types.FunctionType(sync_every_step.__code__, vars(trainer), "to_device",
                                         None, sync_every_step.__closure__)
    reads = count_host_reads(monkeypatch)
    monkeypatch.setattr(trainer, "to_device", as_trainer_code)
    train(spec(epochs=3, log_every=7), tmp_path, **QUIET)
    assert reads["gridrun.train.loop.trainer"] >= 21


def test_divergence_seen_at_an_evaluation_still_writes_a_summary(tmp_path):
    """Non-finite validation metrics end up as null in summary.json, and weights
    broken by the last update are never checkpointed."""
    import json

    from gridrun.spec import write_run_config
    from gridrun.train import worker

    run = spec(optimizer="sgd", lr=1e6, warmup=0, schedule="constant", eval_every=1,
               checkpoint_every=1, log_every=50)
    write_run_config(tmp_path / layout.CONFIG, run)
    with pytest.warns(UserWarning, match="Error detected in"):  # the divergence replay, in anomaly mode
        assert worker.main(tmp_path) == states.EXIT_CODES[states.DIVERGED]
    summary = json.loads((tmp_path / layout.SUMMARY).read_text())
    assert summary["status"] == states.DIVERGED and 1 <= summary["diverged_step"] <= 8
    for name in ("last.pt", "best.pt"):
        saved = checkpoint.load(tmp_path / layout.CHECKPOINTS / name)
        if saved is not None:
            assert saved["step"] < summary["diverged_step"]
            assert all(torch.isfinite(v).all() for v in saved["model"].values())


def test_a_tracked_metric_never_finite_is_said_at_the_end(tmp_path):
    """f1 is NaN at every evaluation: the run completes with no best evaluation, and its
    summary and its last lines say so and what to do, instead of a silent `best {}`."""
    lines: list[str] = []
    summary = train(spec("helper_tasks:nan_metric", {}), tmp_path, log=lines.append)
    assert summary["status"] == states.COMPLETED and summary["best"] == {}
    assert math.isnan(summary["final"]["f1"]) and math.isfinite(summary["final"]["loss"])
    (warning,) = [w for w in summary["warnings"] if "never finite" in w]
    assert warning.startswith("f1 was never finite") and "early_stop_metric" in warning
    assert f"warning: {warning}" in lines[-3:]
    assert not (tmp_path / layout.CHECKPOINTS / "best.pt").exists()
