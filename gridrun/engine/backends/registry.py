"""Choose the backend named by `[engine] backend`: "local" (this machine), "ray" or "slurm"."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from gridrun.engine.backends.base import Backend, Slot
from gridrun.engine.backends.slots import slots_for

NAMES = ("local", "ray", "slurm")


class BackendError(RuntimeError):
    """The configured backend cannot be used (unknown name, Ray or submitit not installed)."""


def check_backend(config: Any) -> None:
    """Raise BackendError now, before anything is queued or started, if the
    configured backend cannot be used here."""
    name = getattr(config, "backend", "local")
    if name not in NAMES:
        raise BackendError(f"[engine] backend = {name!r} is unknown; choose one of "
                           + ", ".join(repr(n) for n in NAMES))
    if name == "ray" and importlib.util.find_spec("ray") is None:
        raise BackendError("[engine] backend = \"ray\" needs Ray, which is not installed: "
                           "pip install 'gridrun[ray]'")
    if name == "slurm" and importlib.util.find_spec("submitit") is None:
        raise BackendError("[engine] backend = \"slurm\" needs submitit, which is not installed: "
                           "pip install 'gridrun[slurm]'")


def make_backend(config: Any, root: str | Path, log_path: Path | None = None) -> Backend:
    check_backend(config)
    name = getattr(config, "backend", "local")
    if name == "local":
        from gridrun.engine.backends.local import LocalBackend

        return LocalBackend(log_path=log_path)
    if name == "ray":
        from gridrun.engine.backends.ray import RayBackend, RayUnavailable

        try:
            return RayBackend(root, address=config.ray_address, runs_per_gpu=config.runs_per_gpu,
                              log_path=log_path)
        except RayUnavailable as e:  # installed, but broken
            raise BackendError(str(e)) from e
    if name == "slurm":
        from gridrun.engine.backends.slurm import SlurmBackend, SlurmUnavailable

        try:
            return SlurmBackend(root, config, log_path=log_path)
        except SlurmUnavailable as e:
            raise BackendError(str(e)) from e
    raise AssertionError(name)


def slots_for_backend(backend: Backend, config: Any) -> list[Slot]:
    """The backend's own slots when it has them (Ray: the cluster's capacity; the
    list is filled by `backend.start()` and kept current as nodes come and go;
    SLURM: `max_jobs`), else the config's."""
    if hasattr(backend, "slots"):
        return backend.slots()
    return slots_for(config)
