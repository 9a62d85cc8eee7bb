"""The determinism audit: replay a run in a scratch folder and compare it bit for bit.

`verify(run_dir)` re-executes a finished or interrupted run with its exact
recorded config (`config.toml`) in a temporary folder, from the start or from
the run's last checkpoint, and compares every metrics line with the line the
run recorded at the same position (timing fields aside, floats exactly), then
the final weights when the replay ends where the recorded run did. Nothing
that affects results changes: a shorter replay stops the trainer through
`should_stop`, never by changing `max_steps` or `epochs` (that would change the
learning-rate schedule). The one file written in the run folder is
`verify.json` (see verdict.py).
"""

from __future__ import annotations

import contextlib
import io
import math
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gridrun.checks import verdict
from gridrun.runs import layout, nofollow, records, runlog, space, states
from gridrun.spec import parse_run_config
from gridrun.train import checkpoint, environment, threads
from gridrun.train.loop.trainer import train

MISSING = "(missing)"


class VerifyError(ValueError):
    """The run cannot be verified as asked (no config, no metrics, no checkpoint, ...)."""


def verify(run_dir: str | Path, *, steps: int | None = None, from_checkpoint: bool = False,
           progress: Callable[[int, int], None] = lambda done, total: None) -> dict[str, Any]:
    """Replay the run in RUN_DIR (at most `steps` optimizer steps), compare, write verify.json.

    With `from_checkpoint` the replay resumes from `checkpoints/last.pt` and is
    compared with what the run recorded after that checkpoint. Returns the
    verdict (verdict.py); raises VerifyError when there is nothing to verify.
    """
    run_dir = Path(run_dir)
    started = time.time()
    if steps is not None and steps < 1:
        raise VerifyError(f"--steps must be at least 1, not {steps}")
    try:  # never through a link
        run = parse_run_config(nofollow.read_bytes(run_dir / layout.CONFIG, limit=1 << 20))
    except (OSError, ValueError, KeyError, TypeError, layout.UnsafePath) as e:
        raise VerifyError(f"{run_dir}: no readable {layout.CONFIG} ({e})") from None
    devices = run.trainer.get("devices", 1)
    if devices > 1 and run.trainer.get("reduce", "ddp") != "invariant":
        raise VerifyError(
            f"{run_dir}: a reduce = \"ddp\" run on {devices} devices sums its gradients in DDP's "
            f"order for {devices}: a replay in one process cannot give its bits; queue it again "
            "to compare (two runs at the same devices give the same bits), or use reduce = "
            "\"invariant\", whose runs replay on any number of devices")
    start_step, offset = 0, 0
    if from_checkpoint:
        try:
            state = checkpoint.load(run_dir / layout.CHECKPOINTS / checkpoint.LAST)
        except checkpoint.CheckpointError as e:
            raise VerifyError(str(e)) from None
        if state is None:
            raise VerifyError(f"{run_dir}: no checkpoint to replay from ({layout.CHECKPOINTS}/last.pt)")
        if not isinstance(state.get("step"), int) or not isinstance(state.get("metrics_offset"), int):
            raise VerifyError(f"{run_dir}/{layout.CHECKPOINTS}/last.pt holds no step and metrics "
                              "position (written by another version?): verify from the start")
        start_step, offset = state["step"], state["metrics_offset"]
    recorded = runlog.read_from(run_dir / layout.METRICS, offset)[0]
    # the one summary reader: garbage reads as no summary, wrong-typed fields as unset
    stored = runlog.read_summary(run_dir / layout.SUMMARY)
    recorded_summary = stored.to_json() if stored is not None else {}
    # where the run ended: its last line, or a later stop that summary.json records
    ends = [r.get("step") for r in recorded] + [recorded_summary.get("step")]
    last_step = max((s for s in ends if isinstance(s, int)), default=start_step)
    if last_step <= start_step:
        where = f"after the checkpoint at step {start_step}" if from_checkpoint else "yet"
        raise VerifyError(f"{run_dir}: no steps recorded {where}: nothing to compare"
                          + (" (verify from the start instead)" if from_checkpoint else ""))
    target = last_step if steps is None else min(last_step, start_step + steps)
    recorded_env = recorded_summary.get("environment") or {}
    if (n := replay_threads(recorded_summary, from_checkpoint)) is not None:
        # the bits depend on the thread count: replay with the run's own, on any machine
        run = run.with_trainer(threads=n)

    with tempfile.TemporaryDirectory(prefix="gridrun-verify-") as tmp:
        scratch = Path(tmp)
        if from_checkpoint:
            (scratch / layout.CHECKPOINTS).mkdir(mode=0o700)
            shutil.copyfile(run_dir / layout.CHECKPOINTS / "last.pt", scratch / layout.CHECKPOINTS / "last.pt")
            shutil.copyfile(run_dir / layout.METRICS, scratch / layout.METRICS)
        calls = 0

        def should_stop() -> bool:  # called once per optimizer step
            nonlocal calls
            calls += 1
            progress(calls, target - start_step)
            return start_step + calls >= target

        before = threads.apply(torch.get_num_threads())  # the replay's threads are its own
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # a failure's traceback is in summary
                summary = train(run, scratch, fresh=not from_checkpoint, should_stop=should_stop,
                                log=lambda line: None)
        finally:
            threads.restore(before)
        if summary["status"] == states.FAILED and space.mentions_no_space(summary["error"]):
            raise VerifyError(f"{run_dir}: the replay ran out of disk space in {scratch.parent} "
                              f"({summary['error']}): free some space, then verify again")
        replayed = runlog.read_from(scratch / layout.METRICS, offset)[0]
        if not replayed and summary["status"] == states.FAILED:  # e.g. the task no longer imports
            raise VerifyError(f"{run_dir}: the replay could not start: {summary['error']}")
        window = [r for r in recorded if r.get("step", 0) <= target]
        difference = compare_lines(window, replayed, summary,
                                   log_format=records.log_format(first_line(run_dir)))
        weights = "not compared"
        if difference is None:
            weights, difference = compare_weights(run_dir, recorded_summary, scratch, summary)
    # a replay that failed leaves summary["step"] at 0: its last line says how far it came
    end = max([summary["step"], *(r["step"] for r in replayed if isinstance(r.get("step"), int))])

    result = {
        "ok": difference is None, "steps": end - start_step, "from_step": start_step,
        "to_step": end, "lines": min(len(window), len(replayed)), "weights": weights,
        "weights_sha256": summary["weights_sha256"], "difference": difference,
        "when": time.time(), "args": {"steps": steps, "from_checkpoint": from_checkpoint},
        "replay_status": summary["status"], "replay_error": summary["error"],
        "device": summary["device"], "recorded_device": recorded_summary.get("device"),
        "environment": environment_differences(recorded_env, summary.get("environment") or {}),
        # what a resume could not keep: a difference from there on is explained by it
        "resumed_changes": recorded_summary.get("environment_changes") or [],
        "wall_time_s": round(time.time() - started, 3),
    }
    try:
        verdict.write(run_dir, result)
    except OSError as e:  # a full disk, say: the verdict is still the command's answer
        raise VerifyError(f"{verdict.describe(result)}; but {run_dir / layout.VERIFY} could "
                          f"not be written: {e.strerror or e}") from None
    return result


