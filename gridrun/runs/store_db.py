"""The store's SQLite file: opening it (0600, WAL), its schema and migrations,
the one transaction shape every write uses, and what a damaged file means.
The queue's operations on it are store.py's; nobody else speaks SQL.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gridrun.runs import layout

# Append only: each entry moves the schema from version i to i + 1.
MIGRATIONS = [
    """
    CREATE TABLE runs (
        id TEXT PRIMARY KEY, experiment TEXT NOT NULL, variant TEXT NOT NULL,
        ablation TEXT NOT NULL DEFAULT '', seed INTEGER NOT NULL, config TEXT NOT NULL,
        status TEXT NOT NULL, priority INTEGER NOT NULL DEFAULT 0,
        attempt INTEGER NOT NULL DEFAULT 1, retries INTEGER NOT NULL DEFAULT 0,
        restarts INTEGER NOT NULL DEFAULT 0, fresh INTEGER NOT NULL DEFAULT 0,
        not_before REAL NOT NULL DEFAULT 0,
        slot TEXT, pid INTEGER, pid_start_time REAL,
        queued_at REAL NOT NULL, started_at REAL, ended_at REAL,
        error TEXT, note TEXT, summary TEXT, provenance TEXT, adjustments TEXT,
        seq INTEGER NOT NULL
    );
    CREATE INDEX runs_seq ON runs(seq);
    CREATE INDEX runs_queue ON runs(status, priority DESC, queued_at);
    CREATE TABLE intents (
        id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, run_id TEXT,
        value TEXT, created_at REAL NOT NULL, applied_at REAL, outcome TEXT
    );
    CREATE INDEX intents_pending ON intents(applied_at);
    CREATE TABLE telemetry (t REAL NOT NULL, data TEXT NOT NULL);
    CREATE INDEX telemetry_t ON telemetry(t);
    CREATE TABLE state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    INSERT INTO state VALUES ('seq', '0'), ('paused', 'false');
    """,
    # where a run executes beyond this machine's slot and pid: a SLURM job's id,
    # node, state and GPUs (backends/slurm.py placements)
    """
    ALTER TABLE runs ADD COLUMN placement TEXT;
    """,
]


class StoreDamaged(Exception):
    """The store's file cannot be read. str() is one line: which file, what is
    wrong with it, and what to do."""


# SQLite's own words for a file that is not (or no longer) a readable database;
# anything else (busy, locked, a bad statement) is not damage and passes as is.
_DAMAGE = ("SQLITE_NOTADB", "SQLITE_CORRUPT", "SQLITE_IOERR")


def _damage(path: Path, error: BaseException) -> StoreDamaged | None:
    """The StoreDamaged that `error` (or the error it happened in) means, if any."""
    while error is not None and not (isinstance(error, sqlite3.DatabaseError) and
                                     (getattr(error, "sqlite_errorname", "") or "").startswith(_DAMAGE)):
        error = error.__context__
    if error is None:
        return None
    root = shlex.quote(str(path.parent))
    rebuild = (f"`gridrun doctor --rebuild --root {root}` moves it aside and rebuilds the queue "
               "from the run folders")
    name = error.sqlite_errorname
    if name.startswith("SQLITE_IOERR"):
        return StoreDamaged(
            f"{path} cannot be read ({error}): its {path.name}-wal was probably deleted while "
            f"the engine had it open; if the engine runs, `gridrun engine stop --root {root}` "
            f"writes its copy back, then try again; if it persists, {rebuild}")
    what = "is not a SQLite database" if name == "SQLITE_NOTADB" else "is damaged"
    return StoreDamaged(f"{path} {what} ({error}): the queue cannot be read; {rebuild}")


class _Guard:
    """The store's lock (calls are serialised), which also turns SQLite's
    errors for a damaged file into one StoreDamaged, wherever they surface: a
    deleted -wal shows only when a query reaches a page it held."""

    def __init__(self, path: Path) -> None:
        self.path, self._lock = path, threading.RLock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, kind: type | None, error: BaseException | None, tb: Any) -> None:
        self._lock.release()
        damaged = None if error is None or isinstance(error, StoreDamaged) else \
            _damage(self.path, error)
        if damaged is not None:
            raise damaged from error


class Database:
    """A connection to ROOT/gridrun.db (created, 0600 in a 0700 root, on first use),
    in WAL mode at the newest schema, with one short transaction per write.

    Safe to share between threads of one process (calls are serialised).
    """

    def __init__(self, root: str | os.PathLike, *, timeout: float = 30.0):
        self.root = Path(root)
        layout.check_root(self.root)  # UnsafeRoot: others can write it (with the chmod that fixes it)
        self.path = self.root / layout.DB_NAME
        if not self.path.exists():
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        os.chmod(self.path, 0o600)
        self._lock = _Guard(self.path)
        self._db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None,
                                   check_same_thread=False)
        try:
            with self._lock:
                self._db.row_factory = sqlite3.Row
                self._db.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
                self._wal(timeout)
                self._db.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: durable across crashes of us
                self._migrate()
        except BaseException:
            self._db.close()
            raise

    def _wal(self, timeout: float) -> None:
        # Switching to WAL (or opening while the last connection closes the WAL)
        # returns "locked" at once, without the busy timeout: wait here instead.
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                if self._db.in_transaction:  # a damaged file may have ended it already
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _migrate(self) -> None:
        with self._tx() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):
                raise RuntimeError(f"{self.path} was written by a newer gridrun (schema {version})")
            for i in range(version, len(MIGRATIONS)):
                for statement in MIGRATIONS[i].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {i + 1}")
