"""Reading a file under a run folder without following a link.

Whoever can write in a run folder could otherwise make another user's gridrun
read and print any file that user can read (`output.log -> /etc/shadow`). So
a reader opens ROOT/EXPERIMENT/RUN/NAME one component at a time from a
descriptor of the root: the experiment folder, the run folder and the file
with O_NOFOLLOW (the root itself may be a link), the file with O_NONBLOCK so
that a FIFO never blocks, and only a regular file is read. What is refused
raises layout.UnsafePath, one line that says what the path is; a missing file
raises FileNotFoundError as `open` does.

The writers' side (making folders, refusing other users' files) is layout.py's.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path

from gridrun.runs.layout import UnsafePath

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def what_is_wrong(path: Path, st: os.stat_result, *, folder: bool) -> str | None:
    """Why a reader does not read `path` (whose lstat is `st`): a link, or not the
    kind of thing it should be. None when it is fine."""
    if stat.S_ISLNK(st.st_mode):
        return (f"{path} is a symbolic link: gridrun never follows a link inside its root, "
                f"so it was not read (remove it: rm {path})")
    if folder and not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder (something else is in the way): not read; move it away"
    if not folder and not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file: not read; move it away"
    return None


def _refused(path: Path, dir_fd: int, error: OSError, *, folder: bool) -> BaseException:
    if error.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
        return error
    try:
        st = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return error
    found = what_is_wrong(path, st, folder=folder)
    return UnsafePath(found) if found else error


def open_folder(folder: str | os.PathLike, *, folders: int = 2) -> int:
    """A descriptor of `folder` itself: it and the `folders - 1` folders above it (a run
    folder and its experiment folder) opened without following a link, from the one
    above them (the root, which may be a link)."""
    folder = Path(os.path.abspath(folder))
    dirs: list[Path] = []
    top = folder
    while len(dirs) < folders and top.parent != top:
        dirs.insert(0, top)
        top = top.parent
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for d in dirs:
            try:
                inner = os.open(d.name, _DIR, dir_fd=fd)
            except OSError as e:
                raise _refused(d, fd, e, folder=True) from None
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_fd(path: str | os.PathLike, *, folders: int = 2) -> int:
    """A descriptor of `path` for reading: its last `folders` folders (a run folder and
    its experiment folder) and the file itself opened without following a link."""
    path = Path(os.path.abspath(path))
    fd = open_folder(path.parent, folders=folders) if folders else \
        os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            file_fd = os.open(path.name, _FILE, dir_fd=fd)
        except OSError as e:
            raise _refused(path, fd, e, folder=False) from None
    finally:
        os.close(fd)
    st = os.fstat(file_fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(file_fd)
        raise UnsafePath(what_is_wrong(path, st, folder=False))
    os.set_blocking(file_fd, True)
    return file_fd


def open_file(path: str | os.PathLike, *, folders: int = 2) -> io.BufferedReader:
    """`open(path, "rb")`, without following a link (see `open_fd`)."""
    return os.fdopen(open_fd(path, folders=folders), "rb")


def read_bytes(path: str | os.PathLike, *, folders: int = 2, limit: int | None = None) -> bytes:
    """The bytes of `path` (at most `limit`), read without following a link."""
    with open_file(path, folders=folders) as f:
        return f.read() if limit is None else f.read(limit)


def is_dir(path: str | os.PathLike) -> bool:
    """A real folder (not a link to one)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
