"""The documentation's pictures of the interface: SVG screenshots of the real app
(`GridrunApp`, driven by Textual's Pilot as its own tests drive it), made by
`python scripts/docs.py pictures`; tests/test_docs_pictures.py fails when a committed
picture is no longer what the app draws.

The data is fixed, like the snapshot tests': the 18 runs of the repository's example
(experiments.toml, expanded by the spec: their real ids and variants) in several states,
each with seeded curves, at a frozen clock, and a stand-in GPU in the machine panel (a
scripted source, as tests/tui/ inject one; no store, no engine, no NVML). Textual's export
is deterministic for the same screen: its ids are a hash of what it draws.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gridrun.tui import demo
from gridrun.tui.source import (
    EngineState,
    FakeSource,
    GpuMemory,
    GpuRow,
    Machine,
    RunDetail,
    RunRow,
    Table,
    Update,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "experiments.toml"
NOW = demo.NOW  # the frozen clock
STEPS = 186  # the example's runs: 6 epochs of 31 steps
EPOCHS = 6
# the example's 18 runs, in order: width-lr's 12 (4 cells x 3 seeds), tricks' 6
STATES = ("completed",) * 8 + ("failed", "cancelled", "running", "running") + \
         ("completed",) * 5 + ("queued",)
GPU = "NVIDIA H100 80GB"  # as the panel shows a name: its first 18 characters


def example_runs() -> list[Any]:
    from gridrun.spec import load_runs

    return load_runs(EXAMPLE)


def _rate(run: Any) -> float:
    """How fast a run's loss falls: wider and faster learners do better, without warmup a
    little worse, SGD at its lr much worse."""
    if run.trainer.get("optimizer") == "sgd":
        return 0.35
    hidden, lr = run.task_args.get("hidden", 64), run.trainer.get("lr", 1e-2)
    return (0.6 + 0.2 * math.log2(hidden / 32) + 30 * lr) * (0.92 if run.ablation == "no-warmup" else 1)


def records(run: Any, upto: int) -> list[dict[str, Any]]:
    """The run's metrics lines up to step `upto`: seeded by its id, the same every time."""
    rng = random.Random(run.id)
    rate, out = _rate(run), []
    for s in range(10, upto + 1, 10):
        noise = 1 + 0.08 * (rng.random() - 0.5)
        loss = (0.05 + 0.65 * math.exp(-rate * s / 60)) * noise
        out.append({"t": NOW - 600 + s, "step": s, "epoch": s // 31, "split": "train",
                    "loss": loss, "lr": run.trainer.get("lr", 1e-2) * 0.5 * (1 + math.cos(math.pi * s / STEPS)),
                    "samples_per_s": 5150 + 40 * math.sin(s / 9) + 30 * rng.random(), "step_time": 0.024,
                    "grad_norm": 1.5 * math.exp(-s / 80) + 0.2, "data_wait": 0.01,
                    "rss": (610 + s / 5) * 2**20})
        if s % 30 == 0:
            val = (0.04 + 0.6 * math.exp(-rate * s / 65)) * (1 + 0.05 * (rng.random() - 0.5))
            out.append({"t": NOW - 600 + s, "step": s, "epoch": s // 31, "split": "val",
                        "loss": val, "accuracy": min(0.995, 1 - 0.55 * val)})
    return out


def _best(recs: list[dict[str, Any]], name: str = "loss") -> float | None:
    vals = [r[name] for r in recs if r["split"] == "val"]
    return round(min(vals), 4) if vals else None


def rows(runs: list[Any]) -> list[RunRow]:
    out = []
    for i, (run, status) in enumerate(zip(runs, STATES, strict=True)):
        step = {"completed": STEPS, "running": 40 + 50 * (i % 3), "queued": 0}.get(status, 71)
        recs = records(run, step)
        train = [r["loss"] for r in recs if r["split"] == "train"]
        started = None if status == "queued" else \
            NOW - step * 0.45 if status == "running" else NOW - 1800 + 90 * i
        ended = None if started is None or status == "running" else started + 80 + i
        out.append(RunRow(
            id=run.id, experiment=run.experiment, variant=run.variant, seed=run.seed,
            status=status, step=step, total_steps=STEPS if status != "queued" else None,
            epoch=step // 31, epochs=EPOCHS, train_loss=round(train[-1], 4) if train else None,
            best=_best(recs) if status != "queued" else None, best_name="loss",
            best_direction="lower", samples_per_s=None if status == "queued" else 5100.0 + i,
            slot="gpu0" if status == "running" else None, queued_at=NOW - 1000 + i,
            started_at=started, ended_at=ended,
            ends_at=NOW + 20 if status == "running" else None))
    return out


