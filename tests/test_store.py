"""The store: real SQLite files, several connections and processes at once."""

from __future__ import annotations

import multiprocessing
import re
import sqlite3
import stat

import patience
import pytest
from test_engine_kit import make_run

from gridrun.runs import states
from gridrun.runs.store import MIGRATIONS, RunNotFound, Store


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "runs") as s:
        yield s


def test_creates_private_files_wal_and_schema_version(tmp_path):
    root = tmp_path / "runs"
    Store(root).close()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "gridrun.db").stat().st_mode) == 0o600
    db = sqlite3.connect(root / "gridrun.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    Store(root).close()  # opening again migrates nothing


def test_refuses_a_newer_schema(tmp_path):
    root = tmp_path / "runs"
    Store(root).close()
    db = sqlite3.connect(root / "gridrun.db")
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    db.commit()
    with pytest.raises(RuntimeError, match="newer gridrun"):
        Store(root)


def test_a_root_has_one_identity_made_with_its_store_and_kept(tmp_path):
    """Two roots holding the same run ids are told apart (the MLflow mirror keys a run by
    its root and its id): each store gets a random root id once, kept for its life; an older
    store gets one when it is migrated."""
    a, b = tmp_path / "a", tmp_path / "b"
    with Store(a) as store:
        first = store.root_id()
        store.enqueue([make_run()])
    with Store(b) as store:
        store.enqueue([make_run()])  # the same run id
        assert store.root_id() != first
    assert re.fullmatch("[0-9a-f]{16}", first)
    with Store(a) as store:
        assert store.root_id() == first
    with Store(a, create=False, create_store=False) as reader:
        assert reader.root_id() == first
    db = sqlite3.connect(a / "gridrun.db")  # as a store from before root ids was
    db.execute("DELETE FROM state WHERE key = 'root_id'")
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) - 1}")
    db.commit()
    db.close()
    with Store(a) as store:
        older = store.root_id()
    with Store(a) as store:
        assert store.root_id() == older != first and len(store.list_runs()) == 1


def test_enqueue_skips_known_cells_and_force_queues_a_new_attempt(store):
    a, b = make_run(seed=0), make_run(seed=1)
    assert store.enqueue([a, b], {"git_commit": "abc"}) == ([a.id, b.id], [])
    assert store.enqueue([a, b]) == ([], [a.id, b.id])
    assert store.transition(a.id, states.QUEUED, states.RUNNING)
    assert store.transition(a.id, states.RUNNING, states.COMPLETED)
    assert store.enqueue([a]) == ([], [a.id])
    assert store.enqueue([a], force=True) == ([a.id], [])
    run = store.get_run(a.id)
    assert (run.status, run.attempt, run.fresh) == (states.QUEUED, 2, True)
    assert store.get_run(b.id).provenance == {"git_commit": "abc"}


def test_failed_cells_are_queued_again_without_force(store):
    a = make_run()
    store.enqueue([a])
    store.transition(a.id, states.QUEUED, states.RUNNING)
    store.transition(a.id, states.RUNNING, states.FAILED, error="boom")
    assert store.enqueue([a]) == ([a.id], [])
    run = store.get_run(a.id)
    assert (run.status, run.attempt, run.error, run.fresh) == (states.QUEUED, 2, None, False)


def test_unique_prefixes(store):
    runs = [make_run(seed=s) for s in range(40)]
    store.enqueue(runs)
    rid = runs[0].id
    assert store.get_run(rid[:8]).id == rid
    with pytest.raises(RunNotFound, match="no run matches"):
        store.get_run("zzzz")
    with pytest.raises(RunNotFound, match="several runs"):
        store.get_run("")


def test_transitions_are_guarded(store):
    a = make_run()
    store.enqueue([a])
    assert store.transition(a.id, states.QUEUED, states.RUNNING, slot="cpu0")
    assert not store.transition(a.id, states.QUEUED, states.RUNNING, slot="cpu1")
    assert store.get_run(a.id).slot == "cpu0"


