"""The durable queue: SQLite at ROOT/gridrun.db. The only module that speaks SQL
(its rows as Python values: store_rows.py; the file, its schema and damage:
store_db.py).

Everyone opens their own `Store`: the engine (the only writer of launches and
exits), CLIs and TUIs (which write intents). WAL lets readers never block the
writer; every write is one short `BEGIN IMMEDIATE` transaction, and every
state change is guarded (`UPDATE ... WHERE status = expected`), so two
processes can never both take the same run.

Each write to a run gives it the next value of a store-wide counter, `seq`,
so a client polls `changes_since(last_seq)` and reads only what changed.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping
from typing import Any

from gridrun.runs import states
from gridrun.runs.store_db import (  # noqa: F401 (what Store raises)
    MIGRATIONS,
    Database,
    StoreDamaged,
    StoreError,
    StoreFull,
    StoreNotWritable,
)
from gridrun.runs.store_rows import (
    Intent,
    Run,
    RunNotFound,
    TelemetrySample,
    dumps,
    end_gone,
    loads,
    run_of,
    to_columns,
)
from gridrun.runs.store_search import SearchTables
from gridrun.spec import RunSpec

RETRYABLE = (states.FAILED, states.DIVERGED, states.OOM, states.CANCELLED)
ACTIVE = (states.QUEUED, states.RUNNING)
FOREGROUND = "fg"  # the slot of a run `gridrun train` trains in its own process
# what `gridrun train` may take without a second look: a new attempt of an ended run
CLAIMABLE = (states.QUEUED, states.INTERRUPTED, states.COMPLETED, *RETRYABLE)
TELEMETRY_KEEP = 3600  # samples: an hour at 1 Hz
REMOVED_KEEP = 10_000  # removed run ids remembered for readers (the `state` table's 'removed')

class Store(SearchTables, Database):
    """The durable queue over ROOT/gridrun.db: reading runs, queueing, intents,
    the engine's transitions, telemetry.

    Safe to share between threads of one process (calls are serialised).
    """

    def _next_seq(self, db: sqlite3.Connection) -> int:
        row = db.execute("UPDATE state SET value = CAST(value AS INTEGER) + 1 "
                         "WHERE key = 'seq' RETURNING value").fetchone()
        return int(row[0])

    def _update(self, db: sqlite3.Connection, run_id: str, expected: Iterable[str] | None,
                **fields: Any) -> bool:
        """The guarded write every state change goes through."""
        fields["seq"] = self._next_seq(db)
        sets = ", ".join(f"{k} = ?" for k in fields)
        sql, args = f"UPDATE runs SET {sets} WHERE id = ?", [*fields.values(), run_id]
        if expected is not None:
            expected = list(expected)
            sql += f" AND status IN ({', '.join('?' * len(expected))})"
            args += expected
        return db.execute(sql, args).rowcount == 1

    # ---- reading --------------------------------------------------------------

    def list_runs(self, *, status: str | Iterable[str] | None = None,
                  experiment: str | None = None, ids: Iterable[str] | None = None,
                  config_has: str | None = None) -> list[Run]:
        """Runs in queue order (priority, then first in); `config_has` keeps those whose
        config's JSON text contains it (a cheap superset for a caller that checks the
        parsed config: only the rows kept are parsed)."""
        where, args = [], []
        for column, value in (("status", status), ("id", ids)):
            if value is not None:
                values = [value] if isinstance(value, str) else list(value)
                where.append(f"{column} IN ({', '.join('?' * len(values))})")
                args += values
        if experiment is not None:
            where.append("experiment = ?")
            args.append(experiment)
        if config_has is not None:
            where.append("instr(config, ?) > 0")
            args.append(config_has)
        sql = "SELECT * FROM runs" + (f" WHERE {' AND '.join(where)}" if where else "")
        self.end_gone_foreground()
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY priority DESC, queued_at, rowid", args).fetchall()
        return [run_of(r) for r in rows]

    def get_run(self, prefix: str) -> Run:
        """The run whose id starts with `prefix`; RunNotFound if none or several."""
        return self.list_runs(ids=[self.resolve(prefix)])[0]

    def resolve(self, prefix: str) -> str:
        with self._lock:
            found = [r[0] for r in self._db.execute(
                "SELECT id FROM runs WHERE id >= ? AND id < ? LIMIT 6", (prefix, prefix + "\uffff"))]
        if not found:
            raise RunNotFound(f"no run matches {prefix!r}")
        if len(found) > 1 and prefix not in found:
            raise RunNotFound(f"{prefix!r} matches several runs ({', '.join(found[:5])}); "
                              "give more characters")
        return prefix if prefix in found else found[0]

    def changes_since(self, seq: int = 0, *, experiment: str | None = None) -> tuple[list[Run], int]:
        """Runs (of one experiment, if given) written after `seq`, and the seq to pass next
        time. The first read (seq 0) comes in queue order: priority, first in, file order."""
        order = "seq" if seq else "priority DESC, queued_at, rowid"
        where, args = ("seq > ? AND experiment = ?", (seq, experiment)) if experiment is not None \
            else ("seq > ?", (seq,))
        self.end_gone_foreground()
        with self._lock:
            rows = self._db.execute(f"SELECT * FROM runs WHERE {where} ORDER BY {order}",
                                    args).fetchall()
        runs = [run_of(r) for r in rows]
        return runs, max([seq, *(r.seq for r in runs)])

    def experiments(self) -> list[str]:
        """The experiments the store has runs of, sorted."""
        with self._lock:
            return [r[0] for r in self._db.execute(
                "SELECT DISTINCT experiment FROM runs ORDER BY experiment").fetchall()]

    def has_runs(self) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM runs LIMIT 1").fetchone() is not None

    def check(self, *, full: bool = False) -> list[str]:
        """SQLite's `quick_check` of every page (with `full`, its `integrity_check`,
        which also compares every index with its table): [] when the file is sound,
        else its complaints (StoreDamaged when it cannot even be read)."""
        pragma = "integrity_check" if full else "quick_check"
        with self._lock:
            rows = [r[0] for r in self._db.execute(f"PRAGMA {pragma}").fetchall()]
        return [] if rows == ["ok"] else rows

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT status, COUNT(*) FROM runs GROUP BY status").fetchall()
        return {status: n for status, n in rows}

    # ---- queueing -------------------------------------------------------------

    def enqueue(self, runs: Iterable[RunSpec], provenance: Mapping[str, Any] | None = None,
                *, force: bool = False, priority: int = 0) -> tuple[list[str], list[str]]:
        """Queue new runs. Returns (queued ids, skipped ids).

        A run already queued, running or completed is skipped (its id is a
        content hash, so it is the same cell); `force` queues a completed or
        ended one again as a new attempt from scratch. A run that failed,
        diverged, ran out of memory or was cancelled is queued again as a new
        attempt without `force`.
        """
        queued, skipped = [], []
        now = time.time()
        prov = dumps(provenance)
        with self._tx() as db:
            for spec in runs:
                row = db.execute("SELECT status, attempt FROM runs WHERE id = ?", (spec.id,)).fetchone()
                if row is None:
                    self._insert(db, spec, prov, priority, now)
                    queued.append(spec.id)
                    continue
                status, attempt = row
                again = status in RETRYABLE or (force and status == states.COMPLETED)
                if not again:
                    skipped.append(spec.id)
                    continue
                self._update(db, spec.id, [status], status=states.QUEUED, attempt=attempt + 1,
                             config=json.dumps(spec.to_dict()), priority=priority, queued_at=now,
                             provenance=prov, fresh=int(force), retries=0, restarts=0,
                             not_before=0, error=None, slot=None, pid=None, pid_start_time=None,
                             started_at=None, ended_at=None, adjustments=None,
                             note="queued again" + (" (--force)" if force else ""))
                queued.append(spec.id)
        return queued, skipped

    def _insert(self, db, spec: RunSpec, provenance: str | None, priority: int, now: float) -> None:
        db.execute(
            "INSERT INTO runs (id, experiment, variant, ablation, seed, config, status, "
            "priority, queued_at, provenance, seq) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (spec.id, spec.experiment, spec.variant, spec.ablation, spec.seed,
             json.dumps(spec.to_dict()), states.QUEUED, priority, now, provenance,
             self._next_seq(db)))

    # ---- foreground runs: `gridrun train` ------------------------------------------

    def claim_foreground(self, spec: RunSpec, pid: int, start_time: float | None, *,
                         provenance: Mapping[str, Any] | None = None,
                         dead_pid: int | None = None) -> tuple[bool, Run]:
        """`gridrun train` takes a run for its own process: queued first if the store
        has no such run (as `gridrun queue` would), then `running` on slot FOREGROUND
        with `pid`, from queued, or as a new attempt from an ended state, or from a
        foreground process `dead_pid` the caller found gone. The engine never
        launches, adopts or stops it. Returns (taken, the row as it was before)."""
        now = time.time()
        with self._tx() as db:
            if self._status(db, spec.id) is None:
                self._insert(db, spec, dumps(provenance), 0, now)
            before = run_of(db.execute("SELECT * FROM runs WHERE id = ?", (spec.id,)).fetchone())
            took_over = (before.status == states.RUNNING and before.slot == FOREGROUND
                         and dead_pid is not None and before.pid == dead_pid)
            if before.status not in CLAIMABLE and not took_over:
                return False, before
            again = before.status not in (states.QUEUED, states.RUNNING)
            extra = dict(attempt=before.attempt + 1, retries=0, restarts=0, error=None,
                         adjustments=None, queued_at=now, not_before=0) if again else {}
            note = (f"training in the foreground (pid {pid})"
                    + (f"; took over from pid {dead_pid}, which was gone" if took_over else ""))
            taken = self._update(db, spec.id, [before.status], status=states.RUNNING,
                                 slot=FOREGROUND, pid=pid, pid_start_time=start_time,
                                 started_at=now, ended_at=None, fresh=0,
                                 config=json.dumps(spec.to_dict()), note=note, **extra)
            return taken, before

    def end_foreground(self, run_id: str, pid: int, status: str, **fields: Any) -> bool:
        """A foreground run ends (or, its process gone, goes back to the queue): only
        while it is still `running` on FOREGROUND under `pid`, so a process that was
        taken over never overwrites its successor."""
        fields = to_columns(fields)
        with self._tx() as db:
            mine = db.execute("SELECT 1 FROM runs WHERE id = ? AND status = ? AND slot = ? "
                              "AND pid = ?", (run_id, states.RUNNING, FOREGROUND, pid)).fetchone()
            return mine is not None and self._update(
                db, run_id, [states.RUNNING], status=status, slot=None, pid=None,
                pid_start_time=None, **fields)

    _foreground_looked = 0.0  # monotonic: readers look at most once a second (the TUI's tick)

    def end_gone_foreground(self) -> None:
        """list_runs' and changes_since's look at foreground runs: a killed one is queued."""
        if (now := time.monotonic()) - self._foreground_looked < 1.0:
            return
        self._foreground_looked = now
        with self._lock:
            rows = [] if self.view is not None else self._db.execute(
                "SELECT * FROM runs WHERE status = ? AND slot = ?",
                (states.RUNNING, FOREGROUND)).fetchall()
        end_gone(self, [run_of(r) for r in rows])

    # ---- intents: what any client may ask -----------------------------------------

    def _intent(self, db, kind: str, run_id: str | None, value: Any = None,
                outcome: str | None = None) -> None:
        now = time.time()
        db.execute("INSERT INTO intents (kind, run_id, value, created_at, applied_at, outcome) "
                   "VALUES (?,?,?,?,?,?)",
                   (kind, run_id, dumps(value), now, now if outcome else None, outcome))

    def cancel(self, ids: Iterable[str]) -> dict[str, str]:
        """Cancel runs: a queued one at once; a running one is stopped by the
        engine (it checkpoints, then it is cancelled). Returns {id: outcome}."""
        out = {}
        with self._tx() as db:
            for run_id in ids:
                if self._update(db, run_id, [states.QUEUED, states.WAITING],
                                status=states.CANCELLED, ended_at=time.time(),
                                note="cancelled while it waited"):
                    self._intent(db, "cancel", run_id, outcome="cancelled")
                    out[run_id] = "cancelled"
                elif fg := db.execute("SELECT pid FROM runs WHERE id = ? AND status = ? AND "
                                      "slot = ?", (run_id, states.RUNNING, FOREGROUND)).fetchone():
                    out[run_id] = (f"not cancelled: it trains in the foreground (pid {fg[0]}); "
                                   "stop it there (ctrl-c checkpoints it)")
                elif self._status(db, run_id) == states.RUNNING:
                    self._intent(db, "cancel", run_id)
                    out[run_id] = "cancelling"
                else:
                    out[run_id] = f"not cancelled: it is {self._status(db, run_id)}"
        return out

    def retry(self, ids: Iterable[str], *, fresh: bool = False) -> dict[str, str]:
        """Queue ended runs (failed, diverged, oom, cancelled) again as a new
        attempt; it resumes from its last checkpoint, or with `fresh` starts
        over (its checkpoints are deleted at launch). Returns {id: outcome}."""
        out = {}
        with self._tx() as db:
            for run_id in ids:
                row = db.execute("SELECT status, attempt, fresh FROM runs WHERE id = ?",
                                 (run_id,)).fetchone()
                # a pending fresh start (asked for earlier, or a run whose folder was
                # replaced) survives a plain retry: only a launch clears it
                start_over = bool(fresh or (row and row[2]))
                if row and self._update(db, run_id, RETRYABLE, status=states.QUEUED,
                                        attempt=row[1] + 1, queued_at=time.time(), retries=0,
                                        restarts=0, not_before=0, error=None, ended_at=None,
                                        started_at=None, fresh=int(start_over),
                                        note=f"retried {'from scratch ' * start_over}after {row[0]}"):
                    self._intent(db, "retry", run_id, outcome="queued")
                    out[run_id] = "queued"
                else:
                    why = states.NOT_RETRIED.get(row[0]) if row else None
                    out[run_id] = f"not retried: it is {row[0] if row else 'unknown'}" + (
                        f": {why}" if why else "")
        return out

    def remove(self, ids: Iterable[str]) -> dict[str, str]:
        """Take runs out of the store (queued or ended ones; a running one is refused:
        cancel it first). Returns {id: "removed" | "not removed: ..."}; readers learn
        of it from `removed_since`. Run folders are the caller's to keep or delete."""
        out: dict[str, str] = {}
        with self._tx() as db:
            gone = self._removals(db)
            for run_id in ids:
                status = self._status(db, run_id)
                if status is None:
                    out[run_id] = "not removed: no such run"
                elif status == states.RUNNING:
                    out[run_id] = ("not removed: it is running; cancel it first "
                                   f"(`gridrun cancel {run_id}`), then remove it")
                elif db.execute("DELETE FROM runs WHERE id = ? AND status = ?",
                                (run_id, status)).rowcount == 1:
                    gone.append([self._next_seq(db), run_id])
                    self._intent(db, "remove", run_id, outcome="removed")
                    out[run_id] = "removed"
            db.execute("INSERT OR REPLACE INTO state VALUES ('removed', ?)",
                       (json.dumps(gone[-REMOVED_KEEP:]),))
        return out

    @staticmethod
    def _removals(db: sqlite3.Connection) -> list[list]:
        row = db.execute("SELECT value FROM state WHERE key = 'removed'").fetchone()
        try:
            gone = json.loads(row[0]) if row else []
        except ValueError:
            gone = []
        return [g for g in gone if isinstance(g, list) and len(g) == 2] if isinstance(gone, list) else []

    def removed_since(self, seq: int = 0) -> tuple[list[str], int]:
        """Ids removed after `seq`, and the seq to pass next time (the last
        REMOVED_KEEP removals are remembered; a reader further behind reads all rows again)."""
        with self._lock:
            gone = self._removals(self._db)
        new = [(s, i) for s, i in gone if isinstance(s, int) and s > seq]
        return [i for _, i in new], max([seq, *(s for s, _ in new)])

    def set_priority(self, ids: Iterable[str], value: int, *, relative: bool = False) -> None:
        """Set (or with `relative`, add to) the priority of runs. Higher runs first."""
        with self._tx() as db:
            for run_id in ids:
                expr = "priority + ?" if relative else "?"
                seq = self._next_seq(db)
                db.execute(f"UPDATE runs SET priority = {expr}, seq = ? WHERE id = ?",
                           (value, seq, run_id))
                self._intent(db, "priority", run_id, value, outcome="set")

    def pause(self) -> None:
        """Stop launching; running runs finish."""
        self._set_paused(True)

    def resume(self) -> None:
        self._set_paused(False)

    def _set_paused(self, paused: bool) -> None:
        with self._tx() as db:
            db.execute("UPDATE state SET value = ? WHERE key = 'paused'", (json.dumps(paused),))
            self._intent(db, "pause" if paused else "resume", None, outcome="set")

    @property
    def paused(self) -> bool:
        return bool(self.get_state("paused", False))

    def intents(self, *, pending: bool = False, limit: int = 100) -> list[Intent]:
        sql = "SELECT * FROM intents" + (" WHERE applied_at IS NULL" if pending else "")
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [Intent(**{**dict(r), "value": loads(r["value"])}) for r in reversed(rows)]

    def mark_applied(self, intent_id: int, outcome: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE intents SET applied_at = ?, outcome = ? WHERE id = ?",
                       (time.time(), outcome, intent_id))

    def _status(self, db, run_id: str) -> str | None:
        row = db.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        return row[0] if row else None

    # ---- engine state ---------------------------------------------------------

    def get_state(self, key: str, default: Any = None) -> Any:
        with self._lock:
            row = self._db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def set_state(self, key: str, value: Any) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO state VALUES (?, ?)", (key, json.dumps(value)))

    # ---- transitions (the engine's) ---------------------------------------------

    def next_queued(self, limit: int, now: float | None = None) -> list[Run]:
        """Queued runs ready to launch: highest priority first, then first in."""
        now = time.time() if now is None else now
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM runs WHERE status = ? AND not_before <= ? "
                "ORDER BY priority DESC, queued_at, rowid LIMIT ?", (states.QUEUED, now, limit)).fetchall()
        return [run_of(r) for r in rows]

    def transition(self, run_id: str, expected: str | Iterable[str], status: str,
                   **fields: Any) -> bool:
        """Move a run to `status` only if it is in `expected`; False if someone
        else moved it first. JSON fields (summary, config, adjustments) may be
        given as Python values."""
        fields = to_columns(fields)
        expected = [expected] if isinstance(expected, str) else list(expected)
        with self._tx() as db:
            return self._update(db, run_id, expected, status=status, **fields)

    def set_placement(self, run_id: str, placement: Mapping[str, Any]) -> None:
        """Where the backend placed a run (a SLURM job); readers see it as a change."""
        with self._tx() as db:
            self._update(db, run_id, None, placement=dumps(placement))

    # ---- telemetry ------------------------------------------------------------

    def record_telemetry(self, data: Mapping[str, Any], t: float | None = None,
                         keep: int = TELEMETRY_KEEP) -> None:
        """Append a sample; keeps only the latest `keep` samples."""
        t = time.time() if t is None else t
        with self._tx() as db:
            cur = db.execute("INSERT INTO telemetry (t, data) VALUES (?, ?)", (t, json.dumps(data)))
            if cur.lastrowid % 64 == 0:  # trim now and then, not on every write
                db.execute("DELETE FROM telemetry WHERE rowid <= ?", (cur.lastrowid - keep,))

    def latest_telemetry(self) -> TelemetrySample | None:
        with self._lock:
            row = self._db.execute("SELECT t, data FROM telemetry ORDER BY rowid DESC LIMIT 1").fetchone()
        return None if row is None else TelemetrySample(row[0], json.loads(row[1]))

    def telemetry_since(self, t: float, limit: int = TELEMETRY_KEEP) -> list[TelemetrySample]:
        """Samples taken after unix time `t`, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT t, data FROM telemetry WHERE t > ? ORDER BY t LIMIT ?",
                                    (t, limit)).fetchall()
        return [TelemetrySample(r[0], json.loads(r[1])) for r in rows]
