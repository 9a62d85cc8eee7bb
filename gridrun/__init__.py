"""gridrun: a terminal experiment runner for PyTorch.

What users import, and all they need to:

    from gridrun import Task      # what a task factory returns
    gridrun.load_run("6d36")       # a finished run from Python

Everything else (`gridrun.spec`, `gridrun.train`, `gridrun.runs`, ...) is
internal and may move; ARCHITECTURE.md maps it. Nothing here imports torch
until it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gridrun.tasks import Task

__version__ = "0.1.0"
__all__ = ["Task", "__version__", "load_run"]

if TYPE_CHECKING:
    from gridrun.deploy.model import LoadedRun


def load_run(path_or_id: Any, root: Any = None) -> LoadedRun:
    """A run folder, or a run id (a unique prefix) under `root` (default ./runs or
    $GRIDRUN_ROOT): `.spec`, `.config`, `.summary`, `.metrics` (a DataFrame),
    `.model(checkpoint="best" | "last", device="cpu")`, `.evaluate(...)`, `.task`."""
    from gridrun.deploy.model import load_run as load

    return load(path_or_id, root)
