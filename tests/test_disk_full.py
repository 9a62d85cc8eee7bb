"""A full disk is a state, not a crash (issue 24, findings 1 and 2), on a real full
disk: a 20 MB tmpfs (mounted as root, as CI runs; skipped otherwise) filled by a
file that takes every free byte.

The engine stays up, says it waits for disk space, keeps every run (none failed,
none `running` without a process) and, once the filler is gone, finishes the
queue by itself with the metrics and weights of an undisturbed queue. Commands
say the disk is full instead of blaming the store, and `doctor --rebuild` never
touches a sound store."""

from __future__ import annotations

import json
import os
import sqlite3
import time

import pytest
from test_engine_kit import (
    drain,
    engine_for,
    kill_quietly,
    metrics_without_timing,
    slow_run,
    summary,
    wait_for,
)
from tmpfs_kit import fill, mounted
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.engine import daemon
from gridrun.runs import layout, space, states
from gridrun.runs.store import Store, StoreDamaged, StoreFull

RUNS = 10


@pytest.fixture
def disk(tmp_path):
    with mounted(tmp_path / "disk") as where:
        yield where


def gridrun(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


def queued_root(disk, n: int = 8):
    root = disk / "runs"
    runs = [slow_run(seed=s, sleep=0.0, epochs=1) for s in range(n)]
    with Store(root) as store:
        store.enqueue(runs)
    return root, runs


# ---- finding 1: the engine waits for space and finishes the queue by itself -------------


def test_a_queue_filled_mid_way_waits_for_space_and_ends_as_an_undisturbed_one(
        disk, tmp_path, backend, monkeypatch):
    runs = [slow_run(seed=s, sleep=0.03, epochs=2) for s in range(RUNS)]
    # the undisturbed queue, on a roomy disk
    reference = tmp_path / "reference"
    with Store(reference) as store:
        store.enqueue(runs)
        engine = engine_for(reference, backend, slots=2)
        engine.start()
        drain(engine)
        assert {r.status for r in store.list_runs()} == {states.COMPLETED}

    root = disk / "runs"
    with Store(root) as store:
        store.enqueue(runs)
    monkeypatch.setenv("GRIDRUN_ENGINE_OPTIONS", json.dumps(
        {"tick": 0.05, "space_retry": 0.3, "space_margin": 1 << 20}))
    timeline: list[tuple[float, str]] = []
    t0 = time.monotonic()

    def mark(what: str) -> None:
        timeline.append((round(time.monotonic() - t0, 2), what))

    engine_pid = None
    try:
        code, out = gridrun("engine", "start", "--root", str(root))
        assert code == 0, out
        engine_pid = daemon.status(root).pid
        mark("engine started")
        with Store(root) as store:
            def checkpointed() -> bool:  # some run is mid-way, past its first checkpoint
                return any((r.run_dir(root) / layout.CHECKPOINTS / "last.pt").exists()
                           and not (r.run_dir(root) / layout.SUMMARY).exists()
                           for r in store.list_runs(status=states.RUNNING))
            wait_for(lambda: store.counts().get(states.COMPLETED, 0) >= 2 and checkpointed(),
                     timeout=60, interval=0.02)
            mark(f"filled the disk: {store.counts()}")
            filler = fill(disk)
            st = wait_for(lambda: (s := daemon.status(root)).waiting_for_space and s, timeout=30)
            mark("engine status: waiting for disk space")
            assert st.pid == engine_pid and st.responding
            code, out = gridrun("engine", "status", "--root", str(root))
            assert code == 0 and "waiting for disk space" in out, out
            code, out = gridrun("ls", "--root", str(root))
            assert code == 0 and "waiting for disk space" in out, out
            code, out = gridrun("doctor", "--root", str(root), "--json")
            checks = {c["check"]: c for c in json.loads(out[out.index("["):])}
            assert "waiting for disk space" in checks["engine"]["message"]
            assert checks["disk"]["status"] == "FAIL" and "full" in checks["disk"]["message"]
            time.sleep(2)  # it keeps waiting: it neither exits nor fails anything
            assert daemon.status(root).pid == engine_pid
            seen = store.list_runs()
            assert not [r for r in seen if r.status not in (states.QUEUED, states.RUNNING,
                                                            states.COMPLETED)]
            mark(f"still waiting after 2 s: {store.counts()}")
            os.unlink(filler)
            mark("filler removed")
            wait_for(lambda: store.counts() == {states.COMPLETED: RUNS}, timeout=120)
            mark("all completed")
            assert not daemon.status(root).waiting_for_space
            done = store.list_runs()
        assert daemon.status(root).pid == engine_pid  # one engine all along, nothing typed
    finally:
        gridrun("engine", "stop", "--root", str(root))
        kill_quietly(engine_pid)
        print("\n" + "\n".join(f"{t:6.2f} s  {what}" for t, what in timeline))
        log = (root / daemon.LOG).read_text(errors="replace").splitlines()
        print("\n".join(line for line in log if any(w in line for w in (
            "disk", "paused", "space", "launched", "completed", "queue"))))
    # exactly once: one attempt each, no retry, no restart spent
    assert len(done) == RUNS
    assert all((r.attempt, r.retries, r.restarts) == (1, 0, 0) for r in done), \
        [(r.id, r.attempt, r.retries, r.restarts, r.note) for r in done]
    resumed = [r for r in done if (summary(root, r.spec).get("resumed_from_step") or 0) > 0]
    print(f"{len(resumed)} run(s) were paused for want of space and resumed from a checkpoint")
    assert resumed, "no run was caught mid-way by the full disk"
    for run in runs:
        assert metrics_without_timing(root, run) == metrics_without_timing(reference, run)
        assert summary(root, run)["weights_sha256"] == summary(reference, run)["weights_sha256"]
    leftovers = [p for p in root.rglob("*.tmp")]
    assert leftovers == []


def test_a_run_whose_write_fails_for_space_pauses_and_never_fails(disk, backend):
    """An in-process engine: the run's own write fails, it returns to the queue with
    the reason, the engine waits (no launch) and resumes once there is space."""
    root = disk / "runs"
    run = slow_run(seed=0, sleep=0.05, epochs=3)
    with Store(root) as store:
        store.enqueue([run])
        engine = engine_for(root, backend, slots=1, space_retry=0.2, space_margin=1 << 20)
        engine.start()
        wait_for(lambda: (engine.step() or True) and (layout.run_dir(
            root, run.experiment, run.id) / "checkpoints" / "last.pt").exists(), timeout=60)
        filler = fill(disk)
        wait_for(lambda: (engine.step() or True) and engine.space.waiting, timeout=60)
        for _ in range(20):  # waiting: nothing is launched, nothing fails
            engine.step(0.05)
        row = store.list_runs()[0]
        assert row.status in (states.QUEUED, states.RUNNING), row
        os.unlink(filler)
        drain(engine)
        row = store.list_runs()[0]
    assert row.status == states.COMPLETED and (row.retries, row.restarts) == (0, 0), row
    assert summary(root, run)["resumed_from_step"] > 0


# ---- finding 2: diagnose before advising ------------------------------------------------


def test_on_a_full_disk_every_command_says_so_and_never_blames_the_store(disk):
    root, runs = queued_root(disk)
    filler = fill(disk)
    with pytest.raises(StoreFull) as full, Store(root) as store:
        store.set_state("x", 1)
    text = str(full.value)
    assert "is full" in text and "nothing needs rebuilding" in text
    assert "--rebuild` moves" not in text and "-wal was probably deleted" not in text
    for args in (["pause"], ["cancel", runs[0].id]):
        code, out = gridrun(*args, "--root", str(root))
        assert code == 2 and "is full" in out and "Traceback" not in out, out
        assert len(out.strip().splitlines()) == 1
    # readers still read: the queue is there
    code, out = gridrun("ls", "--root", str(root))
    assert code == 0 and out.count("queued") == len(runs), out
    os.unlink(filler)


def test_queue_into_a_new_root_on_a_full_disk_is_one_line(disk, tmp_path):
    exp = tmp_path / "exp.toml"
    exp.write_text('[experiments.a]\ntask = "spirals"\ntrain_size = 64\nval_size = 32\n'
                   'epochs = 1\nbatch_size = 32\n')
    filler = fill(disk)
    code, out = gridrun("queue", str(exp), "--no-check", "--root", str(disk / "new"))
    assert code == 2 and "full" in out and "Traceback" not in out, out
    os.unlink(filler)


def test_rebuild_on_a_full_disk_leaves_the_queue_intact(disk):
    root, _runs = queued_root(disk)
    db = (root / layout.DB_NAME).read_bytes()
    filler = fill(disk)
    for extra in ([], ["--force"]):
        code, out = gridrun("doctor", "--rebuild", "--root", str(root), *extra)
        assert code == 2 and "not rebuilding" in out and "full" in out, out
        assert "Traceback" not in out
        # nothing moved aside, nothing built (SQLite's -wal and -shm and the lock aside)
        assert not [p for p in os.listdir(root) if "damaged-" in p or "rebuild" in p]
        assert (root / layout.DB_NAME).read_bytes() == db
    os.unlink(filler)
    code, out = gridrun("ls", "--root", str(root))
    assert code == 0 and out.count("queued") == 8, out
    with Store(root) as store:
        assert store.check(full=True) == [] and store.counts() == {states.QUEUED: 8}


def test_a_rebuild_that_fails_half_way_changes_nothing(disk, tmp_path):
    """A damaged store is rebuilt into a new file first: when the disk fills while it is
    written, the damaged one stays exactly where it was (byte for byte)."""
    root, runs = queued_root(disk, n=2)
    for run in runs:  # folders to rebuild from
        folder = layout.make_run_dir(root, run.experiment, run.id)
        from gridrun.spec import write_run_config
        write_run_config(folder / layout.CONFIG, run)
    db = root / layout.DB_NAME
    with open(db, "r+b") as f:  # damage its header
        f.write(b"not a database at all")
    damaged = db.read_bytes()
    with pytest.raises(StoreDamaged):
        Store(root).close()
    filler = fill(disk)
    code, out = gridrun("doctor", "--rebuild", "--root", str(root))
    assert code == 2 and "changed nothing" in out, out
    assert db.read_bytes() == damaged
    assert not [p for p in os.listdir(root) if "rebuild" in p or "damaged-" in p]
    os.unlink(filler)
    code, out = gridrun("doctor", "--rebuild", "--root", str(root))
    assert code == 0 and "restored 2 runs" in out, out
    with Store(root) as store:
        assert store.counts() == {states.QUEUED: 2}


def test_the_damage_message_tells_the_disk_from_the_file(tmp_path, monkeypatch):
    """Without a tmpfs: SQLite's own errors, classified."""
    from gridrun.runs.store_db import StoreNotWritable, diagnose

    db = tmp_path / "gridrun.db"

    def error(name: str, text: str) -> sqlite3.OperationalError:
        e = sqlite3.OperationalError(text)
        e.sqlite_errorname = name
        return e

    assert isinstance(diagnose(db, error("SQLITE_FULL", "database or disk is full")), StoreFull)
    assert isinstance(diagnose(db, OSError(28, "No space left on device")), StoreFull)
    monkeypatch.setattr(space, "nearly_full", lambda path, margin=0: True)
    io = diagnose(db, error("SQLITE_IOERR_SHMSIZE", "disk I/O error"))
    assert isinstance(io, StoreFull) and "is full" in str(io)
    monkeypatch.setattr(space, "nearly_full", lambda path, margin=0: False)
    assert isinstance(diagnose(db, error("SQLITE_IOERR", "disk I/O error")), StoreDamaged)
    monkeypatch.setattr(space, "read_only", lambda path: True)
    ro = diagnose(db, error("SQLITE_READONLY", "attempt to write a readonly database"))
    assert isinstance(ro, StoreNotWritable) and "read-only file system" in str(ro)
    monkeypatch.setattr(space, "read_only", lambda path: False)
    denied = diagnose(db, error("SQLITE_CANTOPEN", "unable to open database file"))
    assert isinstance(denied, StoreNotWritable) and "permission denied" in str(denied)
    for found in (ro, denied):
        assert "nothing needs rebuilding" in str(found) and "--rebuild` moves" not in str(found)
    notadb = diagnose(db, error("SQLITE_NOTADB", "file is not a database"))
    assert isinstance(notadb, StoreDamaged) and "--rebuild" in str(notadb)


def test_doctor_does_not_call_an_engine_ok_while_runs_say_running_without_one(tmp_path):
    """Finding 1's last part, without a tmpfs: runs left `running` by an engine that is
    gone are named, with the start that requeues them."""
    root = tmp_path / "runs"
    run = slow_run(seed=0)
    with Store(root) as store:
        store.enqueue([run])
        store.transition(run.id, states.QUEUED, states.RUNNING, slot="cpu0", pid=2**22 + 7)
    _, out = gridrun("doctor", "--root", str(root), "--json")
    checks = {c["check"]: c for c in json.loads(out[out.index("["):])}
    assert checks["engine"]["status"] == "warn", checks["engine"]
    assert "1 run says running but no engine runs" in checks["engine"]["message"]
    assert "gridrun engine start" in checks["engine"]["message"]
