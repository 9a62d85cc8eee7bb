"""Checks of the machine, the root and the store (`gridrun doctor`), and the
rebuild of a lost or damaged store from the run folders (`--rebuild`).

Each check returns one `Check`: ok, warn or FAIL and one line that says what to
do. Nothing here imports torch at the top (the GPU check does, inside), and
nothing here speaks SQL: the store does.
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

from gridrun.runs import layout, runlog, states
from gridrun.runs.rundirs import (  # noqa: F401  (lost_queue_warning: re-exported)
    COUNT_LIMIT,
    count_run_dirs,
    lost_queue_warning,
    run_dirs,
)

OK, WARN, FAIL = "ok", "warn", "FAIL"
SHOW = 5  # paths shown in a line; --json lists them all


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | FAIL
    message: str
    paths: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.name, "status": self.status, "message": self.message,
                "paths": list(self.paths)}


def _q(path: Path) -> str:
    return shlex.quote(str(path))


# ---- the checks ------------------------------------------------------------------------

def check_root(root: Path) -> Check:
    """The root, what is in it and its run folders: the user's, not writable by
    others, no symlinks inside (the same rules the engine and the store refuse by)."""
    if not root.exists():
        return Check("root", OK, f"{root} does not exist yet (created 0700 at the first queue)")
    problems = layout.root_problems(root, deep=True)
    if problems:
        more = f" (+{len(problems) - 1} more: --json lists them)" if len(problems) > 1 else ""
        return Check("root", FAIL, problems[0] + more, tuple(problems))
    return Check("root", OK, f"{root}: yours, not writable by group or others")


def _children(path: Path) -> list[Path]:
    try:
        return sorted(Path(e.path) for e in os.scandir(path))
    except OSError:
        return []


def _n(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'s' * (len(items) != 1)}"


def check_store(root: Path) -> tuple[Check, Any]:
    """SQLite's quick_check; a lost queue. Returns the open store too (or None)."""
    from gridrun.runs.store import Store, StoreDamaged

    db = root / layout.DB_NAME
    if not db.is_file():
        n = count_run_dirs(root) if root.is_dir() else 0
        if n:
            return Check("store", WARN, f"{db} is missing but {root} holds {n} run folder"
                         f"{'s' * (n != 1)}; `gridrun doctor --rebuild --root {_q(root)}` "
                         "restores the queue"), None
        return Check("store", OK, f"no store yet at {db} (nothing queued)"), None
    try:
        store = Store(root)
        problems = store.check()
    except StoreDamaged as e:
        return Check("store", FAIL, str(e)), None
    except layout.UnsafeRoot:
        return Check("store", WARN, "not opened: the root is not safe to use (see root)"), None
    if problems:
        store.close()
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return Check("store", FAIL, f"{db} fails SQLite's integrity check: {problems[0]}{more}; "
                     f"`gridrun doctor --rebuild --root {_q(root)}` moves it aside and rebuilds "
                     "the queue from the run folders"), None
    lost = lost_queue_warning(root, store)
    if lost:
        return Check("store", WARN, lost), store
    counts = store.counts()
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no runs"
    return Check("store", OK, f"{db}: integrity ok; {summary}"), store


def check_engine(root: Path) -> Check:
    """engine.pid and engine.lock: a dead engine's leftovers, a lock nobody can take."""
    from gridrun.engine import daemon

    st = daemon.status(root)
    pid_file = root / daemon.PID
    holder = _lock_holder(root / daemon.LOCK)
    if st.running:
        return Check("engine", OK, f"engine running (pid {st.pid})"
                     + (", starting its backend" if st.starting else ""))
    if holder is not None:
        return Check("engine", FAIL, f"{root / daemon.LOCK} is held (taken by pid {holder}) but no "
                     "engine runs: a process the engine started still holds it and no engine can "
                     f"start; `fuser -v {_q(root / daemon.LOCK)}` names it")
    if pid_file.exists():
        return Check("engine", WARN, f"stale {pid_file}: the engine it names is gone (killed?); "
                     "the next `gridrun engine start` replaces it; queued runs are safe")
    return Check("engine", OK, "engine not running; no stale pid file or lock")


def _lock_holder(lock: Path) -> int | None:
    """The pid /proc/locks names for a flock on `lock` (Linux), without touching the lock."""
    try:
        ino = os.stat(lock).st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(ino):
            with contextlib.suppress(ValueError):
                return int(parts[4])
    return None


