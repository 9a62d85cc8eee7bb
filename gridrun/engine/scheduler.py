"""The engine loop: give queued runs to free slots, watch them end, apply what
clients asked for, sample telemetry, and after a restart adopt what still runs.

One thread, one loop: `Engine.step()` applies intents, launches onto free
slots, waits (up to a tick) for runs to end and records how they ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridrun.engine.backends import child
from gridrun.engine.backends.base import EXIT_ALREADY_RUNNING, Backend, Exited, Handle, Slot
from gridrun.runs import layout, outputlog, runlog, states
from gridrun.runs.records import Summary
from gridrun.runs.store import FOREGROUND, Run, Store
from gridrun.spec import write_run_config

log = logging.getLogger("gridrun.engine")

MAX_RESTARTS = 3  # a run whose process keeps dying under it fails after this
HEARTBEAT = "engine_heartbeat"  # store state: {"pid", "t"}, written every HEARTBEAT_EVERY s
HEARTBEAT_EVERY = 1.0
FOREGROUND_EVERY = 2.0  # how often the engine looks whether foreground runs' processes live
OUTPUT_TAIL_LINES = 30


def output_tail(run_dir: Path, lines: int = OUTPUT_TAIL_LINES) -> str:
    """The last lines a run printed, for its error (read from the end: a big log costs nothing)."""
    try:
        return outputlog.tail_lines(run_dir / layout.OUTPUT, lines).rstrip("\n")
    except OSError:
        return ""


def read_summary(run_dir: Path) -> Summary | None:
    """The run's summary.json through the one reader: garbage is None, wrong-typed fields dropped."""
    return runlog.read_summary(run_dir / layout.SUMMARY)


def foreground_alive(run: Run, root: Path) -> bool:
    """Whether the `gridrun train` process of a foreground run still runs: its pid
    is still that process, or someone holds the run's lock (a process elsewhere on
    a shared root). The engine and the next `gridrun train` ask the same question."""
    if run.pid and child.alive(run.pid, run.pid_start_time) is not None:
        return True
    try:
        return child.lock_holder(run.run_dir(root)) is not None
    except OSError:
        return False


