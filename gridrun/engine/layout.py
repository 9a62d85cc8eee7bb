"""Where things live under a runs root (see DESIGN.md "Runs on disk")."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_ROOT = "runs"
DB_NAME = "gridrun.db"
CONFIG = "config.toml"
METRICS = "metrics.jsonl"
OUTPUT = "output.log"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
VERIFY = "verify.json"  # the last `gridrun verify` verdict (gridrun/engine/verdict.py)


def default_root() -> Path:
    return Path(os.environ.get("GRIDRUN_ROOT", DEFAULT_ROOT))


def run_dir(root: str | os.PathLike, experiment: str, run_id: str) -> Path:
    # experiment names are validated as safe folder names by spec.py
    return Path(root) / experiment / run_id


def make_private_dir(path: str | os.PathLike) -> Path:
    """Create `path` (and parents) with mode 0700, whatever the umask."""
    path = Path(path)
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):  # parents too: mkdir(parents=True) would give them the umask
        p.mkdir(mode=0o700, exist_ok=True)
        os.chmod(p, 0o700)
    return path
