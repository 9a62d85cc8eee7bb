"""Tasks for the export tests, used as "deploy_tasks:NAME"."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from gridrun import Task


def cross_entropy(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def summed_cross_entropy(model, batch):
    logits = model(batch[0])
    return {"loss": (F.cross_entropy(logits, batch[1], reduction="sum"), batch[1].numel())}


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

    data = TensorDataset(x, y)
    return Task(model=Branchy(), train_data=data, val_data=data, loss=cross_entropy,
                evaluate=summed_cross_entropy,
                metrics={"loss": "lower"})


class PerBatchScale(nn.Module):
    """Scales raw uint8 values by their batch's maximum, read as a Python number:
    torch.export cannot export a value read out of the input."""

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        return raw.float() / float(raw.max())


def unexportable(n: int = 64) -> Task:
    """A preprocess that trains and evaluates but cannot be exported."""
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(1, 256, (n, 2), generator=g, dtype=torch.uint8)
    y = (raw[:, 0] > raw[:, 1]).long()
    prep = PerBatchScale()
    data = TensorDataset(torch.stack([prep(r[None])[0] for r in raw]), y)
    return Task(model=nn.Linear(2, 2), train_data=data, val_data=data, loss=cross_entropy,
                evaluate=summed_cross_entropy, metrics={"loss": "lower"}, preprocess=prep,
                raw_val_data=TensorDataset(raw, y))


def binary(n: int = 128) -> Task:
    """A binary classifier with one logit per sample ([batch, 1]), trained with BCE: the
    positive class is the logit above 0, whatever its size."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=g)
    y = (x[:, 0] > 0).float()

    def loss(model, batch):
        return F.binary_cross_entropy_with_logits(model(batch[0])[:, 0], batch[1])

    def evaluate(model, batch):
        logit = model(batch[0])[:, 0]
        return {"loss": (F.binary_cross_entropy_with_logits(logit, batch[1], reduction="sum"),
                         batch[1].numel()),
                "accuracy": (((logit > 0).float() == batch[1]).sum(), batch[1].numel())}

    data = TensorDataset(x, y)
    return Task(model=nn.Linear(2, 1), train_data=data, val_data=data, loss=loss,
                evaluate=evaluate, metrics={"loss": "lower", "accuracy": "higher"})


class SqrtHead(nn.Module):
    """A classifier of the square roots of its input: a negative value, inside the declared
    range, gives NaN logits (what `predict` must still write as strict JSON)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.sqrt())


def sqrt_head(n: int = 64) -> Task:
    """Three classes of points in 0.25..2 (the input declared -4..4), for predict's hostile
    tests: a small float model whose outputs turn non-finite on a negative input."""
    from gridrun import InputInfo

    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 2, generator=g) * 1.75 + 0.25
    y = (x[:, 0] > x[:, 1]).long() + (x.sum(1) > 2.2).long()

    data = TensorDataset(x, y)
    return Task(model=SqrtHead(), train_data=data, val_data=data, loss=cross_entropy,
                evaluate=summed_cross_entropy,
                metrics={"loss": "lower"}, class_names=("low", "mid", "high"),
                input_info={"x": InputInfo(range=(-4.0, 4.0), note="a point")})
