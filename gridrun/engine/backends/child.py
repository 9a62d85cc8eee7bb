"""The first thing a run's process does, forked or freshly started.

It becomes its own session (the engine's signals and terminal are not its),
takes the run's lock (so a run can never execute twice at once, whatever
happened to the engine), points stdout/stderr at output.log (through a pipe to
a keeper process that caps the file: engine/outputlog.py), runs the worker,
and leaves an exit record that a restarted engine can read.

`python -m gridrun.engine.backends.child RUN_DIR [--fresh]` is the fresh
interpreter path; the fork server calls `run` directly.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path

from gridrun.engine.backends.base import MEMORY_BUDGET
from gridrun.runs import space, states

EXIT_NO_SPACE = states.EXIT_NO_SPACE

LOCK = ".gridrun-lock"
EXIT_RECORD = ".gridrun-exit"
EXIT_ALREADY_RUNNING = 75  # kept equal to backends.base.EXIT_ALREADY_RUNNING


def process_start_time(pid: int) -> float | None:
    """The process's start time (seconds since the epoch), or None if it is gone."""
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        return None


def alive(pid: int, start_time: float | None) -> float | None:
    """The process's start time if `pid` is still that process and not a zombie."""
    try:
        import psutil

        proc = psutil.Process(pid)
        actual = proc.create_time()
        if start_time and abs(actual - start_time) > 0.5:
            return None
        return None if proc.status() == psutil.STATUS_ZOMBIE else actual
    except Exception:
        return None


def lock_holder(run_dir: str | os.PathLike) -> dict | None:
    """{"pid", "start_time"} of the process holding the run's lock, or None if free."""
    path = Path(run_dir) / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        try:
            # a probe that takes the lock must drop it at once; F_TEST would be
            # nicer but lockf has no test form for exclusive locks in Python
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                return json.loads(os.pread(fd, 200, 0) or b"{}") or {"pid": None}
            except ValueError:
                return {"pid": None, "start_time": None}
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def read_exit_record(run_dir: str | os.PathLike) -> dict | None:
    try:  # never through a link, never a pipe
        fd = os.open(Path(run_dir) / EXIT_RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            record = json.loads(f.read(4096))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _capture_output(path: Path) -> subprocess.Popen | None:
    """Point stdin at /dev/null and stdout/stderr at a pipe read by the keeper
    (engine/outputlog.py), which writes `path` capped at 10 MB, head and tail.
    Without a keeper (it could not start) they go straight to the file, uncapped."""
    from gridrun.runs import outputlog

    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    r, w = os.pipe()
    try:
        keeper = subprocess.Popen(
            [sys.executable, "-I", "-S", outputlog.__file__, str(path)], stdin=r,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        keeper = None
        os.close(w)
        w = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.close(r)
    with contextlib.suppress(OSError):  # room for bursts: the run rarely waits on the keeper
        fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    os.dup2(w, 1)
    os.dup2(w, 2)
    os.close(w)
    return keeper


def _release_output(keeper: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """Close our end of the pipe and wait until the keeper has written everything,
    so output.log is complete when the run's end is seen (a DataLoader worker that
    outlives us may hold the pipe: then we stop waiting after `timeout`)."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    if keeper is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            keeper.wait(timeout)


def run(run_dir: str, *, fresh: bool, cuda_visible_devices: str, close_fds: tuple[int, ...] = (),
        env: dict[str, str] | None = None) -> int:
    """Runs the worker in this process and returns its exit code. Never returns
    control to a fork server: the caller `os._exit`s with the code. `env`: what this
    launch adds to the environment (its memory budget); a fork server's own never leaks."""
    os.umask(0o077)  # layout.private_umask, without importing more into a fresh child
    for fd in close_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    with contextlib.suppress(OSError):  # already a session leader (start_new_session)
        os.setsid()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    # before anything can touch CUDA: the fork server never initialised it
    os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    if env is not None:
        os.environ.pop(MEMORY_BUDGET, None)
        os.environ.update(env)

    run_path = Path(run_dir)
    lock_fd = os.open(run_path / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.lockf(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return EXIT_ALREADY_RUNNING
    pid = os.getpid()
    start_time = process_start_time(pid)
    try:
        os.ftruncate(lock_fd, 0)
        os.pwrite(lock_fd, json.dumps({"pid": pid, "start_time": start_time}).encode(), 0)
    except OSError as e:  # a full disk: nothing has started, the run waits in the queue
        if not space.is_no_space(e):
            raise
        return EXIT_NO_SPACE
    (run_path / EXIT_RECORD).unlink(missing_ok=True)

    sys.stdout.flush()
    sys.stderr.flush()
    keeper = _capture_output(run_path / "output.log")

    try:
        from gridrun.train import worker

        code = int(worker.main(run_dir, fresh=fresh))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException as e:
        traceback.print_exc()
        code = EXIT_NO_SPACE if space.is_no_space(e) else 1
    with contextlib.suppress(OSError):
        sys.stdout.flush()
        sys.stderr.flush()
    _release_output(keeper)
    tmp = run_path / (EXIT_RECORD + ".tmp")
    try:
        tmp.write_text(json.dumps({"code": code, "pid": pid, "start_time": start_time}))
        tmp.replace(run_path / EXIT_RECORD)
    except OSError:  # a full disk: the code still reaches the engine through our exit
        with contextlib.suppress(OSError):
            tmp.unlink()
    return code


def main() -> None:
    args = sys.argv[1:]
    fresh = "--fresh" in args
    run_dir = next(a for a in args if not a.startswith("--"))
    code = run(run_dir, fresh=fresh,
               cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    os._exit(code)


if __name__ == "__main__":
    main()
