"""A full disk: how gridrun recognises it and what it calls it.

A full disk is a state, not a fault: the engine waits for space and resumes
by itself, a run that cannot write pauses (it returns to the queue and resumes
from its last good checkpoint), and a command says "the disk is full" instead
of blaming the store. Every writer asks `is_no_space` of what it caught; the
worker asks `hit()` whether one of its own writes failed so (`NoSpace`).

Standard library only: a run's process (backends/child.py) imports it.
"""

from __future__ import annotations

import errno
import os

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
NEARLY_FULL = 1 << 20  # bytes: less free than this and a failed write is put down to space
RESUME_MARGIN = 8 << 20  # bytes free before the engine launches again after waiting

_hit: list[str] = []  # what this process could not write for want of space


class NoSpace(OSError):
    """A write that failed because the disk (or the user's quota) is full. str() is
    one line: what could not be written and how much space is left."""

    def __init__(self, path: str | os.PathLike, cause: BaseException | None = None):
        self.path = os.fspath(path)
        free = free_bytes(os.path.dirname(self.path) or ".")
        left = f" ({human(free)} free)" if free is not None else ""
        super().__init__(errno.ENOSPC, f"no space left on the device to write {self.path}{left}")
        _hit.append(self.path)
        self.__cause__ = cause

    def __str__(self) -> str:
        return self.strerror or "no space left on the device"


def hit() -> str | None:
    """The first path this process could not write for want of space, if any."""
    return _hit[0] if _hit else None


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes this user may still write on the file system holding `path` (None if unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail  # root may use the reserve
    return blocks * st.f_frsize


def nearly_full(path: str | os.PathLike, margin: int = NEARLY_FULL) -> bool:
    free = free_bytes(path)
    return free is not None and free < margin


def read_only(path: str | os.PathLike) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def is_no_space(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from or during, says the disk is full:
    ENOSPC or EDQUOT, or SQLite's SQLITE_FULL ("database or disk is full")."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, OSError) and error.errno in NO_SPACE_ERRNOS:
            return True
        name = getattr(error, "sqlite_errorname", "") or ""
        if name == "SQLITE_FULL" or "database or disk is full" in str(error):
            return True
        if type(error).__name__ == "StoreFull":  # store_db's, without importing it here
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def mentions_no_space(text: str | None) -> bool:
    """Whether an error's text (a summary's, written by another process) says the disk was full."""
    if not text:
        return False
    return any(s in text for s in ("[Errno 28]", "[Errno 122]", "No space left on device",
                                   "Disk quota exceeded", "database or disk is full",
                                   "no space left on the device"))


def human(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"