def replay_threads(recorded: dict[str, Any], from_checkpoint: bool) -> int | None:
    """The threads a replay computes with: the first attempt's from the start (a later
    attempt that changed them is a recorded change), the last one's from the checkpoint;
    a run from before attempts were recorded: its environment's."""
    attempts = [a for a in recorded.get("attempts") or [] if isinstance(a, dict)]
    chosen = (attempts[-1] if from_checkpoint else attempts[0]) if attempts else (
        recorded.get("environment") or {})
    n = chosen.get("threads")
    return n if type(n) is int and n >= 1 else None


def first_line(run_dir: Path) -> dict[str, Any] | None:
    """The run's first metrics line (its start line), or None."""
    try:
        chunk = next(runlog.iter_chunks(run_dir / layout.METRICS, 4096), None)
    except OSError:
        return None
    return chunk.records[0] if chunk is not None and chunk.records else None


def environment_differences(recorded: dict[str, Any], replayed: dict[str, Any]) -> dict[str, Any]:
    """{field: {"recorded", "replayed"}} for each field that decides a run's bits
    (environment.REPRODUCE) and differs; fields the run did not record are left out."""
    return {f: {"recorded": recorded[f], "replayed": replayed.get(f)}
            for f in environment.REPRODUCE
            if recorded.get(f) is not None and recorded[f] != replayed.get(f)}


