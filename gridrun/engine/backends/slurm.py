"""Runs on a SLURM cluster through submitit: the queue stays in gridrun, SLURM
only places and runs each job.

Decisions (issue 16):

- The engine runs where `sbatch` works (a login node), detached as always. Its
  slots are `max_jobs`: that many runs may be pending or running on the
  cluster at once, so the order, priorities, pause and retries stay in gridrun
  and stay reorderable; nothing waits in SLURM's queue that gridrun could
  still reorder, beyond those.
- Each run is a job asking for `gpus_per_run` GPUs (as GRES), `cpus_per_run`
  CPUs and the table's other keys; a run on `devices` > 1 is one job of its own,
  never packed, with that many GPUs (or `devices` x its threads CPUs), whose ranks
  its own process starts (`job_size`); `runs_per_job = N` puts up to N runs
  launched together into one job, which runs them one after another through
  a warm fork server (slurm_job.py): the job's start-up is paid once. A pack
  is submitted when full, or PACK_WAIT after its first run came.
- The job runs the same entry as the local backend in the run's folder on the
  shared filesystem, with the CUDA_VISIBLE_DEVICES SLURM set (never our own).
  The engine learns a run's end from the STATUS file the job writes there, and
  a job's fate from sacct (submitit's watcher, one call for all jobs every
  STATE_EVERY seconds); a job sacct still does not know after SACCT_GRACE
  (accounting lagging or down) is asked of squeue, and one neither knows is gone.
- The job id, node, state and GPUs of each run are recorded in the store
  (`placements`), shown by `gridrun ls` and the run's detail, and the job id
  also in the run folder (TICKET), from which a restarted engine adopts the
  jobs still pending or running.
- Cancel: the STOP file asks the job to SIGTERM the run (it checkpoints and
  exits 5: cancelled), SIGKILL after the grace; a job still alive FORCE_AFTER
  later is `scancel`ed. A cancelled run whose job has not started yet is
  `scancel`ed at once.
- A job that ends without the run's exit code: CANCELLED (scancel from
  outside), PREEMPTED, NODE_FAIL, TIMEOUT, BOOT_FAIL, DEADLINE make the run
  interrupted: it goes back to the queue and resumes from its checkpoint,
  however often. FAILED, OUT_OF_MEMORY or a job that ended quietly count as
  its process dying: it resumes, and fails after MAX_RESTARTS with the job's
  stderr. A refused submission (bad partition) fails the run with sbatch's
  message.
- The runs root must be shared by every node: `start` checks it with a tiny
  job, as the Ray backend does.

This is the only module that imports submitit (`pip install 'gridrun[slurm]'`).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridrun.engine.backends import slurm_job
from gridrun.engine.backends.base import Backend, Exited, Handle, Slot
from gridrun.runs import layout, states
from gridrun.spec import read_run_config

try:
    import submitit
except ImportError as e:
    submitit, SUBMITIT_IMPORT_ERROR = None, e

log = logging.getLogger("gridrun.engine")

INSTALL_HINT = "[engine] backend = \"slurm\" needs submitit: pip install 'gridrun[slurm]'"
INTERRUPTED = states.EXIT_CODES[states.INTERRUPTED]
STATE_EVERY = 2.0  # seconds between sacct calls
PACK_WAIT = 1.0  # seconds an unfilled pack waits for more runs
FORCE_AFTER = 10.0  # seconds after the grace before a cancelled run's job is scancel'ed
SIGNAL_BEFORE = 120  # seconds before a time limit the job is told to checkpoint (--signal)
SETTLE = 5.0  # seconds a job seen ended is given for its STATUS file to appear here
LIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "COMPLETING",
        "CONFIGURING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "UNKNOWN"}
GONE = {"CANCELLED", "PREEMPTED", "NODE_FAIL", "TIMEOUT", "BOOT_FAIL", "DEADLINE", "REVOKED",
        "VANISHED"}
SACCT_GRACE = 120.0  # seconds a job may be unknown to sacct before squeue is asked


class SlurmUnavailable(RuntimeError):
    pass


def job_size(config: Any, trainer: Mapping[str, Any]) -> tuple[int, int]:
    """The GPUs and CPUs a run's job asks for: `gpus_per_run` and `cpus_per_run`; for a run
    on `devices` > 1 (its own process starts its ranks inside the job) one GPU a device,
    each with `cpus_per_run` CPUs, or without GPUs `devices` times its threads."""
    devices = max(1, int(trainer.get("devices", 1)))
    gpus, cpus = int(config.gpus_per_run), int(config.cpus_per_run)
    if devices == 1:
        return gpus, cpus
    if gpus:
        return devices, devices * cpus
    threads = trainer.get("threads")  # "auto": the job's CPUs decide, cpus_per_run each
    fixed = isinstance(threads, int) and not isinstance(threads, bool) and threads > 0
    return 0, devices * (threads if fixed else cpus)


def require_slurm() -> None:
    if submitit is None:
        raise SlurmUnavailable(INSTALL_HINT if isinstance(SUBMITIT_IMPORT_ERROR, ModuleNotFoundError)
                               else f"submitit does not import ({SUBMITIT_IMPORT_ERROR})")
    if shutil.which("sbatch") is None or shutil.which("sacct") is None:
        raise SlurmUnavailable("[engine] backend = \"slurm\": no `sbatch`/`sacct` on this machine; "
                               "start the engine on a node that can submit jobs (a login node)")


def job_state(info: dict[str, str]) -> str:
    # sacct says "CANCELLED by 0"; an id it does not know (yet) is UNKNOWN
    return (info.get("State") or "UNKNOWN").split()[0].upper()


@dataclass
class _Ref:
    """One run given to SLURM."""

    run_id: str
    run_dir: Path
    token: str
    fresh: bool
    handle: Handle | None = None
    job_id: str | None = None
    state: str = "QUEUED"  # "QUEUED" in an unsent pack, then the job's sacct state
    node: str | None = None
    cuda: str | None = None
    launched_at: float = field(default_factory=time.monotonic)
    started_after: float | None = None  # seconds from launch to its process started
    cancelling: bool = False
    kill_at: float | None = None  # monotonic: past the grace, scancel the job
    ended_at: float | None = None  # monotonic: its job was first seen ended
    adopted_code: int | None = None


class SlurmBackend(Backend):
    name = "slurm"

    def __init__(self, root: str | Path, config: Any, *, log_path: Path | None = None,
                 check_shared: bool = True):
        require_slurm()
        self.root = Path(root).resolve()
        self.config = config
        self.log_path = log_path
        self.check_shared = check_shared
        self.folder = self.root / ".slurm"  # submitit's pickles, sbatch files and job logs
        self.refs: dict[str, _Ref] = {}
        self.jobs: dict[str, Any] = {}  # job id -> submitit Job
        self.pack: list[_Ref] = []
        self._slots = [Slot(f"slurm{i}") for i in range(max(1, int(config.max_jobs)))]
        self._next_state = 0.0
        self._changed: dict[str, _Ref] = {}  # placements not yet recorded in the store

    # ---- setup ----------------------------------------------------------------------

    def slots(self) -> list[Slot]:
        return self._slots

    def executor(self, *, gpus: int | None = None, cpus: int | None = None,
                 time_limit: str | None = None) -> Any:
        c = self.config
        gpus = c.gpus_per_run if gpus is None else gpus
        ex = submitit.SlurmExecutor(folder=self.folder / "%j")
        sbatch = {k: v for k, v in (("partition", c.partition), ("mem", c.mem),
                                    ("account", c.account), ("qos", c.qos),
                                    ("constraint", c.constraint)) if v}
        ex.update_parameters(
            job_name="gridrun", time=time_limit or c.time,
            cpus_per_task=c.cpus_per_run if cpus is None else cpus,
            gres=f"gpu:{gpus}" if gpus else None, signal_delay_s=SIGNAL_BEFORE,
            additional_parameters={**sbatch, **dict(c.slurm_args)})
        return ex

    def start(self) -> None:
        layout.make_private_dir(self.folder)
        if self.check_shared:
            self.check_root_shared()
        log.info("slurm backend: up to %d runs on the cluster, %d per job",
                 len(self._slots), max(1, int(self.config.runs_per_job)))

    def sbatch_options(self) -> list[str]:
        """The table's placement options as sbatch flags (for the root check's job)."""
        c = self.config
        given = {"partition": c.partition, "account": c.account, "qos": c.qos,
                 "constraint": c.constraint, **dict(c.slurm_args)}
        return [f"--{k}" if v is True else f"--{k}={v}" for k, v in given.items()
                if v not in (None, "") and k != "signal"]

    def check_root_shared(self) -> None:
        slurm_job.check_root_shared(self.root, self.sbatch_options())

    # ---- runs -----------------------------------------------------------------------

    def launch(self, run_id: str, run_dir: Path, slot: Slot, *, fresh: bool = False) -> Handle:
        run_dir = Path(run_dir).resolve()
        ref = _Ref(run_id, run_dir, uuid.uuid4().hex, fresh)
        ref.handle = Handle(run_id, run_dir, 0, 0.0, slot, extra=ref)
        # a new token first: a job of an earlier submission that SLURM restarts leaves it alone
        for name in (slurm_job.STATUS, slurm_job.STOP):
            (run_dir / name).unlink(missing_ok=True)
        slurm_job.write(run_dir, slurm_job.TICKET, {"token": ref.token})
        trainer = read_run_config(run_dir / layout.CONFIG).trainer
        if trainer.get("devices", 1) > 1:  # a job of its own, never packed: its ranks share it
            self._submit([ref], *job_size(self.config, trainer))
        elif max(1, int(self.config.runs_per_job)) == 1:
            self._submit([ref])  # raises: a refused submission fails this launch with sbatch's words
        else:
            self.pack.append(ref)  # submitted by poll, full or after PACK_WAIT
        self.refs[run_id] = ref
        self._changed[run_id] = ref
        return ref.handle

    def _flush(self, size: int) -> list[Exited]:
        """Submit the first `size` runs of the open pack; their endings if sbatch refused it."""
        pack, self.pack = self.pack[:size], self.pack[size:]
        if not pack:
            return []
        try:
            self._submit(pack)
        except Exception as e:
            ended = []
            for ref in pack:
                self._note_output(ref, f"gridrun: {e}")
                self.refs.pop(ref.run_id, None)
                ended.append(Exited(ref.handle, states.EXIT_CODES[states.FAILED]))
            return ended
        return []

    def _submit(self, pack: list[_Ref], gpus: int | None = None, cpus: int | None = None) -> None:
        entries = [{"run_dir": str(r.run_dir), "token": r.token, "fresh": r.fresh} for r in pack]
        try:
            with submitit.helpers.clean_env():  # an engine inside a job must not pass its SLURM_*
                job = self.executor(gpus=gpus, cpus=cpus).submit(slurm_job.run_pack, entries)
        except Exception as e:
            raise RuntimeError(f"sbatch refused the job: {slurm_job.one_line(e)}") from None
        finally:
            # submitit leaves a symlink to the sbatch file it moved into the job's folder;
            # nothing in the root is a symlink (layout.py, and doctor says so)
            for link in self.folder.glob(".submission_file_*"):
                if link.is_symlink():
                    link.unlink(missing_ok=True)
        self.jobs[job.job_id] = job
        for ref in pack:
            ref.job_id, ref.state = job.job_id, "PENDING"
            slurm_job.write(ref.run_dir, slurm_job.TICKET, {"token": ref.token, "job_id": job.job_id})
            self._changed[ref.run_id] = ref
        log.info("submitted job %s: %s", job.job_id, ", ".join(r.run_id for r in pack))

    def reattach(self, run_id: str, run_dir: Path, pid: int | None, start_time: float | None,
                 slot: Slot | None = None) -> Handle | None:
        if run_id in self.refs:
            return self.refs[run_id].handle
        run_dir = Path(run_dir).resolve()
        ticket = slurm_job.read(run_dir, slurm_job.TICKET)
        job_id, token = ticket.get("job_id"), ticket.get("token")
        if not (job_id and token):
            return None
        job = self.jobs.get(job_id) or submitit.SlurmJob(folder=self.folder / "%j", job_id=job_id)
        state = job_state(job.get_info(mode="force"))
        status = slurm_job.read(run_dir, slurm_job.STATUS)
        code = status.get("code") if status.get("token") == token else None
        # before a launch (pid None) an ended attempt is not adopted: it would end again at once
        if code is not None and pid is None:
            if state in LIVE and job_id not in {r.job_id for r in self.refs.values()}:
                job.cancel(check=False)  # a job SLURM requeued after its runs ended: nothing to do
            return None
        if code is None and state not in LIVE:
            return None  # the job is gone and the run did not end: it resumes (interrupted)
        ref = _Ref(run_id, run_dir, token, False, job_id=job_id, state=state,
                   node=status.get("node"), cuda=status.get("cuda"), adopted_code=code)
        ref.handle = Handle(run_id, run_dir, 0, 0.0, slot, extra=ref)
        self.jobs[job_id] = job
        self.refs[run_id] = ref
        self._changed[run_id] = ref
        log.info("adopted %s in SLURM job %s (%s)", run_id, job_id, state)
        return ref.handle

    def cancel(self, handle: Handle, grace: float = 30.0) -> None:
        ref = self.refs.get(handle.run_id)
        if ref is None:
            return
        ref.cancelling = True
        ref.kill_at = time.monotonic() + grace + FORCE_AFTER
        if ref.job_id is None:
            return  # in the unsent pack: poll ends it
        slurm_job.write(ref.run_dir, slurm_job.STOP, {"token": ref.token, "grace": grace})
        mates = [r for r in self.refs.values() if r.job_id == ref.job_id]
        if all(r.cancelling and r.state == "PENDING" and r.started_after is None for r in mates):
            self.jobs[ref.job_id].cancel(check=False)  # nothing started: no checkpoint to wait for

    def poll(self, timeout: float) -> list[Exited]:
        ended = []
        for ref in [r for r in self.pack if r.cancelling]:
            self.pack.remove(ref)
            self.refs.pop(ref.run_id)
            ended.append(Exited(ref.handle, None))
        per_job = max(1, int(self.config.runs_per_job))
        while len(self.pack) >= per_job or (
                self.pack and time.monotonic() - self.pack[0].launched_at >= PACK_WAIT):
            ended += self._flush(per_job)
        if ended:
            return ended
        time.sleep(timeout if not self.refs else min(timeout, 0.25))
        self._refresh_states()
        now = time.monotonic()
        for run_id, ref in list(self.refs.items()):
            if ref.job_id is None:
                continue
            code = self._code(ref, now)
            if code is False:
                if ref.kill_at is not None and now >= ref.kill_at:
                    log.warning("%s did not stop within its grace: scancel %s", run_id, ref.job_id)
                    self.jobs[ref.job_id].cancel(check=False)
                    ref.kill_at = None
                continue
            del self.refs[run_id]
            ended.append(Exited(ref.handle, code))
        self._cancel_leftover_jobs()
        return ended

    def _refresh_states(self) -> None:
        now = time.monotonic()
        if now < self._next_state or not self.jobs:
            return
        self._next_state = now + STATE_EVERY
        watcher = submitit.SlurmJob.watcher
        with contextlib.suppress(Exception):
            watcher.update()  # one sacct for every job not yet seen finished
        for ref in self.refs.values():
            if ref.job_id is None:
                continue
            info = watcher.get_info(ref.job_id, mode="cache")
            state = job_state(info)
            if state == "UNKNOWN" and now - ref.launched_at > SACCT_GRACE:
                # sacct still does not know the job (accounting lagging or down): squeue
                # does while it is pending or running; a job neither knows is gone
                state = slurm_job.squeue_state(ref.job_id) or "VANISHED"
            node = info.get("NodeList")
            node = None if not node or node.startswith("None") else node
            if state != ref.state or (node and node != ref.node):
                ref.state, ref.node = state, node or ref.node
                self._changed[ref.run_id] = ref

    def _code(self, ref: _Ref, now: float) -> int | bool | None:
        """The run's exit code, None when it ended without one, False while it goes on."""
        if ref.adopted_code is not None:
            return ref.adopted_code
        status = slurm_job.read(ref.run_dir, slurm_job.STATUS)
        if status.get("token") == ref.token:
            if ref.started_after is None:  # the job started it: sacct may not know yet
                ref.cuda, ref.node = status.get("cuda"), ref.node or status.get("node")
                ref.started_after = now - ref.launched_at
                ref.state = "RUNNING" if ref.state in ("PENDING", "UNKNOWN") else ref.state
                self._changed[ref.run_id] = ref
            if status.get("code") is not None:
                return int(status["code"])
        if ref.state in LIVE:
            return False
        # the job ended without the run's code: give the shared filesystem a moment
        ref.ended_at = ref.ended_at or now
        if now - ref.ended_at < SETTLE and not ref.cancelling:
            return False
        if ref.cancelling:
            return None  # the scheduler makes it cancelled
        if ref.state in GONE:
            log.warning("%s: its job %s ended %s; it resumes from its checkpoint",
                        ref.run_id, ref.job_id, ref.state)
            return INTERRUPTED
        self._note_output(ref, f"gridrun: SLURM job {ref.job_id} ended {ref.state} without the "
                               f"run's exit code; its stderr ends with:\n{self._job_stderr(ref)}")
        return None

    def _cancel_leftover_jobs(self) -> None:
        """A job none of our runs is in any more (all ended here) but alive: SLURM
        requeued it, or it is on its way out. Never scancel a job that just ended."""
        busy = {r.job_id for r in self.refs.values()}
        for job_id in [j for j in self.jobs if j not in busy]:
            job = self.jobs.pop(job_id)
            state = job_state(submitit.SlurmJob.watcher.get_info(job_id, mode="cache"))
            if state in ("PENDING", "REQUEUED"):
                job.cancel(check=False)

    def _job_stderr(self, ref: _Ref) -> str:
        path = self.folder / str(ref.job_id) / f"{ref.job_id}_0_log.err"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return f"({path} is not readable)"

    def _note_output(self, ref: _Ref, text: str) -> None:
        with contextlib.suppress(OSError), open(ref.run_dir / layout.OUTPUT, "a") as f:
            f.write(text.rstrip("\n") + "\n")

    # ---- what the store shows ---------------------------------------------------------

    def placements(self) -> dict[str, dict[str, Any]]:
        """{run id: {"backend", "job_id", "node", "state", "gpus"}} of runs whose
        placement changed since the last call (the engine records them)."""
        out = {}
        for run_id, ref in self._changed.items():
            out[run_id] = {"backend": "slurm", "job_id": ref.job_id, "node": ref.node,
                           "state": ref.state, "gpus": ref.cuda}
        self._changed.clear()
        return out

    def close(self) -> None:
        # runs keep going in their jobs; a restarted engine adopts them (reattach)
        self.refs.clear()
        self.jobs.clear()
        self.pack.clear()
