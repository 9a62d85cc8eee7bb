"""A search's stopped trial says `stopped` in every record: its summary.json, the store
(ls, exports, the interface), `gridrun.load_run` and a store rebuilt from the folders.
The trials pause by hand (a summary.json as the worker writes it at a rung), so the
engine's half of the search runs in milliseconds, without training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from search_kit import SMALL, search_runs
from typer.testing import CliRunner

import gridrun
from gridrun.cli import app
from gridrun.engine.search import Searches
from gridrun.runs import layout, records, runlog, states
from gridrun.runs.store import Store
from gridrun.spec import write_run_config

ACCURACY = {0: 0.5, 1: 0.8, 2: 0.6, 3: 0.7}  # at rung 0 (epoch 1): t1 and t3 go on


def paused(root: Path, run, accuracy: float) -> dict:
    """The run's folder as the worker leaves it at its first rung: config.toml and a
    summary.json that says waiting; the store told as the engine tells it."""
    folder = layout.make_run_dir(root, run.experiment, run.id)
    write_run_config(folder / layout.CONFIG, run)
    summary = {"run_id": run.id, "experiment": run.experiment, "status": states.WAITING,
               "epoch": run.pause_at, "step": 4, "early_stop_metric": "accuracy",
               "metrics": {"loss": "lower", "accuracy": "higher"},
               "final": {"loss": 1 - accuracy, "accuracy": accuracy},
               "best": {"loss": 1 - accuracy, "accuracy": accuracy}, "started_at": 1.0,
               "ended_at": 2.0}
    (folder / layout.SUMMARY).write_text(json.dumps(summary, indent=1))
    with runlog.MetricsWriter(folder / layout.METRICS) as log:
        log.write(records.val_line(1.5, 4, run.pause_at, summary["final"]))
    return summary


@pytest.fixture
def search(tmp_path):
    """A 4-trial search paused at its first rung, every trial waiting; its root and runs."""
    runs = search_runs(tmp_path, SMALL)
    root = tmp_path / "runs"
    with Store(root) as store:
        store.enqueue(runs)
        for run in runs:
            summary = paused(root, run, ACCURACY[run.trial])
            assert store.transition(run.id, states.QUEUED, states.WAITING, summary=summary,
                                    started_at=1.0, ended_at=2.0)
    return root, {r.trial: r for r in runs}


def file_status(root: Path, run) -> str:
    return json.loads((layout.run_dir(root, run.experiment, run.id) / layout.SUMMARY)
                      .read_text())["status"]


def listed(root: Path) -> dict[str, str]:
    """`gridrun ls`: each run's status (its lines, not the header or a footer)."""
    out = CliRunner().invoke(app, ["ls", "--root", str(root)])
    assert out.exit_code == 0, out.output
    return {cells[0]: cells[1] for cells in map(str.split, out.output.splitlines()[1:])
            if len(cells) > 1 and cells[1] in states.ALL}


def test_a_stopped_trial_says_stopped_in_its_summary_load_run_and_ls(search):
    root, trials = search
    with Store(root) as store:
        assert Searches(store).update() == 4
        status = {r.config["trial"]: r.status for r in store.list_runs()}
        stored = {r.config["trial"]: r.summary["status"] for r in store.list_runs()}
    assert status == {0: states.STOPPED, 1: states.QUEUED, 2: states.STOPPED, 3: states.QUEUED}
    shown = listed(root)
    for t in (0, 2):
        run = trials[t]
        assert file_status(root, run) == states.STOPPED
        assert gridrun.load_run(layout.run_dir(root, run.experiment, run.id)).summary.status \
            == states.STOPPED
        assert shown[run.id] == states.STOPPED
        assert stored[t] == states.STOPPED  # the store's copy, which exports and the interface read
    # a promoted trial's summary is the record of where it last paused: it says so until
    # its next stretch ends and the worker writes it again
    assert {file_status(root, trials[t]) for t in (1, 3)} == {states.WAITING}


def test_an_engine_killed_before_rewriting_the_summary_heals_on_its_next_pass(search, monkeypatch):
    """The store moved the trial to stopped, the engine died before summary.json said so:
    the next engine's first look at the search rewrites it, and reads no summary after."""
    root, trials = search
    with Store(root) as store:
        Searches(store).update()
        path = layout.run_dir(root, trials[0].experiment, trials[0].id) / layout.SUMMARY
        path.write_text(json.dumps({**json.loads(path.read_text()), "status": states.WAITING}))
        engine = Searches(store)
        assert engine.update() == 0
        assert file_status(root, trials[0]) == states.STOPPED
        assert file_status(root, trials[2]) == states.STOPPED
        read = []
        monkeypatch.setattr(runlog, "restate_summary", lambda *a: read.append(a))
        engine.update()
        assert read == []  # once per search and engine: not a read per stopped trial per pass


def test_the_summary_is_rewritten_atomically_and_never_through_a_link(search, tmp_path):
    root, trials = search
    folder = layout.run_dir(root, trials[0].experiment, trials[0].id)
    secret = tmp_path / "elsewhere.json"
    secret.write_text('{"status": "waiting"}')
    (folder / layout.SUMMARY).unlink()
    (folder / layout.SUMMARY).symlink_to(secret)
    with Store(root) as store:
        Searches(store).update()
        assert store.list_runs(ids=[trials[0].id])[0].status == states.STOPPED
    assert secret.read_text() == '{"status": "waiting"}'  # the link's target is left alone
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert file_status(root, trials[2]) == states.STOPPED


def test_a_rebuilt_store_restores_a_stopped_trial_as_stopped(search):
    from gridrun.checks.rebuild import rebuild

    root, trials = search
    with Store(root) as store:
        Searches(store).update()
        sid = trials[0].search["id"]
        decided = sorted((d.trial, d.epoch, d.kind, d.order) for d in store.search_decisions(sid))
    out = rebuild(root, force=True)
    assert out.restored == {states.STOPPED: 2, states.WAITING: 2}
    with Store(root) as store:
        got = {r.config["trial"]: r for r in store.list_runs()}
        assert {t: r.status for t, r in got.items()} == {
            0: states.STOPPED, 1: states.WAITING, 2: states.STOPPED, 3: states.WAITING}
        assert got[0].note.startswith("stopped at rung 0 (epoch 1)")
        # the decisions come back with the results they follow from
        assert sorted((d.trial, d.epoch, d.kind, d.order)
                      for d in store.search_decisions(sid)) == decided
        assert Searches(store).update() == 2  # the waiting ones promoted again
    assert sorted(listed(root).values()) == [states.QUEUED] * 2 + [states.STOPPED] * 2
