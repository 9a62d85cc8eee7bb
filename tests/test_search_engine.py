"""A search's decisions are the same whoever runs it: the real engine with one slot,
with two, and an engine killed with SIGKILL mid-search and started again give the
same trials, the same promotions in the same order, the same stopped trials, the
same winner and the winner's same weights."""

from __future__ import annotations

import os
import re
import shutil
import signal
from pathlib import Path

import pytest
from search_kit import drained, outcome, search_runs
from test_engine_kit import drain, engine_for, finished, wait_for

from gridrun.engine import daemon
from gridrun.runs import states
from gridrun.runs.store import Store
from gridrun.spec import EngineConfig


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return search_runs(tmp_path_factory.mktemp("file"))


def in_process(root: Path, backend, runs, slots: int) -> dict:
    return drained(root, engine_for(root, backend, slots=slots), runs)


def rebuilt_and_decided_again(done: Path, root: Path, backend) -> dict:
    """A finished search's folders whose store is lost, rebuilt by `doctor --rebuild`:
    its stopped trials come back stopped (their summary.json says so), the rung results
    come back from the folders' logs and with them the decisions the engine had taken
    (it waited forever for the results of the rungs trials had passed)."""
    from typer.testing import CliRunner

    from gridrun.checks.rebuild import rebuild
    from gridrun.cli import app

    shutil.copytree(done, root, ignore=shutil.ignore_patterns("gridrun.db*", "engine.*"))
    rebuild(root)
    board = CliRunner().invoke(app, ["compare", "tune", "--root", str(root)])
    assert board.exit_code == 0 and board.output.startswith("search tune: 9 trials"), board.output
    with Store(root) as store:
        assert {r.status for r in store.list_runs()} == {states.STOPPED, states.COMPLETED}
        engine = engine_for(root, backend, slots=2)
        engine.start()
        drain(engine, timeout=240)
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
    assert rebuilt_and_decided_again(tmp_path / "one", tmp_path / "rebuilt", backend) == one

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
    # the interface's `v` on a trial: compare's first five, each trial's runs
    from gridrun.tui.store_source import StoreSource

    source = StoreSource(root)
    try:
        leaders = source.best_trials("tune", 5)
        shown = source.compare("tune")  # `t`: the leaderboard, every trial, as compare prints it
        assert source.compare("tune") is shown  # nothing changed: the same table
        written = source.export_csv("tune", str(root / "board.csv"))  # `e`: what `t` shows
    finally:
        source.store.close()
    assert shown.kind == "leaderboard" and len(shown.rows) == 9
    assert shown.columns[5:7] == ("accuracy↑ at rung end", "best accuracy↑")
    printed = [re.split(r"\s{2,}", line.strip()) for line in board.splitlines()[1:11]
               if line.strip()]
    assert [list(shown.columns), *map(list, shown.rows[:len(printed) - 1])] == printed
    assert shown.best == {(0, 5)} and "budget used: 21 of 81 epochs" in shown.note
    with open(written) as f:
        exported = list(csv.DictReader(f))
    assert [f"t{r['trial']}" for r in exported] == [r[1] for r in shown.rows]
    assert float(exported[0]["accuracy"]) == pytest.approx(float(shown.rows[0][5]), rel=1e-3)
    with Store(root) as store:
        trial_of = {r.id: r.config["trial"] for r in store.list_runs()}
    ranked = [int(line.split()[1][1:]) for line in board.splitlines()[2:7]]
    assert [trial_of[i] for i in leaders.ids] == ranked
    assert (leaders.metric, leaders.mode, leaders.trials, leaders.shown) == ("accuracy", "max", 9, 5)
    # a stopped trial says stopped in every record: ls, the store, its summary.json, load_run
    import gridrun

    assert [line.split()[1] for line in listed.splitlines()[1:-1]].count(states.STOPPED) == 8
    assert listed.splitlines()[-1].startswith("BEST: each run's best evaluation")
    with Store(root) as store:
        for run in store.list_runs():
            said = {run.status, run.summary["status"],
                    gridrun.load_run(run.run_dir(root)).summary.status}
            assert said == {run.status}, (run.id, said)
