"""Other engines' entries in the GPU ledger (engine/ledger.py), read as what they are:
files that other users wrote. What an entry holds, which entries are read, which live,
and which of the processes an entry names are verifiably its engine's runs.

- An entry is numbers and pids only (`parse`), at most MAX_ENTRY bytes of a plain file
  owned by the uid its name says, read without following a link or waiting on a FIFO;
  anything else is ignored and counted, never an error.
- Bounded: at most PER_OWNER entries of one user (the file's owner) are read in a pass,
  the first by name; the rest are passed over and counted (`Reader.passed_over`). A
  user who writes more hides only their own engines' commitments, and what their
  processes use NVML still shows.
- Cheap: the folder is listed again only when it changed (its inode, mtime, ctime; one
  changed within RACY seconds of the listing may change again within the clock's tick,
  so it is listed again next time), an entry is parsed again only when its file changed
  (inode, size, mtime, ctime), and whether its engine lives is looked at again only
  after `max_age` seconds: a dead engine's commitment then counts a little longer,
  which errs on the safe side. Another engine's new or rewritten entry is a change of
  the folder (a rename), so it is always seen at once.
- An entry lives while its engine does (pid and start time) or one of its runs does,
  each a process of the entry's owner (`living`).
- A process on a GPU is another engine's run only when it is verifiably so
  (`engine_runs`): an entry names it (or an ancestor of it, a run's ranks being its
  children), its real uid is the entry's owner, and it descends from the entry's engine
  process, alive and its owner's. An entry cannot pass off anything else as a run.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gridrun.engine.backends.child import alive

MAX_ENTRY = 64 << 10  # bytes; a bigger entry is ignored
ENTRY_NAME = re.compile(r"(?P<uid>\d{1,10})\.(?P<pid>\d{1,10})\.[0-9a-f]{1,64}\.json")
MAX_GPU_BYTES, MAX_THREADS, MAX_PIDS, MAX_GPUS, MAX_KEY = 1 << 50, 1 << 20, 4096, 1024, 128
PID_LIMIT = 1 << 22  # Linux's PID_MAX_LIMIT
PER_OWNER = 64  # entries of one user read in a pass; no honest user runs more engines
RACY = 0.1  # seconds: a folder changed this close to its listing is listed again (a
# file system's clock moves by a tick of a few ms: two changes within one look like one)
REFRESH = 2.0  # seconds the engine trusts a pass's verdicts on which engines live
READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # no link, no FIFO wait


@dataclass(frozen=True)
class Entry:
    uid: int  # the file's owner (st_uid), never what the file says
    pid: int
    start_time: float
    gpus: dict[str, int]  # GPU key ("GPU-<uuid>" or "index:N") -> bytes committed there
    threads: int
    pids: tuple[int, ...]  # its runs' pids, as the entry claims them
    file: str = field(default="", compare=False)  # its path, to name it to people


class Reader:
    """One folder's entries as the last pass found them; `read` makes a pass."""

    def __init__(self) -> None:
        self.ignored = 0  # malformed entries the last pass passed over
        self.opened = 0  # entry files the last pass read (the others were cached)
        self.passed_over: dict[int, int] = {}  # uid -> its entries beyond PER_OWNER
        self._folder_key: tuple[int, ...] | None = None
        self._racy = True
        self._names: list[tuple[str, int, int]] = []  # (name, uid, pid) to read, capped
        self._parsed: dict[str, tuple[tuple[int, ...], Entry | None]] = {}
        self._live: list[Entry] = []
        self._checked = -math.inf  # when the last pass looked at which engines live

    def read(self, folder: int, path: str, skip: str, me: int, max_age: float = 0.0) -> list[Entry]:
        """The live entries in the folder open at `folder` (shown as `path`) but `skip`
        (ours); stale ones we may remove (ours, or all of them as root) are removed.
        OSError when the folder cannot be read."""
        st = os.fstat(folder)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink)
        changed = self._racy or key != self._folder_key
        if not changed and time.monotonic() - self._checked < max_age:
            self.opened = 0
            return self._live
        if changed:
            listed_at = time.time_ns()
            self._list(os.listdir(folder), skip)
            self._folder_key = key
            self._racy = listed_at - st.st_mtime_ns < RACY * 1e9
        self.opened = self.ignored = 0
        live: list[Entry] = []
        verdicts: dict[tuple[int, int, float, tuple[int, ...]], bool] = {}
        for name, uid, pid in self._names:
            entry = self._entry(folder, path, name, uid, pid)
            if entry is None:
                self.ignored += 1
                continue
            verdict = (entry.uid, entry.pid, entry.start_time, entry.pids)
            if verdict not in verdicts:
                verdicts[verdict] = living(entry)
            if verdicts[verdict]:
                live.append(entry)
            elif me in (entry.uid, 0):
                with contextlib.suppress(OSError):  # another engine may have beaten us to it
                    os.unlink(name, dir_fd=folder)
        self._live, self._checked = live, time.monotonic()
        return live

    def _list(self, names: Iterable[str], skip: str) -> None:
        # grouped by the uid the name starts with, cheaply: only the names kept are
        # matched whole, so 30,000 names of one user cost a partition each, not a parse
        by_owner: dict[str, list[str]] = {}
        for name in names:
            if name.endswith(".json") and name != skip:
                by_owner.setdefault(name.partition(".")[0], []).append(name)
        self._names, self.passed_over = [], {}
        for each in by_owner.values():
            kept = []
            for name in sorted(each):
                if len(kept) == PER_OWNER:
                    break
                if match := ENTRY_NAME.fullmatch(name):
                    kept.append((name, int(match["uid"]), int(match["pid"])))
            self._names += kept
            if kept and len(each) > len(kept) and len(kept) == PER_OWNER:
                self.passed_over[kept[0][1]] = len(each) - PER_OWNER
        kept = {name for name, _, _ in self._names}
        self._parsed = {k: v for k, v in self._parsed.items() if k in kept}

    def _entry(self, folder: int, path: str, name: str, uid: int, pid: int) -> Entry | None:
        """The entry in file `name` (cached while the file is unchanged), or None."""
        try:
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except OSError:
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_uid, st.st_mode)
        cached = self._parsed.get(name)
        if cached is not None and cached[0] == key:
            return cached[1]
        entry = None
        if stat.S_ISREG(st.st_mode) and st.st_uid == uid and st.st_size <= MAX_ENTRY:
            self.opened += 1
            entry = _read(folder, name, uid, pid, os.path.join(path, name))
        self._parsed[name] = (key, entry)
        return entry