def check_heartbeat(root: Path, store: Any) -> Check:
    """The engine's loop, through `daemon.status`: the threshold `engine status` uses."""
    from gridrun.engine import daemon

    if store is None:
        return Check("heartbeat", WARN, "not checked: the store cannot be read")
    st = daemon.status(root, store=store)
    if not st.running:
        beat = store.get_state(daemon.HEARTBEAT)
        if not isinstance(beat, dict) or not isinstance(beat.get("t"), int | float):
            return Check("heartbeat", OK, "no heartbeat recorded")
        age = max(0.0, time.time() - beat["t"])
        return Check("heartbeat", OK, f"engine not running; its last heartbeat was {age:.0f} s ago")
    if st.heartbeat_age is None:
        return Check("heartbeat", WARN, f"the running engine (pid {st.pid}) has not written a "
                     "heartbeat yet")
    if not st.responding:
        return Check("heartbeat", FAIL, f"the engine (pid {st.pid}) has not responded for "
                     f"{st.heartbeat_age:.0f} s (stopped with SIGSTOP? `kill -CONT {st.pid}`; stuck? "
                     f"`gridrun engine stop --force --root {_q(root)}`)")
    return Check("heartbeat", OK, f"the engine answered {st.heartbeat_age:.1f} s ago")


def check_temporaries(root: Path, store: Any) -> Check:
    """Half-written files of killed writes (checkpoints, summaries), outside running runs."""
    running = set()
    if store is not None:
        running = {r.id for r in store.list_runs(status=states.RUNNING)}
    found = [p for p in _children(root) if p.name.endswith(".tmp") and p.is_file()]
    for run in run_dirs(root):
        if run.name in running:
            continue
        for folder in (run, run / layout.CHECKPOINTS):
            found += [p for p in _children(folder) if p.name.endswith(".tmp")
                      and not p.is_symlink() and p.is_file()]
    if not found:
        return Check("temporaries", OK, "no leftover temporary files")
    shown = ", ".join(map(str, found[:SHOW])) + (f" (+{len(found) - SHOW} more)" if len(found) > SHOW else "")
    return Check("temporaries", WARN, f"{_n(found, 'leftover temporary file')} of killed writes, "
                 f"safe to delete: {shown}", tuple(map(str, found)))


def check_gpu() -> Check:
    """NVML's GPUs against torch's: a CPU machine is fine; a GPU torch cannot use is not."""
    from gridrun.engine.telemetry import Telemetry

    telemetry = Telemetry()
    nvml = telemetry.gpu_count
    telemetry.close()
    try:
        import torch
    except ImportError:
        return Check("gpu", WARN, f"torch is not installed; NVML sees {nvml} GPU(s)")
    cuda = torch.cuda.is_available()
    seen = torch.cuda.device_count() if cuda else 0
    build = f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none (CPU build)'}"
    if not nvml and not cuda:
        return Check("gpu", OK, f"no GPU ({telemetry.error or 'none found'}): runs use the CPU; {build}")
    if nvml and not cuda:
        return Check("gpu", FAIL, f"NVML sees {nvml} GPU(s) but torch cannot use CUDA ({build}): "
                     "install a CUDA build of torch that matches the driver")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if nvml and seen != nvml and visible is None:
        return Check("gpu", WARN, f"NVML sees {nvml} GPU(s) but torch sees {seen} ({build})")
    names = ", ".join(sorted({torch.cuda.get_device_name(i) for i in range(seen)}))
    broken = [m for m in map(_matmul, range(seen)) if m]
    if broken:
        return Check("gpu", FAIL, f"{len(broken)} of {seen} GPU(s) fail a small matmul: "
                     + "; ".join(broken), tuple(broken))
    return Check("gpu", OK, f"{seen} GPU(s) usable by torch ({names}), each passes a small "
                 f"matmul; NVML sees {nvml}"
                 + (f"; CUDA_VISIBLE_DEVICES={visible}" if visible is not None else "")
                 + f"; {build}")


def _matmul(index: int) -> str | None:
    """None when GPU `index` multiplies two small matrices as the CPU does, else why not."""
    import torch

    try:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
        got = (a.to(f"cuda:{index}") @ b.to(f"cuda:{index}")).cpu()
        if not torch.allclose(got, a @ b, rtol=1e-2, atol=1e-2):
            return f"cuda:{index} gives a wrong product"
    except Exception as exc:  # a GPU that faults is what this check is for
        return f"cuda:{index}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def check_environment() -> Check:
    """What summary.json records of a run's environment (environment.describe), for this
    machine: versions, driver, CUDA_VISIBLE_DEVICES and the default determinism settings."""
    try:
        from gridrun.train import environment
        from gridrun.train.threads import GPU_THREADS
    except ImportError:
        return Check("environment", WARN, "torch is not installed")
    try:
        device = environment.pick_device()
    except environment.EnvironmentProblem as exc:
        return Check("environment", FAIL, str(exc))
    env = environment.describe(device)
    driver = env["driver"] or environment.nvml().get("driver")
    parts = [f"torch {env['torch']}", f"CUDA {env['cuda'] or 'none'}", f"cuDNN {env['cudnn'] or 'none'}",
             f"driver {driver or 'none'}", f"runs train on {device.type}"
             + (f" ({env['gpu']}, {env['gpu_memory_bytes'] / 2**30:.0f} GiB)" if env["gpu"] else ""),
             f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES'] if env['CUDA_VISIBLE_DEVICES'] is not None else 'unset'}",
             "deterministic = true sets use_deterministic_algorithms, cudnn.deterministic, "
             "cudnn.benchmark off and CUBLAS_WORKSPACE_CONFIG=:4096:8",
             f"CPU {env['cpu_capability']} ({env['cpu'] or 'model unknown'}), BLAS "
             f"{env['blas'] or 'unknown'}, oneDNN {env['onednn'] or 'off'}; {env['cores']} usable "
             f"core{'s' * (env['cores'] != 1)}: threads = \"auto\" is {env['cores']} for a CPU run, "
             f"{min(GPU_THREADS, env['cores'])} for a GPU run"]
    return Check("environment", OK, "; ".join(parts))


