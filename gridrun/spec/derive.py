"""A run with some keys changed (the interface's clone): checked with the file's
checks and messages, coerced the same way (so `lr=1` is the cell `lr = 1.0`),
its variant labelled with what changed.

Trainer keys need nothing but this package. A task key needs the task
factory's signature, so it imports the task's module (torch, for the built-in
tasks): `needs_task` says beforehand whether a derive will.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from typing import Any

from gridrun.spec import sources
from gridrun.spec.errors import Problem, SpecError
from gridrun.spec.expand import label
from gridrun.spec.keys import (
    RESERVED,
    TRAINER_KEYS,
    TaskSignature,
    check_task_value,
    check_trainer_value,
    suggest_key,
    task_signature,
)
from gridrun.spec.model import RunSpec, run_id

SEED = "seed"  # a clone's own key: the one run's seed (a file's `seeds` replicate cells)
_KEY = re.compile(r"(?:^|(?<=[\s,;]))([A-Za-z_][A-Za-z0-9_-]*)\s*=")
EXAMPLE = "write key=value, several separated by spaces, e.g. lr=0.001 epochs=60"


def _where(run: RunSpec) -> str:
    return f"clone of {run.id}"


def parse_overrides(text: str, *, where: str = "clone") -> dict[str, Any]:
    """`epochs=60 lr=0.005` -> {"epochs": 60, "lr": 0.005}: each value read as a TOML
    value (a bare word is a string); separated by spaces, commas or semicolons."""
    starts = list(_KEY.finditer(text))
    problems: list[Problem] = []
    before = text[:starts[0].start()] if starts else text
    if before.strip(" \t,;"):
        problems.append(Problem(where, f"{before.strip()!r} is not key=value: {EXAMPLE}"))
    out: dict[str, Any] = {}
    for i, m in enumerate(starts):
        key = m.group(1)
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        raw = text[m.end():end].strip().rstrip(",;").strip()
        if not raw:
            problems.append(Problem(where, f"no value given: {EXAMPLE}", key=key))
            continue
        if key in out:
            problems.append(Problem(where, "given twice", key=key))
            continue
        try:
            out[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = raw  # a bare word: checked as the string it is (`optimizer=adamx`)
    if problems:
        raise SpecError(problems)
    return out


def needs_task(overrides: Mapping[str, Any]) -> bool:
    """Whether deriving with these keys reads the task's signature (imports its module)."""
    return any(k not in TRAINER_KEYS and k not in RESERVED and k != SEED for k in overrides)


def _signature(task: str) -> TaskSignature:
    from gridrun import tasks

    return task_signature(tasks.resolve(task))


def derive(run: RunSpec, overrides: Mapping[str, Any] | str) -> RunSpec:
    """`run` with `overrides` applied: a new RunSpec (a new id, unless nothing changed).
    Raises SpecError with every problem, worded as for the same key in a file."""
    if isinstance(overrides, str):
        overrides = parse_overrides(overrides, where=_where(run))
    if not overrides:
        raise SpecError([Problem(_where(run), f"nothing to change: {EXAMPLE}")])
    problems: list[Problem] = []

    def refuse(key: str, message: str, suggestion: str | None = None) -> None:
        problems.append(Problem(_where(run), message, experiment=run.experiment, key=key,
                                suggestion=suggestion))

    trainer, task_args, seed = dict(run.trainer), dict(run.task_args), run.seed
    changed: dict[str, Any] = {}
    signature: TaskSignature | None = None
    for key, value in overrides.items():
        if key == SEED:
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                seed = value
            else:
                refuse(key, f"expected an integer >= 0, got {value!r}")
            continue
        if key in RESERVED or key == sources.VARY:
            hint = {"seeds": "; give seed=N for another seed",
                    sources.VARY: " (it spreads a file's seeds over the sources); pin a "
                                  "source's seed instead, e.g. seed_order=3"}.get(key, "")
            refuse(key, f"{key!r} cannot change in a clone{hint}")
            continue
        if key in TRAINER_KEYS:
            cleaned, expected = check_trainer_value(TRAINER_KEYS[key], value)
            target = trainer
        else:
            if signature is None:
                from gridrun.tasks import TaskNotFound

                try:
                    signature = _signature(run.task)
                except TaskNotFound as exc:
                    refuse("task", str(exc))
                    break
            if key in signature.params:
                cleaned, expected = check_task_value(key, signature.params[key], value)
            elif signature.any_keyword:
                cleaned, expected = value, None
            else:
                known = [*TRAINER_KEYS, *signature.params, SEED]
                refuse(key, f"unknown key {key!r}: not a trainer key and not a parameter of "
                       "the task", suggest_key(key, known))
                continue
            target = task_args
        if expected is not None:
            refuse(key, expected)
            continue
        target[key] = changed[key] = cleaned
    if problems:
        raise SpecError(problems)
    if seed != run.seed:
        trainer = sources.with_seed(trainer, seed)
    words = [w for w in run.variant.split() if w.partition("=")[0] not in changed]
    variant = " ".join(x for x in (" ".join(words), label(changed)) if x)
    return RunSpec(id=run_id(run.experiment, run.task, trainer, task_args, seed),
                   experiment=run.experiment, variant=variant, seed=seed, task=run.task,
                   trainer=trainer, task_args=task_args, axes={**run.axes, **changed},
                   ablation=run.ablation)
