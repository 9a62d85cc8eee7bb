"""The training loop: the only place that steps an optimizer.

`train()` reads top to bottom, nanoGPT-shaped: seed and build, resume, then the
loop (forward and backward, the step, log, evaluate, checkpoint, stop). The
phases and the collaborators that decide when to log, evaluate and checkpoint
live beside it: build, state (TrainState, resume, Checkpointer), step, meter,
validate. Metrics stay on the device between log points; reading them there is
the loop's only host sync.
"""

from __future__ import annotations

import re
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gridrun import randomness
from gridrun.runs import layout, records, states
from gridrun.runs.runlog import MetricsWriter, NullWriter
from gridrun.spec import RunSpec
from gridrun.train import checkpoint, environment
from gridrun.train.data import to_device
from gridrun.train.diagnostics import peak_reserved, unused_warning
from gridrun.train.loop.build import build, resolve_precision, training_loader
from gridrun.train.loop.combine import Combiner, agree
from gridrun.train.loop.memory import MemoryBudget, budget_from_env
from gridrun.train.loop.meter import Meter
from gridrun.train.loop.probe import Probe
from gridrun.train.loop.state import RESUME_KEYS, Checkpointer, TrainState, resume
from gridrun.train.loop.step import forward_backward, micro_batches, step_once
from gridrun.train.loop.validate import Validator, evaluate
from gridrun.train.world import SINGLE, World, collective_failed, peer_gone

# the names other modules import from here
__all__ = ["RESUME_KEYS", "Probe", "evaluate", "failed", "peak_memory", "resolve_precision", "train"]

# what autograd's anomaly mode raises: "Function 'LogBackward0' returned nan values in its 0th output."
ANOMALY = re.compile(r"Function '(\w+)' returned nan values")


def peak_memory(device: torch.device, seen: int = 0) -> int:
    """The run's peak; `seen`: the peaks of the intervals whose counters were reset."""
    if device.type == "cuda":
        return max(seen, int(torch.cuda.max_memory_allocated(device)))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def train(run: RunSpec, run_dir: str | Path, *, fresh: bool = False,
          should_stop: Callable[[], bool] = lambda: False,
          log: Callable[[str], None] = lambda s: print(s, flush=True),
          probe: Probe | None = None, world: World = SINGLE) -> dict[str, Any]:
    """Train one run to the end (or to a stop request); returns its summary. With several
    devices, every rank runs this loop in lock step and rank 0 alone writes."""
    probe = probe or Probe()
    run_dir = Path(run_dir)
    if world.size == 1:  # one device: still the invariant loop when the run asks for it
        world = World(reduce=run.trainer.get("reduce", world.reduce))
    started = time.time()
    summary = new_summary(run, started)  # filled in as we go: a run that fails says how far it got

    def warn(message: str) -> None:
        summary["warnings"].append(message)
        log(f"warning: {message}")

    device, setup, state, writer = torch.device("cpu"), None, None, None
    budget = MemoryBudget()  # none until the device is known
    switched_off = randomness.switched_off()  # the run sets its own; put back at its end
    try:
        # ---- seed and build
        device = environment.pick_device()  # a GPU it was given and cannot use: fail, never the CPU
        if device.type == "cuda" and world.size > 1:
            device = torch.device("cuda", world.rank)  # rank r: the r-th GPU it was given
            torch.cuda.set_device(device)
        budget = MemoryBudget.from_env(device)  # the engine's share of a GPU it packs runs on
        budget.apply(log)  # before the model is on the device
        setup = build(run, device, summary, probe, warn, world)

        # ---- resume (rank 0 first: it sets damaged files aside, the others then read)
        layout.make_private_dir(run_dir)
        writer = MetricsWriter(run_dir / layout.METRICS) if world.leader else NullWriter()
        if not world.leader:
            agree(world, 0, "the start", device)
        state = resume(setup, run_dir, writer, fresh=fresh, summary=summary, warn=warn, log=log)
        if world.leader:
            agree(world, 0, "the start", device)
        agree(world, state.step, "the step they resume from", device)
        checkpointer = Checkpointer(setup, run_dir / layout.CHECKPOINTS, writer, summary)
        validator = Validator(setup, writer, summary, log, checkpointer)

        # ---- the loop
        setup.model.train()
        status = states.COMPLETED
        log(f"run {run.id} {run.experiment} {run.variant or ''} seed {run.seed}: {setup.total} steps "
            f"on {summary['device']} ({setup.precision})")
        loader = training_loader(setup)
        meter = Meter(setup, state, writer, summary, log, budget)
        pause = run.pause_at if run.pause_at and run.pause_at < run.trainer["epochs"] else None
        if pause and state.epoch >= pause:  # resumed where it waits: nothing to train yet
            status = waiting(pause, log)
        batches = micro_batches(loader, setup, state) if status != states.WAITING else ()
        combiner = (Combiner(setup.model, world, setup.accumulate, setup.seeds["model"], device)
                    if world.size > 1 or world.invariant else None)
        stop_asked = False
        for micro, batch in enumerate(batches, start=1):
            meter.count(batch)
            forward_backward(setup, state, to_device(batch, device, non_blocking=loader.pin_memory),
                             probe, combiner)
            if micro % setup.local_accumulate:
                continue
            if combiner is not None:  # every rank learns the step's losses and any stop asked
                losses, stop_asked = combiner.finish(should_stop())
                state.pending.extend(losses)
            if (unused := setup.diagnostics.unused()):
                summary["unused_parameters"] = unused
                warn(unused_warning(unused))
            log_now = meter.due(state)
            lr = step_once(setup, state, measure_norm=log_now)
            # before any line is written: a line's epoch is the epochs completed
            epoch_ended = state.end_epoch_if_done(setup)
            if log_now and (bad_step := meter.log_point(state, lr)) is not None:
                status = diverged(summary, bad_step, "non-finite loss", log)
                break
            if validator.due(state, epoch_ended):
                validator.evaluate(state)
                meter.restart_interval()
            asked = stop_asked if combiner is not None else should_stop()
            stopping = asked and state.step < setup.total and not validator.stop
            # an evaluation gave NaN or Inf: look at the weights now, even with nothing to save
            bad_step = checkpointer.after_step(state, epoch_ended=epoch_ended,
                                               stopping=stopping or validator.stop,
                                               check=validator.nonfinite_step == state.step)
            if bad_step is not None:  # nothing was saved: the last checkpoint stays the good one
                status = diverged(summary, bad_step, "non-finite loss or weights", log)
                break
            if stopping:
                status = states.INTERRUPTED
                log(f"interrupted at step {state.step}: checkpoint saved")
                break
            if pause and epoch_ended and state.epoch == pause and not validator.stop:
                status = waiting(pause, log)  # last.pt was saved at the epoch's end
                break
            if state.step >= setup.total or validator.stop:
                break

        # ---- the end
        summary.update(status=status, step=state.step, epoch=state.epoch)
        summary["weights_sha256"] = checkpoint.weights_sha256(setup.model.state_dict())
        summary["best"], summary["best_step"] = state.best["metrics"], state.best["step"]
        summary["own_best"] = state.best.get("own") or {}
        meter.summarize()
        validator.report_early_stop(state)
    except Exception as exc:
        if world.size > 1 and peer_gone(exc):  # not this run's failure: a rank is gone
            collective_failed(world, exc)
        record_exception(summary, exc, device, state, run.trainer["detect_anomaly"], log, budget)
    finally:
        randomness.configure(switched_off)
        if writer is not None:
            writer.close()
    summary["peak_memory_bytes"] = peak_memory(device, setup.diagnostics.peak if setup else 0)
    summary["peak_reserved_bytes"] = peak_reserved(device,
                                                   setup.diagnostics.peak_reserved if setup else 0)
    summary["ended_at"] = time.time()
    summary["wall_time_s"] = summary["ended_at"] - started
    return summary


