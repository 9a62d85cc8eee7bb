"""A damaged store, as a user meets it: garbage, truncated, a deleted -wal; then
`gridrun doctor` and `gridrun doctor --rebuild` on real run folders."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import patience
import psutil
import pytest
from typer.testing import CliRunner

from gridrun.checks import doctor
from gridrun.cli import app
from gridrun.engine import daemon
from gridrun.engine.backends.child import process_start_time
from gridrun.runs import states
from gridrun.runs.store import Store, StoreDamaged

TINY = """
[defaults]
epochs = 1
batch_size = 64
seeds = 2

[experiments.tiny]
task = "spirals"
train_size = 256
val_size = 64
hidden = 8
depth = 1
grid = { lr = [1e-3, 3e-3] }

[experiments.broken]  # crashes at its first batch: queued with --no-check
task = "helper_tasks:crash"
at_step = 1
train_size = 128

[engine]
cpu_slots = 2
"""
COMMANDS = [["ls"], ["cancel", "abc"], ["engine", "status"], ["queue", "--no-check", "FILE"]]
runner = CliRunner()


def gridrun(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def command(args: list[str], root: Path, file: Path) -> tuple[int, str]:
    return gridrun(*[str(file) if a == "FILE" else a for a in args], "--root", str(root))


@pytest.fixture
def file(tmp_path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A root whose queue ran through the real engine: 4 completed runs, 2 failed."""
    base = tmp_path_factory.mktemp("finished")
    (base / "tiny.toml").write_text(TINY)
    root = base / "runs"
    done = patience.run([sys.executable, "-m", "gridrun", "run", "--no-check", str(base / "tiny.toml"), "--wait",
                         "--root", str(root)], capture_output=True, text=True, timeout=300)
    pid = daemon.status(root).pid
    daemon.stop(root)
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(timeout=60)  # its pid file goes first, its store last
    assert done.returncode == 1 and "2 failed" in done.stdout, done.stdout + done.stderr
    return root


@pytest.fixture
def copy(finished, tmp_path) -> Path:
    root = tmp_path / "copy"
    shutil.copytree(finished, root, symlinks=True)
    return root


def ls(root: Path) -> dict[str, str]:
    code, out = gridrun("ls", "--json", "--root", str(root))
    assert code == 0, out
    return {r["id"]: r["status"] for r in json.loads(out)}


# ---- damage: one line, never a traceback -------------------------------------------------

@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
def test_garbage_store_is_one_line_from_every_command(tmp_path, file, args):
    root = tmp_path / "runs"
    assert gridrun("queue", "--no-check", str(file), "--root", str(root))[0] == 0
    (root / "gridrun.db").write_bytes(b"not a database at all " * 500)
    code, out = command(args, root, file)
    assert code == 2
    assert out.strip().splitlines() == [
        f"{root}/gridrun.db is not a SQLite database (file is not a database): the queue cannot "
        f"be read; `gridrun doctor --rebuild --root {root}` moves it aside and rebuilds the queue "
        "from the run folders"]


def test_a_torn_page_is_damage_too(tmp_path, file):
    root = tmp_path / "runs"
    gridrun("queue", "--no-check", str(file), "--root", str(root))
    db = root / "gridrun.db"
    with sqlite3.connect(db) as conn:
        page = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'runs'").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    data = bytearray(db.read_bytes())
    data[(page - 1) * size:page * size] = b"\xff" * size  # the runs table's first page
    db.write_bytes(bytes(data))
    code, out = gridrun("ls", "--root", str(root))
    assert code == 2 and len(out.strip().splitlines()) == 1
    assert "gridrun.db is damaged" in out and "gridrun doctor --rebuild" in out


