"""What the per-step diagnostics (issue 14) cost: this tree's trainer against the
trainer before them, measured in the same run.

The baseline is the `gridrun` package of another commit (default: where this
branch left main), extracted into a temporary folder. Each measurement trains
one run in a fresh subprocess whose PYTHONPATH points at one tree or the
other, alternating who goes first; the figure is the median time per optimizer
step from the train lines' `step_time` (data loading, the step and the log
point's read; no evaluation, no checkpoints), as bench_overhead.py reads it.
Each subprocess trains the run 3 times and keeps its fastest: on a shared
machine other work only ever adds time. Medians over the subprocesses, and
the fastest of all, are printed with the ratio to the baseline.

    python benchmarks/bench_diagnostics.py [--reps 7] [--baseline REV] [--micro-only] [--cases ...]

On a machine busy with other work, whole runs vary by more than the 1% this
is about; `--micro-only` (also printed first in a full run) times each piece
of work the diagnostics add to a step, in this process, with the fastest of
many repetitions, against the fastest step of the same model: the added
share does not depend on what else the machine runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

CASES = {  # name: (task, task args, trainer keys)
    "spirals": ("spirals", {"hidden": 256, "train_size": 32768, "val_size": 256}, {"batch_size": 128}),
    "spirals clip": ("spirals", {"hidden": 256, "train_size": 32768, "val_size": 256},
                     {"batch_size": 128, "clip_grad": 1.0}),
    "shapes": ("shapes", {"train_size": 4096, "val_size": 64}, {"batch_size": 64}),
}

CHILD = r"""
import json, sys, tempfile
import torch
torch.set_num_threads(1)
from gridrun.engine import layout, runlog
from gridrun.spec import TRAINER_KEYS, RunSpec
from gridrun.train.loop.trainer import train
task, args, trainer = json.loads(sys.argv[1])
cfg = {k: key.default for k, key in TRAINER_KEYS.items()}
cfg.update(epochs=1, lr=1e-3, warmup=0, schedule="constant", log_every=16, **trainer)
run = RunSpec(id="bench", experiment="bench", variant="", seed=0, task=task, trainer=cfg,
              task_args=args, axes={})
best = None
for _ in range(3):
    with tempfile.TemporaryDirectory() as d:
        s = train(run, d, log=lambda s: None)
        assert s["status"] == "completed", s.get("error")
        lines = [r for r in runlog.read_all(f"{d}/{layout.METRICS}") if r["split"] == "train"]
    total, steps, prev = 0.0, 0, 0
    for r in lines:
        total += r["step_time"] * (r["step"] - prev)
        steps += r["step"] - prev
        prev = r["step"]
    best = total / steps if best is None else min(best, total / steps)
print(json.dumps({"step": best, "fields": sorted(lines[-1])}))
"""


def measure(tree: Path, case: tuple) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(case)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def micro(log_every: int = 16) -> None:
    """The work the diagnostics add to a step, piece by piece (fastest of many)."""
    import timeit

    import torch

    from gridrun.tasks import resolve
    from gridrun.train.diagnostics import Diagnostics

    torch.set_num_threads(1)
    task = resolve("spirals")(hidden=256, train_size=4096, val_size=64)
    model, (x, y) = task.model, task.train_data.tensors
    x, y = x[:128], y[:128]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        loss = task.loss(model, (x, y))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def best(fn, number):
        return min(timeit.repeat(fn, number=number, repeat=15)) / number

    t_step = best(step, 20)
    loss = task.loss(model, (x, y))
    loss.backward()
    diag = Diagnostics(model, torch.device("cpu"), clip=1.0)
    items = list(range(1000))
    plain = best(lambda: [None for _ in items], 20) / len(items)
    timed = best(lambda: [None for _ in diag.batches(items)], 20) / len(items)
    clip_plain = best(lambda: torch.nn.utils.clip_grad_norm_(diag.params, 1.0), 200)
    clip_kept = best(lambda: (diag.clip_grads(), diag.norms.clear()), 200)
    norm = best(diag.measure_norm, 200)
    diag.norm = torch.tensor(1.0)
    line = best(lambda: (diag.device_values(), diag.line([1.0], 1.0)), 200)
    every_step = (timed - plain) + 3e-7  # the batches wrapper; + the null probe's call, the log_now test
    per_step = {
        "data wait timing (per batch)": timed - plain,
        "clip: the norm kept (per step, clip_grad on)": clip_kept - clip_plain,
        "grad norm without clipping (per log point)": norm / log_every,
        "device values + memory read (per log point)": line / log_every,
    }
    print(f"micro: fastest spirals step (hidden 256, batch 128) {t_step * 1e6:.0f} us; log_every {log_every}")
    for what, cost in per_step.items():
        print(f"  {what:<55} {cost * 1e6:7.2f} us a step = {cost / t_step:7.3%}")
    no_clip = every_step + per_step["grad norm without clipping (per log point)"] + per_step[
        "device values + memory read (per log point)"]
    clip = every_step + per_step["clip: the norm kept (per step, clip_grad on)"] + per_step[
        "device values + memory read (per log point)"]
    print(f"  total added: {no_clip * 1e6:.2f} us a step = {no_clip / t_step:.3%} without clipping, "
          f"{clip * 1e6:.2f} us = {clip / t_step:.3%} with clip_grad")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--micro-only", action="store_true")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--baseline", default=None, help="a commit (default: merge-base with main)")
    args = parser.parse_args()
    micro()
    if args.micro_only:
        return
    rev = args.baseline or subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=HERE, check=True,
                                          capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as base:
        archive = subprocess.run(["git", "archive", rev, "gridrun"], cwd=HERE, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
        trees = {"before": Path(base), "diagnostics": HERE}
        print(f"baseline {rev[:10]}; 1 thread per run; load {os.getloadavg()[0]:.2f} at start")
        print(f"{'case':<14} {'trainer':<12} {'median step':>12} {'vs before':>10} "
              f"{'fastest':>10} {'vs before':>10}")
        for name, case in ((n, CASES[n]) for n in args.cases):
            times: dict[str, list[float]] = {k: [] for k in trees}
            for rep in range(args.reps):
                for label in (list(trees) if rep % 2 == 0 else list(trees)[::-1]):
                    times[label].append(measure(trees[label], case)["step"])
            before, fastest = statistics.median(times["before"]), min(times["before"])
            for label, values in times.items():
                med = statistics.median(values)
                print(f"{name:<14} {label:<12} {med * 1e3:>9.3f} ms {med / before:>10.3f} "
                      f"{min(values) * 1e3:>7.3f} ms {min(values) / fastest:>10.3f}", flush=True)
        print(f"load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
