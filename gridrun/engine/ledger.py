"""One machine-wide ledger of what each gridrun engine placed on each GPU, so that engines
of different users and run roots on one server never commit more than a GPU's memory.

It lives in /dev/shm/gridrun-ledger (tmpfs: cleared at reboot, as the GPUs are), in the
folder GRIDRUN_LEDGER names, or in /tmp/gridrun-ledger on a machine without /dev/shm. Each
engine (each Ledger object: two engines may share a process) keeps one entry,
`UID.PID.TOKEN.json`: its pid and start time, the bytes it committed per GPU, the CPU
threads its runs hold and their pids. It is a boundary between users, so:

- NVML is the truth and an entry only adds: what entries commit is counted on top of
  what NVML says is used, never instead of it (engine/sharing.py), and a process is
  another engine's run only when verifiably so (engine/entries.py).
- The folder is sticky (1777): no one but the folder's owner can replace or remove
  another's entry. Whoever comes first creates it, so an admin who wants no user to own
  it creates it as root at boot (tmpfiles.d: `d /dev/shm/gridrun-ledger 1777 root root`).
  A symlink, or a folder without the sticky bit, is refused (`problem`). The folder's
  owner may still remove entries: each engine looks at its own every tick (`intact`)
  and writes it again, and says whose folder it is.
- Fail closed: an engine whose entry cannot be written (a full file system, a folder it
  may not write in) or whose folder cannot be read knows nothing safe about the GPUs'
  memory: `blocked` says why in one line (which file system, how full, whose folder) and
  what to do, and the engine starts no GPU run until it clears.
- Entries are read as other users' files (engine/entries.py): bounded in size, in
  number per owner, and cached while unchanged.
- The lock is a flock on the folder itself (nothing to unlink or replace) with a short
  bounded wait; one held longer (a stuck engine, or a user holding it on purpose) is
  gone around: `held` yields False, `busy` says so, and the engine places without it
  (tried again without waiting until it is had) rather than stall.

Pids mean this machine's PID namespace: containers that share /dev/shm but not their
PIDs need a GRIDRUN_LEDGER each.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import stat
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from gridrun.engine.backends.child import process_start_time
from gridrun.engine.entries import MAX_ENTRY, PER_OWNER, Entry, Reader, user_name  # noqa: F401

DEFAULT = "/dev/shm/gridrun-ledger"
ENV = "GRIDRUN_LEDGER"
FIX = "ask the admin to remove it, or set GRIDRUN_LEDGER to another folder"
ADMIN = "an admin can create it as root at boot (tmpfiles.d: d {folder} 1777 root root)"
CREATE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_WRONLY | os.O_CLOEXEC

log = logging.getLogger("gridrun.engine")


class _Unusable(Exception):
    """What is wrong with the folder and what to do, after "the GPU ledger FOLDER"."""


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
        self.problem: str | None = None  # the folder cannot be used at all
        self.busy: str | None = None  # the lock was not had the last time: why, in one line
        self.unwritten: str | None = None  # our entry could not be written the last time
        self.unread: str | None = None  # the folder could not be listed the last time
        self.removed: str | None = None  # someone removed or changed our entry: whose folder
        self._uid, self._pid = os.geteuid(), os.getpid()
        self._start_time = process_start_time(self._pid)
        self._name = f"{self._uid}.{self._pid}.{secrets.token_hex(8)}.json"
        self._written: tuple[int, ...] | None = None  # our entry's file as we left it
        self._reader = Reader()
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

    # ---- what others wrote ---------------------------------------------------------------

    @property
    def ignored(self) -> int:
        """Malformed entries the last pass passed over."""
        return self._reader.ignored

    @property
    def opened(self) -> int:
        """Entry files the last pass read (the unchanged ones are cached)."""
        return self._reader.opened

    @property
    def passed_over(self) -> dict[int, int]:
        """uid -> that user's entries beyond entries.PER_OWNER, never read."""
        return self._reader.passed_over

    def others(self, max_age: float = 0.0) -> list[Entry]:
        """The live entries of other engines (another Ledger in this process included);
        stale ones we may remove are removed. `max_age`: seconds a pass's verdict on
        which engines live may serve (new and rewritten entries are always read)."""
        if self.problem:
            return []
        try:
            found = self._reader.read(self._dir, str(self.folder), self._name, self._uid, max_age)
        except OSError as e:
            self.unread = (f"the GPU ledger {self.folder} cannot be read ({e.strerror}): what "
                           "other engines commit is unknown")
            self._warn(self.unread)
            return []
        self.unread = None
        if self.ignored:
            log.debug("GPU ledger %s: ignored %d malformed entries", self.folder, self.ignored)
        return found

    def notes(self) -> list[str]:
        """Lines for `engine status`: owners whose entries were passed over."""
        return [f"the GPU ledger {self.folder} holds {n + PER_OWNER} entries of "
                f"{user_name(uid)}: only the first {PER_OWNER} are read"
                for uid, n in sorted(self.passed_over.items())]

    # ---- our entry -------------------------------------------------------------------------

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

    def write(self, gpus: Mapping[str, int], threads: int, pids: Iterable[int]) -> bool:
        """Replace our entry at once: a reader sees the old one or the new one. False when
        it could not be written (`blocked` says why; the caller tries again)."""
        if self.problem:
            return False
        record = {"pid": self._pid, "start_time": self._start_time,
                  "gpus": {str(k): int(v) for k, v in gpus.items()},
                  "threads": int(threads), "pids": sorted({int(p) for p in pids})}
        temporary = f".{self._name}.{secrets.token_hex(4)}.tmp"
        try:
            with os.fdopen(os.open(temporary, CREATE, 0o644, dir_fd=self._dir), "wb") as f:
                os.fchmod(f.fileno(), 0o644)  # an engine's umask is private; others must read it
                f.write(json.dumps(record).encode())
                f.flush()
                written = _identity(os.fstat(f.fileno()))
            os.rename(temporary, self._name, src_dir_fd=self._dir, dst_dir_fd=self._dir)
        except OSError as e:
            self.unwritten = f"the GPU ledger {self.folder} cannot be written ({e.strerror})"
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                self.unwritten += f": {self.where()}; free space there (anyone can fill it: ask " \
                                  "the admin to find what does)"
            elif e.errno == errno.ENOENT:
                self.unwritten += ": the folder was removed; it is made again at the next step"
            else:
                self.unwritten += f": {self.whose()}"
            self._warn(self.unwritten)
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=self._dir)
            return False
        self._written, self.unwritten = written, None
        return True

    def intact(self) -> bool:
        """Whether our entry is in the folder as we last wrote it (False: write it again).
        The folder's owner may remove or replace it; a folder replaced under us is opened
        again (and checked again) where it now is."""
        if self.problem or self._written is None:
            return False
        try:
            now = os.lstat(self.folder)
        except OSError:
            now = None
        held = os.fstat(self._dir)
        if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            self._reopen()
            return False
        try:
            st = os.stat(self._name, dir_fd=self._dir, follow_symlinks=False)
        except OSError:
            st = None
        if st is not None and _identity(st) == self._written:
            return True
        self.removed = (f"this engine's entry in the GPU ledger was removed or changed by "
                        f"someone else and has been written again: {self.whose()}")
        self._warn(self.removed)
        return False

    @property
    def blocked(self) -> str | None:
        """Why this engine cannot coordinate its GPUs with other engines now, with what to
        do, in one line; None when it can. The engine then starts no GPU run."""
        if self.problem:
            return f"{self.problem}; no run starts on a GPU until then"
        if self.unread:
            return f"{self.unread}; no run starts on a GPU until it can be read: {self.whose()}"
        if self.unwritten:
            return f"{self.unwritten}; no run starts on a GPU until this engine's entry is written"
        return None

    def where(self) -> str:
        """`its file system (tmpfs at /dev/shm) is 100% used, 0 bytes free of 1.0 MB`."""
        return filesystem(self._dir if not self.problem else None, self.folder)

    def whose(self) -> str:
        """Who owns the folder, and what that means, in a few words."""
        try:
            uid = os.fstat(self._dir).st_uid if not self.problem else os.lstat(self.folder).st_uid
        except OSError:
            return FIX
        if uid in (0, self._uid):
            return f"the GPU ledger {self.folder} belongs to {user_name(uid)}"
        return (f"the GPU ledger {self.folder} belongs to {user_name(uid)} (uid {uid}), who may "
                f"remove or change any entry in it; {ADMIN.format(folder=self.folder)}")

    def close(self) -> None:
        """Remove our entry: others no longer count what we placed."""
        if self.problem:
            return
        try:
            os.unlink(self._name, dir_fd=self._dir)
        except OSError as e:
            if not isinstance(e, FileNotFoundError):
                self._warn(f"the GPU ledger entry {self.folder / self._name} stays: {e.strerror}")

    # ---- the folder and its lock -------------------------------------------------------------

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

    def _reopen(self) -> None:
        """The folder at our path is not the one we hold (removed, made again or replaced):
        use the new one if it is safe, else say why (the engine then places no GPU run)."""
        old = self._dir
        try:
            self._dir = self._open_folder()
        except (_Unusable, OSError) as e:
            why = e if isinstance(e, _Unusable) else f"cannot be used: {e.strerror or e}; {FIX}"
            self.problem = f"the GPU ledger {self.folder} was replaced and {why}"
            self._warn(self.problem)
            return
        self._fds.remove(old)
        os.close(old)
        self._reader, self._written = Reader(), None

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

    def _warn(self, message: str) -> None:
        # once per message: the scheduler asks every few seconds
        (log.debug if message in self._warned else log.warning)("%s", message)
        self._warned.add(message)


