"""The task's preprocess and the model as one module: what `--with-preprocess` exports.

Its one input, `raw`, is a batch of raw samples as the task's `raw_val_data`
holds them (e.g. uint8 images [batch, H, W, C]); `preprocess(raw)` gives the
model's input (a tensor, or a tuple or dict of the model's inputs).
"""

from __future__ import annotations

import site
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gridrun.deploy.formats import DeployError, _quiet
from gridrun.tasks import Task, user_frame

RAW = "raw"  # the name of the exported whole's input
# frames of the exporter, of this package and of installed libraries (onnx, ...)
_NOT_THE_USERS = (str(Path(__file__).parent), *site.getsitepackages(), site.getusersitepackages())


class Whole(torch.nn.Module):
    """preprocess, then the model."""

    def __init__(self, preprocess: torch.nn.Module, model: torch.nn.Module):
        super().__init__()
        self.preprocess, self.model = preprocess, model

    def forward(self, raw: torch.Tensor) -> Any:
        x = self.preprocess(raw)
        if isinstance(x, Mapping):
            return self.model(**x)
        if isinstance(x, list | tuple):
            return self.model(*x)
        return self.model(x)


def wanted(task: Task, task_name: str, asked: bool | None) -> tuple[bool, str | None]:
    """(export the preprocess too?, a note for the user). `asked`: --with-preprocess (True),
    --no-preprocess (False), or neither (None: when the task declares one)."""
    if task.preprocess is None:
        note = (f"task {task_name!r} declares no preprocess: --with-preprocess changes nothing, "
                "the exported model takes the model's own input") if asked else None
        return False, note
    if not isinstance(task.preprocess, torch.nn.Module):
        raise DeployError(f"task {task_name!r}: preprocess is a {type(task.preprocess).__name__}, "
                          "not a torch.nn.Module (--no-preprocess exports the model alone)")
    if task.raw_val_data is None:
        if asked:
            raise DeployError(f"task {task_name!r} declares a preprocess but no raw_val_data: "
                              "nothing to export it with (--no-preprocess exports the model alone)")
        return False, (f"task {task_name!r} declares a preprocess but no raw_val_data: "
                       "exporting the model alone")
    return asked is not False, None


def raw_dynamic(task: Task) -> dict[str, Any]:
    """The raw input's dynamic axes: the task's `dynamic_shapes["raw"]`, else the batch axis."""
    spec = task.dynamic_shapes
    if isinstance(spec, Mapping) and RAW in spec:
        return {RAW: spec[RAW]}
    return {RAW: {0: "batch"}}


def check_exportable(fmt: str, preprocess: torch.nn.Module, raw: torch.Tensor,
                     shapes: dict[str, Any] | None) -> None:
    """Export the preprocess alone first, so that a refusal names it, the op and its line.
    `shapes`: the whole's dynamic_shapes ({"raw": {axis: Dim}}), None when static."""
    if fmt == "torchscript":
        return  # tracing records whatever ran; the parity check tells
    try:
        with _quiet(), torch.no_grad():
            torch.export.export(preprocess, (raw,),
                                dynamic_shapes=(shapes[RAW],) if shapes else None)
    except Exception as exc:
        raise DeployError(refusal(fmt, exc)) from exc


def refusal(fmt: str, exc: BaseException) -> str:
    """One line: the preprocess cannot be exported, the operation, and the line that does it."""
    where = ""
    if f := user_frame(exc, skip=_NOT_THE_USERS):
        where = f" at {Path(f.filename).name}:{f.lineno}" + (f" `{f.line.strip()}`" if f.line else "")
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = lines[0].split(" (")[0].split(". ")[0][:160] if lines else ""
    what = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    hint = ""
    text = str(exc)
    if "data-dependent" in text or "GuardOnDataDependent" in type(exc).__name__:
        hint = " (it reads a value of its input as a Python number: keep it a tensor)"
    elif ".numpy()" in text or "numpy" in text.lower():
        hint = " (NumPy cannot be exported: write it with torch operations)"
    return f"cannot export the task's preprocess to {fmt}: {what}{where}{hint}"