HOLDER = """
import sys
from gridrun.runs.store import Store
store = Store(sys.argv[1])
ids = [r.id for r in store.list_runs()]
store.set_priority(ids, 5)
store.cancel(ids[:1])
print("written", flush=True)
sys.stdin.readline()
store.close()
"""


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
def test_wal_deleted_under_a_live_writer_is_one_line(tmp_path, file, args):
    """The engine holds the store open; someone deletes gridrun.db-wal: every other
    reader got "disk I/O error" tracebacks. Stopping the writer writes its copy back."""
    root = tmp_path / "runs"
    gridrun("queue", "--no-check", str(file), "--root", str(root))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "written"
        (root / "gridrun.db-wal").unlink()
        code, out = command(args, root, file)
        assert code == 2
        assert out.strip().splitlines() == [
            f"{root}/gridrun.db cannot be read (disk I/O error): its gridrun.db-wal was probably "
            "deleted while the engine had it open; if the engine runs, `gridrun engine stop --root "
            f"{root}` writes its copy back, then try again; if it persists, `gridrun doctor "
            f"--rebuild --root {root}` moves it aside and rebuilds the queue from the run folders"]
    finally:
        patience.communicate(holder, 30, "\n")  # a clean close: the writer checkpoints its WAL
    runs = Store(root).list_runs()
    assert len(runs) == 6 and {r.priority for r in runs} == {5}  # nothing written was lost
    assert sum(r.status == states.CANCELLED for r in runs) == 1


def test_engine_start_on_a_garbage_store_says_the_line(tmp_path, file):
    root = tmp_path / "runs"
    gridrun("queue", "--no-check", str(file), "--root", str(root))
    (root / "gridrun.db").write_bytes(b"garbage" * 100)
    code, out = gridrun("engine", "start", "--root", str(root))
    assert code == 1 and "Traceback" not in out
    assert "the engine exited at start (code 2)" in out and "is not a SQLite database" in out
    assert not daemon.status(root).running


def test_tui_on_a_garbage_store_says_the_line(tmp_path):
    root = tmp_path / "runs"
    root.mkdir(mode=0o700)
    (root / "gridrun.db").write_bytes(b"garbage" * 100)
    code, out = gridrun("tui", "--root", str(root))
    assert code == 2 and "is not a SQLite database" in out and len(out.strip().splitlines()) == 1


# ---- an empty store beside run folders -------------------------------------------------------

def test_truncated_store_is_never_a_silent_empty_queue(copy, file):
    (copy / "gridrun.db").write_bytes(b"")
    warning = (f"warning: the store has no runs but {copy} holds 6 run folders: the queue may have "
               f"been lost; `gridrun doctor --rebuild --root {copy}` restores it")
    code, out = gridrun("ls", "--root", str(copy))
    assert code == 0 and out.splitlines() == [warning, "no runs"]
    code, out = gridrun("engine", "status", "--root", str(copy))
    assert code == 0 and warning in out.splitlines()
    code, out = gridrun("cancel", "abc", "--root", str(copy))
    assert out.splitlines()[0] == warning
    code, out = gridrun("doctor", "--root", str(copy))
    assert code == 0 and warning.removeprefix("warning: ") in out


def test_a_root_without_run_folders_has_no_warning(tmp_path, file):
    root = tmp_path / "runs"
    (root / "exp" / "not-a-run").mkdir(parents=True)  # no config.toml: not a run folder
    root.chmod(0o700)  # private, as gridrun makes roots (else: the warning for a readable root)
    code, out = gridrun("ls", "--root", str(root))
    assert code == 0 and out.strip() == "no runs"


# ---- rebuild ------------------------------------------------------------------------------------

def test_rebuild_brings_back_every_finished_run(copy):
    before = ls(copy)
    assert sorted(before.values()).count(states.COMPLETED) == 4
    assert sorted(before.values()).count(states.FAILED) == 2
    failed_error = next(r for r in Store(copy).list_runs() if r.status == states.FAILED).error
    # a run that started and was killed before its summary, and a folder that does not parse
    started = copy / "tiny" / "0123456789"
    shutil.copytree(next((copy / "tiny").iterdir()), started)
    (started / "summary.json").unlink()
    config = (started / "config.toml").read_text()
    old_id = next(line for line in config.splitlines() if line.startswith("id ="))
    (started / "config.toml").write_text(config.replace(old_id, 'id = "0123456789"'))
    broken = copy / "tiny" / "fedcba9876"
    broken.mkdir()
    (broken / "config.toml").write_text("this is = = not toml")
    (copy / "gridrun.db").write_bytes(b"garbage" * 1000)

    code, out = gridrun("doctor", "--rebuild", "--root", str(copy))
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("moved the old store aside: ") and ".damaged-" in lines[0]
    assert "restored 7 runs: 4 completed, 2 failed, 1 queued" in lines
    assert "1 queued run resume from a checkpoint" in out
    assert f"skipped 1 folder: {broken}: TOMLDecodeError" in out

    after = ls(copy)
    assert {i: s for i, s in after.items() if i in before} == before
    assert after["0123456789"] == states.QUEUED
    runs = {r.id: r for r in Store(copy).list_runs()}
    assert runs["0123456789"].note == "rebuilt: resumes from its checkpoint"
    done = next(r for r in runs.values() if r.status == states.COMPLETED)
    assert done.summary["status"] == "completed" and done.ended_at and done.started_at
    failed = next(r for r in runs.values() if r.status == states.FAILED)
    assert "injected crash" in failed.error and "injected crash" in failed_error
    aside = [p for p in copy.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"garbage")
    code, out = gridrun("doctor", "--root", str(copy), "--json")
    assert next(c for c in json.loads(out) if c["check"] == "store")["status"] == "ok"


