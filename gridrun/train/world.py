"""Where a process stands among its run's devices (`World`), and how the ranks meet.

The loop's modules read the `World`; starting and watching the ranks is ranks.py's.

The ranks meet through torch's FileStore: an append-only file of (length, key,
length, value) records that every rank reads again and again. Bytes that are no
record make every reader spin at full CPU for good (a length past the file's end
is read forever), holding the GIL inside the store's own calls (issue 45: 14.5
minutes at 98% CPU, the collective timeout never reached). So rank 0 makes a fresh
file each launch (O_EXCL, 0600, never through a link) in the private run folder
before any other process knows its name, each rank opens it once without
following a link and its store reopens that very file (/proc/self/fd/N) whatever
is later put at the name, and rank 0's watcher reads it as the store's format
(`read_rendezvous`): which ranks have arrived, and bytes that no rank wrote.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import secrets
import stat
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridrun.runs.states import EXIT_RANK_DIED

COLLECTIVE_TIMEOUT_S = 600.0  # a rank alive but stuck; ranks.py sees a dead, absent or stopped one sooner
RENDEZVOUS = ".gridrun-rendezvous-"  # + rank 0's pid and a random name: a new file each launch
ARRIVED = "gridrun/arrived/"  # + rank: the key each rank sets once its store is open
# c10d's records are addresses and ids of a few hundred bytes; a longer one is garbage
# (and one read from garbage is a length of gigabytes that readers wait on forever)
MAX_RECORD = 1 << 20
MAX_FILE = 64 << 20  # far past what any number of ranks writes: read no more of it
# what gloo and NCCL say when a peer's process is gone
PEER_GONE = ("gloo", "NCCL", "Connection closed by peer", "Connection reset by peer")


@dataclass(frozen=True)
class World:
    """Where this process stands in its run: rank `rank` of `size`, summing gradients
    the `reduce` way ("ddp" or "invariant"). One device: rank 0 of 1."""

    rank: int = 0
    size: int = 1
    reduce: str = "ddp"
    group: Any = field(default=None, compare=False)  # the torch.distributed group, when size > 1

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def invariant(self) -> bool:
        return self.reduce == "invariant"


SINGLE = World()


def join(rank: int, size: int, reduce: str, store: Any, cuda: bool) -> World:
    """This process's place in the run's process group (gloo on the CPU, NCCL on GPUs),
    met through `store` (`open_store`)."""
    import torch.distributed as dist

    if size == 1:
        return World(reduce=reduce)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    return World(rank=rank, size=size, reduce=reduce, group=dist.group.WORLD)


def leave(world: World) -> None:
    if world.size > 1:
        import torch.distributed as dist

        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def which_died() -> str | None:
    """Rank 0's account of the rank that died, "rank 1 of 2 died (signal 9)": ranks.Gang
    puts its own in place of this one, which knows nothing."""
    return None


# called with the one line before this process ends for a dead rank (`gridrun train`
# records its foreground run's end there: nothing after os._exit would)
before_exit: list[Callable[[str], None]] = []


def rank_died(who: str) -> None:
    """The run stops here, as a process that died: never a failure of its own."""
    line = f"{who}: the run stops and resumes from its last checkpoint"
    print(line, file=sys.stderr, flush=True)
    for hook in before_exit:
        with contextlib.suppress(Exception):
            hook(line)
    os._exit(EXIT_RANK_DIED)


def collective_failed(world: World, exc: BaseException) -> None:
    """A collective raised (a peer's socket closed, a timeout): a rank is gone. Nothing
    is written: the last checkpoint stays the run's."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    print(f"rank {world.rank}: a collective failed: {type(exc).__name__}: {first}",
          file=sys.stderr, flush=True)
    rank_died(which_died() or "another rank is gone")


def peer_gone(exc: BaseException) -> bool:
    """Whether `exc` is a collective that failed (another rank is gone)."""
    import torch.distributed as dist

    return isinstance(exc, dist.DistError) or any(s in str(exc) for s in PEER_GONE)


# ---- the rendezvous file ---------------------------------------------------------------


class RendezvousRefused(Exception):
    """A rendezvous file this rank will not use; str() says why in a few words."""


