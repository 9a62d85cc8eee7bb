"""Shipping the preprocessing with the weights (issue 27): `export-model` exports the task's
preprocess and the model as one graph taking the raw sample, `--static` fixes every
dimension, parity starts from raw validation data and its metrics are exactly the
run's; `gridrun predict` serves the folder from model.json alone, importing no task or
training code, and refuses a wrong input with what was expected."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import patience
import pytest
import torch
from test_deploy import TINY, invoke, make_run

import gridrun
from gridrun.checks.verify import same

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
Image = pytest.importorskip("PIL.Image")

TASKS = ["spirals", "shapes", "sort"]
RUNS = {**{t: TINY[t] for t in TASKS}, "deploy_tasks:unexportable": {}}
MODES = {"with-preprocess": ["--with-preprocess"], "static": ["--static"]}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("root")
    for i, (task, args) in enumerate(RUNS.items()):
        make_run(root, task, f"p{i}{task.split(':')[-1]}", args)
    return root


def folder_of(root: Path, task: str) -> Path:
    return next((root / "deploy").glob(f"*{task.split(':')[-1]}"))


@pytest.fixture(scope="module")
def exports(root, tmp_path_factory) -> dict[tuple[str, str], tuple[Path, str]]:
    """(task, mode) -> (export folder, export-model's output), each exported once to ONNX."""
    found = {}
    for task in TASKS:
        for mode, flags in MODES.items():
            out = tmp_path_factory.mktemp(f"{task}-{mode}")
            result = invoke("export-model", str(folder_of(root, task)), "-o", str(out / "model.onnx"),
                            "--batches", "2", *flags)
            found[task, mode] = out, result.output
            assert result.exit_code == 0, result.output
    return found


# ---- parity from raw data, with and without --static ---------------------------------------


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("task", TASKS)
def test_parity_passes_with_preprocess_and_static(root, exports, task, mode):
    out, output = exports[task, mode]
    report = json.loads((out / "parity.json").read_text())
    card = json.loads((out / "model.json").read_text())
    assert report["ok"] and "parity ok" in output, output
    assert all(o["max_abs"] <= o["atol"] for o in report["outputs"].values())
    # the metric table is the validation set, exactly the run's record (issue 23, item 4)
    recorded = json.loads((folder_of(root, task) / "summary.json").read_text())["best"]
    assert report["metrics"]["recorded"] == recorded == card["metrics"]
    assert all(same(report["metrics"]["pytorch"][k], v) for k, v in recorded.items()), report["metrics"]
    for k, v in recorded.items():
        assert report["metrics"]["onnx"][k] == pytest.approx(v, rel=1e-4, abs=1e-6)
    assert report["metrics_samples"] == RUNS[task]["val_size"]
    assert report["batches"][-1]["batch"] == "unseen shape"
    assert "not part of the metrics" in output and "the validation set" in output
    assert report["preprocess"] is (task == "shapes")  # the default when the task declares one
    if task == "shapes":
        assert card["inputs"][0]["name"] == "raw" and card["inputs"][0]["dtype"] == "uint8"
        assert card["inputs"][0]["layout"] == "HWC" and card["inputs"][0]["range"] == [0, 255]
        assert card["preprocess"]["included"] and card["preprocess"]["module"] == "ToModelInput"
        assert card["preprocess"]["model_inputs"][0]["dtype"] == "float32"
        assert card["outputs"][0]["class_names"] == ["square", "disc", "cross", "triangle"]
    elif mode == "with-preprocess":
        assert "declares no preprocess: --with-preprocess changes nothing" in output
        assert card["preprocess"] is None
    if mode == "static":
        val_batch = min(RUNS[task]["val_size"], 256)
        expected = {"batch": val_batch, **({"length": 12} if task == "sort" else {})}
        assert report["static"] == card["static"] == expected
        assert card["dynamic_dims"] == {} and "padded" in card["padding"]
        assert all(isinstance(s, int) for i in card["inputs"] for s in i["shape"])
        assert "static: every input fed padded to" in output
    else:
        assert card["static"] is None and card["inputs"][0]["shape"][0] == "batch"


def test_sort_static_length_is_max_len_and_shorter_sequences_are_padded(exports):
    out, _ = exports["sort", "static"]
    card = json.loads((out / "model.json").read_text())
    assert [i["shape"] for i in card["inputs"]] == [[64, 12], [64, 12]]
    assert card["outputs"][0]["dims"] == {"0": "batch", "1": "length"}
    report = json.loads((out / "parity.json").read_text())
    unseen = report["batches"][-1]["inputs"]["x"]
    assert unseen[0] == 3 and unseen[1] < 12 and report["batches"][-1]["max_abs"] < 1e-4


# ---- model.json alone ----------------------------------------------------------------------


def example_from_card(card: dict, batch: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs built from model.json's description only: shapes (a named dimension at its max,
    the batch at `batch` unless static), dtypes and value ranges."""
    rng = np.random.default_rng(seed)
    ranges = card["dynamic_dims"]
    feed = {}
    for spec in card["inputs"]:
        shape = []
        for size in spec["shape"]:
            if isinstance(size, int):
                shape.append(size)
            else:
                shape.append(batch if size == "batch" else ranges[size]["max"])
        dtype = np.dtype(spec["dtype"])
        low, high = spec.get("range", (0, 1))
        if dtype == np.bool_:
            feed[spec["name"]] = np.ones(shape, dtype)  # True: every position real
        elif dtype.kind in "iu":
            feed[spec["name"]] = rng.integers(max(low, 1), high, shape, endpoint=True).astype(dtype)
        else:
            feed[spec["name"]] = rng.uniform(low, high, shape).astype(dtype)
    return feed


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("task", TASKS)
def test_model_json_alone_is_enough_to_feed_the_exported_model(exports, task, mode):
    import onnxruntime

    out, _ = exports[task, mode]
    card = json.loads((out / "model.json").read_text())  # nothing else of the task
    feed = example_from_card(card)
    session = onnxruntime.InferenceSession(str(out / card["model"]), providers=["CPUExecutionProvider"])
    got = session.run(None, feed)
    sizes = {d: feed[i["name"]].shape[int(a)] for i in card["inputs"] for a, d in i["dims"].items()}
    for spec, array in zip(card["outputs"], got, strict=True):
        expected = [sizes.get(s, s) if isinstance(s, str) else s for s in spec["shape"]]
        assert list(array.shape) == expected and array.dtype == np.dtype(spec["dtype"])
        assert np.isfinite(array).all()
        if "class_names" in spec:
            assert array.shape[-1] == len(spec["class_names"])


# ---- gridrun predict ---------------------------------------------------------------------


def write_pngs(root: Path, folder: Path, count: int = 4) -> tuple[list[Path], list[int]]:
    """PNGs of the first validation samples of the shapes run (one of each class)."""
    run = gridrun.load_run(folder_of(root, "shapes"))
    paths, labels = [], []
    for i in range(count):
        raw, label = run.task.raw_val_data[i]
        assert raw.dtype == torch.uint8 and raw.shape[-1] == 1
        path = folder / f"val{i}.png"
        Image.fromarray(raw[:, :, 0].numpy()).save(path)
        paths.append(path)
        labels.append(int(label))
    return paths, labels


@pytest.mark.parametrize("how", ["onnx", "onnx-static", "pt2"])
def test_predict_on_a_png_gives_the_class_and_logits_of_the_pytorch_model(root, exports, how,
                                                                         tmp_path):
    if how == "pt2":
        out = tmp_path / "pt2"
        result = invoke("export-model", str(folder_of(root, "shapes")), "--format", "pt2",
                        "-o", str(out / "model.pt2"), "--batches", "1")
        assert result.exit_code == 0, result.output
    else:
        out = exports["shapes", "static" if how == "onnx-static" else "with-preprocess"][0]
    pngs, _ = write_pngs(root, tmp_path)
    result = invoke("predict", str(out), *map(str, pngs), "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    run = gridrun.load_run(folder_of(root, "shapes"))
    model = run.model()
    classes = ["square", "disc", "cross", "triangle"]
    for i, item in enumerate(found):
        assert item["fed"] == {"raw": ["uint8", [1, 16, 16, 1]]}
        with torch.inference_mode():
            expected = model(run.task.val_data[i][0][None])[0]  # the task's preprocessed tensor
        logits = torch.tensor(item["outputs"]["output"][0])
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-3)
        assert item["top"]["output"][0][0]["class"] == classes[int(expected.argmax())]
    text = invoke("predict", str(out), str(pngs[1]))
    assert text.exit_code == 0 and text.output.startswith(f"{pngs[1]}  (raw uint8 [1, 16, 16, 1])")
    assert len(text.output.splitlines()) == 4  # the input, then the top 3 classes


def test_predict_imports_no_task_and_no_training_code(root, exports, tmp_path):
    out = exports["shapes", "with-preprocess"][0]
    png = write_pngs(root, tmp_path, 1)[0][0]
    script = (
        "import json, sys\n"
        "from gridrun.cli import app\n"
        "code = None\n"
        f"try:\n    app(['predict', {str(out)!r}, {str(png)!r}])\n"
        "except SystemExit as e:\n    code = e.code\n"
        "print(json.dumps({'code': code, 'modules': sorted(sys.modules)}))\n")
    done = patience.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["code"] in (0, None), done.stdout + done.stderr
    assert "square" in done.stdout and "disc" in done.stdout
    mine = [m for m in found["modules"] if m == "gridrun" or m.startswith("gridrun.")]
    allowed = {"gridrun", "gridrun.cli", "gridrun.commands", "gridrun.deploy", "gridrun.deploy.predict",
               "gridrun.deploy.modeljson", "gridrun.deploy.jsoninput", "gridrun.deploy.results",
               "gridrun.userfiles",
               "gridrun.runs", "gridrun.runs.states"}  # run-state names, for `gridrun run`'s display
    assert all(m in allowed or m.startswith("gridrun.commands.") for m in mine), mine
    for banned in ("gridrun.tasks", "gridrun.train", "gridrun.spec", "gridrun.runs.store",
                   "deploy_tasks", "torch"):
        assert not any(m == banned or m.startswith(banned + ".") for m in found["modules"]), banned


def test_predict_refuses_a_wrong_input_in_one_line(exports, tmp_path):
    out = exports["shapes", "with-preprocess"][0]
    image = np.full((16, 16, 1), 64, np.uint8)
    cases = {
        "floats.npy": (image.astype(np.float32) / 255, ["float32 values", "'raw' uint8 [batch, 16, 16, 1]",
                                                        "layout HWC", "0..255 pixels, not 0-1 floats"]),
        "chw.npy": (image.transpose(2, 0, 1), ["shape [1, 1, 16, 16]", "layout HWC"]),
        "big.npy": (np.zeros((20, 20, 1), np.uint8), ["shape [1, 20, 20, 1]", "[batch, 16, 16, 1]"]),
        "names.json": ({"x": [1]}, ["gives 'x'", "the model takes 'raw' uint8"]),
        "floats.json": ([[[0.5]] * 16] * 16, ["float64 values", "'raw' uint8"]),
    }
    for name, (value, words) in cases.items():
        path = tmp_path / name
        if name.endswith(".npy"):
            np.save(path, value)
        else:
            path.write_text(json.dumps(value))
        result = invoke("predict", str(out), str(path))
        assert result.exit_code == 2, (name, result.output)
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
        for word in words:
            assert word in result.output, (name, word, result.output)
    sort_out = exports["sort", "static"][0]
    (tmp_path / "long.json").write_text(json.dumps({"x": [1] * 13, "mask": [True] * 13}))
    result = invoke("predict", str(sort_out), str(tmp_path / "long.json"))
    assert result.exit_code == 2 and "[64, 12]" in result.output and "static" in result.output
    result = invoke("predict", str(exports["spirals", "static"][0]), str(tmp_path / "val.png"))
    assert result.exit_code == 2 and "no such file" in result.output


def test_predict_without_pillow_says_how_to_read_an_image(root, exports, tmp_path, monkeypatch):
    png = write_pngs(root, tmp_path, 1)[0][0]
    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL now raises ImportError
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    result = invoke("predict", str(exports["shapes", "with-preprocess"][0]), str(png))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "reading val0.png needs Pillow: pip install pillow" in result.output
    assert "or give the image as a .npy" in result.output


def test_predict_pads_a_static_model_and_serves_sort_from_json(exports, tmp_path):
    seq = {"x": [5, 3, 9, 1, 2], "mask": [True] * 5}
    (tmp_path / "seq.json").write_text(json.dumps(seq))
    dynamic = json.loads(invoke("predict", str(exports["sort", "with-preprocess"][0]),
                                str(tmp_path / "seq.json"), "--json").output)
    static = json.loads(invoke("predict", str(exports["sort", "static"][0]),
                               str(tmp_path / "seq.json"), "--json").output)
    assert static[0]["fed"] == dynamic[0]["fed"] == {"x": ["int64", [1, 5]], "mask": ["bool", [1, 5]]}
    a, b = np.array(static[0]["outputs"]["output"]), np.array(dynamic[0]["outputs"]["output"])
    assert a.shape == b.shape == (1, 5, 16)
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-3)
    text = invoke("predict", str(exports["sort", "static"][0]), str(tmp_path / "seq.json")).output
    assert "argmax over its last axis" in text


def test_an_export_folder_missing_a_file_is_named(exports, tmp_path):
    result = invoke("predict", str(tmp_path), str(tmp_path / "x.npy"))
    assert result.exit_code == 2 and "has no model.json" in result.output
    out = exports["spirals", "with-preprocess"][0]
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "model.json").write_text((out / "model.json").read_text())
    np.save(tmp_path / "p.npy", np.zeros((1, 2), np.float32))
    result = invoke("predict", str(copy), str(tmp_path / "p.npy"))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "model.onnx is missing" in result.output and "model.json names it" in result.output


def test_no_preprocess_exports_the_model_alone(root, tmp_path):
    result = invoke("export-model", str(folder_of(root, "shapes")), "--no-preprocess", "--format",
                    "pt2", "-o", str(tmp_path / "model.pt2"), "--batches", "1")
    assert result.exit_code == 0, result.output
    card = json.loads((tmp_path / "model.json").read_text())
    assert card["inputs"][0]["dtype"] == "float32" and card["inputs"][0]["shape"] == ["batch", 1, 16, 16]
    assert card["preprocess"]["included"] is False
    png = write_pngs(root, tmp_path, 1)[0][0]
    refused = invoke("predict", str(tmp_path), str(png))
    assert refused.exit_code == 2 and "this export has no preprocess" in refused.output


def test_a_preprocess_that_cannot_be_exported_names_the_op_and_the_line(root, tmp_path):
    result = invoke("export-model", str(folder_of(root, "deploy_tasks:unexportable")),
                    "-o", str(tmp_path / "model.onnx"))
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert line.startswith("cannot export the task's preprocess to onnx: ")
    assert "deploy_tasks.py:" in line and "float(raw.max())" in line, line


def test_shapes_runs_of_the_8_bit_images_never_share_an_id_with_the_float_ones(tmp_path):
    # the data changed under the same keys (issue 27): the version is a task key, so in the id
    from gridrun.spec import load_runs

    file = tmp_path / "e.toml"
    file.write_text('[experiments.s]\ntask = "shapes"\n')
    (run,) = load_runs(file)
    assert run.task_args["data_version"] == 2
    from gridrun.spec.model import run_id

    without = {k: v for k, v in run.task_args.items() if k != "data_version"}
    assert run.id != run_id(run.experiment, run.task, run.trainer, without, run.seed)
    from gridrun.tasks.shapes import shapes

    with pytest.raises(ValueError, match="data_version 1 cannot be built"):
        shapes(data_version=1)
