"""The store's SQLite file: opening it (0600, WAL), its schema and migrations,
the one transaction shape every write uses, and what a damaged file means.
The queue's operations on it are store.py's (a search's, store_search.py's);
nobody else speaks SQL.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gridrun.runs import layout, space
from gridrun.runs.store_search import SCHEMA as SEARCH_SCHEMA

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
    # searches: their trials' rung results and the decisions taken (store_search.py)
    SEARCH_SCHEMA,
    # the root's identity, made once with its store (or when an older store is migrated):
    # two roots may hold the same run ids (one root per device count), and what mirrors
    # them elsewhere (MLflow) tells their runs apart by it
    """
    INSERT OR IGNORE INTO state VALUES ('root_id', '"' || lower(hex(randomblob(8))) || '"');
    """,
]


class StoreError(Exception):
    """The store cannot be used. str() is one line: which file, what is wrong and what
    to do. Each kind says what it is, so that nobody is told to rebuild a sound store."""


class StoreDamaged(StoreError):
    """The store's file itself is damaged or is not a SQLite database."""


class StoreFull(StoreError):
    """The disk (or the user's quota) holding the store is full: the file is sound."""


class StoreNotWritable(StoreError):
    """A read-only file system, or permissions: the file is sound."""


# SQLite's own words for a file that is not (or no longer) a readable database;
# anything else (busy, locked, a bad statement) is not damage and passes as is.
_DAMAGE = ("SQLITE_NOTADB", "SQLITE_CORRUPT", "SQLITE_IOERR")
_CANNOT_WRITE = ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH")
_INTACT = "the queue is intact: nothing needs rebuilding"


def _sqlite_error(error: BaseException | None) -> BaseException | None:
    """The SQLite or OS error `error` is, or happened in (its chain)."""
    while error is not None:
        if isinstance(error, sqlite3.DatabaseError | OSError):
            return error
        error = error.__context__
    return None


def _cannot_write(path: Path, root: str) -> StoreNotWritable:
    if space.read_only(path.parent):
        return StoreNotWritable(
            f"{path} cannot be written: {path.parent} is on a read-only file system; remount it "
            f"read-write or use another root (--root); {_INTACT}")
    who = ""
    with contextlib.suppress(OSError):
        st = os.stat(path if path.exists() else path.parent)
        who = f" (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})"
    return StoreNotWritable(
        f"{path} cannot be opened for writing: permission denied{who}; run gridrun as the "
        f"root's owner or fix the permissions (`ls -l {root}`); {_INTACT}")


def _full(path: Path) -> StoreFull:
    free = space.free_bytes(path.parent)
    return StoreFull(
        f"{path} cannot be written: the disk holding {path.parent} is full "
        f"({space.human(free)} free); free some space and try again; {_INTACT} "
        "(do not run `gridrun doctor --rebuild`)")


def diagnose(path: Path, error: BaseException) -> StoreError | None:
    """The StoreError that `error` (or the error it happened in) means, if any: a full
    disk, a read-only file system or missing permissions are told apart from damage
    (checked first: on a full disk SQLite reports a disk I/O error)."""
    found = _sqlite_error(error)
    if found is None:
        return None
    root = shlex.quote(str(path.parent))
    name = getattr(found, "sqlite_errorname", "") or ""
    if space.is_no_space(found):
        return _full(path)
    if isinstance(found, OSError):
        if found.errno == errno.EROFS or found.errno in (errno.EACCES, errno.EPERM):
            return _cannot_write(path, root)
        return None
    if name.startswith(_CANNOT_WRITE):
        return _cannot_write(path, root)
    if not name.startswith(_DAMAGE):
        return None
    if name.startswith("SQLITE_IOERR"):
        if space.nearly_full(path.parent):
            return _full(path)
        if space.read_only(path.parent):
            return _cannot_write(path, root)
    rebuild = (f"`gridrun doctor --rebuild --root {root}` moves it aside and rebuilds the queue "
               "from the run folders")
    if name.startswith("SQLITE_IOERR"):
        return StoreDamaged(
            f"{path} cannot be read ({found}): its {path.name}-wal was probably deleted while "
            f"the engine had it open; if the engine runs, `gridrun engine stop --root {root}` "
            f"writes its copy back, then try again; if it persists, {rebuild}")
    what = "is not a SQLite database" if name == "SQLITE_NOTADB" else "is damaged"
    return StoreDamaged(f"{path} {what} ({found}): the queue cannot be read; {rebuild}")


