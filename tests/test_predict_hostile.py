"""`gridrun predict` on hostile inputs and a tampered model.json (issue 36): every file it
reads goes through userfiles (a FIFO, a folder or a device is named, never hangs), with a
size bound; model.json's fields are checked on load and its `model` entry may only name a
file inside its own folder; NaN, infinities and values outside the declared range are
refused; `--json` is strict JSON. Each case ends in a result or in one line (exit 2),
never a traceback or a hang."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from patience import run as run_patiently
from test_deploy import invoke, make_run

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

LOW, HIGH = -4.0, 4.0  # deploy_tasks:sqrt_head's declared input range


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """One small ONNX export: input 'x' float32 [batch, 2] in -4..4, three classes; a
    negative value gives NaN logits."""
    root = tmp_path_factory.mktemp("root")
    folder = make_run(root, "deploy_tasks:sqrt_head", "sq", {})
    out = root / "export"
    result = invoke("export-model", str(folder), "-o", str(out / "model.onnx"), "--batches", "1")
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def card(export) -> dict:
    return json.loads((export / "model.json").read_text())


@pytest.fixture(scope="module")
def good(export) -> Path:
    path = export.parent / "good.json"
    path.write_text("[[1.0, 0.5], [0.25, 2.0]]")
    return path


def strict(text: str):
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def refused(result, *words: str) -> str:
    """The command ended in exactly one stderr line (exit 2) holding each of `words`."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def help_text() -> str:
    """`predict --help` as one line of words (the panels' borders and wrapping taken out)."""
    return " ".join(invoke("predict", "--help").output.replace("│", " ").split())


def with_card(export: Path, where: Path, card: dict | str) -> Path:
    """A copy of the export folder at `where` with model.json replaced."""
    where.mkdir(parents=True, exist_ok=True)
    if not (where / "model.onnx").exists():
        shutil.copy(export / "model.onnx", where / "model.onnx")
    (where / "model.json").write_text(card if isinstance(card, str) else json.dumps(card))
    return where


# ---- 1, 2: size and nesting of a JSON input ------------------------------------------------


def test_a_json_input_over_the_limit_is_refused_before_parsing(export, tmp_path, monkeypatch):
    from gridrun.deploy import predict

    big = tmp_path / "big.json"
    with big.open("w") as f:  # 17 MB of valid JSON
        f.write("[[1.0, " + " " * 17_000_000 + "0.5]]")
    monkeypatch.setattr(predict, "_json", lambda *a, **k: pytest.fail("parsed"))
    line = refused(invoke("predict", str(export), str(big)), "big.json", "16", "MB", ".npy")
    assert "17.0 MB" in line
    assert "16 MB" in help_text()  # the limit is documented


