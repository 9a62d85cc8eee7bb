"""`gridrun export-model RUN`: a deployable model, with proof that it computes the same;
`gridrun predict EXPORT_DIR INPUT...`: run it on files, from its folder alone."""

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
    register_export(app)
    register_predict(app)


def register_export(app: typer.Typer) -> None:
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


def register_predict(app: typer.Typer) -> None:
    @app.command("predict")
    def predict(
        export_dir: Annotated[Path, typer.Argument(
            metavar="EXPORT_DIR", help="The folder export-model wrote (model.json and the model file), or the model file.")],
        inputs: Annotated[list[Path], typer.Argument(
            metavar="INPUT...", help="Input files: an image (PNG, JPEG, ...; needs Pillow), a .npy (.npz for several "
            "inputs), or JSON (an array, or an object with one array per input name; at most 16 MB, "
            "a larger input as a .npy). A single sample or a batch.")],
        top: Annotated[int, typer.Option("--top", "-k", min=1, help="Classes shown per sample.")] = 3,
        as_json: Annotated[bool, typer.Option("--json", help="Print the outputs as strict JSON (a NaN or infinite output written as null, with a note).")] = False,
    ) -> None:
        """Run an exported model on input files, with nothing but its folder.

        Reads model.json (written by export-model; a field of the wrong type, or a model
        file outside the folder, is refused), checks each input against it (dtype, shape,
        layout: a wrong one is refused with what was expected; so are NaN, infinities and
        values outside the range model.json declares), runs the model file (onnxruntime for
        ONNX, the loaded program for pt2 and TorchScript) and prints the outputs: for a
        classifier, the top classes with their softmax probability; for a one-output binary
        model ([batch, 1]), the decision logit > 0 (probability > 0.5 when model.json gives
        the output the range 0..1). Imports no task or training code: proof that the folder
        is self-contained. Exit 2 on a missing file or a wrong input. Reads regular files
        only: JSON inputs up to 16 MB, .npy and .npz up to 1 GB, images up to 64 MB and 33
        million pixels.
        """
        from gridrun.deploy.predict import PredictError, Served, read
        from gridrun.deploy.results import result, write_json, write_lines

        found = []  # every input read and run before anything is written: a refusal writes nothing
        try:
            served = Served(export_dir)
            for path in inputs:
                feed = read(path, served)
                found.append(result(path, feed, served.run(feed), served, top))
        except PredictError as e:
            fail(str(e))

        def write(text: str) -> None:  # the results' text as it is made, never whole
            typer.echo(text, nl=False)

        if as_json:
            write_json(found, write)
        else:
            for item in found:
                write_lines(item, write)
