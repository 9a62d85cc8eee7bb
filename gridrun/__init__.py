"""gridrun: a terminal experiment runner for PyTorch.

`gridrun.load_run(path_or_id, root=None)` opens a finished run from Python
(config, summary, metrics, and its model with the checkpoint loaded); it
imports torch only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "load_run"]

if TYPE_CHECKING:
    from gridrun.engine.deploy import LoadedRun


def load_run(path_or_id: Any, root: Any = None) -> LoadedRun:
    """A run folder, or a run id (a unique prefix) under `root` (default ./runs or
    $GRIDRUN_ROOT): `.spec`, `.config`, `.summary`, `.metrics` (a DataFrame),
    `.model(checkpoint="best" | "last", device="cpu")`, `.evaluate(...)`, `.task`."""
    from gridrun.engine.deploy import load_run as load

    return load(path_or_id, root)
