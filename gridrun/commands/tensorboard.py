"""`gridrun tensorboard [RUN...]`: runs' metrics as TensorBoard event files, and TensorBoard on them."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gridrun.commands.common import DEFAULT_ROOT, RootOption, fail, open_store, say, working

DEFAULT_LOGDIR = Path("logs")


def _runs(store: Any, prefixes: list[str]) -> list[Any]:
    from gridrun.runs.store import RunNotFound

    if not prefixes:
        return store.list_runs()
    try:
        ids = list(dict.fromkeys(store.resolve(p) for p in prefixes))
    except RunNotFound as e:
        fail(str(e))
    return store.list_runs(ids=ids)


def not_written(error: OSError, logdir: Path) -> str:
    """One line for an OSError met while writing event files under `logdir`."""
    from gridrun.userfiles import write_error

    return (f"cannot write event files in {logdir}: {write_error(error)}; what was written before stays "
            "(free some space, or choose another --logdir)")


def sync(root: Path, logdir: Path, prefixes: list[str], writer: Any, *, ended: set[str],
         noted: set[str]) -> str:
    """Write what is new of the runs (all, or those named); one line saying what was written.
    Runs in `ended` were complete at an earlier sync and are not read again; a log not
    read (a link) is said once, then kept in `noted`."""
    from gridrun.runs import runlog, states

    points = skipped = runs = 0
    with open_store(root) as store:
        chosen = _runs(store, prefixes)
    for run in chosen:
        if run.id in ended and run.status in states.FINISHED:
            continue  # read to its end at an earlier sync
        try:
            wrote, bad, refused = writer.run(root, run)
        except OSError as e:  # a full disk, a quota: one line; what was written stays whole
            fail(not_written(e, logdir))
        if run.status in states.FINISHED:
            ended.add(run.id)
        points, skipped, runs = points + wrote, skipped + bad, runs + (wrote > 0)
        if bad:
            say(f"note: {runlog.skipped_note(bad, run.run_dir(root) / 'metrics.jsonl')}")
        if refused and refused not in noted:  # as `gridrun export` says it, once a run
            noted.add(refused)
            say(f"note: {refused}")
    return (f"wrote {points:,} scalar{'s' * (points != 1)} of {runs} run{'s' * (runs != 1)} "
            f"to {logdir}")


def register(app: typer.Typer) -> None:
    @app.command()
    def tensorboard(
        runs: Annotated[list[str] | None, typer.Argument(
            help="Run ids (unique prefixes are enough). Default: every run of the root.",
            metavar="RUN...")] = None,
        logdir: Annotated[Path, typer.Option(
            "--logdir", metavar="DIR", file_okay=False,
            help="Where the event files go: DIR/experiment/variant/seed and run id, one "
            "folder a run (TensorBoard's run names).")] = DEFAULT_LOGDIR,
        serve: Annotated[bool, typer.Option(
            "--serve/--no-serve", help="Start TensorBoard on the log folder and keep adding "
            "what the runs log until ctrl-c; --no-serve writes once and exits.")] = True,
        port: Annotated[int, typer.Option("--port", min=0, metavar="PORT",
                                          help="TensorBoard's port (on localhost).")] = 6006,
        every: Annotated[float, typer.Option(
            "--every", min=0.5, metavar="SECONDS",
            help="While serving: how often to add the runs' new lines.")] = 5.0,
        root: RootOption = DEFAULT_ROOT,
    ) -> None:
        """Write runs' scalars as TensorBoard event files and open TensorBoard on them.

        Train and validation metrics, the learning rate, throughput, gradient norm and memory,
        at each line's step and time, written with TensorBoard's own writer (the tensorboard
        extra: pip install 'gridrun[tensorboard]'). Incremental: a second call writes only
        what the runs logged since; while TensorBoard serves, live runs are followed.
        ctrl-c, SIGTERM or SIGHUP stops TensorBoard (and what it started) with it.
        """
        from gridrun.analysis.tensorboard import Sync, TensorBoardMissing, writer_class
        from gridrun.userfiles import system_tree

        # a wrong --logdir is wrong with or without the package: said first
        if logdir.resolve().is_relative_to(root.resolve()):
            fail(f"--logdir {logdir} is inside the runs root {root}: choose a folder outside it")
        if (tree := system_tree(logdir / "_")) is not None:  # where its files would go
            fail(f"refusing to write event files in {logdir}: it is in the system folder "
                 f"{tree}; choose a folder of your own (--logdir)")
        try:
            writer_class()
        except TensorBoardMissing as e:
            fail(str(e))
        writer, ended, noted = Sync(logdir), set(), set()
        try:
            with working(f"writing event files to {logdir}"):
                wrote = sync(root, logdir, runs or [], writer, ended=ended, noted=noted)
            typer.echo(wrote)
            if not serve:
                return
            _serve(root, logdir, runs or [], writer, (ended, noted), port, every)
        finally:
            writer.close()


class _Signalled(Exception):
    """SIGTERM or SIGHUP while TensorBoard serves: stopped as ctrl-c stops it."""


def _raise(signum: int, frame: Any) -> None:
    raise _Signalled(signal.Signals(signum).name)


def _serve(root: Path, logdir: Path, prefixes: list[str], writer: Any,
           seen: tuple[set[str], set[str]], port: int, every: float) -> None:
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", str(port)]
    if shutil.which("tensorboard"):
        command = ["tensorboard", "--logdir", str(logdir), "--port", str(port)]
    # the default action of either would end gridrun and leave TensorBoard serving
    previous = {signal.SIGINT: signal.getsignal(signal.SIGINT),
                **{sig: signal.signal(sig, _raise) for sig in (signal.SIGTERM, signal.SIGHUP)}}
    board = None
    try:
        try:
            # its own session: its process group holds what it starts (the data server) to
            # stop it all, and a terminal's ctrl-c reaches gridrun alone, which stops it
            board = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            fail(f"cannot start TensorBoard ({' '.join(map(shlex.quote, command))}): {e.strerror}", 1)
        typer.echo(f"TensorBoard on http://localhost:{port}/ (ctrl-c stops it; the event files stay)")
        while board.poll() is None:
            time.sleep(every)
            sync(root, logdir, prefixes, writer, ended=seen[0], noted=seen[1])
        fail(f"TensorBoard exited (code {board.returncode})", 1)
    except (KeyboardInterrupt, _Signalled) as e:
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
            typer.echo(f"\nTensorBoard stopped{f' ({e})' if isinstance(e, _Signalled) else ''}")
    finally:
        for sig in previous:  # a second signal, a second ctrl-c, must not cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        try:
            if board is not None:
                stop(board)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def stop(board: subprocess.Popen, wait: float = 10.0) -> None:
    """TensorBoard and every process of its group: SIGTERM, then SIGKILL to what is left
    after `wait` seconds (the group outlives its leader while a child of it runs)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(board.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        board.wait(timeout=wait)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(board.pid, signal.SIGKILL)
    board.wait()