def test_changes_since_returns_only_what_changed(store):
    a, b = make_run(seed=0), make_run(seed=1)
    store.enqueue([a, b])
    rows, seq = store.changes_since(0)
    assert {r.id for r in rows} == {a.id, b.id}
    assert store.changes_since(seq) == ([], seq)
    store.transition(b.id, states.QUEUED, states.RUNNING)
    rows, seq2 = store.changes_since(seq)
    assert [r.id for r in rows] == [b.id] and seq2 > seq


def test_a_first_read_comes_in_queue_order_not_id_or_change_order(store):
    runs = [make_run(seed=s) for s in range(6)]  # ids are hashes: not in this order
    store.enqueue(runs)
    store.transition(runs[0].id, states.QUEUED, states.RUNNING)  # changed last
    store.set_priority([runs[4].id], 2)
    rows, _ = store.changes_since(0)
    assert [r.id for r in rows] == [runs[i].id for i in (4, 0, 1, 2, 3, 5)]


def test_queue_order_is_priority_then_first_in(store):
    runs = [make_run(seed=s) for s in range(4)]
    store.enqueue(runs)
    store.set_priority([runs[2].id], 5)
    store.set_priority([runs[3].id], 1)
    store.set_priority([runs[3].id], 10, relative=True)
    assert [r.id for r in store.next_queued(10)] == [runs[i].id for i in (3, 2, 0, 1)]


def test_cancel_retry_pause(store):
    a, b = make_run(seed=0), make_run(seed=1)
    store.enqueue([a, b])
    store.transition(b.id, states.QUEUED, states.RUNNING)
    assert store.cancel([a.id, b.id]) == {a.id: "cancelled", b.id: "cancelling"}
    pending = store.intents(pending=True)
    assert [(i.kind, i.run_id) for i in pending] == [("cancel", b.id)]
    store.mark_applied(pending[0].id, "stopping")
    assert store.intents(pending=True) == []
    assert store.retry([a.id]) == {a.id: "queued"}
    assert store.get_run(a.id).attempt == 2
    assert store.retry([b.id])[b.id].startswith("not retried")
    assert not store.paused
    store.pause()
    assert store.paused
    store.resume()
    assert not store.paused


def test_telemetry_history_is_bounded(store):
    for i in range(200):
        store.record_telemetry({"i": i}, t=1000.0 + i, keep=50)
    assert store.latest_telemetry().data == {"i": 199}
    since = store.telemetry_since(1190.0)
    assert [s.data["i"] for s in since] == list(range(191, 200))
    assert len(store.telemetry_since(0)) <= 50 + 64


def _hammer(root, ids, n, worker):
    # a separate process acting like a CLI: retries, cancels and reprioritises
    with Store(root) as s:
        for i in range(n):
            s.cancel(ids) if (i + worker) % 2 else s.retry(ids)
            s.set_priority(ids, 1, relative=True)


def test_two_clients_at_once_keep_the_store_consistent(tmp_path):
    root = tmp_path / "runs"
    runs = [make_run(seed=s) for s in range(5)]
    with Store(root) as s:
        s.enqueue(runs)
    ids = [r.id for r in runs]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(root, ids, 30, w)) for w in range(2)]
    for p in procs:
        p.start()
    with Store(root) as s:  # meanwhile an "engine" takes runs with guarded updates
        taken = [r.id for r in s.list_runs() if s.transition(r.id, states.QUEUED, states.RUNNING)]
    for p in procs:
        patience.wait_for(lambda p=p: not p.is_alive(), 60, what=f"hammering process {p.pid} to end")
        assert p.exitcode == 0
    with Store(root) as s:
        rows = s.list_runs()
        assert all(r.priority == 60 for r in rows)
        assert all(r.status in (states.QUEUED, states.CANCELLED) for r in rows if r.id not in taken)
        assert all(s.get_run(t).status == states.RUNNING for t in taken)
        seqs = [r.seq for r in rows]
        assert len(set(seqs)) == len(seqs)
        assert s.get_state("seq") >= max(seqs)


