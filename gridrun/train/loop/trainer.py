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
from gridrun.runs import layout, records, runlog, states
from gridrun.runs.runlog import MetricsWriter, NullWriter
from gridrun.spec import RunSpec
from gridrun.train import checkpoint, environment
from gridrun.train.data import to_device
from gridrun.train.diagnostics import peak_reserved, unused_warning
from gridrun.train.loop import attempts
from gridrun.train.loop.build import Setup, build, resolve_precision, training_loader
from gridrun.train.loop.combine import Combiner, agree, in_rank_order
from gridrun.train.loop.memory import MemoryBudget, budget_from_env
from gridrun.train.loop.meter import Meter
from gridrun.train.loop.probe import Probe
from gridrun.train.loop.state import RESUME_KEYS, Checkpointer, TrainState, load_earlier, resume
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
    probe, run_dir = probe or Probe(), Path(run_dir)
    world = world if world.size > 1 else World(reduce=run.trainer.get("reduce", world.reduce))
    started = time.time()
    summary = new_summary(run, started)  # filled in as we go: a run that fails says how far it got

    def warn(message: str) -> None:
        summary["warnings"].append(message)
        log(f"warning: {message}")

    device, setup, state, writer = torch.device("cpu"), None, None, None
    budget = MemoryBudget()  # none until the device is known
    switched_off = randomness.switched_off()  # the run sets its own; put back at its end
    try:
        # ---- the device, the checkpoint to go on from, and the threads it was trained with
        device = rank_device(world)  # a GPU it was given and cannot use: fail, never the CPU
        budget = MemoryBudget.from_env(device)  # the engine's share of a GPU it packs runs on
        budget.apply(log)  # before the model is on the device
        layout.make_private_dir(run_dir)
        saved = in_rank_order(world, device, lambda: load_earlier(
            run_dir / layout.CHECKPOINTS, device, leader=world.leader, fresh=fresh, warn=warn))
        attempt = attempts.begin(run, world, device.type, str(torch.__version__), saved,
                                 legacy_threads(run_dir, saved))

        # ---- seed and build, then resume
        setup = build(run, device, summary, probe, warn, world, attempt.threads)
        writer = MetricsWriter(run_dir / layout.METRICS) if world.leader else NullWriter()
        state = resume(setup, saved, writer, summary=summary, log=log)
        attempts.record_into(summary, attempt, warn)
        agree(world, state.step, "the step they resume from", device)

        # ---- the steps
        log(f"run {run.id} {run.experiment} {run.variant or ''} seed {run.seed}: {setup.total} steps "
            f"on {summary['device']} ({setup.precision})")
        status, meter, validator = steps(run, setup, state, writer, summary, log, warn, probe,
                                         budget, should_stop, run_dir)

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


def steps(run: RunSpec, setup: Setup, state: TrainState, writer: MetricsWriter,
          summary: dict[str, Any], log: Callable[[str], None], warn: Callable[[str], None],
          probe: Probe, budget: MemoryBudget, should_stop: Callable[[], bool],
          run_dir: Path) -> tuple[str, Meter, Validator]:
    """The optimizer steps from `state` to the end, a stop request, a divergence, an early
    stop or a search's pause; returns the status they end in and the meter and validator
    that summarize them."""
    checkpointer = Checkpointer(setup, run_dir / layout.CHECKPOINTS, writer, summary)
    validator = Validator(setup, writer, summary, log, checkpointer)
    setup.model.train()
    status = states.COMPLETED
    loader = training_loader(setup)
    meter = Meter(setup, state, writer, summary, log, budget)
    pause = run.pause_at if run.pause_at and run.pause_at < run.trainer["epochs"] else None
    if pause and state.epoch >= pause:  # resumed where it waits: nothing to train yet
        status = waiting(pause, log)
    batches = micro_batches(loader, setup, state) if status != states.WAITING else ()
    combiner = Combiner.of(setup)  # several devices, or the invariant sum on one
    for micro, batch in enumerate(batches, start=1):
        meter.count(batch)
        forward_backward(setup, state, to_device(batch, setup.device, non_blocking=loader.pin_memory),
                         probe, combiner)
        if micro % setup.local_accumulate:
            continue
        # every rank learns the step's losses, and any rank's stop request
        asked = combiner.end_step(state, should_stop()) if combiner else should_stop()
        if (unused := setup.diagnostics.unused()):
            summary["unused_parameters"] = unused
            warn(unused_warning(unused))
        log_now = meter.due(state)
        lr = step_once(setup, state, measure_norm=log_now)
        # before any line is written: a line's epoch is the epochs completed
        epoch_ended = state.end_epoch_if_done(setup)
        if log_now and (bad_step := meter.log_point(state, lr)) is not None:
            return diverged(summary, bad_step, "non-finite loss", log), meter, validator
        if validator.due(state, epoch_ended):
            validator.evaluate(state)
            meter.restart_interval()
        stopping = asked and state.step < setup.total and not validator.stop
        # an evaluation gave NaN or Inf: look at the weights now, even with nothing to save
        bad_step = checkpointer.after_step(state, epoch_ended=epoch_ended,
                                           stopping=stopping or validator.stop,
                                           check=validator.nonfinite_step == state.step)
        if bad_step is not None:  # nothing was saved: the last checkpoint stays the good one
            return diverged(summary, bad_step, "non-finite loss or weights", log), meter, validator
        if stopping:
            log(f"interrupted at step {state.step}: checkpoint saved")
            return states.INTERRUPTED, meter, validator
        if pause and epoch_ended and state.epoch == pause and not validator.stop:
            return waiting(pause, log), meter, validator  # last.pt was saved at the epoch's end
        if state.step >= setup.total or validator.stop:
            break
    return status, meter, validator


def rank_device(world: World) -> torch.device:
    """This process's device: the GPU it was given (rank r: the r-th), else the CPU."""
    device = environment.pick_device()
    if device.type == "cuda" and world.size > 1:
        device = torch.device("cuda", world.rank)
        torch.cuda.set_device(device)
    return device


def legacy_threads(run_dir: Path, saved: dict[str, Any] | None) -> int | None:
    """The threads a checkpoint from before attempts were recorded was trained with, as
    the summary.json of the attempt that wrote it says (None: not known)."""
    if saved is None or saved.get("attempts"):
        return None
    earlier = runlog.read_summary(run_dir / layout.SUMMARY)
    threads = ((earlier.environment or {}) if earlier else {}).get("threads")
    return threads if type(threads) is int and threads >= 1 else None


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
