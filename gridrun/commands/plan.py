"""`gridrun plan FILE`: the runs an experiment file expands to, before anything runs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from gridrun.commands.common import _root, fail, working

FileArgument = Annotated[
    Path, typer.Argument(help="The experiment file (TOML).", exists=True, dir_okay=False,
                         metavar="FILE")
]
PlanRootOption = Annotated[
    Path | None,
    typer.Option("--root", envvar="GRIDRUN_ROOT", file_okay=False, callback=_root,
                 help="A runs root: also say how many of the runs are new there and how many "
                 "are done or queued (nothing is written)."),
]


def gpus_an_engine_here_could_take() -> int:
    """The most GPUs an engine started on this machine could take with no `gpus` key in
    [engine] (engine/backends/slots.slots_for): the ones NVML sees, or more where a job's
    CUDA_VISIBLE_DEVICES names more (MIG instances); never raises, 0 without a driver."""
    from gridrun.engine.backends.slots import gpu_count, inherited_gpus

    return max(gpu_count(), len(inherited_gpus() or []))


def load_or_exit(file: Path, *, force: bool = False, for_the_engine: bool = False):
    """The file's runs, or every problem on stderr and exit 2. `for_the_engine`: the runs
    are to be queued (`plan`), so one that can never fit the file's [engine] is refused."""
    from gridrun.spec import SpecError, load_runs

    try:
        return load_runs(file, force=force,
                         gpus_here=gpus_an_engine_here_could_take if for_the_engine else None)
    except SpecError as err:
        n = len(err.problems)
        fail(f"{err}\n{n} problem{'s' if n != 1 else ''} in {file}; nothing was changed.")


def check_tasks(file: Path, runs, *, quiet: bool = False):
    """The task check's report; every note on stderr (notes never block). On a
    terminal a spinner says what it does (importing torch takes seconds)."""
    with working("importing torch and the tasks", quiet=quiet) as status:
        from gridrun.checks.taskcheck import check_runs, configurations

        total, done = configurations(runs), 0

        def checked(config) -> None:
            nonlocal done
            done += 1
            status.update(f"checking the tasks: {done} of {total} configurations done")

        status.update(f"checking the tasks: 0 of {total} configurations done")
        report = check_runs(runs, file, progress=checked)
    for note in report.notes:
        typer.echo(str(note), err=True)
    return report


QUEUED = "nothing was queued."  # `gridrun queue` and `run`: they refused the file
REFUSED = "`gridrun queue` and `gridrun run` would refuse the file."  # `plan --check` queues nothing


def fail_on_problems(file: Path, report, outcome: str = QUEUED) -> None:
    """Every problem of the task check on stderr and exit 2; nothing when it passed.
    The last line says what came of them for the command that checked (`outcome`)."""
    if report.problems:
        n = len(report.problems)
        fail("\n".join(map(str, report.problems))
             + f"\n{n} problem{'s' if n != 1 else ''} in {file}; {outcome}")


def checked_text(report) -> str:
    n = len(report.configs)
    return (f"task check passed: {n} task configuration{'s' * (n != 1)} "
            f"in {report.seconds:.2f} s")


def check_or_exit(file: Path, runs) -> None:
    """`gridrun run` and `queue`: the task check, exit 2 on a problem."""
    report = check_tasks(file, runs)
    fail_on_problems(file, report)
    typer.echo(checked_text(report))


