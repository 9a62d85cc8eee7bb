"""The run folders under a root, found from the disk alone (no store): listed,
counted, the warning that a store without runs sits beside them, and removing
runs with their folders (`gridrun rm`).

Below both the daemon and the doctor, which each need it."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gridrun.runs import layout

COUNT_LIMIT = 100_000  # run folders counted for the "lost queue" warning, at most


def _subdirs(path: Path) -> Iterator[Path]:
    """Real folders in `path` (never a symlink), dot-folders left out."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for e in sorted(entries, key=lambda e: e.name):
        with contextlib.suppress(OSError):
            if not e.name.startswith(".") and e.is_dir(follow_symlinks=False):
                yield Path(e.path)


def run_dirs(root: str | os.PathLike) -> Iterator[Path]:
    """ROOT/<experiment>/<run_id> folders that hold a config.toml."""
    for exp in _subdirs(Path(root)):
        for run in _subdirs(exp):
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(run / layout.CONFIG).st_mode):
                    yield run


def count_run_dirs(root: str | os.PathLike, limit: int = COUNT_LIMIT) -> int:
    n = 0
    for _ in run_dirs(root):
        n += 1
        if n >= limit:
            break
    return n


def lost_queue_warning(root: str | os.PathLike, store: Any) -> str | None:
    """One line when the store has no runs but the root holds run folders (and nobody
    emptied it with `gridrun rm`, keeping the folders)."""
    if store.has_runs():
        return None
    removed = getattr(store, "removed_since", None)
    if removed is not None and removed(0)[0]:
        return None
    n = count_run_dirs(root)
    if not n:
        return None
    more = "+" if n >= COUNT_LIMIT else ""
    return (f"the store has no runs but {root} holds {n}{more} run folder{'s' * (n != 1)}: "
            f"the queue may have been lost; `gridrun doctor --rebuild --root {shlex.quote(str(Path(root)))}` "
            "restores it")


def delete_run_dir(folder: Path) -> str:
    """Delete a run folder; a symbolic link is never followed (it is left as it is)."""
    if folder.is_symlink():
        return f"folder {folder} kept: it is a symbolic link"
    if not folder.exists():
        return "it had no folder"
    shutil.rmtree(folder)
    return f"folder {folder} deleted"


def remove_runs(store: Any, root: str | os.PathLike, ids: list[str], *,
                delete_folders: bool = False) -> dict[str, str]:
    """`gridrun rm` and the interface's x: runs out of the store (Store.remove refuses
    running ones), then their folders deleted or kept. {id: outcome}; a removed
    run's outcome starts with "removed"."""
    folders = {i: store.get_run(i).run_dir(root) for i in ids}
    out = store.remove(ids)
    for run_id, outcome in out.items():
        if outcome == "removed":
            folder = folders[run_id]
            out[run_id] = (f"removed; {delete_run_dir(folder)}" if delete_folders
                           else f"removed; folder {folder} kept" if folder.exists() else "removed")
    return out
