"""The one entry point: `gridrun` opens the interface; subcommands script everything.

Each group of commands lives in `gridrun/commands/` and registers itself here.
Command modules import only Typer at the top, so `gridrun --help` and
`gridrun plan` never pay for importing torch.
"""

from __future__ import annotations

import typer

from gridrun.commands import analysis, deploy, doctor, engine, plan, remove, train, tui, verify
from gridrun.commands import data as data_commands

app = typer.Typer(
    name="gridrun",
    help="A terminal experiment runner for PyTorch. With no command, opens the interface.",
    add_completion=False,
    no_args_is_help=False,
    pretty_exceptions_enable=False,
)

for module in (tui, plan, train, engine, remove, analysis, doctor, verify, deploy, data_commands):
    module.register(app)


def main() -> None:
    from gridrun.runs.layout import private_umask

    private_umask()
    app()


if __name__ == "__main__":
    main()
