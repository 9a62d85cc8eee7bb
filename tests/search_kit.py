"""A small ASHA search (9 sobol trials, rungs at 1, 3 and 9 epochs of spirals; or 4
trials at 1, 2 and 4 epochs, a quicker one for the cluster backends, whose launches
cost seconds each) and what its engine decided, for the tests that run it on each
backend and compare."""

from __future__ import annotations

from pathlib import Path

from test_engine_kit import drain, engine_for

from gridrun.engine import promotion
from gridrun.engine.search import decisions_of, trial_results
from gridrun.runs.store import Store
from gridrun.spec import load_runs
from gridrun.spec.search import rungs

SEARCH = """
[defaults]
seeds = 1
batch_size = 64
log_every = 4
threads = 1

[experiments.tune]
task = "spirals"
train_size = 256
val_size = 64
depth = 1

[experiments.tune.search]
trials = 9
sampler = "sobol"
seed = 7
params.lr = { dist = "log_uniform", low = 1e-3, high = 1e-1 }
params.hidden = { dist = "choice", values = [8, 16, 32] }
scheduler = "asha"
metric = "accuracy"
min_epochs = 1
max_epochs = 9
eta = 3
"""


SMALL = SEARCH.replace("trials = 9", "trials = 4").replace("max_epochs = 9", "max_epochs = 4") \
    .replace("eta = 3", "eta = 2")


def search_runs(folder: Path, text: str = SEARCH) -> list:
    path = folder / "search.toml"
    path.write_text(text)
    return load_runs(path)


def outcome(store: Store) -> dict:
    rows = store.list_runs()
    sid = rows[0].config["search"]["id"]
    decided = store.search_decisions(sid)
    results = trial_results(rows, store.search_results(sid))
    trials = sorted(r.config["trial"] for r in rows)
    search = rows[0].config["search"]
    epochs = [*rungs(search["min_epochs"], search["max_epochs"], search["eta"]), search["max_epochs"]]
    best = promotion.winner(trials, epochs, results, "max")
    by_trial = {r.config["trial"]: r for r in rows}
    return {
        "values": {r.config["trial"]: r.config["axes"] for r in rows},
        "promotions": [(d.epoch, d.order, d.trial) for d in decided if d.kind == promotion.PROMOTE],
        "stopped": sorted((d.trial, d.epoch) for d in decided if d.kind == promotion.STOP),
        "states": {t: r.status for t, r in by_trial.items()},
        "winner": best,
        "weights": by_trial[best].summary["weights_sha256"],
        # the rule again from the kept results alone: the decisions are a function of them
        "recomputed": sorted((d.trial, d.epoch, d.kind, d.order)
                             for d in decisions_of(rows[0].config["search"], rows,
                                                   store.search_results(sid))),
        "kept": sorted((d.trial, d.epoch, d.kind, d.order) for d in decided),
    }


def drained(root: Path, engine, runs) -> dict:
    """The search queued at `root`, run to the end by an in-process `engine`: its outcome."""
    with Store(root) as store:
        store.enqueue(runs)
        engine.start()
        drain(engine, timeout=240)
        return outcome(store)


def decided_locally(folder: Path, runs) -> dict:
    """The same search on the local backend with 2 slots in `folder`: the reference
    another backend's outcome must equal."""
    from gridrun.engine.backends.local import LocalBackend

    local = LocalBackend()  # its fork server: the reference costs little
    try:
        return drained(folder, engine_for(folder, local, slots=2), runs)
    finally:
        local.close()
