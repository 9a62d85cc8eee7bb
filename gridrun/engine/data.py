"""Data order that is seeded per (seed, epoch) and resumes mid-epoch for free."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from gridrun.engine.seeding import data_seed, worker_init_fn


class ResumableSampler(Sampler[int]):
    """A permutation from a generator seeded by (seed, epoch), starting at `start`.

    Skipping to a position costs one permutation, not loading the skipped samples.
    """

    def __init__(self, size: int, seed: int, epoch: int, start: int = 0):
        self.size, self.seed, self.epoch, self.start = size, seed, epoch, start

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(data_seed(self.seed, self.epoch))
        return iter(torch.randperm(self.size, generator=g)[self.start:].tolist())

    def __len__(self) -> int:
        return self.size - self.start


def train_loader(dataset: Any, cfg: Mapping[str, Any], *, seed: int, epoch: int, start_batch: int,
                 collate_fn: Any, cuda: bool) -> DataLoader:
    batch = cfg["batch_size"]
    usable = len(dataset) // batch * batch  # whole batches only: every step sees the same amount
    sampler = ResumableSampler(len(dataset), seed, epoch, start_batch * batch)
    workers = cfg["num_workers"]
    pin = cuda if cfg["pin_memory"] == "auto" else bool(cfg["pin_memory"])
    return DataLoader(
        dataset, batch_size=batch, sampler=_Truncated(sampler, usable - start_batch * batch),
        drop_last=True, collate_fn=collate_fn, num_workers=workers, pin_memory=pin,
        prefetch_factor=cfg["prefetch_factor"] if workers else None,
        persistent_workers=False,  # a fresh loader per epoch carries the epoch's seed
        worker_init_fn=worker_init_fn if workers else None,
        # An explicit generator: otherwise creating the iterator draws from the
        # global RNG, and a resumed run would draw at a different moment.
        generator=torch.Generator().manual_seed(data_seed(seed, epoch) + 1),
    )


class _Truncated(Sampler[int]):
    def __init__(self, inner: Sampler[int], count: int):
        self.inner, self.count = inner, max(count, 0)

    def __iter__(self) -> Iterator[int]:
        it = iter(self.inner)
        for _ in range(self.count):
            yield next(it)

    def __len__(self) -> int:
        return self.count


def val_loader(dataset: Any, cfg: Mapping[str, Any], *, collate_fn: Any, cuda: bool) -> DataLoader:
    pin = cuda if cfg["pin_memory"] == "auto" else bool(cfg["pin_memory"])
    return DataLoader(dataset, batch_size=max(cfg["batch_size"], 256), shuffle=False,
                      collate_fn=collate_fn, num_workers=0, pin_memory=pin)


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        moved = [to_device(v, device, non_blocking) for v in batch]
        return type(batch)(moved) if isinstance(batch, list) else tuple(moved)
    return batch


def count_samples(batch: Any) -> int:
    """The length of the batch's first tensor."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, list | tuple):
        for item in batch:
            n = count_samples(item)
            if n:
                return n
    return 0
