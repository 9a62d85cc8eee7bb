"""`gridrun predict EXPORT_DIR INPUT...`: run an exported model on files, from its folder alone."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gridrun.commands.common import fail


def register(app: typer.Typer) -> None:
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
        from gridrun.deploy.results import json_text, lines, result

        found = []
        try:
            served = Served(export_dir)
            for path in inputs:
                feed = read(path, served)
                found.append(result(path, feed, served.run(feed), served, top))
        except PredictError as e:
            fail(str(e))
        if as_json:
            typer.echo(json_text(found))
        else:
            for item in found:
                typer.echo("\n".join(lines(item, served)))
