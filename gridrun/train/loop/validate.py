"""Evaluation: when the loop validates, what it writes, the best evaluation so
far (best.pt) and early stopping.

The best evaluation lives in `TrainState.best`, so a checkpoint carries it and
a resumed run counts its evaluations without improvement where it left off.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from gridrun.runs import records
from gridrun.runs.runlog import MetricsWriter
from gridrun.tasks import Task
from gridrun.train import checkpoint
from gridrun.train.data import to_device
from gridrun.train.loop.build import Setup
from gridrun.train.loop.combine import gather_rows
from gridrun.train.loop.state import Checkpointer, TrainState
from gridrun.train.world import SINGLE, World


@torch.inference_mode()
def evaluate(model: torch.nn.Module, task: Task, loader: Any, device: torch.device,
             autocast: Any, world: World = SINGLE) -> dict[str, float]:
    """The task's validation metrics over the whole validation set, in eval mode,
    then its derived metrics (computed from those, on the host)."""
    if world.size > 1:
        return evaluate_sharded(model, task, loader, device, autocast, world)
    was_training = model.training
    model.eval()
    sums: dict[str, Any] = {}
    counts: dict[str, Any] = {}
    for batch in loader:
        with autocast:
            out = task.evaluate(model, to_device(batch, device, non_blocking=True))
        for name, (s, n) in out.items():
            sums[name] = sums.get(name, 0) + torch.as_tensor(s, device=device, dtype=torch.float64)
            counts[name] = counts.get(name, 0) + torch.as_tensor(n, device=device, dtype=torch.float64)
    model.train(was_training)
    names = list(sums)
    values = torch.stack([sums[k] / counts[k] for k in names]).tolist()  # one sync
    return task.derive(dict(zip(names, values, strict=True)))


@torch.inference_mode()
def evaluate_sharded(model: torch.nn.Module, task: Task, loader: Any, device: torch.device,
                     autocast: Any, world: World) -> dict[str, float]:
    """`evaluate` with the validation batches dealt to the ranks (batch b to rank b mod n):
    every batch's (sum, count) pairs are gathered and added in batch order, from zero, in
    float64, as one device adds them: the same values whatever the number of ranks."""
    was_training = model.training
    model.eval()
    names = list(task.metrics)
    rows = []
    for batch in loader:
        with autocast:
            out = task.evaluate(model, to_device(batch, device, non_blocking=True))
        rows.append(torch.stack([torch.as_tensor(part, device=device, dtype=torch.float64)
                                 for name in names for part in out[name]]))
    model.train(was_training)
    local = torch.stack(rows) if rows else torch.zeros((0, 2 * len(names)), dtype=torch.float64,
                                                       device=device)
    shards = gather_rows(world, local)
    total = torch.zeros(2 * len(names), dtype=torch.float64, device=device)
    for b in range(sum(len(s) for s in shards)):
        total = total + shards[b % world.size][b // world.size]
    values = (total[0::2] / total[1::2]).tolist()
    return task.derive(dict(zip(names, values, strict=True)))


class Validator:
    """Decides when to evaluate (every `eval_every` steps, else at each epoch's
    end, and at the last step), writes the val line, keeps best.pt and says when
    early stopping ends the run (`stop`)."""

    def __init__(self, setup: Setup, writer: MetricsWriter, summary: dict[str, Any],
                 log: Callable[[str], None], checkpointer: Checkpointer):
        self.setup, self.writer, self.summary, self.log = setup, writer, summary, log
        self.checkpointer = checkpointer
        self.stop = False  # early stopping: no better metric in `early_stop_patience` evaluations
        self.nonfinite_step: int | None = None  # the latest evaluation with a NaN or Inf in it

    def due(self, state: TrainState, epoch_ended: bool) -> bool:
        every = self.setup.cfg["eval_every"]
        return bool(every and state.step % every == 0) or (
            not every and epoch_ended) or state.step == self.setup.total

    def evaluate(self, state: TrainState) -> None:
        """Evaluate, log, keep best.pt; sets `stop` when early stopping says so."""
        setup, best = self.setup, state.best
        values = evaluate(setup.model, setup.task, setup.val_data, setup.device, setup.autocast,
                          setup.world)
        self.writer.write(records.val_line(time.time(), state.step, state.epoch, values))
        self.summary["final"] = values
        self.log(f"eval  step {state.step:>6}  "
                 + "  ".join(f"{k} {v:.4g}" for k, v in values.items()))
        self.stop = False
        if not all(math.isfinite(v) for v in values.values()):
            self.nonfinite_step = state.step
            return
        best["own"] = records.own_best(best.get("own") or {}, values, setup.metrics)
        if records.better(values[setup.metric], best["value"], setup.direction):
            best.update(value=values[setup.metric], step=state.step, metrics=values, bad_evals=0)
            self.checkpointer.save(checkpoint.BEST, state)
            return
        best["bad_evals"] += 1
        patience = setup.cfg["early_stop_patience"]
        self.stop = bool(patience) and best["bad_evals"] >= patience

    def report_early_stop(self, state: TrainState) -> None:
        """At the run's end: early stopping, or an early-stop metric that was never finite."""
        if self.stop:
            self.log(f"early stop at step {state.step}: no better {self.setup.metric} in "
                     f"{self.setup.cfg['early_stop_patience']} evaluations")
        metric, last = self.setup.metric, self.summary.get("final") or {}
        value = last.get(metric)
        # without this the run completes with an empty best and no best.pt, as if nothing were wrong
        if state.best.get("step") is None and last and not (
                isinstance(value, int | float) and math.isfinite(value)):
            message = (f"{metric} was never finite at an evaluation (the last gave "
                       f"{value}): no best evaluation, no best.pt (summary's final has "
                       f"the last values); check how {metric} is computed or choose another "
                       "early_stop_metric")
            self.summary["warnings"].append(message)
            self.log(f"warning: {message}")
