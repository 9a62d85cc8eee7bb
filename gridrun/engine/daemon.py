"""Start, stop and ask about the background engine: one per runs root.

`start` detaches the engine into its own session (closing the terminal or
the SSH connection does not touch it); a lock on ROOT/engine.lock makes a
second engine on the same root exit at once. The engine writes
ROOT/engine.pid and logs to ROOT/engine.log. `stop` sends SIGTERM: running
runs checkpoint and return to the queue, then the engine exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridrun.runs import layout

LOCK, PID, LOG = "engine.lock", "engine.pid", "engine.log"
HEARTBEAT = "engine_heartbeat"  # scheduler.HEARTBEAT (not imported: status stays light)
NOT_RESPONDING_AFTER = 15.0  # seconds without a heartbeat (it beats every second)
PID_SIZE = 4096  # engine.pid is padded to a page: rewritten in place, it needs no new space


class PidFile:
    """ROOT/engine.pid: what readers learn of the engine without the store. Written
    whole (a temporary file renamed over it) and padded to PID_SIZE bytes, so that
    `update` can rewrite it in place when the disk is full (the wait for space)."""

    def __init__(self, root: Path, **record: Any) -> None:
        self.path, self.record = root / PID, dict(record)

    def _bytes(self) -> bytes:
        data = json.dumps(self.record).encode()
        return data + b" " * max(0, PID_SIZE - len(data))

    def write(self, **fields: Any) -> None:
        self.record.update(fields)
        tmp = self.path.with_name(PID + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, self._bytes())
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def update(self, fields: dict[str, Any]) -> None:
        """The same record with `fields`, written over the old bytes (no new block)."""
        self.record.update(fields)
        data = self._bytes()
        fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW)
        try:
            if len(data) > PID_SIZE:
                os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        finally:
            os.close(fd)


def read_pid_file(root: Path) -> dict[str, Any]:
    """engine.pid's record ({} if none); a read that meets a rewrite in place is retried."""
    for _ in range(3):
        try:
            with open(root / PID, "rb") as f:
                info = json.loads(f.read(PID_SIZE * 4) or b"{}")
            return info if isinstance(info, dict) else {}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            time.sleep(0.005)
    return {}


@dataclass(frozen=True)
class EngineStatus:
    running: bool  # the engine process is alive (it may still be starting its backend)
    pid: int | None
    started_at: float | None
    root: Path
    log: Path
    starting: bool = False  # alive, but its backend (a Ray cluster, say) is not up yet
    heartbeat_age: float | None = None  # seconds since its last heartbeat; None: none yet
    cwd: str | None = None  # the folder it runs in: its workers import task packages from there
    waiting_for_space: float | None = None  # since when it waits for disk space (unix time)
    free_bytes: int | None = None  # what the disk had free at its last look, while it waits
    paused: tuple[str, ...] = ()  # runs that stopped for want of space, not yet in the store

    @property
    def state(self) -> str:
        """For people: "not running", "starting its backend", "waiting for disk space", "running"."""
        if not self.running:
            return "not running"
        if self.starting:
            return "starting its backend"
        return "waiting for disk space" if self.waiting_for_space else "running"

    @property
    def responding(self) -> bool:
        """False when the process is there but its loop stopped (SIGSTOP, stuck)."""
        return not (self.running and not self.starting and self.heartbeat_age is not None
                    and self.heartbeat_age > NOT_RESPONDING_AFTER)


def status(root: str | os.PathLike, *, store: Any = None, heartbeat: bool = True) -> EngineStatus:
    """Whether the engine of `root` runs; with `heartbeat`, how long ago its loop
    last said so (read from `store`, or a Store opened for the purpose)."""
    root = Path(root)
    info = read_pid_file(root)
    pid, started = info.get("pid"), info.get("start_time")
    alive = False
    if pid and started:
        from gridrun.engine.backends.child import alive as process_alive

        alive = process_alive(pid, started) is not None  # a zombie engine is not running
    starting = alive and info.get("state") == "starting"
    waiting = info.get("waiting_for_space") if alive else None
    waiting = waiting if isinstance(waiting, int | float) else None
    age = _heartbeat_age(root, pid, store) if heartbeat and alive and not starting else None
    if waiting is not None and heartbeat and isinstance(info.get("t"), int | float):
        # the store takes no write while the disk is full: the wait beats in engine.pid
        beat = max(0.0, time.time() - info["t"])
        age = beat if age is None else min(age, beat)
    free = info.get("free_bytes") if waiting is not None else None
    paused = info.get("paused") if waiting is not None else None
    paused = tuple(p for p in paused if isinstance(p, str)) if isinstance(paused, list) else ()
    cwd = info.get("cwd") if alive and isinstance(info.get("cwd"), str) else None
    return EngineStatus(alive, pid if alive else None, info.get("started_at") if alive else None,
                        root, root / LOG, starting=starting, heartbeat_age=age,
                        waiting_for_space=waiting, free_bytes=free if isinstance(free, int) else None,
                        paused=paused, cwd=cwd)