def new_summary(run: RunSpec, started: float) -> dict[str, Any]:
    """The run's summary.json before it starts: failed at step 0 until it says otherwise."""
    return records.Summary(
        run_id=run.id, experiment=run.experiment, variant=run.variant, ablation=run.ablation,
        seed=run.seed, task=run.task, status=states.FAILED, step=0, epoch=0, started_at=started,
        torch_version=torch.__version__, memory_budget_bytes=budget_from_env()).to_json()


def waiting(epoch: int, log: Callable[[str], None]) -> str:
    """A search's trial at its rung: it waits, checkpointed, for the rung's decision and
    goes on from that checkpoint if promoted (the same bits as never pausing)."""
    log(f"waiting at epoch {epoch} for the search's decision: checkpoint saved")
    return states.WAITING


def diverged(summary: dict[str, Any], step: int, what: str, log: Callable[[str], None]) -> str:
    summary["diverged_step"] = step
    log(f"diverged: {what} at step {step}")
    return states.DIVERGED


def record_exception(summary: dict[str, Any], exc: Exception, device: torch.device,
                     state: TrainState | None, anomaly_mode: bool,
                     log: Callable[[str], None], budget: MemoryBudget | None = None) -> None:
    """What ended the run early, in the summary: the environment, its memory budget
    (outgrown, or a CUDA OOM its cap caused), memory, a non-finite value caught by
    anomaly mode (diverged, not failed), or a failure."""
    step = state.step if state else 0
    if isinstance(exc, environment.EnvironmentProblem):
        summary.update(status=states.FAILED, error=str(exc))
        log(str(exc))
    elif budget is not None and (over := budget.over(exc)) is not None:
        summary.update(status=states.OOM, error=str(over), memory_budget_bytes=over.budget,
                       memory_needed_bytes=over.needed)
        log(str(over))
    elif isinstance(exc, torch.OutOfMemoryError):
        summary.update(status=states.OOM, error=f"out of memory: {exc}")
        if device.type == "cuda":
            print(torch.cuda.memory_summary(device), file=sys.stderr)
        log(f"out of memory: {exc}")
    elif isinstance(exc, RuntimeError) and anomaly_mode and (found := ANOMALY.search(str(exc))):
        summary.update(status=states.DIVERGED, step=step, diverged_step=step + 1,
                       error=str(exc).splitlines()[0])
        summary["divergence"] = {"step": step + 1, "phase": "backward", "op": found.group(1)}
        log(f"diverged: anomaly mode found {found.group(1)} returning NaN at step {step + 1}")
    else:
        failed(summary, exc)


def failed(summary: dict[str, Any], exc: BaseException) -> None:
    import traceback

    summary.update(status=states.FAILED, error=f"{type(exc).__name__}: {exc}",
                   traceback=traceback.format_exc())
    print(summary["traceback"], file=sys.stderr, flush=True)
