"""One machine-wide ledger of what each gridrun engine placed on each GPU, so that engines
of different users and run roots on one server never commit more than a GPU's memory.

It lives in /dev/shm/gridrun-ledger (tmpfs: cleared at reboot, as the GPUs are), in the
folder GRIDRUN_LEDGER names, or in /tmp/gridrun-ledger on a machine without /dev/shm. Each
engine (each Ledger object: two engines may share a process) keeps one entry,
`UID.PID.TOKEN.json`: its pid and start time, the bytes it committed per GPU, the CPU
threads its runs hold and their pids. Why that is safe on a shared machine:

- The folder is sticky (1777): no one but the folder's owner can replace or remove
  another's entry. Whoever comes first creates it, so an admin who wants no user to own
  it creates it as root at boot (tmpfiles.d: `d /dev/shm/gridrun-ledger 1777 root root`).
  A symlink, or a folder without the sticky bit, is refused, and `problem` says in one
  line that this engine does not coordinate.
- Entries are numbers and pids only, read without following links or blocking on a FIFO,
  at most MAX_ENTRY bytes, from files owned by the uid their name says. Anything else is
  ignored, never an error.
- An entry lives while its engine does (pid and start time) or while one of its runs
  does (their engine was killed, they go on): each of those processes must belong to
  the entry's owner, so an entry cannot borrow a stranger's process to stay alive. A
  dead entry is ignored, and removed when it is ours (or we are root).
- The lock is a flock on the folder itself (nothing to unlink or replace) with a short
  bounded wait; one held longer (a stuck engine, or a user holding it on purpose) is
  gone around: `held` yields False, `busy` says so, and the engine places without it
  (tried again without waiting until it is had) rather than stall.

Pids mean this machine's PID namespace: containers that share /dev/shm but not their
PIDs need a GRIDRUN_LEDGER each.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import re
import secrets
import stat
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from gridrun.engine.backends.child import alive, process_start_time

DEFAULT = "/dev/shm/gridrun-ledger"
ENV = "GRIDRUN_LEDGER"
MAX_ENTRY = 64 << 10  # bytes; a bigger entry is ignored
ENTRY_NAME = re.compile(r"(?P<uid>\d{1,10})\.(?P<pid>\d{1,10})\.[0-9a-f]{1,64}\.json")
MAX_GPU_BYTES, MAX_THREADS, MAX_PIDS, MAX_GPUS, MAX_KEY = 1 << 50, 1 << 20, 4096, 1024, 128
PID_LIMIT = 1 << 22  # Linux's PID_MAX_LIMIT
FIX = "ask the admin to remove it, or set GRIDRUN_LEDGER to another folder"
READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # no link, no FIFO wait
CREATE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_WRONLY | os.O_CLOEXEC

log = logging.getLogger("gridrun.engine")


class _Unusable(Exception):
    """What is wrong with the folder and what to do, after "the GPU ledger FOLDER"."""


@dataclass(frozen=True)
class Entry:
    uid: int  # the file's owner (st_uid), never what the file says
    pid: int
    start_time: float
    gpus: dict[str, int]  # GPU key ("GPU-<uuid>" or "index:N") -> bytes committed there
    threads: int
    pids: tuple[int, ...]  # its runs' pids: not foreign processes


def default_folder() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    return Path(DEFAULT) if os.path.isdir("/dev/shm") else Path("/tmp/gridrun-ledger")


class Ledger:
    """This engine's entry and its view of the others'. Raises nothing on the
    filesystem's account."""

    def __init__(self, folder: str | os.PathLike | None = None, *, wait: float = 0.5) -> None:
        self.folder = Path(folder) if folder is not None else default_folder()
        self.wait = wait
        self.problem: str | None = None
        self.busy: str | None = None  # the lock was not had the last time: why, in one line
        self.ignored = 0  # malformed entries the last others() passed over
        self._uid, self._pid = os.geteuid(), os.getpid()
        self._start_time = process_start_time(self._pid)
        self._name = f"{self._uid}.{self._pid}.{secrets.token_hex(8)}.json"
        self._warned: set[str] = set()
        self._fds: list[int] = []
        weakref.finalize(self, _close_all, self._fds)
        try:
            if not self._start_time:  # psutil fails here: every entry would look stale
                raise _Unusable("is not used: this process's start time cannot be read")
            self._dir = self._open_folder()
        except (_Unusable, OSError) as e:
            why = e if isinstance(e, _Unusable) else f"cannot be used: {e.strerror or e}; {FIX}"
            self.problem = f"the GPU ledger {self.folder} {why}"
            _close_all(self._fds)

    @contextlib.contextmanager
    def held(self) -> Iterator[bool]:
        """The ledger to ourselves, across processes and Ledger objects (True), or not
        had in time (False: `busy` says why; placing goes on without it). Not reentrant."""
        if self.problem or not self._lock():
            yield False  # uncoordinated rather than stuck
            return
        try:
            yield True
        finally:
            fcntl.flock(self._dir, fcntl.LOCK_UN)

    def others(self) -> list[Entry]:
        """The live entries of other engines (another Ledger in this process included);
        stale ones we may remove are removed."""
        if self.problem:
            return []
        try:
            names = sorted(os.listdir(self._dir))
        except OSError as e:
            self._warn(f"the GPU ledger {self.folder} cannot be read: {e.strerror}")
            return []
        found: list[Entry] = []
        self.ignored = 0
        for name in names:
            match = ENTRY_NAME.fullmatch(name)
            if match is None or name == self._name:
                continue
            entry = self._read(name, int(match["uid"]), int(match["pid"]))
            if entry is None:
                self.ignored += 1
            elif living(entry):
                found.append(entry)
            elif self._uid in (entry.uid, 0):
                with contextlib.suppress(OSError):  # another engine may have beaten us to it
                    os.unlink(name, dir_fd=self._dir)
        if self.ignored:
            log.debug("GPU ledger %s: ignored %d malformed entries", self.folder, self.ignored)
        return found

    def write(self, gpus: Mapping[str, int], threads: int, pids: Iterable[int]) -> bool:
        """Replace our entry at once: a reader sees the old one or the new one. False when
        it could not be written (the caller tries again)."""
        if self.problem:
            return True
        record = {"pid": self._pid, "start_time": self._start_time,
                  "gpus": {str(k): int(v) for k, v in gpus.items()},
                  "threads": int(threads), "pids": sorted({int(p) for p in pids})}
        temporary = f".{self._name}.{secrets.token_hex(4)}.tmp"
        try:
            with os.fdopen(os.open(temporary, CREATE, 0o644, dir_fd=self._dir), "wb") as f:
                os.fchmod(f.fileno(), 0o644)  # an engine's umask is private; others must read it
                f.write(json.dumps(record).encode())
            os.rename(temporary, self._name, src_dir_fd=self._dir, dst_dir_fd=self._dir)
            return True
        except OSError as e:
            self._warn(f"the GPU ledger {self.folder} cannot be written: {e.strerror}")
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=self._dir)
            return False

    def close(self) -> None:
        """Remove our entry: others no longer count what we placed."""
        if self.problem:
            return
        try:
            os.unlink(self._name, dir_fd=self._dir)
        except OSError as e:
            if not isinstance(e, FileNotFoundError):
                self._warn(f"the GPU ledger entry {self.folder / self._name} stays: {e.strerror}")

    def _open_folder(self) -> int:
        try:
            os.mkdir(self.folder, 0o1777)
            created = True
        except FileExistsError:
            created = False
        except FileNotFoundError:
            raise _Unusable("cannot be created: its parent folder does not exist; create it, "
                            "or set GRIDRUN_LEDGER to another folder") from None
        if not stat.S_ISDIR(os.lstat(self.folder).st_mode):
            kind = "a symlink" if self.folder.is_symlink() else "not a directory"
            raise _Unusable(f"is not safe to use: it is {kind}; {FIX}")
        fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self._fds.append(fd)  # what is checked from here on is what we opened
        if created:
            os.fchmod(fd, 0o1777)  # mkdir's mode went through the umask
        st = os.fstat(fd)
        if not st.st_mode & stat.S_ISVTX:
            raise _Unusable("is not safe to use: it lacks the sticky bit (anyone could replace "
                            f"another's entry); {FIX}")
        if not os.access(self.folder, os.W_OK | os.X_OK):
            raise _Unusable(f"cannot be used: this user cannot write in it; {FIX}")
        return fd

    def _lock(self) -> bool:
        # after a wait that timed out, one try without waiting until the lock is had again:
        # a lock held on purpose must not slow every step of the engine
        deadline = time.monotonic() + (0 if self.busy else self.wait)
        while True:
            try:
                fcntl.flock(self._dir, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.busy = None
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self.busy = (f"the GPU ledger {self.folder} is locked by another process for "
                                 f"more than {self.wait:g} s: runs are placed without its lock "
                                 "(another engine placing at the same moment could overcommit)")
                    return False
                time.sleep(0.01)
            except OSError as e:  # a filesystem without flock
                self.problem = f"the GPU ledger {self.folder} cannot be locked: {e.strerror}; {FIX}"
                log.warning("%s", self.problem)
                return False

    def _read(self, name: str, uid: int, pid: int) -> Entry | None:
        try:
            fd = os.open(name, READ, dir_fd=self._dir)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_size > MAX_ENTRY:
                return None
            data = os.read(fd, MAX_ENTRY + 1)
            entry = _entry(json.loads(data), uid)
        except (OSError, ValueError, RecursionError):  # RecursionError: "[[[[..." nested deep
            return None
        finally:
            os.close(fd)
        return entry if entry is not None and entry.pid == pid else None

    def _warn(self, message: str) -> None:
        # once per message: the scheduler asks every few seconds
        (log.debug if message in self._warned else log.warning)("%s", message)
        self._warned.add(message)


def living(entry: Entry) -> bool:
    """Whether the entry's engine, or one of its runs, still runs as the entry's owner."""
    if owned_by(entry.pid, entry.uid) and alive(entry.pid, entry.start_time) is not None:
        return True
    return any(owned_by(pid, entry.uid) for pid in entry.pids)


def owned_by(pid: int, uid: int) -> bool:
    """Whether `pid` is a live process (not a zombie) whose real or effective uid is `uid`."""
    try:
        import psutil

        proc = psutil.Process(pid)
        return uid in proc.uids()[:2] and proc.status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


def _entry(record: object, uid: int) -> Entry | None:
    """The entry a parsed file holds, or None when a field has the wrong type or size."""
    if not isinstance(record, dict):
        return None
    pid, start, gpus, threads, pids = map(record.get, ("pid", "start_time", "gpus", "threads", "pids"))
    if not (_count(pid, PID_LIMIT) and pid > 0 and _count(threads, MAX_THREADS)):
        return None
    if type(start) not in (int, float) or not (math.isfinite(start) and 0 < start < 1e12):
        return None
    if not (isinstance(gpus, dict) and len(gpus) <= MAX_GPUS and all(
            0 < len(k) <= MAX_KEY and k.isprintable() and _count(v, MAX_GPU_BYTES)
            for k, v in gpus.items())):
        return None
    if not (isinstance(pids, list) and len(pids) <= MAX_PIDS
            and all(_count(p, PID_LIMIT) and p > 0 for p in pids)):
        return None
    return Entry(uid, pid, float(start), dict(gpus), threads, tuple(pids))


def _count(value: object, limit: int) -> bool:
    return type(value) is int and 0 <= value <= limit


def _close_all(fds: list[int]) -> None:
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.pop())
