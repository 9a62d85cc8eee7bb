"""What a run carries from step to step, and how it survives a restart.

`TrainState` is the part of a run that changes as it trains (where it is, the
best evaluation, the losses not yet logged); `read_pending` reads its losses
not yet logged back to the host in one sync (the meter's at a log point, the
Checkpointer's before it writes); `resume` is the phase that brings it back
from the last checkpoint (or starts the metrics log afresh), and the
`Checkpointer` decides when to write it and refuses to write a diverged one.
What a checkpoint holds is the exact-resume contract: the weights, optimizer,
scaler, every RNG state, the data position and the metrics log's length, so a
resumed run ends bit for bit where an uninterrupted one does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gridrun.runs import records
from gridrun.runs.runlog import MetricsWriter
from gridrun.train import checkpoint
from gridrun.train.loop.build import Setup
from gridrun.train.seeding import rng_state, set_rng_state

# what a checkpoint must hold to resume from it (see TrainState.checkpoint)
RESUME_KEYS = ("model", "optimizer", "scaler", "step", "epoch", "position", "best",
               "pending_losses", "rng", "metrics_offset", "final", "train_loss")


def no_best() -> dict[str, Any]:
    # own: each metric's own best value (records.own_best); checkpoints before it lack it
    return {"value": None, "step": None, "metrics": {}, "bad_evals": 0, "own": {}}


@dataclass
class TrainState:
    step: int = 0  # optimizer steps taken
    epoch: int = 0
    position: int = 0  # micro-batches into the epoch
    best: dict[str, Any] = field(default_factory=no_best)  # the evaluation best in the metric
    pending: list[torch.Tensor] = field(default_factory=list)  # losses since the last log point

    def end_epoch_if_done(self, setup: Setup) -> bool:
        """After a step: whether it was the epoch's last; if so, move to the next epoch's start."""
        if self.position < setup.batches_per_epoch:
            return False
        self.epoch, self.position = self.epoch + 1, 0
        return True

    def checkpoint(self, setup: Setup, metrics_offset: int, summary: dict[str, Any]) -> dict[str, Any]:
        """The checkpoint of this state: RESUME_KEYS, plus the schedule's place for readers."""
        return {
            "model": setup.model.state_dict(), "optimizer": setup.optimizer.state_dict(),
            "scheduler": {"step": self.step, "total": setup.total},
            "scaler": setup.scaler.state_dict(),
            "step": self.step, "epoch": self.epoch, "position": self.position, "best": self.best,
            "pending_losses": torch.stack(self.pending).detach() if self.pending else torch.zeros(0),
            "rng": rng_state(), "metrics_offset": metrics_offset,
            "final": summary["final"], "train_loss": summary["train_loss"],
            # what decided the bits of this state, attempt by attempt (train/loop/attempts.py)
            "attempts": summary.get("attempts") or [],
        }


def read_pending(setup: Setup, state: TrainState, weights: bool = False,
                 extra: list[torch.Tensor] | None = None
                 ) -> tuple[list[float], int | None, list[float]]:
    """The losses since the last log point, the first non-finite step and
    the `extra` values (the diagnostics'), in one sync.

    With `weights`, also whether every parameter is finite (the last
    update can break the weights before any loss shows it): if not,
    this step is the diverged one.
    """
    pending, device = state.pending, setup.device
    parts = [torch.stack(pending).float()] if pending else []
    if extra:
        parts.append(torch.stack(extra).to(device))
    if weights:
        finite = torch.stack([p.isfinite().all() for p in setup.model.parameters()]).all()
        parts.append(torch.where(finite, 0.0, math.nan).reshape(1).to(device))
    if not parts:
        return [], None, []
    values = torch.cat(parts).tolist()
    weights_ok = math.isfinite(values.pop()) if weights else True
    extras = values[len(values) - len(extra or ()):]
    del values[len(values) - len(extras):]
    for i, v in enumerate(values):
        if not math.isfinite(v):
            return values, state.step - (len(values) - 1 - i) // setup.accumulate, extras
    return values, None if weights_ok else state.step, extras


def load_earlier(folder: Path, device: torch.device, *, leader: bool, fresh: bool,
                 warn: Callable[[str], None]) -> dict[str, Any] | None:
    """The last usable checkpoint in `folder` to go on from, or None (start at step 0).
    Rank 0 alone removes what a killed write left and sets damaged files aside; the
    other ranks call this after it (the trainer's order) and only read."""
    if leader:
        checkpoint.remove_temporaries(folder)  # writes a kill cut short
    if fresh and leader:
        checkpoint.discard(folder)
    saved, problems = (None, []) if fresh and not leader else checkpoint.load_resumable(
        folder, device, RESUME_KEYS)
    for problem in problems:
        warn(problem)
    if problems and saved is None:
        warn("no checkpoint could be loaded: starting over from step 0")
    return saved


def resume(setup: Setup, saved: dict[str, Any] | None, writer: MetricsWriter, *,
           summary: dict[str, Any], log: Callable[[str], None]) -> TrainState:
    """The state to train from: `saved` (load_earlier's) loaded into the setup's model,
    optimizer, scaler and the RNGs; else step 0 and a new metrics log."""
    if saved is None:
        writer.truncate(0)
        # readers (the interface's progress bar) learn the length before the first log point
        # and the metrics' directions and the early-stop metric, so none of them guesses
        writer.write(records.start_line(time.time(), setup.total, setup.metrics, setup.metric))
        return TrainState()
    setup.model.load_state_dict(saved["model"])
    setup.optimizer.load_state_dict(saved["optimizer"])
    setup.scaler.load_state_dict(saved["scaler"])
    losses = saved["pending_losses"]
    state = TrainState(step=saved["step"], epoch=saved["epoch"], position=saved["position"],
                       best=saved["best"],
                       pending=list(losses.to(setup.device).unbind()) if losses.numel() else [])
    summary["final"], summary["train_loss"] = saved["final"], saved["train_loss"]
    writer.truncate(saved["metrics_offset"])  # drop lines written after this checkpoint
    set_rng_state(saved["rng"])
    summary["resumed_from_step"] = state.step
    log(f"resumed from step {state.step} (epoch {state.epoch}, batch {state.position})")
    return state


class Checkpointer:
    """Decides when last.pt is written (every `checkpoint_every` steps, at each
    epoch's end, at the last step and when the run stops) and writes it, and
    best.pt when asked; it never writes a state whose losses or weights are not
    finite, and reads them (one host sync) only when it might write."""

    def __init__(self, setup: Setup, folder: Path, writer: MetricsWriter, summary: dict[str, Any]):
        self.setup, self.folder, self.writer, self.summary = setup, folder, writer, summary

    def save(self, name: str, state: TrainState) -> None:
        if not self.setup.world.leader:  # every rank holds the same state: rank 0 writes it
            return
        checkpoint.save(state.checkpoint(self.setup, self.writer.offset(), self.summary),
                        self.folder / name, keep_previous=name == checkpoint.LAST)

    def after_step(self, state: TrainState, *, epoch_ended: bool, stopping: bool,
                   check: bool = False) -> int | None:
        """Save last.pt if it is time; with `check`, look for divergence even if it is not.
        Returns the diverged step (and saves nothing) when the state is not finite."""
        every = self.setup.cfg["checkpoint_every"]
        due = epoch_ended or state.step == self.setup.total or stopping or (
            bool(every) and state.step % every == 0)
        if not (due or check):
            return None
        diverged_step = read_pending(self.setup, state, weights=True)[1]
        if diverged_step is None and due:
            self.save(checkpoint.LAST, state)
        return diverged_step
