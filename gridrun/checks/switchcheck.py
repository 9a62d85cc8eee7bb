"""Switches that change nothing: `plan --check` notes a run's `augmentation = false`
that its task ignores (the first training batch is the same with augmentation on
and off: the task never asks `gridrun.randomness.enabled("augment")`, or draws
nothing), `dropout_layers = false` on a model without a dropout module, and
`vary` over the order of runs that do not shuffle. Notes, never problems: the
runs are valid, they just do not isolate what their file says they do."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from gridrun import randomness
from gridrun.spec import RunSpec, sources
from gridrun.tasks import resolve
from gridrun.train.data import SeededBatches
from gridrun.train.seeding import seed_everything, stream_seed
from gridrun.train.switches import dropout_modules

AUGMENT_IGNORED = ("augmentation = false changed nothing it could see: the first training batch "
                   "is the same with augmentation on and off (the task's data code must ask "
                   "gridrun.randomness.enabled(\"augment\"))")
NO_DROPOUT = ("dropout_layers = false changed nothing: no dropout module of the model drops "
              "anything (nn.Dropout*, nn.AlphaDropout, nn.MultiheadAttention with p > 0)")
ORDER_FIXED = ("vary varies the order source of runs with shuffle = false: their data order "
               "is the index order whatever the seed")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _first_batch(task_name: str, task_args: Mapping[str, Any], seed: int, batch_size: int,
                 off: Sequence[str]) -> Any:
    """The first training batch of epoch 0 (indices 0..batch_size-1) with the task built
    and fetched under the switches in `off`, as a run would (same seed, same stream)."""
    previous = randomness.configure(off)
    try:
        seed_everything(seed)
        task = resolve(task_name)(**task_args)
        data = task.train_data
        indices = list(range(min(batch_size, len(data))))
        return SeededBatches(data, task.collate_fn)[(stream_seed(seed, 0, 0), indices)]
    finally:
        randomness.configure(previous)


def switch_notes(task_name: str, task_args: Mapping[str, Any], runs: Sequence[RunSpec],
                 batch_size: int) -> dict[str, list[str]]:
    """{experiment: what the switches of its runs would not change}, for one task
    configuration's runs (the task is built again only for the switches some run uses)."""
    seed = runs[0].seed
    found: dict[str, bool] = {}
    if any(r.trainer.get("augmentation", True) is False for r in runs):
        with contextlib.suppress(Exception):  # the task check reports a task that fails
            found[AUGMENT_IGNORED] = _same(
                _first_batch(task_name, task_args, seed, batch_size, ()),
                _first_batch(task_name, task_args, seed, batch_size, ("augment",)))
    if any(r.trainer.get("dropout_layers", True) is False for r in runs):
        seed_everything(seed)
        with contextlib.suppress(Exception):
            model = resolve(task_name)(**task_args).model
            found[NO_DROPOUT] = isinstance(model, torch.nn.Module) and not dropout_modules(model)
    out: dict[str, list[str]] = {}
    for run in runs:
        t = run.trainer
        vary = t.get(sources.VARY, sources.ALL)
        said = [found.get(AUGMENT_IGNORED) and t.get("augmentation", True) is False and AUGMENT_IGNORED,
                found.get(NO_DROPOUT) and t.get("dropout_layers", True) is False and NO_DROPOUT,
                vary != sources.ALL and "order" in sources.varied(vary)
                and t.get("shuffle", True) is False and ORDER_FIXED]
        mine = out.setdefault(run.experiment, [])
        mine += [note for note in said if note and note not in mine]
    return {experiment: notes for experiment, notes in out.items() if notes}
