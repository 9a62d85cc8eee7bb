"""Foreground runs are runs: `gridrun train` records its run in the store (slot
`fg`, its pid) while it trains; the engine never launches, adopts or stops it;
a `gridrun train` killed outright leaves a run that the engine or the next
`gridrun train` returns to the queue or takes over."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import patience
import pytest
from test_engine_kit import engine_for, kill_quietly, slow_run, wait_for
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.engine import daemon
from gridrun.engine.backends import child
from gridrun.runs import layout, states
from gridrun.runs.store import FOREGROUND, Store

SLOW = """
[experiments.fg]
task = "helper_tasks:slow_spirals"
step_sleep = {sleep}
train_size = 256
val_size = 64
hidden = 16
depth = 1
epochs = {epochs}
batch_size = 64
log_every = 2
checkpoint_every = 2
"""


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "runs"
    yield root
    # never leave an engine or a `gridrun train` behind
    kill_quietly(daemon.status(root).pid)
    if (root / layout.DB_NAME).exists():
        with Store(root) as store:
            for run in store.list_runs(status=states.RUNNING):
                if run.pid:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(run.pid, signal.SIGKILL)


def dead_pid() -> tuple[int, float]:
    """A pid (and its start time) whose process has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    start = child.process_start_time(proc.pid)
    proc.wait()
    return proc.pid, start


def row(root, run_id):
    with Store(root) as store:
        return store.list_runs(ids=[run_id])[0]


def listed(root) -> dict:
    out = CliRunner().invoke(app, ["ls", "--json", "--root", str(root)])
    assert out.exit_code == 0, out.output
    return {r["id"]: r for r in json.loads(out.output)}


