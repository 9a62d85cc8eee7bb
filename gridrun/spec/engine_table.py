"""The `[engine]` table: how runs execute (never part of a run id), checked key by
key like the rest of the file: every problem collected, each with its line, what
was expected and the nearest valid key."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, NamedTuple

from gridrun.spec.errors import toml_type
from gridrun.spec.keys import show_value, suggest_key
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


class Bound(NamedTuple):
    most: int
    why: str  # why no real machine or cluster needs more
    instead: str  # what to write instead


# Every count of the table has a bound: far beyond what a real machine or cluster needs,
# small enough that what the engine builds from it (a slot per GPU x runs_per_gpu, per CPU
# slot, per SLURM job) costs nothing. A count past it is a typo or a stray exponent:
# `runs_per_gpu = 1000000000` made an engine build a billion slots (issue 45). Refused
# when a file is read; an engine reading an older config uses the bound (`bounded`).
BOUNDS = {
    "runs_per_gpu": Bound(64, "each run on a GPU is a process with its own CUDA context, "
                          "0.3 to 0.5 GiB before it computes", 'write runs_per_gpu = "auto" to pack '
                          "as many as their measured memory fits, or the number you want"),
    "cpu_slots": Bound(4096, "the largest single machines have about 2,000 hardware threads, and "
                       "the runs' threads cap CPU runs at the usable cores anyway",
                       "write cpu_slots = the number of CPU runs you want at once"),
    "gpus_per_run": Bound(64, "a job's GPUs are one node's, and the largest nodes hold 8 to 16",
                          "write gpus_per_run = the GPUs one run uses (a run on several devices "
                          "asks for its devices itself)"),
    "cpus_per_run": Bound(4096, "a job's CPUs are one node's, and the largest nodes have about "
                          "2,000 hardware threads", "write cpus_per_run = the CPUs one run uses"),
    "max_jobs": Bound(10_000, "SLURM's default MaxJobCount, the most jobs a whole cluster's queue holds",
                      "write max_jobs = how many runs may be pending or running at once"),
    "runs_per_job": Bound(10_000, "a job packs runs launched together, and no more than max_jobs "
                          "(at most 10,000) are", "write runs_per_job = at most max_jobs"),
}
MAX_GPU = 255  # gpus: an index past any machine's (the largest hold 16 to 20 GPUs)

# What each key is, for the reference page (scripts/docs.py writes it with EngineConfig's
# defaults and the bounds above): (TOML type, meaning)
DOCS = {
    "gpus": ('"auto" or array of integers', 'the GPUs runs may use: "auto" every GPU NVML sees, '
             "[] none (CPU runs only), or their indices"),
    "runs_per_gpu": ('integer or "auto"', 'runs at once on each GPU ("auto": as many as their '
                     "measured memory fits)"),
    "cpu_slots": ("integer", "runs at once on the CPU (their threads never more than the usable "
                  "cores)"),
    "foreign": ("string", '"avoid": no new run on a GPU where another user\'s process computes; '
                '"share": runs start there beside it'),
    "backend": ("string", '"local" (this machine), "ray" (a Ray cluster) or "slurm" (a job per '
                "run, or per pack of runs)"),
    "ray_address": ("string", 'the Ray cluster (backend = "ray"): "auto", "ray://host:port" or '
                    '"host:port"'),
    "partition": ("string", 'the SLURM partition (backend = "slurm"; unset: the cluster\'s '
                  "default, as for every SLURM key)"),
    "gpus_per_run": ("integer", "the GPUs a SLURM job asks for (0: CPU runs)"),
    "cpus_per_run": ("integer", "the CPUs a SLURM job asks for"),
    "mem": ("string or integer", 'a job\'s memory as sbatch --mem takes it, e.g. "16G" (a number: '
            "MB)"),
    "time": ("string or integer", 'a job\'s time limit as sbatch --time takes it, e.g. "4:00:00" '
             'or "1-12" (a number: minutes)'),
    "account": ("string", "the SLURM account charged"),
    "qos": ("string", "the SLURM quality of service"),
    "constraint": ("string", "the node features a job needs (sbatch --constraint)"),
    "max_jobs": ("integer", "runs pending or running on the cluster at once"),
    "runs_per_job": ("integer", "runs one job runs one after another"),
    "slurm_args": ("table", 'any other sbatch option, e.g. { reservation = "mine", exclusive = '
                   "true }"),
}


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
            past = _past_bound(key, good) if expected is None else None
            expected, advice = past if past else (expected, None)
            if expected is None:
                fields[key] = good
            else:
                c.add(f"expected {expected}, got {show_value(value)}" + (f": {advice}" if advice else ""),
                      *path, key=name, suggestion=suggestion)
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


def _past_bound(key: str, good: Any) -> tuple[str, str] | None:
    """(what was expected, why and what to write instead) for a valid value past its bound."""
    if key == "gpus" and good != "auto":
        expected = f'"auto", [] or an array of GPU indices, each once, from 0 to {MAX_GPU}'
        beyond = next((g for g in good if g > MAX_GPU), None)
        if beyond is not None:
            return expected, (f"no machine has a GPU {show_value(beyond)} (the largest hold 16 to "
                              "20); write the indices nvidia-smi lists, e.g. gpus = [0, 1], or "
                              'gpus = "auto" for every GPU')
        twice = next((g for i, g in enumerate(good) if g in good[:i]), None)
        if twice is not None:
            return expected, (f"GPU {twice} is listed twice; list each GPU once (runs_per_gpu = 2 "
                              "puts two runs on each)")
    bound = BOUNDS.get(key)
    if bound is None or good == "auto" or good <= bound.most:
        return None
    low = 0 if key == "gpus_per_run" else 1
    auto = ' or "auto"' if key == "runs_per_gpu" else ""
    return f"an integer >= {low} and <= {bound.most:,}{auto}", f"{bound.why}; {bound.instead}"


def bounded(config: EngineConfig) -> tuple[EngineConfig, list[str]]:
    """`config` with every count within its bound, and a line for each one changed: for an
    engine that reads a config saved before the bounds (or written into the store by hand),
    which must never build a billion slots. A count that is not one at all is the default."""
    changed: dict[str, Any] = {}
    notes = []
    for key, bound in BOUNDS.items():
        value = getattr(config, key)
        if key == "runs_per_gpu" and value == "auto":
            continue
        low = 0 if key == "gpus_per_run" else 1
        if not _int(value, low):
            changed[key] = getattr(EngineConfig, key)
            notes.append(f"[engine] {key} = {show_value(value)} is not an integer >= {low}: "
                         f"using the default, {changed[key]}")
        elif value > bound.most:
            changed[key] = bound.most
            notes.append(f"[engine] {key} = {value} is more than {bound.most} ({bound.why}): "
                         f"using {bound.most}; set it in the file's [engine] and queue it again")
    gpus = config.gpus
    if gpus != "auto":
        listed = tuple(gpus) if isinstance(gpus, list | tuple) else ()
        kept = tuple(dict.fromkeys(g for g in listed if _int(g, 0) and g <= MAX_GPU))
        if kept != listed or not isinstance(gpus, list | tuple):
            changed["gpus"] = kept
            notes.append(f"[engine] gpus = {show_value(gpus)} names GPUs twice, past {MAX_GPU} or "
                         f"not at all: using {show_value(list(kept))}")
    return dataclasses.replace(config, **changed), notes


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
