"""The background engine as users meet it: a detached process per root,
graceful stop, and SIGKILL at random moments losing nothing."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time

import patience
import pytest
from test_engine_kit import (
    finished,
    kill_quietly,
    metrics_without_timing,
    slow_run,
    summary,
    wait_for,
)

from gridrun.engine import daemon
from gridrun.runs import layout, states
from gridrun.runs.store import Store


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "runs"
    yield root
    # never leave an engine or a worker behind
    st = daemon.status(root)
    kill_quietly(st.pid)
    if (root / layout.DB_NAME).exists():
        with Store(root) as store:
            for run in store.list_runs(status=states.RUNNING):
                if run.pid:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(run.pid, signal.SIGKILL)


def test_start_status_stop_and_one_engine_per_root(root):
    assert not daemon.status(root).running
    st = daemon.start(root)
    assert st.running and st.pid != os.getpid()
    assert daemon.start(root).pid == st.pid  # already running: the same engine
    second = patience.run([sys.executable, "-m", "gridrun.engine.daemon", str(root.resolve())],
                          capture_output=True, text=True, timeout=60)
    assert second.returncode == 1 and "already runs" in second.stderr
    assert os.getsid(st.pid) == st.pid  # its own session: a closed terminal does not reach it
    assert json.loads((root / "engine.pid").read_text())["pid"] == st.pid
    assert daemon.stop(root)
    assert not daemon.status(root).running
    assert not (root / "engine.pid").exists()
    assert "started" in (root / "engine.log").read_text()
    assert not daemon.stop(root)


def reference_metrics(tmp_path, runs):
    ref = tmp_path / "reference"
    with Store(ref) as store:
        store.enqueue(runs)
    daemon.start(ref)
    with Store(ref) as store:
        wait_for(lambda: finished(store, [r.id for r in runs]), timeout=180)
    daemon.stop(ref)
    return {r.id: metrics_without_timing(ref, r) for r in runs}


@pytest.mark.slow
def test_graceful_stop_returns_running_runs_to_the_queue(root, tmp_path):
    runs = [slow_run(seed=s, sleep=0.05, epochs=6) for s in range(2)]
    with Store(root) as store:
        store.enqueue(runs)
        daemon.start(root)
        ckpt = layout.run_dir(root, "e", runs[0].id) / layout.CHECKPOINTS / "last.pt"
        wait_for(ckpt.exists, timeout=120)
        assert daemon.stop(root)
        assert {r.status for r in store.list_runs()} == {states.QUEUED}
        daemon.start(root)
        wait_for(lambda: finished(store, [r.id for r in runs]), timeout=180)
        assert {r.status for r in store.list_runs()} == {states.COMPLETED}
        daemon.stop(root)
    assert summary(root, runs[0])["resumed_from_step"] is not None


@pytest.mark.slow
def test_sigkill_of_the_engine_at_random_moments_loses_nothing(root, tmp_path):
    runs = [slow_run(seed=s, sleep=0.08, epochs=8) for s in range(4)]
    expected = reference_metrics(tmp_path, runs)
    rng = random.Random(1234)
    with Store(root) as store:
        store.enqueue(runs)
        ids = [r.id for r in runs]
        for _ in range(3):
            st = daemon.start(root)
            time.sleep(rng.uniform(1.0, 4.0))
            os.kill(st.pid, signal.SIGKILL)  # its workers go on, orphaned
            wait_for(lambda: not daemon.status(root).running)
        daemon.start(root)
        wait_for(lambda: finished(store, ids), timeout=240)
        got = store.list_runs()
        daemon.stop(root)
    log = (root / "engine.log").read_text()
    assert "adopted" in log  # some kills did land while runs trained
    assert [r.status for r in got] == [states.COMPLETED] * len(runs)
    for run in runs:
        # a run that ran twice at once would have interleaved or repeated lines
        assert metrics_without_timing(root, run) == expected[run.id]


SLOW_BACKEND = """
import sys, time
from pathlib import Path
from gridrun.engine import daemon
from gridrun.engine.backends.local import LocalBackend
start = LocalBackend.start
def slow_start(self):  # as a Ray cluster that takes its time to answer
    time.sleep(float(sys.argv[2]))
    start(self)
LocalBackend.start = slow_start
sys.exit(daemon.serve(Path(sys.argv[1])))
"""


def test_an_engine_starting_its_backend_is_visible_and_stoppable(root):
    root.mkdir(mode=0o700)
    proc = subprocess.Popen([sys.executable, "-c", SLOW_BACKEND, str(root), "300"],
                            start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: daemon.status(root).running, timeout=30)
        st = daemon.status(root)
        assert st.starting and st.pid == proc.pid
        assert daemon.stop(root, timeout=10)  # no need to wait for the backend to answer
        # 10 quiet s, far below the backend's 300 s start: the engine did not wait for it
        assert patience.wait(proc, 10) == 0 and not (root / "engine.pid").exists()
    finally:
        kill_quietly(proc.pid)


def test_a_failed_start_says_why_from_this_start_only(root):
    root.mkdir(mode=0o700)
    (root / "engine.log").write_text("2026-01-01 00:00:00 ERROR an old reason\n")
    with Store(root) as store:
        store.set_state("engine_config", {"backend": "nowhere"})
    with pytest.raises(RuntimeError) as failed:
        daemon.start(root)
    assert "backend = 'nowhere' is unknown" in str(failed.value)
    assert "old reason" not in str(failed.value) and not daemon.status(root).running
