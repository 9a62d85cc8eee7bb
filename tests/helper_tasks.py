"""Tasks written for the tests: fault injection and slow runs, used as "helper_tasks:NAME".

tests/ is on PYTHONPATH for the tests and their worker processes (conftest.py).
"""

from __future__ import annotations

import time

import torch
from torch.nn import functional as F

from gridrun.engine.tasks import Task
from gridrun.engine.tasks.spirals import spirals


def slow_spirals(step_sleep: float = 0.05, **kwargs) -> Task:
    """spirals whose every training batch sleeps, so a test can kill a run mid-training."""
    return slow("spirals", step_sleep, **kwargs)


def slow(inner_task: str = "spirals", step_sleep: float = 0.05, **kwargs) -> Task:
    """Any built-in task, sleeping on every training batch."""
    from gridrun.engine.tasks import resolve

    task = resolve(inner_task)(**kwargs)
    inner = task.loss

    def loss(model, batch):
        time.sleep(step_sleep)
        return inner(model, batch)

    task.loss = loss
    return task


def crash(at_step: int = 5, train_size: int = 512) -> Task:
    """Raises RuntimeError("injected crash") at the at_step-th training batch."""
    task = spirals(train_size=train_size, val_size=128)
    calls = {"n": 0}
    inner = task.loss

    def loss(model, batch):
        calls["n"] += 1
        if calls["n"] >= at_step:
            raise RuntimeError("injected crash")
        return inner(model, batch)

    task.loss = loss
    return task


def oom_above(max_batch: int = 32, train_size: int = 512) -> Task:
    """Raises torch.OutOfMemoryError on batches larger than max_batch, else trains like spirals."""
    task = spirals(train_size=train_size, val_size=128)
    inner = task.loss

    def loss(model, batch):
        if batch[0].shape[0] > max_batch:
            raise torch.OutOfMemoryError(f"injected: batch {batch[0].shape[0]} > {max_batch}")
        return inner(model, batch)

    task.loss = loss
    return task


def linear(train_size: int = 256, dim: int = 8) -> Task:
    """Linear regression: no dropout, no BatchNorm, exact arithmetic comparisons."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(train_size, dim, generator=g, dtype=torch.float64)
    w = torch.randn(dim, 1, generator=g, dtype=torch.float64)
    y = x @ w + 0.01 * torch.randn(train_size, 1, generator=g, dtype=torch.float64)
    data = torch.utils.data.TensorDataset(x, y)
    model = torch.nn.Linear(dim, 1).double()

    def loss(model, batch):
        return F.mse_loss(model(batch[0]), batch[1])

    def evaluate(model, batch):
        return {"mse": (F.mse_loss(model(batch[0]), batch[1], reduction="sum"), batch[1].numel())}

    return Task(model=model, train_data=data, val_data=data, loss=loss, evaluate=evaluate,
                metrics={"mse": "lower"})
