"""What the runs list looked like when the interface was quit, per root: filter,
sort, grouping, marks and the run under the cursor, in ROOT/tui-state.json.

Written atomically (a temporary file, then a rename) on quit; read on open. A
file that is not what we wrote (not JSON, wrong types) is ignored with a
notification: a field of the wrong type alone is left out.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FILE = "tui-state.json"


@dataclass
class Saved:
    filter: str = ""
    sort: str | None = None
    reverse: bool = False
    grouped: bool = False
    marks: list[str] = field(default_factory=list)
    cursor: str | None = None  # a run id; restored once that run's row has arrived

    def restore_cursor(self, table: Any) -> None:
        if self.cursor is not None and self.cursor in table.position:
            table.move_cursor(row=table.position[self.cursor])
            self.cursor = None

    def of(self, table: Any) -> Saved:
        current = table.current
        return Saved(filter=table.needle, sort=table.sort_column, reverse=table.reverse,
                     grouped=table.grouped, marks=sorted(m for m in table.marked if m in table.runs),
                     cursor=current.id if current is not None else None)


TYPES = {"filter": str, "sort": (str, type(None)), "reverse": bool, "grouped": bool,
         "marks": list, "cursor": (str, type(None))}


def load(root: str | os.PathLike) -> tuple[Saved, str | None]:
    """The saved state (or the defaults), and a problem to tell the user, if any."""
    path = Path(root) / FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Saved(), None
    except (OSError, ValueError) as e:
        return Saved(), f"ignored {path}: {type(e).__name__}: {e}"
    if not isinstance(data, dict):
        return Saved(), f"ignored {path}: not a JSON object"
    kept = {k: v for k, v in data.items() if k in TYPES and isinstance(v, TYPES[k])}
    kept["marks"] = [m for m in kept.get("marks", []) if isinstance(m, str)]
    wrong = sorted(k for k in data if k not in kept)
    return Saved(**kept), (f"{path}: left out {', '.join(wrong)} (unexpected)" if wrong else None)


def save(root: str | os.PathLike, saved: Saved) -> None:
    """Atomically: a reader never sees half a file. Nothing when the root is gone, or
    when it cannot be written (a full disk must not turn a quit into a traceback)."""
    root = Path(root)
    if not root.is_dir():
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tui-state.", dir=root)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(asdict(saved), f, indent=1)
        os.replace(tmp, root / FILE)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if not isinstance(e, OSError):
            raise
