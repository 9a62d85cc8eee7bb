"""Check a file's tasks before anything runs.

Each distinct task configuration (task + task keys) is built once, seeded
like the trainer seeds it, and given one training micro-batch (forward, loss,
backward, no optimizer step) and one validation batch, on the CPU. What a run
would otherwise find out after an epoch, or on a GPU hours later, becomes one
line per problem in the style of the spec errors:

    FILE:LINE: [experiments.NAME] task 'pkg.mod:factory': what is wrong (what to do)

A problem in one configuration never stops the check of the others. `notes`
are things worth knowing that may be deliberate (frozen parameters); they
never block queueing.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import default_collate

from gridrun import tasks
from gridrun.checks.metriccheck import metric_problems
from gridrun.checks.rawcheck import check_preprocess
from gridrun.checks.switchcheck import switch_notes
from gridrun.spec import RunSpec, format_value
from gridrun.spec.errors import LineIndex, Problem
from gridrun.spec.keys import MAX_STEPS
from gridrun.spec.load import read_text
from gridrun.tasks import DerivedMetricError, Task, resolve
from gridrun.train.seeding import rng_state, seed_everything, set_rng_state

_OURS = (__file__, tasks.__file__)  # frames of the check and of Task.derive are not the user's
_MODULE_INTERNALS = {"_modules", "_parameters", "_buffers"}


@dataclass
class Config:
    """One distinct task configuration and the runs that use it."""

    task: str
    task_args: dict[str, Any]
    runs: list[RunSpec]
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    metrics: dict[str, str] | None = None  # the task's metrics, when it could be built
    seconds: float = 0.0
    switch_notes: dict[str, list[str]] = field(default_factory=dict)  # {experiment: notes}


@dataclass
class Report:
    problems: list[Problem]
    notes: list[Problem]
    configs: list[Config]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "problems": [str(p) for p in self.problems],
            "notes": [str(n) for n in self.notes], "seconds": round(self.seconds, 4),
            "configs": [{"task": c.task, "task_args": c.task_args,
                         "experiments": sorted({r.experiment for r in c.runs}),
                         "problems": len(c.problems), "seconds": round(c.seconds, 4)}
                        for c in self.configs],
        }


# --------------------------------------------------------------------------- one configuration

def describe(exc: BaseException) -> str:
    """`TypeError: what it said` and where in the user's code, never a traceback."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__
    if len(text) > 240:
        text = text[:237] + "..."
    return text + where(exc)


def where(exc: BaseException) -> str:
    """` at FILE:LINE`: the last frame of the user's code in the traceback, or ""."""
    frame = tasks.user_frame(exc, skip=_OURS)
    return f" at {Path(frame.filename).name}:{frame.lineno}" if frame else ""


