"""gridrun's eyes on one Ray node: a small actor on each node (made by engine-side
`nodes.Nodes`, pinned there) that samples the node's GPUs with its own NVML, tells
whose each compute process there is, and keeps the engine's entry in the node's own
GPU ledger. Every question that needs the node's processes (/proc, psutil, pids) is
answered here, on the node, never on the engine's machine: pids are the node's.

- `describe`: the node's name (GRIDRUN_NODE_NAME, else its short hostname) and GPUs
  (index, UUID, size).
- `sample(runs)`: a telemetry sample (each GPU with the node's name) and the compute
  processes, each classified where it runs: `ours` (one of `runs`, this engine's run
  pids on the node, or below one), `engine` (verifiably another engine's run: its
  entry in this node's ledger, engine/entries.engine_runs), else a stranger's.
- The ledger calls (`lock`, `others`, `write`, `intact`, `state`, `close`): this node's
  ledger (GRIDRUN_LEDGER, else /dev/shm/gridrun-ledger), so an engine outside Ray on
  the same server and this engine count each other's commitments. The actor is the
  entry's engine process: it lives as long as the engine (Ray ends it with its driver).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from typing import Any

NAME_ENV = "GRIDRUN_NODE_NAME"


def node_name() -> str:
    """How gridrun names this node to people: GRIDRUN_NODE_NAME, else the short hostname."""
    return os.environ.get(NAME_ENV) or socket.gethostname().split(".")[0] or "node"


class NodeAgent:
    """The actor's class (ray.remote is applied by the engine's side)."""

    def __init__(self) -> None:
        from gridrun.engine.ledger import Ledger
        from gridrun.engine.telemetry import Telemetry

        self.name = node_name()
        self.telemetry = Telemetry()
        self.ledger = Ledger()
        self._lock: contextlib.ExitStack | None = None

    def describe(self) -> dict[str, Any]:
        import psutil

        sample = self.telemetry.sample()
        return {"name": self.name, "failing": self.telemetry.failing,
                "cores": len(os.sched_getaffinity(0)) or psutil.cpu_count() or 1,
                "gpus": [{"index": g.index, "uuid": g.uuid, "total": g.mem_total_bytes}
                         for g in sample.gpus]}

    def rename(self, name: str) -> None:
        """The name the engine tells this node by (two servers with one hostname)."""
        self.name = name

    def pid(self) -> int:
        return os.getpid()

    def sample(self, runs: list[int]) -> dict[str, Any]:
        """This node's sample and classified processes; `runs`: this engine's run pids here."""
        from gridrun.engine.entries import REFRESH, engine_runs
        from gridrun.engine.foreign import owner

        sample = self.telemetry.sample()
        gpus = [dataclasses.replace(g, node=self.name) for g in sample.gpus]
        procs = self.telemetry.gpu_processes()
        mine = {p.pid: bool(owner(p.pid, set(runs))) for p in procs}
        verified = engine_runs([p.pid for p in procs if not mine[p.pid]],
                               self.ledger.others(max_age=REFRESH))
        listed = [dataclasses.replace(p, node=self.name, ours=mine[p.pid],
                                      engine=self._named(verified[p.pid].file)
                                      if p.pid in verified else None) for p in procs]
        return {"sample": dataclasses.replace(sample, gpus=gpus), "processes": listed,
                "failing": self.telemetry.failing}

    # ---- the node's ledger ----------------------------------------------------------------

    def lock(self) -> bool:
        """Hold the node's ledger lock until `unlock` (False: not had in time, as locally)."""
        self.unlock()
        stack = contextlib.ExitStack()
        had = stack.enter_context(self.ledger.held())
        self._lock = stack
        return had

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def others(self, max_age: float) -> list[Any]:
        return [dataclasses.replace(e, file=self._named(e.file))
                for e in self.ledger.others(max_age=max_age)]

    def write(self, gpus: dict[str, int], threads: int, pids: list[int]) -> bool:
        return self.ledger.write(gpus, threads, pids)

    def intact(self) -> bool:
        return self.ledger.intact()

    def state(self) -> dict[str, Any]:
        """What the engine's views say of this node's ledger."""
        ledger = self.ledger
        return {"problem": ledger.problem, "unread": ledger.unread, "busy": ledger.busy,
                "removed": ledger.removed, "blocked": ledger.blocked, "notes": ledger.notes(),
                "folder": str(ledger.folder)}

    def close(self) -> None:
        self.unlock()
        self.ledger.close()

    def _named(self, file: str) -> str:
        return f"{self.name}:{file}"
