"""predict's JSON reader (deploy/jsoninput.py) reads what json.loads and numpy.asarray read,
the same values in the same dtype and shape, and refuses in one line what they refuse or
could not make one array of; without a Python object per number (issue 45, finding 9)."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridrun.deploy.jsoninput import JsonInputError, Numbers, read

AXES = {"x": 4, "y": 3}


def reference(text: str):
    """What json.loads and numpy.asarray make of `text` (one input's value): an array of
    bool, int64 or float64, or None where either refuses or gives no such array."""
    try:
        value = json.loads(text)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            array = np.asarray(value)
    except (ValueError, RecursionError):
        return None
    if array.dtype.kind not in "bif" or array.ndim > AXES["x"]:
        return None
    return array


def mine(text: str):
    try:
        found = read(text.encode(), AXES)
    except JsonInputError as e:
        assert "\n" not in str(e)
        return None
    assert isinstance(found, Numbers)
    return found.array


def assert_same(text: str) -> None:
    want, got = reference(text), mine(text)
    if want is None or got is None:
        assert want is None and got is None, (text, want, got)
        return
    assert (got.dtype, got.shape) == (want.dtype, want.shape), text
    assert np.array_equal(got, want, equal_nan=got.dtype.kind == "f"), text


NUMBERS = (st.integers(-(2**62), 2**62).map(str)
           | st.floats(allow_nan=False, allow_infinity=False).map(repr)
           | st.sampled_from(["true", "false", "NaN", "Infinity", "-Infinity", "1e999", "-0",
                              "0.5", "1E5", "2e-3", "1e+2", "-0.0", "10"]))
WRONG = st.sampled_from(["+1", ".5", "1.", "01", "-01", "-", "1e", "1.2.3", "0x1", "nan", "inf",
                         "tru", "null", '"1"', "1 2", "Infinityx", "truefalse", "--1", "{}", ""])
SPACE = st.sampled_from(["", " ", "\n", "\t ", "\r\n"])


@st.composite
def arrays(draw, wrong: bool):
    """JSON text of a rectangular array (or a scalar), sometimes one value wrong, one
    array of another length or depth, or whitespace anywhere a token ends."""
    shape = draw(st.lists(st.integers(0, 3), max_size=4))
    bad_at = draw(st.integers(0, 40)) if wrong else -1
    count = [0]

    def value(dims):
        count[0] += 1
        if not dims:
            return draw(WRONG) if count[0] == bad_at else draw(NUMBERS)
        n = dims[0] + (1 if count[0] == bad_at + 1 and wrong else 0)
        deeper = dims[1:] if count[0] != bad_at + 2 else dims[2:]
        sep = "," + draw(SPACE)
        return "[" + draw(SPACE) + sep.join(value(deeper) for _ in range(n)) + draw(SPACE) + "]"

    return draw(SPACE) + value(shape) + draw(SPACE)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(text=arrays(wrong=False) | arrays(wrong=True))
def test_it_reads_what_json_and_numpy_read(text):
    assert_same(text)


@pytest.mark.parametrize("text", [
    "1", "-1.5", "true", "[true, false]", "[1, true]", "[1.5, true]", "[]", "[[], []]",
    "[[1, 2], [3, 4]]", "[[[1e-5]], [[2E+3]]]", "[NaN, -Infinity, 1e999]", " [ 1 ,\n2 ] ",
    "[1, 2,]", "[,1]", "[1 2]", "[[1], [2, 3]]", "[[1], 2]", "[[1, 2], [3]]", "[1]]", "[[1]",
    "[1, [2]]", "[1, null]", '[1, "2"]', "[1, {}]", "01", "[1.]", "[-]", "[+1]", "[.5]",
    "[9223372036854775806]", "[-9223372036854775807]", "[1e308, -1e308]",
])
def test_each_form_agrees_with_json_and_numpy(text):
    assert_same(text)


def test_an_object_gives_each_named_array_up_to_a_name_the_model_does_not_take():
    found = read(b'{"x": [[1, 2]], "y" : [true],\n "a\\"b": [[[[[[[1]]]]]]], "z": "?"}', AXES)
    assert list(found) == ["x", "y", 'a"b']  # predict names a"b as what the model does not take
    assert found["x"].array.tolist() == [[1, 2]] and found["y"].array.dtype == bool
    assert found['a"b'] is None  # not read
    with pytest.raises(JsonInputError, match="for 'x': a string at byte 6"):
        read(b'{"x": "abc"}', AXES)
    with pytest.raises(JsonInputError, match="for 'x': a string at byte 10"):
        read(b'{"x": [1, "2"]}', AXES)
    for text in ('{"x": [1], }', '{"x" [1]}', '{"x": [1] "y": [2]}', '{"x": [1]} 5', '{"x": }',
                 '{x: [1]}', '{"x": [1]'):
        with pytest.raises(JsonInputError, match="not JSON"):
            read(text.encode(), AXES)
    assert read(b" {} ", AXES) == {}


def test_nesting_past_the_inputs_axes_is_refused_before_anything_is_read():
    with pytest.raises(JsonInputError, match="nested 100,000 deep, but the input has 4 axes"):
        read(b"[" * 100_000 + b"]" * 100_000, AXES)
    with pytest.raises(JsonInputError, match=r"for 'y'.* but the input has 3 axes"):
        read(b'{"y": [[[[1]]]]}', AXES)


def test_utf16_and_a_byte_order_mark_are_read_as_json_loads_reads_them():
    for data in ("[[1, 2]]".encode("utf-16"), b"\xef\xbb\xbf[[1, 2]]", "[[1, 2]]".encode("utf-32")):
        assert read(data, AXES).array.tolist() == [[1, 2]]
    with pytest.raises(JsonInputError):
        read(b"[1, \xff]", AXES)


def test_its_memory_is_a_few_bytes_per_byte_of_text():
    """The arrays it makes, none per number: traced by tracemalloc (NumPy reports its
    buffers to it), not the process's resident size."""
    import tracemalloc

    text = ("[" + "[0,1]," * 200_000 + "[0,1]]").encode()
    tracemalloc.start()
    try:
        found = read(text, AXES)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found.array.shape == (200_001, 2)
    assert peak < 12 * len(text), peak / len(text)
    assert math.prod(found.array.shape) * 8 <= 12 * len(text)
