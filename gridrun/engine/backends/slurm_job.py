"""What runs inside a SLURM job: one run, or a pack of runs one after another.

submitit pickles `run_pack` with its arguments and calls it on the node (the
job's `srun` step). It starts the same entry as the local backend (child.run,
through a warm fork server, so a pack pays the torch import once) in each run
folder on the shared filesystem, with the CUDA_VISIBLE_DEVICES SLURM gave the
job, passed on as it is.

The engine and the job talk only through three small files in the run folder,
each with one writer, replaced atomically:

- TICKET (engine): the token of the latest submission of this run and its job
  id. A job whose token is no longer the ticket's (SLURM requeued a job that
  gridrun had already requeued itself) leaves the run alone.
- STATUS (job): this job started the run (node, GPUs), and its exit code.
- STOP (engine): `gridrun cancel`: checkpoint now, killed after `grace`.

Signals: SLURM's warning before a time limit or preemption (`--signal`, USR2
as submitit asks for it), `scancel --signal`, and the SIGTERM of a cancel or a
requeue all make the running run checkpoint (SIGTERM to it) and exit 5; runs of
the pack not yet started are left with code 5 too; gridrun requeues them and
they resume. The children ignore USR2 (set before they are started and
inherited): its default action would kill them without a checkpoint.

Also both halves of the engine's check that the runs root is shared with the nodes
(`check_root_shared` submits a tiny job that runs `probe`), and the squeue/sacct calls.

Importable without submitit, torch or the scheduler.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from gridrun.engine.backends import child

TICKET = ".gridrun-slurm-job"
STATUS = ".gridrun-slurm-run"
STOP = ".gridrun-slurm-stop"
INTERRUPTED = 5  # states.EXIT_CODES["interrupted"], without importing more into the job
WATCH_EVERY = 0.2  # seconds between looks at the run, the stop file and signals
LOCK_WAIT = 120.0  # how long a run waits for an earlier process of it to let go
PROBE_WAIT = 60.0  # seconds the shared-root check may wait for a node

log = logging.getLogger("gridrun.engine")


def read(run_dir: str | os.PathLike, name: str) -> dict[str, Any]:
    """One of the three files; {} when absent or unreadable (a half-written file never
    is: they are replaced whole)."""
    try:
        value = json.loads((Path(run_dir) / name).read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def write(run_dir: str | os.PathLike, name: str, value: dict[str, Any]) -> None:
    path = Path(run_dir) / name
    tmp = path.with_name(f"{name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)  # private, as the root
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(value))
    tmp.replace(path)


class _Signals:
    """The first stop signal the job got (USR2 or TERM), if any."""

    def __init__(self) -> None:
        self.got: int | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.got = self.got or signum


def run_pack(entries: list[dict[str, Any]]) -> list[int | None]:
    """Run each entry ({"run_dir", "token", "fresh"}) in turn; their exit codes
    (None: not this job's any more)."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    node = socket.gethostname()
    # SLURM's assignment, passed on untouched; unset means the job got no GPU
    cuda = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # inherited by the children started below
    server = _fork_server()
    signals = _Signals()
    signal.signal(signal.SIGUSR2, signals)
    signal.signal(signal.SIGTERM, signals)  # submitit only logs it; we must act on it
    codes: list[int | None] = []
    try:
        for entry in entries:
            path, token = Path(entry["run_dir"]), entry["token"]
            if read(path, TICKET).get("token") != token:
                codes.append(None)
                continue
            status = {"token": token, "job_id": job_id, "node": node, "cuda": cuda}
            if signals.got or read(path, STOP).get("token") == token:
                code = INTERRUPTED  # never started: back to gridrun's queue (or cancelled)
                write(path, STATUS, {**status, "code": code, "skipped": True})
                codes.append(code)
                continue
            status["started_at"] = time.time()
            write(path, STATUS, status)
            deadline = time.monotonic() + LOCK_WAIT
            while True:
                code = _run_one(server, path, bool(entry.get("fresh")), cuda, token, signals)
                # an earlier process of this run (a job on a lost node, say) still holds
                # it: wait for it to let go rather than run twice or give up
                if code != child.EXIT_ALREADY_RUNNING or signals.got or time.monotonic() > deadline:
                    break
                while child.lock_holder(path) and time.monotonic() < deadline:
                    time.sleep(0.5)
            write(path, STATUS, {**status, "code": code, "ended_at": time.time()})
            codes.append(code)
    finally:
        if server is not None:
            server.close()
    return codes


def _fork_server() -> Any:
    try:
        from gridrun.engine.backends.forkserver import ForkServer

        return ForkServer(Path("/proc/self/fd/2"))  # its complaints go to the job's stderr
    except Exception as e:  # a fresh interpreter per run still works
        print(f"gridrun: no fork server in this job ({e}); runs start fresh interpreters",
              file=sys.stderr, flush=True)
        return None


def _run_one(server: Any, path: Path, fresh: bool, cuda: str, token: str,
             signals: _Signals) -> int:
    popen = None
    if server is not None and server.alive():
        pid, _ = server.launch(path, fresh=fresh, env={"CUDA_VISIBLE_DEVICES": cuda})
    else:
        with open(path / "output.log", "ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "gridrun.engine.backends.child", str(path),
                 *(["--fresh"] if fresh else [])],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                env={**os.environ, "CUDA_VISIBLE_DEVICES": cuda}, start_new_session=True)
        pid = popen.pid
    termed = False
    kill_at = None
    while True:
        if popen is not None:
            code = popen.poll()
            if code is not None:
                return code
            time.sleep(WATCH_EVERY)
        else:
            server.drain(WATCH_EVERY)
            if pid in server.exits:
                return server.exits.pop(pid)
            if not server.alive() and not child.alive(pid, None):
                record = child.read_exit_record(path) or {}
                return record.get("code", 1) if record.get("pid") == pid else 1
        stop = read(path, STOP)
        asked = stop.get("token") == token
        if (signals.got or asked) and not termed:
            termed = True
            _signal(pid, signal.SIGTERM)  # the worker checkpoints and exits 5
            if asked:
                kill_at = time.monotonic() + float(stop.get("grace", 30.0))
        if kill_at is not None and time.monotonic() >= kill_at:
            _signal(pid, signal.SIGKILL)
            kill_at = None