def _open_and_close(root, barrier) -> None:
    barrier.wait()
    for _ in range(20):
        Store(root).close()


def test_many_processes_open_and_close_a_new_store_at_once(tmp_path):
    # two `gridrun queue` at once on a new root once died with "database is locked":
    # switching to WAL, or opening while the last connection closes, skips the busy timeout
    ctx = multiprocessing.get_context("fork")
    for attempt in range(10):
        root = tmp_path / f"runs{attempt}"
        barrier = ctx.Barrier(4)
        procs = [ctx.Process(target=_open_and_close, args=(root, barrier)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            patience.wait_for(lambda p=p: not p.is_alive(), 60, what=f"process {p.pid} to end")
        assert [p.exitcode for p in procs] == [0] * 4
        with Store(root) as s:
            assert s.list_runs() == []


def test_config_has_keeps_the_search_trials_of_a_store_of_grid_runs(store, tmp_path):
    """The engine's search pass asks for `"asha"` configs only: the grid runs beside a
    search are never parsed, and every trial is found."""
    from search_kit import search_runs

    from gridrun.engine.search import SCHEDULER, scheduled

    trials = search_runs(tmp_path)
    store.enqueue([make_run(seed=s) for s in range(20)] + trials)
    found = store.list_runs(config_has=f'"{SCHEDULER}"')
    assert sorted(r.id for r in found) == sorted(r.id for r in trials)
    assert all(scheduled(r) for r in found)


def test_a_rewritten_config_keeps_the_order_it_was_queued_in(store, tmp_path):
    """A promoted trial's config (rewritten by the engine) keeps its keys in the order
    of the queued one: the file's order of its searched keys, which compare's columns
    follow (sorted keys in promoted trials only made the columns' order depend on
    which trial's folder came first)."""
    from search_kit import search_runs

    from gridrun.analysis.frames import load_rows

    trial = search_runs(tmp_path)[0]
    store.enqueue([trial])
    queued = list(store.get_run(trial.id).config["axes"])
    assert queued == list(trial.axes) and queued != sorted(queued)
    assert store.transition(trial.id, states.QUEUED, states.RUNNING)
    assert store.transition(trial.id, states.RUNNING, states.WAITING)
    assert store.transition(trial.id, states.WAITING, states.QUEUED,
                            config=trial.paused_at(3).to_dict())
    assert list(store.get_run(trial.id).config["axes"]) == queued
    assert list(store.get_run(trial.id).config) == list(trial.to_dict())
    assert load_rows(store.root).attrs["axes"] == queued


def test_a_refused_retry_says_why_and_what_to_do(store, tmp_path):
    """`gridrun retry` of a run that cannot be retried names its state, why, and for a
    trial the search stopped, how its values train on."""
    from search_kit import search_runs

    trial, other = search_runs(tmp_path)[:2]
    done = make_run(seed=3)
    store.enqueue([trial, other, done])
    for run_id, path in ((trial.id, [states.RUNNING, states.WAITING, states.STOPPED]),
                         (other.id, [states.RUNNING, states.WAITING]),
                         (done.id, [states.RUNNING, states.COMPLETED])):
        before = states.QUEUED
        for status in path:
            assert store.transition(run_id, before, status)
            before = status
    said = store.retry([trial.id, other.id, done.id])
    assert said[trial.id].startswith("not retried: it is stopped: its search stopped it at a "
                                     "rung, a decision that stands")
    assert "as an experiment of their own" in said[trial.id]
    assert said[other.id] == "not retried: it is waiting: for its search's decision at its rung"
    assert said[done.id].startswith("not retried: it is completed: ")
    assert store.retry(["nope"])["nope"] == "not retried: it is unknown"
    assert {r.status for r in store.list_runs()} == {states.STOPPED, states.WAITING,
                                                     states.COMPLETED}
