"""Tasks with one mistake each, for the task check, used as "bad_tasks:NAME".

Each factory is a small, working classifier (`good`) with exactly one thing
wrong, written the way a person would get it wrong. `dict_batches` is a
correct task with dict samples and its own collate_fn: the check must pass it.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, TensorDataset

from gridrun import Task


def _data(n: int = 64, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, (x.sum(1) > 0).long())


def _loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def _evaluate(model, batch):
    x, y = batch
    logits = model(x)
    return {"loss": (F.cross_entropy(logits, y, reduction="sum"), y.numel()),
            "acc": ((logits.argmax(-1) == y).sum(), y.numel())}


def _task(model=None, **changes) -> Task:
    fields = dict(model=model or nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)),
                  train_data=_data(), val_data=_data(seed=1), loss=_loss, evaluate=_evaluate,
                  metrics={"loss": "lower", "acc": "higher"})
    return Task(**{**fields, **changes})


def good(hidden: int = 8) -> Task:
    return _task(nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 2)))


def non_scalar_loss() -> Task:
    def loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y, reduction="none")  # forgot .mean()
    return _task(loss=loss)


def loss_without_grad() -> Task:
    def loss(model, batch):
        x, y = batch
        with torch.no_grad():
            return F.cross_entropy(model(x), y)
    return _task(loss=loss)


class ListMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(4, 8)
        self.blocks = [nn.Linear(8, 8), nn.Linear(8, 8)]  # not an nn.ModuleList
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        x = self.stem(x).relu()
        for block in self.blocks:
            x = block(x).relu()
        return self.head(x)


def plain_list() -> Task:
    return _task(ListMLP())


class DetachedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.encoder(x).relu().detach())  # the encoder never learns


def detached() -> Task:
    return _task(DetachedMLP())


def all_frozen() -> Task:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model.requires_grad_(False)  # meant for a pretrained part, applied to everything
    return _task(model)


class TensorWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.randn(4, 2, requires_grad=True)  # not an nn.Parameter
        self.bias = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        return x @ self.w + self.bias


def plain_tensor_weight() -> Task:
    return _task(TensorWeight())


def renamed_metric() -> Task:
    def evaluate(model, batch):
        out = _evaluate(model, batch)
        return {"loss": out["loss"], "accuracy": out["acc"]}  # metrics says "acc"
    return _task(evaluate=evaluate)


def bare_float_metric() -> Task:
    def evaluate(model, batch):
        x, y = batch
        logits = model(x)
        return {"loss": (F.cross_entropy(logits, y, reduction="sum"), y.numel()),
                "acc": (logits.argmax(-1) == y).float().mean().item()}  # a mean, not (sum, count)
    return _task(evaluate=evaluate)


def bad_collate() -> Task:
    def collate(samples):
        xs, ys = zip(*samples, strict=True)
        return torch.stack(xs), torch.tensor(ys, dtype=torch.long).view(2, -1, 3)  # wrong view
    return _task(collate_fn=collate)


def bad_count_samples() -> Task:
    return _task(count_samples=lambda batch: batch["x"].shape[0])  # batches are tuples


def bad_count_tokens() -> Task:
    return _task(count_tokens=lambda batch: len(batch[0]) / 0)


def factory_raises(width: int = 8, limit: int = 0) -> Task:
    if width > limit:
        raise ValueError(f"width {width} is not supported")
    return good(width)


def partly_frozen() -> Task:
    """Correct: a frozen first layer is a choice (a note, never a problem)."""
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model[0].requires_grad_(False)
    return _task(model)


def not_a_task() -> dict:
    return {"model": nn.Linear(4, 2)}


class Pairs(Dataset):
    """Samples as dicts of a variable-length sequence and a label."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.items = [torch.randn(int(torch.randint(2, 6, (), generator=g)), 4, generator=g)
                      for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        x = self.items[i]
        return {"x": x, "y": int(x.sum() > 0)}


