"""The store's search tables: each search seen, what its trials scored at each rung,
and the decisions taken (engine/search.py is their one writer; views read them).

Part of `Store` (store.py), in the same short guarded transactions: a result or a
decision once written is never changed, so an engine killed between two writes
finds, on its restart, the decisions it took and takes the rest the same way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# the schema (store_db.MIGRATIONS appends it)
SCHEMA = """
    CREATE TABLE searches (
        id TEXT PRIMARY KEY, experiment TEXT NOT NULL, config TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE TABLE search_results (
        search TEXT NOT NULL, run_id TEXT NOT NULL, trial INTEGER NOT NULL,
        epoch INTEGER NOT NULL, value REAL, recorded_at REAL NOT NULL,
        PRIMARY KEY (search, run_id, epoch)
    );
    CREATE TABLE search_decisions (
        search TEXT NOT NULL, trial INTEGER NOT NULL, epoch INTEGER NOT NULL,
        kind TEXT NOT NULL, ord INTEGER NOT NULL, reason TEXT NOT NULL,
        decided_at REAL NOT NULL, PRIMARY KEY (search, trial, epoch)
    );
"""


@dataclass(frozen=True)
class RungResult:
    run_id: str
    trial: int
    epoch: int
    value: float | None  # None: the run ended without one (failed, diverged)


@dataclass(frozen=True)
class StoredDecision:
    trial: int
    epoch: int
    kind: str  # promotion.PROMOTE | promotion.STOP
    order: int
    reason: str
    decided_at: float


class SearchTables:
    """The search half of `Store` (it needs its `_tx` and `_lock`)."""

    _db: Any
    _lock: Any
    _tx: Any  # Database's: one short BEGIN IMMEDIATE transaction

    def add_search(self, search_id: str, experiment: str, config: Mapping[str, Any]) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO searches VALUES (?, ?, ?, ?)",
                       (search_id, experiment, json.dumps(dict(config)), time.time()))

    def searches(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """{search id: (experiment, its settings)}."""
        with self._lock:
            rows = self._db.execute("SELECT id, experiment, config FROM searches").fetchall()
        return {r[0]: (r[1], json.loads(r[2])) for r in rows}

    def record_results(self, search_id: str, results: Iterable[RungResult]) -> int:
        """Keep rung results not kept yet (a kept one is never changed); how many were new."""
        now, new = time.time(), 0
        with self._tx() as db:
            for r in results:
                new += db.execute("INSERT OR IGNORE INTO search_results VALUES (?, ?, ?, ?, ?, ?)",
                                  (search_id, r.run_id, r.trial, r.epoch, r.value, now)).rowcount
        return new

    def search_results(self, search_id: str) -> list[RungResult]:
        with self._lock:
            rows = self._db.execute("SELECT run_id, trial, epoch, value FROM search_results "
                                    "WHERE search = ? ORDER BY trial, epoch, run_id",
                                    (search_id,)).fetchall()
        return [RungResult(r[0], r[1], r[2], r[3]) for r in rows]

    def record_decisions(self, search_id: str, decisions: Iterable[Any]) -> int:
        """Keep decisions (promotion.Decision) not taken yet; a taken one is final."""
        now, new = time.time(), 0
        with self._tx() as db:
            for d in decisions:
                new += db.execute("INSERT OR IGNORE INTO search_decisions VALUES "
                                  "(?, ?, ?, ?, ?, ?, ?)",
                                  (search_id, d.trial, d.epoch, d.kind, d.order, d.reason,
                                   now)).rowcount
        return new

    def search_decisions(self, search_id: str) -> list[StoredDecision]:
        with self._lock:
            rows = self._db.execute("SELECT trial, epoch, kind, ord, reason, decided_at FROM "
                                    "search_decisions WHERE search = ? ORDER BY epoch, kind, ord, "
                                    "trial", (search_id,)).fetchall()
        return [StoredDecision(*r) for r in rows]
