"""Other users and a machine's GPUs for the ledger's tests (issue 45; no tests here).

- `Users`: real processes of other users (a `sleep`, or a `sh` with a `sleep` child),
  started with setuid in a preexec_fn: what another user's engine or GPU process is to
  psutil. Needs root (the tests run as root here); `needs_root` skips without it.
- `plant`: an entry file in the ledger folder, chowned to its writer, as another user's
  engine (or someone hostile) would leave it.
- `Gpus`: the engine's telemetry, standing in for NVML: each GPU's size and used memory
  (None: not reported) and the compute processes it lists. Used memory, unless set, is
  what the listed processes use.
- `Sleepers`: a backend named "local" (so the engine takes part in the ledger) whose
  runs are `sleep` processes that end only when told; nothing trains.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from gridrun.engine.backends.base import Backend, Exited, Handle, Slot
from gridrun.engine.scheduler import Engine
from gridrun.engine.telemetry import GpuProcess, GpuSample, Sample

GIB = 1 << 30
NOBODY, DAEMON = 65534, 1
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root")


def become(uid: int):
    def preexec() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    return preexec


class Users:
    """Processes of other users, each killed when the test ends."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def process(self, uid: int) -> tuple[int, float]:
        """A live process of `uid`: its pid and start time."""
        proc = subprocess.Popen(["sleep", "600"], preexec_fn=become(uid), stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc.pid, psutil.Process(proc.pid).create_time()

    def family(self, uid: int) -> tuple[int, float, int]:
        """A process of `uid` with a child of its own (an engine and its run, as far as
        anyone can tell): the parent's pid and start time, the child's pid."""
        proc = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; wait"], preexec_fn=become(uid),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        child = int(proc.stdout.readline())
        return proc.pid, psutil.Process(proc.pid).create_time(), child

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=60)


def plant(folder: Path, uid: int, *, pid: int, start_time: float, gpus: dict | None = None,
          threads: int = 0, pids: tuple[int, ...] | list[int] = (), token: str = "ab12") -> Path:
    """An entry as the engine of `uid` writes it (mode 0644, owned by `uid`)."""
    folder.mkdir(mode=0o1777, exist_ok=True)
    folder.chmod(0o1777)
    path = folder / f"{uid}.{pid}.{token}.json"
    path.write_text(json.dumps({"pid": pid, "start_time": start_time, "gpus": gpus or {},
                                "threads": threads, "pids": list(pids)}))
    path.chmod(0o644)
    os.chown(path, uid, uid)
    return path


def uuid(index: int) -> str:
    return f"GPU-{index:04d}"


class Gpus:
    """NVML as the engine's telemetry sees it: `totals` (None: the size is not reported),
    `used` (None: the sum of the listed processes; "n/a": not reported), `procs`:
    (pid, GPU index, bytes or None) of each compute process."""

    def __init__(self, totals=(8 * GIB,), used=None) -> None:
        self.totals = list(totals)
        self.used = list(used) if used is not None else [None] * len(self.totals)
        self.procs: list[tuple[int, int, int | None]] = []
        self.error = None

    @property
    def available(self) -> bool:
        return True

    def _used(self, index: int) -> int | None:
        if self.used[index] == "n/a":
            return None
        if self.used[index] is not None:
            return self.used[index]
        return sum(n or 0 for _, g, n in self.procs if g == index)

    def sample(self) -> Sample:
        return Sample(time.time(), [
            GpuSample(i, "stand-in", mem_total_bytes=total, uuid=uuid(i),
                      mem_used_bytes=self._used(i) if total is not None else None)
            for i, total in enumerate(self.totals)])

    def processes(self) -> dict[int, int]:
        return {pid: gpu for pid, gpu, _ in self.procs}

    def gpu_processes(self) -> list[GpuProcess]:
        out = []
        for pid, gpu, n in self.procs:
            try:
                user = psutil.Process(pid).username()
            except psutil.Error:
                user = "?"
            out.append(GpuProcess(pid, gpu, n, user, uuid(gpu)))
        return out

    def close(self) -> None:
        pass


class Sleepers(Backend):
    """Each run a `sleep` process that ends when `end` is called (exit code 0)."""

    name = "local"

    def __init__(self) -> None:
        self.live: dict[str, subprocess.Popen] = {}
        self.handles: dict[str, Handle] = {}
        self.ending: list[str] = []

    def launch(self, run_id, run_dir, slot, *, fresh=False):
        proc = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)
        self.live[run_id] = proc
        self.handles[run_id] = Handle(run_id, Path(run_dir), proc.pid,
                                      psutil.Process(proc.pid).create_time(), slot)
        return self.handles[run_id]

    def end(self, run_id: str) -> None:
        self.ending.append(run_id)

    def poll(self, timeout):
        ended = []
        for run_id in self.ending:
            proc = self.live.pop(run_id)
            proc.kill()
            proc.wait(timeout=60)
            ended.append(Exited(self.handles.pop(run_id), 0))
        self.ending = []
        return ended

    def cancel(self, handle, grace=30.0):
        self.end(handle.run_id)

    def reattach(self, run_id, run_dir, pid, start_time, slot=None):
        return None

    def close(self) -> None:
        for proc in self.live.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        self.live.clear()


def gpu_engine(root: Path, gpus: Gpus, *, slots: int = 4, runs_per_gpu="auto", foreign="avoid",
               cores: int = 16, ledger=None) -> Engine:
    """An in-process engine with `slots` slots on each of `gpus`' GPUs that samples at
    every step."""
    per = [Slot(f"gpu{g}.{k}" if slots > 1 else f"gpu{g}", g)
           for g in range(len(gpus.totals)) for k in range(slots)]
    return Engine(root, Sleepers(), per, telemetry=gpus, telemetry_every=0.0, processes_every=0.0,
                  backoff=0.05, cores=cores, runs_per_gpu=runs_per_gpu, foreign=foreign,
                  ledger=ledger)


def committed(*engines: Engine) -> dict[int, int]:
    """GPU index -> the bytes the engines' running runs commit there."""
    out: dict[int, int] = {}
    for engine in engines:
        for act in engine.active.values():
            for part in act.slot.parts:
                out[part.gpu] = out.get(part.gpu, 0) + act.commit
    return out


def pretend_daemon(root: Path) -> None:
    """engine.pid naming this process: the in-process engine is the root's engine for
    `engine status` (its loop writes the heartbeat)."""
    from gridrun.engine import daemon
    from gridrun.engine.backends.child import process_start_time

    pid = os.getpid()
    (root / daemon.PID).write_text(json.dumps({"pid": pid, "start_time": process_start_time(pid),
                                               "started_at": time.time(), "state": "running"}))
