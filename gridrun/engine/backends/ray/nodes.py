"""The engine's view of every Ray node, through each node's agent (agent.NodeAgent):

- `Nodes`: the alive nodes, each with its agent, name and GPUs; a node that joins gets
  an agent, one that leaves (or whose agent stops answering) is dropped. The backend
  makes its slots from them: `node2:gpu1`, each pinned to its node.
- `ClusterTelemetry`: what engine/telemetry.Telemetry gives for this machine, for the
  cluster: every node's GPUs (named by node) and compute processes, each already
  classified on its node (ours, another engine's run, a stranger's), so the engine's
  good neighbour (engine/foreign.py) and the machine panel work across servers.
- `ClusterLedger`: engine/ledger.Ledger's face over every node's own ledger, for
  engine/sharing.Sharing: lock, read, write and check each node's entry, each node's
  GPUs (by UUID) in its own ledger.

A node whose agent does not answer in time (a hung server, a full network) never
stalls the queue: it is `silent` from then on, its slots are offered to no new run,
the ledger calls skip it, and its samples are asked for without waiting, until one
comes back. Its runs go on (or end) as Ray says.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from gridrun.engine.backends.ray.agent import NodeAgent
from gridrun.engine.telemetry import GpuProcess, GpuSample, Sample, SystemSample

log = logging.getLogger("gridrun.engine")

ASK_WAIT = 10.0  # seconds a new agent has to describe its node
CALL_WAIT = 3.0  # seconds an agent has to answer a ledger call or a sample
FRESH = 0.5  # seconds a cluster sample serves every question asked of it
ENDED_PIDS_KEPT = 30.0  # seconds an ended run's pid is still ours (its process may linger)


@dataclass
class Node:
    id: str  # Ray's node id
    name: str
    agent: Any
    gpus: list[dict[str, Any]] = field(default_factory=list)  # {"index", "uuid", "total"}
    cores: int = 1
    ray_gpus: int = 0  # Ray's GPU count for the node (used when its NVML sees none)
    failing: str | None = None

    def key(self, gpu: Mapping[str, Any]) -> str:
        """The GPU's key everywhere in the engine: its UUID, else one made of its name."""
        return gpu.get("uuid") or f"{self.name}:gpu{gpu['index']}"


class Nodes:
    def __init__(self) -> None:
        self.alive: dict[str, Node] = {}
        self.silent: set[str] = set()  # nodes whose agent did not answer the last call
        self._agent = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1)(NodeAgent)

    def refresh(self) -> None:
        """Agents for nodes that joined, none for those that left or do not answer."""
        listed = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
        for gone in set(self.alive) - set(listed):
            log.warning("Ray node %s left the cluster", self.alive.pop(gone).name)
            self.silent.discard(gone)
        new = {}
        for node_id in set(listed) - set(self.alive):
            strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
            new[node_id] = self._agent.options(scheduling_strategy=strategy).remote()
        if not new:
            return
        described = ask({i: a.describe.remote() for i, a in new.items()})
        for node_id, info in described.items():
            res = listed[node_id].get("Resources", {})
            self.alive[node_id] = Node(node_id, info["name"], new[node_id], info["gpus"],
                                       int(res.get("CPU", 0)) or info["cores"],
                                       int(res.get("GPU", 0)), info["failing"])
            log.info("Ray node %s: %d GPUs seen by its NVML, %d CPUs", info["name"],
                     len(info["gpus"]), self.alive[node_id].cores)
        for node_id in set(new) - set(described):
            with contextlib.suppress(Exception):
                ray.kill(new[node_id])
        self._unique_names()

    def _unique_names(self) -> None:
        # two servers with one hostname (or a test cluster on one machine): tell them apart
        seen: dict[str, int] = {}
        for node in sorted(self.alive.values(), key=lambda n: n.id):
            seen[node.name] = seen.get(node.name, 0) + 1
        renamed = {}
        for node in self.alive.values():
            if seen[node.name] > 1:
                node.name = f"{node.name}-{node.id[:6]}"
                renamed[node.id] = node.agent.rename.remote(node.name)  # its samples say it too
        ask(renamed, CALL_WAIT)

    def answering(self) -> dict[str, Node]:
        return {i: n for i, n in self.alive.items() if i not in self.silent}

    def heard(self, asked: Mapping[str, Any], answered: Mapping[str, Any]) -> None:
        """Who answered a call and who did not (said once, when a node falls silent)."""
        for node_id in asked:
            if node_id in answered:
                if node_id in self.silent and node_id in self.alive:
                    log.warning("Ray node %s answers again", self.alive[node_id].name)
                self.silent.discard(node_id)
            elif node_id not in self.silent and node_id in self.alive:
                log.warning("Ray node %s does not answer: no new run goes there until it does",
                            self.alive[node_id].name)
                self.silent.add(node_id)

    def close(self) -> None:
        ask({i: n.agent.close.remote() for i, n in self.answering().items()}, CALL_WAIT)
        for node in self.alive.values():
            with contextlib.suppress(Exception):
                ray.kill(node.agent)
        self.alive.clear()


