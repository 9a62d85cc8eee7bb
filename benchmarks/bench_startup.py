"""Whole-process cost of `gridrun train` on a small cell against the same loop
written by hand, each in a fresh interpreter (what the foreground and every
run on a backend without the warm fork server pay).

The hand-written loop trains the same data and model (the built-in `spirals`
task) with the same optimizer, warmup + cosine schedule, epoch-end evaluation
and a checkpoint (model + optimizer) at each epoch end. `gridrun train` also
keeps its store, metrics log, summary and output as always. Wall time is
what a person waits; CPU time (user + system) is printed beside it because on
a machine shared with other work it varies much less. With
`--baseline REV` the `gridrun` of another commit is measured too (before
issue 14's start-up work: determinism imported torch._inductor).

    python benchmarks/bench_startup.py [--reps 7] [--baseline REV]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

CELL = """
[defaults]
task = "spirals"
hidden = 64
train_size = 2048
val_size = 512
epochs = 2
batch_size = 128
lr = 3e-3
warmup = 0.05
seeds = [0]

[experiments.small]
"""

HAND = r"""
import math, sys, torch
from torch.nn import functional as F
from gridrun.tasks.spirals import spirals

torch.manual_seed(0)
task = spirals(hidden=64, train_size=2048, val_size=512)
model = task.model
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
loader = torch.utils.data.DataLoader(task.train_data, batch_size=128, shuffle=True, drop_last=True)
val = torch.utils.data.DataLoader(task.val_data, batch_size=256)
epochs, total = 2, 2 * len(loader)
warm = int(0.05 * total)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warm if s < warm else
                                          (1 + math.cos(math.pi * (s - warm) / (total - warm))) / 2)
for epoch in range(epochs):
    model.train()
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if i % 10 == 0:
            print(f"step {i} loss {loss.item():.4f}")
    model.eval()
    with torch.no_grad():
        correct = sum((model(x).argmax(-1) == y).sum().item() for x, y in val)
    print(f"epoch {epoch} accuracy {correct / len(task.val_data):.3f}")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, sys.argv[1])
"""


def timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the process and its threads)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{cmd} exited {proc.returncode}")
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--baseline", default=None, help="also time the gridrun of this commit")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "cell.toml").write_text(CELL)
        (tmp / "hand.py").write_text(HAND)
        trees = {"gridrun train": HERE}
        if args.baseline:
            base = tmp / "base"
            base.mkdir()
            archive = subprocess.run(["git", "archive", args.baseline, "gridrun"], cwd=HERE,
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
            trees[f"gridrun train @{args.baseline[:8]}"] = base
        times: dict[str, list[tuple[float, float]]] = {"hand-written": [], **{k: [] for k in trees}}
        print(f"{os.cpu_count()} cores; load {os.getloadavg()[0]:.2f} at start")
        for rep in range(args.reps):
            order = list(times)
            order = order[rep % len(order):] + order[:rep % len(order)]
            for label in order:
                tree = trees.get(label, HERE)
                env = {**os.environ, "PYTHONPATH": str(tree)}
                if label == "hand-written":
                    times[label].append(timed([sys.executable, str(tmp / "hand.py"),
                                               str(tmp / "hand.pt")], env))
                else:
                    root = tmp / f"root{rep}-{len(times[label])}-{abs(hash(label)) % 1000}"
                    times[label].append(timed([sys.executable, "-m", "gridrun", "train",
                                               str(tmp / "cell.toml"), "--root", str(root)], env))
        hand = [statistics.median(v[i] for v in times["hand-written"]) for i in (0, 1)]
        for label, values in times.items():
            wall = [v[0] for v in values]
            cpu = statistics.median(v[1] for v in values)
            print(f"{label:<30} wall median {statistics.median(wall):6.2f} s (min {min(wall):.2f}, "
                  f"max {max(wall):.2f}) {statistics.median(wall) / hand[0]:.3f}x   "
                  f"CPU median {cpu:6.2f} s {cpu / hand[1]:.3f}x")
        print(f"load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