def render_plan(runs) -> str:
    rows = [("EXPERIMENT", "VARIANT", "SEED", "ID")]
    rows += [(r.experiment, r.variant or "-", str(r.seed), r.id) for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    counts = Counter(r.experiment for r in runs)
    lines.append("")
    lines += [f"{name}: {n} run{'s' if n != 1 else ''}" for name, n in counts.items()]
    lines += search_lines(runs)
    lines.append(f"total: {len(runs)} run{'s' if len(runs) != 1 else ''} "
                 f"in {len(counts)} experiment{'s' if len(counts) != 1 else ''}")
    return "\n".join(lines)


def search_lines(runs) -> list[str]:
    """One line per search: its trials, its sampler, its rungs."""
    from gridrun.spec.search import rungs

    out = []
    for search in {r.search["id"]: r.search for r in runs if r.search}.values():
        mine = [r for r in runs if r.search and r.search["id"] == search["id"]]
        text = (f"{mine[0].experiment}: search {search['id']}: {search['trials']} trials "
                f"({search['sampler']}), {len(mine)} runs")
        if search.get("scheduler"):
            steps = rungs(search["min_epochs"], search["max_epochs"], search["eta"])
            text += (f"; {search['scheduler']} on {search['metric']} "
                     f"({search.get('mode') or 'its declared direction'}): rungs at epochs "
                     f"{', '.join(map(str, steps))}, 1/{search['eta']} promoted at each")
            if search.get("brackets", 1) > 1:
                text += f", {search['brackets']} brackets"
        out.append(text)
    return out


def in_root(root: Path, runs) -> dict:
    """How the file's runs stand in `root`, as `gridrun queue` would see them: new,
    done (completed: skipped), queued or running (skipped), ended without completing
    (failed, diverged, oom, cancelled: queued again). A root without a store has only
    new ones; nothing is created."""
    from gridrun.runs import layout, states

    counts = {"path": str(root), "new": 0, "done": 0, "queued": 0, "again": 0}
    known: dict[str, str] = {}
    if (root / layout.DB_NAME).is_file():
        from gridrun.runs.store import Store, StoreDamaged

        try:
            with Store(root) as store:
                for experiment in dict.fromkeys(r.experiment for r in runs):
                    known.update((r.id, r.status) for r in store.list_runs(experiment=experiment))
        except (StoreDamaged, layout.UnsafeRoot, OSError) as e:  # planning goes on: all "new"
            typer.echo(f"note: {root}: {e}", err=True)
    for run in runs:
        status = known.get(run.id)
        key = ("new" if status is None else "done" if status == states.COMPLETED
               else "queued" if status in (states.QUEUED, states.RUNNING, states.INTERRUPTED)
               else "again")
        counts[key] += 1
    return counts


def in_root_text(counts: dict) -> str:
    parts = [f"{counts['new']} new"]
    parts += [f"{counts[k]} {what}" for k, what in (
        ("done", "done"), ("queued", "queued or running"),
        ("again", "ended without completing")) if counts[k]]
    text = f"in {counts['path']}: " + ", ".join(parts)
    if counts["again"]:
        text += " (`gridrun queue` runs these again; --force the done ones too)"
    return text


def register(app: typer.Typer) -> None:
    @app.command()
    def plan(
        file: FileArgument,
        as_json: Annotated[bool, typer.Option("--json", help="Print the runs as JSON.")] = False,
        force: Annotated[bool, typer.Option("--force", help="Allow more runs than the cap (10,000).")] = False,
        check: Annotated[bool, typer.Option(
            "--check", help="Also build each task once and run one training and one validation "
            "batch on the CPU; exit 2 on a problem.")] = False,
        root: PlanRootOption = None,
    ) -> None:
        """Validate an experiment file and list the runs it expands to."""
        runs = load_or_exit(file, force=force, for_the_engine=True)
        report = check_tasks(file, runs, quiet=as_json) if check else None
        standing = in_root(root, runs) if root is not None else None
        if as_json:
            out = {"runs": [
                {"id": r.id, "experiment": r.experiment, "variant": r.variant, "ablation": r.ablation,
                 "seed": r.seed, "task": r.task, "config": r.config,
                 **({"trial": r.trial, "search": r.search["id"], "pause_at": r.pause_at}
                    if r.search else {})} for r in runs]}
            if report is not None:
                out["check"] = report.to_json()
            if standing is not None:
                out["root"] = standing
            typer.echo(json.dumps(out))
        else:
            typer.echo(render_plan(runs))
            if report is not None and report.ok:
                typer.echo(checked_text(report))
            if standing is not None:
                typer.echo(in_root_text(standing))
        if report is not None:
            fail_on_problems(file, report, REFUSED)