def done(refs: Mapping[str, Any]) -> set[str]:
    """The keys whose call has ended (answered or failed)."""
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0) if refs else ([], [])
    return {k for k, ref in refs.items() if ref in set(ready)}


def ask(refs: Mapping[str, Any], wait: float = ASK_WAIT) -> dict[str, Any]:
    """Each answer that came within `wait`, by key; a node that failed or is slow is left out."""
    if not refs:
        return {}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=wait)
    done = set(ready)
    out = {}
    for key, ref in refs.items():
        if ref in done:
            try:
                out[key] = ray.get(ref)
            except Exception as e:  # a node lost mid-call, an agent that died
                log.debug("Ray node %s did not answer: %s", key, e)
    return out


class ClusterTelemetry:
    """engine/telemetry.Telemetry's questions, answered for every node. `runs()`: this
    engine's run pids by node id (the backend's tasks)."""

    def __init__(self, nodes: Nodes, runs: Callable[[], dict[str, list[int]]]) -> None:
        self.nodes, self.runs = nodes, runs
        self._at = -1e9
        self._samples: dict[str, dict[str, Any]] = {}
        self._pending: dict[str, Any] = {}  # node -> the sample asked for and not yet had
        self._ended: dict[str, dict[int, float]] = {}  # node -> pid -> when it was last ours

    def _fresh(self) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        if now - self._at < FRESH:
            return self._samples
        runs = self.runs()
        for node, pids in runs.items():
            self._ended.setdefault(node, {}).update(dict.fromkeys(pids, now))
        for pids in self._ended.values():
            for pid in [p for p, t in pids.items() if now - t > ENDED_PIDS_KEPT]:
                del pids[pid]
        for i in set(self._pending) - set(self.nodes.alive):
            del self._pending[i]
        for i, node in self.nodes.alive.items():
            if i not in self._pending:  # a silent node's question stays asked, never doubled
                self._pending[i] = node.agent.sample.remote(sorted(self._ended.get(i, {})))
        # wait for the nodes that answer; a silent one's answer is taken whenever it comes
        waiting = [ref for i, ref in self._pending.items() if i not in self.nodes.silent]
        if waiting:
            ray.wait(waiting, num_returns=len(waiting), timeout=CALL_WAIT)
        answered = ask(self._pending, 0.0)
        self.nodes.heard(self._pending, answered)
        for i in set(self._pending) & (set(answered) | done(self._pending)):
            del self._pending[i]
        # a silent node's GPUs are out of the sample: what they hold now is not known
        self._samples = {i: answered[i] for i in answered if i in self.nodes.alive}
        self._at = now
        return self._samples

    @property
    def failing(self) -> str | None:
        bad = [f"{n.name}: {n.failing}" for n in self.nodes.alive.values() if n.failing]
        return "; ".join(bad) or None

    @property
    def available(self) -> bool:
        return self.gpu_count > 0

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes.alive.values())

    def sample(self) -> Sample:
        samples = self._fresh()
        gpus: list[GpuSample] = []
        for node_id in sorted(samples, key=lambda i: self.nodes.alive[i].name
                              if i in self.nodes.alive else i):
            gpus += samples[node_id]["sample"].gpus
        here = ray.get_runtime_context().get_node_id()
        system = samples.get(here, {}).get("sample")
        return Sample(t=time.time(), gpus=gpus, system=system.system if system else SystemSample())

    def gpu_processes(self) -> list[GpuProcess]:
        return [p for s in self._fresh().values() for p in s["processes"]]

    def processes(self) -> dict[int, Any]:
        """{pid: GPU key}: pids of several nodes may meet here; what it serves (which run a
        listed process is) is told by node where it matters (gpu_processes)."""
        return {p.pid: p.uuid or p.gpu for p in self.gpu_processes()}

    def close(self) -> None:
        self._samples = {}


