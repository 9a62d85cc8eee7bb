"""A search under ASHA against the same trials each trained to the full budget.

    python benchmarks/bench_search.py [--trials 81] [--max-epochs 27] [--slots 2]

Both sides run the same configurations (81 Sobol trials on spirals) through the
real engine (in process, the local backend's warm fork server, 2 CPU slots):
ASHA with eta 3 and rungs at epochs 1, 3, 9, 27, then every trial to epoch 27.
Reported: the epochs each side trained, their wall times and ratio, the rank of
ASHA's winner among the full runs (by their final metric), and the share of slot
time left idle because a rung's decision waited for the trials before it (slots
free, nothing queued, a trial waiting).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

from gridrun.engine import promotion
from gridrun.engine.backends.base import Slot
from gridrun.engine.backends.local import LocalBackend
from gridrun.engine.scheduler import Engine
from gridrun.engine.search import trial_results
from gridrun.runs import states
from gridrun.runs.store import Store
from gridrun.spec import load_runs
from gridrun.spec.search import rungs

FILE = """
[defaults]
task = "spirals"
batch_size = 64
threads = 1
seeds = 1

[experiments.bench]
train_size = 512
val_size = 256
depth = 2

[experiments.bench.search]
trials = {trials}
sampler = "sobol"
params.lr = {{ dist = "log_uniform", low = 1e-4, high = 3e-1 }}
params.hidden = {{ dist = "int_log_uniform", low = 8, high = 128 }}
params.weight_decay = {{ dist = "uniform", low = 0.0, high = 0.1 }}
params.optimizer = {{ dist = "choice", values = ["adamw", "sgd"] }}
scheduler = "asha"
metric = "accuracy"
min_epochs = 1
max_epochs = {max_epochs}
eta = 3
"""


def drain(root: Path, backend: LocalBackend, runs: list, slots: int) -> dict:
    """Run `runs` to the end; wall time and the slot time idle while a trial waited."""
    with Store(root) as store:
        store.enqueue(runs)
        engine = Engine(root, backend, [Slot(f"cpu{i}") for i in range(slots)])
        started = time.perf_counter()
        engine.start()
        idle = 0.0
        last = time.perf_counter()
        while not engine.idle():
            engine.step()
            now = time.perf_counter()
            counts = store.counts()
            free = slots - len(engine.active)
            if free and counts.get(states.WAITING) and not counts.get(states.QUEUED):
                idle += free * (now - last)
            last = now
        wall = time.perf_counter() - started
        rows = store.list_runs()
        kept = store.search_results(rows[0].config["search"]["id"]) \
            if rows[0].config.get("search") else []
    return {"wall": wall, "idle": idle, "rows": rows, "kept": kept}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=81)
    parser.add_argument("--max-epochs", type=int, default=27)
    parser.add_argument("--slots", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "search.toml").write_text(FILE.format(trials=args.trials, max_epochs=args.max_epochs))
        runs = load_runs(tmp / "search.toml")
        # the same configurations, each to the full budget: no search, no pause
        full = [dataclasses.replace(r, trial=None, search=None, pause_at=None) for r in runs]
        backend = LocalBackend(log_path=tmp / "forkserver.log")
        backend.start()
        try:
            asha = drain(tmp / "asha", backend, runs, args.slots)
            straight = drain(tmp / "full", backend, full, args.slots)
        finally:
            backend.close()
    steps = rungs(1, args.max_epochs, 3)
    results = trial_results(asha["rows"], asha["kept"])
    trials = sorted(r.config["trial"] for r in asha["rows"])
    best = promotion.winner(trials, steps, results, "max")
    final = {r.id: (r.summary or {}).get("final", {}).get("accuracy") for r in straight["rows"]}
    by_trial = [final[f.id] for f in full]  # full[i] is trial i's configuration
    order = sorted(range(len(by_trial)), key=lambda t: (-(by_trial[t] or 0.0), t))
    used = sum((r.summary or {}).get("epoch") or 0 for r in asha["rows"])
    out = {
        "trials": len(runs), "rungs": steps, "slots": args.slots,
        "epochs_asha": used, "epochs_full": args.max_epochs * len(runs),
        "epochs_ratio": round(used / (args.max_epochs * len(runs)), 3),
        "wall_asha_s": round(asha["wall"], 1), "wall_full_s": round(straight["wall"], 1),
        "wall_ratio": round(asha["wall"] / straight["wall"], 3),
        "winner": best, "winner_rank_among_full": order.index(best) + 1,
        "winner_accuracy_full": by_trial[best], "best_full_accuracy": by_trial[order[0]],
        "idle_share_asha": round(asha["idle"] / (args.slots * asha["wall"]), 3),
        "stopped": sum(r.status == states.STOPPED for r in asha["rows"]),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
