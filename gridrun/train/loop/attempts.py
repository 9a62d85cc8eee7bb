"""The environment that decides a run's bits, attempt by attempt.

Every start of a run's training loop is an attempt: the first from step 0, each
resume from a checkpoint another. Each records the fields that decide its bits
(FIELDS) in summary.json's `attempts` and in every checkpoint it writes, so a
resume knows what the state it goes on from was trained under.

A resume keeps what it can: `threads = "auto"` computes with the first
attempt's thread count, whatever the machine or the device count now. What it
cannot keep (another torch, the CPU for a GPU, another device count under
reduce = "ddp", a `threads` the file now sets otherwise) is a change: one line
in output.log, `environment_changes` in summary.json, a note in `ls`, and the
field `verify` names when the replay differs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gridrun.spec import RunSpec
from gridrun.train import threads as run_threads
from gridrun.train.world import World

# what decides a run's bits, besides its config (environment.REPRODUCE: the machine's side)
FIELDS = ("threads", "devices", "world_size", "reduce", "torch", "device_type")
# under reduce = "invariant" the device count changes nothing (train/loop/combine.py)
COUNTS = ("devices", "world_size")


@dataclass(frozen=True)
class Attempt:
    """This start of the run: its record, and the threads it computes with."""

    record: dict[str, Any]
    earlier: tuple[dict[str, Any], ...]  # the attempts the resumed checkpoint was trained by

    @property
    def threads(self) -> int:
        return self.record["threads"]

    @property
    def history(self) -> list[dict[str, Any]]:
        return [*self.earlier, self.record]


def begin(run: RunSpec, world: World, device_type: str, torch_version: str,
          saved: Mapping[str, Any] | None, legacy_threads: int | None = None) -> Attempt:
    """This attempt of `run`: from step 0 without `saved` (a checkpoint), else after the
    attempts that checkpoint records. `legacy_threads`: the threads an older version's
    checkpoint was trained with (its summary.json says), for one that records none."""
    earlier = tuple(a for a in (saved or {}).get("attempts") or () if isinstance(a, dict))
    if saved is not None and not earlier and legacy_threads:
        earlier = ({"attempt": 1, "from_step": 0, "threads": legacy_threads},)
    value = run.trainer.get("threads", run_threads.AUTO)
    first = earlier[0].get("threads") if earlier else None
    if value == run_threads.AUTO and isinstance(first, int) and first >= 1:
        n = first  # kept: a resumed run computes as it began
    else:
        share = world.size > 1 and not world.invariant  # a "ddp" GPU run's ranks share the cores
        n = run_threads.resolve(value, gpu=device_type == "cuda",
                                cores=max(1, run_threads.usable_cores() // world.size)
                                if share else None)
    record = {"attempt": len(earlier) + 1, "from_step": int((saved or {}).get("step", 0)),
              "started_at": time.time(), "threads": n,
              "devices": int(run.trainer.get("devices", 1)), "world_size": world.size,
              "reduce": world.reduce, "torch": torch_version, "device_type": device_type}
    return Attempt(record, earlier)


def changes(attempt: Attempt) -> dict[str, list[Any]]:
    """{field: [the first attempt's value, this one's]} for each field that decides the
    bits and differs from the first attempt's (fields an older record lacks: unknown)."""
    if not attempt.earlier:
        return {}
    first, now = attempt.earlier[0], attempt.record
    out = {}
    for name in FIELDS:
        if name in COUNTS and now["reduce"] == "invariant":
            continue
        if name in first and first[name] != now[name]:
            out[name] = [first[name], now[name]]
    return out


def describe(changed: Mapping[str, Sequence[Any]]) -> str:
    """`devices 2 -> 1, world_size 2 -> 1`."""
    return ", ".join(f"{name} {was} -> {now}" for name, (was, now) in changed.items())


def record_into(summary: dict[str, Any], attempt: Attempt, warn: Callable[[str], None]) -> None:
    """The attempts and every change of environment since the first (this one's and
    earlier resumes') in the summary, and so in every checkpoint written from now on;
    this attempt's change is also said in one line."""
    changed = changes(attempt)
    attempt.record["changed"] = changed
    summary["attempts"] = attempt.history
    summary["environment_changes"] = [
        {"field": name, "from": values[0], "to": values[1], "step": a.get("from_step")}
        for a in attempt.history if isinstance(a.get("changed"), dict)
        for name, values in a["changed"].items() if isinstance(values, list) and len(values) == 2]
    if changed:
        warn(f"resumed at step {attempt.record['from_step']} in another environment "
             f"({describe(changed)}): from here its bits differ from an uninterrupted run's; "
             "start it over with --fresh (gridrun retry or gridrun train) for one environment's")
