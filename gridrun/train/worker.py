"""Runs one run inside its own process: RUN_DIR/config.toml -> trainer -> summary.json.

`python -m gridrun.train.worker RUN_DIR [--fresh]`; the exit code tells
completed, failed, diverged, oom and interrupted apart (states.EXIT_CODES).
SIGTERM or SIGINT asks the loop to checkpoint at the next step boundary.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from gridrun.runs import layout, runlog, space, states
from gridrun.runs.records import Summary
from gridrun.train.world import SINGLE, World, collective_failed, join, leave


def json_safe(value: Any) -> Any:
    """NaN and infinities (a diverged run's last evaluation) become null, at any depth."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    runlog.write_summary(run_dir, summary)  # the one writer: atomic, never through a link


def read_config(run_dir: Path) -> Any:
    """The RunSpec the engine wrote to RUN_DIR/config.toml, read only through
    descriptors that prove the experiment folder, the run folder and the file are
    this user's, private and not symlinks (layout.read_private): a config swapped
    in by someone else between the engine's write and this read is refused."""
    import tomllib

    from gridrun.spec import RunSpec

    return RunSpec.from_dict(tomllib.loads(layout.read_private(run_dir / layout.CONFIG).decode()))


def replay_divergence(run: Any, run_dir: Path, summary: dict[str, Any],
                      stop: Any = lambda: False) -> dict[str, Any]:
    """Where a diverged run broke, found by replaying it (diverge.py); what the
    run itself saw (anomaly mode's op) is kept when the replay cannot tell more."""
    from gridrun.train import diverge

    seen = summary.get("divergence") or {}
    print(f"replaying to step {summary.get('diverged_step')} to find where it diverged",
          flush=True)
    try:
        found = diverge.explain(run, run_dir, summary.get("diverged_step"), should_stop=stop)
    except Exception as exc:  # an explanation that fails must not lose the run's own summary
        found = {**seen, "reproduced": False, "note": f"the replay failed: {type(exc).__name__}: {exc}"}
    found = {**seen, **{k: v for k, v in found.items() if v is not None}}
    line = diverge.describe(found)
    print(line, flush=True)
    summary["warnings"].append(line)
    return found


# PyTorch's own cure for "reserved but unallocated" memory: without it, a big
# block freed by one micro-batch is split by small allocations and the next
# micro-batch's block no longer fits (seen on an H200: an OOM retry at half the
# batch failed so with 54 of 140 GiB free). It changes where tensors live, never
# what is computed. A user's own setting wins.
CUDA_ALLOC_CONF = "expandable_segments:True"


def completed_before(run_dir: Path, run: Any) -> Summary | None:
    """The summary of this very run, completed in an earlier attempt: a completed cell
    queued again (after its row left the store) keeps what it recorded, timings
    included, instead of a second summary of a resume that trains nothing."""
    from gridrun.runs import runlog

    found = runlog.read_summary(run_dir / layout.SUMMARY)
    if found is None or found.status != states.COMPLETED or found.run_id != run.id:
        return None
    return found


def paused_for_space(summary: dict[str, Any]) -> str | None:
    """Why a run that stopped on a failed write of its own stopped for want of space, or
    None: it is paused (back to the queue, resumed from its last good checkpoint), never
    failed."""
    if summary.get("status") != states.FAILED:
        return None
    if space.hit() is None and not space.mentions_no_space(summary.get("error")):
        return None
    where = space.hit()
    return ("paused: no space left on the device" + (f" to write {where}" if where else "")
            + "; it resumes from its last good checkpoint once there is space")


def start_ranks(run: Any, run_dir: Path, devices: int, *, fresh: bool) -> tuple[Any, Any]:
    """Ranks 1..devices-1 started, and this process joined to them as rank 0."""
    from gridrun.train import environment, ranks

    gang = ranks.Gang(run_dir, devices, fresh=fresh)
    cuda = environment.pick_device().type == "cuda"
    try:
        world = join(0, devices, run.trainer.get("reduce", "ddp"), gang.store, cuda)
    except Exception as exc:
        gang.kill()
        collective_failed(World(size=devices), exc)
    gang.met()
    others = ", ".join(f"{r} (pid {p.pid})" for r, p in gang.children.items())
    print(f"{devices} devices ({'nccl' if cuda else 'gloo'}, reduce = "
          f"{run.trainer.get('reduce', 'ddp')}): rank 0 is this process, ranks {others}",
          flush=True)
    return gang, world


def main(run_dir: str | Path, *, fresh: bool = False) -> int:
    # before anything touches CUDA: the allocator reads it when CUDA starts
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", CUDA_ALLOC_CONF)
    from gridrun.train.loop.trainer import train

    run_dir = Path(run_dir)
    try:
        run = read_config(run_dir)
    except layout.UnsafePath as e:
        print(f"gridrun: refusing to run {run_dir}: {e}", file=sys.stderr, flush=True)
        return states.EXIT_CODES[states.FAILED]
    if not fresh and completed_before(run_dir, run) is not None:
        print(f"run {run.id} completed before: its summary.json is kept as it is", flush=True)
        return states.EXIT_CODES[states.COMPLETED]
    stop = threading.Event()

    def request_stop(signum: int, frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    gang, world = None, SINGLE
    try:
        if (devices := run.trainer.get("devices", 1)) > 1:  # rank 0 starts the others
            gang, world = start_ranks(run, run_dir, devices, fresh=fresh)
        summary = train(run, run_dir, fresh=fresh, should_stop=stop.is_set, world=world)
        if gang is not None:
            gang.finish()
            leave(world)
        if summary["status"] == states.DIVERGED and not stop.is_set():
            # SIGTERM meanwhile ends the replay (a cancel must not wait for it)
            summary["divergence"] = replay_divergence(run, run_dir, summary, stop.is_set)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    paused = paused_for_space(summary)
    if paused is not None:
        summary.update(status=states.INTERRUPTED, error=paused)
        print(f"gridrun: {paused}", file=sys.stderr, flush=True)
    written = Summary.from_json(json_safe(summary)) or Summary()
    try:
        write_summary(run_dir, written.to_json())
    except OSError as e:
        if not space.is_no_space(e) and paused is None:
            raise
        (run_dir / (layout.SUMMARY + ".tmp")).unlink(missing_ok=True)
        paused = paused or ("paused: no space left on the device to write its summary; it "
                            "resumes from its last good checkpoint once there is space")
        print(f"gridrun: {paused}", file=sys.stderr, flush=True)
    if paused is not None:
        return states.EXIT_NO_SPACE
    return states.EXIT_CODES[written.status]


def _die_with_parent() -> None:
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def rank_main(run_dir: str, rank: int, size: int, rendezvous: str, *, fresh: bool) -> int:
    """A rank other than 0 (train/ranks.py starts it): the same loop, nothing written;
    rank 0 decides when to stop, and its death is this process's."""
    _die_with_parent()
    if os.getppid() == 1:  # rank 0 died before the line above
        return states.EXIT_RANK_DIED
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a stop reaches every rank through rank 0's step
    from gridrun.train import environment
    from gridrun.train.loop.trainer import train
    from gridrun.train.world import RendezvousRefused, open_store

    run = read_config(Path(run_dir))
    cuda = environment.pick_device().type == "cuda"
    try:
        store = open_store(Path(rendezvous), size, rank)
    except RendezvousRefused as e:  # rank 0's watcher says what happened to the file
        print(f"rank {rank}: refusing the rendezvous file {rendezvous}: {e}", file=sys.stderr,
              flush=True)
        return 1
    place = join(rank, size, run.trainer.get("reduce", "ddp"), store, cuda)
    try:
        summary = train(run, run_dir, fresh=fresh, world=place, log=lambda s: None)
    finally:
        leave(place)
    if summary.get("status") == states.FAILED and summary.get("error"):
        print(f"rank {rank}: {summary['error']}", file=sys.stderr, flush=True)
        return 1
    return 0


USAGE = "usage: python -m gridrun.train.worker RUN_DIR [--fresh] [--rank R --of N --rendezvous FILE]"

if __name__ == "__main__":
    fresh = "--fresh" in sys.argv[1:]
    args = [a for a in sys.argv[1:] if a != "--fresh"]
    if len(args) == 7 and args[1::2] == ["--rank", "--of", "--rendezvous"]:
        sys.exit(rank_main(args[0], int(args[2]), int(args[4]), args[6], fresh=fresh))
    if len(args) != 1:
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(args[0], fresh=fresh))
