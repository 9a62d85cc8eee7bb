"""Runs on this machine: each run its own process, forked from a warm fork
server, or a fresh interpreter when the server is unavailable."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gridrun.engine.backends import child
from gridrun.engine.backends.base import MEMORY_BUDGET, Backend, Exited, Handle, Slot

log = logging.getLogger("gridrun.engine")


@dataclass
class _Proc:
    handle: Handle
    how: str  # "fork" | "popen" | "adopted"
    popen: subprocess.Popen | None = None
    pidfd: int | None = None
    kill_at: float | None = None


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class LocalBackend(Backend):
    name = "local"

    def __init__(self, *, forkserver: bool = True, log_path: Path | None = None):
        self.use_forkserver = forkserver
        self.log_path = log_path
        self.server = None
        self.procs: dict[int, _Proc] = {}

    def start(self) -> None:
        if not self.use_forkserver or (self.server is not None and self.server.alive()):
            return
        from gridrun.engine.backends.forkserver import ForkServer

        try:
            self.server = ForkServer(self.log_path)
        except Exception as e:
            log.warning("fork server unavailable (%s); starting runs in fresh interpreters", e)
            self.server = None

    def launch(self, run_id: str, run_dir: Path, slot: Slot, *, fresh: bool = False) -> Handle:
        if self.server is not None and self.server.alive():
            try:
                pid, start = self.server.launch(run_dir, fresh=fresh, env=slot.env)
                handle = Handle(run_id, Path(run_dir), pid, start or 0.0, slot)
                self.procs[pid] = _Proc(handle, "fork", pidfd=_pidfd(pid))
                return handle
            except (OSError, RuntimeError, ValueError) as e:
                log.warning("fork server failed (%s); using fresh interpreters", e)
                self.server = None
        env = {k: v for k, v in os.environ.items() if k != MEMORY_BUDGET} | slot.env
        with open(Path(run_dir) / "output.log", "ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "gridrun.engine.backends.child", str(run_dir),
                 *(["--fresh"] if fresh else [])],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True)
        start = child.process_start_time(popen.pid) or 0.0
        handle = Handle(run_id, Path(run_dir), popen.pid, start, slot)
        self.procs[popen.pid] = _Proc(handle, "popen", popen=popen, pidfd=_pidfd(popen.pid))
        return handle

    def reattach(self, run_id: str, run_dir: Path, pid: int | None, start_time: float | None,
                 slot: Slot | None = None) -> Handle | None:
        holder = child.lock_holder(run_dir) or {}
        # the lock names the process that runs it; without a holder, the
        # recorded pid may be one that has not taken the lock yet
        pid = holder.get("pid") or pid
        start_time = holder.get("start_time") or start_time
        if pid is None or (not holder and not start_time):
            return None
        actual = child.alive(pid, start_time)
        if actual is None:
            record = child.read_exit_record(run_dir)
            if not (record and record.get("pid") == pid):
                return None
            actual = start_time  # it ended while no engine watched: poll reports its code
        handle = Handle(run_id, Path(run_dir), pid, actual, slot)
        self.procs[pid] = _Proc(handle, "adopted", pidfd=_pidfd(pid))
        return handle

    def cancel(self, handle: Handle, grace: float = 30.0) -> None:
        proc = self.procs.get(handle.pid)
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(handle.pid, signal.SIGTERM)
        proc.kill_at = time.monotonic() + grace

    def poll(self, timeout: float) -> list[Exited]:
        # a forked child's end comes as a message from the server (with its code)
        server_up = self.server is not None and self.server.alive()
        fds = [p.pidfd for p in self.procs.values()
               if p.pidfd is not None and not (p.how == "fork" and server_up)]
        if self.server is not None:
            fds.append(self.server.fd)
        needs_polling = any(p.pidfd is None for p in self.procs.values())
        wait = min(timeout, 0.2) if needs_polling else timeout
        if self.server is not None and (b"\n" in self.server._buf):
            wait = 0
        if fds:
            with contextlib.suppress(InterruptedError):
                select.select(fds, [], [], wait)
        elif wait:
            time.sleep(wait)
        if self.server is not None:
            self.server.drain(0)
        exited = []
        now = time.monotonic()
        for pid, proc in list(self.procs.items()):
            code = self._exit_code(proc)
            if code is False:
                if proc.kill_at is not None and now >= proc.kill_at:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, signal.SIGKILL)
                    proc.kill_at = None
                continue
            del self.procs[pid]
            if proc.pidfd is not None:
                os.close(proc.pidfd)
            exited.append(Exited(proc.handle, code))
        return exited

    def _exit_code(self, proc: _Proc) -> int | bool | None:
        """The exit code, None if it ended but the code is unknown, False if still running."""
        pid = proc.handle.pid
        if proc.how == "popen":
            code = proc.popen.poll()
            return False if code is None else code
        if proc.how == "fork" and self.server is not None:
            if pid in self.server.exits:
                return self.server.exits.pop(pid)
            if self.server.alive():
                return False
        # adopted, or the server died: watch the process and read its exit record
        if child.alive(pid, proc.handle.start_time):
            return False
        record = child.read_exit_record(proc.handle.run_dir)
        if record and record.get("pid") == pid:
            return record["code"]
        return None

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.pidfd is not None:
                with contextlib.suppress(OSError):
                    os.close(proc.pidfd)
            if proc.popen is not None:
                proc.popen.returncode = 0  # it outlives us; don't warn about it
        self.procs.clear()
        if self.server is not None:
            self.server.close()
            self.server = None