def filesystem(fd: int | None, folder: Path) -> str:
    """The file system holding `folder` (open at `fd`, else looked up by path) and how
    full it is, for a line: `its file system (tmpfs at /dev/shm) is 100% used, ...`."""
    from gridrun.runs.space import human

    try:
        st = os.statvfs(fd if fd is not None else folder)
    except OSError:
        return "its file system cannot be looked at"
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    used = 100 - (100 * st.f_bfree // st.f_blocks) if st.f_blocks else 100
    inodes = "; no inode is left" if st.f_files and not st.f_favail else ""
    return f"its file system ({mount_of(folder)}) is {used}% used, {human(free)} free of {human(size)}{inodes}"


def mount_of(path: Path) -> str:
    """`tmpfs at /dev/shm`: the type and mount point of the file system holding `path`."""
    real, best = os.path.realpath(path), ("?", "/")
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields, _, rest = line.partition(" - ")
                parts = fields.split()
                if len(parts) < 5 or not rest:
                    continue
                point = parts[4].replace("\\040", " ")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best[1]):
                    best = (rest.split()[0], point)
    except OSError:
        pass
    return f"{best[0]} at {best[1]}"


def _identity(st: os.stat_result) -> tuple[int, ...]:
    # a rename keeps all of these (it changes ctime); a rewrite in place changes mtime
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _close_all(fds: list[int]) -> None:
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.pop())
