"""Optimizers and the learning-rate schedule as a pure function of the step."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch


def build_optimizer(params: Any, cfg: Mapping[str, Any]) -> torch.optim.Optimizer:
    name, lr, wd = cfg["optimizer"], cfg["lr"], cfg["weight_decay"]
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=tuple(cfg["betas"]), weight_decay=wd)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=tuple(cfg["betas"]), weight_decay=wd)
    if name == "sgd":
        momentum = cfg["momentum"]
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=wd,
                               nesterov=cfg["nesterov"] and momentum > 0)
    raise ValueError(f"unknown optimizer {name!r}")


def warmup_steps(cfg: Mapping[str, Any], total: int) -> int:
    w = cfg["warmup"]
    if cfg["schedule"] == "onecycle" and not w:
        w = 0.3  # the usual rise of a one-cycle schedule
    return int(w * total) if isinstance(w, float) else int(w)


def lr_at(step: int, cfg: Mapping[str, Any], total: int) -> float:
    """The learning rate of optimizer step `step` (0-based) out of `total`.

    Linear warmup to `lr` (onecycle: from lr/25, cosine-shaped), then:
    cosine or linear decay to `min_lr`, `gamma` every `step_size` steps,
    constant, or onecycle's cosine fall to `min_lr` (or lr/25e4 when min_lr is 0).
    """
    lr, min_lr, kind = cfg["lr"], cfg["min_lr"], cfg["schedule"]
    warm = warmup_steps(cfg, total)
    if kind == "onecycle":
        start, end = lr / 25, (min_lr or lr / 25e4)
        if step < warm:
            return start + (lr - start) * (1 - math.cos(math.pi * step / warm)) / 2
        progress = min((step - warm) / max(1, total - warm - 1), 1.0)
        return end + (lr - end) * (1 + math.cos(math.pi * progress)) / 2
    if step < warm:
        return lr * (step + 1) / warm
    progress = min((step - warm) / max(1, total - warm), 1.0)
    if kind == "cosine":
        return min_lr + (lr - min_lr) * (1 + math.cos(math.pi * progress)) / 2
    if kind == "linear":
        return lr - (lr - min_lr) * progress
    if kind == "step":
        return lr * cfg["gamma"] ** ((step - warm) // cfg["step_size"])
    return lr  # constant
