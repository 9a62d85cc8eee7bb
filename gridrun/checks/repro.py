"""`gridrun repro RUN`: a standalone script that rebuilds a run and takes its first steps.

The script (`script`) imports torch, NumPy and the run's task module, and nothing
of gridrun's trainer, store, engine or interface: the data order, the per-batch
random streams, the learning-rate schedule and the step are written out in it,
the pure functions copied from gridrun's own source (so they cannot drift), the
loop written as the trainer runs it. Run where the run ran, it prints the losses
the run recorded, bit for bit; `check` runs it and compares.

What it leaves out changes no number of the training: evaluation (in eval mode,
under its own streams), checkpoints, diagnostics, `checkpoint_modules` (bitwise
the same), the DataLoader and its workers (`num_workers` never changes results).
A model that draws random numbers in eval mode is the exception: its evaluations
move the model source's stream, which the script does not replay.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gridrun import userfiles
from gridrun.runs import layout, records, runlog
from gridrun.spec import RunSpec, read_run_config, sources
from gridrun.tasks import BUILTIN, TaskNotFound, resolve
from gridrun.train import data, optim, seeding
from gridrun.train.loop.build import resolve_precision

# the lines a script prints: each step's loss, and at the run's log points the
# interval's mean loss (the trainer's sum over its micro-batches) and its lr
STEP_LINE = re.compile(r"^step (\d+) loss (\S+)$")
LOG_LINE = re.compile(r"^log (\d+) loss (\S+) lr (\S+)$")


class ReproError(ValueError):
    """The run cannot be turned into a script (no config, a task that does not import)."""


def _source(*functions: Any) -> str:
    return "\n\n\n".join(inspect.getsource(f).rstrip() for f in functions)


def _literal(value: Any) -> str:
    """`value` as Python source: a long dict one key a line."""
    if len(repr(value)) < 88 or not isinstance(value, dict):
        return repr(value)
    return "{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in value.items()) + "}"


def _optimizer(cfg: Mapping[str, Any]) -> str:
    name, lr, wd = cfg["optimizer"], cfg["lr"], cfg["weight_decay"]
    if name in ("adamw", "adam"):
        cls = "AdamW" if name == "adamw" else "Adam"
        return (f"torch.optim.{cls}(\n        model.parameters(), lr={lr!r}, "
                f"betas={tuple(cfg['betas'])!r}, weight_decay={wd!r})")
    momentum = cfg["momentum"]
    return (f"torch.optim.SGD(\n        model.parameters(), lr={lr!r}, momentum={momentum!r}, "
            f"weight_decay={wd!r}, nesterov={bool(cfg['nesterov'] and momentum > 0)!r})")


def _device(summary: Mapping[str, Any]) -> str:
    return "cpu" if summary.get("device") in (None, "cpu") else "cuda"


def script(run: RunSpec, summary: Mapping[str, Any], steps: int) -> str:
    """The text of the script for `run` (its summary.json says its device and precision)."""
    target = BUILTIN.get(run.task, run.task)
    module, _, attr = target.partition(":")
    cfg = dict(run.trainer)
    device = _device(summary)
    precision = summary.get("precision")  # as the run resolved "auto"
    if precision not in ("fp32", "bf16", "fp16"):
        import torch

        precision = resolve_precision(cfg["precision"], torch.device(device))
    schedule = {k: cfg[k] for k in ("lr", "min_lr", "schedule", "warmup", "gamma", "step_size")}
    off = sources.switched_off(cfg)
    max_steps = cfg["max_steps"]
    values = {
        "TASK_ARGS": dict(run.task_args), "SEEDS": sources.seeds_of(cfg, run.seed),
        "SEPARATE": sources.separated(cfg), "SWITCHED_OFF": off, "SHUFFLE": cfg.get("shuffle", True),
        "EPOCHS": cfg["epochs"], "MAX_STEPS": max_steps, "BATCH_SIZE": cfg["batch_size"],
        "ACCUMULATE": cfg["accumulate"], "LOG_EVERY": cfg["log_every"], "SCHEDULE": schedule,
        "CLIP_GRAD": cfg["clip_grad"], "PRECISION": precision, "DETERMINISTIC": cfg["deterministic"],
        "DETECT_ANOMALY": cfg["detect_anomaly"], "COMPILE": cfg["compile"],
        "COMPILE_MODE": cfg["compile_mode"], "DEVICE": device, "STEPS": steps,
        "THREADS": (summary.get("determinism") or {}).get("cpu_threads"),
    }
    constants = "\n".join(f"{k} = {_literal(v)}" for k, v in values.items())
    copied = _source(seeding.seed_everything, seeding.model_seed, seeding.data_seed,
                     seeding.stream_seed, optim.warmup_steps, optim.lr_at, data.to_device)
    switch = "import gridrun.randomness  # the task asks it: gridrun.randomness.enabled(...)\n" \
        if off else ""
    return TEMPLATE.format(
        id=run.id, experiment=run.experiment, variant=run.variant or "-", seed=run.seed,
        steps=steps, module=module, attr=attr, task=run.task, constants=constants,
        copied=copied, optimizer=_optimizer(cfg), switch=switch,
        configure="    gridrun.randomness.configure(SWITCHED_OFF)\n" if off else "")


TEMPLATE = '''\
#!/usr/bin/env python3
"""Reproduces the first {steps} optimizer steps of gridrun run {id}, printing each loss.

