"""The machine-wide GPU ledger (gridrun/engine/ledger.py): engines see each other's
numbers and not their own, a dead engine's entry is gone, anything an other user could
plant in the folder is ignored without raising or blocking, an unsafe folder is refused
in one line, and the lock excludes Ledger objects and processes with a bounded wait;
one held on purpose is waited for once, then gone around.

Processes are coordinated through pipes, never sleeps: a lock test waits for the holder
to say "held", and the one bound that is a timeout (wait=0.2) is on a lock that is held
for certain."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

import patience
import psutil
import pytest

from gridrun.engine import ledger as ledger_module
from gridrun.engine.ledger import DEFAULT, ENV, MAX_ENTRY, Entry, Ledger

ROOT = os.geteuid() == 0
NOBODY = 65534
needs_root = pytest.mark.skipif(not ROOT, reason="giving a file to another user needs root")

HOLDER = """
import json, sys
from gridrun.engine.ledger import Ledger
ledger = Ledger(sys.argv[1], wait=60)
ledger.write({"GPU-x": 7}, 3, [])
print(json.dumps({"problem": ledger.problem,
                  "seen": [[e.uid, e.gpus] for e in ledger.others()]}), flush=True)
with ledger.held():
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path / "ledger"


def record(**changes) -> dict:
    """A well-formed entry of this (live) process."""
    return {"pid": os.getpid(), "start_time": psutil.Process().create_time(),
            "gpus": {"GPU-a": 1 << 30}, "threads": 2, "pids": [os.getpid()], **changes}


def plant(folder: Path, content: dict | str | bytes, *, uid: int | None = None,
          pid: int | None = None, token: str = "ab12") -> Path:
    """An entry file written by hand, as another engine (or someone hostile) would."""
    if isinstance(content, dict):
        pid = content.get("pid") if pid is None else pid
        content = json.dumps(content)
    path = folder / f"{os.geteuid() if uid is None else uid}.{pid or os.getpid()}.{token}.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".json"))