@dataclass(frozen=True)
class Rendezvous:
    """The file one launch's ranks meet through, as rank 0 made it."""

    path: Path
    ident: tuple[int, int]  # (device, inode): a file put at the name later is another one


@dataclass(frozen=True)
class Reading:
    """What the rendezvous file holds now: the ranks that have arrived, and what in it
    no rank wrote (None: nothing)."""

    arrived: frozenset[int] = frozenset()
    problem: str | None = None


_held: list[int] = []  # each store reopens its file through one of these: open for good


def make_rendezvous(run_dir: Path) -> Rendezvous:
    """A new, empty rendezvous file in the run folder, this user's alone; an earlier
    launch's (a killed one leaves it) removed first."""
    for stale in run_dir.glob(RENDEZVOUS + "*"):
        with contextlib.suppress(OSError):
            stale.unlink()  # a link is removed, never followed
    path = run_dir / f"{RENDEZVOUS}{os.getpid()}-{secrets.token_hex(8)}"
    # O_EXCL: never a file or a link someone put there first
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return Rendezvous(path, (st.st_dev, st.st_ino))


def open_store(path: Path, size: int, rank: int) -> Any:
    """This rank's torch store on the rendezvous file, its arrival recorded in it. The file
    is opened once, refused if it is a link, not a regular file or not this user's; on
    Linux the store reopens that very file through the descriptor (/proc/self/fd/N), so
    whatever is later put at the name is never read or written."""
    import torch.distributed as dist

    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise RendezvousRefused("it is a symlink" if e.errno == errno.ELOOP else
                                e.strerror or str(e)) from e
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise RendezvousRefused("it is not a regular file of this user's")
    _held.append(fd)
    through = f"/proc/self/fd/{fd}"
    store = dist.FileStore(through if os.path.exists(through) else str(path), size)
    store.set(f"{ARRIVED}{rank}", str(os.getpid()))
    return store


def read_rendezvous(rendezvous: Rendezvous) -> Reading:
    """The ranks that have arrived in the rendezvous file, and anything in it no rank wrote
    (its problem: "holds bytes no rank wrote (...)", "was replaced", ...). Never blocks:
    a store's writer holding its lock means the file's last record may be under way."""
    try:
        fd = os.open(rendezvous.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return Reading(problem="was removed")
    except OSError as e:
        return Reading(problem="was replaced by a symlink" if e.errno == errno.ELOOP else
                       f"cannot be read ({e.strerror})")
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != rendezvous.ident:
            return Reading(problem="was replaced by another file")
        if st.st_size > MAX_FILE:
            return Reading(problem=f"holds {st.st_size} bytes, more than ranks ever write")
        try:  # the store's own lock: held shared, no record is half written
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            whole = True
        except OSError:
            whole = False
        keys, garbage = parse_store(os.pread(fd, st.st_size, 0), whole=whole)
    finally:
        os.close(fd)
    arrived = frozenset(int(k[len(ARRIVED) + 1:]) for k in keys
                        if k.startswith("/" + ARRIVED) and k[len(ARRIVED) + 1:].isdigit())
    return Reading(arrived, garbage and f"holds bytes no rank wrote ({garbage})")


def parse_store(data: bytes, *, whole: bool) -> tuple[set[str], str | None]:
    """The keys of the FileStore records in `data`, and where it stops being records (None:
    it is records throughout). `whole`: read under the store's shared lock, so a record
    cut short by the file's end is garbage too, not a write under way."""
    keys: set[str] = set()
    at = 0
    while at < len(data):
        start, parts = at, []
        for _ in range(2):  # the key, then the value
            if at + 4 > len(data):
                return keys, f"a record cut short at byte {start}" if whole else None
            (length,) = struct.unpack_from("=I", data, at)  # the store writes a native uint32
            if length > MAX_RECORD:
                return keys, f"a record of {length} bytes at byte {start}"
            if at + 4 + length > len(data):
                return keys, f"a record cut short at byte {start}" if whole else None
            parts.append(data[at + 4:at + 4 + length])
            at += 4 + length
        key = parts[0]
        if not key or any(b < 0x20 or b > 0x7e for b in key):  # c10d's keys are text
            return keys, f"a key that is not text at byte {start}"
        keys.add(key.decode("ascii"))
    return keys, None
