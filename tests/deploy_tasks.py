"""Tasks for the export tests, used as "deploy_tasks:NAME"."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from gridrun import Task


class Branchy(nn.Module):
    """Takes a different path depending on the values of its input: torch.jit.trace
    freezes the path its example took, torch.export refuses to guess."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if x.mean() > 0:
            return h
        return 2 * h + 1


def branchy(n: int = 300) -> Task:
    """The first three validation samples pull their mean below zero; the first
    full batch stays above it."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 2, generator=g) + 0.5
    x[:3] = -5.0
    y = (x[:, 0] > 0).long()

    def loss(model, batch):
        return F.cross_entropy(model(batch[0]), batch[1])

    def evaluate(model, batch):
        logits = model(batch[0])
        return {"loss": (F.cross_entropy(logits, batch[1], reduction="sum"), batch[1].numel())}

    data = TensorDataset(x, y)
    return Task(model=Branchy(), train_data=data, val_data=data, loss=loss, evaluate=evaluate,
                metrics={"loss": "lower"})
