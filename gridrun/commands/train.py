"""`gridrun train FILE [RUN]`: one cell of an experiment file, in the foreground.

The run is a run like any other: it is in the store (slot `fg`, this process's
pid) while it trains, so `gridrun ls` and the interface show it and the engine
leaves it alone; it ends there with its status and summary. If this process is
killed outright, the engine, the next `gridrun train` or any reader of the store
(`gridrun ls`) sees its pid gone and returns the run to the queue. What it prints is
also kept in the run's output.log, by the keeper the engine's runs use
(outputlog.teed), so `gridrun logs` shows it.

SIGTERM and SIGINT ask the run to checkpoint at its next step, as an engine run's
worker does; a run that has not stopped STOP_GRACE_S later (blocked in a read, which
a Python handler that does not raise lets go on), or at a second signal, is stopped
where it is (`answering_signals`), and what it started that is left is killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from gridrun.commands.common import (
    DEFAULT_ROOT,
    RootOption,
    fail,
    open_root,
    open_store,
    say,
    working,
)
from gridrun.commands.plan import FileArgument, load_or_exit

LOCK_TRIES = 50  # the engine's lock probe holds the lock for an instant: try again a little
STOP_GRACE_S = 5.0  # after SIGTERM or SIGINT: the time the run has to stop at a step boundary
# sent by the watch to the main thread, whose handler raises: a signal nothing else uses
STOP_SIGNAL = getattr(signal, "SIGRTMAX", signal.SIGUSR2)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGINT (its name: str()), and the run did not stop at a step boundary
    within STOP_GRACE_S: raised in the main thread, wherever it was blocked."""


@contextlib.contextmanager
def answering_signals(grace: float = STOP_GRACE_S) -> Iterator[list[str]]:
    """While the worker trains: its own handlers make SIGTERM and SIGINT a request to
    checkpoint at the next step, and return; a read the signal interrupted is then retried,
    so a run blocked in one (a dataset reading a FIFO, a hung mount) would never stop. A
    thread sees the signal (the wakeup fd: written by the C handler, whatever the main thread
    does) and, if the run is still here `grace` seconds later, sends STOP_SIGNAL to the main
    thread, whose handler raises Stopped: the blocked read ends with it; a second signal does
    so at once. Yields the names of the signals seen (the first one stopped the run)."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    done, lock, main = threading.Event(), threading.Lock(), threading.main_thread().ident
    seen: list[str] = []

    def raise_stopped(signum: int, frame: Any) -> None:
        if not done.is_set():  # a late one, once the run has ended: nothing to stop
            raise Stopped(seen[0] if seen else "a signal")

    def watch() -> None:
        until = None  # the first signal's grace; a second signal ends it at once
        while not done.is_set():
            wait = None if until is None else max(0.0, until - time.monotonic())
            if not select.select([read_fd], [], [], wait)[0]:
                break
            names = [signal.Signals(n).name for n in os.read(read_fd, 64)
                     if n in (signal.SIGTERM, signal.SIGINT)]
            if names and seen:
                break
            seen.extend(names)
            until = time.monotonic() + grace if seen and until is None else until
        with lock:
            if seen and not done.is_set():
                signal.pthread_kill(main, STOP_SIGNAL)

    _WATCHED[0] = write_fd
    if not _WATCHED[1]:  # once a process: a hook cannot be taken back
        os.register_at_fork(after_in_child=_unwatched)
        _WATCHED[1] = 1
    before_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    before = signal.signal(STOP_SIGNAL, raise_stopped)
    watcher = threading.Thread(target=watch, name="gridrun-stop-watch", daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        with lock:
            done.set()
        with contextlib.suppress(OSError):
            os.write(write_fd, b"\0")  # wakes the watch if it still waits for a signal
        signal.set_wakeup_fd(before_fd)
        _WATCHED[0] = -1
        watcher.join()
        signal.signal(STOP_SIGNAL, before)
        os.close(read_fd)
        os.close(write_fd)


_WATCHED = [-1, 0]  # the wakeup fd answering_signals set, and whether _unwatched is hooked


def _unwatched() -> None:
    """In a process forked meanwhile (a DataLoader worker): its signals are its own, never
    taken for the run's (a worker's SIGTERM at its loader's shut-down would stop the run)."""
    if _WATCHED[0] != -1:
        with contextlib.suppress(ValueError, OSError):
            if (found := signal.set_wakeup_fd(-1)) != _WATCHED[0]:
                signal.set_wakeup_fd(found)  # not ours after all: put back
        _WATCHED[0] = -1


def end_leftovers() -> None:
    """What a stopped run started and left behind (a DataLoader worker blocked in a read
    survives its loader's shut-down): killed. The output keeper has a session of its own.
    torch's SIGCHLD handler goes first: it would raise for each worker killed."""
    import psutil

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    mine = os.getsid(0)
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error, OSError):
                if os.getsid(proc.pid) == mine:
                    proc.kill()


