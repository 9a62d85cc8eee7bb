"""Tasks written for the tests: fault injection and slow runs, used as "helper_tasks:NAME".

tests/ is on PYTHONPATH for the tests and their worker processes (conftest.py).
"""

from __future__ import annotations

import time

import torch
from torch.nn import functional as F

from gridrun import Task
from gridrun.tasks.spirals import spirals


def slow_spirals(step_sleep: float = 0.05, **kwargs) -> Task:
    """spirals whose every training batch sleeps, so a test can kill a run mid-training."""
    return slow("spirals", step_sleep, **kwargs)


def slow(inner_task: str = "spirals", step_sleep: float = 0.05, **kwargs) -> Task:
    """Any built-in task, sleeping on every training batch."""
    from gridrun.tasks import resolve

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


def scored(train_size: int = 256, dim: int = 8) -> Task:
    """`linear` whose one metric is named "score" and declared "lower": a name the
    guess (lower only for loss, error, perplexity) would maximise."""
    task = linear(train_size, dim)
    inner = task.evaluate
    task.evaluate = lambda model, batch: {"score": inner(model, batch)["mse"]}
    task.metrics = {"score": "lower"}
    return task


class Augmented(torch.utils.data.Dataset):
    """Written the way users write augmentation: every draw from a global RNG."""

    def __init__(self, n: int, dim: int):
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, dim, generator=g)
        self.y = (self.x.sum(1) > 0).long()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        import random

        import numpy as np

        x = self.x[i] + 0.3 * torch.randn(self.x.shape[1])          # torch's global RNG
        x = x * float(np.random.uniform(0.8, 1.2))                   # NumPy's global RNG
        if random.random() < 0.5:                                    # python's global RNG
            x = x.flip(0)
        return {"x": x, "y": self.y[i]}


def mix_collate(samples: list[dict]) -> dict:
    """A collate_fn of the user's own that draws too (mixup-style noise)."""
    x = torch.stack([s["x"] for s in samples])
    lam = torch.rand(()) * 0.1
    return {"x": (1 - lam) * x + lam * x.roll(1, 0), "y": torch.stack([s["y"] for s in samples])}


def augmented(train_size: int = 256, val_size: int = 64, dim: int = 8, hidden: int = 32) -> Task:
    """A user-style task: global-RNG augmentation, dict batches, its own collate_fn,
    a model with dropout and BatchNorm."""
    model = torch.nn.Sequential(
        torch.nn.Linear(dim, hidden), torch.nn.BatchNorm1d(hidden), torch.nn.ReLU(),
        torch.nn.Dropout(0.2), torch.nn.Linear(hidden, 2))

    def loss(model, batch):
        return F.cross_entropy(model(batch["x"]), batch["y"])

    def evaluate(model, batch):
        logits = model(batch["x"])
        return {"loss": (F.cross_entropy(logits, batch["y"], reduction="sum"), len(batch["y"])),
                "accuracy": ((logits.argmax(-1) == batch["y"]).sum(), len(batch["y"]))}

    return Task(model=model, train_data=Augmented(train_size, dim), val_data=Augmented(val_size, dim),
                loss=loss, evaluate=evaluate, metrics={"loss": "lower", "accuracy": "higher"},
                collate_fn=mix_collate, count_samples=lambda b: len(b["y"]))


# ---- diagnostics: tasks with the faults a careful engineer looks for

class Blocks(torch.nn.Module):
    """Layers in an nn.ModuleList, and two things outside it that the forward
    never uses: a parameter and a whole layer (the bug of a refactor)."""

    def __init__(self, dim: int = 2, hidden: int = 16, classes: int = 3):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(dim, hidden), torch.nn.Linear(hidden, classes)])
        self.scale = torch.nn.Parameter(torch.ones(1))
        self.spare = torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        return self.layers[1](torch.relu(self.layers[0](x)))


def unused_parameters(train_size: int = 256) -> Task:
    task = spirals(train_size=train_size, val_size=64)
    task.model = Blocks()
    return task


class SlowData(torch.utils.data.Dataset):
    def __init__(self, inner, sleep: float):
        self.inner, self.sleep = inner, sleep

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        time.sleep(self.sleep)
        return self.inner[i]


def slow_data(sleep: float = 0.0005, train_size: int = 512) -> Task:
    """spirals whose every sample takes `sleep` seconds to load: input-bound."""
    task = spirals(train_size=train_size, val_size=64)
    task.train_data = SlowData(task.train_data, sleep)
    return task


