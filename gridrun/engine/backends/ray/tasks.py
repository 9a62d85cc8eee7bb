"""What runs on the Ray nodes: a run's task (the child process, its events streamed
back), the signal sent to a run's process group, the probe of the shared runs root.
Imported by Ray's workers by reference; imports ray only inside the functions."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gridrun.engine.backends import child
from gridrun.engine.backends.base import EXIT_ALREADY_RUNNING
from gridrun.runs import layout, runlog

PROGRESS_EVERY = 1.0  # seconds between metrics events from a task
LOCK_WAIT = 120.0  # how long a relaunch waits for a previous process to let go of the run


def _die_with_parent() -> None:
    # if the Ray worker running this task dies (engine gone, node lost, forced
    # cancel), the run is told to checkpoint and stop instead of running on unowned
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def run_task(run_dir: str, fresh: bool, env: dict[str, str] | None = None):
    """The body of the Ray task: run the child, stream its events."""
    import ray as _ray

    path = Path(run_dir)
    node = _ray.get_runtime_context().get_node_id()
    if not (path / layout.CONFIG).exists():
        yield {"event": "exit", "code": 1,
               "error": f"{path / layout.CONFIG} is not visible on node {node}: "
                        "the runs root must be shared by every node"}
        return
    cmd = [sys.executable, "-m", "gridrun.engine.backends.child", run_dir, *(["--fresh"] if fresh else [])]
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        with open(path / layout.OUTPUT, "ab") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    preexec_fn=_die_with_parent, env={**os.environ, **(env or {})})
        yield {"event": "started", "node": node, "pid": proc.pid,
               "start_time": child.process_start_time(proc.pid) or 0.0,
               "cuda": (env or {}).get("CUDA_VISIBLE_DEVICES", "")}
        offset, next_progress = 0, 0.0
        metrics = path / layout.METRICS
        while proc.poll() is None:
            time.sleep(0.1)
            if time.monotonic() >= next_progress:
                next_progress = time.monotonic() + PROGRESS_EVERY
                with contextlib.suppress(OSError):
                    records, offset = runlog.read_from(metrics, offset)
                    if records:
                        yield {"event": "metrics", "records": records}
        code = proc.returncode
        # an earlier process of this run (on a lost node, or from before an engine
        # restart) still checkpoints: wait for it rather than run twice or give up
        if code == EXIT_ALREADY_RUNNING and time.monotonic() < deadline:
            while child.lock_holder(path) and time.monotonic() < deadline:
                time.sleep(0.5)
            continue
        with contextlib.suppress(OSError):
            records, offset = runlog.read_from(metrics, offset)
            if records:
                yield {"event": "metrics", "records": records}
        yield {"event": "exit", "code": code}
        return


def signal_task(pid: int, start_time: float, sig: int) -> bool:
    if not child.alive(pid, start_time or None):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # the child is its own session leader: its group is the run
        return True
    return False


def probe_task(path: str) -> str:
    import ray as _ray

    node = _ray.get_runtime_context().get_node_id()
    try:
        token = Path(path).read_text()
    except OSError as e:
        return f"error:{e}"
    Path(f"{path}.{node}").write_text(token)
    return token


