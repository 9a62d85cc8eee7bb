"""The training loop: the only place that steps an optimizer.

One readable function in the shape of nanoGPT's train.py: seed -> build ->
resume -> loop (log, evaluate, checkpoint); the build and resume phases are
build.py's and state.py's. Metrics stay on the device between log points;
reading them there is the loop's only host sync.
"""

from __future__ import annotations

import math
import re
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gridrun.runs import layout, records, states
from gridrun.runs.runlog import MetricsWriter
from gridrun.spec import RunSpec
from gridrun.tasks import Task
from gridrun.train import checkpoint, environment
from gridrun.train.build import build, resolve_precision, training_loader
from gridrun.train.data import start_epoch, to_device
from gridrun.train.diagnostics import unused_warning
from gridrun.train.optim import lr_at
from gridrun.train.state import RESUME_KEYS, resume

# the names other modules import from here
__all__ = ["RESUME_KEYS", "Probe", "evaluate", "failed", "peak_memory", "resolve_precision", "train"]

# what autograd's anomaly mode raises: "Function 'LogBackward0' returned nan values in its 0th output."
ANOMALY = re.compile(r"Function '(\w+)' returned nan values")


class Probe:
    """Watches a run as it trains (diverge.py replays a diverged run with one);
    the null probe watches nothing."""

    def attach(self, model: torch.nn.Module) -> None:
        pass

    def before_step(self, step: int, batch: Any) -> None:
        """Before the forward of each micro-batch of optimizer step `step` (1-based)."""


@torch.inference_mode()
def evaluate(model: torch.nn.Module, task: Task, loader: Any, device: torch.device,
             autocast: Any) -> dict[str, float]:
    """The task's validation metrics over the whole validation set, in eval mode."""
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
    return dict(zip(names, values, strict=True))


