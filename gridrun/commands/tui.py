"""`gridrun` with no command, and `gridrun tui [FILE]`: the interface.

Textual and the app are imported inside the functions, so other commands
never pay for them; the app itself never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gridrun.commands.common import DEFAULT_ROOT, RootOption, fail, refuse_early


def open_app(root: Path, file: Path | None = None) -> None:
    from gridrun.runs.layout import NoSuchRoot, UnsafePath
    from gridrun.runs.store import StoreError
    from gridrun.tui.app import GridrunApp
    from gridrun.tui.store_source import StoreSource

    refuse_early(root)  # as every command: one line, nothing created; a missing root opens empty
    try:
        source = StoreSource(root)  # creates nothing: a missing root is "no such root"
    except (StoreError, UnsafePath, NoSuchRoot) as e:  # later trouble: the bridge's notification
        fail(str(e))
    app = GridrunApp(source)
    if file is not None:
        app.queue_on_start = str(file)
    app.run()
    if app.return_code:  # the app stopped on an error (its traceback is above): say so
        raise typer.Exit(app.return_code)


def register(app: typer.Typer) -> None:
    @app.callback(invoke_without_command=True)
    def default(ctx: typer.Context, root: RootOption = DEFAULT_ROOT) -> None:
        """With no command: open the interface on the runs root."""
        if ctx.invoked_subcommand is None:
            open_app(root)

    @app.command()
    def tui(
        file: Annotated[Path | None, typer.Argument(
            help="An experiment file to offer for queueing at start.", dir_okay=False,
            metavar="FILE")] = None,
        root: RootOption = DEFAULT_ROOT,
    ) -> None:
        """Open the interface: watch the queue, curves and GPUs; queue, cancel and compare."""
        open_app(root, file)
