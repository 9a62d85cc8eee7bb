"""`gridrun rm ID...`: take runs out of the queue and the store.

Queued and ended runs are removed; a running one is refused (cancel it first:
removing it under the engine would leave a process nobody tracks). Folders
are kept unless `--delete-folders`; a removed run queued again from its file
starts from scratch either way (its id comes back as a new run).
"""

from __future__ import annotations

from typing import Annotated

import typer

from gridrun.commands.common import DEFAULT_ROOT, RootOption, fail, open_store


def rm(
    runs: Annotated[list[str], typer.Argument(help="Run ids (unique prefixes are enough).",
                                              metavar="RUN...")],
    delete_folders: Annotated[bool, typer.Option(
        "--delete-folders", help="Also delete the runs' folders (metrics, checkpoints, "
        "output). Without it they stay on disk.")] = False,
    root: RootOption = DEFAULT_ROOT,
) -> None:
    """Remove runs from the queue and the store (queued or ended ones; a running run is
    refused: `gridrun cancel` it first). Their folders are kept unless --delete-folders.
    Exits 2, removing nothing, if an id matches no run or several; exits 2 if any
    run was refused (the others are removed)."""
    from gridrun.runs.rundirs import remove_runs
    from gridrun.runs.store import RunNotFound

    with open_store(root) as store:
        try:
            ids = list(dict.fromkeys(store.resolve(p) for p in runs))
        except RunNotFound as e:
            fail(f"gridrun rm: {e}; nothing was removed")
        out = remove_runs(store, root, ids, delete_folders=delete_folders)
    refused = False
    for run_id, outcome in out.items():
        ok = outcome.startswith("removed")
        refused |= not ok
        typer.echo(f"{run_id}: {outcome}", err=not ok)
    if refused:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.command("rm")(rm)