def peak_memory(device: torch.device, seen: int = 0) -> int:
    """The run's peak; `seen`: the peaks of the intervals whose counters were reset."""
    if device.type == "cuda":
        return max(seen, int(torch.cuda.max_memory_allocated(device)))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def train(run: RunSpec, run_dir: str | Path, *, fresh: bool = False,
          should_stop: Callable[[], bool] = lambda: False,
          log: Callable[[str], None] = lambda s: print(s, flush=True),
          probe: Probe | None = None) -> dict[str, Any]:
    """Train one run to the end (or to a stop request); returns its summary."""
    probe = probe or Probe()
    run_dir = Path(run_dir)
    cfg = run.trainer
    started = time.time()
    summary: dict[str, Any] = records.Summary(  # the fields are the Summary's; filled in as we go
        run_id=run.id, experiment=run.experiment, variant=run.variant, ablation=run.ablation,
        seed=run.seed, task=run.task, status=states.FAILED, step=0, epoch=0, started_at=started,
        torch_version=torch.__version__).to_json()

    def warn(message: str) -> None:
        summary["warnings"].append(message)
        log(f"warning: {message}")

    device = torch.device("cpu")
    writer = diag = None
    step = 0
    try:
        # ---- seed and build
        device = environment.pick_device()  # a GPU it was given and cannot use: fail, never the CPU
        setup = build(run, device, summary, probe, warn)
        diag, task, model, total = setup.diagnostics, setup.task, setup.model, setup.total
        accumulate, steps_per_epoch = setup.accumulate, setup.steps_per_epoch

        # ---- resume
        ckpt_dir = run_dir / layout.CHECKPOINTS
        layout.make_private_dir(run_dir)
        writer = MetricsWriter(run_dir / layout.METRICS)
        state = resume(setup, run_dir, writer, fresh=fresh, summary=summary, warn=warn, log=log)
        step, epoch, position, best, pending = (state.step, state.epoch, state.position,
                                                state.best, state.pending)

        def save(name: str) -> None:
            state.step, state.epoch, state.position = step, epoch, position
            checkpoint.save(state.checkpoint(setup, writer.offset(), summary), ckpt_dir / name,
                            keep_previous=name == checkpoint.LAST)

        def evaluate_and_track() -> bool:
            """Evaluate, log, keep best.pt; True when early stopping says stop."""
            values = evaluate(model, task, setup.val_data, device, setup.autocast)
            writer.write(records.val_line(time.time(), step, epoch, values))
            summary["final"] = values
            log(f"eval  step {step:>6}  " + "  ".join(f"{k} {v:.4g}" for k, v in values.items()))
            if not all(math.isfinite(v) for v in values.values()):
                return False
            if records.better(values[setup.metric], best["value"], setup.direction):
                best.update(value=values[setup.metric], step=step, metrics=values, bad_evals=0)
                save(checkpoint.BEST)
                return False
            best["bad_evals"] += 1
            return bool(cfg["early_stop_patience"]) and best["bad_evals"] >= cfg["early_stop_patience"]

        def read_pending(weights: bool = False, extra: list[torch.Tensor] | None = None
                         ) -> tuple[list[float], int | None, list[float]]:
            """The losses since the last log point, the first non-finite step and
            the `extra` values (the diagnostics'), in one sync.

            With `weights`, also whether every parameter is finite (the last
            update can break the weights before any loss shows it): if not,
            this step is the diverged one.
            """
            parts = [torch.stack(pending).float()] if pending else []
            if extra:
                parts.append(torch.stack(extra).to(device))
            if weights:
                finite = torch.stack([p.isfinite().all() for p in model.parameters()]).all()
                parts.append(torch.where(finite, 0.0, math.nan).reshape(1).to(device))
            if not parts:
                return [], None, []
            values = torch.cat(parts).tolist()
            weights_ok = math.isfinite(values.pop()) if weights else True
            extras = values[len(values) - len(extra or ()):]
            del values[len(values) - len(extras):]
            for i, v in enumerate(values):
                if not math.isfinite(v):
                    return values, step - (len(values) - 1 - i) // accumulate, extras
            return values, None if weights_ok else step, extras

        # ---- the loop
        model.train()
        status = states.COMPLETED
        log(f"run {run.id} {run.experiment} {run.variant or ''} seed {run.seed}: {total} steps on "
            f"{summary['device']} ({setup.precision})")
        loader = training_loader(setup)
        non_blocking = loader.pin_memory
        samples = tokens = 0
        interval_start, interval_steps, train_time = time.perf_counter(), 0, 0.0
        total_samples = total_tokens = 0
        micro = 0
        stop_early = False
        while step < total and not stop_early and status == states.COMPLETED:
            start_epoch(loader, run.seed, epoch, position)
            for batch in diag.batches(loader):
                samples += setup.count_samples(batch)
                if task.count_tokens:
                    tokens += task.count_tokens(batch)
                batch = to_device(batch, device, non_blocking=non_blocking)
                probe.before_step(step + 1, batch)
                with setup.autocast:
                    loss = task.loss(setup.step_model, batch)
                pending.append(loss.detach())
                setup.scaler.scale(loss / accumulate if accumulate > 1 else loss).backward()
                micro += 1
                if micro % accumulate:
                    continue
                lr = lr_at(step, cfg, total)
                optimizer, scaler = setup.optimizer, setup.scaler
                for group in optimizer.param_groups:
                    group["lr"] = lr
                if (unused := diag.unused()):
                    summary["unused_parameters"] = unused
                    warn(unused_warning(unused))
                log_now = (step + 1) % cfg["log_every"] == 0 or step + 1 == total or (
                    position + accumulate >= steps_per_epoch * accumulate)
                if cfg["clip_grad"]:
                    scaler.unscale_(optimizer)
                    diag.clip_grads()
                elif log_now:
                    scaler.unscale_(optimizer)  # what scaler.step would do: the same update
                    diag.measure_norm()
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                position += accumulate
                interval_steps += 1
                last_of_epoch = position >= steps_per_epoch * accumulate

                if log_now:
                    losses, bad_step, read = read_pending(extra=diag.device_values())  # the one host sync
                    elapsed = time.perf_counter() - interval_start
                    train_time += elapsed
                    total_samples += samples
                    total_tokens += tokens
                    if bad_step is not None:
                        summary["diverged_step"] = bad_step
                        status = states.DIVERGED
                        log(f"diverged: non-finite loss at step {bad_step}")
                        break
                    mean_loss, speed = sum(losses) / len(losses), samples / elapsed if elapsed else None
                    writer.write(records.train_line(
                        time.time(), step, epoch, mean_loss, lr, speed, elapsed / interval_steps,
                        counts_tokens=bool(task.count_tokens),
                        tokens_per_s=tokens / elapsed if elapsed else None,
                        diagnostics=diag.line(read, elapsed)))
                    summary["train_loss"] = mean_loss
                    log(f"train step {step:>6}/{total}  epoch {epoch}  loss {mean_loss:.4f}  "
                        f"lr {lr:.3g}  {speed or 0:,.0f} samples/s")
                    pending.clear()
                    samples = tokens = interval_steps = 0
                    interval_start = time.perf_counter()

                if last_of_epoch:
                    epoch, position = epoch + 1, 0
                evaluate_now = (cfg["eval_every"] and step % cfg["eval_every"] == 0) or (
                    not cfg["eval_every"] and last_of_epoch) or step == total
                if evaluate_now:
                    stop_early = evaluate_and_track()
                    interval_start = time.perf_counter()
                stopping = should_stop() and step < total and not stop_early
                checkpoint_now = last_of_epoch or step == total or stop_early or stopping or (
                    cfg["checkpoint_every"] and step % cfg["checkpoint_every"] == 0)
                bad_eval = evaluate_now and not all(math.isfinite(v) for v in summary["final"].values())
                if checkpoint_now or bad_eval:
                    bad_step = read_pending(weights=True)[1]
                    if bad_step is not None:  # never save a diverged state
                        summary["diverged_step"] = bad_step
                        status = states.DIVERGED
                        log(f"diverged: non-finite loss or weights at step {bad_step}")
                        break
                    if checkpoint_now:
                        save(checkpoint.LAST)
                if stopping:
                    status = states.INTERRUPTED
                    log(f"interrupted at step {step}: checkpoint saved")
                    break
                if step >= total or stop_early or last_of_epoch:
                    break

        summary.update(status=status, step=step, epoch=epoch)
        summary["weights_sha256"] = checkpoint.weights_sha256(model.state_dict())
        summary["best"], summary["best_step"] = best["metrics"], best["step"]
        if train_time:
            summary["data_wait"] = min(1.0, diag.total_waited / train_time)
            summary["samples_per_s"] = total_samples / train_time
            summary["tokens_per_s"] = total_tokens / train_time if task.count_tokens else None
        if stop_early:
            log(f"early stop at step {step}: no better {setup.metric} in {cfg['early_stop_patience']} evaluations")
    except environment.EnvironmentProblem as exc:
        summary.update(status=states.FAILED, error=str(exc))
        log(str(exc))
    except torch.OutOfMemoryError as exc:
        summary.update(status=states.OOM, error=f"out of memory: {exc}")
        if device.type == "cuda":
            print(torch.cuda.memory_summary(device), file=sys.stderr)
        log(f"out of memory: {exc}")
    except RuntimeError as exc:
        if not (cfg["detect_anomaly"] and (found := ANOMALY.search(str(exc)))):
            failed(summary, exc)
        else:  # a non-finite value, found by anomaly mode in the backward: diverged, not failed
            summary.update(status=states.DIVERGED, step=step, diverged_step=step + 1,
                           error=str(exc).splitlines()[0])
            summary["divergence"] = {"step": step + 1, "phase": "backward", "op": found.group(1)}
            log(f"diverged: anomaly mode found {found.group(1)} returning NaN at step {step + 1}")
    except Exception as exc:
        failed(summary, exc)
    finally:
        if writer is not None:
            writer.close()
    summary["peak_memory_bytes"] = peak_memory(device, diag.peak if diag else 0)
    summary["ended_at"] = time.time()
    summary["wall_time_s"] = summary["ended_at"] - started
    return summary


def failed(summary: dict[str, Any], exc: BaseException) -> None:
    import traceback

    summary.update(status=states.FAILED, error=f"{type(exc).__name__}: {exc}",
                   traceback=traceback.format_exc())
    print(summary["traceback"], file=sys.stderr, flush=True)
