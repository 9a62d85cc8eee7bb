"""The search's promise on a task gridrun's authors did not write: a package in the
user's own folder, whose dataset draws a random augmentation in `__getitem__`. The
same ASHA search on 1 slot reading in the main process, and on 2 slots with 2
persistent loader workers per trial, decides the same trials, promotions, stops and
winner, and the winner's weights are bitwise the same."""

from __future__ import annotations

import sys

import pytest
from search_kit import SMALL, drained, search_runs
from test_engine_kit import engine_for

TASK = '''
import os
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, get_worker_info

from gridrun import Task


class Jittered(Dataset):
    """Two noisy blobs; each read adds fresh noise (drawn from torch's global generator,
    as users' augmentations do), so the batches depend on how workers are seeded."""

    def __init__(self, n: int, seed: int, jitter: float):
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, 2, (n,), generator=g)
        self.x = torch.randn(n, 4, generator=g) + 1.5 * self.y[:, None]
        self.jitter = jitter

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        if get_worker_info() is not None:  # leaves a mark of each loader worker that read
            Path("workers", str(os.getpid())).touch()
        return self.x[i] + self.jitter * torch.randn(4), self.y[i]


def make(hidden: int = 16):
    model = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def loss(m, b):
        return F.cross_entropy(m(b[0]), b[1])

    def evaluate(m, b):
        out = m(b[0])
        return {"loss": (F.cross_entropy(out, b[1], reduction="sum"), len(b[1])),
                "accuracy": ((out.argmax(1) == b[1]).sum(), len(b[1]))}

    return Task(model=model, train_data=Jittered(192, 0, 0.5), val_data=Jittered(64, 1, 0.0),
                loss=loss, evaluate=evaluate, metrics={"loss": "lower", "accuracy": "higher"})
'''


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """The user's folder, current directory of the engine's workers, with their package."""
    package = tmp_path / "userlab"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "jitter.py").write_text(TASK)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "userlab" or m.startswith("userlab.")]:
        del sys.modules[name]


def search(folder, workers: int) -> str:
    text = SMALL.replace('task = "spirals"\ntrain_size = 256\nval_size = 64\ndepth = 1',
                         'task = "userlab.jitter:make"')
    text = text.replace("threads = 1", f"threads = 1\nnum_workers = {workers}\n"
                        f"persistent_workers = {str(workers > 0).lower()}")
    assert "userlab.jitter:make" in text and f"num_workers = {workers}" in text
    folder.mkdir()
    return text


@pytest.mark.slow
def test_a_users_own_task_is_searched_alike_on_any_slots_and_loader_workers(lab):
    from gridrun.engine.backends.local import LocalBackend

    outcomes = []
    readers = []
    for name, slots, workers in (("one", 1, 0), ("two", 2, 2)):
        root = lab / name
        runs = search_runs(lab, search(root, workers))
        assert all(r.trainer["num_workers"] == workers for r in runs)
        (lab / "workers").mkdir()
        backend = LocalBackend()
        try:
            outcomes.append(drained(root, engine_for(root, backend, slots=slots), runs))
        finally:
            backend.close()
        readers.append(len(list((lab / "workers").iterdir())))
        (lab / "workers").rename(lab / f"workers-{name}")
    assert readers[0] == 0 and readers[1] >= 2 * 4  # the 4 trials' first stretches alone
    one, two = outcomes
    assert len(one["promotions"]) == 2 + 1 and len(one["stopped"]) == 3  # 4 -> 2 -> 1
    assert one == two
