"""An ExperimentSpec -> one RunSpec per cell and seed (no file, no task import)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from gridrun.spec import sources
from gridrun.spec.keys import TRAINER_KEYS
from gridrun.spec.model import ExperimentSpec, RunSpec, format_value, run_id
from gridrun.spec.search import first_pause


def label(axes: Mapping[str, Any]) -> str:
    """`lr=0.001 hidden=64`: the part of a variant's name that says its values."""
    return " ".join(f"{k}={format_value(v)}" for k, v in axes.items())


def count_runs(exp: ExperimentSpec) -> int:
    """How many runs `expand(exp)` gives, from the axis lengths alone (nothing is built)."""
    cells = math.prod(len(v) for v in exp.grid.values())
    if exp.zip:
        cells *= len(next(iter(exp.zip.values())))
    variants = 1 + len(exp.ablations) if exp.ablations else 1  # the baseline runs too
    trials = exp.search.trials if exp.search else 1
    return cells * variants * trials * len(exp.seeds)


def expand(exp: ExperimentSpec) -> list[RunSpec]:
    """One RunSpec per cell and seed: defaults < experiment < ablation < grid/zip cell."""
    grid_keys = list(exp.grid)
    cells = [dict(zip(grid_keys, values, strict=True))
             for values in itertools.product(*(exp.grid[k] for k in grid_keys))]
    n_zip = len(next(iter(exp.zip.values()))) if exp.zip else 0
    if exp.zip:
        rows = [{k: v[i] for k, v in exp.zip.items()} for i in range(n_zip)]
        cells = [{**cell, **row} for cell in cells for row in rows]
    varying = [k for k in [*exp.grid, *exp.zip] if len(set(map(repr, (exp.grid | exp.zip)[k]))) > 1]
    variants = [("baseline", {}), *exp.ablations.items()] if exp.ablations else [("", {})]
    if exp.search is None:
        return _runs(exp, [(None, {}, ablation, overrides, cell) for ablation, overrides in variants
                           for cell in cells], varying)
    # a search's trials: each sampled point in each cell, point by point (trial index order)
    points = exp.search.points()
    return _runs(exp, [(i * len(variants) * len(cells) + j * len(cells) + k, point, ablation,
                        overrides, cell)
                       for i, point in enumerate(points)
                       for j, (ablation, overrides) in enumerate(variants)
                       for k, cell in enumerate(cells)], varying)


def _runs(exp: ExperimentSpec, cells: list[tuple[int | None, dict[str, Any], str, Mapping[str, Any],
                                                  dict[str, Any]]],
          varying: list[str]) -> list[RunSpec]:
    """One RunSpec per (trial, point, ablation, overrides, cell) and seed."""
    search = exp.search
    found = search.run_config(exp.name, len(cells)) if search is not None else None
    runs = []
    for trial, point, ablation, overrides, cell in cells:
        resolved = {**exp.keys, **point, **overrides, **cell}
        if search is not None and search.scheduler:  # the schedule of the full budget
            resolved["epochs"] = search.max_epochs
        trainer = {k: key.default for k, key in TRAINER_KEYS.items()}
        trainer.update({k: v for k, v in resolved.items() if k in TRAINER_KEYS})
        task_args = {**exp.task_defaults,
                     **{k: v for k, v in resolved.items() if k not in TRAINER_KEYS}}
        axes = {**{k: cell[k] for k in varying}, **point}
        base = exp.seeds[0]  # with `vary`, the seed of the sources that do not vary
        name = " ".join(x for x in (f"t{trial}" if trial is not None else "", ablation,
                                    label(axes), *sources.label(trainer, axes, base)) if x)
        for seed in exp.seeds:
            mine = sources.apply_vary(trainer, seed, base)
            runs.append(RunSpec(
                id=run_id(exp.name, exp.task, mine, task_args, seed,
                          search=found["id"] if found else None, trial=trial),
                experiment=exp.name, variant=name, seed=seed, task=exp.task,
                trainer=mine, task_args=dict(task_args), axes=axes, ablation=ablation,
                trial=trial, search=found,
                pause_at=first_pause(found, trial) if found and trial is not None else None))
    return runs
