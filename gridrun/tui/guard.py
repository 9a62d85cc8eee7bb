"""A refresh that raises is a notification and a line in ROOT/tui.log, never a crash.

Every handler that paints what the bridge delivered (rows, engine state, a
run's records, a table) is wrapped in `refresh`; an unexpected exception in it
is reported here and the app keeps going. Errors that do stop the app still
end it with a non-zero exit status (see commands/tui.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

LOG = "tui.log"
F = TypeVar("F", bound=Callable[..., Any])


def log_path(app: Any) -> Path | None:
    root = getattr(getattr(app, "source", None), "root", None)
    return Path(root) / LOG if root is not None else None


def write_log(path: Path | None, where: str, error: BaseException) -> bool:
    """Append the traceback to `path` (0600); False when it cannot be written."""
    if path is None or not path.parent.is_dir():
        return False
    lines = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {where}\n{lines}\n")
    except OSError:
        return False
    return True


def report(app: Any, where: str, error: BaseException) -> None:
    """Tell the user (a notification) and keep the traceback (ROOT/tui.log)."""
    path = log_path(app)
    logged = write_log(path, where, error)
    more = f"; details in {path}" if logged else ""
    with contextlib.suppress(Exception):
        app.notify(f"{where}: {type(error).__name__}: {error}{more}", title="error",
                   severity="error", timeout=10)


def refresh(fn: F) -> F:
    """A method of a widget or screen that paints data: its exceptions are reported."""
    @functools.wraps(fn)
    def guarded(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except Exception as error:
            report(self.app, fn.__qualname__, error)
            return None
    return guarded  # type: ignore[return-value]
