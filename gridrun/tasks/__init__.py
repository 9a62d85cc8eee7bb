"""The Task contract and the registry of built-in tasks.

A task factory is any callable whose keyword parameters are the task keys of
the experiment file, returning a `Task`. Built-in tasks are named here as
`module:factory` strings, so nothing is imported until a run needs it.

Near the bottom of the house: imports nothing of gridrun but `gridrun.data`
(the `images` task reads packed files), and torch only in the built-in
tasks' own modules. Users write `from gridrun import Task`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Direction = Literal["lower", "higher"]

BUILTIN: dict[str, str] = {
    "spirals": "gridrun.tasks.spirals:spirals",
    "shapes": "gridrun.tasks.shapes:shapes",
    "sort": "gridrun.tasks.sort:sort",
    "images": "gridrun.tasks.images:images",
}


@dataclass
class Task:
    """What a factory returns; the trainer needs nothing else.

    model       an `nn.Module`; the trainer moves it to the run's device.
    train_data  a map-style `Dataset` (indexable, with `len`).
    val_data    a map-style `Dataset` for evaluation.
    loss        `loss(model, batch) -> Tensor`: the mean training loss of a
                batch already on the device.
    evaluate    `evaluate(model, batch) -> {name: (sum, count)}`: per-batch
                sums and counts (tensors or numbers) for each validation
                metric; the trainer adds them up over the whole validation set
                on the device and divides once at the end.
    metrics     `{name: "lower" | "higher"}`: every name `evaluate` returns and
                which way is better. The first is the default
                `early_stop_metric`.
    collate_fn  optional, passed to the DataLoader.
    count_samples  optional `f(batch) -> int` on the CPU batch; defaults to
                the length of the batch's first tensor.
    count_tokens   optional `f(batch) -> int` on the CPU batch; when given,
                throughput is also reported as tokens per second.
    inputs      optional `f(batch) -> tuple | dict`: what the model is called
                with, for export (`gridrun export-model`); default: the
                batch's first tensor.
    dynamic_shapes  optional `{input: {axis: name}}` (or a tuple in the order
                of `inputs`): the axes an exported model accepts at any size;
                a name is a `torch.export.Dim` of that name, shared by the
                inputs that use it, or give a `Dim` itself (with min/max).
                Default: axis 0 of every input, one shared "batch" dimension.
    """

    model: Any
    train_data: Any
    val_data: Any
    loss: Callable[[Any, Any], Any]
    evaluate: Callable[[Any, Any], Mapping[str, tuple[Any, Any]]]
    metrics: dict[str, Direction]
    collate_fn: Callable[[list[Any]], Any] | None = None
    count_samples: Callable[[Any], int] | None = None
    count_tokens: Callable[[Any], int] | None = None
    inputs: Callable[[Any], Any] | None = None
    dynamic_shapes: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


class TaskNotFound(LookupError):
    """A task name that is neither built in nor an importable `module:factory`."""


def resolve(name: str) -> Callable[..., Task]:
    """The factory for a built-in name or a `package.module:factory` string."""
    target = BUILTIN.get(name, name)
    if ":" not in target:
        raise TaskNotFound(
            f"unknown task {name!r}: built-in tasks are {', '.join(sorted(BUILTIN))}; "
            "a task of your own is written 'package.module:factory'"
        )
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import failure is the user's to see, not a crash
        raise TaskNotFound(f"cannot import module {module_name!r} for task {name!r}: {exc}") from exc
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise TaskNotFound(f"module {module_name!r} has no attribute {attr!r} (task {name!r})") from None
    if not callable(factory):
        raise TaskNotFound(f"{target!r} is not callable (task {name!r})")
    return factory
