"""The verdict of `gridrun verify`: RUN_DIR/verify.json, its one writer and reader.

No torch here: the interface reads verdicts too. A verdict is a small JSON
object:

    ok           true when every compared value was bitwise identical
    steps        optimizer steps replayed (from_step -> to_step)
    lines        metrics lines compared
    weights      "identical", "differs" or "not compared" (the replay stopped
                 before the recorded run's last step)
    weights_sha256  of the replay's final state dict
    difference   null, or the first one: step, split, field, recorded, replayed
    environment  {field: {"recorded", "replayed"}}: the fields that decide the bits
                 (threads, cpu_capability, versions, ...) that differ between the
                 run and the replay; with a difference, `describe` names them
    when, args, replay_status, replay_error, device, recorded_device, wall_time_s
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from gridrun.runs import layout, nofollow, records

WEIGHTS = "weights"  # the `split` of a difference in the final weights


def write(run_dir: str | os.PathLike, verdict: dict[str, Any]) -> Path:
    """Write RUN_DIR/verify.json atomically (temporary file, fsync, rename)."""
    path = Path(run_dir) / layout.VERIFY
    fd, tmp = tempfile.mkstemp(prefix=f".{layout.VERIFY}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(verdict, f, indent=1, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The verdict in RUN_DIR, or None when there is none or it is not one, or a link
    (never followed; never raises)."""
    try:
        verdict = json.loads(nofollow.read_bytes(Path(run_dir) / layout.VERIFY, limit=1 << 20))
    except (OSError, ValueError, layout.UnsafePath):
        return None
    if not isinstance(verdict, dict) or not isinstance(verdict.get("ok"), bool):
        return None
    if not verdict["ok"] and not isinstance(verdict.get("difference"), dict):
        return None
    return verdict


def describe(verdict: dict[str, Any], *, short: bool = False) -> str:
    """'bitwise identical over N steps (...)' or 'differs at step S (split): FIELD recorded X, replayed Y'.

    `short` leaves out the details: 'differs at step 40 loss'.
    """
    steps = verdict.get("steps")
    if verdict.get("ok"):
        text = f"bitwise identical over {steps} step{'s' * (steps != 1)}"
        if short:
            return text
        lines = verdict.get("lines")
        if verdict.get("weights") == "identical":
            weights = f"final weights sha256 {str(verdict.get('weights_sha256'))[:16]}…"
        else:
            weights = "final weights not compared: the replay stopped before the run's last step"
        return f"{text} ({lines} metrics line{'s' * (lines != 1)}, {weights})"
    d = verdict.get("difference") or {}
    if short:
        return f"differs at step {d.get('step')} {d.get('field')}"
    text = (f"differs at step {d.get('step')} ({d.get('split')}): {d.get('field')} "
            f"recorded {_show(d.get('recorded'))}, replayed {_show(d.get('replayed'))}")
    env = verdict.get("environment")
    if isinstance(env, dict) and env:
        fields = ", ".join(f"{name} recorded {v.get('recorded')!r}, replayed {v.get('replayed')!r}"
                           for name, v in env.items() if isinstance(v, dict))
        text += (f"; the environment differs: {fields} (the same bits are promised only "
                 "in the same environment)")
    changes = [c for c in verdict.get("resumed_changes") or [] if isinstance(c, dict)]
    if changes:
        said = ", ".join(map(records.change_text, changes))
        text += (f"; the run was resumed in another environment: {said} (its bits from "
                 "there on are not an uninterrupted run's)")
    return text


def _show(value: Any) -> str:
    return "null" if value is None else repr(value) if isinstance(value, float) else str(value)