class Poison(torch.nn.Module):
    """Identity, except that its `at`-th training call returns NaN. The count is a
    buffer, so checkpoints carry it and a replay sees the same call numbers."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        if not self.training:
            return x
        self.calls += 1
        return x * float("nan") if int(self.calls) == self.at else x


def nan_at(step: int = 5, train_size: int = 512) -> Task:
    """spirals whose layer `body.2` (a Poison) produces NaN at optimizer step `step`."""
    task = spirals(train_size=train_size, val_size=64)
    task.model = torch.nn.Sequential()
    task.model.add_module("body", torch.nn.Sequential(
        torch.nn.Linear(2, 32), torch.nn.ReLU(), Poison(step), torch.nn.Linear(32, 32)))
    task.model.add_module("head", torch.nn.Linear(32, 3))
    return task


class _BadGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, poison):
        ctx.poison = poison
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return (grad * float("nan") if ctx.poison else grad), None


class BadBackward(torch.nn.Module):
    """Identity forward; its `at`-th training backward returns NaN."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        if not self.training:
            return x
        self.calls += 1
        return _BadGrad.apply(x, int(self.calls) == self.at)


def nan_grad_at(step: int = 5, train_size: int = 512) -> Task:
    """spirals whose layer `mid` (a BadBackward) makes the gradient NaN at step `step`."""
    task = spirals(train_size=train_size, val_size=64)
    task.model = torch.nn.Sequential()
    task.model.add_module("inp", torch.nn.Linear(2, 32))
    task.model.add_module("mid", BadBackward(step))
    task.model.add_module("out", torch.nn.Linear(32, 3))
    return task


def nan_sample(index: int = 100, train_size: int = 512) -> Task:
    """spirals with a NaN planted in one training sample."""
    task = spirals(train_size=train_size, val_size=64)
    x, y = task.train_data.tensors
    x = x.clone()
    x[index, 0] = float("nan")
    task.train_data = torch.utils.data.TensorDataset(x, y)
    return task


def blowup(at: int = 4, train_size: int = 512) -> Task:
    """spirals whose loss at optimizer step `at` gains a term worth 0 whose gradient
    on `0.bias` is infinite: that step's update makes the weights infinite while
    its own loss stays finite."""
    task = spirals(train_size=train_size, val_size=64)
    inner = task.loss
    first = task.model[0]
    first.register_buffer("calls", torch.zeros((), dtype=torch.long))  # checkpoints carry it

    def loss(model, batch):
        value = inner(model, batch)
        first.calls += 1
        if int(first.calls) == at:
            value = value + (first.bias - first.bias.detach()).sum() * 1e38 * 1e38
        return value

    task.loss = loss
    return task


class _Many(torch.utils.data.Dataset):
    """`n` samples made on demand: a training set as long as asked, at no cost."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(index)
        return torch.randn(2, generator=g), torch.tensor(index % 3)


def huge_data(train_size: int = 1024) -> Task:
    """spirals with a training set of `train_size` samples made on demand (a run of
    more steps than any real one, for the bounds' tests)."""
    task = spirals(hidden=8, depth=1, train_size=64, val_size=32)
    task.train_data = _Many(train_size)
    return task


def perplexity(train_size: int = 256, val_size: int = 64, hidden: int = 16) -> Task:
    """A task that reports only its loss, with perplexity derived from the mean loss
    (Task.derived), as a language model's would be."""
    import math

    task = spirals(train_size=train_size, val_size=val_size, hidden=hidden, depth=1)
    inner = task.evaluate

    def evaluate(model, batch):
        return {"loss": inner(model, batch)["loss"]}

    task.evaluate = evaluate
    task.metrics = {"loss": "lower"}
    task.derived = {"perplexity": ("lower", lambda m: math.exp(m["loss"]))}
    return task


def nan_metric(train_size: int = 256, val_size: int = 64) -> Task:
    """spirals whose first metric, `f1` (the default early-stop metric), is 0/0 at every
    evaluation while its loss and accuracy are finite."""
    task = spirals(train_size=train_size, val_size=val_size, hidden=16, depth=1)
    inner = task.evaluate

    def evaluate(model, batch):
        return {"f1": (torch.zeros(()), torch.zeros(())), **inner(model, batch)}

    task.evaluate = evaluate
    task.metrics = {"f1": "higher", **task.metrics}
    return task


def gated_spirals(gate: str = "", at: int = 5, **kwargs) -> Task:
    """spirals whose `at`-th training batch waits until the file `gate` exists: the run
    is still running, however long the test took to look at it (never a race against
    the run's speed); the test makes the file when it has looked."""
    return gated("spirals", gate, at, **kwargs)


def gated(inner_task: str = "spirals", gate: str = "", at: int = 5, **kwargs) -> Task:
    """Any built-in task whose `at`-th training batch (of each process) writes
    `GATE.reached`, then waits until the file `gate` exists: a test can stop the run
    there (a signal, then the gate) at a step that does not depend on the machine's speed."""
    import os
    from pathlib import Path

    from gridrun.tasks import resolve

    task = resolve(inner_task)(**kwargs)
    inner, calls = task.loss, [0]

    def loss(model, batch):
        calls[0] += 1
        if calls[0] == at and gate:
            Path(f"{gate}.reached").touch()
            while not os.path.exists(gate):
                time.sleep(0.05)
        return inner(model, batch)

    task.loss = loss
    return task
