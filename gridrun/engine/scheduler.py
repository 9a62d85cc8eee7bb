"""The engine loop: give queued runs to free slots, watch them end, apply what
clients asked for, sample telemetry, and after a restart adopt what still runs.

One thread, one loop: `Engine.step()` applies intents, launches onto free
slots, waits (up to a tick) for runs to end and records how they ended
(endings.py decides what each ending means).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gridrun.engine import packing, placement
from gridrun.engine.backends.base import Backend, Exited, Refused, Slot
from gridrun.engine.diskspace import DiskSpace
from gridrun.engine.endings import Active, Endings, folder_id
from gridrun.engine.foreign import STATE as FOREIGN  # the GPUs others' processes take, or None
from gridrun.engine.foreign import Watch
from gridrun.engine.sampling import NVML, Sampling
from gridrun.engine.search import Searches
from gridrun.engine.sharing import Sharing
from gridrun.runs import layout, space, states
from gridrun.runs.store import FOREGROUND, Run, Store
from gridrun.spec import write_run_config
from gridrun.train import threads as run_threads  # usable_cores

log = logging.getLogger("gridrun.engine")


HEARTBEAT = "engine_heartbeat"  # store state: {"pid", "t"}, written every HEARTBEAT_EVERY s
HEARTBEAT_EVERY = 1.0
CPU_CAP = "cpu_cap"  # store state: why CPU runs wait with slots free (threads), or None
SLOTS_WAIT = "slots_wait"  # store state: the first run waits for more free slots (devices), or None
FOREGROUND_EVERY = 2.0  # how often the engine looks whether foreground runs' processes live


class Engine(Endings, Sampling):
    def __init__(self, root: str | Path, backend: Backend, slots: list[Slot], *,
                 store: Store | None = None, telemetry: Any = None, tick: float = 0.25,
                 backoff: float = 10.0, cancel_grace: float = 30.0, stop_grace: float = 120.0,
                 telemetry_every: float = 1.0, processes_every: float = 5.0,
                 space_retry: float = 2.0, space_margin: int = space.RESUME_MARGIN,
                 announce: Callable[[dict[str, Any]], None] | None = None,
                 thread_budget: bool = True, cores: int | None = None,
                 foreign: str | None = None, runs_per_gpu: int | str | None = None,
                 ledger: Any = None):
        self.root = Path(root)
        # CPU runs on this machine start only while their threads fit the usable cores
        # (`thread_budget = False`: every free slot, as before; the benchmark's baseline)
        self.thread_budget = thread_budget
        self.cores = cores or run_threads.usable_cores()
        self._said: dict[str, Any] = {}  # what CPU_CAP, SLOTS_WAIT, FOREIGN say (absent: clear)
        self.store = store or Store(root)
        # a GPU others compute on: `foreign` as given, else as the [engine] table says
        table = self.store.get_state("engine_config") or {}
        self.others = Watch(foreign or table.get("foreign"))
        self.backend, self.slots, self.telemetry = backend, slots, telemetry
        # the GPUs' memory, shared with other engines (engine/sharing.py); None: not ours
        self.runs_per_gpu = runs_per_gpu if runs_per_gpu is not None else table.get("runs_per_gpu", 1)
        self.sharing = Sharing.for_engine(self.runs_per_gpu, slots,
                                          getattr(backend, "name", "") == "local", ledger)
        self.tick, self.backoff = tick, backoff
        self.cancel_grace, self.stop_grace = cancel_grace, stop_grace
        self.telemetry_every, self.processes_every = telemetry_every, processes_every
        self.active: dict[str, Active] = {}
        self.stopping = self.started = False
        self._next_sample = self._next_processes = self._next_heartbeat = self._next_foreground = 0.0
        # a full disk: launch nothing, keep the endings that could not be recorded
        self.space = DiskSpace(self.root, announce=announce, retry_every=space_retry,
                               margin=space_margin)
        self.deferred: list[Exited] = []
        self._cut_short = False  # a wait for space just ended: look for launches it cut short
        self._next_record_try = 0.0
        self.searches = Searches(self.store)  # a search's rung decisions (engine/search.py)

    # ---- the loop -------------------------------------------------------------

    def start(self) -> None:
        self.backend.start()
        self.adopt_cluster()  # a Ray cluster's GPUs: every node's telemetry and ledger
        if self.sharing:
            self.sharing.learn_from(self.store.list_runs())  # what each shape measured so far
        self.recover()
        self.sample_telemetry()  # the GPUs' sizes and who else is there, before any launch
        self.searches.update()  # decisions an engine killed mid-search had not carried out
        self.started = True
        self.heartbeat()
        if self.stopping:  # asked to stop while the backend was starting: stop what was adopted
            self._stop_active()

    def run(self, *, until_idle: bool = False) -> None:
        """Until `request_stop()`; then running runs checkpoint and return to the queue.
        `until_idle`: also stop once nothing is queued or running (a whole queue run
        inside one SLURM allocation ends with it)."""
        if not self.started:
            self.start()
        while not (self.stopping and not self.active):
            self.step()
            if until_idle and not self.stopping and self.idle():
                log.info("nothing queued or running: stopping (--until-idle)")
                self.request_stop()
        for key in (CPU_CAP, SLOTS_WAIT, FOREIGN, packing.STATE, NVML):
            self._say(key, None)
        if self.sharing:
            self.sharing.close()
        self.backend.close()

    def request_stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        self._stop_active()

    def _stop_active(self) -> None:
        log.info("stopping: %d running runs checkpoint and return to the queue", len(self.active))
        for act in self.active.values():
            self.backend.cancel(act.handle, self.stop_grace)

    def step(self, timeout: float | None = None) -> None:
        if self.space.waiting:
            if not self.space.ready(self._probe_store):
                self._wait_for_space(timeout)
                return
            self._cut_short = True
        try:
            if self._cut_short:
                self._requeue_cut_short()
            kept, self.deferred = self.deferred, []
            self._record(kept)  # endings kept while the disk was full
            if not self.stopping:
                self.apply_intents()
                self.launch_ready()
            ended = self.backend.poll(self.tick if timeout is None else timeout)
            self._record(ended)
            if self.sharing:  # what ended commits nothing any more: less is safe unlocked
                self.sharing.publish(self.active)
            self.searches.update(ended=bool(ended or kept))
            self.record_placements()
            self.sample_telemetry()
            self.heartbeat()
            self.watch_foreground()
        except Exception as e:
            if not space.is_no_space(e):
                raise
            self.space.enter(e)  # a write of the store's failed for want of space

    def _wait_for_space(self, timeout: float | None) -> None:
        """A step while the disk is full: runs still going may end (their endings are
        kept), nothing is launched and nothing is written but the wait's own beat."""
        events = self.backend.poll(self.tick if timeout is None else timeout)
        self.deferred += events
        now = time.monotonic()
        if self.deferred and now >= self._next_record_try:
            # the store may take these small writes before the disk has room for runs
            self._next_record_try = now + self.space.retry_every
            kept, self.deferred = self.deferred, []
            self._record(kept)
        self.space.beat(paused=[e.handle.run_id for e in self.deferred])
        if self.stopping:
            # nothing can record them now: the next engine start finds their processes
            # gone and queues them again (as after an engine that was killed)
            for event in self.deferred:
                self.active.pop(event.handle.run_id, None)
            self.deferred = []

    def _probe_store(self) -> None:
        self.store.set_state(HEARTBEAT, {"pid": os.getpid(), "t": time.time()})

    def _requeue_cut_short(self) -> None:
        """After a wait for space: a run the store says runs here but that has no process
        (its launch was cut short by the full disk) goes back to the queue."""
        for run in self.store.list_runs(status=states.RUNNING):
            if run.slot != FOREGROUND and run.id not in self.active:
                self._requeue(run, "its launch was cut short by a full disk; resumes from its "
                                   "checkpoint")
        self._cut_short = False

    def record_placements(self) -> None:
        """A backend that places runs elsewhere (SLURM: job id, node, state) says where;
        the store keeps it for `gridrun ls` and the run's detail."""
        placements = getattr(self.backend, "placements", None)
        if placements is None:
            return
        try:
            for run_id, where in placements().items():
                self.store.set_placement(run_id, where)
        except Exception as e:  # a busy store is no reason to stop (a full disk: the wait)
            if space.is_no_space(e):
                raise
            log.warning("could not record where runs execute: %s", e)

    def heartbeat(self) -> None:
        """Say "alive" in the store (daemon.status reads it): a frozen engine stops saying it."""
        now = time.monotonic()
        if now < self._next_heartbeat:
            return
        self._next_heartbeat = now + HEARTBEAT_EVERY
        try:
            self.store.set_state(HEARTBEAT, {"pid": os.getpid(), "t": time.time()})
        except Exception as e:  # a busy store is no reason to stop (a full disk: the wait)
            if space.is_no_space(e):
                raise
            log.warning("could not write the heartbeat: %s", e)

    def idle(self) -> bool:
        return not self.active and not self.store.next_queued(1, now=float("inf"))

    # ---- recovery ---------------------------------------------------------------

    def recover(self) -> None:
        """Adopt runs whose process still runs; queue again those whose process is
        gone, unless a cancel was asked while no engine ran: then they are cancelled."""
        cancels = {i.run_id: i for i in self.store.intents(pending=True, limit=1_000_000)
                   if i.kind == "cancel"}
        for run in self.store.list_runs(status=states.RUNNING):
            if run.slot == FOREGROUND:  # alive: list_runs returned the gone ones to the queue
                continue
            slot = placement.recovered(self.slots, self._used(), run.slot, self.slots_wanted(run))
            try:
                handle = self.backend.reattach(run.id, run.run_dir(self.root), run.pid,
                                               run.pid_start_time, slot)
            except Exception as e:  # e.g. its folder is no folder any more
                log.warning("could not look for the process of %s: %s", run.id, e)
                handle = None
            if handle is None:
                if run.id in cancels:
                    self._end(run, states.CANCELLED, ended_at=time.time(), pid=None,
                              pid_start_time=None, note="cancelled while the engine was down")
                    self.store.mark_applied(cancels[run.id].id, "cancelled")
                else:
                    self._requeue(run, "interrupted: its process was gone when the engine restarted")
                continue
            self.active[run.id] = Active(run.id, handle, slot, run.started_at or time.time(),
                                         folder=folder_id(run.run_dir(self.root)),
                                         threads=self.cpu_threads(run, slot),
                                         commit=int((run.placement or {}).get("commit_bytes") or 0))
            self.store.transition(run.id, states.RUNNING, states.RUNNING, pid=handle.pid,
                                  pid_start_time=handle.start_time,
                                  slot=slot.name if slot else run.slot,
                                  note="adopted after an engine restart")
            log.info("adopted %s (pid %d)", run.id, handle.pid)

    # ---- foreground runs -----------------------------------------------------------

    def watch_foreground(self) -> None:
        """Runs `gridrun train` trains in its own process are never launched,
        adopted or stopped here; one whose process is gone (SIGKILL, a closed
        terminal) goes back to the queue, as a run whose process died."""
        now = time.monotonic()
        if now < self._next_foreground:
            return
        self._next_foreground = now + FOREGROUND_EVERY
        try:
            self.store.end_gone_foreground()  # what every reader of the queue does (store_rows)
        except Exception as e:  # a busy store is no reason to stop (a full disk: the wait)
            if space.is_no_space(e):
                raise
            log.warning("could not look at foreground runs: %s", e)

    def _used(self) -> set[str]:
        """The plain slots active runs hold (each member of a gang)."""
        return {p.name for a in self.active.values() if a.slot for p in a.slot.parts}

    # ---- intents ----------------------------------------------------------------

    def apply_intents(self) -> None:
        for intent in self.store.intents(pending=True):
            outcome = "ignored"
            if intent.kind == "cancel":
                act = self.active.get(intent.run_id)
                if act is None:
                    # queued again meanwhile (its process died, or an engine restarted): it
                    # must not start after all
                    cancelled = self.store.transition(
                        intent.run_id, states.QUEUED, states.CANCELLED, ended_at=time.time(),
                        note="cancelled while queued")
                    outcome = "cancelled" if cancelled else "not running here"
                else:
                    act.cancelling = True
                    self.backend.cancel(act.handle, self.cancel_grace)
                    outcome = "stopping"
            self.store.mark_applied(intent.id, outcome)

    # ---- launching --------------------------------------------------------------

    def slots_wanted(self, run: Run) -> int:
        """The slots `run` takes at once (placement.devices_wanted)."""
        return placement.devices_wanted(run.config, getattr(self.backend, "name", ""))

    def cpu_threads(self, run: Run, slot: Slot | None) -> int:
        """The CPU threads `run` holds on `slot` (placement.threads_held; 0 without the budget)."""
        local = self.thread_budget and getattr(self.backend, "name", "") == "local"
        packed = bool(self.sharing and self.sharing.book.auto)  # GPU runs count too
        return placement.threads_held(run.config, slot, self.cores, packed) if local else 0

    def _say(self, key: str, value: dict[str, Any] | None) -> None:
        """Keep CPU_CAP, SLOTS_WAIT, FOREIGN, packing.STATE current for `engine status`
        (written when they change; FOREIGN is logged as it is sampled)."""
        if key in self._said and self._said[key] == value:
            return
        if value is not None and not isinstance(self._said.get(key), dict):
            if key == CPU_CAP:
                log.info("threads cap CPU runs: %s needs %d threads, %d of %d usable cores "
                         "are taken", value["run_id"], value["threads"], value["holding"],
                         value["cores"])
            elif key == SLOTS_WAIT:
                log.info("%s waits for %d free %s (%d free); later runs wait behind it",
                         value["run_id"], value["devices"], value["unit"], value["free"])
        self._said[key] = value
        with contextlib.suppress(Exception):  # a busy store is no reason to stop
            self.store.set_state(key, value)

    def launch_ready(self) -> None:
        """Start what the placement gives (engine/placement.py: queue order, gangs of slots
        for runs on several devices, the threads budget), fail what can never start."""
        if self.store.paused:
            return
        self.sample_processes(time.monotonic())  # who else computes on the GPUs, first
        used = self._used()
        free = [s for s in self.slots if s.name not in used]
        if free and self.space.short_of_space() and self.store.next_queued(1):
            self.space.enter("too little space left to start a run")
            return
        queue = self.store.next_queued(max(1, len(free)))
        if self.sharing is None:
            self._carry_out(queue, *self._plan(queue, free, used, None))
            return
        foreign = self.others.memory()
        # read the ledger, decide, write what is about to start: the lock is held that long
        # only; the launches come after it
        with self.sharing.placing(self.active, foreign, bool(queue and free), self.others.runs) as rooms:
            plan, budgets = self._plan(queue, free, used, rooms)
            runs = {r.id: r for r in queue}
            if not self.sharing.reserve(self.active, plan, {
                    run_id: self.cpu_threads(runs[run_id], slot) for run_id, slot in plan.starts}):
                plan = self.sharing.hold(plan)  # fail closed: its state says why
        self._carry_out(queue, plan, budgets)
        self.sharing.publish(self.active)  # with the new runs' pids: theirs, not strangers'
        self._say(packing.STATE, self.sharing.state(self.active, rooms, foreign, plan.memory))

    def _plan(self, queue: list[Run], free: list[Slot], used: set[str],
              rooms: dict[Any, packing.Room] | None) -> tuple[placement.Plan, dict[str, Any]]:
        """What starts where (placement.plan) and each run's budget; `rooms`: each GPU's
        memory room (None: slots alone)."""
        budgets = {r.id: self.sharing.budget(r) for r in queue} if self.sharing and rooms else {}
        wants = [placement.Want(r.id, self.slots_wanted(r), self.cpu_threads(r, free[0]) if free
                                else 0, budgets.get(r.id, 0)) for r in queue]
        holding = [a.threads for a in self.active.values()]
        holding += self.sharing.others_threads(self.cores) if self.sharing else []  # other engines'
        plan = placement.plan(wants, self.slots, used, holding, self.cores,
                              avoid=self.others.avoid(), rooms=rooms)
        if plan.cap and self.sharing and (holders := self.sharing.thread_holders(self.cores)):
            plan.cap["others"] = holders  # who holds the threads, named in `engine status`
        return plan, budgets

    def _carry_out(self, queue: list[Run], plan: placement.Plan, budgets: dict[str, Any]) -> None:
        """Fail what can never start, start what the plan gives, say why the rest waits."""
        runs = {r.id: r for r in queue}
        for run_id, why in plan.refused:
            log.error("%s can never start here: %s", run_id, why)
            self.store.transition(run_id, states.QUEUED, states.FAILED, ended_at=time.time(),
                                  slot=None, error=why, note=why)
        for run_id, slot in plan.starts:
            if self.space.waiting:
                break
            commit = plan.commits.get(run_id, 0)
            # one that fails leaves its slots to the next step
            held = self.sharing.enforced(budgets.get(run_id), commit) if self.sharing else None
            self._start(runs[run_id], slot, commit, held)
        self._say(CPU_CAP, plan.cap)
        self._say(SLOTS_WAIT, plan.short)
        self._say(FOREIGN, self.others.state(plan.taken))

    def _start(self, run: Run, slot: Slot, commit: int = 0, budget: int | None = None) -> None:
        need = self.cpu_threads(run, slot)
        try:
            # never through a symlink, never into someone else's folder (layout.py)
            run_dir = layout.make_run_dir(self.root, run.experiment, run.id)
            # a process from an engine killed mid-launch may still run it: adopt, never double
            handle = self.backend.reattach(run.id, run_dir, None, None, slot)
        except Exception as e:
            self._not_started(run, states.QUEUED, e)
            return
        if handle is not None:
            if self.store.transition(run.id, states.QUEUED, states.RUNNING, slot=slot.name,
                                     pid=handle.pid, pid_start_time=handle.start_time,
                                     started_at=time.time(), note="adopted a running process"):
                self.active[run.id] = Active(run.id, handle, slot, time.time(),
                                             folder=folder_id(run_dir), threads=need, commit=commit)
            return
        self._launch(run, run_dir, dataclasses.replace(slot, budget=budget), need, commit)

    def _not_started(self, run: Run, expected: str, e: Exception) -> None:
        """One run that could not be prepared or launched fails with the reason; the
        engine goes on with the others. For want of space it waits in the queue instead
        (and the engine waits for space: a store write that fails raises from here)."""
        if space.is_no_space(e):
            log.warning("could not start %s: %s", run.id, e)
            self.space.enter(e)
            self.store.transition(run.id, expected, states.QUEUED, slot=None, pid=None,
                                  pid_start_time=None, started_at=None,
                                  note="waits for disk space: its folder could not be written")
            return
        if isinstance(e, (layout.UnsafePath, Refused)):
            why = str(e)
        elif isinstance(e, OSError) and e.strerror:
            why = f"its folder {run.run_dir(self.root)} could not be made or used: {e.strerror}"
        else:
            why = f"{type(e).__name__}: {e}"
        log.error("could not start %s: %s", run.id, why)
        self.store.transition(run.id, expected, states.FAILED, ended_at=time.time(), slot=None,
                              error=f"could not start: {why}", note="could not start")

    def _launch(self, run: Run, run_dir: Path, slot: Slot, threads: int = 0, commit: int = 0) -> None:
        now = time.time()
        if not self.store.transition(run.id, states.QUEUED, states.RUNNING, slot=slot.name,
                                     started_at=now, ended_at=None, pid=None, pid_start_time=None,
                                     note=f"started on {slot.name}"):
            return  # cancelled or taken meanwhile
        try:
            if run.fresh:
                # a forced re-run or an OOM retry starts over: an old checkpoint must not
                # be resumed if this attempt is interrupted before writing its own
                shutil.rmtree(run_dir / layout.CHECKPOINTS, ignore_errors=True)
                (run_dir / layout.SUMMARY).unlink(missing_ok=True)
            write_run_config(run_dir / layout.CONFIG, run.spec)
            folder = folder_id(run_dir)
            handle = self.backend.launch(run.id, run_dir, slot, fresh=run.fresh)
        except Exception as e:
            log.debug("could not launch %s", run.id, exc_info=True)
            self._not_started(run, states.RUNNING, e)
            return
        self.active[run.id] = Active(run.id, handle, slot, now, folder=folder, threads=threads,
                                     commit=commit)
        where = {"backend": self.backend.name, "budget_bytes": slot.budget, "commit_bytes": commit} \
            if commit else {}  # its memory budget, for `engine status` and the interface
        self.store.transition(run.id, states.RUNNING, states.RUNNING, pid=handle.pid,
                              pid_start_time=handle.start_time, fresh=False, **(
                                  {"placement": where} if where else {}))
        log.info("launched %s on %s (pid %d)", run.id, slot.name, handle.pid)
