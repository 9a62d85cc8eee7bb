"""`gridrun train FILE [RUN]`: one cell of an experiment file, in the foreground."""

from __future__ import annotations

from typing import Annotated

import typer

from gridrun.commands.common import DEFAULT_ROOT, RootOption, fail
from gridrun.commands.plan import FileArgument, load_or_exit


def pick(runs, wanted: str | None):
    """The run named by an id or a unique prefix (optional when there is one run)."""
    if wanted is None:
        if len(runs) == 1:
            return runs[0]
        fail(f"the file has {len(runs)} runs: name one by its id or a unique prefix "
             "(`gridrun plan FILE` lists them)")
    matches = [r for r in runs if r.id.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        fail(f"no run of the file has an id starting with {wanted!r} (`gridrun plan FILE` lists them)")
    listed = ", ".join(f"{r.id} ({r.experiment} {r.variant} seed {r.seed})".replace("  ", " ")
                       for r in matches[:5])
    fail(f"{wanted!r} matches {len(matches)} runs: {listed}{' ...' if len(matches) > 5 else ''}; "
         "type more of the id")


def register(app: typer.Typer) -> None:
    @app.command()
    def train(
        file: FileArgument,
        run: Annotated[str | None, typer.Argument(help="Run id or unique prefix, as `gridrun plan` prints.")] = None,
        root: RootOption = DEFAULT_ROOT,
        fresh: Annotated[bool, typer.Option("--fresh", help="Start over instead of resuming.")] = False,
    ) -> None:
        """Train one run of an experiment file in the foreground.

        Resumes from the run's last checkpoint when there is one. The exit code
        tells completed (0), failed (1), diverged (3), out of memory (4) and
        interrupted (5) apart; ctrl-c checkpoints and exits 5.
        """
        from gridrun.engine import layout, states, worker
        from gridrun.engine.spec import write_run_config

        chosen = pick(load_or_exit(file), run)
        try:  # the same checks as the engine: a private root, no symlink followed inside it
            layout.check_root(root)
            run_dir = layout.make_run_dir(root, chosen.experiment, chosen.id)
        except (layout.UnsafePath, OSError) as e:
            fail(f"cannot use the run's folder: {e}")
        write_run_config(run_dir / layout.CONFIG, chosen)
        code = worker.main(run_dir, fresh=fresh)
        status = states.STATUS_OF_EXIT[code]
        typer.echo(f"{status}: {run_dir}", err=code != 0)
        raise typer.Exit(code)
