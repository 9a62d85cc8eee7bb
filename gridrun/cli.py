"""The one entry point: `gridrun` opens the interface; subcommands script everything.

Each group of commands lives in `gridrun/commands/` and registers itself here.
Command modules import only Typer at the top, so `gridrun --help` and
`gridrun plan` never pay for importing torch.
"""

from __future__ import annotations

import typer
from typer.core import TyperCommand

from gridrun.commands import (
    analysis,
    deploy,
    doctor,
    engine,
    mirror,
    plan,
    remove,
    repro,
    tensorboard,
    train,
    tui,
    verify,
)
from gridrun.commands import data as data_commands
from gridrun.commands.common import Command

app = typer.Typer(
    name="gridrun",
    help="A terminal experiment runner for PyTorch. With no command, opens the interface.\n\n"
    "Every command works on a runs root: ./runs, or --root DIR (after the command or before "
    "it), or $GRIDRUN_ROOT. Run ids accept unique prefixes.",
    add_completion=False,
    no_args_is_help=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)

for module in (tui, plan, train, engine, remove, analysis, doctor, verify, repro, deploy,
               tensorboard, mirror, data_commands):
    module.register(app)


def _usage_names(group: typer.Typer) -> None:
    """Every command's usage line writes a required argument as FILE (see common.Command)."""
    for info in group.registered_commands:
        if info.cls in (None, TyperCommand):  # Typer's default; a command's own class stays
            info.cls = Command
    for sub in group.registered_groups:
        _usage_names(sub.typer_instance)


_usage_names(app)


def main() -> None:
    from gridrun.runs.layout import private_umask

    private_umask()
    app()


if __name__ == "__main__":
    main()