def _heartbeat_age(root: Path, pid: int, store: Any) -> float | None:
    try:
        if store is None:
            from gridrun.runs.store import Store

            with Store(root, create=False, create_store=False) as opened:
                beat = opened.get_state(HEARTBEAT)
        else:
            beat = store.get_state(HEARTBEAT)
    except Exception:  # an unreadable store says nothing about the engine
        return None
    if not isinstance(beat, dict) or beat.get("pid") != pid:
        return None  # none yet from this engine (an older engine's does not count)
    return max(0.0, time.time() - float(beat.get("t", 0)))


def start(root: str | os.PathLike, config: Any = None, *, timeout: float = 30.0,
          backend_timeout: float = 300.0) -> EngineStatus:
    """Start the engine for `root` unless one runs; returns its status once it
    runs. `timeout` bounds the process start; a backend that is still
    connecting (Ray) gets up to `backend_timeout` more, then we stop waiting and
    say so (the engine stays visible to `status` and `stop`).

    `config` (an EngineConfig) is remembered in the store and used by this and
    later starts; an engine already running keeps the config it started with.
    """
    # UnsafeRoot (a system folder, another user's folder in it, ...) or NoSuchRoot,
    # before engine.log, engine.lock, engine.pid or the store is written there; the
    # root as given, as the command that calls this names it
    layout.check_root(root, experiments=True, claim=True)
    root = Path(root).resolve()
    current = status(root, heartbeat=False)
    proc = None
    if not current.running:
        from gridrun.runs import space

        if space.nearly_full(root):
            raise RuntimeError(f"the disk holding {root} is full ({space.human(space.free_bytes(root))} "
                               "free): free some space, then start the engine; the queue is intact")
        if config is not None:
            from gridrun.runs.store import Store

            with Store(root) as store:
                store.set_state("engine_config", dataclasses.asdict(config))
        log_fd = os.open(root / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                         0o600)
        log_from = os.fstat(log_fd).st_size  # reasons for a failed start come after this
        try:
            proc = subprocess.Popen([sys.executable, "-m", "gridrun.engine.daemon", str(root)],
                                    stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
                                    start_new_session=True, close_fds=True)
        finally:
            os.close(log_fd)
    start_deadline = time.monotonic() + timeout
    backend_deadline = start_deadline + backend_timeout
    while True:
        current = status(root, heartbeat=False)
        if current.running and not current.starting:
            if proc is not None:
                proc.returncode = 0  # detached: it outlives us, don't warn
            return current
        if proc is not None and proc.poll() is not None:
            current = status(root, heartbeat=False)  # another engine won the lock meanwhile?
            if current.running:
                proc = None
                continue
            raise RuntimeError(f"{_exit_text(proc.returncode)}: "
                               f"{_start_error(root / LOG, log_from)}see {root / LOG}")
        if proc is None and not current.running:
            raise RuntimeError(f"the engine that was starting exited; see {root / LOG}")
        now = time.monotonic()
        if now > (backend_deadline if current.starting else start_deadline):
            if current.starting:
                raise RuntimeError(f"the engine (pid {current.pid}) is still starting its backend "
                                   f"after {timeout + backend_timeout:.0f} s; see {root / LOG}; "
                                   "`gridrun engine stop` stops it")
            raise RuntimeError(f"the engine did not start within {timeout:.0f} s; see {root / LOG}")
        time.sleep(0.05)


def _exit_text(code: int) -> str:
    """How the engine ended at start: its exit code, or the signal that killed it, which
    leaves nothing in its log (SIGKILL is what the kernel sends when memory runs out)."""
    if code >= 0:
        return f"the engine exited at start (code {code})"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    text = f"the engine was killed by {name} as it started"
    if -code == signal.SIGKILL:
        text += (" (out of memory? the kernel's out-of-memory killer sends SIGKILL; `dmesg` or "
                 "`journalctl -k` says)")
    return text


def _start_error(log: Path, offset: int) -> str:
    """Why a start failed: the last ERROR line (else the last line) the engine
    wrote to its log after `offset`."""
    with contextlib.suppress(OSError), open(log, "rb") as f:
        f.seek(offset)
        lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        errors = [ln.split(" ERROR ", 1)[1] for ln in lines if " ERROR " in ln]
        if errors or lines:
            return (errors or lines)[-1] + "; "
    return ""


