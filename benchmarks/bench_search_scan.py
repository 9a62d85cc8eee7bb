"""The engine's search pass in a big store: what it costs each time a run ends.

    python benchmarks/bench_search_scan.py [--grid 10000] [--trials 27] [--reps 20]

A real store holding `--grid` finished grid runs and a `--trials` ASHA search
(every trial waiting at its first rung, so the pass has work to do). Timed, in
the same run: finding the search's trials by parsing every run's config (how
`Searches.update` found them before) against asking SQLite for the configs
that name the scheduler (how it finds them now), and the whole `update()`
once its decisions are stored (what every later run's end pays).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gridrun.engine.search import SCHEDULER, Searches, scheduled
from gridrun.runs import states
from gridrun.runs.store import Store
from gridrun.spec import load_runs

FILE = """
[defaults]
task = "spirals"
seeds = 1

[experiments.grid]
grid.lr = [{lrs}]

[experiments.tune.search]
trials = {trials}
sampler = "sobol"
params.lr = {{ dist = "log_uniform", low = 1e-4, high = 1e-1 }}
scheduler = "asha"
metric = "accuracy"
min_epochs = 1
max_epochs = 9
eta = 3
"""


def timed(fn, reps: int) -> float:
    """The median of `reps` calls, in milliseconds."""
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", type=int, default=10_000)
    ap.add_argument("--trials", type=int, default=27)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "experiments.toml"
        lrs = ", ".join(f"{1e-4 * (1 + i)}" for i in range(args.grid))
        path.write_text(FILE.format(lrs=lrs, trials=args.trials))
        runs = load_runs(path, force=True)  # a store this big is the point
        with Store(Path(tmp) / "runs") as store:
            store.enqueue(runs)
            for run in runs:  # grid runs finished; trials waiting at epoch 1 with a result
                search = run.trial is not None
                store.transition(run.id, states.QUEUED, states.RUNNING)
                store.transition(run.id, states.RUNNING,
                                 states.WAITING if search else states.COMPLETED,
                                 summary={"epoch": 1, "final": {"accuracy": 0.5 + 0.01 * (run.trial or 0)},
                                          "metrics": {"accuracy": "higher"}})
            parse_all = timed(lambda: [r for r in store.list_runs() if scheduled(r)], args.reps)
            asked = timed(lambda: [r for r in store.list_runs(config_has=f'"{SCHEDULER}"')
                                   if scheduled(r)], args.reps)
            searches = Searches(store)
            moved = searches.update()
            again = timed(lambda: searches.update(), args.reps)
    print(f"store: {args.grid:,} grid runs + {args.trials} trials; python {sys.version.split()[0]}")
    print(f"the first pass decided and moved {moved} trials")
    print(f"{'finding the trials':<34} {'ms':>8}  ratio")
    print(f"{'  parse every config (before)':<34} {parse_all:8.1f}  1.00x")
    print(f"{'  configs naming the scheduler':<34} {asked:8.1f}  {asked / parse_all:.3f}x")
    print(f"{'a whole update() after a run ends':<34} {again:8.1f}  {again / parse_all:.3f}x")


if __name__ == "__main__":
    main()