def test_a_deeply_nested_json_input_is_one_line(export, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    refused(invoke("predict", str(export), str(deep)), "deep.json", "nested")
    deep.write_text('{"x": ' + "[" * 200 + "]" * 200 + "}")  # parsed, but no array numpy takes
    refused(invoke("predict", str(export), str(deep)), "deep.json")


def test_an_npz_that_expands_past_the_limit_is_refused(export, tmp_path, monkeypatch):
    from gridrun.deploy import predict

    np.savez_compressed(tmp_path / "bomb.npz", x=np.zeros((50_000, 2), np.float32))
    monkeypatch.setattr(predict, "ARRAY_LIMIT", 100_000)
    refused(invoke("predict", str(export), str(tmp_path / "bomb.npz")), "bomb.npz", "uncompressed")


# ---- 7: memory in proportion to the input (issue 45, finding 9) ---------------------------
# A 15.9 MB JSON input (under the 16 MB cap) took 5.7 GB and 30 s: Python lists of floats,
# then a Python object for every sample's result. Its peak memory is measured in a process
# of its own, against the same command on a tiny input (the runtime's own memory).

PEAK = """
import resource, subprocess, sys
with open(sys.argv[1], "wb") as out:  # the results go to a file, never into this process
    code = subprocess.run([sys.executable, "-m", "gridrun", "predict", *sys.argv[2:]],
                          stdout=out, stderr=subprocess.PIPE).returncode
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)  # KiB on Linux
"""
PER_BYTE = 20  # the bound: this many bytes of memory for a byte of input, beyond the baseline


def peak(out: Path, *args: str) -> tuple[int, int]:
    """(exit code, peak resident bytes) of `gridrun predict ARGS` run by a fresh parent: its
    RUSAGE_CHILDREN is that one child's."""
    done = run_patiently([sys.executable, "-c", PEAK, str(out), *args], timeout=900,
                         capture_output=True, text=True)
    code, kib = done.stdout.split()
    return int(code), int(kib) * 1024


def repeated(path: Path, head: str, unit: str, last: str, tail: str, size: int) -> Path:
    """`head` + `unit` as often as fits + `last` + `tail`: a file of about `size` bytes."""
    count = (size - len(head) - len(last) - len(tail)) // len(unit)
    with path.open("w") as f:
        f.write(head + unit * count + last + tail)
    return path


HUGE = {  # name: (head, unit, last, tail, size, exit code, options)
    # the finding's: 2.65 million samples, all valid, each a Python list and its results
    # Python objects (its text is 350 MB, written as it is made)
    "samples": ("[", "[0,0],", "[0,0]", "]", 15_900_000, 0, []),
    "samples --json": ("[", "[0,0],", "[0,0]", "]", 4_000_000, 0, ["--json"]),
    "floats": ("[", "[1.5,-0.25],", "[1.5,-0.25]", "]", 4_000_000, 0, []),
    "keyed": ('{"x": [', "[3,1],", "[3,1]", "]}", 4_000_000, 0, ["--json"]),
    "empty lists": ("[", "[],", "[]", "]", 15_900_000, 2, []),
    # numpy pads every string to the longest: 1,000 characters times 500,000 strings
    "strings": ('["' + "a" * 1000 + '"', ',""', ',""', "]", 1_500_000, 2, []),
}


@pytest.mark.parametrize("name", sorted(HUGE))
def test_a_json_input_takes_memory_in_proportion_to_its_size(export, tmp_path, name):
    head, unit, last, tail, size, expected, options = HUGE[name]
    tiny = tmp_path / "tiny.json"
    tiny.write_text("[[1.5, 0.5]]")
    code, baseline = peak(tmp_path / "tiny.out", str(export), str(tiny), *options)
    assert code == 0
    path = repeated(tmp_path / "huge.json", head, unit, last, tail, size)
    out = tmp_path / "huge.out"
    code, used = peak(out, str(export), str(path), *options)
    with out.open("rb") as f:  # what it wrote, to the end (a result) or one line (a refusal)
        f.seek(max(0, out.stat().st_size - 300))
        end = f.read().decode()
    assert code == expected, end
    if expected == 0:
        samples = (size - len(head) - len(last) - len(tail)) // len(unit) + 1
        assert (f"sample {samples - 1}\n" if not options else '"p": ') in end, end
    grown = used - baseline
    assert grown < PER_BYTE * size, (
        f"{name}: {grown / 1e6:.0f} MB beyond the {baseline / 1e6:.0f} MB baseline for "
        f"{size / 1e6:.1f} MB of JSON, more than {PER_BYTE} x")
    out.unlink()  # the 350 MB of text


# ---- 3: a tampered model.json --------------------------------------------------------------

TAMPERED = [
    (("inputs", 0, "dtype"), 5, "one of"),
    (("inputs", 0, "dtype"), "float128", "one of"),
    (("inputs", 0, "range"), "wide", "pair of finite numbers"),
    (("inputs", 0, "range"), [0], "pair of finite numbers"),
    (("inputs", 0, "range"), [0, "1"], "pair of finite numbers"),
    (("inputs", 0, "range"), [float("nan"), 1], "pair of finite numbers"),
    (("inputs", 0, "range"), [2, 1], "low <= high"),
    (("inputs", 0, "range"), [True, 1], "pair of finite numbers"),
    (("inputs", 0, "range"), [-(10**400), 1], "pair of finite numbers"),
    (("inputs", 0, "shape"), "batch,2", "list"),
    (("inputs", 0, "shape"), ["batch", 1.5], "a size"),
    (("inputs", 0, "shape"), ["batch", None], "a size"),
    (("inputs", 0, "shape"), ["batch", 10**40], "a size"),
    (("inputs", 0, "name"), ["x"], "name"),
    (("inputs", 0, "dims"), {"7": "batch"}, "axis"),
    (("inputs",), [], "list"),
    (("inputs",), {"x": 1}, "list"),
    (("inputs", 0), 5, "object"),
    (("outputs", 0, "class_names"), [1, 2, 3], "strings"),
    (("outputs",), None, "list"),
    (("static",), "yes", "static"),
    (("static",), True, "static"),
    (("static",), {"batch": "big"}, "static"),
    (("static",), {"batch": -1}, "static"),
    (("dynamic_dims",), [], "object"),
    (("dynamic_dims", "batch", "max"), "x", "whole number"),
    (("preprocess",), "yes", "object"),
    (("preprocess",), {"included": "no"}, "true or false"),
    (("format",), "tflite", "onnx"),
    (("format",), ["onnx"], "onnx"),
    (("model",), 5, "file name"),
]


def tamper(card: dict, where: tuple, value) -> dict:
    card = json.loads(json.dumps(card))
    if not where:
        return value
    holder = card
    for key in where[:-1]:
        holder = holder[key]
    holder[where[-1]] = value
    return card


@pytest.mark.parametrize(("where", "value", "word"), TAMPERED,
                         ids=[f"{'.'.join(map(str, w))}={v!r}"[:40] for w, v, _ in TAMPERED])
def test_a_tampered_model_json_names_the_file_the_field_and_what_was_expected(
        export, card, good, tmp_path, where, value, word):
    folder = with_card(export, tmp_path / "copy", tamper(card, where, value))
    line = refused(invoke("predict", str(folder), str(good)), str(folder / "model.json"), word,
                   "expected")
    field = ".".join(str(k) for k in where if not isinstance(k, int))
    assert field.split(".")[-1] in line, line


def test_a_model_json_that_is_not_an_object_nor_json_is_one_line(export, good, tmp_path):
    for i, text in enumerate(["[]", "{", "[" * 50_000 + "]" * 50_000, '{"a": 1' + "0" * 5000 + "}",
                              "\xff\xfe"]):
        folder = with_card(export, tmp_path / f"c{i}", text)
        refused(invoke("predict", str(folder), str(good)), "model.json")


# ---- 4: non-finite and out-of-range values; strict --json ----------------------------------


@pytest.mark.parametrize(("text", "word"), [
    ("[[NaN, 1.0]]", "non-finite"), ("[[1e999, 1.0]]", "non-finite"),
    ("[[-Infinity, 1.0]]", "non-finite"), ("[[100.0, 1.0]]", "outside"),
    ("[[1e300, 1.0]]", "outside"), ("[[1.0, -4.5]]", "outside")])
def test_non_finite_and_out_of_range_json_inputs_are_refused(export, tmp_path, text, word):
    (tmp_path / "x.json").write_text(text)
    line = refused(invoke("predict", str(export), str(tmp_path / "x.json"), "--json"), word)
    if word == "outside":
        assert "values -4..4" in line


def test_non_finite_and_out_of_range_npy_inputs_are_refused(export, tmp_path):
    for name, value, word in (("nan", [[np.nan, 1]], "non-finite"), ("inf", [[1, np.inf]], "non-finite"),
                              ("far", [[1, 5]], "outside")):
        np.save(tmp_path / f"{name}.npy", np.array(value, np.float32))
        refused(invoke("predict", str(export), str(tmp_path / f"{name}.npy")), word)
    np.save(tmp_path / "edge.npy", np.array([[LOW, HIGH]], np.float32))  # the bounds are inside
    assert invoke("predict", str(export), str(tmp_path / "edge.npy")).exit_code == 0


def test_non_finite_outputs_are_written_as_null_in_strict_json(export, tmp_path):
    (tmp_path / "neg.json").write_text("[[1.0, 1.0], [-1.0, 1.0]]")  # sqrt(-1): NaN logits
    result = invoke("predict", str(export), str(tmp_path / "neg.json"), "--json")
    assert result.exit_code == 0, result.output
    (found,) = strict(result.stdout)
    first, second = found["outputs"]["output"]
    assert all(isinstance(v, float) for v in first) and second == [None, None, None]
    assert all(row["score"] is None and row["p"] is None for row in found["top"]["output"][1])
    assert any("null" in note and "output" in note for note in found["notes"]), found
    text = invoke("predict", str(export), str(tmp_path / "neg.json"))
    assert text.exit_code == 0 and "non-finite" in text.output


def test_the_help_says_what_is_refused():
    text = help_text()
    assert "NaN" in text and "outside the range" in text and "null" in text


# ---- 5: what a non-regular file is ---------------------------------------------------------


def test_a_fifo_a_folder_or_a_device_is_named_not_missing(export, card, good, tmp_path):
    os.mkfifo(tmp_path / "pipe.json")
    (tmp_path / "dir.npy").mkdir()
    for path, word in ((tmp_path / "pipe.json", "FIFO"), (tmp_path / "dir.npy", "a folder"),
                       (Path("/dev/null"), "character device")):
        line = refused(invoke("predict", str(export), str(path)), str(path), word)
        assert "no such file" not in line
    refused(invoke("predict", str(tmp_path / "pipe.json"), str(good)), "FIFO")
    folder = with_card(export, tmp_path / "copy", card)
    (folder / "model.json").unlink()
    os.mkfifo(folder / "model.json")
    refused(invoke("predict", str(folder), str(good)), "model.json", "FIFO")
    (folder / "model.json").unlink()
    (folder / "model.json").write_text(json.dumps(tamper(card, ("model",), "m.onnx")))
    os.mkfifo(folder / "m.onnx")
    refused(invoke("predict", str(folder), str(good)), "m.onnx", "FIFO")


def test_an_image_over_the_pixel_limit_is_refused_before_decoding(export, card, tmp_path, monkeypatch):
    from gridrun.deploy import predict

    image = pytest.importorskip("PIL.Image")
    monkeypatch.setattr(predict, "IMAGE_PIXELS", 1000)
    spec = {"name": "x", "shape": ["batch", 4, 4, 1], "dtype": "uint8", "dims": {"0": "batch"},
            "layout": "HWC"}
    folder = with_card(export, tmp_path / "img", tamper(card, ("inputs",), [spec]))
    image.new("L", (100, 100)).save(tmp_path / "huge.png")
    refused(invoke("predict", str(folder), str(tmp_path / "huge.png")), "huge.png", "pixels")


# ---- 6: the model file model.json names ----------------------------------------------------


def test_the_model_entry_may_only_name_a_file_inside_its_folder(export, card, good, tmp_path):
    folder = with_card(export, tmp_path / "copy", card)
    shutil.copy(export / "model.onnx", tmp_path / "outside.onnx")  # a real model: it would load
    (folder / "sub").mkdir()
    (folder / "link.onnx").symlink_to(tmp_path / "outside.onnx")
    for name, word in (("../outside.onnx", "inside"), (str(tmp_path / "outside.onnx"), "inside"),
                       ("link.onnx", "inside"), ("sub/../../outside.onnx", "inside"),
                       ("sub", "a folder"), (".", "inside"), ("", "file name"),
                       ("a\x00b", "file name")):
        with_card(export, folder, tamper(card, ("model",), name))
        refused(invoke("predict", str(folder), str(good)), "model", word)
    (folder / "sub" / "m.onnx").symlink_to(folder / "model.onnx")  # a link inside stays inside
    with_card(export, folder, tamper(card, ("model",), "sub/m.onnx"))
    assert invoke("predict", str(folder), str(good)).exit_code == 0


def test_model_json_over_its_limit_is_refused(export, card, good, tmp_path):
    big = tamper(card, ("note",), "x" * 5_000_000)
    refused(invoke("predict", str(with_card(export, tmp_path / "c", big)), str(good)), "model.json",
            "MB")


# ---- fuzz: random hostile model.json values and input JSON ---------------------------------


class Raw(str):
    """JSON text put in as it is (json.dumps cannot write it)."""


RAW = st.sampled_from([Raw("NaN"), Raw("-Infinity"), Raw("1e999"), Raw("1" + "0" * 5000),
                       Raw("[" * 5000 + "]" * 5000), Raw("[" * 150 + "1" + "]" * 150)])
WORDS = st.sampled_from(["..", "../model.onnx", "/etc/passwd", "/dev/zero", "model.json", ".", "",
                         "onnx", "pt2", "torchscript", "float32", "uint8", "bool", "batch", "x",
                         "HWC", "float128", "bfloat16", "output", "a\x00b", "0", "min", "max"])
SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats()
           | st.sampled_from([0, 1, 2, -1, 10**12, 10**400, 1e308, -1e308]) | st.text(max_size=12) | WORDS)
