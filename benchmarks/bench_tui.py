"""The interface under load: measured, not asserted.

    .venv/bin/python benchmarks/bench_tui.py [--runs 10000] [--log-runs 1000] [--points 10000]

1. Cold start, in fresh interpreters: a bare Textual app (the baseline),
   gridrun on an empty fake source, gridrun on a real store with --runs runs.
   Two times for the store: its first frame, and the first frame with every
   row in the table. Reported as seconds and as a ratio to the baseline.
2. With --runs rows in the table (headless): keypress-to-paint for j/k,
   sorting, filtering; updating changed cells. A key goes into the driver as a
   terminal's would, and the time runs until the next frame is composed (a
   Pilot press + pause costs 60-80 ms of idle waits whatever the app does, so
   it is not used for timing). The baseline: a bare DataTable with as many rows.
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

from textual import events

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIRST_PAINT = r"""
import time, sys
t0 = time.perf_counter()
kind, root, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
from textual.app import App
frames = []  # (seconds since start, rows in the table) for each frame composed
display = App._display
def on_display(self, screen, renderable):
    if renderable is not None:
        frames.append((time.perf_counter() - t0, self.main.table.row_count if kind != "bare" else 0))
    return display(self, screen, renderable)
App._display = on_display
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
    async with app.run_test(size=(120, 40)):
        while not frames:
            await asyncio.sleep(0.001)
        full = None
        if kind == "store":
            while frames[-1][1] < n:
                await asyncio.sleep(0.001)
            full = next(t for t, rows in frames if rows >= n)
        print(frames[0][0], full, "torch" in sys.modules)
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
    from gridrun.runs import layout
    from gridrun.runs.store import Store
    from gridrun.spec import RunSpec, run_id

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


def bench_first_paint(root: Path, n: int) -> None:
    print("## cold start to first frame (fresh interpreter, headless 120x40)")
    results = {}
    for kind in ("bare", "fake", "store"):
        times = []
        for _ in range(3):
            out = subprocess.run([sys.executable, "-c", FIRST_PAINT, kind, str(root), str(n)],
                                 capture_output=True, text=True, check=True, cwd=ROOT)
            first, full, torch = out.stdout.split()
            times.append((float(first), None if full == "None" else float(full)))
            assert torch == "False"
        results[kind] = min(t[0] for t in times)
        extra = ""
        if kind == "store":
            full = min(t[1] for t in times)
            extra = (f"; first frame with all {n:,} rows in the table: {full:.3f} s, "
                     f"x{full / results['bare']:.2f}")
        print(f"{kind:>6}: first frame {results[kind]:.3f} s (best of 3), "
              f"x{results[kind] / results['bare']:.2f} of a bare Textual app{extra}")


class Frames:
    """When `app` composes a frame (headless: composed, not written), with the row count."""

    def __init__(self, app, table=lambda app: app.main.table) -> None:
        self.app, self.log = app, []
        display = app._display

        def on_display(screen, renderable) -> None:
            if renderable is not None:
                self.log.append((time.perf_counter(), table(app).row_count))
            return display(screen, renderable)
        app._display = on_display

    async def first(self, after: int, cond=lambda rows: True) -> tuple[float, int]:
        """The first frame past the `after` frames so far whose row count meets `cond`."""
        deadline = time.perf_counter() + 30
        while time.perf_counter() < deadline:
            hit = next((f for f in self.log[after:] if cond(f[1])), None)
            if hit:
                return hit
            await asyncio.sleep(0.0005)
        raise TimeoutError("no frame came in 30 s")

    async def after(self, act) -> float:
        """Seconds from `act()` (on an idle app) to the next frame."""
        await asyncio.sleep(0.03)  # idle: nothing pending, nothing dirty
        seen, t = len(self.log), time.perf_counter()
        act()
        return (await self.first(seen))[0] - t

    def key(self, key: str):
        def press() -> None:  # as a terminal's keystroke arrives
            event = events.Key(key, key if len(key) == 1 else None)
            event.set_sender(self.app)
            self.app._driver.send_message(event)
        return press


