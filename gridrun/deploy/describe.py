"""model.json: what a consumer of an exported model needs, and nothing from gridrun to read it.

Each input: its name, shape (a dynamic axis by its dimension's name, e.g.
`["batch", 16, 16, 1]`; with `--static` all sizes), dtype, `dims` (which axes
follow which dimension), and what the task says of it (`layout`, `range`,
`note`). Each output: the same, and `class_names` for a classifier. With the
preprocess exported, `preprocess` says so and what it hands the model.
`static` gives the fixed sizes and `padding` how a smaller input is fed.
`gridrun predict` reads nothing else.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch

from gridrun.deploy import static as fixed
from gridrun.deploy.formats import HOW_TO_LOAD, Signature, runtime_versions
from gridrun.deploy.whole import RAW
from gridrun.tasks import InputInfo, Task


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def info(described: InputInfo | None) -> dict[str, Any]:
    """An InputInfo as model.json fields (only those the task gave)."""
    if described is None:
        return {}
    out: dict[str, Any] = {}
    if described.layout:
        out["layout"] = described.layout
    if described.range is not None:
        out["range"] = list(described.range)
    if described.note:
        out["note"] = described.note
    return out


def inputs(sig: Signature, task: Task) -> list[dict[str, Any]]:
    told = task.input_info or {}
    return [{"name": n, "shape": shape, "dtype": dtype_name(sig.inputs[n].dtype),
             "dims": {str(a): d for a, d in sig.axes[n].items()}, **info(told.get(n))}
            for n, shape in sig.symbolic_shapes().items()]


def outputs(sig: Signature, task: Task, log: Any) -> list[dict[str, Any]]:
    found = []
    names = list(task.class_names or [])
    for (n, shape, dtype), axes in zip(sig.output_info(), sig.out_axes, strict=True):
        entry: dict[str, Any] = {"name": n, "shape": shape, "dtype": dtype,
                                 "dims": {str(a): d for a, d in axes.items()}}
        if names and len(sig.outputs) == 1:
            if shape and shape[-1] == len(names):
                entry["class_names"] = names
            else:
                log(f"note: the task names {len(names)} classes but output {n!r} has shape "
                    f"{shape}: class names left out of model.json")
        found.append(entry)
    return found


def preprocess(task: Task, model: torch.nn.Module, sig: Signature, included: bool) -> Any:
    """What the exported whole does before the model: the preprocess and the model's input."""
    if task.preprocess is None:
        return None
    out: dict[str, Any] = {"included": included, "module": type(task.preprocess).__name__}
    if not included:
        out["note"] = ("exported without it (--no-preprocess): apply the task's preprocess "
                       "before feeding the model")
        return out
    with torch.inference_mode():
        given = task.preprocess(sig.inputs[RAW])
    names = list(inspect.signature(model.forward).parameters)
    if isinstance(given, torch.Tensor):
        given = {names[0]: given}
    elif isinstance(given, list | tuple):
        given = dict(zip(names, given, strict=False))
    batch = {0: sig.axes[RAW][0]} if sig.static is None and 0 in sig.axes[RAW] else {}
    told = task.input_info or {}
    out["model_inputs"] = [
        {"name": n, "shape": [batch.get(a, s) for a, s in enumerate(t.shape)],
         "dtype": dtype_name(t.dtype), **info(told.get(n))} for n, t in given.items()]
    return out


def card(run: Any, which: str, fmt: str, out: Path, sig: Signature, report: dict[str, Any],
         model: torch.nn.Module, *, included: bool, log: Any = lambda line: None) -> dict[str, Any]:
    """model.json for run `run` (a LoadedRun) exported to `out`."""
    import gridrun

    task = run.task
    return {
        "model": out.name, "format": fmt, "run_id": run.id, "experiment": run.spec.experiment,
        "variant": run.spec.variant, "seed": run.spec.seed, "task": run.spec.task,
        "task_args": dict(run.spec.task_args), "trainer": dict(run.spec.trainer),
        "checkpoint": which, "checkpoint_step": run.state(which).get("step"),
        "metrics": run.checkpoint_metrics(which),
        "inputs": inputs(sig, task),
        "preprocess": preprocess(task, model, sig, included),
        "dynamic_dims": sig.dim_ranges(),
        "static": sig.static,
        "padding": fixed.PADDING if sig.static is not None else None,
        "outputs": outputs(sig, task, log),
        "parity_ok": report["ok"],
        "versions": {"gridrun": gridrun.__version__, "torch": torch.__version__,
                     **runtime_versions(fmt)},
        "load": HOW_TO_LOAD[fmt],
    }
