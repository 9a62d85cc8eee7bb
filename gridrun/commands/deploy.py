"""`gridrun export-model RUN`: a deployable model, with proof that it computes the same."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from gridrun.commands.common import DEFAULT_ROOT, RootOption, fail, say, working


class Checkpoint(StrEnum):
    best = "best"
    last = "last"


class ModelFormat(StrEnum):
    onnx = "onnx"
    pt2 = "pt2"
    torchscript = "torchscript"


def register(app: typer.Typer) -> None:
    @app.command("export-model")
    def export_model(
        run: Annotated[str, typer.Argument(help="A run id (a unique prefix is enough) or a run folder.",
                                           metavar="RUN")],
        checkpoint: Annotated[Checkpoint, typer.Option(
            "--checkpoint", help="best.pt (the best validation metric) or last.pt.")] = Checkpoint.best,
        fmt: Annotated[ModelFormat, typer.Option(
            "--format", help="onnx (needs the export extra), pt2 (a torch.export archive) or "
            "torchscript (traced: control flow is frozen at the example).")] = ModelFormat.onnx,
        output: Annotated[Path | None, typer.Option(
            "-o", "--output", dir_okay=False, metavar="FILE", help="The model file; parity.json and model.json go "
            "beside it. Default: model.onnx (model.pt2, model.ts.pt) in the run folder's "
            "export/best/ (export/last/ with --checkpoint last), replaced on a re-export.")] = None,
        force: Annotated[bool, typer.Option(
            "--force", help="Replace FILE, and the parity.json and model.json beside it, if they "
            "exist (never through a symbolic link).")] = False,
        batches: Annotated[int, typer.Option(
            "--batches", min=0, metavar="N", help="Validation batches to check, besides one of a batch size "
            "(and for sort a length) not seen at export.")] = 3,
        atol: Annotated[float | None, typer.Option(
            "--atol", min=0, metavar="X", help="Absolute tolerance (default per dtype: 1e-4 for float32).")] = None,
        rtol: Annotated[float | None, typer.Option(
            "--rtol", min=0, metavar="X", help="Relative tolerance (default per dtype: 1e-3 for float32).")] = None,
        with_preprocess: Annotated[bool, typer.Option(
            "--with-preprocess", help="Export the task's preprocess and the model as one graph "
            "whose input is the raw sample (e.g. a uint8 image): the default when the task "
            "declares a preprocess.")] = False,
        no_preprocess: Annotated[bool, typer.Option(
            "--no-preprocess", help="Export the model alone: its input is the preprocessed "
            "tensor.")] = False,
        static: Annotated[bool, typer.Option(
            "--static", help="Fix every input dimension: the batch at the example's size, a "
            "dimension with a max (sort's length) at its max; smaller inputs are fed padded. "
            "The sizes go to model.json.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print parity.json instead of the table.")] = False,
        root: RootOption = DEFAULT_ROOT,
    ) -> None:
        """Export a run's model and check it computes what PyTorch computes.

        Rebuilds the model through the run's task with its config, loads the checkpoint,
        exports it (with the task's preprocess in front, when it declares one) with example
        inputs from the validation data (the batch axis dynamic; for sort also the length;
        --static fixes them), then runs the exported model and PyTorch on validation
        batches (raw ones with the preprocess) and compares every output, and the task's
        metrics on the whole validation set. Writes parity.json and model.json beside the
        model; `gridrun predict` serves the folder. With -o, existing files are replaced only
        with --force, and whole or not at all. Exit 0 when within tolerance, 1 when not (the
        files are kept, marked), 2 when the run cannot be exported or written.
        """
        if with_preprocess and no_preprocess:
            fail("--with-preprocess and --no-preprocess contradict each other: give one")
        with working("importing torch", quiet=as_json) as status:
            from gridrun.deploy.model import DeployError, export_model, load_run
            from gridrun.deploy.parity import table

            def said(line: str) -> None:  # export_model says one line, before exporting
                say(line)
                status.update(f"exporting to {fmt.value}, then checking parity")

            try:
                loaded = load_run(run, root)
                status.update(f"building the model of run {loaded.id}")
                report = export_model(loaded, checkpoint=checkpoint.value, fmt=fmt.value,
                                      out=output, force=force, batches=batches, atol=atol, rtol=rtol,
                                      preprocess=True if with_preprocess else False if no_preprocess
                                      else None, static=static, log=said)
            except DeployError as e:
                fail(str(e))
        folder = (output.parent if output else loaded.folder / "export" / checkpoint.value)
        if as_json:
            typer.echo(json.dumps(report, indent=1, default=str))
        else:
            typer.echo(table(report))
            typer.echo(f"wrote {folder / report['model']}, parity.json, model.json")
        raise typer.Exit(0 if report["ok"] else 1)
