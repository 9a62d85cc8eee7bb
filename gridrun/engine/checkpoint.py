"""Atomic checkpoints: a crash while writing leaves the previous one intact."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch


def save(state: dict[str, Any], path: str | os.PathLike) -> None:
    """Write to a temporary file in the same folder, fsync, rename, fsync the folder."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load(path: str | os.PathLike, device: torch.device | str = "cpu") -> dict[str, Any] | None:
    """The checkpoint at `path`, or None when there is none."""
    path = Path(path)
    if not path.exists():
        return None
    return torch.load(path, map_location=device, weights_only=True)


def weights_sha256(state_dict: Mapping[str, Any]) -> str:
    """A hash of a state dict that two machines agree on: keys in sorted order, and for
    each its name, dtype, shape and the bytes of a contiguous CPU copy."""
    h = hashlib.sha256()
    for key in sorted(state_dict):
        value = state_dict[key]
        if not isinstance(value, torch.Tensor):  # e.g. a module's extra state
            h.update(f"{key}\0{value!r}\0".encode())
            continue
        tensor = value.detach().cpu().contiguous()
        h.update(f"{key}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        h.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return h.hexdigest()
