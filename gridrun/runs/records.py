"""The shapes of a run's records: its metrics lines and its summary.

This module is their one owner. A metrics line is a flat JSON object; which
fields place it (`t`, `step`, `epoch`, `split`), which belong to the loop
(`lr`, timings) and which are the task's metrics is said here once, and so is
every field of `summary.json` (`Summary`). Writers build lines with
`start_line` (the others are plain dicts with these names) and the worker writes
a `Summary`; readers go through `record`, `metric_items`, `start_fields` and
`Summary.from_json`, which treat what they read as untrusted: a value of the
wrong shape is dropped, never a crash.

No torch, no pandas: the interface imports this.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypedDict

# ---- splits: what a line records
START = "start"  # the first line of a run: its length and what it tracks
TRAIN = "train"  # a log point: the mean training loss since the last one, lr, throughput
VAL = "val"  # an evaluation: the task's validation metrics

# ---- directions a task declares for its metrics
LOWER, HIGHER = "lower", "higher"
DIRECTIONS = (LOWER, HIGHER)
LOWER_HINTS = ("loss", "error", "perplexity")  # the guess for a log that declares nothing

# ---- the fields of a line
T, STEP, EPOCH, SPLIT = "t", "step", "epoch", "split"
# EPOCH is the epochs completed when the line was written (after its step), on every
# line, log line and summary; logs without a start line's FORMAT (>= 2) wrote a train
# line at an epoch's last step with the epoch in progress (one less)
PLACE = frozenset({T, STEP, EPOCH, SPLIT})  # where a line is: on every line
TOTAL_STEPS, METRICS, EARLY_STOP_METRIC = "total_steps", "metrics", "early_stop_metric"  # start
FORMAT = "format"  # start: the version of these definitions the log was written with
CURRENT_FORMAT = 2
LOSS = "loss"  # a train line's one metric
LR, SAMPLES_PER_S, STEP_TIME, TOKENS_PER_S = "lr", "samples_per_s", "step_time", "tokens_per_s"
# diagnostics of a train line, all read in the log point's one host sync (or host-side):
GRAD_NORM = "grad_norm"  # the global gradient norm before clipping, at the log point's step
CLIPPED = "clipped"  # the share of the interval's steps where clipping bit (with clip_grad only)
DATA_WAIT = "data_wait"  # the share of the interval's wall time spent waiting for the DataLoader
MEM_ALLOCATED, MEM_RESERVED, MEM_PEAK = "mem_allocated", "mem_reserved", "mem_peak"  # CUDA bytes
RSS = "rss"  # the process's resident memory in bytes, on the CPU
MEMORY = (MEM_ALLOCATED, RSS)  # the one memory figure a line has, by device
LOOP = frozenset({LR, SAMPLES_PER_S, STEP_TIME, TOKENS_PER_S, GRAD_NORM, CLIPPED, DATA_WAIT,
                  MEM_ALLOCATED, MEM_RESERVED, MEM_PEAK, RSS})  # the loop's values on a train line
TIMING = frozenset({T, SAMPLES_PER_S, STEP_TIME, TOKENS_PER_S, DATA_WAIT, MEM_ALLOCATED,
                    MEM_RESERVED, MEM_PEAK, RSS})  # differ between identical replays
NOT_METRICS = PLACE | LOOP | {TOTAL_STEPS, METRICS, EARLY_STOP_METRIC, FORMAT}


class StartLine(TypedDict, total=False):
    t: float
    step: int
    epoch: int
    split: str  # START
    total_steps: int
    metrics: dict[str, str]  # {name: LOWER | HIGHER}, as the task declares them (derived too)
    early_stop_metric: str  # the metric "best" is about
    format: int  # CURRENT_FORMAT


class TrainLine(TypedDict, total=False):
    t: float
    step: int
    epoch: int
    split: str  # TRAIN
    loss: float | None
    lr: float
    samples_per_s: float | None
    step_time: float
    tokens_per_s: float | None  # only for tasks that count tokens
    grad_norm: float | None  # null: non-finite (an fp16 step the scaler skipped)
    clipped: float  # only with clip_grad
    data_wait: float
    mem_allocated: int  # these three on CUDA
    mem_reserved: int
    mem_peak: int  # since the previous log point
    rss: int  # this one on the CPU


class ValLine(TypedDict, total=False):  # plus one field per validation metric
    t: float
    step: int
    epoch: int
    split: str  # VAL


def start_line(t: float, total_steps: int, metrics: Mapping[str, str],
               early_stop_metric: str) -> StartLine:
    return {T: t, STEP: 0, EPOCH: 0, SPLIT: START, TOTAL_STEPS: total_steps,
            METRICS: dict(metrics), EARLY_STOP_METRIC: early_stop_metric, FORMAT: CURRENT_FORMAT}


def log_format(first: Mapping[str, Any] | None) -> int:
    """The FORMAT a log was written with, from its first line (1: before the field)."""
    value = (first or {}).get(FORMAT) if (first or {}).get(SPLIT) == START else None
    return value if type(value) is int else 1


def train_line(t: float, step: int, epoch: int, loss: float, lr: float,
               samples_per_s: float | None, step_time: float, *, counts_tokens: bool = False,
               tokens_per_s: float | None = None,
               diagnostics: Mapping[str, float | int | None] | None = None) -> TrainLine:
    """A log point; `tokens_per_s` only for a task that counts tokens; `diagnostics`
    holds the fields named above (GRAD_NORM ... RSS) that apply to this run."""
    line: TrainLine = {T: t, STEP: step, EPOCH: epoch, SPLIT: TRAIN, LOSS: loss, LR: lr,
                       SAMPLES_PER_S: samples_per_s, STEP_TIME: step_time}
    if counts_tokens:
        line[TOKENS_PER_S] = tokens_per_s
    for key, value in (diagnostics or {}).items():
        if key not in LOOP:
            raise ValueError(f"{key!r} is not a diagnostic of a train line")
        line[key] = None if isinstance(value, float) and not math.isfinite(value) else value
    return line


def val_line(t: float, step: int, epoch: int, metrics: Mapping[str, float]) -> ValLine:
    return {T: t, STEP: step, EPOCH: epoch, SPLIT: VAL, **metrics}


def direction(metric: str, declared: Mapping[str, str] | None = None) -> str:
    """LOWER or HIGHER: as declared, else the one guess (a name with loss, error or
    perplexity in it is lower-is-better) for records from before declarations."""
    said = (declared or {}).get(metric)
    if said in DIRECTIONS:
        return said
    return LOWER if any(h in metric.lower() for h in LOWER_HINTS) else HIGHER


def better(value: float, best: float | None, way: str) -> bool:
    """Whether `value` improves on `best` going `way` (ties do not)."""
    return best is None or (value < best if way == LOWER else value > best)


def own_best(previous: Mapping[str, Any], values: Mapping[str, Any],
             declared: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Each metric's own best value so far: `previous` with the evaluation `values`
    folded in, each metric strictly better in its own direction. As for "best", an
    evaluation with a non-finite value (or a null) never counts. The trainer keeps it
    (summary.json's `own_best`) and the fold (progress.py) for live runs."""
    if not all(_number(v) and math.isfinite(v) for v in values.values()):
        return dict(previous)
    out = dict(previous)
    for name, value in values.items():
        if better(value, out.get(name), direction(name, declared)):
            out[name] = value
    return out


