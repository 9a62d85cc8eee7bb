"""Data order that is seeded per (seed, epoch) and resumes mid-epoch for free."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from gridrun.engine.seeding import data_seed, worker_init_fn


class ResumableSampler(Sampler[int]):
    """A permutation from a generator seeded by (seed, epoch), from position `start`.

    Skipping to a position costs one permutation, not loading the skipped
    samples. Only whole batches are drawn, so every step sees as many samples.
    The sampler runs in the main process, so `set_epoch` also works with
    persistent workers.
    """

    def __init__(self, size: int, batch_size: int, seed: int):
        self.size, self.seed = size, seed
        self.usable = size // batch_size * batch_size
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(data_seed(self.seed, self.epoch))
        return iter(torch.randperm(self.size, generator=g)[self.start:self.usable].tolist())

    def __len__(self) -> int:
        return max(self.usable - self.start, 0)


def train_loader(dataset: Any, cfg: Mapping[str, Any], *, seed: int, collate_fn: Any,
                 cuda: bool) -> DataLoader:
    """A loader for the whole run; call `start_epoch` before iterating each epoch."""
    workers = cfg["num_workers"]
    pin = cuda if cfg["pin_memory"] == "auto" else bool(cfg["pin_memory"])
    return DataLoader(
        dataset, batch_size=cfg["batch_size"], sampler=ResumableSampler(len(dataset), cfg["batch_size"], seed),
        drop_last=True, collate_fn=collate_fn, num_workers=workers, pin_memory=pin,
        prefetch_factor=cfg["prefetch_factor"] if workers else None,
        persistent_workers=bool(workers) and cfg["persistent_workers"],
        worker_init_fn=worker_init_fn if workers else None,
        # An explicit generator: otherwise creating an iterator draws from the
        # global RNG, and a resumed run would draw at a different moment.
        generator=torch.Generator(),
    )


def start_epoch(loader: DataLoader, seed: int, epoch: int, start_batch: int) -> None:
    """Point the loader at `epoch`, from batch `start_batch`. Worker seeds follow
    (seed, epoch) too, except with persistent workers, seeded once per process."""
    loader.sampler.set_epoch(epoch, start_batch * loader.batch_size)
    loader.generator.manual_seed(data_seed(seed, epoch) + 1)


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