HOSTILE = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=6) | WORDS, inner, max_size=4),
                       max_leaves=12) | RAW

CARD_PATHS = [(), ("format",), ("model",), ("inputs",), ("inputs", 0), ("inputs", 0, "name"),
              ("inputs", 0, "shape"), ("inputs", 0, "shape", 0), ("inputs", 0, "shape", 1),
              ("inputs", 0, "dtype"), ("inputs", 0, "dims"), ("inputs", 0, "dims", "0"),
              ("inputs", 0, "range"), ("inputs", 0, "range", 0), ("inputs", 0, "range", 1),
              ("inputs", 0, "layout"), ("outputs",), ("outputs", 0), ("outputs", 0, "shape"),
              ("outputs", 0, "dims"), ("outputs", 0, "class_names"), ("outputs", 0, "range"),
              ("outputs", 0, "dtype"), ("static",), ("dynamic_dims",), ("dynamic_dims", "batch"),
              ("dynamic_dims", "batch", "max"), ("dynamic_dims", "batch", "min"), ("preprocess",),
              ("padding",), ("note",)]


def dumps(value) -> str:
    """JSON text for a value holding Raw pieces and NaN (as the tampering hand would write)."""
    pieces: list[str] = []

    def mark(v):
        if isinstance(v, Raw):
            pieces.append(str(v))
            return f"@@raw{len(pieces) - 1}@@"
        if isinstance(v, list):
            return [mark(x) for x in v]
        if isinstance(v, dict):
            return {k: mark(x) for k, x in v.items()}
        return v

    text = json.dumps(mark(value))
    for i, piece in enumerate(pieces):
        text = text.replace(f'"@@raw{i}@@"', piece)
    return text


