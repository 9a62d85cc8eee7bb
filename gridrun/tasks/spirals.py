"""`spirals`: an MLP with dropout classifying points on interleaved 2-D spirals.

Generated data, no downloads; real learning curves in seconds on a CPU.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from gridrun.tasks import InputInfo, Task


def make_spirals(n: int, arms: int, noise: float, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    per_arm = n // arms
    t = torch.rand(arms, per_arm, generator=g).sqrt() * 3 * math.pi  # denser near the centre
    offsets = torch.arange(arms).unsqueeze(1) * (2 * math.pi / arms)
    x = torch.stack([t * torch.cos(t + offsets), t * torch.sin(t + offsets)], dim=-1) / (3 * math.pi)
    x = x + noise * torch.randn(x.shape, generator=g)
    y = torch.arange(arms).repeat_interleave(per_arm)
    return TensorDataset(x.reshape(-1, 2), y)


def mlp(hidden: int, depth: int, dropout: float, classes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = 2
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.GELU(), nn.Dropout(dropout)]
        width = hidden
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def spirals(
    hidden: int = 64,
    depth: int = 3,
    dropout: float = 0.1,
    arms: int = 3,
    noise: float = 0.03,
    train_size: int = 4096,
    val_size: int = 1024,
    data_seed: int = 1234,
) -> Task:
    """An MLP on `arms` interleaved spirals. Metrics: loss (lower), accuracy (higher)."""

    def loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    def evaluate(model, batch):
        x, y = batch
        logits = model(x)
        n = y.numel()
        return {
            "loss": (F.cross_entropy(logits, y, reduction="sum"), n),
            "accuracy": ((logits.argmax(-1) == y).sum(), n),
        }

    return Task(
        model=mlp(hidden, depth, dropout, arms),
        train_data=make_spirals(train_size, arms, noise, data_seed),
        val_data=make_spirals(val_size, arms, noise, data_seed + 1),
        loss=loss,
        evaluate=evaluate,
        metrics={"loss": "lower", "accuracy": "higher"},
        # no preprocess: a point is the model's input as it is
        input_info={"input": InputInfo(range=(-1.2, 1.2), note="a point (x, y) of the plane; "
                                       "the spirals lie in the unit disc")},
        class_names=tuple(f"arm {i}" for i in range(arms)),
    )