# --------------------------------------------------------------------------- lines

_VALUE_TYPES = frozenset((int, float, str, type(None)))
_INF = math.inf


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _directions(value: Any) -> dict[str, str] | None:
    if not isinstance(value, dict):
        return None
    return {k: v for k, v in value.items() if isinstance(k, str) and v in DIRECTIONS}


def _start(value: dict[str, Any]) -> dict[str, Any] | None:
    """A start line's declarations checked (dropped when not of their shape), then
    the rest checked as any line."""
    declared = {}
    if METRICS in value and (metrics := _directions(value[METRICS])) is not None:
        declared[METRICS] = metrics
    if isinstance(value.get(EARLY_STOP_METRIC), str):
        declared[EARLY_STOP_METRIC] = value[EARLY_STOP_METRIC]
    rest = {k: v for k, v in value.items() if k not in (METRICS, EARLY_STOP_METRIC)}
    if record(rest) is None:
        return None
    return {**rest, **declared}


def record(value: Any) -> dict[str, Any] | None:
    """`value` as a metrics line, or None when it does not have the shape of one:
    an object whose `step` (and `epoch`, if any) is a whole number, `split` a name,
    `t` a number, and every other value a number or null (a start line may also
    declare `metrics` and `early_stop_metric`). NaN and infinities (which JSON
    lacks but a hand-edited line may hold) read as null, as written."""
    if type(value) is not dict:
        return None
    step, epoch, t = value.get(STEP), value.get(EPOCH, 0), value.get(T, 0)
    if not (type(step) is int and type(epoch) is int and _number(t)
            and type(value.get(SPLIT)) is str):
        return None
    values = list(value.values())
    kinds = list(map(type, values))  # whole-line checks at C speed: this is every reader's hot loop
    if kinds.count(str) != 1 or not _VALUE_TYPES.issuperset(kinds):
        # a string besides split, a list, an object, a bool: only a start line's declarations
        return _start(value) if value[SPLIT] == START and (
            METRICS in value or EARLY_STOP_METRIC in value) else None
    if _INF in values or -_INF in values:  # 1e999 (NaN and Infinity are read as null)
        for key, v in value.items():
            if v in (_INF, -_INF):
                value[key] = None
    return value


