"""Other people's processes on the engine's GPUs: which compute processes are not this
engine's runs, the GPUs they take, the store state that says so (STATE: the scheduler's
FOREIGN) and its lines for people (`engine status`, `gridrun ls`).

- A process on a GPU is this engine's when it is an active run's process or a
  descendant of one (a run on several devices starts its ranks as its children), and
  another engine's run only when the ledger's entry of that engine says so and it is
  verifiably true (engine/entries.py: its owner's, below that engine's live process);
  any other is foreign: a colleague's, a `gridrun train` in a terminal, a run whose
  engine was killed, whatever an entry claims of it.
- A GPU is taken when a foreign process there uses more than MIN_BYTES of its memory,
  or NVML does not say how much. Under `[engine] foreign = "avoid"` (the default) no
  new run starts on it (`placement.plan` leaves its slots out); runs already there go
  on. Under `"share"` runs start there beside it, and the GPU is still named. Either
  way every byte a foreign process uses, however small, is out of the GPU's room
  (`Watch.memory`, engine/packing.py).
- The processes are sampled every `processes_every` seconds: a run may start on a GPU
  in the seconds between someone's start there and the next sample.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from gridrun.spec.engine_table import FOREIGN as POLICIES

AVOID, SHARE = POLICIES
STATE = "foreign_gpus"  # store state: {"policy", "gpus": [{"gpu", "uuid", "processes"}], "waits"}
MIN_BYTES = 256 << 20  # what a foreign process may hold on a GPU without taking it


def gib(n: Any) -> str:
    """A process's GPU memory for people: "20.0 GiB", or that NVML does not say."""
    return f"{n / 2**30:.1f} GiB" if isinstance(n, int | float) else "memory not reported"


def owner(pid: int, run_pids: Collection[int]) -> bool | None:
    """Whether `pid` is one of `run_pids` or a descendant of one (psutil: its ancestors);
    None when the process cannot be seen from here (gone, or in another PID namespace)."""
    if pid in run_pids:
        return True
    try:
        import psutil

        return any(p.pid in run_pids for p in psutil.Process(pid).parents())
    except Exception:  # NoSuchProcess, AccessDenied, no psutil
        return None


