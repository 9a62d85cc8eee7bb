"""The interface under load: measured, not asserted.

    .venv/bin/python benchmarks/bench_tui.py [--runs 10000] [--log-runs 1000] [--points 10000]

1. Cold start to first paint, in fresh interpreters: a bare Textual app (the
   baseline), gridrun on an empty fake source, gridrun on a real store with
   --runs runs. Reported as seconds and as a ratio to the baseline.
2. With --runs rows in the table (headless Pilot): keypress-to-paint for j/k,
   sorting, filtering; updating changed cells.
3. The bridge's work per tick on a real store with --runs runs, of which
   --log-runs have a metrics log of --points lines (a few are running and
   their logs grow between ticks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIRST_PAINT = r"""
import time, sys
t0 = time.perf_counter()
kind, root = sys.argv[1], sys.argv[2]
from textual.app import App
if kind == "bare":
    from textual.widgets import Static
    class Bare(App):
        def compose(self):
            yield Static("hello")
    app = Bare()
else:
    from gridrun.tui.app import GridrunApp
    if kind == "fake":
        from gridrun.tui.source import FakeSource
        src = FakeSource()
    else:
        from gridrun.tui.store_source import StoreSource
        src = StoreSource(root)
    app = GridrunApp(src, live=False)
async def main():
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        first = time.perf_counter() - t0
        full = None
        if kind == "store":
            while getattr(app, "ticks", 1) < 1:
                await pilot.pause(0.005)
            await pilot.pause()
            full = time.perf_counter() - t0
        print(first, full, "torch" in sys.modules)
