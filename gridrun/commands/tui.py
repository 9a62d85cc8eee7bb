"""`gridrun` with no command, and `gridrun tui`: the interface (not built yet)."""

import typer


def register(app: typer.Typer) -> None:
    @app.callback(invoke_without_command=True)
    def default(ctx: typer.Context) -> None:
        if ctx.invoked_subcommand is None:
            typer.echo(ctx.get_help())