@functools.cache
def nested_pid_namespace() -> bool:
    """Whether this process lives in a PID namespace of its own (a container): NVML then
    names processes by the host's pids, which psutil cannot see here."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            return any(len(line.split()) > 2 for line in f if line.startswith("NSpid:"))
    except OSError:
        return False


def strangers(procs: Iterable[Any], run_pids: Collection[int], *,
              keys: Collection[Any] | None = None, held: Collection[int] = (), blind: bool = False,
              ours: Callable[[int, Collection[int]], bool | None] = owner) -> list[Any]:
    """The foreign processes of telemetry's GpuProcess records: on the engine's GPUs
    (`keys`: indices or UUIDs; None: every one) and not of `run_pids` nor below one;
    `blind` (a PID namespace of its own): a process that cannot be seen on a GPU one of
    the engine's runs holds (`held`) is that run's."""
    out = []
    for p in procs:
        if keys is not None and p.gpu not in keys and p.uuid not in keys:
            continue
        # a Ray node's agent told on the node itself (its pids are not ours to look up)
        mine = (p.ours or bool(p.engine)) if getattr(p, "ours", None) is not None \
            else ours(p.pid, run_pids)
        if not (mine or (mine is None and blind and p.gpu in held)):
            out.append(p)
    return out


def taken(procs: Iterable[Any], run_pids: Collection[int], *, keys: Collection[Any] | None = None,
          held: Collection[int] = (), blind: bool = False, min_bytes: int = MIN_BYTES,
          ours: Callable[[int, Collection[int]], bool | None] = owner) -> list[dict[str, Any]]:
    """The GPUs foreign processes (`strangers`) take, in GPU order, each with those
    processes (pid, user, memory): a process over `min_bytes`, or of unknown memory."""
    gpus: dict[tuple[str, int], dict[str, Any]] = {}
    for p in strangers(procs, run_pids, keys=keys, held=held, blind=blind, ours=ours):
        if p.mem_bytes is not None and p.mem_bytes <= min_bytes:
            continue
        node = getattr(p, "node", None)  # a Ray node's GPU: its index is the node's
        gpu = gpus.setdefault((node or "", p.gpu), {"gpu": p.gpu, "uuid": p.uuid, "processes": []}
                              | ({"node": node} if node else {}))
        gpu["processes"].append({"pid": p.pid, "user": p.user, "mem_bytes": p.mem_bytes})
    return [gpus[g] for g in sorted(gpus)]


class Watch:
    """The processes on the engine's GPUs, as last sampled: the sample's list (each with
    its run), and the GPUs others take (`gpus`, what STATE lists)."""

    def __init__(self, policy: str | None = AVOID) -> None:
        self.policy = policy if policy in POLICIES else AVOID
        self.listed: list[dict[str, Any]] = []  # {"pid", "gpu", "run_id"}: the telemetry sample's
        self.gpus: list[dict[str, Any]] = []
        self.bytes: dict[Any, int] = {}  # GPU (index and UUID) -> every foreign byte there
        self.runs: list[Any] = []  # the listed processes that are runs (ours, other engines')
        self._before: set[int] = set()  # the previous sample's run pids

    def sample(self, telemetry: Any, runs: Mapping[int, str], keys: Collection[Any],
               held: Collection[int],
               friends: Collection[int] | Callable[[list[int]], Collection[int]] = ()) -> bool:
        """A new sample (`runs`: the active runs' pids; `friends`: other gridrun engines'
        runs, which the ledger counts, or what verifies them among the listed processes:
        engine/sharing.Sharing.verify); True when the GPUs taken, or who takes them,
        changed. Without GPU slots nothing is taken."""
        self.listed = [{"pid": pid, "gpu": gpu, "run_id": runs.get(pid)}
                       for pid, gpu in telemetry.processes().items()]
        listed = getattr(telemetry, "gpu_processes", None)
        procs = listed() if keys and listed is not None else []
        # a run that ended since the last sample is ours still: its process may linger there
        ours, self._before = set(runs) | self._before, set(runs)
        if callable(friends):
            friends = friends([p.pid for p in procs if p.pid not in ours])
        ours |= set(friends)
        others = strangers(procs, ours, keys=keys, held=held, blind=nested_pid_namespace())
        strange = {id(p) for p in others}
        self.runs = [p for p in procs if id(p) not in strange and (p.gpu in keys or p.uuid in keys)]
        gpus = taken(others, (), min_bytes=MIN_BYTES, ours=lambda pid, runs: False)
        self.bytes = {}
        for p in others:
            for key in gpu_keys(p.gpu, p.uuid, getattr(p, "node", None)):
                self.bytes[key] = self.bytes.get(key, 0) + (p.mem_bytes or 0)
        changed = who(gpus) != who(self.gpus)
        self.gpus = gpus
        return changed

    def avoid(self) -> frozenset[Any]:
        """The GPUs no new run starts on (placement.plan's `avoid`), by index and UUID."""
        if self.policy != AVOID:
            return frozenset()
        return frozenset(k for g in self.gpus for k in gpu_keys(g["gpu"], g.get("uuid"), g.get("node")))

    def memory(self) -> dict[Any, int]:
        """GPU (index and UUID) -> every byte others' processes use there, however small
        each (packing's rooms; memory NVML does not report counts in NVML's used)."""
        return dict(self.bytes)

    def state(self, waits: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """STATE's value: the taken GPUs and, under "avoid", the first queued run that
        waits because every free GPU is taken (placement.Plan.taken); None: none taken."""
        if not self.gpus:
            return None
        return {"policy": self.policy, "gpus": self.gpus,
                "waits": dict(waits) if waits and self.policy == AVOID else None}


def gpu_keys(index: Any, uuid: Any, node: str | None = None) -> set[Any]:
    """How placement may name a GPU: its index and UUID here; on a Ray node, where every
    node has a GPU 0, its UUID (or the key its node gives it) alone."""
    if node:
        return {uuid or f"{node}:gpu{index}"}
    return {index, uuid} - {None}


def gpu_name(g: Mapping[str, Any]) -> str:
    """A GPU for people: `gpu1`, or `node2:gpu1` on a Ray node."""
    return f"{g['node']}:gpu{g.get('gpu')}" if g.get("node") else f"gpu{g.get('gpu')}"


def who(gpus: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """The GPUs and their processes' pids and users (memory moves with every sample)."""
    return [(g.get("gpu"), *sorted((p.get("pid"), p.get("user")) for p in g.get("processes") or []))
            for g in gpus]


def by_users(processes: Sequence[Mapping[str, Any]]) -> str:
    """`alice (pid 4242, 20.0 GiB), bob (pid 77, memory not reported; pid 78, 1.0 GiB)`."""
    users: dict[str, list[str]] = {}
    for p in processes:
        users.setdefault(str(p.get("user") or "?"), []).append(
            f"pid {p.get('pid')}, {gib(p.get('mem_bytes'))}")
    return ", ".join(f"{user} ({'; '.join(each)})" for user, each in users.items())


def gpu_lines(state: Any) -> list[str]:
    """A line per GPU others take (`engine status`, `gridrun ls`); [] for anything else."""
    if not isinstance(state, dict) or not isinstance(state.get("gpus"), list):
        return []
    share = state.get("policy") == SHARE
    out = []
    for g in state["gpus"]:
        if not isinstance(g, dict) or not isinstance(g.get("processes"), list):
            continue  # a state written by hand or another version: nothing to say
        procs = [p for p in g["processes"] if isinstance(p, dict)]
        out.append(f"{gpu_name(g)}: shared with {by_users(procs)}: runs start there beside "
                   'them ([engine] foreign = "share")' if share else
                   f"{gpu_name(g)}: taken by {by_users(procs)}: no new run starts there "
                   '([engine] foreign = "share" to use it anyway)')
    return out


def waits_line(state: Any) -> str | None:
    """`engine status`'s line for a queue whose first run waits because every free GPU
    is taken by others, or None."""
    waits = state.get("waits") if isinstance(state, dict) else None
    if not isinstance(waits, dict):
        return None
    gpus = ", ".join(map(str, waits.get("gpus") or [])) or "?"
    return (f"queue: every free GPU ({gpus}) is taken by others: {waits.get('run_id')} and the "
            'runs after it wait until one is free ([engine] foreign = "share" to use them anyway)')