def test_rebuild_restores_a_stopped_run_as_cancelled(copy):
    run = next((copy / "tiny").iterdir())
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    (copy / "gridrun.db").unlink()
    code, out = gridrun("doctor", "--rebuild", "--root", str(copy))
    assert code == 0 and "1 run stopped mid-run" in out and "gridrun retry" in out
    assert ls(copy)[run.name] == states.CANCELLED  # never run again unasked


def test_rebuild_refuses_while_the_engine_runs(copy):
    # this process poses as the engine: its pid file names a live process
    pid = os.getpid()
    (copy / "engine.pid").write_text(json.dumps({"pid": pid, "start_time": process_start_time(pid)}))
    code, out = gridrun("doctor", "--rebuild", "--root", str(copy))
    assert code == 2 and out.strip().splitlines() == [
        f"the engine runs on {copy} (pid {pid}): stop it first with "
        f"`gridrun engine stop --root {copy}`, then rebuild"]
    assert (copy / "gridrun.db").exists()


def test_rebuild_refuses_an_unsafe_root_and_moves_nothing(copy, tmp_path):
    (copy / "tiny" / "planted").symlink_to(tmp_path)
    code, out = gridrun("doctor", "--rebuild", "--force", "--root", str(copy))
    assert code == 2 and out.strip().splitlines() == [
        f"not rebuilding: {copy / 'tiny' / 'planted'} is a symlink: gridrun never follows a "
        f"symlink inside its root; remove it (rm {copy / 'tiny' / 'planted'})"]
    assert (copy / "gridrun.db").exists()  # the store was not moved aside
    (copy / "tiny" / "planted").unlink()
    os.chmod(copy, 0o777)
    code, out = gridrun("doctor", "--rebuild", "--force", "--root", str(copy))
    assert code == 2 and "writable by group or others" in out and "Traceback" not in out
    os.chmod(copy, 0o700)


def test_rebuild_keeps_a_healthy_store_unless_forced(copy):
    before = ls(copy)
    code, out = gridrun("doctor", "--rebuild", "--root", str(copy))
    assert code == 2 and "passes SQLite's integrity check and holds 6 runs" in out \
        and "--force" in out
    assert not [p for p in copy.iterdir() if ".damaged-" in p.name]
    code, out = gridrun("doctor", "--rebuild", "--force", "--root", str(copy))
    assert code == 0 and ls(copy) == before


# ---- doctor's checks ----------------------------------------------------------------------------

def checks(root: Path) -> tuple[int, dict[str, dict]]:
    code, out = gridrun("doctor", "--json", "--root", str(root))
    return code, {c["check"]: c for c in json.loads(out)}


def test_doctor_on_a_healthy_root(copy):
    code, out = gridrun("doctor", "--root", str(copy))
    assert code == 0, out
    assert [line.split()[:2] for line in out.splitlines()] == [
        ["ok", "root"], ["ok", "store"], ["ok", "disk"], ["ok", "engine"], ["ok", "heartbeat"],
        ["ok", "temporaries"], ["ok", "ledger"], ["ok", "gpu"], ["ok", "environment"]]
    assert "integrity ok; 4 completed, 2 failed" in out
    assert "engine not running; its last heartbeat was" in out  # the engine beat while it ran


def test_doctor_fails_a_group_writable_root_with_the_chmod(copy):
    os.chmod(copy, 0o775)
    code, found = checks(copy)
    assert code == 1 and found["root"]["status"] == "FAIL"
    assert f"`chmod 700 {copy}`" in found["root"]["message"]
    assert found["store"]["status"] == "warn"  # never opened through an unsafe root
    os.chmod(copy, 0o700)
    os.chmod(copy / "tiny", 0o777)
    os.chmod(copy / "broken", 0o770)
    code, found = checks(copy)
    assert code == 1 and f"`chmod 700 {copy / 'broken'}`" in found["root"]["message"]
    assert "+1 more" in found["root"]["message"] and len(found["root"]["paths"]) == 2


