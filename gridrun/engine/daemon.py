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

from gridrun.engine import layout

LOCK, PID, LOG = "engine.lock", "engine.pid", "engine.log"


@dataclass(frozen=True)
class EngineStatus:
    running: bool
    pid: int | None
    started_at: float | None
    root: Path
    log: Path


def status(root: str | os.PathLike) -> EngineStatus:
    root = Path(root)
    info: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        info = json.loads((root / PID).read_text())
    pid, started = info.get("pid"), info.get("start_time")
    alive = False
    if pid and started:
        from gridrun.engine.backends.child import alive as process_alive

        alive = process_alive(pid, started) is not None  # a zombie engine is not running
    return EngineStatus(alive, pid if alive else None, info.get("started_at") if alive else None,
                        root, root / LOG)


def start(root: str | os.PathLike, config: Any = None, *, timeout: float = 30.0) -> EngineStatus:
    """Start the engine for `root` unless one runs; returns its status.

    `config` (an EngineConfig) is remembered in the store and used by this and
    later starts; an engine already running keeps the config it started with.
    """
    root = Path(root).resolve()
    current = status(root)
    if current.running:
        return current
    layout.make_private_dir(root)
    if config is not None:
        from gridrun.engine.store import Store

        with Store(root) as store:
            store.set_state("engine_config", dataclasses.asdict(config))
    log_fd = os.open(root / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "gridrun.engine.daemon", str(root)],
                                stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
                                start_new_session=True, close_fds=True)
    finally:
        os.close(log_fd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = status(root)
        if current.running:
            proc.returncode = 0  # detached: it outlives us, don't warn
            return current
        if proc.poll() is not None:
            current = status(root)  # another engine won the lock meanwhile?
            if current.running:
                return current
            raise RuntimeError(f"the engine exited at start (code {proc.returncode}): "
                               f"{_last_error(root / LOG)}see {root / LOG}")
        time.sleep(0.05)
    raise RuntimeError(f"the engine did not start within {timeout:.0f} s; see {root / LOG}")


def _last_error(log: Path) -> str:
    """The last ERROR line of the engine log, to say why a start failed."""
    with contextlib.suppress(OSError):
        lines = [ln for ln in log.read_text(errors="replace").splitlines()[-50:] if " ERROR " in ln]
        if lines:
            return lines[-1].split(" ERROR ", 1)[1] + "; "
    return ""


def stop(root: str | os.PathLike, *, timeout: float = 300.0, force: bool = False) -> bool:
    """SIGTERM the engine (SIGKILL with `force`) and wait for it to exit.
    Returns False if no engine was running."""
    current = status(root)
    if not current.running:
        return False
    os.kill(current.pid, signal.SIGKILL if force else signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and status(root).running:
        time.sleep(0.05)
    if status(root).running:
        raise RuntimeError(f"the engine (pid {current.pid}) did not stop within {timeout:.0f} s")
    return True


def engine_config(root: Path) -> Any:
    from gridrun.engine.spec import EngineConfig
    from gridrun.engine.store import Store

    with Store(root) as store:
        saved = store.get_state("engine_config")
    if not saved:
        return EngineConfig.default()
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    saved = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items() if k in fields}
    return EngineConfig(**saved)


def make_telemetry() -> Any:
    try:
        from gridrun.engine.telemetry import Telemetry

        return Telemetry()
    except Exception:
        return None


def serve(root: Path, **engine_options: Any) -> int:
    """The engine process itself (run by `start`, or in the foreground)."""
    from gridrun.engine.backends.registry import BackendError, make_backend, slots_for_backend
    from gridrun.engine.scheduler import Engine
    from gridrun.engine.store import Store

    root = Path(root).resolve()
    layout.make_private_dir(root)
    lock_fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"an engine already runs for {root}", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    log = logging.getLogger("gridrun.engine")
    config = engine_config(root)
    try:
        backend = make_backend(config, root, root / LOG)
    except BackendError as e:
        log.error("%s", e)
        return 2
    engine = Engine(root, backend, slots_for_backend(backend, config), store=Store(root),
                    telemetry=make_telemetry(), **engine_options)
    signal.signal(signal.SIGTERM, lambda *_: engine.request_stop())
    signal.signal(signal.SIGINT, lambda *_: engine.request_stop())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        # before engine.pid exists: "running" means the backend is up (Ray connected)
        engine.start()
    except Exception as e:
        log.exception("the %s backend could not start", config.backend)
        log.error("the %s backend could not start: %s: %s", config.backend, type(e).__name__,
                  str(e).strip().splitlines()[0] if str(e).strip() else "")
        return 2
    from gridrun.engine.backends.child import process_start_time

    pid = os.getpid()
    tmp = root / (PID + ".tmp")
    tmp.write_text(json.dumps({"pid": pid, "start_time": process_start_time(pid),
                               "started_at": time.time(), "backend": config.backend,
                               "slots": [s.name for s in engine.slots]}))
    tmp.replace(root / PID)
    log.info("engine %d started on %s, backend %s, slots %s", pid, root, config.backend,
             ", ".join(s.name for s in engine.slots) or "from the cluster")
    try:
        engine.run()
    finally:
        (root / PID).unlink(missing_ok=True)
        log.info("engine %d stopped", pid)
    return 0


if __name__ == "__main__":
    opts = json.loads(os.environ.pop("GRIDRUN_ENGINE_OPTIONS", "{}"))  # tests: shorter ticks
    sys.exit(serve(Path(sys.argv[1]), **opts))