def _names(names: Sequence[str], most: int = 6) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _is_number(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return v.numel() == 1
    return isinstance(v, int | float) and not isinstance(v, bool)


def _batch(task: Task, data: Any, size: int, what: str, found: list[str]) -> Any:
    """`size` samples of `data`, collated as the DataLoader would; None after a problem."""
    try:
        n = min(size, len(data))
        samples = [data[i] for i in range(n)]
    except Exception as exc:
        found.append(f"reading {what} failed: {describe(exc)} "
                     "(it must be a map-style Dataset: len() and [index])")
        return None
    if not samples:
        found.append(f"{what} is empty")
        return None
    try:
        return (task.collate_fn or default_collate)(samples)
    except Exception as exc:
        who = "collate_fn" if task.collate_fn else "torch's default collate"
        hint = "" if task.collate_fn else "; give the task a collate_fn"
        found.append(f"{who} failed on {n} samples of {what}: {describe(exc)}"
                     f" (it gets a list of what {what}[i] returns{hint})")
        return None


def _counts(task: Task, batch: Any, found: list[str]) -> None:
    for name in ("count_samples", "count_tokens"):
        fn = getattr(task, name)
        if fn is None:
            continue
        try:
            value = fn(batch)
        except Exception as exc:
            found.append(f"{name} failed: {describe(exc)} (it gets the collated training batch)")
            continue
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not isinstance(value, int) or isinstance(value, bool):
            found.append(f"{name} returned {value!r}, not an integer (return the batch's count)")


def _hidden(model: nn.Module) -> tuple[dict[str, list[nn.Parameter]], dict[str, torch.Tensor]]:
    """Layers the model cannot see (kept in plain lists, tuples or dicts) and plain tensor
    attributes (neither a parameter nor a buffer), by attribute path."""
    known = {id(p) for p in model.parameters()}
    layers: dict[str, list[nn.Parameter]] = {}
    tensors: dict[str, torch.Tensor] = {}
    for prefix, module in model.named_modules():
        for name, value in vars(module).items():
            path = f"{prefix}.{name}" if prefix else name
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                if value.is_leaf:  # not one computed from parameters (old-style weight_norm)
                    tensors[path] = value
            elif name not in _MODULE_INTERNALS and isinstance(value, list | tuple | dict):
                items = value.values() if isinstance(value, dict) else value
                params = [p for m in items if isinstance(m, nn.Module)
                          for p in m.parameters() if id(p) not in known]
                if params:
                    layers[f"{type(value).__name__} {path!r}"] = params
    return layers, tensors


def _train_step(task: Task, model: nn.Module, batch: Any, found: list[str], notes: list[str]) -> None:
    layers, tensors = _hidden(model)
    for p in [*model.parameters(), *(p for ps in layers.values() for p in ps)]:
        p.grad = None
    for t in tensors.values():
        t.grad = None
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if not trainable:
        found.append("no parameter of the model requires a gradient: nothing would train "
                     "(a forgotten requires_grad, or requires_grad_(False) on the whole model)")
    elif frozen:
        notes.append(f"{len(frozen)} frozen parameter{'s' * (len(frozen) != 1)} "
                     f"(requires_grad=False) will not train: {_names(frozen)}")
    model.train()
    try:
        with torch.enable_grad():
            loss = task.loss(model, batch)
    except Exception as exc:
        found.append(f"loss failed on a training batch: {describe(exc)}")
        return
    if not isinstance(loss, torch.Tensor):
        found.append(f"loss returned {type(loss).__name__}, not a tensor "
                     "(return the batch's mean loss as a scalar tensor)")
        return
    if loss.numel() != 1:
        found.append(f"loss returned a tensor of shape {tuple(loss.shape)}, not a scalar "
                     "(reduce it, e.g. with .mean())")
        return
    if not loss.requires_grad:
        if not trainable:
            return  # said above: nothing can have a gradient
        found.append("loss has no gradient (requires_grad is False): it was computed under "
                     "torch.no_grad() or detached (compute it from the model's output)")
        return
    value = loss.detach().float().item()
    if not math.isfinite(value):
        found.append(f"loss is {value} on the first training batch (check the data and the model's "
                     "initialisation)")
    try:
        loss.backward()
    except Exception as exc:
        found.append(f"backward of the loss failed: {describe(exc)}")
        return
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if missing:
        found.append(f"{len(missing)} parameter{'s' * (len(missing) != 1)} got no gradient: "
                     f"{_names(missing)} (a detach(), .data or .item() in the forward, or a layer "
                     "the loss never uses)")
    for path, params in layers.items():
        if any(p.grad is not None for p in params):
            found.append(f"layers in the plain {path} train in the forward but are not part "
                         "of the model, so the optimizer never updates them (use nn.ModuleList or "
                         "nn.ModuleDict)")
    for path, t in tensors.items():
        if t.grad is not None or t.requires_grad:
            found.append(f"{path!r} is a plain tensor, not an nn.Parameter: the optimizer never "
                         "updates it (wrap it in nn.Parameter)")
        elif t.is_floating_point():
            notes.append(f"{path!r} is a plain tensor, neither a parameter nor a buffer: it never "
                         "trains and does not move to the run's device (nn.Parameter to train it, "
                         "register_buffer for a constant)")


def _pair(value: Any) -> bool:
    return isinstance(value, tuple | list) and len(value) == 2 and all(_is_number(v) for v in value)


def _eval_step(task: Task, model: nn.Module, batch: Any, metrics: Mapping[str, str],
               found: list[str]) -> None:
    model.eval()
    try:
        with torch.inference_mode():
            out = task.evaluate(model, batch)
    except Exception as exc:
        found.append(f"evaluate failed on a validation batch: {describe(exc)}")
        return
    if not isinstance(out, Mapping):
        found.append(f"evaluate returned {type(out).__name__}, not a dict "
                     "{name: (sum, count)}")
        return
    missing = [m for m in metrics if m not in out]
    extra = [str(k) for k in out if k not in metrics]
    if missing or extra:
        what = "; ".join(x for x in (
            f"missing {_names([repr(m) for m in missing])}" if missing else "",
            f"not declared {_names([repr(k) for k in extra])}" if extra else "") if x)
        found.append(f"evaluate returns {_names([repr(str(k)) for k in out])} but metrics declares "
                     f"{_names([repr(m) for m in metrics])}: {what} (return exactly the declared "
                     "names, or declare them in metrics)")
    values: dict[str, float] = {}
    for name, value in out.items():
        if not _pair(value):
            shown = repr(value.tolist() if isinstance(value, torch.Tensor) and value.numel() < 5
                         else value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            found.append(f"evaluate returned {shown} for {str(name)!r}, not a (sum, count) pair "
                         "(return e.g. (correct.sum(), len(y)); the trainer divides once at the end)")
        elif name in metrics:
            total, count = (float(v) for v in value)
            values[name] = total / count if count else math.nan
    if not missing and len(values) == len(metrics) and task.derived:
        try:  # on this one batch's aggregates, as the trainer does over the whole set
            task.derive(values)
        except DerivedMetricError as err:
            found.append(str(err) + where(err.exc))


def check_task(task_name: str, task_args: Mapping[str, Any], *, seed: int = 0,
               batch_size: int = 32, sizes: dict[str, int] | None = None
               ) -> tuple[list[str], list[str], dict[str, str] | None]:
    """(problems, notes, the task's metrics or None) for one task configuration;
    `sizes` gets the training set's length ("train") when it has one."""
    found: list[str] = []
    notes: list[str] = []
    seed_everything(seed)
    try:
        task = resolve(task_name)(**task_args)
    except Exception as exc:
        keys = ", ".join(f"{k}={format_value(v)}" for k, v in task_args.items()) or "no task keys"
        return [f"the factory failed: {describe(exc)} (it was called with {keys})"], notes, None
    if not isinstance(task, Task):
        return [f"the factory returned {type(task).__name__}, not a Task "
                "(return gridrun.tasks.Task(model=..., ...))"], notes, None
    metrics = task.metrics
    if (not isinstance(metrics, Mapping) or not metrics
            or any(v not in ("lower", "higher") for v in metrics.values())):
        found.append(f"metrics is {metrics!r}: expected a non-empty dict "
                     "{name: \"lower\" | \"higher\"}")
        metrics = None
    declared = None
    if metrics and (problem := task.derived_problem()) is not None:
        found.append(problem)
        # the rest is checked without them; their names still count (early_stop_metric)
        names = [n for n in task.derived if isinstance(n, str)] if isinstance(
            task.derived, Mapping) else []
        task.derived = {}
        declared = {**metrics, **dict.fromkeys(names, "lower")}
    elif metrics:
        declared = task.all_metrics()
    if not isinstance(task.model, nn.Module):
        found.append(f"model is {type(task.model).__name__}, not a torch.nn.Module")
        return found, notes, declared
    task.model.cpu()
    if sizes is not None:
        with contextlib.suppress(Exception):  # no len(): _batch says what is wrong
            sizes["train"] = len(task.train_data)
    train = _batch(task, task.train_data, batch_size, "train_data", found)
    if train is not None:
        _counts(task, train, found)
        _train_step(task, task.model, train, found, notes)
    val_found: list[str] = []
    val = _batch(task, task.val_data, batch_size, "val_data", val_found)
    found += [p for p in val_found if p.replace("val_data", "train_data") not in found]
    if val is not None and metrics:
        _eval_step(task, task.model, val, metrics, found)
    if val is not None:
        check_preprocess(task, found, describe)
    return found, notes, declared


# --------------------------------------------------------------------------- a whole file

def total_steps(run: RunSpec, train_size: int) -> int:
    """The optimizer steps a run takes, as the trainer counts them."""
    t = run.trainer
    total = train_size // t["batch_size"] // t["accumulate"] * t["epochs"]
    return min(total, t["max_steps"]) if t.get("max_steps") else total


def _too_long(runs: Sequence[RunSpec], train_size: int | None) -> list[str]:
    """A run longer than any real run (MAX_STEPS), known once the training set's size is."""
    if not isinstance(train_size, int):
        return []
    longest = max(runs, key=lambda r: total_steps(r, train_size))
    steps = total_steps(longest, train_size)
    if steps <= MAX_STEPS:
        return []
    return [f"a run would take {steps:,} optimizer steps ({train_size:,} samples, epochs = "
            f"{longest.trainer['epochs']:,}): more than 2^40 ({MAX_STEPS:,}); lower epochs or "
            "set max_steps"]


def _configs(runs: Sequence[RunSpec]) -> list[Config]:
    by_key: dict[str, Config] = {}
    for run in runs:
        key = json.dumps([run.task, run.task_args], sort_keys=True, default=repr)
        by_key.setdefault(key, Config(run.task, dict(run.task_args), [])).runs.append(run)
    return list(by_key.values())


def configurations(runs: Sequence[RunSpec]) -> int:
    """How many distinct task configurations `check_runs` builds for `runs`."""
    return len(_configs(runs))


def _label(config: Config, siblings: Sequence[Config]) -> str:
    """The task keys that tell this configuration apart from the experiment's others."""
    varying = [k for k in config.task_args
               if len({repr(c.task_args.get(k)) for c in siblings}) > 1]
    return " ".join(f"{k}={format_value(config.task_args[k])}" for k in varying)


def check_runs(runs: Sequence[RunSpec], path: str | Path,
               progress: Callable[[Config], None] = lambda c: None) -> Report:
    """Check every distinct task configuration of `runs` (the runs of file `path`)."""
    started = time.perf_counter()
    state, threads = rng_state(), torch.get_num_threads()
    # one micro-batch gains nothing from intra-op threads; on a busy machine they cost 10x
    torch.set_num_threads(1)
    configs = _configs(runs)
    try:
        for config in configs:
            t0 = time.perf_counter()
            first = config.runs[0]
            batch = min(r.trainer["batch_size"] for r in config.runs)
            sizes: dict[str, int] = {}
            config.problems, config.notes, config.metrics = check_task(
                config.task, config.task_args, seed=first.seed, batch_size=batch, sizes=sizes)
            config.problems += _too_long(config.runs, sizes.get("train"))
            if not config.problems:  # switches the task ignores
                config.switch_notes = switch_notes(config.task, config.task_args, config.runs, batch)
            config.seconds = time.perf_counter() - t0
            progress(config)
    finally:
        set_rng_state(state)
        torch.set_num_threads(threads)
    try:
        text = read_text(path)  # bounded: only a regular file, at most 1 MB
    except (OSError, ValueError):
        text = ""
    lines = LineIndex(text)

    def line_of(experiment: str, *key: str) -> int | None:
        return (lines.lines.get(("experiments", experiment, *key))
                or lines.lines.get(("defaults", *key)) or lines.find("experiments", experiment, *key))

    problems: list[Problem] = []
    notes: list[Problem] = []
    for experiment in dict.fromkeys(r.experiment for r in runs):
        mine = [c for c in configs if any(r.experiment == experiment for r in c.runs)]
        for attr, out in (("problems", problems), ("notes", notes)):
            said: dict[str, list[Config]] = {}
            for c in mine:
                for message in getattr(c, attr):
                    said.setdefault(message, []).append(c)
            for message, where in said.items():
                for c in ([where[0]] if len(where) == len(mine) else where):
                    label = _label(c, mine) if len(where) < len(mine) else ""
                    prefix = "note: " if attr == "notes" else ""
                    out.append(Problem(str(path), f"{prefix}task {c.task!r}"
                                       f"{f' ({label})' if label else ''}: {message}",
                                       line=line_of(experiment, "task"), experiment=experiment))
        for c in mine:
            label = _label(c, mine)
            notes += [Problem(str(path), f"note: task {c.task!r}{f' ({label})' if label else ''}: "
                              f"{message}", line=line_of(experiment, "task"), experiment=experiment)
                      for message in c.switch_notes.get(experiment, [])]
        problems += metric_problems(str(path), experiment, mine, line_of)
    return Report(problems, notes, configs, time.perf_counter() - started)


def check_file(path: str | Path) -> Report:
    """Validate and expand `path`, then check its tasks; raises SpecError on an invalid file."""
    from gridrun.spec import load_runs

    return check_runs(load_runs(path), path)
