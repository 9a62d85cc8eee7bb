"""The `[engine]` table: how runs execute (never part of a run id), checked key by
key like the rest of the file: every problem collected, each with its line, what
was expected and the nearest valid key."""

from __future__ import annotations

import re
from typing import Any

from gridrun.spec.errors import toml_type
from gridrun.spec.keys import suggest_key
from gridrun.spec.model import EngineConfig

BACKENDS = ("local", "ray", "slurm")
# a GPU where another user's process computes (engine/foreign.py): no new run starts
# there ("avoid"), or runs start there beside it ("share")
FOREIGN = ("avoid", "share")
FOREIGN_WORDS = {"allow": "share", "use": "share", "beside": "share", "exclude": "avoid",
                 "skip": "avoid", "free": "avoid"}  # what a person may write for one of them
LOCAL_KEYS = ("gpus", "runs_per_gpu", "cpu_slots", "foreign", "backend", "ray_address")
SLURM_KEYS = ("partition", "gpus_per_run", "cpus_per_run", "mem", "time", "account", "qos",
              "constraint", "max_jobs", "runs_per_job", "slurm_args")
NAMES = LOCAL_KEYS + SLURM_KEYS
# sbatch's own forms: --mem=16G (K/M/G/T, MB when bare); --time=MM, MM:SS, HH:MM:SS,
# D-HH, D-HH:MM, D-HH:MM:SS
MEM = re.compile(r"^\d+[KMGT]?B?$", re.IGNORECASE)
TIME = re.compile(r"^(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2})$")
NAME = re.compile(r"^[A-Za-z0-9._,|&:*()\[\]-]+$")  # partition, account, qos, constraint
SLURM_ARG = re.compile(r"^[a-z][a-z0-9-]*$")
# what submitit or this backend sets itself; given in slurm_args they would fight it
RESERVED_ARGS = ("output", "error", "array", "open-mode", "job-name")


def _int(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def engine_config(table: Any, c: Any) -> EngineConfig:
    """`c` is validate.Checker (problems go there); the config has the valid keys."""
    if not isinstance(table, dict):
        c.add(f"expected a table, got {toml_type(table)}", "engine")
        return EngineConfig()
    fields: dict[str, Any] = {}
    for key, value in table.items():
        path, name = ("engine", key), f"engine.{key}"
        if key not in NAMES:
            c.add(f"unknown key {key!r} in [engine]", *path, key=name,
                  suggestion=suggest_key(key, NAMES))
        elif key == "slurm_args":
            fields[key] = _slurm_args(value, c, path)
        else:
            good, expected, suggestion = _check(key, value)
            if expected is None:
                fields[key] = good
            else:
                c.add(f"expected {expected}, got {value!r}", *path, key=name,
                      suggestion=suggestion)
    return EngineConfig(**{k: v for k, v in fields.items() if v is not None})


def _check(key: str, value: Any) -> tuple[Any, str | None, str | None]:
    """(the value to keep, None, None), or (None, what was expected, a suggestion)."""
    if key == "gpus":
        if value == "auto":
            return "auto", None, None
        if isinstance(value, list) and all(_int(g, 0) for g in value):
            return tuple(value), None, None
        return None, '"auto", [] or an array of GPU indices', None
    if key == "runs_per_gpu" and value == "auto":  # packed by memory (engine/packing.py)
        return "auto", None, None
    if key == "runs_per_gpu":
        return (value, None, None) if _int(value, 1) else (
            None, 'an integer >= 1 or "auto" (as many as their measured memory fits)', None)
    if key in ("cpu_slots", "cpus_per_run", "max_jobs", "runs_per_job"):
        return (value, None, None) if _int(value, 1) else (None, "an integer >= 1", None)
    if key == "gpus_per_run":
        return (value, None, None) if _int(value, 0) else (None, "an integer >= 0 (0: CPU runs)", None)
    if key == "backend":
        if value in BACKENDS:
            return value, None, None
        return None, " or ".join(f'"{b}"' for b in BACKENDS), suggest_key(str(value), BACKENDS)
    if key == "foreign":
        if value in FOREIGN:
            return value, None, None
        return (None, '"avoid" (no new run on a GPU where another user\'s process computes) or '
                '"share" (runs start there beside it)',
                suggest_key(str(value), FOREIGN) or FOREIGN_WORDS.get(str(value).lower()))
    if key == "ray_address":
        if isinstance(value, str) and value:
            return value, None, None
        return None, '"auto", "ray://host:port" or "host:port"', None
    if key == "mem":
        if _int(value, 1):
            return f"{value}M", None, None
        if isinstance(value, str) and MEM.match(value):
            return value, None, None
        return None, 'a size as sbatch --mem takes it, e.g. "16G" or "4000M"', None
    if key == "time":
        if _int(value, 1):
            return str(value), None, None
        if isinstance(value, str) and TIME.match(value):
            return value, None, None
        return None, 'a time limit as sbatch --time takes it, e.g. "4:00:00", "1-12" or minutes', None
    # partition, account, qos, constraint
    if isinstance(value, str) and NAME.match(value):
        return value, None, None
    return None, "a non-empty string of SLURM name characters", None


def _slurm_args(value: Any, c: Any, path: tuple[str, ...]) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        c.add(f'expected a table of sbatch options, e.g. {{ reservation = "mine", '
              f"exclusive = true }}, got {value!r}", *path, key="engine.slurm_args")
        return None
    good = {}
    for opt, v in value.items():
        where = (*path, opt)
        if not SLURM_ARG.match(opt):
            c.add(f"{opt!r} is not an sbatch option name (long form without the dashes, "
                  'e.g. "reservation")', *where, key=f"engine.slurm_args.{opt}")
        elif opt in RESERVED_ARGS:
            c.add(f"--{opt} is set by gridrun itself and cannot be given", *where,
                  key=f"engine.slurm_args.{opt}")
        elif v is True or (isinstance(v, str | int) and not isinstance(v, bool)):
            good[opt] = v
        else:
            c.add(f"expected a string, an integer or true (a flag), got {v!r}", *where,
                  key=f"engine.slurm_args.{opt}")
    return good
