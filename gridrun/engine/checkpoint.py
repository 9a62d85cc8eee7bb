"""Atomic checkpoints: a crash while writing leaves the previous one intact."""

from __future__ import annotations

import os
import tempfile
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
