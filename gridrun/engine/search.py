"""The engine's half of a search: the rung results of its waiting trials kept in the
store, the rule (promotion.py) applied to them, its decisions kept, then carried
out: a promoted trial goes back to the queue to train on to its next rung (from
its own checkpoint), a stopped one ends `stopped`.

Every decision comes from the store's results alone and is written before it is
carried out, so an engine killed at any point takes, on its restart, the same
decisions and carries out those it had not; the backends (local, Ray, SLURM)
only run trials and never decide.

A stop is the store's transition, then the trial's summary.json (which the worker
left saying `waiting`) rewritten to say `stopped`, so that the folder, `load_run`
and a store rebuilt from the folders agree with the store. An engine that dies
between the two, or a write that fails (a full disk), is healed by the next pass:
an engine's first look at a search reads the summaries of its stopped trials once,
and a write that failed is tried again each pass until it succeeds. A promoted
trial's summary.json keeps saying `waiting` at its rung until its next stretch
ends and the worker writes it again: it records where the trial last paused, and
a store rebuilt meanwhile decides that rung again from it.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gridrun.engine import promotion
from gridrun.runs import records, runlog, states
from gridrun.runs.layout import UnsafePath
from gridrun.runs.store import Run, Store
from gridrun.runs.store_search import RungResult
from gridrun.spec.search import bracket_of, rungs

log = logging.getLogger("gridrun.engine")

ENDED = (states.FAILED, states.DIVERGED, states.OOM, states.CANCELLED)
EVERY = 2.0  # seconds: a look at the searches even when no run ended (a retry, a cancel)


SCHEDULER = "asha"


def scheduled(run: Run) -> dict[str, Any] | None:
    """The search settings of a run that is a trial under a scheduler, else None."""
    search = run.config.get("search")
    if isinstance(search, dict) and search.get("scheduler") == SCHEDULER \
            and isinstance(run.config.get("trial"), int):
        return search
    return None


def rung_value(value: Any) -> float | None:
    """A logged metric as a rung result: a finite number, else None (no result)."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def result_of(run: Run, metric: str) -> RungResult | None:
    """What a trial's run scored where it stands: at the epoch it waits at or ended at
    (completed), or nothing (None) where it ended without a result."""
    trial, summary = run.config["trial"], run.summary or {}
    epoch = summary.get("epoch")
    if run.status in (states.WAITING, states.COMPLETED) and isinstance(epoch, int):
        return RungResult(run.id, trial, epoch, rung_value((summary.get("final") or {}).get(metric)))
    if run.status in ENDED:
        epoch = run.config.get("pause_at") or run.config["trainer"]["epochs"]
        return RungResult(run.id, trial, epoch, None)
    return None


def trial_results(runs: Iterable[Run], kept: Iterable[RungResult]) -> dict[tuple[int, int], float | None]:
    """(trial, epoch) -> the mean over the trial's runs (its seeds), where every run of
    the trial has a result there; None where one of them has none."""
    ids: dict[int, set[str]] = defaultdict(set)
    for run in runs:
        ids[run.config["trial"]].add(run.id)
    at: dict[tuple[int, int], dict[str, float | None]] = defaultdict(dict)
    for r in kept:
        at[(r.trial, r.epoch)][r.run_id] = r.value
    out: dict[tuple[int, int], float | None] = {}
    for (trial, epoch), values in at.items():
        if not ids[trial] or set(values) != ids[trial]:
            continue
        got = list(values.values())
        out[(trial, epoch)] = None if None in got else sum(got) / len(got)  # type: ignore[arg-type]
    return out


def mode_of(search: dict[str, Any], runs: Iterable[Run]) -> str:
    """min or max: as the file says, else the direction the task declares for the metric."""
    if search.get("mode") in ("min", "max"):
        return search["mode"]
    declared: dict[str, str] = {}
    for run in runs:
        declared.update((run.summary or {}).get("metrics") or {})
    return "min" if records.direction(search["metric"], declared) == records.LOWER else "max"


def decisions_of(search: dict[str, Any], runs: list[Run],
                 kept: list[RungResult]) -> list[promotion.Decision]:
    """Every decision the rule takes on these results, bracket by bracket."""
    results = trial_results(runs, kept)
    mode = mode_of(search, runs)
    trials = sorted({r.config["trial"] for r in runs})
    out = []
    brackets = search.get("brackets", 1)
    for b in range(brackets):
        mine = [t for t in trials if bracket_of(t, brackets) == b]
        steps = rungs(search["min_epochs"], search["max_epochs"], search["eta"], b)
        out += promotion.decide(mine, steps, results, mode, search["eta"])
    return out


