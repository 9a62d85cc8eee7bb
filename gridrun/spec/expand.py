"""An ExperimentSpec -> one RunSpec per cell and seed (no file, no task import)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from gridrun.spec import sources
from gridrun.spec.keys import TRAINER_KEYS
from gridrun.spec.model import ExperimentSpec, RunSpec, format_value, run_id


def label(axes: Mapping[str, Any]) -> str:
    """`lr=0.001 hidden=64`: the part of a variant's name that says its values."""
    return " ".join(f"{k}={format_value(v)}" for k, v in axes.items())


def count_runs(exp: ExperimentSpec) -> int:
    """How many runs `expand(exp)` gives, from the axis lengths alone (nothing is built)."""
    cells = math.prod(len(v) for v in exp.grid.values())
    if exp.zip:
        cells *= len(next(iter(exp.zip.values())))
    variants = 1 + len(exp.ablations) if exp.ablations else 1  # the baseline runs too
    return cells * variants * len(exp.seeds)


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
    runs = []
    for ablation, overrides in variants:
        for cell in cells:
            resolved = {**exp.keys, **overrides, **cell}
            trainer = {k: key.default for k, key in TRAINER_KEYS.items()}
            trainer.update({k: v for k, v in resolved.items() if k in TRAINER_KEYS})
            task_args = {**exp.task_defaults,
                         **{k: v for k, v in resolved.items() if k not in TRAINER_KEYS}}
            axes = {k: cell[k] for k in varying}
            base = exp.seeds[0]  # with `vary`, the seed of the sources that do not vary
            name = " ".join(x for x in (ablation, label(axes),
                                        *sources.label(trainer, axes, base)) if x)
            for seed in exp.seeds:
                mine = sources.apply_vary(trainer, seed, base)
                runs.append(RunSpec(
                    id=run_id(exp.name, exp.task, mine, task_args, seed),
                    experiment=exp.name, variant=name, seed=seed, task=exp.task,
                    trainer=mine, task_args=dict(task_args), axes=axes, ablation=ablation))
    return runs
