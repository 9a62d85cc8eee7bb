"""`gridrun pack` and `gridrun tune-loader`: the data a run reads, and how fast it can read it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gridrun.commands.common import fail
from gridrun.commands.plan import FileArgument, load_or_exit

MB = 1e6


def _progress(label: str):
    """A rich progress bar on stderr when it is a terminal, nothing otherwise."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("records"),
                    TimeRemainingColumn(), console=console, transient=True,
                    disable=not console.is_terminal)


def _one_line(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _dataset(spec: str) -> Any:
    """`package.module:attr`: a map-style Dataset, or a function that returns one, imported
    under the rule every task import follows (the current directory first on sys.path)."""
    import importlib

    from gridrun.tasks import use_working_directory

    use_working_directory()
    module_name, _, attr = spec.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except Exception as e:  # the user's import: one line, whatever it raised
        fail(f"cannot load {spec!r}: {_one_line(e)}")
    if callable(found) and not hasattr(found, "__getitem__"):
        try:
            found = found()
        except Exception as e:  # the user's factory: one line, whatever it raised
            fail(f"{spec}() raised {_one_line(e)}")
    return found


def _with_bar(label: str, work):
    with _progress(label) as bar:
        task = bar.add_task(label, total=None)
        return work(lambda done, total: bar.update(task, completed=done, total=total))


def register(app: typer.Typer) -> None:
    @app.command()
    def pack(
        src: Annotated[str, typer.Argument(help="A folder of images (SRC/CLASS/IMAGE), "
                                           "`package.module:attr` naming a map-style Dataset (or "
                                           "a function returning one), or with --check alone a "
                                           "packed file.", metavar="SRC")],
        out: Annotated[Path | None, typer.Option("--out", "-o", help="The file to write.")] = None,
        fmt: Annotated[str | None, typer.Option("--format", help="lmdb or hdf5 (default: from "
                                                "OUT's suffix, .lmdb or .h5).")] = None,
        check: Annotated[bool, typer.Option("--check", help="Read every record back and verify "
                                            "it: after packing, or of the packed file SRC.")] = False,
        any_size: Annotated[bool, typer.Option("--any-size", help="Accept images of different "
                                               "sizes and modes.")] = False,
        force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print what was done as JSON.")] = False,
    ) -> None:
        """Pack a dataset into one LMDB or HDF5 file (or check a packed one).

        A folder in the ImageFolder layout is stored as the images' own bytes with their class
        (decoded at read time); a Dataset's samples as their tensors and arrays. The file has
        an index (length, names, dtypes, shapes, class names) and the content hash of the
        source, and is written to a temporary file, fsynced and renamed: a pack cut short never
        leaves a file that reads as good. Read it with `gridrun.data.PackedDataset(OUT)` or the
        `images` task's `data` key. Exit 0 done, 1 when --check finds damage, 2 on bad input.
        """
        from gridrun.data import PackError
        from gridrun.data import check as check_file
        from gridrun.data import pack as pack_into
        from gridrun.userfiles import RefusedFile

        if fmt is not None and fmt not in ("lmdb", "hdf5"):
            fail(f"--format {fmt!r}: expected lmdb or hdf5")
        report: dict[str, Any] = {}
        try:
            if out is None:
                if not check:
                    fail("name the file to write: -o OUT (or --check a packed file)")
                target = Path(src)
            else:
                source: Any = src
                if not Path(src).exists() and ":" in src:
                    source = _dataset(src)
                report["pack"] = packed = _with_bar(f"packing {Path(src).name}", lambda p: pack_into(
                    source, out, format=fmt, any_size=any_size, force=force, progress=p,
                    source_name=src))
                target = out
                if packed["skipped"]:
                    shown = ", ".join(packed["skipped"][:5])
                    more = " ..." if len(packed["skipped"]) > 5 else ""
                    typer.echo(f"skipped {len(packed['skipped'])} files that are not images: "
                               f"{shown}{more}", err=True)
                if not as_json:
                    typer.echo(
                        f"packed {packed['describe']} from {packed['source']} into {out} "
                        f"({packed['format']}): {packed['bytes'] / MB:,.1f} MB of records, file "
                        f"{packed['file_bytes'] / MB:,.1f} MB, in {packed['seconds']:.1f} s; "
                        f"source sha256 {packed['source_sha256'][:16]}")
            if check:
                report["check"] = checked = _with_bar(f"checking {target.name}",
                                                      lambda p: check_file(target, progress=p))
        except (PackError, RefusedFile) as e:
            fail(str(e))
        if as_json:
            typer.echo(json.dumps(report, indent=1))
        if check:
            if not as_json:
                typer.echo(describe_check(checked))
            raise typer.Exit(0 if checked["ok"] else 1)

    @app.command("tune-loader")
    def tune_loader(
        file: FileArgument,
        run: Annotated[str | None, typer.Argument(
            help="Run id or unique prefix, as `gridrun plan` prints.", metavar="RUN")] = None,
        seconds: Annotated[float, typer.Option("--seconds", min=0.5, help="Time to spend measuring.")] = 10.0,
        as_json: Annotated[bool, typer.Option("--json", help="Print the measurements as JSON.")] = False,
    ) -> None:
        """Measure DataLoader settings for one run of a file, as `num_workers = "auto"` does.

        Builds the run's task and times its real training loader (dataset, augmentation,
        collate, the copy to the device) with 0, 1, 2, 4, ... workers up to the cores this
        process may use, then more prefetch (and pinned memory on CUDA) for the best; reads the
        workers' memory (USS and PSS) and prints what a run with "auto" would choose. Trains
        nothing and changes nothing.
        """
        from gridrun.commands.train import pick
        from gridrun.train.loader_probe import tune

        chosen = pick(load_or_exit(file), run)
        try:
            record = tune(chosen, seconds)
        except Exception as e:  # the user's task: one line, whatever it raised
            fail(f"run {chosen.id} ({chosen.task}): {type(e).__name__}: {e}", 1)
        if as_json:
            typer.echo(json.dumps(record, indent=1))
        else:
            typer.echo(f"run {chosen.id} ({chosen.task}, seed {chosen.seed}): "
                       f"{record['train_samples']:,} training samples on {record['device']}, "
                       f"{record['cores']} cores, {record['spent_s']:.1f} s measuring")
            typer.echo(loader_table(record))
        if record["timed_out"]:  # what it measured is printed; the hang is an error
            fail(f"run {chosen.id}: {record['reason']}", 1)


def describe_check(checked: dict[str, Any]) -> str:
    if checked["ok"]:
        return (f"{checked['path']}: all {checked['records']:,} records intact, the content hash "
                f"matches the source's ({checked['source_sha256'][:16]}), {checked['seconds']:.1f} s")
    problems = []
    if checked["bad_records"]:
        first = ", ".join(str(x) for x in checked["first_bad"])
        problems.append(f"{checked['bad_records']} records differ from what was packed "
                        f"(first: {first})")
    if not checked["sha256_matches"]:
        problems.append("the content hash differs from the source's")
    if checked["bad_labels"]:
        problems.append(f"{checked['bad_labels']} labels name no class")
    if checked.get("class_names"):
        problems.append(checked["class_names"])
    return (f"{checked['path']} is damaged: {'; '.join(problems)}: re-pack it "
            f"(`gridrun pack {checked['source']} -o {checked['path']} --force`)")


def loader_table(record: dict[str, Any]) -> str:
    def mib(v: Any) -> str:
        return f"{v / 2**20:,.1f} MiB" if isinstance(v, int | float) else "-"

    rows = [f"{'workers':>7}  {'prefetch':>8}  {'pin':>3}  {'samples/s':>10}  {'first batch':>11}  "
            f"{'workers USS':>11}  {'PSS':>10}"]
    for t in record["trials"]:
        rate = (f"{t['samples_per_s']:,.0f}" if t["samples_per_s"] else
                "timed out" if t.get("timed_out") else t["error"] or "-")  # the reason says more
        first = f"{t['first_batch_s']:.2f} s" if t["first_batch_s"] is not None else "-"
        rows.append(f"{t['num_workers']:>7}  {t['prefetch_factor']:>8}  "
                    f"{'yes' if t['pin_memory'] else 'no':>3}  {rate:>10}  {first:>11}  "
                    f"{mib(t['workers_uss_bytes']):>11}  {mib(t['workers_pss_bytes']):>10}")
    c = record["chosen"]
    rows.append(f"choice: num_workers = {c['num_workers']}, prefetch_factor = "
                f"{c['prefetch_factor']}, pin_memory = {str(c['pin_memory']).lower()} "
                f"({record['reason']}; memory budget {mib(record['memory_budget_bytes'])})")
    return "\n".join(rows)