def pick(runs, wanted: str | None):
    """The run named by an id or a unique prefix (optional when there is one run)."""
    if wanted is None:
        if len(runs) == 1:
            return runs[0]
        fail(f"the file has {len(runs)} runs: name one by its id or a unique prefix "
             "(`gridrun plan FILE` lists them)")
    matches = [r for r in runs if r.id.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        fail(f"no run of the file has an id starting with {wanted!r} (`gridrun plan FILE` lists them)")
    listed = ", ".join(f"{r.id} ({r.experiment} {r.variant} seed {r.seed})".replace("  ", " ")
                       for r in matches[:5])
    fail(f"{wanted!r} matches {len(matches)} runs: {listed}{' ...' if len(matches) > 5 else ''}; "
         "type more of the id")


def claim(root: Path, spec, file: Path, pid: int, start_time: float | None):
    """Take the run in the store for this process, or end the command saying who has it.
    Returns the row as it was before (its pending `fresh`, its status)."""
    from gridrun.commands.engine import provenance
    from gridrun.runs import states
    from gridrun.runs.store import FOREGROUND
    from gridrun.runs.store_rows import foreground_gone

    prov = provenance(file.resolve().parent)
    with open_store(root) as store:
        dead = None
        while True:
            taken, before = store.claim_foreground(spec, pid, start_time, provenance=prov,
                                                   dead_pid=dead)
            if taken:
                return before
            if before.slot != FOREGROUND or before.status != states.RUNNING:
                fail(f"{spec.id} is {before.status} on the engine (slot {before.slot}, pid "
                     f"{before.pid}): `gridrun cancel {spec.id}` stops it at its next checkpoint, "
                     "then `gridrun train` resumes it here", 1)
            if before.pid == dead or not foreground_gone(before, root):
                fail(f"{spec.id} already trains in the foreground (pid {before.pid}): "
                     "one process per run", 1)
            dead = before.pid  # killed outright: take it over, once


def hold_lock(run_dir: Path, pid: int, start_time: float | None) -> int | None:
    """The run's lock, as the engine's worker takes it (backends/child.py): held
    while this process lives, so nothing else can execute the run meanwhile."""
    from gridrun.engine.backends import child

    fd = os.open(run_dir / child.LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    for _ in range(LOCK_TRIES):
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            time.sleep(0.01)
            continue
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": pid, "start_time": start_time}).encode(), 0)
        return fd
    os.close(fd)
    return None


@contextlib.contextmanager
def rank_deaths_recorded(root: Path, run_id: str, run_dir: Path, pid: int) -> Iterator[None]:
    """A multi-device run whose rank dies ends this process at once (train/world.py): its
    end is recorded first, back in the queue, and said on the terminal."""
    from gridrun.runs import states
    from gridrun.train import world

    def record(line: str) -> None:
        record_end(root, run_id, run_dir, pid, states.EXIT_RANK_DIED, by=line.split(":")[0])

    world.before_exit.append(record)
    try:
        yield
    finally:
        world.before_exit.remove(record)


def record_end(root: Path, run_id: str, run_dir: Path, pid: int, code: int | None,
               error: str | None = None, by: str | None = None) -> str:
    """The run's ending in the store, as the engine records one; what to print."""
    from gridrun.runs import layout, runlog, states
    from gridrun.runs.records import Summary

    summary = runlog.read_summary(run_dir / layout.SUMMARY)
    status = states.STATUS_OF_EXIT.get(code, states.FAILED)
    s = summary or Summary()
    fields = {"ended_at": time.time(), "summary": summary.to_json() if summary else None,
              "fresh": False}
    if code == states.EXIT_RANK_DIED:
        # the machine's doing, not the run's: it waits for `gridrun train` or the engine
        status = states.QUEUED
        fields = {"note": f"{by or 'a rank died'} in the foreground; `gridrun train` or the "
                          "engine resumes it from its last checkpoint", "fresh": False}
    elif code == states.EXIT_NO_SPACE:
        # paused for want of space, never failed: the engine (or `gridrun train`) resumes it
        status = states.QUEUED
        fields = {"note": "paused: the disk was full; resumes from its last good checkpoint "
                          "(the engine, or `gridrun train`)", "fresh": False}
    elif status == states.INTERRUPTED:
        # ctrl-c is the user's stop, not the machine's: kept out of the engine's queue
        status = states.CANCELLED
        fields["note"] = (f"stopped in the foreground{f' by {by}' if by else ''}; `gridrun train` "
                          "or `gridrun retry` resumes it")
    elif status == states.COMPLETED:
        fields["note"] = "completed in the foreground"
    else:
        fields["error"] = "\n".join(x for x in (error or s.error or f"exit code {code}",
                                                s.traceback) if x)
        fields["note"] = (f"diverged at step {s.diverged_step}" if status == states.DIVERGED
                          else "out of memory" if status == states.OOM else "failed") \
            + " in the foreground"
    try:
        with open_store(root) as store:
            if not store.end_foreground(run_id, pid, status, **fields):
                typer.echo(f"warning: {run_id} was taken from this process meanwhile; "
                           "the store keeps what its new owner recorded", err=True)
    except typer.Exit:  # the store went bad during training: the folder still has it all
        pass
    return status


def register(app: typer.Typer) -> None:
    @app.command()
    def train(
        file: FileArgument,
        run: Annotated[str | None, typer.Argument(
            help="A run id or a unique prefix, as `gridrun plan` prints them (optional when the "
            "file has one run).", metavar="RUN")] = None,
        root: RootOption = DEFAULT_ROOT,
        fresh: Annotated[bool, typer.Option("--fresh", help="Start over instead of resuming.")] = False,
    ) -> None:
        """Train one run of an experiment file in the foreground.

        Resumes from the run's last checkpoint when there is one. The run is in
        the store while it trains (slot `fg`: `gridrun ls` and the interface show
        it; the engine leaves it alone). The exit code tells completed (0),
        failed (1), diverged (3), out of memory (4) and interrupted (5) apart;
        ctrl-c checkpoints, exits 5 and leaves the run cancelled (resumable). A
        run on several devices one of whose ranks dies exits 8, back in the
        queue.
        What the training prints goes to the terminal and to the run's output.log
        (`gridrun logs`), as an engine run's does.
        """
        from gridrun.engine.backends import child
        from gridrun.runs import layout, outputlog, states
        from gridrun.spec import write_run_config
        from gridrun.train import worker

        chosen = pick(load_or_exit(file), run)
        open_root(root, create=True)  # the one way every command opens a root
        try:  # the same checks as the engine: a private root, no symlink followed inside it
            run_dir = layout.make_run_dir(root, chosen.experiment, chosen.id)
        except (layout.UnsafePath, OSError) as e:
            fail(f"cannot use the run's folder: {e}")
        pid = os.getpid()
        start_time = child.process_start_time(pid)
        before = claim(root, chosen, file, pid, start_time)
        lock = hold_lock(run_dir, pid, start_time)
        if lock is None:
            holder = child.lock_holder(run_dir) or {}
            # a process the store lost track of runs it: the engine adopts it from the queue
            with open_store(root) as store:
                store.end_foreground(chosen.id, pid, states.QUEUED,
                                     note=f"already running in pid {holder.get('pid')}")
            fail(f"{chosen.id} is already running in another process (pid {holder.get('pid')})", 1)
        try:
            start_over = fresh or before.fresh
            if start_over:  # as the engine: an old checkpoint is never resumed after a fresh start
                shutil.rmtree(run_dir / layout.CHECKPOINTS, ignore_errors=True)
                (run_dir / layout.SUMMARY).unlink(missing_ok=True)
            write_run_config(run_dir / layout.CONFIG, chosen)
            with working("importing torch"):
                import gridrun.train.loop.trainer  # noqa: F401 - the worker's import, before it prints
            try:
                with outputlog.teed(run_dir / layout.OUTPUT):  # as an engine run's, and on the terminal
                    try:
                        with answering_signals() as seen, rank_deaths_recorded(
                                root, chosen.id, run_dir, pid):
                            code = worker.main(run_dir, fresh=start_over)
                    except Stopped as e:
                        end_leftovers()  # before the keeper waits for what holds its pipe
                        say(f"{e}: the run did not stop at a step boundary within "
                            f"{STOP_GRACE_S:g} s (blocked, in a read?): gridrun stopped it there; "
                            "`gridrun train` resumes it from its last checkpoint")
                        raise
            except KeyboardInterrupt as e:  # before the worker's own handler, or Stopped
                record_end(root, chosen.id, run_dir, pid, states.EXIT_CODES[states.INTERRUPTED],
                           by=str(e) if isinstance(e, Stopped) else None)
                raise typer.Exit(states.EXIT_CODES[states.INTERRUPTED]) from None
            except BaseException as e:
                record_end(root, chosen.id, run_dir, pid, states.EXIT_CODES[states.FAILED],
                           error=f"{type(e).__name__}: {e}")
                raise
        finally:
            with contextlib.suppress(OSError):
                os.close(lock)
        recorded = record_end(root, chosen.id, run_dir, pid, code, by=seen[0] if seen else None)
        status = states.STATUS_OF_EXIT[code]
        typer.echo(f"{status}: {run_dir}" + (f" (the run is {recorded}: `gridrun train` resumes it)"
                                             if recorded != status else ""), err=code != 0)
        raise typer.Exit(code)
