"""The metric names a file gives (early_stop_metric, a search's metric) checked against
the metrics the task declares, once the task check has built it: a name it does not
have is one line in the spec errors' form, before anything is queued (a search's mode
left out is the metric's declared direction: engine/search.py reads it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gridrun.spec.errors import Problem, suggest_metric


def metric_problems(file: str, experiment: str, configs: Sequence[Any],
                    line_of: Callable[..., int | None]) -> list[Problem]:
    """Problems of `experiment`'s metric names; `configs`: its task configurations (each
    with .task, .runs and .metrics, {name: direction} or None when it could not be built);
    `line_of(experiment, *key path)`: the line of a key."""
    wrong: dict[tuple[str, str], Any] = {}
    for c in configs:
        if not c.metrics:
            continue
        for r in c.runs:
            if r.experiment != experiment:
                continue
            metric = r.trainer.get("early_stop_metric")
            search = r.search or {}
            # a search's metric is early_stop_metric too, unless set: said once, as the search's
            if metric and metric not in c.metrics and metric != search.get("metric"):
                wrong.setdefault(("early_stop_metric", metric), c)
            if search.get("metric") and search["metric"] not in c.metrics:
                wrong.setdefault(("search.metric", search["metric"]), c)
    problems = []
    for (key, metric), c in wrong.items():
        where = ("search", "metric") if key == "search.metric" else (key,)
        problems.append(Problem(
            file, f"task {c.task!r}: {key} {metric!r} is not among its metrics "
            f"{', '.join(map(repr, c.metrics or {}))}", line=line_of(experiment, *where),
            experiment=experiment, suggestion=suggest_metric(metric, c.metrics or {})))
    return problems