def dict_batches(hidden: int = 8) -> Task:
    """Correct: dict samples, padded by its own collate_fn; counts tokens."""

    def collate(samples):
        x = nn.utils.rnn.pad_sequence([s["x"] for s in samples], batch_first=True)
        lengths = torch.tensor([len(s["x"]) for s in samples])
        return {"x": x, "lengths": lengths, "y": torch.tensor([s["y"] for s in samples])}

    class Pool(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, hidden)
            self.heads = nn.ModuleList([nn.Linear(hidden, 2)])
            self.register_buffer("scale", torch.tensor(1.0))

        def forward(self, batch):
            mask = (torch.arange(batch["x"].shape[1]) < batch["lengths"][:, None]).float()
            h = (self.proj(batch["x"]) * mask[..., None]).sum(1) / batch["lengths"][:, None]
            return self.heads[0](h) * self.scale

    def loss(model, batch):
        return F.cross_entropy(model(batch), batch["y"])

    def evaluate(model, batch):
        logits = model(batch)
        y = batch["y"]
        return {"acc": ((logits.argmax(-1) == y).sum(), len(y)),
                "loss": (F.cross_entropy(logits, y, reduction="sum").item(), len(y))}

    return Task(model=Pool(), train_data=Pairs(64, 0), val_data=Pairs(32, 1), loss=loss,
                evaluate=evaluate, metrics={"acc": "higher", "loss": "lower"}, collate_fn=collate,
                count_samples=lambda b: len(b["y"]), count_tokens=lambda b: int(b["lengths"].sum()))


def weight_normed() -> Task:
    """Correct: old-style weight_norm keeps a computed (non-leaf) `weight` tensor attribute."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in favour of parametrizations, still used
        first = nn.utils.weight_norm(nn.Linear(4, 8))
    return _task(nn.Sequential(first, nn.ReLU(),
                               nn.utils.parametrizations.weight_norm(nn.Linear(8, 2))))


class _Scale(nn.Module):
    """Raw uint8 features -> the model's input: x / 255."""

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        return raw.float() / 255


def _raw(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n, 4), generator=g, dtype=torch.uint8)
    return TensorDataset(raw, (raw.float().sum(1) > 510).long())


def preprocess_forgotten() -> Task:
    """The data path feeds raw.float() (0..255): the preprocess (0..1) is not what trained."""
    raw_train, raw_val = _raw(64, 0), _raw(64, 1)
    train, val = (TensorDataset(r.tensors[0].float(), r.tensors[1]) for r in (raw_train, raw_val))
    return _task(train_data=train, val_data=val, preprocess=_Scale(), raw_val_data=raw_val)


def preprocess_without_raw() -> Task:
    return _task(preprocess=_Scale())


def preprocess_applied() -> Task:
    """Correct: the data path calls the preprocess the task declares."""
    prep, raw_train, raw_val = _Scale(), _raw(64, 0), _raw(64, 1)
    train, val = (TensorDataset(prep(r.tensors[0]), r.tensors[1]) for r in (raw_train, raw_val))
    return _task(train_data=train, val_data=val, preprocess=prep, raw_val_data=raw_val)


# ---- derived metrics (Task.derived): computed from the aggregated ones

def derived_missing_metric() -> Task:
    """A typo in the name a derived metric reads."""
    return _task(derived={"perplexity": ("lower", lambda m: math.exp(m["los"]))})


def derived_raises() -> Task:
    def ratio(m):
        raise ValueError("precision and recall are both needed")

    return _task(derived={"ratio": ("higher", ratio)})


def derived_bad_direction() -> Task:
    return _task(derived={"perplexity": ("down", lambda m: math.exp(m["loss"]))})


def derived_not_a_number() -> Task:
    return _task(derived={"grade": ("higher", lambda m: "good" if m["acc"] > 0.5 else "bad")})


def derived_shadows_a_metric() -> Task:
    return _task(derived={"acc": ("higher", lambda m: m["acc"] * 100)})


def derived_good() -> Task:
    """Correct: perplexity from the mean loss, and an error rate from the accuracy."""
    return _task(derived={"perplexity": ("lower", lambda m: math.exp(m["loss"])),
                          "error": ("lower", lambda m: 1 - m["acc"])})
