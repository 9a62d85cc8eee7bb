"""How far a run has got, from its metrics lines: the one such calculation.

`fold(records, previous=...)` is pure and incremental: folding new lines into
the Progress of the earlier ones gives what folding all of them at once gives.
Every view of a live run uses it: the interface's runs table and detail,
`gridrun run`'s progress lines, analysis of runs without a summary.

"Best" is the early-stop metric's best evaluation in the direction the task
declares (the start line says both), found as the trainer finds it: strictly
better, and an evaluation with a non-finite value never counts. For a log from
before declarations, what the caller knows seeds the fold (`Progress.known`,
from the summary of an earlier attempt or the run's config); what is still
missing falls back to `records.direction`.

No torch, no pandas: the interface imports this.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gridrun.runs import records as rec
from gridrun.runs.records import Summary

# between two log points, more wall time than this many times the steps' own time
# (plus a minute) is a pause (the run was stopped and resumed), not the pace
_PAUSE_FACTOR, _PAUSE_SLACK_S = 10.0, 60.0
_PACE_WEIGHT = 0.3  # of the latest interval in the pace's moving average

# flags a view shows beside a run
INPUT_BOUND = "input-bound"  # waits for its DataLoader more than INPUT_BOUND_SHARE of the time
MEMORY_CREEP = "memory creep"  # its memory grew steadily over the last CREEP_POINTS log points
INPUT_BOUND_SHARE = 0.3
WAIT_POINTS = 5  # log points the data wait is averaged over (the first one starts workers: skipped)
CREEP_POINTS = 8
CREEP_GROWTH = 0.02  # growth, of the first of those points, below which memory is flat


@dataclass(frozen=True)
class Progress:
    step: int = 0
    total_steps: int | None = None
    epoch: int = 0
    train_loss: float | None = None  # the last train line's
    last: Mapping[str, float | None] = field(default_factory=dict)  # the last evaluation
    metrics: Mapping[str, str] = field(default_factory=dict)  # declared directions
    early_stop_metric: str | None = None
    best: float | None = None  # the early-stop metric's best value
    best_step: int | None = None
    best_values: Mapping[str, float | None] = field(default_factory=dict)  # that evaluation
    own_best: Mapping[str, float | None] = field(default_factory=dict)  # each metric's own best
    samples_per_s: float | None = None  # over the last log interval
    tokens_per_s: float | None = None
    speed_sum: float = 0.0  # samples/s summed over the train lines that had it
    speed_count: int = 0
    t: float | None = None  # the time of the last line
    s_per_step: float | None = None  # wall time per step, evaluations included (moving average)
    lines: int = 0
    grad_norm: float | None = None  # the last train line's
    data_wait: float | None = None  # the last train line's
    waits: tuple[float, ...] = ()  # the data wait of the last WAIT_POINTS train lines, the first left out
    memory: tuple[float, ...] = ()  # the memory figure of the last CREEP_POINTS train lines
    _train: tuple[float, int] | None = None  # (t, step) of the last train line

    @classmethod
    def known(cls, summary: Summary | None = None, *,
              early_stop_metric: str | None = None) -> Progress:
        """A fold's start from what is known besides the log (used only where the
        log's start line does not say): an earlier attempt's summary, the config's
        early-stop metric."""
        s = summary or Summary()
        return cls(total_steps=s.total_steps, metrics=dict(s.metrics),
                   early_stop_metric=s.early_stop_metric or early_stop_metric or None)

    @property
    def metric(self) -> str | None:
        """The metric "best" is about: declared, or the first one evaluated."""
        return self.early_stop_metric or next(iter(self.last), None)

    @property
    def direction(self) -> str | None:
        m = self.metric
        return rec.direction(m, self.metrics) if m else None

    @property
    def mean_samples_per_s(self) -> float | None:
        return self.speed_sum / self.speed_count if self.speed_count else None

    def fraction(self, epochs: int | None = None) -> float | None:
        """How much is done, 0..1: by steps, or by epochs for a log without a length."""
        if self.total_steps:
            return min(1.0, self.step / self.total_steps)
        if epochs:
            return min(1.0, self.epoch / epochs)
        return None

    def eta(self, now: float | None = None) -> float | None:
        """Seconds left, at `now` (default: the time of the last line)."""
        if not self.total_steps or self.s_per_step is None or self.t is None:
            return None
        left = (self.total_steps - self.step) * self.s_per_step
        return max(0.0, left - max(0.0, (now if now is not None else self.t) - self.t))

    @property
    def flags(self) -> tuple[str, ...]:
        """INPUT_BOUND and MEMORY_CREEP, when they apply."""
        out = []
        if self.waits and sum(self.waits) / len(self.waits) > INPUT_BOUND_SHARE:
            out.append(INPUT_BOUND)
        m = self.memory
        if len(m) == CREEP_POINTS and m[-1] > m[0] * (1 + CREEP_GROWTH) and all(
                b >= a for a, b in itertools.pairwise(m)):
            out.append(MEMORY_CREEP)
        return tuple(out)

    @property
    def ends_at(self) -> float | None:
        eta = self.eta()
        return None if eta is None or self.t is None else self.t + eta


def _finite(values: Mapping[str, Any]) -> bool:
    return all(isinstance(v, int | float) for v in values.values())  # null: non-finite, as written


def fold(records: Iterable[Mapping[str, Any]], *, previous: Progress | None = None) -> Progress:
    """`previous` (or a fresh Progress) with `records` (the next lines of the log) folded in."""
    p = previous or Progress()
    new: dict[str, Any] = {}
    get = new.get
    for line in records:
        split, step, t = line.get(rec.SPLIT), line.get(rec.STEP, 0), line.get(rec.T)
        new.update(step=step, epoch=line.get(rec.EPOCH, 0), t=t, lines=get("lines", p.lines) + 1)
        if split == rec.START:
            said = rec.start_fields(line)
            if said.total_steps is not None:
                new["total_steps"] = said.total_steps
            if said.metrics:
                new["metrics"] = said.metrics
            if said.early_stop_metric is not None:
                new["early_stop_metric"] = said.early_stop_metric
        elif split == rec.TRAIN:
            new["train_loss"] = line.get(rec.LOSS)
            speed = line.get(rec.SAMPLES_PER_S)
            new["samples_per_s"], new["tokens_per_s"] = speed, line.get(rec.TOKENS_PER_S)
            if isinstance(speed, int | float):
                new["speed_sum"] = get("speed_sum", p.speed_sum) + speed
                new["speed_count"] = get("speed_count", p.speed_count) + 1
            before = get("_train", p._train)
            if before is not None and isinstance(t, int | float) and step > before[1]:
                dt, steps = t - before[0], step - before[1]
                busy = line.get(rec.STEP_TIME)
                busy = busy * steps if isinstance(busy, int | float) else 0.0
                if 0 <= dt <= _PAUSE_FACTOR * busy + _PAUSE_SLACK_S:
                    pace, was = dt / steps, get("s_per_step", p.s_per_step)
                    new["s_per_step"] = pace if was is None else (
                        _PACE_WEIGHT * pace + (1 - _PACE_WEIGHT) * was)
            if isinstance(t, int | float):
                new["_train"] = (t, step)
            new["grad_norm"] = line.get(rec.GRAD_NORM)
            wait = new["data_wait"] = line.get(rec.DATA_WAIT)
            if isinstance(wait, int | float) and before is not None:
                new["waits"] = (*get("waits", p.waits), wait)[-WAIT_POINTS:]
            mem = next((line[k] for k in rec.MEMORY if isinstance(line.get(k), int | float)), None)
            if mem is not None:
                new["memory"] = (*get("memory", p.memory), mem)[-CREEP_POINTS:]
        elif split == rec.VAL:
            values = rec.metric_items(line)
            new["last"] = values
            new["own_best"] = rec.own_best(get("own_best", p.own_best), values,
                                           get("metrics", p.metrics))
            metric = get("early_stop_metric", p.early_stop_metric) or next(iter(values), None)
            value = values.get(metric) if metric else None
            if value is None or not _finite(values):
                continue
            way = rec.direction(metric, get("metrics", p.metrics))
            if rec.better(value, get("best", p.best), way):
                new.update(best=value, best_step=step, best_values=values)
    return replace(p, **new) if new else p
