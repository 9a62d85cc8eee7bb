"""`gridrun doctor`: check the machine, the root and the store; `--rebuild` the queue."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from gridrun.commands.common import DEFAULT_ROOT, RootOption, fail, working


def doctor(root: RootOption = DEFAULT_ROOT,
           rebuild: Annotated[bool, typer.Option(
               "--rebuild", help="Rebuild the queue's history from the run folders into a new "
               "store, then move the old one aside (gridrun.db.damaged-TIME). Refused while the "
               "engine runs, for a store that passes SQLite's integrity check, and for one the "
               "disk (full, read-only) or permissions keep from being used.")] = False,
           force: Annotated[bool, typer.Option(
               "--force", help="With --rebuild: replace a store that reads fine too.")] = False,
           as_json: Annotated[bool, typer.Option("--json", help="The checks as one JSON array.")] = False,
           ) -> None:
    """Check the store (SQLite integrity), the root's owner and modes, stale locks, the
    engine's heartbeat, leftover temporary files and the GPU set-up. Exit 1 if a check fails."""
    from gridrun.checks import doctor as checks

    if rebuild:
        _rebuild(root, force, as_json)
        return
    with working("checking the root, the store, the disk, the engine and the GPUs", quiet=as_json):
        results = checks.run_checks(root)  # creates nothing: a missing root is said so
    if as_json:
        typer.echo(json.dumps([c.to_dict() for c in results], indent=1))
    else:
        for c in results:
            typer.echo(f"{c.status:<4}  {c.name:<11}  {c.message}")
    raise typer.Exit(1 if any(c.status == checks.FAIL for c in results) else 0)


def _rebuild(root, force: bool, as_json: bool) -> None:
    from gridrun.checks import rebuild as checks

    try:
        with working("rebuilding the queue from the run folders", quiet=as_json):
            out = checks.rebuild(root, force=force)
    except checks.RebuildRefused as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps({"moved": [str(p) for p in out.moved], "restored": out.restored,
                               "resumes": out.resumes, "stopped": out.stopped,
                               "rung_results": out.rung_results,
                               "skipped": [{"folder": str(p), "why": why} for p, why in out.skipped]}))
        return
    if out.moved:
        typer.echo(f"moved the old store aside: {', '.join(str(p) for p in out.moved)}")
    total = sum(out.restored.values())
    typer.echo(f"restored {total} run{'s' * (total != 1)}"
               + (": " + ", ".join(f"{n} {s}" for s, n in sorted(out.restored.items())) if total else ""))
    if out.rung_results:
        typer.echo(f"{out.rung_results} rung results of search trials read back from their logs: "
                   "the engine decides the waiting trials again as it had")
    if out.resumes:
        typer.echo(f"{out.resumes} queued run{'s' * (out.resumes != 1)} resume from a checkpoint "
                   f"when the engine starts (`gridrun engine start --root {root}`)")
    if out.stopped:
        typer.echo(f"{out.stopped} run{'s' * (out.stopped != 1)} stopped mid-run (interrupted or "
                   "cancelled: the folders do not say which) restored as cancelled; "
                   "`gridrun retry ID` resumes one")
    if out.skipped:
        typer.echo(f"skipped {len(out.skipped)} folder{'s' * (len(out.skipped) != 1)}: "
                   + "; ".join(f"{p}: {why}" for p, why in out.skipped))
    typer.echo("not in the folders, so not restored: priorities, git provenance, and queued runs "
               "that had not started")


def register(app: typer.Typer) -> None:
    app.command()(doctor)
