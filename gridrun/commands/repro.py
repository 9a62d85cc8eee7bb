"""`gridrun repro RUN`: a standalone script that reproduces a run's first steps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer

from gridrun.commands.common import DEFAULT_ROOT, RootOption, fail


def register(app: typer.Typer) -> None:
    @app.command()
    def repro(
        run: Annotated[str, typer.Argument(help="A run id (a unique prefix is enough) or a run folder.",
                                           metavar="RUN")],
        steps: Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps the script "
                                           "takes (the schedule stays the run's own).")] = 50,
        output: Annotated[Path, typer.Option("-o", "--output", dir_okay=False,
                                             help="The script to write.")] = Path("repro.py"),
        check: Annotated[bool, typer.Option("--check", help="Run the script here and compare "
                                            "its losses with the run's, bit for bit.")] = False,
        force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists "
                                            "(never through a symbolic link).")] = False,
        root: RootOption = DEFAULT_ROOT,
    ) -> None:
        """Write a standalone Python script that rebuilds RUN's model and data with its config
        and seeds and takes its first N steps, printing the loss of each.

        The script imports torch, NumPy and the run's task module, nothing of gridrun's trainer,
        store or engine: for a bug report, or to cut a problem down until it still reproduces.
        Run on the machine and software the run used, it prints the losses the run recorded,
        bit for bit; --check runs it and compares them with the run's train lines (the mean
        loss and the lr of each log point; `log_every = 1` logs every step). Exit 0 identical,
        1 on a difference, 2 when there is no script to write.
        """
        from gridrun import userfiles
        from gridrun.commands.verify import run_folder

        folder = run_folder(run, root, "reproduce")
        try:
            userfiles.check_target(output, force=force)  # at once: before torch is imported
        except userfiles.RefusedFile as e:
            _refused(e, output)
        from gridrun.checks import repro as scripts

        try:
            spec = scripts.write(folder, output, steps, force=force)
        except userfiles.RefusedFile as e:  # a full disk; a file that appeared meanwhile
            _refused(e, output)
        except scripts.ReproError as e:
            fail(str(e))
        typer.echo(f"wrote {output}: run {spec.id}'s first {steps} steps (python {output})")
        if not check:
            return
        try:
            _, logs, _ = scripts.run_script(output)
        except scripts.ReproError as e:
            fail(str(e))
        result = scripts.check(folder, logs)
        typer.echo(scripts.describe(result, steps))
        raise typer.Exit(0 if result["ok"] else 1)


def _refused(e: Exception, output: Path) -> NoReturn:
    from gridrun.userfiles import TargetExists

    fail(f"{output} exists: pass --force to replace it" if isinstance(e, TargetExists) else str(e))