async def bare_keys(n: int) -> list[float]:
    """The baseline: a bare DataTable with `n` rows, 14 columns, the cursor moved by arrows."""
    from textual.app import App
    from textual.widgets import DataTable

    class Bare(App):
        def compose(self):
            yield DataTable(cursor_type="row")

        def on_mount(self) -> None:
            table = self.query_one(DataTable)
            for c in range(14):
                table.add_column(f"c{c}", width=7)
            for i in range(n):
                table.add_row(*(f"{c}:{i}" for c in range(14)), key=str(i))
            table.focus()

    app = Bare()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        frames = Frames(app, lambda app: app.query_one(DataTable))
        return [await frames.after(frames.key(k)) for k in ["down"] * 40 + ["up"] * 20]


async def bench_table(n: int) -> None:
    from gridrun.tui import demo
    from gridrun.tui.app import GridrunApp

    print(f"## {n:,} runs in the table (headless, 120x40; from the key sent to the next frame)")
    src = demo.source(n)
    app = GridrunApp(src, clock=lambda: demo.NOW, live=False)
    t0 = time.perf_counter()
    async with app.run_test(size=(120, 40)) as pilot:
        frames = Frames(app)
        full = await frames.first(0, lambda rows: rows >= n)
        print(f"first {n:,} rows applied and painted: {full[0] - t0:.3f} s")
        await pilot.pause()
        table = app.main.table
        press = [await frames.after(frames.key(k)) for k in ["j"] * 40 + ["k"] * 20]
        bare = await bare_keys(n)
        print(f"keypress j/k to paint: {ms(press)}")
        print(f"  baseline, a bare DataTable with {n:,} rows: {ms(bare)}; "
              f"p50 x{statistics.median(press) / statistics.median(bare):.2f}, "
              f"p95 x{pct(press, 0.95) / pct(bare, 0.95):.2f}")
        # `s` opens a menu; its key picks the column: time the sort itself, menu to frame
        sort = [await frames.after(lambda c=c: table.sort_by(c))
                for c in ("status", "experiment", "progress", "loss")]
        print(f"sort (s, then a column's key) {n:,} rows: {ms(sort)}")
        table.sort_by(None)
        app.clear_notifications()  # no toast may time out during a later measurement
        await pilot.press("slash", "f", "a", "i")
        await asyncio.sleep(0.03)
        seen, t = len(frames.log), time.perf_counter()
        frames.key("l")()
        shown = await frames.first(seen, lambda rows: rows != n)  # once typing pauses (150 ms)
        print(f"filter: last keystroke of '/fail' to the filtered table painted "
              f"(incl. the 150 ms debounce): {1000 * (shown[0] - t):.0f} ms; "
              f"{table.row_count:,} of {n:,} rows shown")
        await pilot.press("escape")
        table.sort_column, table.reverse = None, False  # queue order, the cursor on top
        table.resort()
        table.move_cursor(row=0)
        await pilot.pause()
        running = [table.runs[i] for i in table.order if table.runs[i].status == "running"][:100]
        top = [table.runs[i] for i in table.order[:100]]  # every visible row changes
        for name, changing in (("live runs (1 in 8 rows)", running), ("the top rows", top)):
            updates = []
            for k in range(20):
                rows = tuple(replace(r, step=r.step + k + 1, train_loss=0.5 / (k + 1))
                             for r in changing)
                updates.append(await frames.after(lambda rows=rows: app.main.runs_changed(rows)))
            print(f"update {len(changing)} changed rows of {n:,} ({name}) and paint: {ms(updates)}")


def bench_bridge(root: Path, running: list[str], points: int) -> None:
    from gridrun.runs import layout
    from gridrun.runs.store import Store
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
        bench_first_paint(root, args.runs)
        asyncio.run(bench_table(args.runs))
        bench_bridge(root, running, args.points)


if __name__ == "__main__":
    main()
