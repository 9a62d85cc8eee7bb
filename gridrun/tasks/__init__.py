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
import importlib.util
import math
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Direction = Literal["lower", "higher"]

BUILTIN: dict[str, str] = {
    "spirals": "gridrun.tasks.spirals:spirals",
    "shapes": "gridrun.tasks.shapes:shapes",
    "sort": "gridrun.tasks.sort:sort",
    "images": "gridrun.tasks.images:images",
}


@dataclass(frozen=True)
class InputInfo:
    """How to build one input of an exported model, for whoever feeds it (model.json).

    layout  the axes after the batch axis, one letter each: "HWC" for an image
            of height, width and channels, "L" for a sequence; "" when unsaid.
    range   (low, high): the values the input holds in training, inclusive.
    note    anything else a consumer must know ("0 is padding").
    """

    layout: str = ""
    range: tuple[float, float] | None = None
    note: str = ""


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
    derived     optional `{name: ("lower" | "higher", fn)}`: metrics computed
                from the aggregated ones, once per evaluation, after the
                division: `fn(values)` gets `{name: value}` of every metric (and
                of the derived ones declared before it) and returns a number,
                e.g. `{"perplexity": ("lower", lambda m: math.exp(m["loss"]))}`
                or an F1 from precision and recall. They are recorded, tracked
                (`early_stop_metric`), shown and compared like the others. An
                ArithmeticError (an overflow, a division by zero) records NaN.
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
    preprocess  optional `nn.Module` from a batch of raw samples (as they come off
                disk or the wire, e.g. `uint8` images [batch, H, W, C]) to the
                model's input (a tensor, or a tuple or dict of the model's
                inputs). The task's own data path calls it, so training and
                serving share one definition; `export-model` exports it with
                the model as one graph whose one input, `raw`, is the raw batch.
    raw_val_data  with `preprocess`: a map-style Dataset, item i being
                `val_data[i]` with the model's input in its raw form (e.g.
                `(uint8 image, label)`), so `preprocess(raw) == val_data`'s
                input (checked by `plan --check`) and parity can start from raw
                data.
    input_info  optional `{input name: InputInfo}`: what each exported input holds
                (layout, value range, a note), written to model.json; `"raw"`
                names preprocess's input.
    class_names optional: a classifier's class names, in the order of its
                output's last axis (model.json; `gridrun predict` shows top-k).
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
    preprocess: Any = None
    raw_val_data: Any = None
    input_info: Mapping[str, InputInfo] | None = None
    class_names: Sequence[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    derived: dict[str, tuple[Direction, Callable[[Mapping[str, float]], Any]]] = field(
        default_factory=dict)

    def all_metrics(self) -> dict[str, Direction]:
        """Every metric a run records and which way is better: `metrics`, then `derived`."""
        return {**self.metrics, **{name: way for name, (way, _) in self.derived.items()}}

    def derived_problem(self) -> str | None:
        """What is wrong with the shape of `derived`, or None."""
        if not isinstance(self.derived, Mapping):
            return f"derived is {type(self.derived).__name__}: {DERIVED_SHAPE}"
        for name, value in self.derived.items():
            if not (isinstance(value, tuple | list) and len(value) == 2
                    and value[0] in ("lower", "higher") and callable(value[1])):
                return f"derived[{name!r}] is {value!r}: {DERIVED_SHAPE}"
            if isinstance(self.metrics, Mapping) and name in self.metrics:
                return (f"derived metric {name!r} is also in metrics: name it otherwise "
                        "(evaluate's metrics are aggregated, derived ones computed from them)")
        return None

    def derive(self, values: Mapping[str, float]) -> dict[str, float]:
        """`values` (the aggregated metrics) with the derived metrics added, in order.
        Raises DerivedMetricError naming the metric when one fails."""
        out = dict(values)
        for name, (_, fn) in self.derived.items():
            try:
                value = fn(dict(out))
            except ArithmeticError:
                value = math.nan  # exp of a huge loss, 0/0: not finite, as a NaN loss is
            except Exception as exc:
                raise DerivedMetricError(name, exc, list(out)) from exc
            try:
                out[name] = float(value)
            except (TypeError, ValueError) as exc:
                raise DerivedMetricError(name, exc, list(out), returned=(value,)) from exc
        return out


DERIVED_SHAPE = 'expected {name: ("lower" | "higher", function of the aggregated metrics)}'


class DerivedMetricError(ValueError):
    """A derived metric that failed: str() says which, why, and what it was given."""

    def __init__(self, name: str, exc: BaseException, given: list[str],
                 returned: tuple[Any, ...] = ()):
        self.name, self.exc, self.given = name, exc, given
        if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
            import difflib

            guess = difflib.get_close_matches(exc.args[0], given, n=1, cutoff=0.5)
            hint = f" (did you mean {guess[0]!r}?)" if guess else ""
            why = f"it reads {exc.args[0]!r}, which is not a metric{hint}"
        elif returned:
            why = f"it returned {returned[0]!r}, not a number"
        else:
            lines = [ln for ln in str(exc).splitlines() if ln.strip()]
            why = f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__
        super().__init__(f"derived metric {name!r} failed: {why} "
                         f"(it gets {', '.join(map(repr, given))})")


class TaskNotFound(LookupError):
    """A task name that is neither built in nor an importable `module:factory`."""


# Where a task module that moved in this release used to be, and what to write instead.
MOVED = {"gridrun.engine.tasks": "from gridrun import Task"}


def use_working_directory() -> str:
    """The one import rule for task modules: the current directory comes first on
    sys.path, as `python -m` puts it for the engine's workers (its fork server and
    fresh interpreters start that way). The `gridrun` console script starts with
    its own bin folder there instead; every command, `verify`, `export-model` and
    `load_run` import tasks through `resolve`, which applies this rule first.
    Returns the directory."""
    here = os.getcwd()
    if not ({"", ".", here} & set(sys.path)):
        sys.path.insert(0, here)
    return here


def _import_problem(module_name: str, name: str, exc: BaseException) -> str:
    """One line: what failed, where Python looked, and what to do."""
    text = f"cannot import module {module_name!r} for task {name!r}"
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if missing in MOVED:
        return f"{text}: it imports {missing!r}, which moved in this release: write `{MOVED[missing]}`"
    parts = module_name.split(".")
    if missing and missing in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}:
        top = parts[0]
        return (f"{text}: {exc}; looked in the current directory ({os.getcwd()}) and the "
                f"installed packages of {sys.executable}: install the package (pip install -e "
                f"PATH_TO_IT) or run gridrun from the folder that holds {top}/")
    if missing:
        return f"{text}: it imports {missing!r}, which is not installed ({exc})"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{text}: {type(exc).__name__}: {first}" if first else f"{text}: {type(exc).__name__}"


