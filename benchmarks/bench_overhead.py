"""What gridrun's training loop costs over a bare textbook loop.

Trains the same model, data and optimizer three ways, alternating in one
process: a bare loop (forward, loss, zero_grad, backward, step), the same loop
with `loss.item()` every step (the habit gridrun avoids), and gridrun's
trainer. Reports the median time per optimizer step over the repetitions and
the ratio to the bare loop measured in the same run.

    python benchmarks/bench_overhead.py [--reps 7]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time

import torch

from gridrun.runs import layout, runlog
from gridrun.spec import TRAINER_KEYS, RunSpec
from gridrun.tasks import resolve
from gridrun.train.loop.trainer import train

CASES = {
    "spirals": ({"hidden": 256, "train_size": 8192, "val_size": 256}, {"batch_size": 128}),
    "shapes": ({"train_size": 1024, "val_size": 64}, {"batch_size": 64}),
}


def config(trainer: dict) -> dict:
    cfg = {k: key.default for k, key in TRAINER_KEYS.items()}
    cfg.update(epochs=1, lr=1e-3, warmup=0, schedule="constant", log_every=16, **trainer)
    return cfg


def textbook(task_name: str, task_args: dict, trainer: dict, *, item: bool) -> float:
    torch.manual_seed(0)
    task = resolve(task_name)(**task_args)
    model = task.model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(task.train_data, batch_size=trainer["batch_size"],
                                         shuffle=True, drop_last=True)
    model.train()
    steps = 0
    start = time.perf_counter()
    for batch in loader:
        loss = task.loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if item:
            loss.item()
        steps += 1
    return (time.perf_counter() - start) / steps


def gridrun(task_name: str, task_args: dict, trainer: dict) -> float:
    run = RunSpec(id="bench", experiment="bench", variant="", seed=0, task=task_name,
                  trainer=config(trainer), task_args=task_args, axes={})
    with tempfile.TemporaryDirectory() as d:
        train(run, d, log=lambda s: None)
        lines = [r for r in runlog.read_all(f"{d}/{layout.METRICS}") if r["split"] == "train"]
    # step_time is the wall time of a log interval over its steps: data loading,
    # the step itself and the log-point sync, without evaluation or checkpoints
    total, steps, prev = 0.0, 0, 0
    for r in lines:
        total += r["step_time"] * (r["step"] - prev)
        steps += r["step"] - prev
        prev = r["step"]
    return total / steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)  # steadier timings on a shared machine
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} thread, "
          f"torch {torch.__version__}, CPU")
    print(f"{'task':<8} {'loop':<18} {'median step':>12} {'vs bare':>8}")
    for name, (task_args, trainer) in CASES.items():
        times: dict[str, list[float]] = {"bare": [], "bare + item()": [], "gridrun": []}
        for rep in range(args.reps):
            order = list(times)
            order = order[rep % 3:] + order[:rep % 3]  # alternate who goes first
            for loop in order:
                if loop == "gridrun":
                    times[loop].append(gridrun(name, task_args, trainer))
                else:
                    times[loop].append(textbook(name, task_args, trainer, item=loop != "bare"))
        bare = statistics.median(times["bare"])
        for loop, values in times.items():
            med = statistics.median(values)
            print(f"{name:<8} {loop:<18} {med * 1e3:>9.3f} ms {med / bare:>8.3f}")


if __name__ == "__main__":
    main()
