"""Waits that tell a hang from a busy machine (issue 44; no tests here).

A test waits for something that will happen: a run ends, a screen shows, a child
process exits. The bound on that wait only guards against a hang, so it must never
end a test whose subject is merely slow because other work shares the cores: the
README's test command beside other work (load 8-14 on 2 cores) took 44 minutes and
failed on bounds that a quiet machine never comes near.

So every bound here is in quiet seconds: what the thing takes on an idle machine,
with a wide margin. A `Deadline` counts them at the rate the machine runs a process
now: a wall second counts as min(1, usable cores / load average) of a quiet second.
At load 14 on 2 cores a 60 s bound lasts about 7 minutes; on an idle machine a real
hang still fails in 60 s. (CPython's test suite sizes its SHORT_TIMEOUT and
LONG_TIMEOUT by its slowest buildbots for the same reason; here the load average
says how slow the machine is while the test runs.) Over-counting is the safe side:
where the load average counts more than this machine's cores (a container pinned to
2 of a busy host's cores), a bound only waits longer.

pytest-timeout's global `timeout` (pyproject.toml) stays the last guard, for a test
stuck where none of these waits are.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

SLICE_S = 1.0  # how often a wait on a child process wakes to count its deadline


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def core_share() -> float:
    """The share of a core a runnable process gets now: 1 on an idle machine,
    2/14 at load 14 on 2 cores."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform: count wall seconds
        return 1.0
    return min(1.0, usable_cores() / load) if load > 0 else 1.0


class Deadline:
    """`quiet_s` quiet seconds from now, counted at the machine's current pace
    (`core_share`, sampled each time the deadline is asked)."""

    def __init__(self, quiet_s: float, *, clock: Callable[[], float] = time.monotonic,
                 share: Callable[[], float] = core_share) -> None:
        self.quiet_s, self._clock, self._share = quiet_s, clock, share
        self._last, self.spent_s, self.wall_s = clock(), 0.0, 0.0

    def passed(self) -> bool:
        now = self._clock()
        elapsed, self._last = now - self._last, now
        self.wall_s += elapsed
        self.spent_s += elapsed * self._share()
        return self.spent_s >= self.quiet_s

    def __str__(self) -> str:
        return f"{self.quiet_s:g} quiet s ({self.wall_s:.0f} s of wall time at this machine's load)"


class QuietTime:
    """The `time` module for code under test that budgets wall time (the loader probe):
    its perf_counter and monotonic count quiet seconds, so a budget buys about the same
    work on a busy machine as on an idle one."""

    def __init__(self, share: Callable[[], float] = core_share) -> None:
        self._elapsed = Deadline(float("inf"), share=share)

    def perf_counter(self) -> float:
        self._elapsed.passed()
        return self._elapsed.spent_s

    monotonic = perf_counter

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def wait_for(predicate: Callable[[], Any], quiet_s: float, interval: float = 0.05,
             what: Any = None) -> Any:
    """`predicate()` once it is true; an AssertionError naming `what` (or, when callable,
    what it returns: the state to show) if it never is within `quiet_s`."""
    deadline = Deadline(quiet_s)
    while True:
        value = predicate()
        if value:
            return value
        if deadline.passed():
            said = what() if callable(what) else what or predicate
            raise AssertionError(f"still waiting for {said} after {deadline}")
        time.sleep(interval)


def wait(proc: subprocess.Popen, timeout: float) -> int:
    """`proc.wait(timeout)` with `timeout` in quiet seconds: its exit code, or
    subprocess.TimeoutExpired (the process left running, as Popen.wait leaves it)."""
    deadline = Deadline(timeout)
    while True:
        try:
            return proc.wait(timeout=SLICE_S)
        except subprocess.TimeoutExpired:
            if deadline.passed():
                raise subprocess.TimeoutExpired(proc.args, round(deadline.wall_s)) from None


def communicate(proc: subprocess.Popen, timeout: float, input: Any = None) -> tuple[Any, Any]:
    """`proc.communicate(input, timeout)` with `timeout` in quiet seconds; on
    subprocess.TimeoutExpired the process is left running, as Popen.communicate leaves it,
    and a later communicate() still gets all of its output."""
    deadline = Deadline(timeout)
    while True:
        try:
            return proc.communicate(input, timeout=SLICE_S)
        except subprocess.TimeoutExpired as expired:
            input = None  # sent already: Popen keeps what is left of it
            if deadline.passed():
                raise subprocess.TimeoutExpired(proc.args, round(deadline.wall_s),
                                                expired.output, expired.stderr) from None


def run(args: Any, *, timeout: float, input: Any = None, capture_output: bool = False,
        check: bool = False, **popen: Any) -> subprocess.CompletedProcess:
    """subprocess.run with `timeout` in quiet seconds: past it the child is killed and
    subprocess.TimeoutExpired raised with what it printed, as subprocess.run does."""
    if capture_output:
        popen["stdout"] = popen["stderr"] = subprocess.PIPE
    if input is not None:
        popen["stdin"] = subprocess.PIPE
    with subprocess.Popen(args, **popen) as proc:
        try:
            out, err = communicate(proc, timeout, input)
        except subprocess.TimeoutExpired as expired:
            proc.kill()
            expired.output, expired.stderr = proc.communicate()
            raise
        except BaseException:
            proc.kill()
            raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done
