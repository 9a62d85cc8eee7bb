"""Options and helpers shared by the commands."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

RootOption = Annotated[
    Path,
    typer.Option(
        "--root",
        envvar="GRIDRUN_ROOT",
        help="The runs root (default ./runs, or $GRIDRUN_ROOT).",
        file_okay=False,
    ),
]
DEFAULT_ROOT = Path("runs")


def fail(message: str, code: int = 2) -> NoReturn:
    """End a command with a clean message on stderr (no traceback)."""
    typer.echo(message, err=True)
    raise typer.Exit(code)


@contextmanager
def open_store(root: Path) -> Iterator[Any]:
    """The store under `root`, for a command: a damaged one ends the command with
    its one-line reason (exit 2), wherever the damage shows; an empty one while
    run folders exist says so on stderr first."""
    from gridrun.engine.layout import UnsafeRoot
    from gridrun.engine.store import Store, StoreDamaged

    try:
        with Store(root) as store:
            if not store.has_runs():
                from gridrun.engine.doctor import lost_queue_warning

                warning = lost_queue_warning(root, store)
                if warning:
                    typer.echo(f"warning: {warning}", err=True)
            yield store
    except (StoreDamaged, UnsafeRoot) as e:  # one line each, with what to do
        fail(str(e))
