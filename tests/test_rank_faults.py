"""Ranks that never join or stop answering (issue 45, finding 7), on the CPU with gloo:
the run ends with one line naming the rank and the dead-rank exit (states.EXIT_RANK_DIED,
which the engine requeues), and runs again from its last checkpoint.

A rank is held before it joins by a sitecustomize.py on the children's PYTHONPATH (the
`hold` hook): it waits in a rank's process, before gridrun's code runs, while rank 0
lives. Every wait here ends with a process's end; the quiet-second bounds only guard a
hang (tests/patience.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import patience
import pytest
from test_devices import SIZE, USER_TASK, cell, lines, ranks_of, summary, worker
from test_engine_kit import prepare, wait_for
from user_folder import user_package

from gridrun.runs import states
from gridrun.train import world

TAIL = ": the run stops and resumes from its last checkpoint"

# in a rank's process (it has --rank): wait while rank 0, its parent, lives
HOLD = '''\
import os, sys, time
if "--rank" in sys.argv:
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.1)
    os._exit(0)
'''
# in rank 0 (no --rank): starting a rank's process fails as when none is to be had
FAIL_LAUNCH = '''\
import errno, subprocess, sys
if "--rank" not in sys.argv:
    class Refused(subprocess.Popen):
        def __init__(self, args, *a, **kw):
            if "--rank" in args:
                raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
            super().__init__(args, *a, **kw)
    subprocess.Popen = Refused
'''


@pytest.fixture
def lab(tmp_path, monkeypatch):
    with user_package(tmp_path, monkeypatch, "devlab", {"dropcnn": USER_TASK}) as folder:
        yield folder


def hooked(lab: Path, monkeypatch: pytest.MonkeyPatch, hook: str) -> None:
    """Every Python process started from now on runs `hook` first."""
    folder = lab / "hook"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(hook)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(folder), os.environ.get("PYTHONPATH")) if p))


def unhooked(lab: Path) -> None:
    (lab / "hook" / "sitecustomize.py").unlink()


def ended(run_dir: Path) -> tuple[int, str]:
    proc = worker(run_dir)
    out, _ = patience.communicate(proc, 600)
    return proc.returncode, out


def rendezvous_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob(world.RENDEZVOUS + "*"))


def completes(run_dir: Path) -> str:
    code, out = ended(run_dir)
    assert code == 0, out
    assert rendezvous_files(run_dir) == []
    return out


def test_a_rank_that_never_joins_ends_the_run_at_the_join_deadline(lab, monkeypatch):
    run_dir = prepare(lab / "runs", cell("ddp", 2))
    hooked(lab, monkeypatch, HOLD)
    monkeypatch.setenv("GRIDRUN_JOIN_DEADLINE_S", "3")
    code, out = ended(run_dir)
    assert code == states.EXIT_RANK_DIED, out
    assert f"rank 1 of 2 never joined within 3 s{TAIL}" in out.splitlines()
    assert not ranks_of(run_dir)
    unhooked(lab)
    monkeypatch.delenv("GRIDRUN_JOIN_DEADLINE_S")  # 3 s is no bound for a rank that starts
    completes(run_dir)


def test_a_rank_whose_launch_fails_ends_the_run_with_its_reason(lab, monkeypatch):
    run_dir = prepare(lab / "runs", cell("ddp", 2))
    hooked(lab, monkeypatch, FAIL_LAUNCH)
    code, out = ended(run_dir)
    assert code == states.EXIT_RANK_DIED, out
    assert f"rank 1 of 2 could not start (Resource temporarily unavailable){TAIL}" in out
    unhooked(lab)
    completes(run_dir)


def test_garbage_in_the_rendezvous_file_ends_the_run_at_once_and_it_runs_again(lab, monkeypatch):
    run_dir = prepare(lab / "runs", cell("ddp", 2))
    hooked(lab, monkeypatch, HOLD)
    monkeypatch.setenv("GRIDRUN_JOIN_DEADLINE_S", "3600")  # only the garbage can end it
    proc = worker(run_dir)
    # rank 0 has written its records; rank 1 is held before it joins
    found = wait_for(lambda: [p for p in rendezvous_files(run_dir) if p.stat().st_size]
                     or proc.poll() is not None, timeout=300)
    assert proc.poll() is None, proc.communicate()[0]
    with open(found[0], "ab") as f:
        f.write(b"garbage garbage garbage\n")
    out, _ = patience.communicate(proc, 600)
    assert proc.returncode == states.EXIT_RANK_DIED, out
    said = [line for line in out.splitlines() if line.endswith(TAIL)]
    assert len(said) == 1, out
    assert said[0].startswith(f"rank 1 of 2 never joined: the rendezvous file {found[0].name} "
                              "holds bytes no rank wrote (a record of "), said
    assert not ranks_of(run_dir)
    unhooked(lab)
    completes(run_dir)


def test_a_stopped_rank_ends_the_run_and_it_resumes_exactly(lab, monkeypatch):
    root = lab / "runs"
    undisturbed = cell("ddp", 2, experiment="ref", train_size=SIZE)
    completes(prepare(root, undisturbed))
    gate = lab / "gate"  # stopped at each rank's 9th micro-batch (step 5; checkpoint at 4)
    run = cell("ddp", 2, experiment="stopped", gate=gate, checkpoint_every=2, train_size=SIZE)
    run_dir = prepare(root, run)
    monkeypatch.setenv("GRIDRUN_STOPPED_LIMIT_S", "2")
    proc = worker(run_dir)
    wait_for(lambda: Path(f"{gate}.reached").exists() or proc.poll() is not None, timeout=300)
    victims = ranks_of(run_dir)
    assert len(victims) == 1, proc.communicate()[0]
    os.kill(victims[0].pid, signal.SIGSTOP)
    gate.touch()
    out, _ = patience.communicate(proc, 600)
    assert proc.returncode == states.EXIT_RANK_DIED, out
    assert (f"rank 1 of 2 stopped answering (its process was stopped, SIGSTOP or SIGTSTP, "
            f"for 2 s){TAIL}") in out.splitlines()
    assert not ranks_of(run_dir)  # killed: a stopped process dies of SIGKILL
    monkeypatch.delenv("GRIDRUN_STOPPED_LIMIT_S")
    out = completes(run_dir)
    assert "resumed from step" in out
    assert summary(root, run)["weights_sha256"] == summary(root, undisturbed)["weights_sha256"]
    assert lines(root, run) == lines(root, undisturbed)


# ---- the rendezvous file, read as the store's records ------------------------------------


def record(key: bytes, value: bytes) -> bytes:
    return (len(key).to_bytes(4, "little") + key + len(value).to_bytes(4, "little") + value)


def test_the_store_records_parse_and_garbage_is_named_where_it_starts():
    good = record(b"refcount/", b"1") + record(b"/gridrun/arrived/1", b"42")
    assert world.parse_store(good, whole=True) == ({"refcount/", "/gridrun/arrived/1"}, None)
    assert world.parse_store(good + b"garbage!", whole=False)[1] == (
        f"a record of {int.from_bytes(b'garb', 'little')} bytes at byte {len(good)}")
    assert world.parse_store(good + record(b"\x00\x01", b""), whole=False)[1] == (
        f"a key that is not text at byte {len(good)}")
    assert world.parse_store(good + record(b"", b""), whole=False)[1] is not None
    torn = good + record(b"/0//cpu//0/0", b"x" * 100)[:20]
    # a writer holding the store's lock may be half way through its record
    assert world.parse_store(torn, whole=False) == ({"refcount/", "/gridrun/arrived/1"}, None)
    assert world.parse_store(torn, whole=True)[1] == f"a record cut short at byte {len(good)}"


def test_rank_0_makes_a_private_file_and_sees_it_removed_replaced_or_linked(tmp_path):
    stale = tmp_path / f"{world.RENDEZVOUS}1-old"
    stale.write_bytes(b"a killed launch's")
    made = world.make_rendezvous(tmp_path)
    assert not stale.exists() and made.path.stat().st_mode & 0o777 == 0o600
    made.path.write_bytes(record(b"/gridrun/arrived/0", b"1") + record(b"/gridrun/arrived/2", b"2"))
    assert world.read_rendezvous(made) == world.Reading(frozenset({0, 2}), None)
    made.path.write_bytes(b"garbage garbage garbage\n")
    assert world.read_rendezvous(made).problem.startswith("holds bytes no rank wrote (a record")
    other = tmp_path / "other"
    other.write_bytes(b"")  # made while the first is there: another inode
    other.replace(made.path)
    assert world.read_rendezvous(made).problem == "was replaced by another file"
    made.path.unlink()
    assert world.read_rendezvous(made).problem == "was removed"
    made.path.symlink_to(tmp_path / "elsewhere")
    assert world.read_rendezvous(made).problem == "was replaced by a symlink"
    with pytest.raises(world.RendezvousRefused, match="symlink"):
        world.open_store(made.path, 2, 1)
    assert not (tmp_path / "elsewhere").exists()


def test_a_bound_from_the_environment_must_be_a_positive_number(monkeypatch, capsys):
    from gridrun.train import ranks

    monkeypatch.setenv("GRIDRUN_JOIN_DEADLINE_S", "2.5")
    assert ranks.seconds_from_env("GRIDRUN_JOIN_DEADLINE_S", 120) == 2.5
    for bad in ("soon", "0", "-1", "nan", "inf"):
        monkeypatch.setenv("GRIDRUN_JOIN_DEADLINE_S", bad)
        assert ranks.seconds_from_env("GRIDRUN_JOIN_DEADLINE_S", 120) == 120
    assert capsys.readouterr().err.count("is not a positive number of seconds; using 120") == 5


def test_the_docs_state_the_bounds_the_code_uses():
    from gridrun.train import ranks

    page = (Path(__file__).resolve().parents[1] / "docs" / "devices.md").read_text()
    faults = page[page.index("## Faults"):]
    assert f"joins within {ranks.JOIN_DEADLINE_S:g} s" in faults.replace("\n", " ")
    assert f"stopped for {ranks.STOPPED_LIMIT_S:g} s" in faults
    assert ranks.JOIN_DEADLINE_ENV in faults and ranks.STOPPED_LIMIT_ENV in faults
    assert f"after {world.COLLECTIVE_TIMEOUT_S / 60:g} minutes" in faults
