"""The files gridrun writes and reads on a user's request, outside its runs root:
`export-model -o`, `repro -o`, `pack -o`, `export -o`, `tensorboard --logdir`;
pack sources, packed files, `predict`'s inputs, an export's `model.json` and what
it names. One rule each way, so a new command cannot forget one of its parts.

Writing (`atomic_write`): an existing target is replaced only with `force`; a
symbolic link is never written through nor replaced, a folder never replaced;
nothing is written into a system folder (`/etc`, `/usr`, `/proc`, ...). The bytes
go to a temporary file in the target's folder, fsynced, then renamed onto the
target: a failure at any point (a full disk, a kill) leaves the old file whole
and at most a hidden `.NAME.*.tmp` beside it. A full disk, a quota, a read-only
file system or a permission refused becomes one line (`RefusedFile`).

Reading (`open_regular`, `read_regular`): regular files only. The file is opened
non-blocking, so a FIFO never hangs the reader, then checked on its descriptor: a
FIFO, a device, a socket or a folder is refused in one line that says what it is;
with `limit`, so is a file larger than what the reader can sensibly hold.

The bottom of the stack: imports nothing of gridrun (`data` uses it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

# Never written into: the system's own trees (a path's real folder at or under one).
SYSTEM_TREES = ("/proc", "/sys", "/dev", "/etc", "/boot", "/usr", "/bin", "/sbin", "/lib",
                "/lib32", "/lib64", "/libx32")

_WRITE_ERRORS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}


class RefusedFile(Exception):
    """A file gridrun will not write or read as asked; str() is one line with what to do."""


class TargetExists(RefusedFile, FileExistsError):
    """The target exists and `force` was not given."""


def kind_of(mode: int) -> str:
    """What a non-regular file is, in a word or two."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def system_tree(path: str | os.PathLike) -> str | None:
    """The system tree `path` (resolved) lies in, or None."""
    real = os.path.realpath(path)
    for tree in SYSTEM_TREES:
        if real == tree or real.startswith(tree + "/"):
            return tree
    return "/" if os.path.dirname(real) == "/" else None


def write_error(error: OSError) -> str:
    """What an OSError met while writing means, in a few words ("the disk is full")."""
    return _WRITE_ERRORS.get(error.errno or 0) or (error.strerror or str(error))


def why_not_written(error: OSError, out: str | os.PathLike) -> str:
    """One line for an OSError met while writing `out`."""
    return (f"cannot write {out}: {write_error(error)}; nothing was changed there "
            "(free space or pick another -o)")


def check_target(out: str | os.PathLike, *, force: bool = False) -> Path:
    """`out`, if it may be written: not a link (even with `force`), not a folder or
    anything but a regular file, not in a system folder, an existing file only with
    `force`, its folder existing."""
    out = Path(out)
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise RefusedFile(f"refusing to write {out}: it is a symbolic link (gridrun never "
                          "writes through one); name the file itself")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise RefusedFile(f"refusing to write {out}: it is {kind_of(st.st_mode)}")
    tree = system_tree(out)  # the file itself: /tmp/x is fine, /x and /etc/x are not
    if tree is not None:
        raise RefusedFile(f"refusing to write {out}: it is in the system folder {tree}; "
                          "write into a folder of your own")
    if st is not None and not force:
        raise TargetExists(f"{out} exists; add --force to replace it")
    if not out.parent.is_dir():
        raise RefusedFile(f"cannot write {out}: its folder {out.parent} does not exist")
    return out


@contextlib.contextmanager
def atomic_write(out: str | os.PathLike, *, force: bool = False,
                 binary: bool = True) -> Iterator[IO[Any]]:
    """A file to write into; on success it becomes `out` (fsynced, renamed, the folder
    fsynced); on any failure or interruption it is removed and `out` is as it was."""
    out = check_target(out, force=force)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    except OSError as e:
        raise RefusedFile(why_not_written(e, out)) from None
    try:
        try:
            with os.fdopen(fd, "wb" if binary else "w",
                           **({} if binary else {"encoding": "utf-8", "newline": ""})) as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            check_target(out, force=force)  # again: the target may have appeared meanwhile
            _move(tmp, out, force)
        except OSError as e:
            if isinstance(e, TargetExists):
                raise
            raise RefusedFile(why_not_written(e, out)) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _move(tmp: str, out: Path, force: bool) -> None:
    if force:
        os.replace(tmp, out)  # replaces the file itself (check_target refused a link)
    else:
        try:
            os.link(tmp, out)  # fails if out exists: no check-then-write race
        except FileExistsError:
            raise TargetExists(f"{out} exists; add --force to replace it") from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            os.replace(tmp, out)  # a file system without hard links
        else:
            os.unlink(tmp)
    with contextlib.suppress(OSError):
        dir_fd = os.open(out.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def open_regular(path: str | os.PathLike, *, limit: int | None = None,
                 what: str = "file") -> IO[bytes]:
    """`open(path, "rb")` for a regular file only: opened non-blocking (a FIFO never
    hangs), then checked on the descriptor; with `limit`, at most that many bytes.
    FileNotFoundError as `open` raises it; anything else refused is RefusedFile."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise RefusedFile(f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RefusedFile(f"{what} {path} is {kind_of(st.st_mode)}, not a regular file: "
                              "not read")
        if limit is not None and st.st_size > limit:
            raise RefusedFile(f"{what} {path} is {_size(st.st_size)}, more than the "
                              f"{_size(limit)} gridrun reads there: not read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, *, limit: int | None = None,
                 what: str = "file") -> bytes:
    """The bytes of a regular file (see `open_regular`)."""
    with open_regular(path, limit=limit, what=what) as f:
        if limit is None:
            data = f.read()
        else:  # in pieces: f.read(limit + 1) would allocate the whole limit up front
            parts, left = [], limit + 1
            while left > 0 and (part := f.read(min(left, 1 << 20))):
                parts.append(part)
                left -= len(part)
            data = b"".join(parts)
    if limit is not None and len(data) > limit:  # it grew after the check
        raise RefusedFile(f"{what} {path} is more than the {_size(limit)} gridrun reads there: "
                          "not read")
    return data


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
