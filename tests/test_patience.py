"""tests/patience.py: a test's bound counts quiet seconds, so a busy machine stretches it
and an idle one keeps it (issue 44)."""

from __future__ import annotations

import subprocess
import sys

import patience
import pytest
from patience import Deadline


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_idle_machine_counts_wall_seconds():
    clock = Clock()
    deadline = Deadline(60, clock=clock, share=lambda: 1.0)
    clock.now = 59.0
    assert not deadline.passed()
    clock.now = 60.0
    assert deadline.passed()


def test_a_busy_machine_stretches_the_bound_by_its_load():
    clock, share = Clock(), [2 / 14]  # load 14 on 2 cores
    deadline = Deadline(60, clock=clock, share=lambda: share[0])
    clock.now = 400.0
    assert not deadline.passed()  # 57 quiet seconds: still working, not hung
    share[0] = 1.0  # the load went away
    clock.now = 403.0
    assert deadline.passed() and deadline.wall_s == 403.0
    assert str(deadline).startswith("60 quiet s (403 s of wall time")


def test_the_share_of_a_core_is_at_most_one(monkeypatch):
    monkeypatch.setattr(patience, "usable_cores", lambda: 2)
    monkeypatch.setattr(patience.os, "getloadavg", lambda: (0.5, 0, 0))
    assert patience.core_share() == 1.0
    monkeypatch.setattr(patience.os, "getloadavg", lambda: (8.0, 0, 0))
    assert patience.core_share() == 0.25


def test_wait_for_returns_the_value_or_says_what_it_waited_for(monkeypatch):
    assert patience.wait_for(lambda: 7, 1) == 7
    monkeypatch.setattr(patience, "core_share", lambda: 1.0)
    with pytest.raises(AssertionError, match=r"still waiting for the run to end after 0.1 quiet s"):
        patience.wait_for(lambda: False, 0.1, interval=0.01, what="the run to end")
    with pytest.raises(AssertionError, match="state: queued"):
        patience.wait_for(lambda: None, 0.05, interval=0.01, what=lambda: "state: queued")


def test_run_is_subprocess_run_with_a_quiet_timeout():
    done = patience.run([sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"],
                        timeout=60, input="abc", capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "ABC\n" and done.stderr == ""
    with pytest.raises(subprocess.CalledProcessError):
        patience.run([sys.executable, "-c", "raise SystemExit(3)"], timeout=60, check=True)


def test_a_child_past_its_bound_is_killed_with_what_it_printed(monkeypatch, tmp_path):
    """The bound passes once the child has printed (not after some seconds that a busy
    machine could need to start it): what it printed comes back with the error."""
    started = tmp_path / "started"

    class OnceStarted:
        def __init__(self, quiet_s):
            self.wall_s = 0.0

        def passed(self):
            return started.exists()

    monkeypatch.setattr(patience, "SLICE_S", 0.05)
    monkeypatch.setattr(patience, "Deadline", OnceStarted)
    code = (f"import pathlib, time; print('started', flush=True); "
            f"pathlib.Path({str(started)!r}).touch(); time.sleep(600)")
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        patience.run([sys.executable, "-c", code], timeout=60, capture_output=True, text=True)
    assert expired.value.stdout == "started\n"
    started.unlink()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            patience.wait(proc, 60)
        assert proc.poll() is None  # left running, as Popen.wait leaves it
        with pytest.raises(subprocess.TimeoutExpired):
            patience.communicate(proc, 60)
    finally:
        proc.kill()
    assert proc.communicate()[0] == "started\n"  # nothing it printed was lost
    assert patience.wait(proc, 60) == -9


def test_quiet_time_is_the_time_module_with_a_clock_in_quiet_seconds():
    quiet = patience.QuietTime(share=lambda: 0.0)  # a machine so busy that nothing moves
    start = quiet.perf_counter()
    quiet.sleep(0.01)  # the rest is the time module's
    assert quiet.perf_counter() == quiet.monotonic() == start == 0.0
    idle = patience.QuietTime(share=lambda: 1.0)
    first = idle.perf_counter()
    quiet.sleep(0.01)
    assert idle.perf_counter() >= first + 0.01  # an idle machine's quiet seconds are wall seconds