def _signal(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the child is its own session leader: its group is the run
    except ProcessLookupError:  # not a session leader yet (just forked)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    except PermissionError:
        pass


# ---- the shared-root check ---------------------------------------------------------


def check_root_shared(root: Path, sbatch_options: list[str]) -> None:
    """A tiny job on a node reads a file written here and writes one back next to
    it. A plain `sbatch --wrap`, not submitit: submitit's own files live under the
    root, and a node that cannot see them makes its job wait a minute for them."""
    probe_file = root / f".gridrun-probe-{uuid.uuid4().hex[:12]}"
    token = uuid.uuid4().hex
    probe_file.write_text(token)
    command = (f"{shlex.quote(sys.executable)} -m gridrun.engine.backends.slurm_job "
               f"--probe {shlex.quote(str(probe_file))}")
    try:
        out = subprocess.run(["sbatch", "--parsable", "--job-name=gridrun-check", "--time=5",
                              "--output=/dev/null", "--ntasks=1", *sbatch_options,
                              "--wrap", command], capture_output=True, text=True, timeout=60)
        if out.returncode:
            log.warning("could not check that the runs root is shared: sbatch refused the "
                        "check's job: %s", one_line(RuntimeError(out.stderr)))
            return
        job_id = out.stdout.strip().split(";")[0]
        deadline = time.monotonic() + PROBE_WAIT
        while not list(root.glob(probe_file.name + ".*")) and squeue_state(job_id):
            if time.monotonic() > deadline:
                subprocess.run(["scancel", job_id], capture_output=True)
                log.warning("could not check that the runs root is shared: the check's "
                            "job %s did not run within %.0f s", job_id, PROBE_WAIT)
                return
            time.sleep(0.2)
        back = list(root.glob(probe_file.name + ".*"))
        if not back or back[0].read_text() != token:
            node = sacct(job_id, "NodeList") or "?"
            raise RuntimeError(
                f"the runs root {root} is not shared with the SLURM node {node}: the "
                f"check's job {job_id} could not read a file written here or write one "
                "back; put the root (--root) on a filesystem every node mounts at the same "
                "path")
    finally:
        for p in root.glob(probe_file.name + "*"):
            p.unlink(missing_ok=True)


def squeue_state(job_id: str) -> str:
    """The job's state as squeue says it ("PENDING", "RUNNING", ...), "" if it does not list it."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip().upper() if out.returncode == 0 else ""


def sacct(job_id: str, field_name: str) -> str:
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", field_name],
                         capture_output=True, text=True)
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""


def one_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return "; ".join(lines) or type(e).__name__


def probe(path: str) -> str:
    """The shared-root check: read the token the engine wrote, write it back next to it."""
    token = Path(path).read_text()
    Path(f"{path}.{socket.gethostname()}").write_text(token)
    return token


if __name__ == "__main__":  # the root check's job: python -m ... --probe PATH
    probe(sys.argv[sys.argv.index("--probe") + 1])