def resolve(name: str) -> Callable[..., Task]:
    """The factory for a built-in name or a `package.module:factory` string, imported
    under the one import rule (`use_working_directory`)."""
    target = BUILTIN.get(name, name)
    if ":" not in target:
        raise TaskNotFound(
            f"unknown task {name!r}: built-in tasks are {', '.join(sorted(BUILTIN))}; "
            "a task of your own is written 'package.module:factory'"
        )
    module_name, _, attr = target.partition(":")
    if name not in BUILTIN:
        use_working_directory()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import failure is the user's to see, not a crash
        raise TaskNotFound(_import_problem(module_name, name, exc)) from exc
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise TaskNotFound(f"module {module_name!r} has no attribute {attr!r} (task {name!r})") from None
    if not callable(factory):
        raise TaskNotFound(f"{target!r} is not callable (task {name!r})")
    return factory


def user_frame(exc: BaseException, skip: Sequence[str] = ()) -> traceback.FrameSummary | None:
    """The last frame of `exc`'s traceback outside torch and `skip` (files, or folders as
    prefixes): the line of the user's code to name in a one-line error, or None."""
    spec = importlib.util.find_spec("torch")
    torch_dirs = tuple(spec.submodule_search_locations or ()) if spec else ()
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith((*torch_dirs, *skip))]
    return frames[-1] if frames else None
