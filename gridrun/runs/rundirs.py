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


def _set_aside(folder: Path) -> tuple[Path | None, str | None]:
    """Before a run leaves the store: its folder renamed to a dot-name beside it (readers
    skip it), or why it cannot be deleted (then the run stays in the store). (None, None):
    nothing to delete (no folder, or a link, which is kept)."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"its folder {folder} cannot be looked at ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return None, None
    if not stat.S_ISDIR(st.st_mode):
        return None, (f"{folder} is not a folder (something else is in the way): move it "
                      "away, then remove the run")
    aside = folder.with_name(f".{folder.name}.removing")
    try:
        if os.path.lexists(aside):
            shutil.rmtree(aside)  # an earlier `rm` that was cut short
        os.rename(folder, aside)
    except OSError as e:
        return None, f"its folder {folder} cannot be deleted ({e.strerror})"
    return aside, None


def remove_runs(store: Any, root: str | os.PathLike, ids: list[str], *,
                delete_folders: bool = False) -> dict[str, str]:
    """`gridrun rm` and the interface's x: runs out of the store (Store.remove refuses
    running ones), then their folders deleted or kept. {id: outcome}; a removed
    run's outcome starts with "removed". With `delete_folders`, a run whose folder
    cannot be deleted stays in the store: the folder is set aside first, and put back
    if the store refuses the run."""
    folders = {i: store.get_run(i).run_dir(root) for i in ids}
    out: dict[str, str] = {}
    aside: dict[str, Path | None] = {}
    if delete_folders:
        for run_id in ids:
            aside[run_id], refused = _set_aside(folders[run_id])
            if refused:
                out[run_id] = f"not removed: {refused}"
    removed = store.remove([i for i in ids if i not in out])
    for run_id, outcome in removed.items():
        folder, moved = folders[run_id], aside.get(run_id)
        if outcome != "removed":
            out[run_id] = outcome
            if moved is not None:
                try:
                    os.rename(moved, folder)  # the store kept it: so does the disk
                except OSError as e:
                    out[run_id] += f"; its folder was set aside at {moved} ({e.strerror})"
        elif delete_folders:
            if moved is not None:
                shutil.rmtree(moved, ignore_errors=True)
                out[run_id] = f"removed; folder {folder} deleted"
            else:
                out[run_id] = "removed; " + delete_run_dir(folder)
        else:
            out[run_id] = f"removed; folder {folder} kept" if folder.exists() else "removed"
    return {i: out[i] for i in ids if i in out}
