"""One optimizer step: the micro-batches it trains on, their forward and
backward, then the update.

Nothing here reads a value back to the host: the losses go to
`TrainState.pending` on the device, for the meter's one read at a log point.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

from torch.utils.data import DataLoader

from gridrun.train.data import start_epoch
from gridrun.train.loop.build import Setup
from gridrun.train.loop.combine import Combiner
from gridrun.train.loop.probe import Probe
from gridrun.train.loop.state import TrainState
from gridrun.train.optim import lr_at


def micro_batches(loader: DataLoader, setup: Setup, state: TrainState) -> Iterator[Any]:
    """The training batches from where `state` stands to the run's last step,
    epoch after epoch: a new epoch starts once the loop has moved `state` to it.
    The loop stops asking when it is done, so no epoch is started for nothing."""
    while state.step < setup.total:
        epoch = state.epoch
        start_epoch(loader, setup.seeds["order"], epoch, state.position)
        for batch in setup.diagnostics.batches(loader):
            yield batch
            if state.epoch != epoch:
                break


def forward_backward(setup: Setup, state: TrainState, batch: Any, probe: Probe,
                     combiner: Combiner | None = None) -> None:
    """One micro-batch of the step to come: its loss kept on the device, its
    gradients added to those of the step's other micro-batches (with a combiner:
    several devices, or the invariant sum, combine.py: kept apart, its loss too)."""
    probe.before_step(state.step + 1, batch)
    if combiner is None:
        with setup.autocast:
            loss = setup.task.loss(setup.step_model, batch)
        state.pending.append(loss.detach())
        accumulate = setup.accumulate
        setup.scaler.scale(loss / accumulate if accumulate > 1 else loss).backward()
        return
    # DDP reduces once a step: after this rank's last micro-batch
    quiet = setup.world.size > 1 and not setup.world.invariant and not combiner.last_local
    with setup.step_model.no_sync() if quiet else nullcontext():
        combiner.before(state.step)
        with setup.autocast:
            loss = setup.task.loss(setup.step_model, batch)
        combiner.after_forward()
        # invariant: each gradient is the micro-batch's share of the step's mean;
        # ddp averages over the ranks, so each rank divides by its own share only
        share = setup.accumulate if setup.world.invariant else setup.local_accumulate
        setup.scaler.scale(loss / share if share > 1 else loss).backward()
    combiner.after_backward(loss)


def step_once(setup: Setup, state: TrainState, *, measure_norm: bool) -> float:
    """Update the weights from the accumulated gradients and count the step in
    `state`; returns the step's learning rate. The gradient norm is measured
    when clipping (it comes free) or when asked (at log points)."""
    optimizer, scaler, diag = setup.optimizer, setup.scaler, setup.diagnostics
    lr = lr_at(state.step, setup.cfg, setup.total)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if setup.cfg["clip_grad"]:
        scaler.unscale_(optimizer)
        diag.clip_grads()
    elif measure_norm:
        scaler.unscale_(optimizer)  # what scaler.step would do: the same update
        diag.measure_norm()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    state.step += 1
    state.position += setup.accumulate
    return lr
