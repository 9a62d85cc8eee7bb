"""Small image folders and datasets for the data tests (issue 26): scripts/make_images.py
imported from its file, and a dataset that reports which process read it."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_images.py"


def make_images(root: Path, n: int = 120, size: int = 16, classes: int = 4, seed: int = 0) -> Path:
    spec = importlib.util.spec_from_file_location("make_images", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.make(root, n=n, size=size, classes=classes, seed=seed)
    return root


class WhoReads(torch.utils.data.Dataset):
    """Item i: (record i as read, the pid that read it, whether its handle was opened in this pid)."""

    def __init__(self, records):
        self.records = records

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        from gridrun.data import readers

        data, label = self.records[i]
        own = [key for key, r in readers._OPEN.items() if r is self.records.reader()]
        return (torch.frombuffer(bytearray(data), dtype=torch.uint8), label, os.getpid(),
                own[0][0] == os.getpid())


class Samples(torch.utils.data.Dataset):
    """Samples of every packable kind, one shape varying with i; `fail_at` raises there,
    `sleep` slows every sample."""

    def __init__(self, n: int = 12, fail_at: int = -1, sleep: float = 0.0):
        self.n, self.fail_at, self.sleep = n, fail_at, sleep

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import numpy as np

        if i == self.fail_at:
            raise RuntimeError(f"sample {i} cannot be made")
        if self.sleep:
            time.sleep(self.sleep)
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(3, 4, generator=g), "tokens": torch.arange(i % 5 + 1),
                "mask": np.arange(6, dtype=np.uint8) % 2 == 0, "label": i % 3, "weight": i / 7,
                "flag": bool(i % 2), "raw": bytes([i, 255 - i]), "half": torch.ones(2).half()}


def samples(n: int = 12) -> Samples:
    """For `gridrun pack tests.data_helpers:samples` (a function that returns a Dataset)."""
    return Samples(n)


def slow_augmented(sleep: float = 0.002, **kwargs):
    """helper_tasks.augmented (augmentation from python's, NumPy's and torch's global
    RNGs, its own drawing collate_fn, dropout, BatchNorm) whose every training sample
    takes `sleep` seconds to load: a run with workers to gain."""
    from helper_tasks import SlowData, augmented

    task = augmented(**kwargs)
    task.train_data = SlowData(task.train_data, sleep)
    return task


class FileLike(torch.utils.data.Dataset):
    """Says it reads one file per sample, as FolderDataset does."""

    storage = "files"