def train(file, root) -> subprocess.Popen:
    # its own session, as a shell's job: the fixture can kill it and what it started
    return subprocess.Popen([sys.executable, "-m", "gridrun", "train", str(file), "--root",
                             str(root)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def experiment(tmp_path, sleep=0.05, epochs=3):
    file = tmp_path / "exp.toml"
    file.write_text(SLOW.format(sleep=sleep, epochs=epochs))
    out = CliRunner().invoke(app, ["plan", "--json", str(file)])
    (run,) = json.loads(out.output)["runs"]
    return file, run["id"]


def checkpointed(root, run_id):
    return (layout.run_dir(root, "fg", run_id) / layout.CHECKPOINTS / "last.pt").exists()


# ---- the store -------------------------------------------------------------------------


def sleeper() -> subprocess.Popen:
    """A live process to stand for a `gridrun train` (stopped by the test that starts it)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def test_claim_queues_then_takes_and_refuses_what_is_not_its(tmp_path):
    run = slow_run()
    first, me = sleeper(), os.getpid()
    try:
        first_start, my_start = child.process_start_time(first.pid), child.process_start_time(me)
        with Store(tmp_path / "r") as store:
            taken, before = store.claim_foreground(run, first.pid, first_start,
                                                   provenance={"git_commit": "abc"})
            assert taken and before.status == states.QUEUED  # queued by the user, then taken
            (r,) = store.list_runs()
            assert (r.status, r.slot, r.pid, r.pid_start_time) == (states.RUNNING, FOREGROUND,
                                                                    first.pid, first_start)
            assert r.provenance["git_commit"] == "abc" and r.attempt == 1
            # a second foreground process, or a dead pid that is not the one recorded, is refused
            assert not store.claim_foreground(run, 222, 2.0)[0]
            assert not store.claim_foreground(run, 222, 2.0, dead_pid=999)[0]
            assert store.cancel([run.id])[run.id].startswith("not cancelled: it trains in the "
                                                             "foreground")
            assert store.intents(pending=True) == []  # the engine is asked nothing
            # the recorded pid found gone: taken over
            assert store.claim_foreground(run, me, my_start, dead_pid=first.pid)[0]
            assert store.list_runs()[0].pid == me
            # only the owner ends it
            assert not store.end_foreground(run.id, first.pid, states.COMPLETED)
            assert store.end_foreground(run.id, me, states.COMPLETED, summary={"status": "completed"})
            r = store.list_runs()[0]
            assert (r.status, r.slot, r.pid, r.summary) == (states.COMPLETED, None, None,
                                                            {"status": "completed"})
            # an ended run is trained again as a new attempt; an engine's run is refused
            assert store.claim_foreground(run, first.pid, first_start)[0]
            assert store.list_runs()[0].attempt == 2
            store.end_foreground(run.id, first.pid, states.QUEUED)
            store.transition(run.id, states.QUEUED, states.RUNNING, slot="cpu0", pid=444)
            taken, before = store.claim_foreground(run, 555, 5.0)
            assert not taken and before.slot == "cpu0"
    finally:
        first.kill()
        first.wait()


def test_a_reader_never_shows_a_dead_foreground_run_running(tmp_path):
    """`gridrun train` killed outright (SIGKILL, a closed terminal) and no engine to look:
    `ls` (any reader of the store) returns its run to the queue, as the engine would,
    saying why, instead of showing it `running ... training in the foreground` forever.
    A live one, and one whose lock another process holds (a shared root), stay running."""
    from gridrun.runs import store_rows

    assert store_rows.RUN_LOCK == child.LOCK  # the lock a reader probes is the one runs hold
    root = tmp_path / "r"
    gone_run, live_run, locked_run = slow_run(), slow_run(seed=1), slow_run(seed=2)
    (pid, start), (other, other_start) = dead_pid(), dead_pid()
    with Store(root) as store:
        store.claim_foreground(gone_run, pid, start)
        store.claim_foreground(live_run, os.getpid(), child.process_start_time(os.getpid()))
        store.claim_foreground(locked_run, other, other_start)
    locked_dir = layout.make_run_dir(root, locked_run.experiment, locked_run.id)
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(locked_dir / child.LOCK)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        runs = listed(root)
        assert runs[live_run.id]["status"] == runs[locked_run.id]["status"] == states.RUNNING
        r = runs[gone_run.id]
        assert (r["status"], r["slot"], r["pid"]) == (states.QUEUED, None, None)
        assert r["note"] == (f"interrupted: its foreground process (pid {pid}) was gone; "
                             "returned to the queue, resumes from its checkpoint")
        shown = CliRunner().invoke(app, ["ls", "--root", str(root)]).output
        assert f"(pid {pid})" in shown and f"training in the foreground (pid {pid})" not in shown
    finally:
        holder.kill()
        holder.wait()


LOCK_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(120)
"""


# ---- the engine ------------------------------------------------------------------------


def test_engine_leaves_a_live_foreground_run_alone(tmp_path, backend):
    root = tmp_path / "r"
    run = slow_run()
    with Store(root) as store:
        store.claim_foreground(run, os.getpid(), child.process_start_time(os.getpid()))
    engine = engine_for(root, backend)
    engine.recover()
    engine.launch_ready()
    engine._next_foreground = 0
    engine.watch_foreground()
    assert engine.active == {}
    r = row(root, run.id)
    assert (r.status, r.slot, r.pid) == (states.RUNNING, FOREGROUND, os.getpid())


@pytest.mark.parametrize("how", ["recover", "watch"])
def test_engine_returns_a_dead_foreground_run_to_the_queue(tmp_path, backend, how):
    root = tmp_path / "r"
    run = slow_run()
    pid, start = dead_pid()
    with Store(root) as store:
        store.claim_foreground(run, pid, start)
    engine = engine_for(root, backend)
    if how == "recover":
        engine.recover()
    else:
        engine.watch_foreground()
    r = row(root, run.id)
    assert (r.status, r.slot, r.pid) == (states.QUEUED, None, None)
    assert f"foreground process (pid {pid}) was gone" in r.note


# ---- gridrun train, as users meet it ---------------------------------------------------


@pytest.mark.slow
def test_a_foreground_run_is_live_in_ls_and_the_engine_never_launches_it(tmp_path, root):
    # the run waits at its 5th batch until the test has looked: never "trained too fast"
    gate = tmp_path / "looked"
    file = tmp_path / "exp.toml"
    file.write_text(SLOW.format(sleep=0, epochs=2).replace(
        '"helper_tasks:slow_spirals"\nstep_sleep = 0', f'"helper_tasks:gated_spirals"\ngate = "{gate}"'))
    (run_id,) = [r["id"] for r in json.loads(CliRunner().invoke(
        app, ["plan", "--json", str(file)]).output)["runs"]]
    proc = train(file, root)
    try:
        wait_for(lambda: (root / layout.DB_NAME).exists() and
                 listed(root).get(run_id, {}).get("status") == states.RUNNING, timeout=60)
        r = listed(root)[run_id]
        assert (r["slot"], r["pid"]) == (FOREGROUND, proc.pid)
        # a second `gridrun train` of the same cell is refused; so is a cancel
        again = CliRunner().invoke(app, ["train", str(file), "--root", str(root)])
        assert again.exit_code == 1 and "already trains in the foreground" in again.output
        daemon.start(root)
        with Store(root) as store:  # the engine has looked at it (recovery, then its watch)
            t0 = wait_for(lambda: store.get_state("engine_heartbeat"), timeout=60)["t"]
            wait_for(lambda: store.get_state("engine_heartbeat")["t"] > t0 + 2.5, timeout=60)
        assert proc.poll() is None
        r = listed(root)[run_id]
        assert (r["status"], r["slot"], r["pid"]) == (states.RUNNING, FOREGROUND, proc.pid)
        gate.touch()
        assert patience.wait(proc, 120) == 0, proc.stdout.read()
    finally:
        kill_quietly(proc.pid)
        daemon.stop(root)
    r = listed(root)[run_id]
    assert (r["status"], r["slot"], r["pid"]) == (states.COMPLETED, None, None)
    assert r["summary"]["status"] == states.COMPLETED and r["ended_at"]
    assert f"launched {run_id}" not in (root / "engine.log").read_text()


@pytest.mark.slow
def test_a_sigkilled_train_is_taken_over_by_the_next_train(tmp_path, root):
    file, run_id = experiment(tmp_path, sleep=0.1, epochs=6)
    proc = train(file, root)
    try:
        wait_for(lambda: checkpointed(root, run_id), timeout=60)
        os.kill(proc.pid, signal.SIGKILL)
        patience.wait(proc, 10)  # a SIGKILLed process, reaped
    finally:
        kill_quietly(proc.pid)
    r = listed(root)[run_id]  # `ls` looked: not `running` on a dead process
    assert (r["status"], r["slot"]) == (states.QUEUED, None)
    assert f"foreground process (pid {proc.pid}) was gone" in r["note"]
    again = CliRunner().invoke(app, ["train", str(file), "--root", str(root)])
    assert again.exit_code == 0, again.output
    assert "resumed from step" in again.output
    r = listed(root)[run_id]
    assert (r["status"], r["slot"]) == (states.COMPLETED, None)


@pytest.mark.slow
def test_a_sigkilled_train_is_resumed_by_the_engine(tmp_path, root):
    file, run_id = experiment(tmp_path, sleep=0.1, epochs=6)
    proc = train(file, root)
    try:
        wait_for(lambda: checkpointed(root, run_id), timeout=60)
        os.kill(proc.pid, signal.SIGKILL)
        patience.wait(proc, 10)  # a SIGKILLed process, reaped
        daemon.start(root)
        with Store(root) as store:
            wait_for(lambda: store.list_runs(ids=[run_id])[0].status in states.FINISHED,
                     timeout=120)
    finally:
        kill_quietly(proc.pid)
        daemon.stop(root)
    r = listed(root)[run_id]
    assert r["status"] == states.COMPLETED and r["summary"]["resumed_from_step"]
    assert "foreground process" in (root / "engine.log").read_text()


def test_a_foreground_train_writes_output_log_and_still_prints(tmp_path, root):
    """What the training prints (stdout and stderr) goes to the terminal and to the run's
    output.log, as an engine run's does; `gridrun logs` then shows it."""
    file, run_id = experiment(tmp_path, sleep=0, epochs=1)
    proc = train(file, root)
    try:
        printed, _ = patience.communicate(proc, 120)
    finally:
        kill_quietly(proc.pid)
    assert proc.returncode == 0, printed
    log = (layout.run_dir(root, "fg", run_id) / layout.OUTPUT).read_text()
    steps = [line for line in printed.splitlines() if "train step" in line]
    assert steps and all(line in log.splitlines() for line in steps), (printed, log)
    assert "completed:" in printed and "completed:" not in log  # gridrun's own end line
    shown = CliRunner().invoke(app, ["logs", run_id, "--root", str(root)])
    assert shown.exit_code == 0 and steps[-1] in shown.output.splitlines()


BLOCKING = """
[experiments.fg]
task = "data_helpers:blocking"
where = "{where}"
num_workers = {workers}
fifo = "{fifo}"
marker = "{marker}"
train_size = 128
val_size = 32
batch_size = 16
epochs = 1
"""


def session(sid: int) -> list[int]:
    """The live processes of a session (a `gridrun train` started in one of its own)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(proc.pid) == sid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("sig, how, where", [(signal.SIGTERM, "sleep", "main"),
                                             (signal.SIGTERM, "fifo", "main"),
                                             (signal.SIGINT, "fifo", "main"),
                                             (signal.SIGTERM, "sleep", "workers")])
def test_a_train_blocked_in_a_read_answers_sigterm_and_sigint(tmp_path, root, sig, how, where):
    """The run's dataset blocks for good (time.sleep, a read of a FIFO nobody writes; in the
    training process or in its DataLoader workers): the signal still ends `gridrun train`,
    which records the run as stopped (cancelled, resumable) and exits 5, saying so in one
    line, without a traceback, and leaves no process of its own behind."""
    fifo = ""
    if how == "fifo":
        os.mkfifo(fifo := str(tmp_path / "fifo"))
    marker = tmp_path / "blocked"
    file = tmp_path / "exp.toml"
    file.write_text(BLOCKING.format(fifo=fifo, marker=marker, where=where,
                                    workers=2 if where == "workers" else 0))
    proc = train(file, root)
    try:
        wait_for(marker.exists, timeout=60)
        os.kill(proc.pid, sig)
        printed, _ = patience.communicate(proc, 60)  # it answered, however slow the machine
        assert session(proc.pid) == [], "a process of the stopped run is left"
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == states.EXIT_CODES[states.INTERRUPTED], printed
    assert "Traceback" not in printed
    name = signal.Signals(sig).name
    told = [line for line in printed.splitlines() if name in line]
    assert len(told) == 1 and "stopped it" in told[0], printed
    (r,) = listed(root).values()
    assert (r["status"], r["slot"], r["pid"]) == (states.CANCELLED, None, None)
    assert r["note"].startswith(f"stopped in the foreground by {name}")


@contextlib.contextmanager
def worker_handlers():
    """SIGTERM and SIGINT as the worker sets them while it trains: a request, no raise."""
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@pytest.mark.parametrize("grace, signals", [(0.3, [signal.SIGTERM]),
                                             (600, [signal.SIGINT, signal.SIGTERM])])
def test_a_signal_ends_a_read_that_its_handler_would_let_go_on(grace, signals):
    """After its grace; a second signal at once."""
    from gridrun.commands.train import Stopped, answering_signals

    r, w = os.pipe()
    unblock = threading.Timer(30, os.write, (w, b"x"))  # the test's own way out, if it fails
    senders = [threading.Timer(0.2 * (i + 1), os.kill, (os.getpid(), sig))
               for i, sig in enumerate(signals)]
    try:
        with worker_handlers(), pytest.raises(Stopped, match=signal.Signals(signals[0]).name), \
                answering_signals(grace=grace):
            for timer in [unblock, *senders]:
                timer.start()
            os.read(r, 1)  # blocks: nothing writes it
    finally:
        for timer in [unblock, *senders]:
            timer.cancel()
        os.close(r)
        os.close(w)


def test_a_forked_process_signal_is_not_the_runs():
    """A DataLoader worker sent SIGTERM at its loader's shut-down (it inherits the run's
    handlers and, without care, the wakeup fd) does not stop the run."""
    from gridrun.commands.train import answering_signals

    with worker_handlers(), answering_signals(grace=0.2):
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(1.0)  # five times the grace: a Stopped would have come