The run: experiment {experiment}, variant {variant}, seed {seed}.

Written by `gridrun repro`. It needs torch, NumPy and the task's module
({module}), nothing of gridrun's trainer, store or engine. The data order, the
per-batch random streams, the learning-rate schedule and the step are written out
below as gridrun runs them (the functions copied from gridrun's source). On the
machine and software the run used, it prints the losses the run recorded, bit
for bit; `gridrun repro {id} --check` compares them with its metrics.jsonl.

    step N loss L          the loss of optimizer step N (the mean of its micro-batches')
    log N loss L lr R      at the run's log points: the line the run wrote (its mean
                           over the micro-batches since the last log point)

Left out, as they change no number of the training: evaluation, checkpoints,
diagnostics, activation checkpointing, the DataLoader and its workers.
Cut it down from here: a repro of a divergence is often one source, one batch.
"""
from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import sys
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import default_collate

sys.path.insert(0, os.getcwd())  # a task of your own imports from here, as gridrun imports it
{switch}from {module} import {attr} as factory  # task {task!r}

# ---- the run: its config, each source's seed and the switches it turned off
{constants}


# ---- copied from gridrun's source: seeds, the schedule, moving a batch
{copied}


# ---- the per-batch random streams (gridrun/train/data.py, without a DataLoader)
NUMPY_BATCH = np.random.MT19937(0)


def fetch(dataset, collate, stream, indices):
    """One batch fetched under its own streams: python's, NumPy's and torch's CPU
    generators seeded from `stream`, the main streams put back after."""
    saved = random.getstate(), np.random.get_bit_generator(), torch.get_rng_state()
    random.seed(stream & 0xFFFF_FFFF)
    np.random.set_bit_generator(NUMPY_BATCH)
    np.random.seed(stream & 0xFFFF_FFFF)
    torch.default_generator.manual_seed(stream)
    try:
        if getattr(dataset, "__getitems__", None):
            return collate(dataset.__getitems__(indices))
        return collate([dataset[i] for i in indices])
    finally:
        random.setstate(saved[0])
        np.random.set_bit_generator(saved[1])
        torch.set_rng_state(saved[2])


def dropout_off(model):
    """dropout_layers = false: dropout modules the identity, attention dropout 0."""
    dropouts = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                nn.FeatureAlphaDropout)
    for module in model.modules():
        if isinstance(module, dropouts):
            module.forward = lambda input, *args, **kwargs: input
        elif isinstance(module, nn.MultiheadAttention):
            module.dropout = 0.0


def main(steps, device, threads):
    device = torch.device(device)
    if threads:  # CPU kernels split their sums by thread: the run's count, the run's bits
        torch.set_num_threads(threads)
    if DETERMINISTIC:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(DETERMINISTIC)
    torch.backends.cudnn.deterministic = DETERMINISTIC
    torch.backends.cudnn.benchmark = not DETERMINISTIC
    torch.autograd.set_detect_anomaly(DETECT_ANOMALY)
{configure}    seed_everything(SEEDS["init"])  # the init source: what the factory draws
    task = factory(**TASK_ARGS)
    model = task.model.to(device)
    if "dropout" in SWITCHED_OFF:
        dropout_off(model)
    dtype = {{"bf16": torch.bfloat16, "fp16": torch.float16}}.get(PRECISION)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype else nullcontext()
    scaler = torch.amp.GradScaler(device.type, enabled=PRECISION == "fp16")
    optimizer = {optimizer}
    step_model = model
    if COMPILE:
        step_model = torch.compile(model, mode=None if COMPILE_MODE == "default" else COMPILE_MODE)
    if SEPARATE:  # the model source: dropout and other draws in training
        seed_everything(model_seed(SEEDS["model"]))
    data, collate = task.train_data, task.collate_fn or default_collate
    steps_per_epoch = len(data) // BATCH_SIZE // ACCUMULATE
    total = steps_per_epoch * EPOCHS
    total = min(total, MAX_STEPS) if MAX_STEPS else total
    model.train()
    step, since_log = 0, []
    for epoch in range(EPOCHS):
        if SHUFFLE:  # the order source
            g = torch.Generator().manual_seed(data_seed(SEEDS["order"], epoch))
            order = torch.randperm(len(data), generator=g).tolist()
        else:
            order = list(range(len(data)))
        for position in range(0, steps_per_epoch * ACCUMULATE, ACCUMULATE):
            losses = []
            for b in range(position, position + ACCUMULATE):  # the augment source
                batch = fetch(data, collate, stream_seed(SEEDS["augment"], epoch, b),
                              order[b * BATCH_SIZE:(b + 1) * BATCH_SIZE])
                batch = to_device(batch, device)
                with autocast:
                    loss = task.loss(step_model, batch)
                losses.append(loss.detach())
                scaler.scale(loss / ACCUMULATE if ACCUMULATE > 1 else loss).backward()
            log_now = ((step + 1) % LOG_EVERY == 0 or step + 1 == total
                       or position + ACCUMULATE >= steps_per_epoch * ACCUMULATE)
            lr = lr_at(step, SCHEDULE, total)
            for group in optimizer.param_groups:
                group["lr"] = lr
            if CLIP_GRAD:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(
                    [p for p in model.parameters() if p.requires_grad], CLIP_GRAD)
            elif log_now:
                scaler.unscale_(optimizer)  # as the trainer does to measure the gradient norm
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            values = torch.stack(losses).float().tolist()
            print(f"step {{step}} loss {{sum(values) / len(values)!r}}", flush=True)
            since_log += values
            if log_now:
                print(f"log {{step}} loss {{sum(since_log) / len(since_log)!r}} lr {{lr!r}}",
                      flush=True)
                since_log = []
            if step >= min(steps, total):
                return


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS, help="optimizer steps to take")
    parser.add_argument("--device", default=DEVICE, help="the run's device by default")
    parser.add_argument("--threads", type=int, default=THREADS,
                        help="torch's CPU threads (the run's by default, when it recorded them)")
    args = parser.parse_args()
    main(args.steps, args.device, args.threads)
'''


def read(run_dir: Path) -> tuple[RunSpec, dict[str, Any]]:
    """The run's config and summary; ReproError when the config cannot be read or the
    task's module no longer imports."""
    try:
        run = read_run_config(run_dir / layout.CONFIG)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ReproError(f"{run_dir}: no readable {layout.CONFIG} ({e})") from None
    try:
        resolve(run.task)
    except TaskNotFound as e:
        raise ReproError(f"cannot write a repro of run {run.id}: {e}") from None
    stored = runlog.read_summary(run_dir / layout.SUMMARY)
    return run, stored.to_json() if stored is not None else {}


def write(run_dir: Path, out: Path, steps: int, *, force: bool = False) -> RunSpec:
    """The script, executable, by the rule of userfiles.py: an existing `out` replaced only
    with `force`, whole or not at all; never a link nor a system folder (RefusedFile)."""
    run, summary = read(run_dir)
    text = script(run, summary, steps)
    with userfiles.atomic_write(out, force=force, binary=False) as f:
        f.write(text)
        os.fchmod(f.fileno(), 0o700)
    return run


def run_script(path: Path, steps: int | None = None, timeout: float | None = None
               ) -> tuple[list[tuple[int, float]], list[tuple[int, float, float]], str]:
    """Run a repro script here: (step losses, log lines, stderr)."""
    command = [sys.executable, str(path), *(["--steps", str(steps)] if steps else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        tail = "\n".join(done.stderr.strip().splitlines()[-3:])
        raise ReproError(f"the script failed (exit {done.returncode}): {tail}")
    step_losses, logs = [], []
    for line in done.stdout.splitlines():
        if m := STEP_LINE.match(line):
            step_losses.append((int(m[1]), float(m[2])))
        elif m := LOG_LINE.match(line):
            logs.append((int(m[1]), float(m[2]), float(m[3])))
    return step_losses, logs, done.stderr


def check(run_dir: Path, logs: list[tuple[int, float, float]]) -> dict[str, Any]:
    """The script's log lines against the run's train lines at the same steps, bit for bit:
    {"ok", "compared", "last_step", "difference"}."""
    from gridrun.checks.verify import same

    recorded = {r.get(records.STEP): r for r in runlog.read_all(run_dir / layout.METRICS)
                if r.get(records.SPLIT) == records.TRAIN}
    compared = last = 0
    for step, loss, lr in logs:
        line = recorded.get(step)
        if line is None:
            continue
        compared, last = compared + 1, step
        for field, mine in ((records.LOSS, loss), (records.LR, lr)):
            theirs = line.get(field)
            if not (isinstance(theirs, float) and same(theirs, mine)):
                return {"ok": False, "compared": compared, "last_step": step, "difference": {
                    "step": step, "field": field, "recorded": theirs, "repro": mine}}
    return {"ok": compared > 0, "compared": compared, "last_step": last, "difference": None}


def describe(result: dict[str, Any], steps: int) -> str:
    d = result["difference"]
    if d is not None:
        return (f"differs at step {d['step']}: {d['field']} recorded {d['recorded']!r}, "
                f"the script {d['repro']!r}")
    if not result["compared"]:
        return f"nothing to compare: the run recorded no train line in its first {steps} steps"
    n = result["compared"]
    return (f"bitwise identical: the {n} train line{'s' * (n != 1)} (loss and lr) the run "
            f"logged up to step {result['last_step']}")