def folder_id(path: Path) -> tuple[int, int] | None:
    """Which folder `path` is (device, inode), or None if there is none."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@dataclass
class Active:
    run_id: str
    handle: Handle
    slot: Slot | None
    started_at: float
    cancelling: bool = False
    folder: tuple[int, int] | None = None  # the run folder it was given (folder_id)


class Engine:
    def __init__(self, root: str | Path, backend: Backend, slots: list[Slot], *,
                 store: Store | None = None, telemetry: Any = None, tick: float = 0.25,
                 backoff: float = 10.0, cancel_grace: float = 30.0, stop_grace: float = 120.0,
                 telemetry_every: float = 1.0, processes_every: float = 5.0):
        self.root = Path(root)
        self.store = store or Store(root)
        self.backend, self.slots, self.telemetry = backend, slots, telemetry
        self.tick, self.backoff = tick, backoff
        self.cancel_grace, self.stop_grace = cancel_grace, stop_grace
        self.telemetry_every, self.processes_every = telemetry_every, processes_every
        self.active: dict[str, Active] = {}
        self.stopping = self.started = False
        self._next_sample = 0.0
        self._next_processes = 0.0
        self._next_heartbeat = 0.0
        self._next_foreground = 0.0
        self._processes: list = []

    # ---- the loop -------------------------------------------------------------

    def start(self) -> None:
        self.backend.start()
        self.recover()
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
        if not self.stopping:
            self.apply_intents()
            self.launch_ready()
        for event in self.backend.poll(self.tick if timeout is None else timeout):
            try:
                self.finished(event)
            except Exception as e:  # one run's ending never takes the engine down
                log.exception("could not record how %s ended", event.handle.run_id)
                self.active.pop(event.handle.run_id, None)
                self.store.transition(event.handle.run_id, states.RUNNING, states.FAILED,
                                      ended_at=time.time(), slot=None, pid=None,
                                      error=f"the engine could not record how it ended: "
                                            f"{type(e).__name__}: {e}", note="failed")
        self.record_placements()
        self.sample_telemetry()
        self.heartbeat()
        self.watch_foreground()

    def record_placements(self) -> None:
        """A backend that places runs elsewhere (SLURM: job id, node, state) says where;
        the store keeps it for `gridrun ls` and the run's detail."""
        placements = getattr(self.backend, "placements", None)
        if placements is None:
            return
        try:
            for run_id, where in placements().items():
                self.store.set_placement(run_id, where)
        except Exception as e:  # a busy store is no reason to stop
            log.warning("could not record where runs execute: %s", e)

    def heartbeat(self) -> None:
        """Say "alive" in the store (daemon.status reads it): a frozen engine stops saying it."""
        now = time.monotonic()
        if now < self._next_heartbeat:
            return
        self._next_heartbeat = now + HEARTBEAT_EVERY
        try:
            self.store.set_state(HEARTBEAT, {"pid": os.getpid(), "t": time.time()})
        except Exception as e:  # a busy store is no reason to stop
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
            if run.slot == FOREGROUND:
                self._check_foreground(run)
                continue
            slot = self._free_slot(prefer=run.slot)
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
                                         folder=folder_id(run.run_dir(self.root)))
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
            for run in self.store.list_runs(status=states.RUNNING):
                if run.slot == FOREGROUND:
                    self._check_foreground(run)
        except Exception as e:  # a busy store is no reason to stop
            log.warning("could not look at foreground runs: %s", e)

    def _check_foreground(self, run: Run) -> None:
        if foreground_alive(run, self.root):
            return
        note = (f"interrupted: its foreground process (pid {run.pid}) was gone; "
                "returned to the queue, resumes from its checkpoint")
        if self.store.end_foreground(run.id, run.pid, states.QUEUED, note=note):
            log.info("%s %s", run.id, note)

    def _free_slot(self, prefer: str | None = None) -> Slot | None:
        used = {a.slot.name for a in self.active.values() if a.slot}
        free = [s for s in self.slots if s.name not in used]
        return next((s for s in free if s.name == prefer), free[0] if free else None)

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

    def launch_ready(self) -> None:
        if self.store.paused:
            return
        free = self._free_slots()
        if not free:
            return
        for run in self.store.next_queued(len(free)):
            slot = free[0]
            try:
                # never through a symlink, never into someone else's folder (layout.py)
                run_dir = layout.make_run_dir(self.root, run.experiment, run.id)
                # a process from an engine killed mid-launch may still run it: adopt, never double
                handle = self.backend.reattach(run.id, run_dir, None, None, slot)
            except Exception as e:
                self._not_started(run, states.QUEUED, e)
                continue  # the slot stays free for the next run
            free.pop(0)
            if handle is not None:
                if self.store.transition(run.id, states.QUEUED, states.RUNNING, slot=slot.name,
                                         pid=handle.pid, pid_start_time=handle.start_time,
                                         started_at=time.time(), note="adopted a running process"):
                    self.active[run.id] = Active(run.id, handle, slot, time.time(),
                                                 folder=folder_id(run_dir))
                continue
            self._launch(run, run_dir, slot)

    def _not_started(self, run: Run, expected: str, e: Exception) -> None:
        """One run that could not be prepared or launched fails with the reason; the
        engine goes on with the others."""
        if isinstance(e, layout.UnsafePath):
            why = str(e)
        elif isinstance(e, OSError) and e.strerror:
            why = f"its folder {run.run_dir(self.root)} could not be made or used: {e.strerror}"
        else:
            why = f"{type(e).__name__}: {e}"
        log.error("could not start %s: %s", run.id, why)
        self.store.transition(run.id, expected, states.FAILED, ended_at=time.time(), slot=None,
                              error=f"could not start: {why}", note="could not start")

    def _free_slots(self) -> list[Slot]:
        used = {a.slot.name for a in self.active.values() if a.slot}
        return [s for s in self.slots if s.name not in used]

    def _launch(self, run: Run, run_dir: Path, slot: Slot) -> None:
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
        self.active[run.id] = Active(run.id, handle, slot, now, folder=folder)
        self.store.transition(run.id, states.RUNNING, states.RUNNING, pid=handle.pid,
                              pid_start_time=handle.start_time, fresh=False)
        log.info("launched %s on %s (pid %d)", run.id, slot.name, handle.pid)

    # ---- endings ----------------------------------------------------------------

    def finished(self, event: Exited) -> None:
        act = self.active.pop(event.handle.run_id, None)
        run_id = event.handle.run_id
        try:
            run = self.store.list_runs(ids=[run_id])[0]
        except IndexError:
            return
        if act is None and run.slot == FOREGROUND:
            return  # a `gridrun train` process seen through its lock at a launch: not ours
        run_dir = run.run_dir(self.root)
        summary = read_summary(run_dir)
        code = event.code
        if code is None and summary and (summary.ended_at or 0) >= (run.started_at or 0):
            code = states.EXIT_CODES.get(summary.status)  # an adopted run's own account
        if code == EXIT_ALREADY_RUNNING:
            handle = self.backend.reattach(run_id, run_dir, None, None, act.slot if act else None)
            if handle is not None:
                self.active[run_id] = Active(run_id, handle, act.slot if act else None, time.time())
                self.store.transition(run_id, states.RUNNING, states.RUNNING, pid=handle.pid,
                                      pid_start_time=handle.start_time, note="adopted a running process")
                return
        cancelling = act is not None and act.cancelling
        status = states.STATUS_OF_EXIT.get(code) if code is not None and code >= 0 else None
        now = time.time()
        common = {"ended_at": now, "summary": summary and summary.to_json(), "pid": None, "pid_start_time": None}
        requeue = status == states.INTERRUPTED or (status is None and self.stopping)
        gone = None if cancelling or requeue else self._folder_gone(run_dir, act)
        if gone:
            # its metrics went with the folder: never "completed" with nothing to show;
            # a retry starts over (fresh) rather than resume from a stray checkpoint
            self._end(run, states.FAILED, error=gone, note="its folder disappeared", fresh=True,
                      **common)
        elif status == states.COMPLETED:
            self._end(run, states.COMPLETED, note="completed", **common)
        elif cancelling and status in (states.INTERRUPTED, None):
            self._end(run, states.CANCELLED, note="cancelled while running", **common)
        elif status == states.INTERRUPTED or (status is None and self.stopping):
            self._requeue(run, "interrupted: returned to the queue; resumes from its checkpoint")
        elif status is None:
            why = "its process died" + (f" (signal {-code})" if code is not None and code < 0 else "")
            if run.restarts + 1 > MAX_RESTARTS:
                self._end(run, states.FAILED, note=why, error=why + f" {run.restarts + 1} times\n\n"
                          + output_tail(run_dir), **common)
            else:
                self._requeue(run, f"{why}; resumes from its checkpoint", restarts=run.restarts + 1)
        elif status == states.OOM:
            self._oom(run, summary, common)
        elif status == states.DIVERGED:
            step = (summary or Summary()).diverged_step
            self._end(run, states.DIVERGED, note=f"diverged at step {step}",
                      error=(summary or Summary()).error, **common)
        else:
            self._failed(run, code, summary, common)

    def _folder_gone(self, run_dir: Path, act: Active | None) -> str | None:
        now = folder_id(run_dir)
        if now is not None and (act is None or act.folder in (None, now)):
            return None
        how = "deleted" if now is None else "deleted and made again, or replaced"
        return (f"its folder {run_dir} disappeared while it ran ({how}): its metrics and "
                "checkpoints are gone; `gridrun retry` runs it again from the start")

    def _end(self, run: Run, status: str, **fields: Any) -> None:
        self.store.transition(run.id, states.RUNNING, status, slot=None, **fields)
        log.info("%s %s", run.id, status)

    def _requeue(self, run: Run, note: str, **fields: Any) -> None:
        self.store.transition(run.id, states.RUNNING, states.QUEUED, slot=None, pid=None,
                              pid_start_time=None, note=note, **fields)
        log.info("%s %s", run.id, note)

    def _failed(self, run: Run, code: int, summary: Summary | None, common: dict) -> None:
        s = summary or Summary()
        error = "\n".join(x for x in (s.error or f"exit code {code}", s.traceback)
                          if x)
        tail = output_tail(run.run_dir(self.root))
        error += "\n\n--- last lines of output.log ---\n" + tail if tail else ""
        max_retries = int(run.config.get("trainer", {}).get("max_retries", 0))
        if run.retries < max_retries:
            delay = self.backoff * 2 ** run.retries
            self._requeue(run, f"failed; retry {run.retries + 1} of {max_retries} in {delay:.0f} s",
                          retries=run.retries + 1, not_before=time.time() + delay, error=error)
        else:
            self._end(run, states.FAILED, error=error, note="failed", **common)

    def _oom(self, run: Run, summary: Summary | None, common: dict) -> None:
        trainer = run.config["trainer"]
        batch, acc = int(trainer["batch_size"]), int(trainer["accumulate"])
        if batch < 2 or any(a.get("kind") == "oom" for a in run.adjustments):
            self._end(run, states.OOM, error=(summary or Summary()).error,
                      note="out of memory" + (" again after halving the batch" if batch >= 2 else ""),
                      **common)
            return
        spec = run.spec.with_trainer(batch_size=batch // 2, accumulate=acc * 2)
        change = {"kind": "oom", "t": time.time(), "batch_size": [batch, batch // 2],
                  "accumulate": [acc, acc * 2]}
        with contextlib.suppress(Exception):  # the launch writes it again in any case
            write_run_config(run.run_dir(self.root) / layout.CONFIG, spec)
        self._requeue(run, f"out of memory: retrying with batch_size {batch // 2} and "
                           f"accumulate {acc * 2} (same effective batch)",
                      config=spec.to_dict(), adjustments=[*run.adjustments, change], fresh=True)

    # ---- telemetry --------------------------------------------------------------

    def sample_telemetry(self) -> None:
        if self.telemetry is None:
            return
        now = time.monotonic()
        if now < self._next_sample:
            return
        self._next_sample = now + self.telemetry_every
        with contextlib.suppress(Exception):
            sample = self.telemetry.sample()
            sample = sample.to_dict() if hasattr(sample, "to_dict") else dict(sample)
            if now >= self._next_processes:
                self._next_processes = now + self.processes_every
                by_pid = {a.handle.pid: a.run_id for a in self.active.values()}
                self._processes = [{"pid": pid, "gpu": gpu, "run_id": by_pid.get(pid)}
                                   for pid, gpu in self.telemetry.processes().items()]
            sample["processes"] = self._processes
            self.store.record_telemetry(sample, t=sample.get("t"))
