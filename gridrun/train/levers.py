"""The memory and speed levers a practitioner reaches for, as trainer keys:
activation checkpointing of chosen module classes, and torch.compile's mode."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


def checkpoint_modules(model: torch.nn.Module, class_names: Sequence[str]) -> int:
    """Recompute the forward of every submodule whose class is named in `class_names`
    during the backward instead of keeping its activations (non-reentrant
    `torch.utils.checkpoint`, which restores the RNG state: dropout draws the same).
    Returns how many modules were wrapped; a name that matches none is an error."""
    if not class_names:
        return 0
    wanted, wrapped = set(class_names), 0
    seen = {type(m).__name__ for m in model.modules() if m is not model}
    missing = sorted(wanted - seen)
    if missing:
        raise ValueError(f"checkpoint_modules names {', '.join(map(repr, missing))}, but the model "
                         f"has no submodule of that class; it has: {', '.join(sorted(seen))}")
    for module in model.modules():
        if type(module).__name__ in wanted and module is not model:
            module.forward = functools.partial(_checkpointed, module.forward)
            wrapped += 1
    return wrapped


def _checkpointed(forward: Any, *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():  # evaluation: nothing to save, nothing to recompute
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def compiled(model: torch.nn.Module, cfg: Mapping[str, Any]) -> torch.nn.Module:
    """The model the loop steps: torch.compile'd in `compile_mode` when `compile` is on."""
    if not cfg["compile"]:
        return model
    mode = cfg["compile_mode"]
    return torch.compile(model, mode=None if mode == "default" else mode)
