"""Options and helpers shared by the commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

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
