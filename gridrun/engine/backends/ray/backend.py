"""Runs on a Ray cluster: the queue stays in gridrun, Ray only places and runs each run.

Decisions (issue 7):

- Each run is one Ray task asking for `num_cpus=1` and `num_gpus=1/runs_per_gpu`
  (0 on a cluster without GPUs); a run on `devices` > 1 fails at its launch with
  one line (`base.Refused`: one process per run here). The engine submits a run
  only onto a free slot, and the slots are the cluster's capacity (`slots()`: GPUs times
  runs_per_gpu, or CPUs), so nothing waits inside Ray's queue: the order,
  priorities, pause and retries stay in gridrun and stay reorderable.
  The slot list is refreshed from the alive nodes as `poll` runs, so nodes
  that join or leave change how many runs go out.
- On its node the task starts the same entry as the local backend,
  `python -m gridrun.engine.backends.child RUN_DIR` (it takes the run's lock,
  points stdout/stderr at RUN_DIR/output.log, runs the worker and leaves an
  exit record); Ray has set CUDA_VISIBLE_DEVICES for the task. The task is a
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
    Refused,
    Slot,
)
from gridrun.engine.backends.ray.tasks import probe_task, run_task, signal_task
from gridrun.runs import layout, states
from gridrun.spec import read_run_config

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
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


class RayBackend(Backend):
    name = "ray"

    def __init__(self, root: str | Path, *, address: str = "auto", runs_per_gpu: int = 1,
                 log_path: Path | None = None, check_shared: bool = True):
        _require_ray()
        self.root = Path(root).resolve()
        self.address = address
        self.runs_per_gpu = max(1, int(runs_per_gpu))
        self.log_path = log_path
        self.check_shared = check_shared
        self.tasks: dict[str, _Task] = {}  # run id -> task
        self._slots: list[Slot] = []
        self._gpu = False
        self._next_refresh = 0.0
        self._owns_ray = False
        self._remote: dict[str, Any] = {}

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
        self.refresh_slots(force=True)
        log.info("ray backend: %d slots on %d nodes", len(self._slots), len(self._alive_nodes()))

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
        if not force and now < self._next_refresh:
            return
        self._next_refresh = now + REFRESH_EVERY
        gpus = cpus = 0
        for node in self._alive_nodes():
            res = node.get("Resources", {})
            gpus += int(res.get("GPU", 0)) * self.runs_per_gpu
            cpus += int(res.get("CPU", 0))
        count = gpus if gpus else cpus
        self._gpu = bool(gpus)
        # kept in place: the engine reads this very list when it looks for free slots
        self._slots[:] = [Slot(f"ray{i}") for i in range(count)]

    # ---- runs ---------------------------------------------------------------------

    def launch(self, run_id: str, run_dir: Path, slot: Slot, *, fresh: bool = False) -> Handle:
        devices = read_run_config(Path(run_dir) / layout.CONFIG).trainer.get("devices", 1)
        if devices > 1:  # `plan` refuses it with a Ray [engine]; queued with another one, here
            raise Refused(f"devices = {devices}: the Ray backend runs one process per run; use "
                          "backend = \"local\" or \"slurm\" for multi-device runs")
        opts = {"num_gpus": 1 / self.runs_per_gpu} if self._gpu else {}
        gen = self._submit("run", str(Path(run_dir).resolve()), fresh, **opts)
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
        self.tasks.clear()
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False
