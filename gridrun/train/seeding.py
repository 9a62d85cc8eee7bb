"""Seeds, deterministic mode, and every RNG state as checkpointable values."""

from __future__ import annotations

import hashlib
import os
import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds every CUDA device too, lazily


def model_seed(seed: int) -> int:
    """The seed of the model source's stream, when a run's sources draw from streams
    of their own: a 63-bit hash of the seed, so that it never replays what the
    init source drew from the same seed."""
    key = f"model:{seed}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def data_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch's data order: distinct per (seed, epoch), stable across runs."""
    return (seed * 1_000_003 + epoch * 7_919 + 12_345) % 2**63


def stream_seed(seed: int, epoch: int, batch: int) -> int:
    """The seed of one batch's random streams: a 63-bit hash of (seed, epoch, batch)."""
    key = f"{seed}:{epoch}:{batch}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def set_determinism(enabled: bool, *, compiled: bool = False) -> dict[str, Any]:
    """Deterministic algorithms on or off; returns what was set, for summary.json.

    CUBLAS_WORKSPACE_CONFIG only takes effect if set before CUDA starts, so
    this runs before the model is built.

    `torch.use_deterministic_algorithms` sets two flags: the one every eager
    kernel reads (`torch._C._set_deterministic_algorithms`) and Inductor's
    `config.deterministic`, whose import costs as long as importing torch
    (about 1.4 s on 2 cores). Without `compiled`, nothing reads Inductor's, so
    only the eager flag is set: the same effect on every kernel this run calls.
    This is the one private torch call in gridrun; tests/test_diagnostics.py
    checks that it matches the public function.
    """
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if compiled:
        torch.use_deterministic_algorithms(enabled, warn_only=False)
    else:
        torch._C._set_deterministic_algorithms(enabled, warn_only=False)
    torch.backends.cudnn.deterministic = enabled
    torch.backends.cudnn.benchmark = not enabled
    return {
        "use_deterministic_algorithms": enabled,
        "cudnn_deterministic": enabled,
        "cudnn_benchmark": not enabled,
        "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }


def worker_init_fn(worker_id: int) -> None:
    # Batches are fetched under their own streams (data.SeededBatches); this
    # seeds whatever a worker draws outside them. The DataLoader gives each
    # worker torch seed base_seed + id, base_seed drawn from the loader's
    # seeded generator; python and numpy follow it.
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


def rng_state() -> dict[str, Any]:
    """Every RNG state as tensors and plain values (loadable with weights_only=True)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