def stop(root: str | os.PathLike, *, timeout: float = 300.0, force: bool = False) -> bool:
    """SIGTERM the engine (SIGKILL with `force`) and wait for it to exit.
    Returns False if no engine was running."""
    current = status(root, heartbeat=False)
    if not current.running:
        return False
    os.kill(current.pid, signal.SIGKILL if force else signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and status(root, heartbeat=False).running:
        time.sleep(0.05)
    if status(root, heartbeat=False).running:
        raise RuntimeError(f"the engine (pid {current.pid}) did not stop within {timeout:.0f} s")
    return True


def engine_config(root: Path) -> Any:
    """The [engine] table the last queued file gave, each count within its bound (a config
    saved before the bounds is held to them, and the log says so)."""
    from gridrun.engine.backends.slots import within_bounds
    from gridrun.runs.store import Store
    from gridrun.spec import EngineConfig

    with Store(root) as store:
        saved = store.get_state("engine_config")
    if not saved:
        return EngineConfig.default()
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    saved = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items() if k in fields}
    return within_bounds(EngineConfig(**saved))


def make_telemetry() -> Any:
    try:
        from gridrun.engine.telemetry import Telemetry

        return Telemetry()
    except Exception:
        return None


class StoppedWhileStarting(BaseException):
    """SIGTERM or SIGINT before the backend was up (like KeyboardInterrupt, not an Exception)."""


def serve(root: Path, *, until_idle: bool = False, **engine_options: Any) -> int:
    """The engine process itself (run by `start`, or in the foreground: `gridrun engine
    start --foreground`, with `until_idle` it returns once the queue is done)."""
    from gridrun.engine.backends.registry import BackendError, make_backend, slots_for_backend
    from gridrun.engine.backends.slots import slot_names
    from gridrun.engine.scheduler import Engine
    from gridrun.runs.rundirs import lost_queue_warning
    from gridrun.runs.store import Store, StoreError

    layout.private_umask()  # the engine, its fork server and every run inherit it
    root = Path(root).resolve()
    try:
        layout.check_root(root, experiments=True, claim=True)  # as `start` checks it
    except (layout.UnsafeRoot, layout.NoSuchRoot) as e:
        print(e, file=sys.stderr)
        return 2
    lock_fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"an engine already runs for {root}", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    log = logging.getLogger("gridrun.engine")
    from gridrun.engine.backends.child import process_start_time

    pid = os.getpid()
    # cwd: where its workers import task packages from (tasks.use_working_directory)
    pid_file = PidFile(root, pid=pid, start_time=process_start_time(pid), started_at=time.time(),
                       cwd=os.getcwd())
    write_pid = pid_file.write

    # Visible (to status and stop) from here on, "starting" until the backend is up:
    # connecting to a Ray cluster can take a while.
    try:
        write_pid(state="starting")
    except OSError as e:  # a full disk, say: one line for `start`
        print(f"the engine cannot write {root / PID}: {e.strerror}", file=sys.stderr)
        return 2
    engine = None

    def on_signal(*_: Any) -> None:
        if engine is not None and engine.started:
            engine.request_stop()  # running runs checkpoint and return to the queue
        else:
            raise StoppedWhileStarting  # nothing runs yet: give up connecting at once

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    backend = None
    try:
        config = engine_config(root)
        try:
            backend = make_backend(config, root, root / LOG)
        except BackendError as e:
            log.error("%s", e)
            return 2
        store = Store(root)
        lost = lost_queue_warning(root, store)
        if lost:
            log.warning("%s", lost)
        engine = Engine(root, backend, slots_for_backend(backend, config), store=store,
                        telemetry=make_telemetry(), announce=pid_file.update,
                        **{"foreign": config.foreign, "runs_per_gpu": config.runs_per_gpu,
                           **engine_options})
        try:
            engine.start()
        except Exception as e:
            log.exception("the %s backend could not start", config.backend)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            log.error("the %s backend could not start: %s: %s", config.backend,
                      type(e).__name__, first)
            with contextlib.suppress(Exception):
                backend.close()
            return 2
        # the count, not the names: engine.pid stays a page that status reads back whole
        # (4,096 CPU slots' names are 40 kB)
        write_pid(state="running", backend=config.backend, slots=len(engine.slots))
        log.info("engine %d started on %s, backend %s, slots %s", pid, root, config.backend,
                 slot_names(engine.slots) or "from the cluster")
        engine.run(until_idle=until_idle)
    except StoreError as e:
        log.error("%s", e)  # the one line `start` reports
        if backend is not None:
            with contextlib.suppress(Exception):
                backend.close()
        return 2
    except StoppedWhileStarting:
        log.info("stopped while starting")
        if backend is not None:
            with contextlib.suppress(Exception):
                backend.close()
    finally:
        (root / PID).unlink(missing_ok=True)
        log.info("engine %d stopped", pid)
    return 0


if __name__ == "__main__":
    opts = json.loads(os.environ.pop("GRIDRUN_ENGINE_OPTIONS", "{}"))  # tests: shorter ticks
    sys.exit(serve(Path(sys.argv[1]), **opts))
