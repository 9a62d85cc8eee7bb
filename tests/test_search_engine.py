"""A search's decisions are the same whoever runs it: the real engine with one slot,
with two, and an engine killed with SIGKILL mid-search and started again give the
same trials, the same promotions in the same order, the same stopped trials, the
same winner and the winner's same weights."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from test_engine_kit import drain, engine_for, finished, wait_for

from gridrun.engine import daemon, promotion
from gridrun.engine.search import decisions_of, trial_results
from gridrun.runs import states
from gridrun.runs.store import Store
from gridrun.spec import EngineConfig, load_runs

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


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = tmp_path_factory.mktemp("file") / "search.toml"
    path.write_text(SEARCH)
    return load_runs(path)


def outcome(store: Store) -> dict:
    rows = store.list_runs()
    sid = rows[0].config["search"]["id"]
    decided = store.search_decisions(sid)
    results = trial_results(rows, store.search_results(sid))
    trials = sorted(r.config["trial"] for r in rows)
    best = promotion.winner(trials, [1, 3, 9], results, "max")
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


def in_process(root: Path, backend, runs, slots: int) -> dict:
    with Store(root) as store:
        store.enqueue(runs)
        engine = engine_for(root, backend, slots=slots)
        engine.start()
        drain(engine, timeout=180)
        return outcome(store)


@pytest.mark.slow
def test_one_slot_two_slots_and_a_killed_engine_decide_the_same(tmp_path, backend, runs):
    one = in_process(tmp_path / "one", backend, runs, 1)
    assert one["recomputed"] == one["kept"]
    assert len(one["promotions"]) == 3 + 1  # 9 -> 3 -> 1
    assert sum(s == states.STOPPED for s in one["states"].values()) == 8
    assert one["states"][one["winner"]] == states.COMPLETED
    views(tmp_path / "one", one)
    two = in_process(tmp_path / "two", backend, runs, 2)
    assert two == one

    root = tmp_path / "killed"
    with Store(root) as store:
        store.enqueue(runs)
        sid = runs[0].search["id"]
        st = daemon.start(root, EngineConfig(gpus=(), cpu_slots=2))
        # killed once the search has decided something, before it has decided everything
        wait_for(lambda: store.search_decisions(sid), timeout=120, interval=0.02)
        os.kill(st.pid, signal.SIGKILL)  # its workers go on, orphaned, and are adopted
        wait_for(lambda: not daemon.status(root).running)
        assert len(store.search_decisions(sid)) < len(one["kept"])
        daemon.start(root, EngineConfig(gpus=(), cpu_slots=2))
        try:
            wait_for(lambda: finished(store, [r.id for r in runs]), timeout=180)
            killed = outcome(store)
        finally:
            daemon.stop(root)
    assert killed == one


def views(root: Path, done: dict) -> None:
    """ls, compare and export over the finished search."""
    import csv

    from typer.testing import CliRunner

    from gridrun.cli import app

    def cli(*args: str) -> str:
        result = CliRunner().invoke(app, [*args, "--root", str(root)])
        assert result.exit_code == 0, result.output
        return result.output

    listed = cli("ls", "--experiment", "tune")
    assert "RUNG  EPOCHS" in listed.splitlines()[0]
    assert "r2    9/9" in listed and "r0    1/9" in listed and "stopped" in listed
    board = cli("compare", "tune")
    assert board.splitlines()[1].startswith("RANK  TRIAL  STATUS")
    assert board.splitlines()[2].startswith(f"1     t{done['winner']} ")
    assert "Spearman rank correlation with accuracy (on the first rung): lr " in board
    cli("export", "-o", str(root / "runs.csv"))
    with open(root / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    used = {int(r["trial"]): (r["rung"], int(r["epochs_used"])) for r in rows}
    assert used[done["winner"]] == ("2", 9)
    assert sum(e for _, e in used.values()) == 9 + 3 * 2 + 1 * 6  # 9 at 1, 3 on to 3, 1 on to 9