def test_doctor_fails_a_symlink_inside_the_root(copy, tmp_path):
    (copy / "elsewhere").symlink_to(tmp_path)
    code, found = checks(copy)
    assert code == 1 and "is a symlink: gridrun never follows" in found["root"]["message"]


def test_doctor_fails_a_damaged_store(copy):
    (copy / "gridrun.db").write_bytes(b"garbage" * 1000)
    code, found = checks(copy)
    assert code == 1 and found["store"]["status"] == "FAIL"
    assert "is not a SQLite database" in found["store"]["message"]


def test_doctor_lists_leftover_temporaries(copy):
    run = next((copy / "tiny").iterdir())
    tmp = run / "checkpoints" / ".last.pt.x1y2.tmp"
    tmp.write_bytes(b"half a checkpoint")
    (run / "summary.json.tmp").write_text("{")
    code, found = checks(copy)
    assert code == 0 and found["temporaries"]["status"] == "warn"
    assert set(found["temporaries"]["paths"]) == {str(tmp), str(run / "summary.json.tmp")}
    assert "2 leftover temporary files" in found["temporaries"]["message"]


def test_doctor_warns_of_a_dead_engines_pid_file(copy):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (copy / "engine.pid").write_text(json.dumps({"pid": int(dead), "start_time": 1.0}))
    _, found = checks(copy)
    assert found["engine"]["status"] == "warn" and "stale" in found["engine"]["message"]


def test_doctor_fails_a_lock_held_with_no_engine(copy):
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys; "
                               "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); "
                               "sys.stdin.readline()", str(copy / "engine.lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        if not Path("/proc/locks").exists():
            pytest.skip("no /proc/locks")
        code, found = checks(copy)
        assert code == 1 and f"taken by pid {holder.pid}" in found["engine"]["message"]
        code, out = gridrun("doctor", "--rebuild", "--force", "--root", str(copy))
        assert code == 2 and "engine.lock is held" in out
    finally:
        patience.communicate(holder, 30, "\n")


def test_doctor_reads_the_heartbeat(copy):
    pid = os.getpid()
    with Store(copy) as store:
        store.set_state("engine_heartbeat", {"pid": pid, "t": time.time() - 120})
    code, found = checks(copy)
    assert found["heartbeat"]["status"] == "ok" and "engine not running" in found["heartbeat"]["message"]
    (copy / "engine.pid").write_text(json.dumps({"pid": pid, "start_time": process_start_time(pid)}))
    code, found = checks(copy)
    assert code == 1 and found["heartbeat"]["status"] == "FAIL"
    # the age is read as the test runs: a busy machine reads 121 s or more
    assert re.search(r"has not responded for 1[2-9]\d s", found["heartbeat"]["message"])
    with Store(copy) as store:
        store.set_state("engine_heartbeat", {"pid": pid, "t": time.time()})
    code, found = checks(copy)
    assert found["heartbeat"]["status"] == "ok"


def test_gpu_check_is_fine_on_a_cpu_machine():
    check = doctor.check_gpu()
    import torch

    if not torch.cuda.is_available():
        assert check.status == doctor.OK and "no GPU" in check.message
    else:
        assert check.status in (doctor.OK, doctor.WARN) and "GPU" in check.message


def test_store_damage_is_one_exception_type(tmp_path):
    (tmp_path / "gridrun.db").write_bytes(b"garbage" * 100)
    with pytest.raises(StoreDamaged) as e:
        Store(tmp_path)
    assert "\n" not in str(e.value)


def test_environment_check_prints_versions_and_fails_for_a_gpu_torch_cannot_use(monkeypatch):
    import torch

    check = doctor.check_environment()
    assert check.status == doctor.OK and f"torch {torch.__version__}" in check.message
    assert "cuDNN" in check.message and "driver" in check.message and "CUDA_VISIBLE_DEVICES" in check.message
    if not torch.cuda.is_available():
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
        check = doctor.check_environment()
        assert check.status == doctor.FAIL and "device_count() is 0" in check.message
