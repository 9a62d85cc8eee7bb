"""`gridrun verify RUN`: replay a run and compare it bit for bit with what it recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gridrun.commands.common import DEFAULT_ROOT, RootOption, fail, working


def run_folder(run: str, root: Path, doing: str = "verify") -> Path:
    """A run folder given as a path, or the folder of the run whose id starts with `run`."""
    from gridrun.commands.common import open_root, open_store
    from gridrun.runs import layout, states

    path = Path(run)
    if (path / layout.CONFIG).is_file():
        return path
    open_root(root)  # a missing, unsafe or system root: one line, nothing created
    if not (root / layout.DB_NAME).exists():
        fail(f"{run!r} is neither a run folder nor a run of {root} (it has no {layout.DB_NAME}; "
             "--root names another root)")
    from gridrun.runs.store import RunNotFound

    with open_store(root, write=False) as store:
        try:
            found = store.get_run(run)
        except RunNotFound as e:
            fail(str(e))
    if found.status in (states.QUEUED, states.RUNNING):
        fail(f"run {found.id} is {found.status}: {doing} it once it has ended")
    return found.run_dir(root)


def register(app: typer.Typer) -> None:
    @app.command()
    def verify(
        run: Annotated[str, typer.Argument(help="A run id (a unique prefix is enough) or a run folder.",
                                           metavar="RUN")],
        steps: Annotated[int | None, typer.Option("--steps", min=1, metavar="N", help="Replay at most N optimizer "
                                                  "steps (the schedule stays the run's own).")] = None,
        from_checkpoint: Annotated[bool, typer.Option(
            "--from-checkpoint", help="Resume the replay from the run's checkpoints/last.pt and "
            "compare what the run recorded after it.")] = False,
        root: RootOption = DEFAULT_ROOT,
    ) -> None:
        """Re-execute a finished or interrupted run in a scratch folder and compare it bit for bit.

        Every metrics line (timing fields aside) and the final weights are compared with what
        the run recorded. Prints "bitwise identical over N steps" or the first differing step
        and field, and writes the verdict to RUN_DIR/verify.json (the interface shows it).
        Exit 0 identical, 1 on a difference, 2 when the run cannot be verified.
        """
        folder = run_folder(run, root)
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        from gridrun.checks import verdict

        with working("importing torch"):
            from gridrun.checks.verify import VerifyError
            from gridrun.checks.verify import verify as replay

        console = Console(stderr=True)
        try:
            with Progress(TextColumn(f"replaying {folder.name}"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("steps"), console=console, transient=True,
                          disable=not console.is_terminal) as bar:
                task = bar.add_task("replay", total=None)
                result = replay(folder, steps=steps, from_checkpoint=from_checkpoint,
                                progress=lambda done, total: bar.update(task, completed=done, total=total))
        except VerifyError as e:
            fail(str(e))
        if result["recorded_device"] not in (None, result["device"]):
            typer.echo(f"note: recorded on {result['recorded_device']}, replayed on {result['device']}",
                       err=True)
        typer.echo(verdict.describe(result))
        raise typer.Exit(0 if result["ok"] else 1)
