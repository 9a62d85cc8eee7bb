"""`gridrun mirror mlflow`: a root's runs mirrored into MLflow, live, with MLflow's own client.

`Mirror` folds over the store's change feed (`read`: `changes_since`, never a walk
of the run folders) and sends, in `step`, what is new of the runs that changed and
of the running ones: a run MLflow has not seen yet becomes an MLflow run in the
experiment named after its own (found by its `gridrun.run_id` and `gridrun.root_id`
tags before one is made: the key is the run in its root, as two roots may hold the
same run id; a search's trials are children of one parent run per search and root,
which carries the leaderboard), then its params, its new metric points (log_batch),
its tags (one of ours it no longer has is deleted) and status, and its files when
they changed (records.py says what each is).

MLflow is the truth: before the first step, and again after any failure, one
search per experiment reads which runs of this root MLflow holds and the last step
of each of their metrics (`_reconcile`); where the cursor disagrees, that run's log
is read again from its start and only steps past MLflow's last are sent. Nothing is
sent twice, and metric points carry the line's own time, so a batch resent after a
lost answer is the same point again. A run sent before runs carried their root is
this root's only where this root's cursor names it (`mr.owned`); it is then tagged
with the root and its tags, status and files are sent again.

Failure is local: the mirror is its own process; a server that is down or fails
raises out of `step` (what was sent stays counted), `follow` says so in one line and
tries again with a bounded backoff, reading the server's state again first. A run
the server refuses (a 4xx answer) is said once and left until it changes.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridrun.analysis.mlflow import records as mr
from gridrun.analysis.mlflow.client import reason, refused
from gridrun.analysis.mlflow.cursor import Cursor, Mirrored, tail
from gridrun.runs import layout, runlog, states
from gridrun.runs.layout import UnsafePath

BACKOFF_CAP = 16.0  # seconds between tries while the server fails
SETTLE = 30  # steps an ended run's files are looked at again until its summary says its state
PAGE = 500  # runs a search answers: a few kB of JSON each, far under bounds.ANSWER_CAP


class _Skip(Exception):
    """A run left out of this step, said once (Mirror.refused)."""


@dataclass(frozen=True)
class Remote:
    """A run of this root MLflow holds: its id, the last step of each metric, its params'
    keys, its tags of mr.OURS, and whether it is tagged with no root (sent before runs
    carried theirs) or with an earlier id of this root (before a rebuild of its store)."""

    id: str
    steps: dict[str, int]
    params: frozenset[str]
    deleted: bool
    tags: frozenset[str] = frozenset()
    retag: bool = False

    @classmethod
    def of(cls, run: Any, root_id: str) -> Remote:
        # public: Run.to_proto() holds each metric's latest point, with its step
        return cls(run.info.run_id, {m.key: m.step for m in run.to_proto().data.metrics},
                   frozenset(run.data.params), run.info.lifecycle_stage == "deleted",
                   frozenset(k for k in run.data.tags if k.startswith(mr.OURS)),
                   run.data.tags.get(mr.ROOT_ID) != root_id)


class Mirror:
    """One root mirrored to one tracking server; `read` the store, then `step`."""

    def __init__(self, root: Path, client: Any, cursor: Cursor,
                 tell: Callable[[str], None], warn: Callable[[str], None]) -> None:
        self.root, self.client, self.cursor, self.tell, self.warn = root, client, cursor, tell, warn
        self.root_id = ""  # the store's (read first): an MLflow run is a run in its root
        self.mine: set[str] = set()  # the root ids whose MLflow runs are this root's
        self.rows: dict[str, Any] = {}
        self.seq = 0
        self.dirty: set[str] = set()
        self.remote: dict[str, Remote] | None = None  # None: read MLflow's state first
        self.experiments: dict[str, str] = {}
        self.refused: dict[str, str] = {}  # run or experiment -> why, said once
        self.boards: set[str] = set()  # searches whose leaderboard is to send
        self.first = True  # the first step looks at every ended run's files
        self.settling: dict[str, int] = {}  # ended runs whose summary.json is still to restate
        self.created = self.points = self.files = 0

    # ---- the store -----------------------------------------------------------------------

    def read(self, store: Any) -> None:
        if not self.root_id:
            self.root_id = store.root_id()
            self.mine = {self.root_id, *self.cursor.roots}
        changed, self.seq = store.changes_since(self.seq)
        for run in changed:
            self.rows[run.id] = run
            self.refused.pop(run.id, None)
            if self.cursor.runs.get(run.id, Mirrored()).seq != run.seq:
                self.dirty.add(run.id)

    def waiting(self) -> list[str]:
        """The runs with something still to send (ids)."""
        return [i for i, r in self.rows.items() if (i in self.dirty or r.status == states.RUNNING)
                and not self._is_refused(r) and not self._not_yet(r)]

    def mirrored(self) -> int:
        """How many runs of the store the mirror has something of (all but those never started
        and those refused)."""
        return sum(not self._not_yet(r) and not self._is_refused(r) for r in self.rows.values())

    def refused_runs(self) -> int:
        """How many runs of the store were refused (said once each, or by their experiment)."""
        return sum(not self._not_yet(r) and self._is_refused(r) for r in self.rows.values())

    def _is_refused(self, run: Any) -> bool:
        return run.id in self.refused or f"experiment {run.experiment}" in self.refused

    @staticmethod
    def _not_yet(run: Any) -> bool:
        return run.status == states.QUEUED and not run.started_at

    # ---- a step --------------------------------------------------------------------------

    def step(self) -> None:
        """Send what is new; raises what the server raised (the rest waits for the next step).
        The cursor is saved either way."""
        try:
            if self.remote is None:
                self._reconcile()
            ended = [i for i, r in self.rows.items() if self.first and r.status in states.FINISHED]
            ended += [i for i in self.settling if i in self.rows]
            for run_id in dict.fromkeys([*self.waiting(), *ended]):
                run = self.rows[run_id]
                if self._is_refused(run) or self._not_yet(run):
                    continue
                try:
                    self._sync(run)
                except _Skip:
                    continue
                except UnsafePath as e:  # a link in its folder: never followed
                    self._refuse(run.id, str(e))
                except Exception as e:
                    if not refused(e):
                        raise
                    self._refuse(run.id, f"run {run.id} not mirrored: MLflow refused it: {reason(e)}")
            for sid in sorted(self.boards):
                self._board(sid)
                self.boards.discard(sid)
            self.first = False
        except Exception:
            self.remote = None  # what MLflow holds is read again before the next try
            raise
        finally:
            try:
                self.cursor.save()
            except OSError as e:  # MLflow keeps what was sent: the next start reads it there
                self.warn(f"cannot write {self.cursor.path}: {e.strerror or e}; the mirror goes "
                          "on (MLflow holds what was sent)")

    def _refuse(self, key: str, why: str) -> None:
        self.refused[key] = why
        self.dirty.discard(key)
        self.warn(why)

    def _skip(self, key: str, why: str) -> _Skip:
        self._refuse(key, why)
        return _Skip(why)

    def _search(self, experiment_id: str, where: str = "") -> list[Any]:
        from mlflow.entities import ViewType

        found, token = [], None
        while True:
            page = self.client.search_runs([experiment_id], where, run_view_type=ViewType.ALL,
                                           max_results=PAGE, page_token=token)
            found += list(page)
            token = page.token
            if not token:
                return found

    def _reconcile(self) -> None:
        """What MLflow holds of this root's runs in these experiments (mr.owned: tagged with
        the root, or from before root tags and named by the cursor); the cursor follows it
        where they differ."""
        remote: dict[str, Remote] = {}
        named_parents, self.cursor.parents = self.cursor.parents, {}
        for name in sorted({r.experiment for r in self.rows.values()}):
            experiment = self.client.get_experiment_by_name(name)
            if experiment is None:
                continue
            self.experiments[name] = experiment.experiment_id
            for run in self._search(experiment.experiment_id):
                tags, rid, sid = run.data.tags, run.data.tags.get(mr.RUN_ID), \
                    run.data.tags.get(mr.SEARCH_ID)
                if rid and mr.owned(tags, run.info.run_id, self.mine,
                                    self.cursor.runs.get(rid, Mirrored()).mlflow) and \
                        (rid not in remote or remote[rid].deleted):  # active first
                    remote[rid] = Remote.of(run, self.root_id)
                elif tags.get(mr.ROLE) == mr.SEARCH_ROLE and sid and \
                        run.info.lifecycle_stage != "deleted" and \
                        mr.owned(tags, run.info.run_id, self.mine, named_parents.get(sid)):
                    self.cursor.parents[sid] = run.info.run_id
                    if tags.get(mr.ROOT_ID) != self.root_id:  # no root, or an earlier id
                        self._batch(run.info.run_id, tags=self._root_tags())
        for run_id, m in list(self.cursor.runs.items()):
            found = remote.get(run_id)
            if found is None or found.id != m.mlflow or found.steps != m.last or found.retag:
                # MLflow lost it, holds another, holds more or less than the cursor says, or
                # holds it under no root or an earlier id of this root: all of it is sent
                # again (what MLflow has of it never twice), with this root's id
                self.cursor.runs[run_id] = self._entry(found)
                self.dirty.add(run_id)
            else:
                m.tags = sorted(found.tags)
        for run_id, found in remote.items():
            if run_id not in self.cursor.runs and run_id in self.rows:
                self.cursor.runs[run_id] = self._entry(found)
                self.dirty.add(run_id)
        self.remote = remote

    @staticmethod
    def _entry(found: Remote | None) -> Mirrored:
        if found is None:
            return Mirrored()
        return Mirrored(found.id, last=dict(found.steps), tags=sorted(found.tags))

    def _root_tags(self) -> dict[str, str]:
        return {mr.ROOT_ID: self.root_id, mr.ROOT: os.path.abspath(self.root)}

    def _experiment(self, name: str) -> str:
        if name not in self.experiments:
            experiment = self.client.get_experiment_by_name(name)
            if experiment is not None and experiment.lifecycle_stage == "deleted":
                raise self._skip(f"experiment {name}", f"the MLflow experiment {name} is deleted "
                                 f"(id {experiment.experiment_id}): its runs are not mirrored; "
                                 "restore it (mlflow experiments restore) to mirror them")
            self.experiments[name] = experiment.experiment_id if experiment is not None else \
                self.client.create_experiment(name)
        return self.experiments[name]

    def _create(self, run: Any, m: Mirrored, experiment: str) -> frozenset[str]:
        """Its MLflow run: the one tagged with its id and this root's, else a new one; the
        params it has."""
        found = sorted((Remote.of(r, self.root_id) for r in self._search(
                            experiment, f"tags.`{mr.RUN_ID}` = '{run.id}'")
                        if mr.owned(r.data.tags, r.info.run_id, self.mine, None)),
                       key=lambda r: r.deleted)  # active first
        if found:
            if found[0].deleted:
                raise self._deleted(run, found[0].id)
            m.mlflow, m.last, m.tags = found[0].id, dict(found[0].steps), sorted(found[0].tags)
            return found[0].params
        tags = mr.tags_of(run, None, self.root_id, os.path.abspath(self.root))
        if (sid := mr.search_of(run)) is not None:
            tags[mr.PARENT] = self._parent(run, sid, experiment)
        made = self.client.create_run(experiment, start_time=mr.millis(run.started_at or
                                                                        run.queued_at),
                                      tags=tags, run_name=mr.run_name(run))
        m.mlflow, m.tags = made.info.run_id, sorted(k for k in tags if k.startswith(mr.OURS))
        self.created += 1
        self.tell(f"{run.id}  {run.experiment} {mr.run_name(run)}: MLflow run {m.mlflow}")
        return frozenset()

    def _deleted(self, run: Any, mlflow_id: str) -> _Skip:
        return self._skip(run.id, f"run {run.id} is deleted in MLflow ({mlflow_id}): not "
                          "mirrored (restore it there to mirror it again)")

    def _parent(self, run: Any, sid: str, experiment: str) -> str:
        if sid not in self.cursor.parents:
            found = [r for r in self._search(experiment, f"tags.`{mr.SEARCH_ID}` = '{sid}' and "
                                                         f"tags.`{mr.ROLE}` = '{mr.SEARCH_ROLE}'")
                     if r.info.lifecycle_stage != "deleted"
                     and mr.owned(r.data.tags, r.info.run_id, self.mine, None)]
            if found:
                self.cursor.parents[sid] = found[0].info.run_id
            else:
                made = self.client.create_run(
                    experiment, start_time=mr.millis(run.queued_at), run_name=f"search {sid}",
                    tags={mr.SEARCH_ID: sid, mr.ROLE: mr.SEARCH_ROLE,
                          "gridrun.experiment": run.experiment, **self._root_tags()})
                self.cursor.parents[sid] = made.info.run_id
            self._batch(self.cursor.parents[sid], params=mr.search_params(run.config["search"]))
        return self.cursor.parents[sid]

    def _batch(self, run_id: str, *, metrics: list[Any] = (), params: dict[str, str] | None = None,
               tags: dict[str, str] | None = None) -> None:
        from mlflow.entities import Param, RunTag

        self.client.log_batch(run_id, metrics=list(metrics),
                              params=[Param(k, v) for k, v in (params or {}).items()],
                              tags=[RunTag(k, v) for k, v in (tags or {}).items()],
                              synchronous=True)

    def _sync(self, run: Any) -> None:
        if self.root_id not in self.cursor.roots:
            self.cursor.roots.append(self.root_id)
        m = self.cursor.runs.setdefault(run.id, Mirrored())
        remote = (self.remote or {}).get(run.id)
        if remote is not None and remote.deleted:
            raise self._deleted(run, remote.id)
        have = remote.params if remote is not None and remote.id == m.mlflow else frozenset()
        if m.mlflow is None:
            have = self._create(run, m, self._experiment(run.experiment))
        if not m.params:
            self._batch(m.mlflow, params={k: v for k, v in mr.params_of(
                run.config, run.adjustments).items() if k not in have})
            m.params = True
        self._metrics(run, m)
        if m.seq == run.seq and not self.first and run.id not in self.settling:
            return
        summary = runlog.read_summary(run.run_dir(self.root) / layout.SUMMARY)
        if m.seq != run.seq:
            self._tags(m, mr.tags_of(run, summary, self.root_id, os.path.abspath(self.root)))
            status = mr.STATUS.get(run.status, "RUNNING")
            if run.status in states.FINISHED:
                self.client.set_terminated(m.mlflow, status, end_time=mr.millis(run.ended_at)
                                           or None)
            else:
                self.client.update_run(m.mlflow, status=status)
            if (sid := mr.search_of(run)) is not None:
                self.boards.add(sid)
        self._files(run, m)
        # a search's stopped trial: the store says so before the engine rewrites its summary
        left = self.settling.get(run.id, SETTLE) - 1
        if run.status in states.FINISHED and summary is not None and left > 0 and \
                summary.status not in (None, run.status):
            self.settling[run.id] = left
        else:
            self.settling.pop(run.id, None)
        if run.status in states.FINISHED and m.seq != run.seq:
            self.tell(f"{run.id}  {run.experiment} {mr.run_name(run)}: {run.status} "
                      f"({m.points:,} metric points sent)")
        m.seq = run.seq
        self.dirty.discard(run.id)

    def _tags(self, m: Mirrored, tags: dict[str, str]) -> None:
        """Its tags as they are now; one of ours it no longer has (an error after a retry
        that completed, a value an attempt dropped) is deleted, never left stale."""
        self._batch(m.mlflow, tags=tags)
        for key in sorted(set(m.tags) - set(tags)):
            try:
                self.client.delete_tag(m.mlflow, key)
            except Exception as e:
                if not refused(e):  # gone already: what was wanted
                    raise
        m.tags = sorted(k for k in tags if k.startswith(mr.OURS))

    def _metrics(self, run: Any, m: Mirrored) -> None:
        from mlflow.entities import Metric

        path = run.run_dir(self.root) / layout.METRICS
        # from the start unless the log still holds the bytes the cursor hashed (a cursor
        # with no hash names no offset: steps MLflow holds are left out either way)
        offset = m.offset if m.offset and m.tail and tail(path, m.offset) == m.tail else 0
        got = runlog.read(path, offset)
        if got.refused:
            raise UnsafePath(got.refused)
        points, last = mr.new_points(got.records, m.last)
        if points:
            self._batch(m.mlflow, metrics=[Metric(k, v, t, s) for k, v, t, s in points])
        m.offset, m.tail, m.last = got.offset, tail(path, got.offset), last
        m.points += len(points)
        self.points += len(points)

    def _files(self, run: Any, m: Mirrored) -> None:
        changed = [f for f in mr.run_files(run.run_dir(self.root))
                   if m.files.get(f.key) != list(f.stamp)]
        if not changed:
            return
        with tempfile.TemporaryDirectory(prefix="gridrun-mirror-") as tmp:
            for f in changed:
                mr.copy_out(f, Path(tmp) / f.key)
            self.client.log_artifacts(m.mlflow, tmp)
        m.files.update({f.key: list(f.stamp) for f in changed})
        self.files += len(changed)

    def _board(self, sid: str) -> None:
        """The search's leaderboard (csv and text) on its parent run, and its status."""
        trials = [r for r in self.rows.values() if mr.search_of(r) == sid]
        parent = self.cursor.parents.get(sid)
        if not trials or parent is None:
            return
        try:  # what the folders hold is untrusted: a board that cannot be made is said, not retried
            texts = mr.leaderboards(self.root, list(self.rows.values()), trials[0].experiment)
        except Exception as e:
            texts = {}
            self.warn(f"the leaderboard of search {sid} was not sent: {type(e).__name__}: {e}")
        if texts:
            with tempfile.TemporaryDirectory(prefix="gridrun-mirror-") as tmp:
                for name, text in texts.items():
                    (Path(tmp) / name).write_text(text)
                self.client.log_artifacts(parent, tmp)
        ended = sum(r.status in states.FINISHED for r in trials)
        self._batch(parent, tags={"gridrun.trials_ended": f"{ended}/{len(trials)}"})
        if ended == len(trials):
            self.client.set_terminated(parent, "FINISHED", end_time=mr.millis(
                max(r.ended_at or 0 for r in trials)) or None)
        else:
            self.client.update_run(parent, status="RUNNING")


def follow(mirror: Mirror, store: Any, uri: str, every: float, *,
           sleep: Callable[[float], None] = time.sleep) -> None:
    """Mirror until interrupted: read the change feed, send, wait `every` seconds; while the
    server fails, say what waits in one line and try again after 1, 2, 4 ... BACKOFF_CAP s."""
    failures = 0
    while True:
        mirror.read(store)
        try:
            mirror.step()
        except Exception as e:
            failures += 1
            wait = min(BACKOFF_CAP, 2.0 ** (failures - 1))
            mirror.warn(f"could not send to {uri}: {reason(e)}; {waits(mirror.waiting())}; "
                        f"trying again in {wait:g} s")
            sleep(wait)
            continue
        if failures:
            mirror.tell(f"{uri} answers again: caught up")
            failures = 0
        sleep(every)


def waits(ids: list[str]) -> str:
    """`3 runs wait to be sent (a1, b2, c3)`: what a failed step left."""
    if not ids:
        return "nothing new waits"
    shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
    return f"{len(ids)} run{'s' * (len(ids) != 1)} wait{'s' * (len(ids) == 1)} to be sent ({shown})"