def run_checks(root: str | os.PathLike, *, gpu: bool = True) -> list[Check]:
    root = Path(root)
    checks = [check_root(root)]  # first: opening the store would fix its mode
    store_check, store = check_store(root)
    try:
        checks += [store_check, check_engine(root), check_heartbeat(root, store),
                   check_temporaries(root, store)]
    finally:
        if store is not None:
            store.close()
    if gpu:
        checks += [check_gpu(), check_environment()]
    return checks


# ---- rebuild ---------------------------------------------------------------------------

class RebuildRefused(Exception):
    """str() is the one line that says why and what to do."""


@dataclass
class Rebuilt:
    moved: list[Path] = field(default_factory=list)  # the old store's files, moved aside
    restored: dict[str, int] = field(default_factory=dict)  # status -> runs
    resumes: int = 0  # queued runs that resume from a checkpoint
    stopped: int = 0  # stopped mid-run: restored as cancelled, `gridrun retry` resumes them
    skipped: list[tuple[Path, str]] = field(default_factory=list)


@dataclass(frozen=True)
class _Found:
    spec: Any
    status: str
    fields: dict[str, Any]
    order: float


def rebuild(root: str | os.PathLike, *, force: bool = False) -> Rebuilt:
    """Move the store aside and rebuild the queue's history from the run folders.

    Holds the engine's lock meanwhile, so no engine starts on a half-built store.
    A store that reads fine and has runs is kept unless `force` (queued runs
    that never started have no folder, so only the store knows them).
    """
    from gridrun.engine import daemon
    from gridrun.runs.store import Store, StoreDamaged

    root = Path(root)
    if not root.is_dir():
        raise RebuildRefused(f"{root} is not a folder: nothing to rebuild from")
    unsafe = layout.root_problems(root, deep=True)
    if unsafe:  # a rebuild trusts what the folders hold: never from a root others can write
        more = f" (+{len(unsafe) - 1} more: `gridrun doctor --root {_q(root)}`)" if len(unsafe) > 1 else ""
        raise RebuildRefused(f"not rebuilding: {unsafe[0]}{more}")
    st = daemon.status(root)
    if st.running:
        raise RebuildRefused(f"the engine runs on {root} (pid {st.pid}): stop it first with "
                             f"`gridrun engine stop --root {_q(root)}`, then rebuild")
    lock = os.open(root / daemon.LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise RebuildRefused(f"{root / daemon.LOCK} is held: an engine is starting or a "
                                 f"process it started still runs; see `gridrun doctor --root "
                                 f"{_q(root)}`") from None
        db = root / layout.DB_NAME
        if db.exists() and not force:
            with contextlib.suppress(StoreDamaged), Store(root) as store:
                if not store.check() and store.has_runs():
                    n = sum(store.counts().values())
                    raise RebuildRefused(
                        f"{db} reads fine and holds {n} runs; a rebuild would keep only what the "
                        "run folders hold (queued runs that never started would be dropped); "
                        "add --force to rebuild anyway")
        out = Rebuilt(moved=_move_aside(db))
        found = []
        for run_dir in run_dirs(root):
            try:
                found.append(_read_folder(run_dir))
            except Exception as e:  # a folder we cannot read is reported, never a crash
                out.skipped.append((run_dir, f"{type(e).__name__}: {e}".splitlines()[0]))
        found.sort(key=lambda f: f.order)
        with Store(root) as store:
            store.enqueue([f.spec for f in found])
            for f in found:
                store.transition(f.spec.id, states.QUEUED, f.status, **f.fields)
                out.restored[f.status] = out.restored.get(f.status, 0) + 1
                out.resumes += f.status == states.QUEUED and "checkpoint" in f.fields["note"]
                out.stopped += "stopped mid-run" in f.fields["note"]
        return out
    finally:
        os.close(lock)


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
    from gridrun.spec import read_run_config

    spec = read_run_config(run_dir / layout.CONFIG)
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
    raise ValueError(f"its summary.json says status {status!r}")


def _time(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None
