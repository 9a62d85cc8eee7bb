"""Runs on a Ray cluster: the queue stays in gridrun, Ray only places and runs each run.

Decisions (issues 7 and 47):

- gridrun places every run itself, on a node and a GPU, as it does on one server,
  and Ray only runs it there. A small agent on each node (nodes.Nodes, agent.py)
  sees the node's GPUs with the node's own NVML; the slots are each node's GPUs
  (`node2:gpu1`, times runs_per_gpu; a node's CPUs where it has no GPU), refreshed
  as `poll` runs, so nodes that join or leave change where runs go. The engine's
  good neighbour and packing see every node (`telemetry`: nodes.ClusterTelemetry;
  `ledger`: nodes.ClusterLedger, each node's own ledger), so no run starts on a GPU
  someone else uses under "avoid", and runs are packed per GPU by measured memory.
- Each run is one Ray task pinned to its slot's node (node affinity, hard), asking
  Ray for `num_cpus=1` and no GPU: the GPUs are gridrun's to hand out, so Ray's
  fractional GPU count never over-commits a card; the task gives the run its
  CUDA_VISIBLE_DEVICES and memory budget (`Slot.env`). The engine submits a run
  only onto a free slot, so nothing waits inside Ray's queue: the order,
  priorities, pause and retries stay in gridrun and stay reorderable.
- A run on `devices` = n takes n slots of one node (placement.pick), is launched once
  on its gang slot (CUDA_VISIBLE_DEVICES "0,1") and starts its ranks itself, as on one
  server. Ray reserves what the ranks take in one placement group on that node (gangs.py):
  n bundles of a CPU (no Ray GPU), STRICT_PACK, each bundle selecting the node's
  `ray.io/node-id` label, which places the group on that node or nowhere
  (`_soft_target_node_id` is only a hint; a task cannot take node affinity and a group
  at once). The run's task goes into the group; the group is removed when the task ends
  (done, cancelled, node lost) and at `close`.
- On its node the task starts the same entry as the local backend,
  `python -m gridrun.engine.backends.child RUN_DIR` (it takes the run's lock,
  points stdout/stderr at RUN_DIR/output.log, runs the worker and leaves an
  exit record) with its slot's environment. The task is a
  streaming generator that yields events: started (node, pid), new
  metrics.jsonl lines as they appear (liveness and progress), and last the
  exit code.
- The runs root must be one shared folder seen by every node (checked at
  `start`). The worker writes metrics.jsonl, summary.json and checkpoints
  there itself, which is what exact resume needs (a checkpoint records its
  metrics offset); the streamed events are how the engine learns progress
  and the end, not a second copy of the files.
- Cancel is graceful: a tiny task pinned to the run's node sends SIGTERM (the
  worker checkpoints and exits 5); after the grace period another sends
  SIGKILL, and if the task still has not ended, `ray.cancel(force=True)`.
- Tasks belong to the engine (the Ray driver): if the engine dies, Ray ends
  them; the child gets SIGTERM from its parent's death (PR_SET_PDEATHSIG) and
  checkpoints. `reattach` therefore returns None and the scheduler resumes
  those runs from their checkpoints; a relaunch whose previous process still
  holds the run lock waits for it in the task, so a run never executes twice.
- A run whose node disappears ends as `interrupted` (exit code 5) and resumes
  elsewhere from its checkpoint.

This package is the only one that imports ray (`pip install 'gridrun[ray]'`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridrun.engine.backends.base import (
    Backend,
    Exited,
    Handle,
    Slot,
)
from gridrun.engine.backends.ray.tasks import probe_task, run_task, signal_task
from gridrun.runs import layout, states
from gridrun.spec import read_run_config

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from gridrun.engine.backends.ray.gangs import Gangs
    from gridrun.engine.backends.ray.nodes import ClusterLedger, ClusterTelemetry, Node, Nodes
except ImportError as e:  # not installed, or installed and broken: said by _require_ray
    ray, RAY_IMPORT_ERROR = None, e

log = logging.getLogger("gridrun.engine")

INSTALL_HINT = "the ray backend needs Ray: pip install 'gridrun[ray]'"
INTERRUPTED = states.EXIT_CODES[states.INTERRUPTED]
FORCE_AFTER = 10.0  # seconds after SIGKILL before the Ray task itself is cancelled
REFRESH_EVERY = 5.0  # seconds between capacity refreshes
LOST_NODE_WAIT = 10.0  # seconds to wait for the cluster to confirm a node died


class RayUnavailable(RuntimeError):
    pass


def _require_ray() -> None:
    if ray is None:
        err = RAY_IMPORT_ERROR
        if isinstance(err, ModuleNotFoundError) and err.name == "ray":
            raise RayUnavailable(INSTALL_HINT)
        raise RayUnavailable(f"[engine] backend = \"ray\": Ray is installed but does not import "
                             f"({err}); reinstall it: pip install 'gridrun[ray]'")


# ---- in the engine ---------------------------------------------------------------


@dataclass
class _Task:
    gen: Any
    handle: Handle | None = None
    node: str | None = None
    pid: int = 0
    start_time: float = 0.0
    cuda: str | None = None
    step: int | None = None
    pending_grace: float | None = None  # cancel asked before the process started
    kill_at: float | None = None
    force_at: float | None = None
    events: int = 0
    launched_at: float = 0.0
    started_after: float | None = None  # seconds from launch to the process started


def node_slots(node: Node, runs_per_gpu: int | str) -> list[Slot]:
    """A node's slots: each GPU its NVML sees (else each Ray counts there) times
    runs_per_gpu ("auto": the node's cores bound it), or a slot a CPU."""
    per = node.cores if runs_per_gpu == "auto" else int(runs_per_gpu)
    gpus = node.gpus or [{"index": i, "uuid": None} for i in range(node.ray_gpus)]
    if not gpus:
        return [Slot(f"{node.name}:cpu{k}", node=node.id) for k in range(node.cores)]
    return [Slot(f"{node.name}:gpu{g['index']}" + (f".{k}" if per > 1 else ""), g["index"],
                 node.key(g), node=node.id) for g in gpus for k in range(per)]


class RayBackend(Backend):
    name = "ray"

    def __init__(self, root: str | Path, *, address: str = "auto", runs_per_gpu: int | str = 1,
                 log_path: Path | None = None, check_shared: bool = True):
        _require_ray()
        self.root = Path(root).resolve()
        self.address = address
        # "auto": packed by measured memory (engine/packing.py); a node's cores bound how many
        self.runs_per_gpu = runs_per_gpu if runs_per_gpu == "auto" else max(1, int(runs_per_gpu))
        self.log_path = log_path
        self.check_shared = check_shared
        self.tasks: dict[str, _Task] = {}  # run id -> task
        self._placed: dict[str, dict[str, Any]] = {}  # run id -> where it started, not yet told
        self._slots: list[Slot] = []
        self._next_refresh = 0.0
        self.nodes: Nodes | None = None
        self.telemetry: ClusterTelemetry | None = None  # the engine's, for every node
        self.ledger: ClusterLedger | None = None  # engine/sharing's, every node's own
        self._owns_ray = False
        self._remote: dict[str, Any] = {}
        self.gangs = Gangs()  # the placement groups of runs on several devices

    # ---- setup ------------------------------------------------------------------

    def start(self) -> None:
        if self._remote:
            return
        if not ray.is_initialized():
            try:
                ray.init(address=self.address, log_to_driver=False, include_dashboard=False)
            except ConnectionError as e:
                raise ConnectionError(
                    f"no Ray cluster at [engine] ray_address = {self.address!r} "
                    f"({str(e).splitlines()[0]}); start one with `ray start --head`, or set "
                    "ray_address to the head node (\"ray://host:10001\" or \"host:6379\")") from e
            self._owns_ray = True
        # (function, default options); options() returns something without options()
        self._remote = {
            "run": (ray.remote(run_task), {"num_returns": "streaming", "max_retries": 0,
                                           "num_cpus": 1}),
            "signal": (ray.remote(signal_task), {"num_cpus": 0, "max_retries": 0}),
            "probe": (ray.remote(probe_task), {"num_cpus": 0, "max_retries": 0}),
        }
        if self.check_shared:
            self.check_root_shared()
        self.nodes = Nodes()
        self.telemetry = ClusterTelemetry(self.nodes, self.run_pids)
        self.ledger = ClusterLedger(self.nodes, self.run_pids)
        self.refresh_slots(force=True)
        log.info("ray backend: %d slots on %d nodes", len(self._slots), len(self.nodes.alive))

    def _submit(self, name: str, *args: Any, node: str | None = None, **options: Any) -> Any:
        fn, defaults = self._remote[name]
        if node is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        return fn.options(**defaults, **options).remote(*args)

    def _alive_nodes(self) -> list[dict]:
        return [n for n in ray.nodes() if n.get("Alive")]

    def check_root_shared(self, timeout: float = 60.0) -> None:
        """Every alive node must read a file written here and write one we can read."""
        layout.make_private_dir(self.root)
        probe = self.root / f".gridrun-probe-{uuid.uuid4().hex[:12]}"
        token = uuid.uuid4().hex
        probe.write_text(token)
        try:
            nodes = self._alive_nodes()
            refs = {n["NodeID"]: self._submit("probe", str(probe), node=n["NodeID"]) for n in nodes}
            addresses = {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in nodes}
            bad = []
            for node, ref in refs.items():
                try:
                    seen = ray.get(ref, timeout=timeout)
                except (ray.exceptions.TaskUnschedulableError, ray.exceptions.NodeDiedError):
                    continue  # a node that just died and is still listed: nothing runs there
                except Exception as e:  # a node that cannot even run the probe
                    bad.append(f"{addresses[node]}: {e}")
                    continue
                back = Path(f"{probe}.{node}")
                if seen != token or not back.exists() or back.read_text() != token:
                    bad.append(f"{addresses[node]}: {seen if seen.startswith('error:') else 'a different folder'}")
            if bad:
                raise RuntimeError(
                    f"the runs root {self.root} is not shared with every Ray node "
                    f"(mount it at the same path on each node): " + "; ".join(bad))
        finally:
            for p in self.root.glob(probe.name + "*"):
                p.unlink(missing_ok=True)

    def slots(self) -> list[Slot]:
        """The live list of slots: the engine holds this very list; `start` fills it
        and `poll` keeps it current as nodes come and go."""
        return self._slots

    def refresh_slots(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.nodes is None or (not force and now < self._next_refresh):
            return
        self._next_refresh = now + REFRESH_EVERY
        self.nodes.refresh()
        # kept in place: the engine reads this very list when it looks for free slots
        self._slots[:] = [s for node in sorted(self.nodes.answering().values(), key=lambda n: n.name)
                          for s in node_slots(node, self.runs_per_gpu)]

    def _where(self, task: _Task) -> dict[str, Any]:
        node = self.nodes.alive.get(task.node) if self.nodes and task.node else None
        slot = task.handle.slot
        return {"backend": "ray", "node": node.name if node else task.node, "gpus": task.cuda,
                "slot": slot.name if slot else None, "budget_bytes": slot.budget if slot else None}

    def placements(self) -> dict[str, dict[str, Any]]:
        """{run id: {"backend", "node", "gpus", "slot", "budget_bytes"}} of runs that
        started since the last call (the engine records them: `ls`, the run's detail)."""
        out, self._placed = self._placed, {}
        return out

    def run_pids(self) -> dict[str, list[int]]:
        """This engine's run processes by Ray node id (their pids are that node's)."""
        out: dict[str, list[int]] = {}
        for task in self.tasks.values():
            if task.node and task.pid:
                out.setdefault(task.node, []).append(task.pid)
        return out

    # ---- runs ---------------------------------------------------------------------

    def launch(self, run_id: str, run_dir: Path, slot: Slot, *, fresh: bool = False) -> Handle:
        devices = read_run_config(Path(run_dir) / layout.CONFIG).trainer.get("devices", 1)
        # pinned to the node gridrun chose; its GPUs are in its environment, not Ray's count;
        # on several devices, into a placement group on that node (gangs.py)
        path = str(Path(run_dir).resolve())
        gen = self.gangs.submit(run_id, slot, devices,
                                lambda **where: self._submit("run", path, fresh, slot.env, **where))
        task = _Task(gen, launched_at=time.monotonic())
        task.handle = Handle(run_id, Path(run_dir), 0, 0.0, slot, extra=task)
        self.tasks[run_id] = task
        return task.handle

    def reattach(self, run_id: str, run_dir: Path, pid: int | None, start_time: float | None,
                 slot: Slot | None = None) -> Handle | None:
        # tasks die with the driver that owned them; a run still held by an old
        # process is waited for inside its next task (see run_task)
        task = self.tasks.get(run_id)
        return task.handle if task is not None else None

    def cancel(self, handle: Handle, grace: float = 30.0) -> None:
        task = self.tasks.get(handle.run_id)
        if task is None:
            return
        if not task.pid:
            task.pending_grace = grace
            return
        self._signal(task, signal.SIGTERM)
        task.kill_at = time.monotonic() + grace

    def _signal(self, task: _Task, sig: int) -> None:
        with contextlib.suppress(Exception):
            self._submit("signal", task.pid, task.start_time, int(sig), node=task.node)

    def poll(self, timeout: float) -> list[Exited]:
        self.refresh_slots()
        if not self.tasks:
            time.sleep(timeout)
            return []
        gens = [t.gen for t in self.tasks.values()]
        with contextlib.suppress(Exception):
            ray.wait(gens, num_returns=1, timeout=timeout, fetch_local=False)
        exited = []
        now = time.monotonic()
        for run_id, task in list(self.tasks.items()):
            code = self._drain(task)
            if code is False:
                if task.kill_at is not None and now >= task.kill_at:
                    self._signal(task, signal.SIGKILL)
                    task.kill_at, task.force_at = None, now + FORCE_AFTER
                elif task.force_at is not None and now >= task.force_at:
                    with contextlib.suppress(Exception):
                        ray.cancel(task.gen, force=True)
                    task.force_at = None
                continue
            del self.tasks[run_id]
            self.gangs.release(run_id)  # its reservation ends with it
            exited.append(Exited(task.handle, code))
        return exited

    def _drain(self, task: _Task) -> int | bool | None:
        """Read the task's ready events; its exit code, None if unknown, False if it goes on."""
        while True:
            ready, _ = ray.wait([task.gen], num_returns=1, timeout=0, fetch_local=True)
            if not ready:
                return False
            try:
                event = ray.get(next(task.gen))
            except StopIteration:
                return None
            except ray.exceptions.TaskCancelledError:
                return None
            except ray.exceptions.RayError as e:
                return self._lost(task, e)
            task.events += 1
            kind = event.get("event")
            if kind == "started":
                task.node, task.pid = event["node"], event["pid"]
                task.start_time, task.cuda = event["start_time"], event["cuda"]
                if task.started_after is None:
                    task.started_after = time.monotonic() - task.launched_at
                self._placed[task.handle.run_id] = self._where(task)
                if task.pending_grace is not None:
                    self.cancel(task.handle, task.pending_grace)
                    task.pending_grace = None
            elif kind == "metrics":
                steps = [r.get("step") for r in event["records"] if r.get("step") is not None]
                task.step = steps[-1] if steps else task.step
            elif kind == "exit":
                if event.get("error"):
                    log.error("%s: %s", task.handle.run_id, event["error"])
                return event["code"]

    def _lost(self, task: _Task, error: Exception) -> int | None:
        """A Ray error instead of an event: interrupted if its node is gone, else unknown."""
        # the owner learns of a dead node before the node list does (tens of seconds)
        crashed = isinstance(error, ray.exceptions.WorkerCrashedError)
        deadline = time.monotonic() + (LOST_NODE_WAIT if crashed else 0)
        while True:
            alive = {n["NodeID"] for n in self._alive_nodes()}
            if (isinstance(error, ray.exceptions.NodeDiedError) or task.node is None
                    or task.node not in alive):
                log.warning("%s: its Ray node is gone (%s); it resumes elsewhere",
                            task.handle.run_id, type(error).__name__)
                return INTERRUPTED
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        log.warning("%s: its Ray task failed: %s: %s", task.handle.run_id, type(error).__name__, error)
        return None

    def close(self) -> None:
        self.gangs.close()
        self.tasks.clear()
        if self.nodes is not None:
            with contextlib.suppress(Exception):
                self.nodes.close()
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False
