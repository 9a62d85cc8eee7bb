"""The header says when the engine's process is there but its loop is not
(SIGSTOP, stuck): its heartbeat in the store has gone stale."""

import json
import os
import time

from tui_helpers import aio, settle

from gridrun.engine import daemon
from gridrun.engine.backends.child import process_start_time
from gridrun.runs.store import Store
from gridrun.tui.app import GridrunApp
from gridrun.tui.store_source import StoreSource


def pretend_engine(root, beat_age: float) -> None:
    """engine.pid naming this (live) process, and its heartbeat `beat_age` seconds old."""
    pid = os.getpid()
    with Store(root) as store:
        store.set_state(daemon.HEARTBEAT, {"pid": pid, "t": time.time() - beat_age})
    (root / daemon.PID).write_text(json.dumps({"pid": pid, "start_time": process_start_time(pid),
                                               "started_at": time.time(), "state": "running"}))


def test_a_stale_heartbeat_is_not_responding(tmp_path):
    pretend_engine(tmp_path, 1.0)
    fresh = StoreSource(tmp_path).poll().engine
    assert fresh.running and fresh.not_responding is None
    pretend_engine(tmp_path, 60.0)
    stale = StoreSource(tmp_path).poll().engine
    assert stale.running and stale.not_responding >= 60


@aio
async def test_the_header_says_not_responding(tmp_path):
    pretend_engine(tmp_path, 60.0)
    app = GridrunApp(StoreSource(tmp_path), live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert "not responding for 6" in str(app.main.query_one("#header").render())


def pretend_waiting(root) -> None:
    """engine.pid as an engine waiting for disk space writes it (the store takes no write)."""
    pid = os.getpid()
    with Store(root) as store:
        store.set_state(daemon.HEARTBEAT, {"pid": pid, "t": time.time() - 120})  # stale: full
    (root / daemon.PID).write_text(json.dumps({
        "pid": pid, "start_time": process_start_time(pid), "started_at": time.time(),
        "state": "running", "waiting_for_space": time.time() - 100, "free_bytes": 0,
        "t": time.time()}))


@aio
async def test_the_header_says_waiting_for_disk_space(tmp_path):
    """Issue 24: a full disk is a state the header shows, and the wait's own beat (in
    engine.pid) keeps a stale store heartbeat from reading as "not responding"."""
    pretend_waiting(tmp_path)
    state = StoreSource(tmp_path).poll().engine
    assert state.running and state.waiting_for_space and state.not_responding is None
    app = GridrunApp(StoreSource(tmp_path), live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert "waiting for disk space" in str(app.main.query_one("#header").render())
