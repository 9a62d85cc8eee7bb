"""Checkpoints that can be trusted.

Writes are atomic (a temporary file, fsynced, renamed), and `last.pt` keeps
its predecessor as `prev.pt` until the new one is durable, so a crash at any
moment, or a damaged file found later, leaves one good checkpoint to resume.
Loading is `weights_only=True`; a file that does not load is named in one
line, never answered with torch's advice to unpickle it unsafely.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

from gridrun.runs import space

LAST, PREV, BEST = "last.pt", "prev.pt", "best.pt"


class CheckpointError(Exception):
    """A checkpoint file that exists but cannot be used; the message is one line."""


def save(state: dict[str, Any], path: str | os.PathLike, *, keep_previous: bool = False) -> None:
    """Write to a temporary file in the same folder, fsync, rename, fsync the folder.
    With `keep_previous`, the file being replaced becomes `prev.pt` first.

    A write that fails for want of space raises space.NoSpace and leaves the
    checkpoints as they were (torch reports a full disk as "file write failed",
    without the errno: a failure with the disk (nearly) full is put down to it)."""
    path = Path(path)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise (space.NoSpace(path, e) if space.is_no_space(e) else e) from e
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous and path.exists():
            # a crash between the two renames leaves prev.pt and no last.pt: resumable
            os.replace(path, path.with_name(PREV))
        os.replace(tmp, path)
    except BaseException as e:
        # asked before the partial file is deleted, which frees what it took
        full = isinstance(e, Exception) and (space.is_no_space(e) or space.nearly_full(path.parent))
        Path(tmp).unlink(missing_ok=True)
        if full:
            raise space.NoSpace(path, e) from e
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load(path: str | os.PathLike, device: torch.device | str = "cpu",
         file: BinaryIO | None = None) -> dict[str, Any] | None:
    """The checkpoint at `path` (read from `file` when the caller opened it, without
    following a link), or None when there is none; CheckpointError when it is damaged."""
    path = Path(path)
    try:
        state = torch.load(path if file is None else file, map_location=device, weights_only=True)
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise CheckpointError(f"{path} cannot be loaded: {_reason(exc)}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} cannot be loaded: it holds a {type(state).__name__}, "
                              "not a checkpoint")
    return state


def _reason(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if "weights_only" in str(exc) or isinstance(exc, EOFError) or not text:
        # torch's text for an unreadable pickle suggests weights_only=False,
        # i.e. running whatever code the file holds: never pass that on
        text = "the file is damaged or not a checkpoint"
    return f"{type(exc).__name__}: {text[:160]}"


def load_resumable(folder: str | os.PathLike, device: torch.device | str,
                   required: Iterable[str]) -> tuple[dict[str, Any] | None, list[str]]:
    """The newest usable checkpoint of `folder` (last.pt, else prev.pt) and a
    one-line problem for each file that exists but could not be used."""
    folder = Path(folder)
    problems: list[str] = []
    for i, name in enumerate((LAST, PREV)):
        try:
            state = load(folder / name, device)
            if state is not None:
                missing = [k for k in required if k not in state]
                if missing:
                    raise CheckpointError(f"{folder / name} cannot be resumed: it lacks "
                                          f"{', '.join(missing)} (written by another version?)")
        except CheckpointError as err:
            # set aside, so the next save does not rotate it into prev.pt over a good one
            aside = folder / f"{name}.damaged"
            os.replace(folder / name, aside)
            fallback = "; trying prev.pt" if i == 0 else ""
            problems.append(f"{err} (kept as {aside.name}){fallback}")
            continue
        if state is not None:
            return state, problems
    return None, problems


def remove_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Delete the `.NAME.*.tmp` files that writes killed midway left behind."""
    removed = []
    for tmp in Path(folder).glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def discard(folder: str | os.PathLike) -> None:
    """Forget the resumable checkpoints of `folder` (a fresh start)."""
    for name in (LAST, PREV):
        (Path(folder) / name).unlink(missing_ok=True)


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
