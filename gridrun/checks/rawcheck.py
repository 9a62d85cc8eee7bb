"""The task check's part for a declared `preprocess`: do the validation samples equal
`preprocess(raw)`? Training and serving share one definition only if they do.

On the first few samples: `raw_val_data[i]` collated as `val_data[i]` is, its
first tensor (the raw input) through `preprocess`, against the model's input of
the collated `val_data` samples. Equal within float32 rounding (|a - b| <= 1e-6
+ 1e-5 |b|), else one problem with the largest difference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import default_collate

from gridrun.tasks import Task

SAMPLES = 4
ATOL, RTOL = 1e-6, 1e-5


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, Mapping) else value
    if isinstance(items, list | tuple) or isinstance(value, Mapping):
        for item in items:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, Mapping):
        return list(value.values())
    return list(value) if isinstance(value, list | tuple) else [value]


def check_preprocess(task: Task, found: list[str], describe: Callable[[BaseException], str]) -> None:
    """Append a problem to `found` for each way the declared preprocess and the data disagree."""
    prep, raw_data = task.preprocess, task.raw_val_data
    if prep is None and raw_data is None:
        return
    if prep is None:
        found.append("raw_val_data is given but no preprocess: declare the preprocess that turns "
                     "it into the model's input, or leave raw_val_data out")
        return
    if not isinstance(prep, nn.Module):
        found.append(f"preprocess is a {type(prep).__name__}, not a torch.nn.Module "
                     "(it is exported with the model, so it must be a module)")
        return
    if raw_data is None:
        found.append("preprocess is declared but raw_val_data is not: give the validation samples "
                     "in raw form (e.g. (uint8 image, label)) so that they can be checked, exported "
                     "with and fed to the exported model")
        return
    try:
        n, m = len(raw_data), len(task.val_data)
    except Exception as exc:
        found.append(f"len(raw_val_data) failed: {describe(exc)}")
        return
    if n != m:
        found.append(f"raw_val_data has {n} samples and val_data {m}: item i of raw_val_data must "
                     "be val_data[i] in raw form")
        return
    count = min(SAMPLES, n)
    collate = task.collate_fn or default_collate
    try:
        raw = _first_tensor(collate([raw_data[i] for i in range(count)]))
        expected = collate([task.val_data[i] for i in range(count)])
        expected = task.inputs(expected) if task.inputs else (_first_tensor(expected),)
    except Exception as exc:
        found.append(f"reading {count} samples of raw_val_data and val_data failed: {describe(exc)}")
        return
    if raw is None:
        found.append("raw_val_data's samples hold no tensor: the raw input is the first tensor "
                     "of a sample")
        return
    try:
        with torch.inference_mode():
            got = prep(raw)
    except Exception as exc:
        found.append(f"preprocess failed on {count} raw validation samples "
                     f"({raw.dtype} {list(raw.shape)}): {describe(exc)}")
        return
    got_list, want_list = _as_list(got), _as_list(expected)
    if len(got_list) != len(want_list):
        found.append(f"preprocess returns {len(got_list)} tensor(s), the model takes "
                     f"{len(want_list)} input(s)")
        return
    for i, (a, b) in enumerate(zip(got_list, want_list, strict=True)):
        what = f"input {i}" if len(want_list) > 1 else "the model's input"
        if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            shown = (f"{a.dtype} {list(a.shape)}" if isinstance(a, torch.Tensor) else type(a).__name__)
            found.append(f"preprocess(raw) gives {shown} but val_data's {what} is "
                         f"{b.dtype} {list(b.shape)} (first {count} samples)")
            continue
        if a.is_floating_point():
            close = torch.isclose(a.double(), b.double(), rtol=RTOL, atol=ATOL)
        else:
            close = a == b
        if not bool(close.all()):
            diff = (a.double() - b.double()).abs()
            sample = int(torch.nonzero(~close)[0, 0])
            found.append(f"val_data's samples are not preprocess(raw): {what} of sample {sample} "
                         f"differs by up to {float(diff.max()):.3g} (the data path must call the "
                         "task's preprocess on raw_val_data's samples)")
