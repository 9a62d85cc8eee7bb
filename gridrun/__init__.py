"""gridrun: a terminal experiment runner for PyTorch.

What users import, and all they need to:

    from gridrun import Task      # what a task factory returns
    gridrun.load_run("6d36")       # a finished run from Python
    gridrun.randomness.enabled("augment")   # in a task: is augmentation on in this run?

Everything else (`gridrun.spec`, `gridrun.train`, `gridrun.runs`, ...) is
internal and may move; ARCHITECTURE.md maps it. Nothing here imports torch
until it is used, and nothing at all until asked: `gridrun predict` serves an
exported model without importing any task or training code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["InputInfo", "Task", "__version__", "load_run", "randomness"]

if TYPE_CHECKING:
    from gridrun import randomness
    from gridrun.deploy.model import LoadedRun
    from gridrun.tasks import InputInfo, Task


def __getattr__(name: str) -> Any:
    """`gridrun.Task`, `gridrun.InputInfo` and `gridrun.randomness`, imported on first use."""
    if name in ("Task", "InputInfo"):
        import gridrun.tasks

        return getattr(gridrun.tasks, name)
    if name == "randomness":
        import importlib

        return importlib.import_module("gridrun.randomness")
    raise AttributeError(f"module 'gridrun' has no attribute {name!r}")


def load_run(path_or_id: Any, root: Any = None) -> LoadedRun:
    """A run folder, or a run id (a unique prefix) under `root` (default ./runs or
    $GRIDRUN_ROOT): `.spec`, `.config`, `.summary`, `.metrics` (a DataFrame),
    `.model(checkpoint="best" | "last", device="cpu")`, `.evaluate(...)`, `.task`."""
    from gridrun.deploy.model import load_run as load

    return load(path_or_id, root)