def metric_items(line: Mapping[str, Any]) -> dict[str, float | None]:
    """The metrics of a train or val line ({name: value}, null for a non-finite
    one): the train loss, or the task's validation metrics. None of a start line."""
    if line.get(SPLIT) == START:
        return {}
    return {k: v for k, v in line.items() if k not in NOT_METRICS}


def values(line: Mapping[str, Any]) -> dict[str, float | None]:
    """Every value a train or val line holds besides its place: its metrics and
    the loop's values (lr, throughput), for curves and exports."""
    if line.get(SPLIT) == START:
        return {}
    return {k: v for k, v in line.items() if k not in PLACE}


@dataclass(frozen=True)
class Declared:
    """What a start line says: the run's length, its metrics' directions, and the
    metric its best value is about (each None or empty when not said)."""

    total_steps: int | None = None
    metrics: Mapping[str, str] = field(default_factory=dict)
    early_stop_metric: str | None = None


def start_fields(line: Mapping[str, Any]) -> Declared:
    total = line.get(TOTAL_STEPS)
    metric = line.get(EARLY_STOP_METRIC)
    return Declared(total if type(total) is int and total > 0 else None,
                    _directions(line.get(METRICS)) or {},
                    metric if isinstance(metric, str) and metric else None)


# --------------------------------------------------------------------------- summary.json

def _values(v: Any) -> dict[str, float | None] | None:
    if not isinstance(v, dict):
        return None
    return {k: x for k, x in v.items() if isinstance(k, str) and (x is None or _number(x))}


def _strings(v: Any) -> list[str] | None:
    return [x for x in v if isinstance(x, str)] if isinstance(v, list | tuple) else None


