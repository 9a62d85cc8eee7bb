"""Checks of the machine, the root and the store (`gridrun doctor`); the rebuild of
a lost or damaged store from the run folders (`--rebuild`) is rebuild.py's.

Each check returns one `Check`: ok, warn or FAIL and one line that says what to
do. Nothing here imports torch at the top (the GPU check does, inside), and
nothing here speaks SQL: the store does.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridrun.runs import layout, states
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
    special = layout.system_folder(root)
    if special:
        return Check("root", FAIL, special)
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
    """SQLite's quick_check; a lost queue. Returns the open store too (or None). Opens
    it as a reader: nothing is created; a full disk is said as such, not as damage."""
    from gridrun.runs.store import Store, StoreError

    db = root / layout.DB_NAME
    if not db.is_file():
        n = count_run_dirs(root) if root.is_dir() else 0
        if n:
            return Check("store", WARN, f"{db} is missing but {root} holds {n} run folder"
                         f"{'s' * (n != 1)}; `gridrun doctor --rebuild --root {_q(root)}` "
                         "restores the queue"), None
        return Check("store", OK, f"no store yet at {db} (nothing queued)"), None
    try:
        store = Store(root, create=False, create_store=False)
        problems = store.check()
    except StoreError as e:
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
    if store.view is not None:  # read as it is on disk: the disk is full, or read-only
        return Check("store", WARN, f"{db}: integrity ok; {summary}; but {store.view}"), store
    return Check("store", OK, f"{db}: integrity ok; {summary}"), store


def check_disk(root: Path) -> Check:
    """Free space where the root is: a full disk stops the engine's launches (it waits)."""
    from gridrun.runs import space

    where = root if root.exists() else root.absolute().parent
    free = space.free_bytes(where)
    if free is None:
        return Check("disk", WARN, f"cannot tell the free space on {where}")
    if space.read_only(where):
        return Check("disk", FAIL, f"{where} is on a read-only file system: nothing can be "
                     "queued or run there; remount it read-write or use another root")
    if free < space.RESUME_MARGIN:
        return Check("disk", FAIL, f"the disk holding {where} is full ({space.human(free)} free): "
                     "the engine launches nothing and runs pause until there is space; free some "
                     "(nothing is lost, nothing needs rebuilding)")
    return Check("disk", OK, f"{space.human(free)} free on the disk holding {where}")


def check_engine(root: Path, store: Any = None) -> Check:
    """engine.pid and engine.lock: a dead engine's leftovers, a lock nobody can take; an
    engine waiting for disk space; runs that say `running` while no engine runs."""
    from gridrun.engine import daemon
    from gridrun.runs import space

    st = daemon.status(root, heartbeat=False)
    pid_file = root / daemon.PID
    holder = _lock_holder(root / daemon.LOCK)
    if st.running and st.waiting_for_space:
        since = time.strftime("%H:%M:%S", time.localtime(st.waiting_for_space))
        return Check("engine", WARN, f"engine running (pid {st.pid}) but waiting for disk space "
                     f"since {since} ({space.human(st.free_bytes)} free): it launches nothing; "
                     "free some space and it resumes by itself")
    if st.running:
        return Check("engine", OK, f"engine running (pid {st.pid})"
                     + (", starting its backend" if st.starting else ""))
    stranded = _stranded(store)
    if stranded:
        says = "says" if len(stranded) == 1 else "say"
        return Check("engine", WARN, f"{_n(stranded, 'run')} {says} running but no engine runs: "
                     f"`gridrun engine start --root {_q(root)}` queues them again (they resume "
                     "from their checkpoints)", tuple(stranded))
    if holder is not None:
        return Check("engine", FAIL, f"{root / daemon.LOCK} is held (taken by pid {holder}) but no "
                     "engine runs: a process the engine started still holds it and no engine can "
                     f"start; `fuser -v {_q(root / daemon.LOCK)}` names it")
    if pid_file.exists():
        return Check("engine", WARN, f"stale {pid_file}: the engine it names is gone (killed?); "
                     "the next `gridrun engine start` replaces it; queued runs are safe")
    return Check("engine", OK, "engine not running; no stale pid file or lock")


def _stranded(store: Any) -> list[str]:
    """Runs the store says the engine runs (not `gridrun train`'s) while no engine runs."""
    if store is None:
        return []
    from gridrun.runs.store import FOREGROUND

    return [r.id for r in store.list_runs(status=states.RUNNING) if r.slot != FOREGROUND]


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


def check_ledger(root: Path, store: Any = None) -> Check:
    """The machine's GPU ledger (checks/ledgercheck.py): its folder, owner, mode, free
    space, and the entry of this root's engine when it runs with GPUs."""
    from gridrun.checks.ledgercheck import survey
    from gridrun.engine import daemon, packing

    book, pid = {}, None
    with contextlib.suppress(Exception):  # an unreadable store: the folder alone
        st = daemon.status(root, store=store) if store is not None else None
        if st is not None and st.running and isinstance(got := store.get_state(packing.STATE), dict):
            book, pid = got, st.pid  # an engine with GPUs: it has an entry
    folder = book.get("folder") if isinstance(book.get("folder"), str) else None
    said = book.get("ledger") if isinstance(book.get("ledger"), str) else None
    s = survey(folder, engine_pid=pid, said=said)
    status = FAIL if s.problems else WARN if s.warnings else OK
    return Check("ledger", status, f"the GPU ledger {s.folder}: "
                 + "; ".join([*s.problems, *s.warnings, *s.facts]))


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
             f"core{'s' * (env['cores'] != 1)}: threads = \"auto\" is 1 for a CPU run, "
             f"{min(GPU_THREADS, env['cores'])} for a GPU run"]
    return Check("environment", OK, "; ".join(parts))


def run_checks(root: str | os.PathLike, *, gpu: bool = True) -> list[Check]:
    root = Path(root)
    checks = [check_root(root)]  # first: opening the store would fix its mode
    if checks[0].status == FAIL and layout.system_folder(root):
        return checks  # nothing of a system folder is opened
    store_check, store = check_store(root)
    try:
        checks += [store_check, check_disk(root), check_engine(root, store),
                   check_heartbeat(root, store), check_temporaries(root, store),
                   check_ledger(root, store)]
    finally:
        if store is not None:
            store.close()
    if gpu:
        checks += [check_gpu(), check_environment()]
    return checks