class Searches:
    """Applies the rule to every search with a waiting trial; the scheduler calls
    `update()` after recording how runs ended."""

    def __init__(self, store: Store):
        self.store = store
        self._known: set[str] = set()
        self._next = 0.0
        self._checked: set[str] = set()  # searches whose stopped trials' summaries were read
        self._unwritten: dict[str, Path] = {}  # stopped runs whose summary.json is to say so
        self._said: set[str] = set()  # those whose failed rewrite was logged

    def update(self, *, ended: bool = True) -> int:
        """Decide and carry out what can be; how many runs it moved. Without `ended`
        (no run ended this step) it looks only every EVERY seconds."""
        now = time.monotonic()
        if not ended and now < self._next:
            return 0
        self._next = now + EVERY
        by_search: dict[str, list[Run]] = defaultdict(list)
        # only configs that name the scheduler are parsed: a store of many grid runs costs
        # one scan in SQLite, not a JSON parse per run, each time a run ends
        for run in self.store.list_runs(config_has=f'"{SCHEDULER}"'):
            search = scheduled(run)
            if search is not None:
                by_search[search["id"]].append(run)
        moved = 0
        for search_id, runs in by_search.items():
            if search_id not in self._checked:  # stopped by an engine that died before rewriting
                self._checked.add(search_id)
                self._unwritten.update({r.id: r.run_dir(self.store.root) for r in runs
                                        if r.status == states.STOPPED})
            if any(r.status == states.WAITING for r in runs):
                moved += self._one(search_id, runs)
            elif ended:  # the last rung's results, for the views (nothing left to decide)
                metric = (scheduled(runs[0]) or {})["metric"]
                self.store.record_results(search_id, [r for r in (result_of(run, metric)
                                                                  for run in runs) if r])
        self._restate()
        return moved

    def _restate(self, only: str | None = None) -> None:
        """Each stopped run's summary.json (or `only` that one's) says `stopped`: the store
        says so first. One that cannot be written now (a full disk) is tried again at the
        next pass; one that is a link is never read nor written through. Each said once."""
        for run_id, folder in list(self._unwritten.items()):
            if only is not None and run_id != only:
                continue
            try:
                runlog.restate_summary(folder, states.STOPPED)
            except UnsafePath as e:
                log.warning("%s: its summary.json is left as it is: %s", run_id, e)
            except OSError as e:
                if run_id not in self._said:
                    self._said.add(run_id)
                    log.warning("%s: its summary.json does not say stopped yet (%s); tried "
                                "again at each pass", run_id, e.strerror or e)
                continue
            del self._unwritten[run_id]
            self._said.discard(run_id)

    def _one(self, search_id: str, runs: list[Run]) -> int:
        search = scheduled(runs[0]) or {}
        if search_id not in self._known:
            self.store.add_search(search_id, runs[0].experiment, search)
            self._known.add(search_id)
        found = [r for r in (result_of(run, search["metric"]) for run in runs) if r is not None]
        self.store.record_results(search_id, found)
        decided = decisions_of(search, runs, self.store.search_results(search_id))
        self.store.record_decisions(search_id, decided)
        return self._carry_out(search, runs, self.store.search_decisions(search_id))

    def _carry_out(self, search: dict[str, Any], runs: list[Run], decided: Iterable[Any]) -> int:
        """Promote or stop the trials still waiting where a decision was taken."""
        waiting: dict[tuple[int, int], list[Run]] = defaultdict(list)
        for run in runs:
            if run.status == states.WAITING:
                waiting[(run.config["trial"], (run.summary or {}).get("epoch"))].append(run)
        moved = 0
        for d in decided:
            for run in waiting.get((d.trial, d.epoch), []):
                steps = rungs(search["min_epochs"], search["max_epochs"], search["eta"],
                              bracket_of(d.trial, search.get("brackets", 1)))
                k = steps.index(d.epoch) if d.epoch in steps else 0
                if d.kind == promotion.PROMOTE:
                    after = steps[min(k + 1, len(steps) - 1)]
                    spec = run.spec.paused_at(after if after < search["max_epochs"] else None)
                    ok = self.store.transition(
                        run.id, states.WAITING, states.QUEUED, config=spec.to_dict(),
                        ended_at=None, note=f"promoted at rung {k} (epoch {d.epoch}, {d.reason}); "
                                            f"trains on to epoch {after}")
                else:  # the store's copy of the summary says stopped with it (exports read it)
                    summary = {**run.summary, "status": states.STOPPED} if run.summary else None
                    ok = self.store.transition(
                        run.id, states.WAITING, states.STOPPED, ended_at=time.time(),
                        note=f"stopped at rung {k} (epoch {d.epoch}): {d.reason}",
                        **({"summary": summary} if summary else {}))
                    if ok:  # then the folder's: the next pass heals a death in between
                        self._unwritten[run.id] = run.run_dir(self.store.root)
                        self._restate(run.id)
                if ok:
                    moved += 1
                    log.info("%s trial %d %s at epoch %d", run.id, d.trial,
                             "promoted" if d.kind == promotion.PROMOTE else "stopped", d.epoch)
        return moved