def same(a: Any, b: Any) -> bool:
    """Bitwise equality: floats by their bits (NaN equals NaN, 0.0 is not -0.0)."""
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


def compare_lines(recorded: list[dict[str, Any]], replayed: list[dict[str, Any]],
                  summary: dict[str, Any], log_format: int = records.CURRENT_FORMAT
                  ) -> dict[str, Any] | None:
    """The first difference between the recorded lines and the replayed ones, position
    by position. The start line's FORMAT is not a result; a log of an older format
    is read by its own definitions (records.FORMAT: a train line's epoch)."""
    for rec, rep in zip(recorded, replayed, strict=False):
        for field in [*rec, *(k for k in rep if k not in rec)]:
            if field in records.TIMING or field == records.FORMAT:
                continue
            a, b = rec.get(field, MISSING), rep.get(field, MISSING)
            if (field == records.EPOCH and log_format < 2 and rec.get(records.SPLIT) == records.TRAIN
                    and type(a) is int and b == a + 1):
                continue  # the epoch in progress at an epoch's last step, as it was written
            if not same(a, b):
                return {"step": rec.get("step"), "split": rec.get("split"), "field": field,
                        "recorded": a, "replayed": b}
    if len(replayed) < len(recorded):  # the replay ended early: it failed or diverged
        rec = recorded[len(replayed)]
        ended = summary["status"] + (f": {summary['error']}" if summary["error"] else "")
        return {"step": rec.get("step"), "split": rec.get("split"), "field": "line",
                "recorded": f"a {rec.get('split')} line",
                "replayed": f"none (the replay ended at step {summary['step']}, {ended})"}
    return None


def compare_weights(run_dir: Path, recorded_summary: dict[str, Any], scratch: Path,
                    summary: dict[str, Any]) -> tuple[str, dict | None]:
    """("identical" | "differs" | "not compared", the difference) for the replay's final weights.

    Compared with the recorded `weights_sha256` when summary.json is at the same
    step, else tensor by tensor with the run's last.pt when that is at the same step.
    """
    step, replayed = summary["step"], summary["weights_sha256"]
    if replayed is None:  # the replay failed: its lines said so already, or there was nothing after
        return "not compared", None
    if recorded_summary.get("step") == step and recorded_summary.get("weights_sha256"):
        expected = recorded_summary["weights_sha256"]
        if expected == replayed:
            return "identical", None
        return "differs", {"step": step, "split": verdict.WEIGHTS, "field": "weights_sha256",
                           "recorded": expected, "replayed": replayed}
    try:
        state = checkpoint.load(run_dir / layout.CHECKPOINTS / "last.pt")
    except Exception:  # an unreadable checkpoint is a reference we do not have
        state = None
    mine = checkpoint.load(scratch / layout.CHECKPOINTS / "last.pt")
    if state is None or mine is None or state["step"] != step or mine["step"] != step:
        return "not compared", None
    a, b = state["model"], mine["model"]
    for key in sorted(a.keys() | b.keys()):
        if key not in a or key not in b:
            return "differs", {"step": step, "split": verdict.WEIGHTS, "field": key,
                               "recorded": "present" if key in a else MISSING,
                               "replayed": "present" if key in b else MISSING}
        if not torch.equal(a[key], b[key]):
            return "differs", {"step": step, "split": verdict.WEIGHTS, **_first_element(key, a[key], b[key])}
    return "identical", None


def _first_element(key: str, a: torch.Tensor, b: torch.Tensor) -> dict[str, Any]:
    if a.shape != b.shape or a.dtype != b.dtype:
        return {"field": key, "recorded": f"{a.dtype} {tuple(a.shape)}", "replayed": f"{b.dtype} {tuple(b.shape)}"}
    fa, fb = a.reshape(-1), b.reshape(-1)
    i = int((fa != fb).nonzero()[0, 0]) if (fa != fb).any() else 0  # NaN != NaN also lands here
    return {"field": f"{key}[{i}]", "recorded": fa[i].item(), "replayed": fb[i].item()}
