"""`gridrun doctor --rebuild`: the queue's history rebuilt from the run folders, for a
store that was lost or is damaged.

It diagnoses before it touches anything: a store that passes SQLite's
integrity_check and holds runs is kept (unless --force), and one that cannot be
opened for want of space, a read-only file system or permissions is never
touched (the store is sound; the disk is the trouble). The new store is built
beside the old one (gridrun.db.rebuild), checked, checkpointed and fsynced;
only then is the old one moved aside (renames, which need no space) and the new
one renamed into place. On any failure the original stays exactly where it was.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridrun.runs import layout, nofollow, runlog, states
from gridrun.runs.rundirs import run_dirs

BUILDING = layout.DB_NAME + ".rebuild"  # the new store, until it is complete and durable


def _q(path: Path) -> str:
    return shlex.quote(str(path))


class RebuildRefused(Exception):
    """str() is the one line that says why and what to do."""


@dataclass
class Rebuilt:
    moved: list[Path] = field(default_factory=list)  # the old store's files, moved aside
    restored: dict[str, int] = field(default_factory=dict)  # status -> runs
    resumes: int = 0  # queued runs that resume from a checkpoint
    stopped: int = 0  # stopped mid-run: restored as cancelled, `gridrun retry` resumes them
    rung_results: int = 0  # a search's results at the rungs its trials passed, from their logs
    skipped: list[tuple[Path, str]] = field(default_factory=list)


@dataclass(frozen=True)
class _Found:
    spec: Any
    status: str
    fields: dict[str, Any]
    order: float


def _refuse_early(root: Path) -> None:
    from gridrun.engine import daemon

    if not root.is_dir():
        raise RebuildRefused(f"{root} is not a folder: nothing to rebuild from")
    special = layout.system_folder(root)
    if special:
        raise RebuildRefused(f"not rebuilding: {special}")
    unsafe = layout.root_problems(root, deep=True)
    if unsafe:  # a rebuild trusts what the folders hold: never from a root others can write
        more = f" (+{len(unsafe) - 1} more: `gridrun doctor --root {_q(root)}`)" if len(unsafe) > 1 else ""
        raise RebuildRefused(f"not rebuilding: {unsafe[0]}{more}")
    st = daemon.status(root)
    if st.running:
        raise RebuildRefused(f"the engine runs on {root} (pid {st.pid}): stop it first with "
                             f"`gridrun engine stop --root {_q(root)}`, then rebuild")


def _diagnose(root: Path, db: Path, force: bool) -> None:
    """Refuse to touch a store the disk, not the file, keeps from being used, and (without
    `force`) one that passes integrity_check and holds runs."""
    from gridrun.runs.store import Store, StoreDamaged, StoreError

    if not db.exists():
        return
    try:
        with Store(root, create=False) as store:
            sound = not store.check(full=True)
            n = sum(store.counts().values()) if sound else 0
    except StoreDamaged:
        return  # what a rebuild is for
    except StoreError as e:  # a full disk, a read-only file system, permissions
        raise RebuildRefused(f"not rebuilding: {e}") from None
    if sound and n and not force:
        raise RebuildRefused(
            f"{db} passes SQLite's integrity check and holds {n} runs: nothing to rebuild; a "
            "rebuild would keep only what the run folders hold (queued runs that never started "
            "would be dropped); add --force to rebuild anyway")


def rebuild(root: str | os.PathLike, *, force: bool = False) -> Rebuilt:
    """Rebuild the queue's history from the run folders into a new store, then move the old
    one aside and the new one into place (see the module's doc).

    Holds the engine's lock meanwhile, so no engine starts on a half-built store.
    """
    from gridrun.engine import daemon

    root = Path(root)
    _refuse_early(root)
    lock = os.open(root / daemon.LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise RebuildRefused(f"{root / daemon.LOCK} is held: an engine is starting or a "
                                 f"process it started still runs; see `gridrun doctor --root "
                                 f"{_q(root)}`") from None
        db = root / layout.DB_NAME
        _diagnose(root, db, force)
        out = Rebuilt()
        found = []
        for run_dir in run_dirs(root):
            try:
                found.append(_read_folder(run_dir))
            except Exception as e:  # a folder we cannot read is reported, never a crash
                out.skipped.append((run_dir, f"{type(e).__name__}: {e}".splitlines()[0]))
        found.sort(key=lambda f: f.order)
        try:
            _build(root, found, out)
            out.moved = _swap(db, root / BUILDING)
        except Exception as e:
            _remove(root / BUILDING)
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise RebuildRefused(f"the rebuild failed and changed nothing ({db} is where it "
                                 f"was): {why}") from e
        return out
    finally:
        os.close(lock)


def _build(root: Path, found: list[_Found], out: Rebuilt) -> None:
    """The new store, complete: every run, its integrity checked, its -wal folded into
    the file (which is then fsynced)."""
    from gridrun.runs.store import Store

    building = root / BUILDING
    _remove(building)  # a rebuild that died before
    with Store(root, create=False, name=BUILDING) as store:
        store.enqueue([f.spec for f in found])
        for f in found:
            store.transition(f.spec.id, states.QUEUED, f.status, **f.fields)
            out.restored[f.status] = out.restored.get(f.status, 0) + 1
            out.resumes += f.status == states.QUEUED and "checkpoint" in f.fields["note"]
            out.stopped += "stopped mid-run" in f.fields["note"]
        out.rung_results = _restore_rung_results(store, root, found)
        problems = store.check(full=True)
        if problems:
            raise RuntimeError(f"the new store fails SQLite's integrity check: {problems[0]}")
        store.make_durable()
    wal = building.with_name(BUILDING + "-wal")
    if wal.exists() and wal.stat().st_size:
        raise RuntimeError(f"{wal} still holds writes that did not reach the new store")
    _fsync(building)


def _restore_rung_results(store: Any, root: Path, found: list[_Found]) -> int:
    """Each search trial's result at every rung it passed, read back from its metrics log
    (the evaluation at that epoch's end), as the engine kept them while the trials
    paused, and the decisions they give: without them a rebuilt search waits forever
    for its rungs' decisions, and with them its decisions are those it had (they are a
    function of these results; the engine carries out those its trials still wait
    for). How many results were kept."""
    from gridrun.engine.search import SCHEDULER, decisions_of, rung_value, scheduled
    from gridrun.runs.store_search import RungResult
    from gridrun.spec.search import bracket_of, rungs

    kept = 0
    for f in found:
        spec, search = f.spec, f.spec.search or {}
        if spec.trial is None or search.get("scheduler") != SCHEDULER \
                or f.status not in (states.WAITING, states.COMPLETED, states.STOPPED):
            continue
        steps = rungs(search["min_epochs"], search["max_epochs"], search["eta"],
                      bracket_of(spec.trial, search.get("brackets", 1)))
        at: dict[int, Any] = {}  # epoch -> the metric at its end (a resumed log repeats: last)
        for line in runlog.read_all(layout.run_dir(root, spec.experiment, spec.id) / layout.METRICS):
            if line.get("split") == "val" and line.get("epoch") in steps:
                at[line["epoch"]] = line.get(search["metric"])
        results = [RungResult(spec.id, spec.trial, epoch, rung_value(value))
                   for epoch, value in sorted(at.items())]
        store.add_search(search["id"], spec.experiment, search)
        kept += store.record_results(search["id"], results)
    trials: dict[str, list[Any]] = {}
    for run in store.list_runs(config_has=f'"{SCHEDULER}"'):
        if (search := scheduled(run)) is not None:
            trials.setdefault(search["id"], []).append(run)
    for search_id, runs in trials.items():
        store.record_decisions(search_id, decisions_of(scheduled(runs[0]) or {}, runs,
                                                       store.search_results(search_id)))
    return kept


def _swap(db: Path, building: Path) -> list[Path]:
    """The old store aside, the new one in its place: renames only (no space needed);
    if the last one fails, the old one is moved back."""
    moved = _move_aside(db)
    try:
        os.replace(building, db)
    except BaseException:
        for path in moved:  # back where it was
            os.replace(path, db.with_name(db.name + path.name[len(moved[0].name):]))
        raise
    _remove(building)  # its -shm
    _fsync(db.parent)
    return moved


def _remove(building: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            building.with_name(building.name + suffix).unlink()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _move_aside(db: Path) -> list[Path]:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = db.with_name(f"{db.name}.damaged-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = db.with_name(f"{db.name}.damaged-{stamp}-{n}")
    moved = []
    for suffix in ("", "-wal", "-shm"):  # the pair keeps SQLite's names: it opens as it was
        src = db.with_name(db.name + suffix)
        if src.exists():
            dst = target.with_name(target.name + suffix)
            os.replace(src, dst)
            moved.append(dst)
    return moved


def _read_folder(run_dir: Path) -> _Found:
    """A run folder -> its spec and the state the store would have given it."""
    from gridrun.runs.outputlog import output_tail
    from gridrun.spec import parse_run_config

    spec = parse_run_config(nofollow.read_bytes(run_dir / layout.CONFIG, limit=1 << 20))
    if (spec.experiment, spec.id) != (run_dir.parent.name, run_dir.name):
        raise ValueError(f"its config.toml is run {spec.experiment}/{spec.id}")
    summary = runlog.read_summary(run_dir / layout.SUMMARY)
    mtime = os.stat(run_dir / layout.CONFIG).st_mtime
    checkpoint = (run_dir / layout.CHECKPOINTS / "last.pt").is_file()
    if summary is None:
        note = "rebuilt: " + ("resumes from its checkpoint" if checkpoint else "starts from scratch")
        return _Found(spec, states.QUEUED, {"note": note, "queued_at": mtime}, mtime)
    s = summary
    status = s.status
    started, ended = _time(s.started_at), _time(s.ended_at)
    common = {"summary": s.to_json(), "started_at": started, "ended_at": ended or mtime,
              "queued_at": started or mtime}
    order = started or mtime
    if status == states.COMPLETED:
        return _Found(spec, status, {**common, "note": "completed (rebuilt)"}, order)
    if status in (states.INTERRUPTED, states.CANCELLED):
        # a cancelled running run also ends "interrupted" in its folder: never run it again unasked
        return _Found(spec, states.CANCELLED, {**common, "note": "rebuilt: stopped mid-run "
                      "(interrupted or cancelled); `gridrun retry` resumes it"}, order)
    error = "\n".join(str(x) for x in (s.error, s.traceback) if x) or None
    if status == states.FAILED:
        tail = output_tail(run_dir)
        error = (error or "failed") + ("\n\n--- last lines of output.log ---\n" + tail if tail else "")
        return _Found(spec, status, {**common, "error": error, "note": "failed (rebuilt)"}, order)
    if status == states.DIVERGED:
        return _Found(spec, status, {**common, "error": error,
                                     "note": f"diverged at step {s.diverged_step} (rebuilt)"}, order)
    if status == states.OOM:
        return _Found(spec, status, {**common, "error": error, "note": "out of memory (rebuilt)"}, order)
    if status == states.WAITING:  # a search's trial at a rung: decided again
        return _Found(spec, status, {**common, "note": f"rebuilt: waiting at epoch {s.epoch} for "
                                     "its rung's decision"}, order)
    if status == states.STOPPED:  # stopped by its search at a rung: a decision that stands
        return _Found(spec, status, {**common, "note": f"{_stopped_at(spec, s.epoch)} (rebuilt)"},
                      order)
    raise ValueError(f"its summary.json says status {status!r}")


def _stopped_at(spec: Any, epoch: int | None) -> str:
    """`stopped at rung 1 (epoch 3)`, as the engine's note begins (its reason is not kept)."""
    from gridrun.engine.search import SCHEDULER
    from gridrun.spec.search import bracket_of, rungs

    search = spec.search or {}
    if search.get("scheduler") != SCHEDULER or spec.trial is None:
        return f"stopped by its search at epoch {epoch}"
    steps = rungs(search["min_epochs"], search["max_epochs"], search["eta"],
                  bracket_of(spec.trial, search.get("brackets", 1)))
    return f"stopped at rung {steps.index(epoch) if epoch in steps else 0} (epoch {epoch})"


def _time(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None