def dead_process() -> tuple[int, float]:
    """The pid and start time of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    start = psutil.Process(proc.pid).create_time()
    proc.stdin.close()
    assert patience.wait(proc, 120) == 0
    return proc.pid, start


# -- entries ------------------------------------------------------------------


def test_two_engines_see_each_others_numbers_and_not_their_own(folder):
    a, b = Ledger(folder), Ledger(folder)
    assert a.problem is None and b.problem is None
    a.write({"GPU-a": 3 << 30, "index:1": 5}, threads=4, pids=[os.getpid()])
    b.write({"GPU-a": 1 << 30}, threads=1, pids=[])
    assert a.others() == [Entry(os.geteuid(), os.getpid(), psutil.Process().create_time(),
                                {"GPU-a": 1 << 30}, 1, ())]
    [seen] = b.others()
    assert (seen.gpus, seen.threads, seen.pids) == ({"GPU-a": 3 << 30, "index:1": 5}, 4, (os.getpid(),))
    assert a.ignored == b.ignored == 0


def test_write_replaces_the_entry_and_close_removes_it(folder):
    a, b = Ledger(folder), Ledger(folder)
    old = os.umask(0o077)  # an engine's private umask must not hide its entry from others
    try:
        a.write({"GPU-a": 100}, 1, [1, 2])
        a.write({"GPU-a": 200}, 2, [3])
    finally:
        os.umask(old)
    [entry] = b.others()
    assert (entry.gpus, entry.threads, entry.pids) == ({"GPU-a": 200}, 2, (3,))
    [name] = entries(folder)
    assert sorted(os.listdir(folder)) == [name]  # no temporary left behind
    assert stat.S_IMODE((folder / name).stat().st_mode) == 0o644
    a.close()
    a.close()  # idempotent
    assert b.others() == [] and entries(folder) == []


def test_the_folder_is_created_sticky_and_open_to_everyone(folder):
    old = os.umask(0o077)
    try:
        Ledger(folder)
    finally:
        os.umask(old)
    assert stat.S_IMODE(folder.lstat().st_mode) == 0o1777


def test_a_well_formed_hand_written_entry_is_read(folder):
    ledger = Ledger(folder)
    plant(folder, record(gpus={"index:0": 0, "GPU-b": 1 << 50}, threads=1 << 20, pids=[]))
    [entry] = ledger.others()
    assert entry.gpus == {"index:0": 0, "GPU-b": 1 << 50} and entry.threads == 1 << 20


@pytest.mark.parametrize("changes", [
    {"gpus": {"GPU-a": -1}}, {"gpus": {"GPU-a": (1 << 50) + 1}}, {"gpus": {"GPU-a": 1.5}},
    {"gpus": {"GPU-a": True}}, {"gpus": {"x" * 129: 1}}, {"gpus": {"GPU\x1b[2J": 1}},
    {"gpus": {"": 1}}, {"gpus": {f"index:{i}": 1 for i in range(1025)}}, {"gpus": [1]},
    {"threads": -1}, {"threads": (1 << 20) + 1}, {"threads": "2"}, {"threads": None},
    {"pids": [-5]}, {"pids": [0]}, {"pids": list(range(1, 4098))}, {"pids": 7},
    {"start_time": -1.0}, {"start_time": float("nan")}, {"start_time": "yesterday"},
    {"start_time": 1e300}, {"pid": 0}, {"pid": -1}, {"pid": 1 << 40},
], ids=lambda changes: str(changes)[:40])
def test_an_entry_with_a_wrong_type_or_size_is_ignored_and_kept(folder, changes):
    ledger = Ledger(folder)
    path = plant(folder, record(**changes), pid=os.getpid())
    assert ledger.others() == [] and ledger.ignored == 1
    assert path.exists()  # not ours to judge: only a dead engine's entry is removed


def test_files_that_are_not_small_plain_entries_are_ignored_without_blocking(folder, tmp_path):
    ledger = Ledger(folder)
    me = f"{os.geteuid()}.{os.getpid()}"
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(record()))
    (folder / f"{me}.a1.json").symlink_to(target)
    os.mkfifo(folder / f"{me}.a2.json")  # a reader that blocked on it would hang here
    (folder / f"{me}.a3.json").mkdir()
    big = json.dumps(record()).encode()
    (folder / f"{me}.a4.json").write_bytes(big + b" " * (MAX_ENTRY + 1 - len(big)))
    plant(folder, b"{not json", token="a5")
    plant(folder, b"[" * 60000, token="a6")  # nested past the parser's recursion limit
    plant(folder, b'{"pid": ' + b"1" * 60000 + b"}", token="a7")
    plant(folder, b"\xff\xfe", token="a8")
    plant(folder, record(), pid=os.getpid() + 1, token="a9")  # the name's pid is not the file's
    plant(folder, "[]", token="b0")
    assert ledger.others() == []
    assert ledger.ignored == 10
    ledger.write({"GPU-a": 1}, 1, [])  # and it still works beside them
    assert Ledger(folder).others()[0].gpus == {"GPU-a": 1}


def test_names_that_are_not_entries_are_passed_over(folder):
    ledger = Ledger(folder)
    for name in ("notes.txt", ".0.1.ab.json.cd.tmp", "0.1.AB.json", "x.1.ab.json", "0.1.ab.json.bak"):
        (folder / name).write_text(json.dumps(record()))
    assert ledger.others() == [] and ledger.ignored == 0
    assert len(list(folder.iterdir())) == 5  # all left as they were


@pytest.fixture
def nobodys_process():
    """A live process of user nobody (an engine of theirs, for the ledger's purposes)."""
    def become():
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    proc = subprocess.Popen(["sleep", "600"], preexec_fn=become, stdin=subprocess.DEVNULL)
    try:
        yield proc.pid, psutil.Process(proc.pid).create_time()
    finally:
        proc.kill()
        patience.wait(proc, 60)


@needs_root
def test_the_owner_is_the_files_not_what_its_name_or_content_says(folder, nobodys_process):
    ledger = Ledger(folder)
    pid, start = nobodys_process
    lying = plant(folder, record(), uid=0, token="a1")
    os.chown(lying, NOBODY, NOBODY)  # someone else's file posing as root's
    theirs = plant(folder, record(pid=pid, start_time=start, pids=[], gpus={"GPU-t": 9}),
                   uid=NOBODY, token="a2")
    os.chown(theirs, NOBODY, NOBODY)
    [entry] = ledger.others()
    assert (entry.uid, entry.gpus) == (NOBODY, {"GPU-t": 9})
    assert ledger.ignored == 1


@needs_root
def test_an_entry_cannot_live_on_a_strangers_process(folder):
    """nobody's entry naming root's processes (this one, pid 1) as its engine and runs is
    dead: it cannot hold memory, nor pass them off as its runs."""
    ledger = Ledger(folder)
    path = plant(folder, record(pids=[1, os.getpid()]), uid=NOBODY)
    os.chown(path, NOBODY, NOBODY)
    assert ledger.others() == [] and not path.exists()


def test_an_entry_lives_while_one_of_its_runs_does(folder):
    """Its engine was killed; its run goes on and still takes its memory."""
    ledger = Ledger(folder)
    pid, start = dead_process()
    plant(folder, record(pid=pid, start_time=start, pids=[os.getpid()]))
    [entry] = ledger.others()
    assert entry.pid == pid and entry.gpus == {"GPU-a": 1 << 30}


def test_a_dead_engines_entry_is_ignored_and_removed(folder):
    ledger = Ledger(folder)
    pid, start = dead_process()
    path = plant(folder, record(pid=pid, start_time=start, pids=[pid]))
    assert ledger.others() == []
    assert not path.exists()


@needs_root
def test_root_removes_a_dead_engines_entry_whoever_wrote_it(folder):
    ledger = Ledger(folder)
    pid, start = dead_process()
    path = plant(folder, record(pid=pid, start_time=start, pids=[]), uid=NOBODY)
    os.chown(path, NOBODY, NOBODY)
    assert ledger.others() == [] and not path.exists()


def test_a_reused_pid_is_not_the_engine_that_wrote_the_entry(folder):
    ledger = Ledger(folder)
    path = plant(folder, record(start_time=psutil.Process().create_time() - 3600, pids=[]))
    assert ledger.others() == [] and not path.exists()


def test_a_folder_that_disappears_gives_warnings_not_errors(folder, caplog):
    ledger = Ledger(folder)
    shutil.rmtree(folder)
    with caplog.at_level(logging.WARNING, logger="gridrun.engine"):
        ledger.write({"GPU-a": 1}, 1, [])
        ledger.write({"GPU-a": 1}, 1, [])
        assert ledger.others() == []
        ledger.close()
    assert [r.getMessage() for r in caplog.records] == [
        f"the GPU ledger {folder} cannot be written (No such file or directory): the folder "
        "was removed; it is made again at the next step"]


# -- the folder ---------------------------------------------------------------


def symlink(folder: Path) -> None:
    real = folder.with_name("real")
    real.mkdir()
    real.chmod(0o1777)
    folder.symlink_to(real)


def not_sticky(folder: Path) -> None:
    folder.mkdir()
    folder.chmod(0o777)


def a_file(folder: Path) -> None:
    folder.write_text("")


def no_parent(folder: Path) -> None:
    pass  # the folder asked for is one further down, below a folder that does not exist


@pytest.mark.parametrize(("setup", "says"), [
    (symlink, "is not safe to use: it is a symlink"),
    (not_sticky, "is not safe to use: it lacks the sticky bit"),
    (a_file, "is not safe to use: it is not a directory"),
    (no_parent, "cannot be created: its parent folder does not exist"),
], ids=lambda v: getattr(v, "__name__", None))
def test_an_unsafe_folder_is_refused_in_one_line_and_nothing_is_written(folder, setup, says):
    setup(folder)
    if setup is no_parent:
        folder = folder / "deeper"
    ledger = Ledger(folder, wait=0.2)
    assert ledger.problem is not None and "\n" not in ledger.problem
    assert ledger.problem.startswith(f"the GPU ledger {folder} {says}"), ledger.problem
    assert "GRIDRUN_LEDGER" in ledger.problem
    before = sorted(p.name for p in folder.parent.rglob("*"))
    ledger.write({"GPU-a": 1}, 1, [])
    with ledger.held() as locked:
        assert not locked and ledger.others() == []
    ledger.close()
    assert sorted(p.name for p in folder.parent.rglob("*")) == before


def test_the_folder_comes_from_the_environment_or_the_default(monkeypatch, folder):
    monkeypatch.setenv(ENV, str(folder))
    assert Ledger().folder == folder and Ledger().problem is None
    monkeypatch.delenv(ENV)
    expected = DEFAULT if os.path.isdir("/dev/shm") else "/tmp/gridrun-ledger"
    assert ledger_module.default_folder() == Path(expected)  # chosen, not created here


# -- the lock -----------------------------------------------------------------


def test_the_lock_excludes_another_ledger_in_the_same_process(folder):
    a, b = Ledger(folder, wait=0.2), Ledger(folder, wait=0.2)
    with a.held() as got_a, b.held() as got_b:
        assert got_a and not got_b
    assert b.busy.startswith(f"the GPU ledger {folder} is locked by another process for more "
                             "than 0.2 s: runs are placed without its lock") and "\n" not in b.busy
    with b.held() as got_b, a.held() as got_a:  # and it was let go
        assert got_b and not got_a
    assert b.busy is None


def test_a_lock_held_on_purpose_slows_only_the_first_try(folder):
    """Someone holds the folder's lock and never lets go: the engine waits once, then
    only tries (placing without it meanwhile), never waiting at every step."""
    import fcntl

    ours = Ledger(folder, wait=0.2)
    squatter = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # any user may open it so
    fcntl.flock(squatter, fcntl.LOCK_EX)
    try:
        with ours.held() as got:
            assert not got and ours.busy
        ours.wait = 3600.0  # were it waited for again, this test would not end
        for _ in range(3):
            with ours.held() as got:
                assert not got
    finally:
        os.close(squatter)
    with ours.held() as got:
        assert got and ours.busy is None


def test_the_lock_excludes_another_process_until_it_lets_go(folder):
    ours = Ledger(folder, wait=0.2)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(holder.stdout.readline())["problem"] is None
        assert holder.stdout.readline() == "held\n"
        with ours.held() as got:
            assert not got
    finally:
        holder.stdin.close()
        assert patience.wait(holder, 120) == 0
    with ours.held() as got:
        assert got and ours.others() == []  # the holder's entry went with it


@needs_root
def test_a_folder_another_user_made_is_shared(folder):
    """Whoever came first made it (here nobody): sticky, it serves every user."""
    folder.mkdir()
    folder.chmod(0o1777)
    os.chown(folder, NOBODY, NOBODY)
    a, b = Ledger(folder), Ledger(folder, wait=0.2)
    assert a.problem is None and b.problem is None
    a.write({"GPU-x": 5}, 1, [])
    assert [e.gpus for e in b.others()] == [{"GPU-x": 5}]
    with a.held() as got_a, b.held() as got_b:
        assert got_a and not got_b


def hold_as_nobody(folder: Path) -> tuple[int, IO[str], int]:
    """A forked engine of user nobody (no interpreter to start: /root may be closed to it):
    it writes its entry, says what it sees, takes the lock and says "held", and lets go
    when the returned descriptor is closed."""
    said_r, said_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 1
        try:
            os.close(said_r)
            os.close(go_w)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            ledger = Ledger(folder, wait=60)
            ledger.write({"GPU-x": 7}, 3, [])
            with os.fdopen(said_w, "w") as say:
                print(json.dumps({"problem": ledger.problem,
                                  "seen": [[e.uid, e.gpus] for e in ledger.others()]}), file=say, flush=True)
                with ledger.held():
                    print("held", file=say, flush=True)
                    os.read(go_r, 1)
            code = 0
        finally:
            os._exit(code)
    os.close(said_w)
    os.close(go_r)
    return pid, os.fdopen(said_r), go_w


@needs_root
def test_another_user_shares_roots_ledger():
    """An engine of user nobody beside ours: it writes in the folder root made, reads our
    entry, takes the lock from us, leaves root's stale entry alone (the sticky bit), and
    its own entry goes once it has ended. Not under tmp_path: nobody must reach it."""
    base = Path(tempfile.mkdtemp(prefix="gridrun-ledger-test-"))
    try:
        base.chmod(0o755)
        folder = base / "ledger"
        ours = Ledger(folder, wait=0.2)
        ours.write({"GPU-x": 1}, 1, [])
        pid, start = dead_process()
        stale = plant(folder, record(pid=pid, start_time=start, pids=[]), token="dead")
        theirs, said, go = hold_as_nobody(folder)
        try:
            assert json.loads(said.readline()) == {"problem": None, "seen": [[0, {"GPU-x": 1}]]}
            assert stale.exists()
            assert said.readline() == "held\n"
            with ours.held() as got:
                assert not got
            [entry] = ours.others()
            assert (entry.uid, entry.pid, entry.gpus, entry.threads) == (NOBODY, theirs, {"GPU-x": 7}, 3)
        finally:
            os.close(go)
            said.close()
            assert os.waitpid(theirs, 0)[1] == 0
        with ours.held() as got:
            assert got and ours.others() == []
        [left] = entries(folder)  # root removed both dead entries: only ours is left
        assert left.startswith(f"0.{os.getpid()}.")
    finally:
        shutil.rmtree(base)