def ablation_table(runs: list[Any], made: list[RunRow]) -> Table:
    """The tricks experiment's table, mean ± std over its finished seeds, as `compare` shows it."""
    by: dict[str, list[float]] = {}
    for run, row in zip(runs, made, strict=True):
        if run.experiment == "tricks" and row.status == "completed" and row.best is not None:
            by.setdefault(run.ablation, []).append(row.best)
    base = statistics.mean(by["baseline"])
    cells = []
    for name in ("baseline", "no-warmup", "sgd"):
        vals = by.get(name, [])
        mean = statistics.mean(vals) if vals else None
        std = statistics.stdev(vals) if len(vals) > 1 else 0.0
        shown = "-" if mean is None else f"{mean:.4f}" + f" ± {std:.4f}" * (len(vals) > 1)
        delta = "" if mean is None or name == "baseline" else \
            f"{mean - base:+.4f} ({(mean - base) / base:+.1%})"
        cells.append((name, str(len(vals)), shown, delta))
    means = {n: statistics.mean(v) for n, v in by.items() if v}
    best = [c[0] for c in cells].index(min(means, key=means.__getitem__))
    return Table("tricks", ("ablation", "seeds", "best val loss ↓", "Δ loss"), tuple(cells),
                 frozenset({(best, 2)}), note="mean ± std over finished seeds; bold: best; "
                 "Δ vs baseline", names=2, lead=(2, 3))


def source() -> FakeSource:
    runs = example_runs()
    made = rows(runs)
    running = tuple(r.id for r in made if r.status == "running")
    history = tuple(55 + 30 * math.sin(k / 7) + 8 * math.sin(k / 2.3) for k in range(60))
    quiet = tuple(20 + 6 * math.sin(k / 5) for k in range(60))
    gib = 2**30
    gpus = (GpuRow(0, GPU, 71.0, 9.6 * gib, 80 * gib, 212.0, 58.0, running, history,
                   memory=GpuMemory(ours=6.0 * gib, runs=len(running), engines=2.0 * gib,
                                    others=0.0, free=70.4 * gib)),
            GpuRow(1, GPU, 22.0, 20.6 * gib, 80 * gib, 96.0, 41.0, (), quiet,
                   others=("alice 20.0 GiB",),
                   memory=GpuMemory(ours=0.0, runs=0, engines=0.0, others=20.0 * gib,
                                    free=59.4 * gib)))
    machine = Machine(gpus=gpus, cpu_percent=38.0, ram_used=21e9, ram_total=64e9,
                      cpu_history=history)
    counts: dict[str, int] = {}
    for r in made:
        counts[r.status] = counts.get(r.status, 0) + 1
    config = {r.id: {"task": r.task, **r.trainer, **r.task_args} for r in runs}
    details = {r.id: RunDetail(config[r.id], {**demo.DIAGNOSED, "status": row.status,
                                               "environment": {**demo.DIAGNOSED["environment"],
                                                               "gpu": GPU}}, None)
               for r, row in zip(runs, made, strict=True)}
    return FakeSource(
        [Update(runs=tuple(made), engine=EngineState(True, False, counts), machine=machine)],
        root="~/work/runs",
        metrics={r.id: records(r, row.step) for r, row in zip(runs, made, strict=True)},
        details=details, tables={"tricks": ablation_table(runs, made)},
        output={r.id: "".join(f"epoch {e} loss {0.6 / e:.4f}\n" for e in range(1, 4)) for r in runs})


# ---- the pictures ---------------------------------------------------------------------

async def _settle(pilot: Any) -> None:
    for _ in range(250):
        if pilot.app.ticks >= 1:
            break
        await pilot.pause(0.02)
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def _until(pilot: Any, cond: Callable[[], bool]) -> None:
    for _ in range(250):
        if cond():
            return
        await pilot.pause(0.02)
    raise RuntimeError("the interface never reached the state to picture")


async def _runs_table(pilot: Any) -> None:
    await _settle(pilot)


async def _detail(pilot: Any) -> None:
    await _settle(pilot)
    await pilot.press("down", "down", "down", "enter")  # a completed width-lr run
    await _until(pilot, lambda: "train loss" in getattr(pilot.app.screen, "data", {}).series)
    await pilot.pause()


async def _compare(pilot: Any) -> None:
    await _settle(pilot)
    await pilot.press("end", "t")  # the cursor on a tricks run: its ablation table
    await _until(pilot, lambda: getattr(pilot.app.screen, "shown", None) is not None)
    await pilot.pause()


# name: (terminal size, what to do before the picture)
SHOTS: dict[str, tuple[tuple[int, int], Callable[[Any], Awaitable[None]]]] = {
    "runs-table": ((120, 30), _runs_table),
    "run-detail": ((120, 36), _detail),
    "compare": ((110, 14), _compare),
    "machine-panel": ((100, 12), _runs_table),
}


async def shoot(name: str) -> str:
    from gridrun.tui.app import GridrunApp

    size, before = SHOTS[name]
    app = GridrunApp(source(), clock=lambda: NOW, live=False)
    async with app.run_test(size=size) as pilot:
        await before(pilot)
        app.clear_notifications()
        await pilot.pause()
        return app.export_screenshot(title=f"gridrun: {name.replace('-', ' ')}")


def picture(name: str) -> str:
    return asyncio.run(shoot(name))


def pictures() -> dict[str, Callable[[], str]]:
    return {f"docs/images/{name}.svg": (lambda n=name: picture(n)) for name in SHOTS}