class ClusterLedger:
    """engine/ledger.Ledger, spread over the nodes: each node's entry holds what this
    engine commits on that node's GPUs. `runs()`: this engine's run pids by node id."""

    def __init__(self, nodes: Nodes, runs: Callable[[], dict[str, list[int]]]) -> None:
        self.nodes, self.runs = nodes, runs
        self._states: dict[str, dict[str, Any]] = {}

    def _each(self, method: str, *args: Any) -> dict[str, Any]:
        asked = {i: getattr(n.agent, method).remote(*args) for i, n in self.nodes.answering().items()}
        answered = ask(asked, CALL_WAIT)
        self.nodes.heard(asked, answered)
        return answered

    def _say(self, key: str) -> str | None:
        said = [f"{self.nodes.alive[i].name}: {s[key]}" for i, s in self._states.items()
                if s.get(key) and i in self.nodes.alive]
        return "; ".join(said) or None

    # what Ledger says of itself, each node's in one line ("node2: ...; node3: ...")
    problem = property(lambda self: self._say("problem"))
    unread = property(lambda self: self._say("unread"))
    busy = property(lambda self: self._say("busy"))
    removed = property(lambda self: self._say("removed"))
    blocked = property(lambda self: self._say("blocked"))

    @property
    def folder(self) -> Path | str:
        folders = {s.get("folder") for s in self._states.values()}
        return folders.pop() if len(folders) == 1 else "each node's GPU ledger"

    def notes(self) -> list[str]:
        return [n for s in self._states.values() for n in s.get("notes", [])]

    def _refresh_states(self) -> None:
        self._states = self._each("state")

    @contextlib.contextmanager
    def held(self) -> Iterator[bool]:
        """Every node's ledger lock, held together while the engine places."""
        had = self._each("lock")
        try:
            yield bool(had) and all(had.values())
        finally:
            self._each("unlock")
            self._refresh_states()

    def others(self, max_age: float = 0.0) -> list[Any]:
        return [e for entries in self._each("others", max_age).values() for e in entries]

    def write(self, gpus: Mapping[str, int], threads: int, pids: Any) -> bool:
        """Each node's share of `gpus` (by ledger key) in its own ledger, with the pids of
        this engine's runs there (`pids`, every node's together, are not the node's)."""
        runs = self.runs()
        refs = {}
        for node_id, node in self.nodes.answering().items():
            keys = {node.key(g) for g in node.gpus}
            mine = {k: n for k, n in gpus.items() if k in keys}
            refs[node_id] = node.agent.write.remote(mine, 0, runs.get(node_id, []))
        written = ask(refs, CALL_WAIT)
        self.nodes.heard(refs, written)
        self._refresh_states()
        return len(written) == len(refs) and all(written.values())

    def intact(self) -> bool:
        asked = self.nodes.answering()
        answers = self._each("intact")
        return len(answers) == len(asked) and all(answers.values())

    def close(self) -> None:
        self._each("close")
