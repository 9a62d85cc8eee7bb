"""Deterministic scripted data for tests, snapshots and benchmarks (no randomness, no clock)."""

from __future__ import annotations

import math

from gridrun.tui.source import (
    EngineState,
    FakeSource,
    GpuRow,
    Machine,
    Plan,
    RunDetail,
    RunRow,
    Table,
    Update,
)

NOW = 1_767_000_000.0  # the frozen clock of the snapshots
STATUSES = ("completed", "completed", "running", "queued", "failed", "completed", "cancelled",
            "diverged")


def rows(n: int) -> list[RunRow]:
    out = []
    for i in range(n):
        status = STATUSES[i % len(STATUSES)]
        exp = ("lr-sweep", "tricks", "widths")[i % 3]
        total = 400
        step = {"completed": total, "running": 37 + i % 300, "queued": 0}.get(status, 120)
        started = None if status == "queued" else NOW - 300 - i
        ended = None if status in ("queued", "running") else NOW - i
        out.append(RunRow(
            id=f"{(i * 2654435761) % 16**10:010x}", experiment=exp,
            variant=f"lr={(1e-3, 3e-4)[i % 2]:g} hidden={(64, 256)[(i // 2) % 2]}",
            seed=i % 3, status=status, priority=1 if i == 0 else 0, step=step,
            total_steps=total if status != "queued" else None, epoch=step // 20, epochs=20,
            train_loss=None if status == "queued" else round(0.9 * math.exp(-step / 150) + 0.05, 4),
            best=None if status in ("queued", "running") else round(0.80 + (i % 7) / 100, 3),
            best_name="accuracy", samples_per_s=None if status == "queued" else 5200.0 + i % 97,
            slot="cpu0" if status == "running" else None, queued_at=NOW - 1000 + i,
            started_at=started, ended_at=ended))
    return out


def records(steps: int = 400, every: int = 10) -> list[dict]:
    out = []
    for s in range(every, steps + 1, every):
        out.append({"t": NOW + s, "step": s, "epoch": s // 20, "split": "train",
                    "loss": 0.9 * math.exp(-s / 150) + 0.05, "lr": 1e-3 * (1 - s / steps),
                    "samples_per_s": 5000 + 50 * math.sin(s / 30), "step_time": 0.02,
                    # diagnostics: a gradient spike at step 200, data wait falling once
                    # workers warm up, memory creeping up
                    "grad_norm": 2.0 * math.exp(-s / 100) + 0.1 + (30.0 if s == 200 else 0.0),
                    "data_wait": 0.05 + 0.4 * math.exp(-s / 60), "rss": (600 + s / 4) * 2**20})
        if s % 50 == 0:
            out.append({"t": NOW + s, "step": s, "epoch": s // 20, "split": "val",
                        "accuracy": 1 - 0.5 * math.exp(-s / 120), "loss": 0.8 * math.exp(-s / 160)})
    return out


DIAGNOSED = {  # what a summary says of a run's diagnostics (records.Summary's fields)
    "status": "running", "parameters": {"total": 52867, "trainable": 52867}, "dtype": "float32",
    "unused_parameters": ["head.scale"], "data_wait": 0.12,
    "environment": {"torch": "2.13.0", "cuda": "12.8", "cudnn": 91000, "driver": "575.51",
                    "gpu": "NVIDIA H100 80GB HBM3", "CUDA_VISIBLE_DEVICES": "0"},
}


def source(n: int = 24, *, gpus: bool = True) -> FakeSource:
    all_rows = rows(n)
    counts: dict[str, int] = {}
    for r in all_rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    machine = Machine(
        gpus=tuple(GpuRow(i, "NVIDIA H100 80GB", 87.0 - 20 * i, 41e9, 80e9, 310.0, 64.0,
                          tuple(r.id for r in all_rows if r.status == "running")[i::2],
                          tuple(50 + 40 * math.sin(k / 6 + i) for k in range(60)))
                   for i in range(2)) if gpus else (),
        cpu_percent=63.0, ram_used=12e9, ram_total=64e9,
        cpu_history=tuple(50 + 30 * math.sin(k / 5) for k in range(60)))
    first = Update(runs=tuple(all_rows), engine=EngineState(True, False, counts), machine=machine)
    failed = next((r for r in all_rows if r.status == "failed"), all_rows[0])
    plan_runs = tuple({"id": r.id, "experiment": r.experiment, "variant": r.variant, "seed": r.seed}
                      for r in all_rows[:6])
    table = Table("lr-sweep", ("lr", "hidden", "seeds", "best val accuracy ↑", "best val loss ↓"),
                  (("0.001", "64", "3", "0.912 ± 0.004", "0.231 ± 0.01"),
                   ("0.001", "256", "2/3", "0.934 ± 0.003", "0.198 ± 0.02"),
                   ("0.0003", "64", "3", "0.874 ± 0.006", "0.301 ± 0.01"),
                   ("0.0003", "256", "3", "0.901 ± 0.005", "0.257 ± 0.01")),
                  frozenset({(1, 3), (1, 4)}), note="best validation value, mean ± std")
    return FakeSource(
        [first], root="/tmp/gridrun-demo",
        metrics={r.id: records() for r in all_rows[:8]},
        details={**{r.id: RunDetail({"lr": 0.001, "hidden": 64, "epochs": 20}, DIAGNOSED, None)
                    for r in all_rows[:8]},
                 failed.id: RunDetail({"lr": 0.001, "hidden": 64, "epochs": 20},
                                      {"status": "failed", "step": 120},
                                      "Traceback (most recent call last):\n  ...\nValueError: boom")},
        plans={"./experiments.toml": Plan("./experiments.toml", runs=plan_runs),
               "bad.toml": Plan("bad.toml", errors="bad.toml:3: experiment 'x': unknown key 'lrr' "
                                                   "(did you mean 'lr'?)")},
        tables={"lr-sweep": table},
        output={r.id: "epoch 1 loss 0.52\nepoch 2 loss 0.41\n" for r in all_rows})