class _Guard:
    """The store's lock (calls are serialised), which also turns SQLite's errors for
    a damaged, full or unwritable file into one StoreError, wherever they surface: a
    deleted -wal shows only when a query reaches a page it held."""

    def __init__(self, path: Path) -> None:
        self.path, self._lock = path, threading.RLock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, kind: type | None, error: BaseException | None, tb: Any) -> None:
        self._lock.release()
        found = None if error is None or isinstance(error, StoreError) else \
            diagnose(self.path, error)
        if found is not None:
            raise found from error


class Database:
    """A connection to ROOT/gridrun.db (created, 0600 in a 0700 root, on first use),
    in WAL mode at the newest schema, with one short transaction per write.

    `create`: the root may be made (0700, only under a folder that exists);
    without it a missing root raises layout.NoSuchRoot. `create_store=False` is a
    reader's: a missing store is not created (an empty view stands in), and a
    store that cannot be opened for want of space or permissions is read as it
    is on disk when nothing waits in its -wal. A view refuses writes.

    Safe to share between threads of one process (calls are serialised).
    """

    def __init__(self, root: str | os.PathLike, *, timeout: float = 30.0, create: bool = True,
                 create_store: bool = True, name: str = layout.DB_NAME):
        self.root = Path(root)
        # UnsafeRoot: others can write it (with the chmod that fixes it); NoSuchRoot
        layout.check_root(self.root, create=create)
        self.path = self.root / name
        self.view: str | None = None  # why writes are refused, for a reader's view
        self._lock = _Guard(self.path)
        if not self.path.exists() and not create_store:
            self._open_view(":memory:", f"{self.root} has no store yet ({name}): nothing "
                            "was queued there")
            return
        if not self.path.exists():
            try:
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o600))
            except OSError as e:
                raise (diagnose(self.path, e) or e) from e
        with contextlib.suppress(OSError):  # a reader on a read-only file system goes on
            if stat.S_IMODE(os.stat(self.path).st_mode) != 0o600:
                os.chmod(self.path, 0o600)
        try:
            self._open(timeout)
        except (StoreFull, StoreNotWritable) as e:
            if create_store or not self._wal_empty():
                raise
            # a reader on a full disk (or a read-only one): the file holds every committed
            # write when its -wal is empty, and SQLite reads it without its -shm then
            self._open_view(f"file:{quote(str(self.path))}?immutable=1", str(e), uri=True)

    def _open(self, timeout: float) -> None:
        with self._lock:
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

    @classmethod
    def nothing(cls, root: str | os.PathLike, why: str, *, name: str = layout.DB_NAME) -> Database:
        """An empty view of a root that does not exist (the interface's, until a queue
        makes it): nothing is checked or created; writes are refused with `why`."""
        self = cls.__new__(cls)
        self.root = Path(root)
        self.path = self.root / name
        self.view = None
        self._lock = _Guard(self.path)
        self._open_view(":memory:", why)
        return self

    def _wal_empty(self) -> bool:
        try:
            return os.stat(f"{self.path}-wal").st_size == 0
        except FileNotFoundError:
            return True
        except OSError:
            return False

    def _open_view(self, target: str, why: str, *, uri: bool = False) -> None:
        self._db = sqlite3.connect(target, uri=uri, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        try:
            with self._lock:
                if target == ":memory:":
                    self._migrate()
                else:
                    self._db.execute("SELECT 1 FROM runs LIMIT 1").fetchall()
        except BaseException:
            self._db.close()
            raise
        self.view = why

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

    def root_id(self) -> str | None:
        """This root's identity: 16 hex digits drawn at random when its store was made,
        kept for the store's life (a store rebuilt by `doctor --rebuild` draws another).
        None only for a store older than root ids read as it is on disk (a reader's view
        on a full disk): it gets one when it is next opened for writing."""
        with self._lock:
            row = self._db.execute("SELECT value FROM state WHERE key = 'root_id'").fetchone()
        return None if row is None else json.loads(row[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def make_durable(self) -> None:
        """Fold the -wal into the file (a checkpoint that truncates it to nothing)."""
        with self._lock:
            busy = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        if busy:
            raise StoreError(f"{self.path}: its -wal could not be folded into it (another "
                             "process has it open)")

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        if self.view is not None:
            raise StoreNotWritable(f"not written: {self.view}")
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                if self._db.in_transaction:  # a damaged file may have ended it already
                    self._db.execute("ROLLBACK")
                raise
            try:
                self._db.execute("COMMIT")
            except BaseException:
                # a COMMIT that failed (a full disk) may leave the transaction open: end it,
                # or every later BEGIN of this connection would fail
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise

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