def _read(folder: int, name: str, uid: int, pid: int, shown: str) -> Entry | None:
    import json

    try:
        fd = os.open(name, READ, dir_fd=folder)
    except OSError:
        return None
    try:
        st = os.fstat(fd)  # what was opened, not what was looked at before
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_size > MAX_ENTRY:
            return None
        entry = parse(json.loads(os.read(fd, MAX_ENTRY + 1)), uid, shown)
    except (OSError, ValueError, RecursionError):  # RecursionError: "[[[[..." nested deep
        return None
    finally:
        os.close(fd)
    return entry if entry is not None and entry.pid == pid else None


def parse(record: object, uid: int, file: str = "") -> Entry | None:
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
    return Entry(uid, pid, float(start), dict(gpus), threads, tuple(pids), file)


def _count(value: object, limit: int) -> bool:
    return type(value) is int and 0 <= value <= limit


def living(entry: Entry) -> bool:
    """Whether the entry's engine, or one of its runs, still runs as the entry's owner."""
    if owned_by(entry.pid, entry.uid) and alive(entry.pid, entry.start_time) is not None:
        return True
    return any(owned_by(pid, entry.uid) for pid in entry.pids)


def owned_by(pid: int, uid: int, real: bool = False) -> bool:
    """Whether `pid` is a live process (not a zombie) whose real (or, unless `real`,
    effective) uid is `uid`."""
    try:
        import psutil

        proc = psutil.Process(pid)
        uids = proc.uids()
        return uid in (uids[:1] if real else uids[:2]) and proc.status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


def engine_runs(candidates: Iterable[int], entries: Iterable[Entry]) -> dict[int, Entry]:
    """Of the processes `candidates` (pids NVML lists), those verifiably another engine's
    runs, each with its entry: named by the entry (it, or an ancestor below the engine),
    of the entry's owner by its real uid, and descended from the entry's engine process,
    which runs as the entry's owner with the entry's start time."""
    claims: dict[int, list[Entry]] = {}
    for entry in entries:
        for pid in entry.pids:
            if pid != entry.pid:  # an engine is no run of its own
                claims.setdefault(pid, []).append(entry)
    out: dict[int, Entry] = {}
    if not claims:
        return out
    engines: dict[tuple[int, int, float], bool] = {}
    for pid in set(candidates):
        chain = _ancestry(pid)  # [(pid, real uid)], the process first, up to init
        if not chain:
            continue
        for i, (claimed, _) in enumerate(chain):
            for entry in claims.get(claimed, ()):
                above = chain[i + 1:]
                if (entry.pid, entry.uid) not in above:
                    continue  # not below the entry's engine
                engine_at = i + 1 + above.index((entry.pid, entry.uid))
                if any(uid != entry.uid for _, uid in chain[:engine_at]):
                    continue  # someone else's process on the way: not the owner's run
                key = (entry.pid, entry.uid, entry.start_time)
                if key not in engines:
                    engines[key] = (owned_by(entry.pid, entry.uid, real=True)
                                    and alive(entry.pid, entry.start_time) is not None)
                if engines[key]:
                    out[pid] = entry
                    break
            if pid in out:
                break
    return out


def _ancestry(pid: int) -> list[tuple[int, int]]:
    """(pid, real uid) of the process and each of its ancestors; [] if it cannot be seen."""
    try:
        import psutil

        proc = psutil.Process(pid)
        return [(p.pid, p.uids().real) for p in (proc, *proc.parents())]
    except Exception:  # gone, another PID namespace, no psutil
        return []


def holders(entries: Iterable[Entry], key: str | None, total: int | None) -> list[dict[str, Any]]:
    """The entries that commit memory on the GPU `key`, the largest first, each capped at
    the GPU's size `total`: who they are for a line of `engine status`."""
    out = [{"uid": e.uid, "pid": e.pid, "file": e.file,
            "bytes": min(n, total) if total else n}
           for e in entries if key and (n := e.gpus.get(key, 0)) > 0]
    return sorted(out, key=lambda h: -h["bytes"])


def thread_holders(entries: Iterable[Entry], cores: int) -> list[dict[str, Any]]:
    """The entries that hold CPU threads, the most first, each capped at `cores`."""
    out = [{"uid": e.uid, "pid": e.pid, "file": e.file, "threads": min(e.threads, cores)}
           for e in entries if e.threads > 0]
    return sorted(out, key=lambda h: -h["threads"])


def who(holder: Mapping[str, Any]) -> str:
    """`nobody's engine (pid 4242, /dev/shm/gridrun-ledger/65534.4242.ab12.json)`."""
    return f"{user_name(holder.get('uid'))}'s engine (pid {holder.get('pid')}, {holder.get('file')})"


def user_name(uid: Any) -> str:
    try:
        import pwd

        return pwd.getpwuid(int(uid)).pw_name
    except (KeyError, TypeError, ValueError, OverflowError):
        return f"uid {uid}"
