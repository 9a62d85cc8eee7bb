"""The data path: seeded order, and random streams that follow the data.

Every batch is fetched under its own random state, derived from (the seed of
the run's augment source, by default the run's seed; epoch; batch index):
python's `random`, NumPy's global generator and torch's CPU generator are
seeded from it around the dataset's `__getitem__` calls and the `collate_fn`,
and restored afterwards in the main process. Whatever a task
draws there (augmentation, as users write it) depends only on which batch it
is: not on which process fetched it, how many workers there are, whether they
persist, the prefetch depth, or where a resume started. Dropout and other
randomness in the model keep the main stream, which checkpoints carry. The
order of the training data comes from the order source's seed (spec/sources.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate, get_worker_info

from gridrun import randomness
from gridrun.train.seeding import data_seed, stream_seed, worker_init_fn

VALIDATION = -1  # the "epoch" of validation streams: every evaluation sees the same view


class BatchKeys(Sampler[tuple[int, list[int]]]):
    """One key a batch: (the batch's stream seed, its sample indices).

    Training order is a permutation from a generator seeded by (seed, epoch),
    read from batch `start`: skipping costs one permutation, not loading the
    skipped samples. The sampler runs in the main process, so `set_epoch` also
    works with persistent workers.
    """

    def __init__(self, size: int, batch_size: int, seed: int, *, shuffle: bool = True,
                 drop_last: bool = True, augment_seed: int | None = None):
        self.size, self.batch_size, self.seed, self.shuffle = size, batch_size, seed, shuffle
        # the order source seeds the permutation; the augment source the batches' streams
        self.augment_seed = seed if augment_seed is None else augment_seed
        self.batches = size // batch_size if drop_last else -(-size // batch_size)
        self.epoch, self.start = 0, 0
        self.rank, self.ranks, self.group = 0, 1, 1  # every batch: one device

    def deal(self, rank: int, ranks: int, group: int) -> None:
        """Keep rank `rank`'s share of each `group` consecutive batches (of `ranks` equal,
        consecutive shares): a step's micro-batches (group = accumulate), or the
        validation batches one by one (group = ranks: batch b goes to rank b mod ranks)."""
        self.rank, self.ranks, self.group = rank, ranks, group

    def mine(self, b: int) -> bool:
        return self.ranks == 1 or (b % self.group) // (self.group // self.ranks) == self.rank

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self) -> Iterator[tuple[int, list[int]]]:
        if self.shuffle:
            g = torch.Generator().manual_seed(data_seed(self.seed, self.epoch))
            order = torch.randperm(self.size, generator=g).tolist()
        else:
            order = list(range(self.size))
        bs = self.batch_size
        for b in range(self.start, self.batches):
            if self.mine(b):
                yield stream_seed(self.augment_seed, self.epoch, b), order[b * bs:(b + 1) * bs]

    def __len__(self) -> int:
        if self.ranks == 1:
            return max(self.batches - self.start, 0)
        return sum(1 for b in range(self.start, self.batches) if self.mine(b))


class SeededBatches(Dataset):
    """Fetches and collates a whole batch under the batch's own random streams."""

    def __init__(self, dataset: Any, collate_fn: Callable[[list[Any]], Any] | None):
        self.dataset, self.collate_fn = dataset, collate_fn or default_collate
        self.batched = bool(getattr(dataset, "__getitems__", None))
        self.numpy_batch = None  # created in the process that fetches (workers unpickle a copy)
        self.switched_off = randomness.switched_off()  # told to workers, however they start

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, list[int]]) -> Any:
        stream, indices = key
        with batch_streams(self, stream):
            if self.batched:
                samples = self.dataset.__getitems__(indices)
            else:
                samples = [self.dataset[i] for i in indices]
            return self.collate_fn(samples)


@contextmanager
def batch_streams(owner: SeededBatches, stream: int) -> Iterator[None]:
    """Python's, NumPy's and torch's CPU generator seeded from `stream`; in the
    main process, whose streams the model and the checkpoints use, put back after.

    About 15 µs a batch (benchmarks/bench_data_streams.py). NumPy's global
    generator is swapped for a second one rather than saved and restored
    (1.8 µs against 65 µs); the swap back drops a cached legacy Gaussian, so a
    main process drawing an odd number of `np.random.normal` values between
    batches would see the next one change. The checkpoint keeps it either way.
    """
    main = get_worker_info() is None
    if not main:
        randomness.configure(owner.switched_off)
    if owner.numpy_batch is None:
        owner.numpy_batch = np.random.MT19937(0)
    saved_python = random.getstate() if main else None
    saved_numpy = np.random.get_bit_generator()
    saved_torch = torch.get_rng_state() if main else None
    random.seed(stream & 0xFFFF_FFFF)  # a 32-bit seed seeds twice as fast
    np.random.set_bit_generator(owner.numpy_batch)
    np.random.seed(stream & 0xFFFF_FFFF)
    torch.default_generator.manual_seed(stream)  # the CPU generator only, never CUDA's
    try:
        yield
    finally:
        if main:
            random.setstate(saved_python)
            np.random.set_bit_generator(saved_numpy)
            torch.set_rng_state(saved_torch)


def _as_fetched(batch: Any) -> Any:
    """The batch as the task's collate_fn made it (a module-level function: workers pickle it)."""
    return batch


def _loader(dataset: Any, keys: BatchKeys, cfg: Mapping[str, Any], collate_fn: Any, cuda: bool,
            workers: int) -> DataLoader:
    pin = cuda if cfg["pin_memory"] == "auto" else bool(cfg["pin_memory"])
    return DataLoader(
        SeededBatches(dataset, collate_fn), batch_size=None, sampler=keys, collate_fn=_as_fetched,
        num_workers=workers, pin_memory=pin,
        prefetch_factor=cfg["prefetch_factor"] if workers else None,
        persistent_workers=bool(workers) and cfg["persistent_workers"],
        worker_init_fn=worker_init_fn if workers else None,
        # An explicit generator: otherwise creating an iterator draws from the
        # global RNG, and a resumed run would draw at a different moment.
        generator=torch.Generator(),
    )


def train_loader(dataset: Any, cfg: Mapping[str, Any], *, seed: int, collate_fn: Any,
                 cuda: bool, augment_seed: int | None = None) -> DataLoader:
    """A loader for the whole run; call `start_epoch` before iterating each epoch.
    With `drop_last` (the default) only whole batches are drawn, so every step sees
    as many samples; without it an epoch's last batch may be partial. `seed` orders
    the data (the order source), `augment_seed` (default: `seed`) seeds the streams;
    `shuffle = false` keeps the index order."""
    keys = BatchKeys(len(dataset), cfg["batch_size"], seed, shuffle=cfg.get("shuffle", True),
                     drop_last=cfg.get("drop_last", True), augment_seed=augment_seed)
    return _loader(dataset, keys, cfg, collate_fn, cuda, cfg["num_workers"])


def start_epoch(loader: DataLoader, seed: int, epoch: int, start_batch: int) -> None:
    """Point the loader at `epoch`, from batch `start_batch`."""
    loader.sampler.set_epoch(epoch, start_batch)
    loader.generator.manual_seed(data_seed(seed, epoch) + 1)


def val_loader(dataset: Any, cfg: Mapping[str, Any], *, seed: int, collate_fn: Any,
               cuda: bool) -> DataLoader:
    keys = BatchKeys(len(dataset), max(cfg["batch_size"], 256), seed, shuffle=False,
                     drop_last=False)
    keys.set_epoch(VALIDATION)
    return _loader(dataset, keys, cfg, collate_fn, cuda, workers=0)


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