@contextlib.contextmanager
def no_hang(seconds: int = 30):
    def stop(*_):
        raise TimeoutError(f"predict hung for {seconds} s")

    before = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def outcome(result) -> list | None:
    """The strict-JSON result of a run that succeeded, None for a one-line refusal; anything
    else fails the test."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    if result.exit_code == 0:
        event("a result")
        return strict(result.stdout)
    event("refused: " + " ".join(refused(result).split()[1:4]))
    return None


def inside(name) -> bool:
    return (isinstance(name, str) and not name.startswith("/") and ".." not in name.split("/")
            and os.path.normpath(name) == "model.onnx")


@settings(max_examples=50, deadline=None, derandomize=True)
@given(where=st.sampled_from(CARD_PATHS), value=HOSTILE)
def test_fuzz_a_tampered_model_json_ends_in_a_result_or_one_line(export, card, good, where, value):
    folder = export.parent / "fuzz-card"
    if not (export.parent / "model.onnx").exists():  # a real model one level up: '..' would load
        shutil.copy(export / "model.onnx", export.parent / "model.onnx")
    try:
        tampered = tamper(card, where, value)
    except (KeyError, IndexError, TypeError):
        return  # a path this export's model.json does not have
    with_card(export, folder, dumps(tampered))
    with no_hang():
        found = outcome(invoke("predict", str(folder), str(good), "--json"))
    if found is not None:
        assert inside(tampered["model"]), tampered["model"]
        assert len(found) == 1 and set(found[0]["outputs"]) == {o["name"] for o in tampered["outputs"]}


def numbers(low=-6.0, high=6.0):
    return st.floats(low, high) | st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1e39, 0.0])


ARRAYS = (st.lists(st.lists(numbers(), min_size=2, max_size=2), min_size=1, max_size=4)
          | st.lists(numbers(), min_size=2, max_size=2))
def shaped(array) -> bool:
    """A sample (two floats) or a batch of them."""
    def point(v):
        return isinstance(v, list) and len(v) == 2 and all(type(x) is float for x in v)

    return point(array) or (isinstance(array, list) and bool(array) and all(map(point, array)))


INPUTS = ARRAYS | ARRAYS.map(lambda a: {"x": a}) | HOSTILE | st.dictionaries(WORDS, HOSTILE, max_size=3)


@settings(max_examples=50, deadline=None, derandomize=True)
@given(value=INPUTS)
def test_fuzz_a_hostile_json_input_ends_in_a_result_or_one_line(export, value):
    import onnxruntime

    path = export.parent / "fuzz-input.json"
    path.write_text(dumps(value))
    with no_hang():
        found = outcome(invoke("predict", str(export), str(path), "--json"))
    array = value.get("x") if isinstance(value, dict) and list(value) == ["x"] else value
    if shaped(array) and all(math.isfinite(v) and LOW <= v <= HIGH for v in np.ravel(array)):
        assert found is not None, value
    if found is None:
        return
    x = np.atleast_2d(np.asarray(array, np.float32))
    assert np.isfinite(x).all() and x.min() >= LOW and x.max() <= HIGH, value
    session = onnxruntime.InferenceSession(str(export / "model.onnx"), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    got = np.array([[math.nan if v is None else v for v in row] for row in found[0]["outputs"]["output"]])
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