@dataclass(frozen=True)
class Summary:
    """summary.json: what the worker writes when a run ends, and what every reader
    (the engine, the interface, analysis, exports, doctor) reads. `from_json` is
    total: anything that is not an object is None, a field of the wrong type reads
    as its default, unknown fields are left out."""

    run_id: str | None = None
    experiment: str | None = None
    variant: str | None = None
    ablation: str | None = None
    seed: int | None = None
    task: str | None = None
    status: str | None = None
    step: int | None = None
    epoch: int | None = None
    total_steps: int | None = None
    metrics: dict[str, str] = field(default_factory=dict)  # {name: LOWER | HIGHER}, declared
    early_stop_metric: str | None = None
    final: dict[str, float | None] = field(default_factory=dict)  # the last evaluation
    best: dict[str, float | None] = field(default_factory=dict)  # the evaluation best in early_stop_metric
    own_best: dict[str, float | None] = field(default_factory=dict)  # each metric's own best value
    best_step: int | None = None
    train_loss: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    peak_memory_bytes: float | None = None
    peak_reserved_bytes: float | None = None  # CUDA's reserved memory at its peak (None on the CPU)
    memory_budget_bytes: float | None = None  # the engine's budget for a run it packed by memory
    memory_needed_bytes: float | None = None  # what a run over its budget measured it needed
    started_at: float | None = None
    ended_at: float | None = None
    wall_time_s: float | None = None
    device: str | None = None
    torch_version: str | None = None
    determinism: dict[str, Any] | None = None
    precision: str | None = None
    error: str | None = None
    traceback: str | None = None
    diverged_step: int | None = None
    resumed_from_step: int | None = None
    weights_sha256: str | None = None
    data_wait: float | None = None  # the share of training time spent waiting for data
    input_bound: dict[str, Any] | None = None  # waited too long: the numbers and the remedies
    parameters: dict[str, Any] | None = None  # {"total": n, "trainable": n}
    dtype: str | None = None  # the parameters' dtype(s), e.g. "float32"
    unused_parameters: list[str] = field(default_factory=list)  # trainable, no grad at step 1
    environment: dict[str, Any] | None = None  # versions, GPU, CUDA_VISIBLE_DEVICES (environment.py)
    divergence: dict[str, Any] | None = None  # where a diverged run broke (diverge.py)
    randomness: dict[str, Any] | None = None  # each source's seed, separate streams, switches off
    warnings: list[str] = field(default_factory=list)
    # each start of the training loop since step 0 and the fields deciding its bits (train/loop/attempts.py)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    # {field, from, to, step}: a resume that could not keep one of them
    environment_changes: list[dict[str, Any]] = field(default_factory=list)
    provenance: dict[str, Any] | None = None  # git commit, dirty flag (older summaries)

    @property
    def best_value(self) -> float | None:
        """The best value of the early-stop metric."""
        return self.best.get(self.early_stop_metric) if self.early_stop_metric else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v
        return out

    @classmethod
    def from_json(cls, data: Any, *, strict: bool = False) -> Summary | None:
        """`data` (a parsed summary.json, or the store's copy) as a Summary; None
        unless it is an object. With `strict` (for writers and tests), a field that
        is unknown or of the wrong type raises ValueError instead of being dropped."""
        if not isinstance(data, dict):
            return None
        kept: dict[str, Any] = {}
        wrong = []
        for name, value in data.items():  # the summary's own keys: most of the fields or fewer
            clean = _CLEANERS.get(name)
            if clean is None:
                wrong.append(name)
            elif value is not None:
                got = clean(value)
                if got is None or (strict and got != value):
                    wrong.append(name)
                if got is not None:
                    kept[name] = got
        if strict and wrong:
            raise ValueError(f"summary fields of the wrong type or unknown: {', '.join(wrong)}")
        return cls(**kept)


# how a field read from a file is cleaned, by its declared type: the value kept, or None
_BY_TYPE: dict[str, Any] = {
    "str | None": lambda v: v if isinstance(v, str) else None,
    "int | None": lambda v: v if type(v) is int else None,
    "float | None": lambda v: v if _number(v) else None,
    "dict[str, Any] | None": lambda v: v if isinstance(v, dict) else None,
    "dict[str, str]": _directions,
    "dict[str, float | None]": _values,
    "list[str]": _strings,
    "list[dict[str, Any]]": lambda v: [x for x in v if isinstance(x, dict)] if isinstance(v, list) else None,
}
_CLEANERS = {f.name: _BY_TYPE[f.type] for f in fields(Summary)}


def change_text(change: dict[str, Any]) -> str:
    """One of summary.json's `environment_changes` for people: `threads 2 -> 1 at step 6`
    (ls, the interface's detail and verify say it so)."""
    return (f"{change.get('field')} {change.get('from')} -> {change.get('to')} "
            f"at step {change.get('step')}")