import asyncio
asyncio.run(main())
"""


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def ms(values: list[float]) -> str:
    return (f"p50 {1000 * statistics.median(values):.1f} ms, p95 {1000 * pct(values, 0.95):.1f} ms, "
            f"max {1000 * max(values):.1f} ms (n={len(values)})")


def make_store(root: Path, n: int, log_runs: int, points: int) -> list[str]:
    from gridrun.engine import layout
    from gridrun.engine.spec import RunSpec, run_id
    from gridrun.engine.store import Store

    specs = []
    for i in range(n):
        trainer = {"lr": 10 ** -(1 + i % 4), "epochs": 10}
        args = {"hidden": 16 * (1 + i % 8), "i": i}
        specs.append(RunSpec(run_id(f"exp{i % 5}", "spirals", trainer, args, i % 3), f"exp{i % 5}",
                             f"lr={trainer['lr']:g} hidden={args['hidden']}", i % 3, "spirals",
                             trainer, args, {"lr": trainer["lr"]}))
    running = []
    with Store(root) as store:
        store.enqueue(specs)
        for k, s in enumerate(specs[:log_runs]):
            folder = layout.make_private_dir(layout.run_dir(root, s.experiment, s.id))
            with open(folder / layout.METRICS, "w") as f:
                for step in range(1, points + 1):
                    f.write(json.dumps({"t": step, "step": step, "epoch": step // 1000,
                                        "split": "train", "loss": 1 / step, "lr": 1e-3,
                                        "samples_per_s": 5000.0, "step_time": 0.01}) + "\n")
            if k < 8:
                store.transition(s.id, "queued", "running", slot=f"cpu{k}", started_at=time.time())
                running.append(s.id)
            else:
                store.transition(s.id, "queued", "completed", started_at=1.0, ended_at=2.0,
                                 summary={"step": points, "total_steps": points, "train_loss": 0.1,
                                          "best": {"loss": 0.1}, "early_stop_metric": "loss"})
    return running


def bench_first_paint(root: Path) -> None:
    print("## cold start to first paint (fresh interpreter, headless 120x40)")
    results = {}
    for kind in ("bare", "fake", "store"):
        times = []
        for _ in range(3):
            out = subprocess.run([sys.executable, "-c", FIRST_PAINT, kind, str(root)],
                                 capture_output=True, text=True, check=True, cwd=ROOT)
            first, full, torch = out.stdout.split()
            times.append((float(first), None if full == "None" else float(full)))
            assert torch == "False"
        results[kind] = min(t[0] for t in times)
        extra = ""
        if kind == "store":
            extra = f"; all rows in the table: {min(t[1] for t in times):.3f} s"
        print(f"{kind:>6}: first paint {results[kind]:.3f} s (best of 3), "
              f"x{results[kind] / results['bare']:.2f} of a bare Textual app{extra}")


async def bench_table(n: int) -> None:
    from gridrun.tui import demo
    from gridrun.tui.app import GridrunApp

    print(f"## {n:,} runs in the table (headless Pilot, 120x40)")
    src = demo.source(n)
    app = GridrunApp(src, clock=lambda: demo.NOW, live=False)
    t0 = time.perf_counter()
    async with app.run_test(size=(120, 40)) as pilot:
        while app.ticks < 1:
            await pilot.pause(0.005)
        await pilot.pause()
        print(f"first {n:,} rows applied and painted: {time.perf_counter() - t0:.3f} s")
        table = app.main.table
        press = []
        for key in ["j"] * 40 + ["k"] * 20:
            t = time.perf_counter()
            await pilot.press(key)
            await pilot.pause()
            press.append(time.perf_counter() - t)
        print(f"keypress j/k to paint: {ms(press)}")
        sort = []
        for _ in range(4):
            t = time.perf_counter()
            await pilot.press("s")
            await pilot.pause()
            sort.append(time.perf_counter() - t)
        print(f"sort (s) {n:,} rows: {ms(sort)}")
        await pilot.press("slash", "f", "a", "i")
        t = time.perf_counter()
        await pilot.press("l")
        while table.row_count == n:  # the filter applies once typing pauses (150 ms)
            await pilot.pause(0.005)
        await pilot.pause()
        print(f"filter: last keystroke of '/fail' to the filtered table painted "
              f"(incl. the 150 ms debounce): {1000 * (time.perf_counter() - t):.0f} ms; "
              f"{table.row_count:,} of {n:,} rows shown")
        await pilot.press("escape")
        await pilot.pause()
        running = [r for r in table.runs.values() if r.status == "running"][:100]
        updates = []
        for k in range(20):
            rows = [replace(r, step=r.step + k + 1, train_loss=0.5 / (k + 1)) for r in running]
            t = time.perf_counter()
            app.main.runs_changed(tuple(rows))
            await pilot.pause()
            updates.append(time.perf_counter() - t)
        print(f"update {len(running)} changed rows of {n:,} and paint: {ms(updates)}")


def bench_bridge(root: Path, running: list[str], points: int) -> None:
    from gridrun.engine import layout
    from gridrun.engine.store import Store
    from gridrun.tui.bridge import Bridge
    from gridrun.tui.store_source import StoreSource

    print("## the bridge's work per tick (real store)")
    src = StoreSource(root)
    bridge = Bridge(src)
    t = time.perf_counter()
    bridge.tick()
    print(f"first tick (every run, every running run's whole log): {time.perf_counter() - t:.3f} s")
    bridge.watch(running[0])  # a detail screen open on a run with `points` points
    t = time.perf_counter()
    bridge.tick()
    print(f"tick that loads a watched run's {points:,}-point log: {1000 * (time.perf_counter() - t):.1f} ms")
    with Store(root) as store:
        folders = {i: layout.run_dir(root, store.get_run(i).experiment, i) for i in running}
        ticks = []
        for k in range(30):
            for folder in folders.values():  # each running run logs a line between ticks
                with open(folder / layout.METRICS, "a") as f:
                    f.write(json.dumps({"t": 0, "step": points + k, "epoch": 9, "split": "train",
                                        "loss": 0.01, "samples_per_s": 5000.0}) + "\n")
            if k % 3 == 0:
                store.set_priority([running[-1]], 1, relative=True)
            t = time.perf_counter()
            bridge.tick()
            ticks.append(time.perf_counter() - t)
    print(f"steady tick ({len(running)} logs growing, a priority change every 3rd tick): {ms(ticks)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--log-runs", type=int, default=1_000)
    ap.add_argument("--points", type=int, default=10_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        t = time.perf_counter()
        running = make_store(root, args.runs, args.log_runs, args.points)
        size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        print(f"# store: {args.runs:,} runs, {args.log_runs:,} logs x {args.points:,} points "
              f"({size / 2**20:.0f} MiB) built in {time.perf_counter() - t:.1f} s; "
              f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}")
        bench_first_paint(root)
        asyncio.run(bench_table(args.runs))
        bench_bridge(root, running, args.points)


if __name__ == "__main__":
    main()
