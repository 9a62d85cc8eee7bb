"""How a run's end becomes its state: completed, cancelled, interrupted (back to
the queue), its process dead, or a rank of it (states.EXIT_RANK_DIED; resumed, failed
after MAX_RESTARTS), out of memory (retried once with half the micro-batch), diverged
or failed (retried `max_retries` times with backoff). The scheduler's half that reads a run's
summary and exit code; launching and intents stay in scheduler.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridrun.engine import packing
from gridrun.engine.backends.base import EXIT_ALREADY_RUNNING, Exited, Handle, Slot
from gridrun.engine.diskspace import DiskSpace
from gridrun.runs import layout, runlog, space, states
from gridrun.runs.outputlog import output_tail
from gridrun.runs.records import Summary
from gridrun.runs.store import FOREGROUND, Run, Store
from gridrun.spec import write_run_config

log = logging.getLogger("gridrun.engine")

MAX_RESTARTS = 3  # a run whose process keeps dying under it fails after this


def read_summary(run_dir: Path) -> Summary | None:
    """The run's summary.json through the one reader: garbage is None, wrong-typed fields dropped."""
    return runlog.read_summary(run_dir / layout.SUMMARY)


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
    threads: int = 0  # the CPU threads it computes with, on a CPU slot of this machine
    commit: int = 0  # bytes of GPU memory it commits on each GPU it holds (engine/sharing.py)


class Endings:
    """The endings half of `Engine` (scheduler.py): what it needs of the engine."""

    root: Path
    store: Store
    backend: Any
    active: dict[str, Active]
    stopping: bool
    backoff: float
    space: DiskSpace
    sharing: Any  # engine/sharing.py's Sharing, or None (no GPU of this machine)
    deferred: list[Exited]

    # ---- endings ----------------------------------------------------------------

    def _record(self, events: list[Exited]) -> None:
        """Record how runs ended. One that cannot be recorded for want of space is kept
        (with those after it) in `deferred`, its run still active, until there is space."""
        events = list(events)
        for i, event in enumerate(events):
            act = self.active.get(event.handle.run_id)
            try:
                try:
                    self.finished(event)
                except Exception as e:
                    if space.is_no_space(e):
                        raise
                    self._unrecorded(event, e)
            except Exception as e:
                if not space.is_no_space(e):
                    raise
                if act is not None:
                    self.active[event.handle.run_id] = act
                self.deferred += events[i:]
                self.space.enter(e)
                return

    def _unrecorded(self, event: Exited, e: Exception) -> None:
        """One run's ending never takes the engine down."""
        log.exception("could not record how %s ended", event.handle.run_id)
        self.active.pop(event.handle.run_id, None)
        self.store.transition(event.handle.run_id, states.RUNNING, states.FAILED,
                              ended_at=time.time(), slot=None, pid=None,
                              error=f"the engine could not record how it ended: "
                                    f"{type(e).__name__}: {e}", note="failed")

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
        if summary and self.sharing:  # what it measured serves its shape
            self.sharing.book.learn(run.config, summary.to_json())
        code = event.code
        if code is None and summary and (summary.ended_at or 0) >= (run.started_at or 0):
            code = states.EXIT_CODES.get(summary.status)  # an adopted run's own account
        if code == EXIT_ALREADY_RUNNING:
            handle = self.backend.reattach(run_id, run_dir, None, None, act.slot if act else None)
            if handle is not None:
                self.active[run_id] = Active(run_id, handle, act.slot if act else None, time.time(),
                                             threads=act.threads if act else 0,
                                             commit=act.commit if act else 0)
                self.store.transition(run_id, states.RUNNING, states.RUNNING, pid=handle.pid,
                                      pid_start_time=handle.start_time, note="adopted a running process")
                return
        cancelling = act is not None and act.cancelling
        status = states.STATUS_OF_EXIT.get(code) if code is not None and code >= 0 else None
        now = time.time()
        common = {"ended_at": now, "summary": summary and summary.to_json(), "pid": None, "pid_start_time": None}
        requeue = status == states.INTERRUPTED or (status is None and self.stopping)
        gone = None if cancelling or requeue else self._folder_gone(run_dir, act)
        paused = None if cancelling or gone else self._paused_for_space(run, code, status, summary)
        if paused:
            self._requeue(run, paused)  # never failed, never a restart spent: it waits for space
            self.space.enter_if_short(f"{run.id} could not write: {paused}")
        elif gone:
            # its metrics went with the folder: never "completed" with nothing to show;
            # a retry starts over (fresh) rather than resume from a stray checkpoint
            self._end(run, states.FAILED, error=gone, note="its folder disappeared", fresh=True,
                      **common)
        elif status == states.COMPLETED:
            self._end(run, states.COMPLETED, note="completed", **common)
        elif status == states.WAITING:  # a search's trial at its rung (engine/search.py decides)
            self._end(run, states.WAITING, note=f"waiting at epoch {(summary or Summary()).epoch} "
                      "for its rung's decision", **common)
        elif cancelling and status in (states.INTERRUPTED, None):
            self._end(run, states.CANCELLED, note="cancelled while running", **common)
        elif status == states.INTERRUPTED or (status is None and self.stopping):
            self._requeue(run, "interrupted: returned to the queue; resumes from its checkpoint")
        elif status is None:
            why = "a rank of the run died" if code == states.EXIT_RANK_DIED else \
                "its process died" + (f" (signal {-code})" if code is not None and code < 0 else "")
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

    def _paused_for_space(self, run: Run, code: int | None, status: str | None,
                          summary: Summary | None) -> str | None:
        """The note of a run that stopped for want of space (it exited so, or it failed or
        died while the disk is full), or None."""
        if status in (states.COMPLETED, states.WAITING, states.DIVERGED, states.OOM) or (
                status == states.INTERRUPTED and code != states.EXIT_NO_SPACE):
            return None
        own = summary if summary and (summary.ended_at or 0) >= (run.started_at or 0) else None
        said = own.error if own and space.mentions_no_space(own.error) else None
        if code != states.EXIT_NO_SPACE and not said and not self.space.waiting \
                and not space.nearly_full(run.run_dir(self.root)):
            return None
        if said and said.startswith("paused"):
            return said
        return ("paused: the disk is full (" + (said or "no space left on the device")
                + "); resumes from its last good checkpoint once there is space")

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
        if summary and summary.memory_needed_bytes and not (
                self.sharing and self.sharing.book.whole(summary.memory_budget_bytes)):
            self._over_budget(run, summary, common)  # it outgrew its budget: it alone failed
            return  # (held to a whole GPU, it is out of memory: a smaller batch, below)
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

    def _over_budget(self, run: Run, s: Summary, common: dict) -> None:
        """A run that outgrew its memory budget is retried once with a budget from the need
        it measured (packing.retry_budget); it resumes from its checkpoint: a budget never
        changes its bits. Twice over: out of memory, with what to give it."""
        need, had = int(s.memory_needed_bytes or 0), s.memory_budget_bytes
        new = packing.retry_budget(need)
        new = self.sharing.book.capped(new) if self.sharing else new
        if any(a.get("kind") == "budget" for a in run.adjustments):
            self._end(run, states.OOM, error=s.error, note=(
                f"over its memory budget again: it needed {packing.gib(need)} with "
                f"{packing.gib(had)}; give it gpu_memory = {new / packing.GIB:.1f} (GiB) in the "
                "file, or a smaller batch_size"), **common)
            return
        change = {"kind": "budget", "t": time.time(), "budget_bytes": [had, new]}
        self._requeue(run, f"over its memory budget ({packing.gib(need)} needed, {packing.gib(had)} "
                           f"given): retried once with {packing.gib(new)}, from its checkpoint",
                      adjustments=[*run.adjustments, change])
