"""A JSON input read into NumPy arrays in memory in proportion to its bytes (issue 45).

json.loads makes a Python object of every number and every list: 25 to 40 bytes of memory
for each 2 to 6 bytes of text, so a 16 MB input took 400 MB before NumPy saw it (and
numpy.asarray then padded every string to the longest: gigabytes). Here NumPy alone reads
an input's array: its brackets and commas, with one mark for each number, are compared
with the one skeleton a rectangular array of that shape has, and its numbers are parsed by
NumPy's C reader (`np.fromstring` with a separator). A few bytes of memory per byte of
text, and the array itself: 8 bytes a number, each of which takes at least 2 bytes.

Read: a number, true or false (NaN, Infinity and -Infinity as json.loads reads them), or
arrays of them nested to the same depth everywhere, no deeper than the input's axes; or an
object of such values keyed by input name. Their dtype is JSON's: bool when every value is
true or false, int64 when every number is whole, else float64; the caller converts it to
the input's. NumPy only: predict imports no more.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass

import numpy as np

WHITESPACE = b" \t\n\r"  # JSON's own
SPACES = re.compile(rb"[ \t\n\r]*+")
NAME = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)  # possessive: no backtracking to keep
# the words a value may be: None, the number reader takes it as written; else what it reads
KEYWORDS = {b"NaN": None, b"Infinity": None, b"true": b"1", b"false": b"0"}
TOKEN, MARK, SPACE, STRAY = 0, 1, 2, 3  # what a byte is in an array of numbers


def _table(default: int, **groups: tuple[bytes, int]) -> bytes:
    """A 256-byte table for `_lookup`: each group's bytes to its value, the rest to `default`."""
    table = bytearray([default]) * 256
    for chars, value in groups.values():
        for ch in chars:
            table[ch] = value
    return bytes(table)


def _lookup(table: bytes, a: np.ndarray) -> np.ndarray:
    """`table[a]` for a uint8 array, by bytes.translate: NumPy's own indexing would first
    make an 8-byte index of every byte (128 MB for a 16 MB input)."""
    return np.frombuffer(a.tobytes().translate(table), np.uint8)


WORDS = b"".join(KEYWORDS)
CLASS = _table(STRAY, number=(b"0123456789+-.eE" + WORDS, TOKEN), marks=(b"[],", MARK),
               spaces=(WHITESPACE, SPACE))  # STRAY: a string, an object, null, any other byte
LETTER = _table(0, letters=(bytes(ch for ch in WORDS if ch not in b"eE"), 1))  # e, E: numbers'
DIGIT = _table(0, digits=(b"0123456789", 1))


class JsonInputError(ValueError):
    """A JSON input that is not arrays of numbers; str() is one line, without the file."""


@dataclass(frozen=True)
class Numbers:
    """An array read from JSON, in JSON's dtype (bool, int64 or float64)."""

    array: np.ndarray


def read(data: bytes, axes: dict[str, int]) -> Numbers | dict[str, Numbers | None]:
    """A JSON input's value: one array (`Numbers`), or an object's, by name (None for a
    name `axes` does not have: the caller names it). `axes`: each input's axes, the batch
    axis included; nothing may be nested deeper."""
    encoding = "utf-8"
    try:
        encoding = json.detect_encoding(data)
        if encoding != "utf-8":  # a BOM, UTF-16 or UTF-32 (as json.loads reads them)
            data = data.decode(encoding).lstrip("\ufeff").encode()
    except (UnicodeDecodeError, LookupError) as e:
        raise JsonInputError(f"not JSON (not {encoding} text: {e})") from None
    view = memoryview(data)
    start = _skip(data, 0)
    if data.startswith(b"{", start):
        return _object(data, view, start, axes)
    return _value(view[start:], start, max(axes.values(), default=0), None)


def _skip(data: bytes, i: int) -> int:
    return SPACES.match(data, i).end()


def _object(data: bytes, view: memoryview, i: int, axes: dict[str, int]) -> dict[str, Numbers | None]:
    """An object of arrays, by name. A value holds no string, so it ends before the next
    double quote: each is read once. A name the model does not take ends the reading."""
    found: dict[str, Numbers | None] = {}
    i = _skip(data, i + 1)
    if data.startswith(b"}", i):
        if _skip(data, i + 1) != len(data):
            raise JsonInputError(f"not JSON (text after its end, at byte {_skip(data, i + 1)})")
        return found
    while True:
        name, i = _name(data, i)
        i = _skip(data, i)
        if not data.startswith(b":", i):
            raise JsonInputError(f"not JSON (':' expected after {name[:40]!r}, at byte {i})")
        end = data.find(b'"', i)
        end = len(data) if end < 0 else end
        closer = b"}" if end == len(data) else b","
        if name not in axes:  # the caller names it among those given; its value is not read
            found[name] = None
            return found
        found[name] = _value(view[i + 1:end], i + 1, axes[name], name, closer)
        if closer == b"}":
            return found
        i = end


def _name(data: bytes, i: int) -> tuple[str, int]:
    """The name in double quotes at `i`, and the byte after it."""
    found = NAME.match(data, i)
    if found is None:
        raise JsonInputError(f"not JSON (a name in double quotes expected at byte {i})")
    try:
        return json.loads(found.group()), found.end()
    except ValueError as e:
        raise JsonInputError(f"not JSON (a name at byte {i}: {e})") from None


def _value(view: memoryview, offset: int, most: int, name: str | None,
           closer: bytes | None = None) -> Numbers:
    """A number, true, false, or arrays of them (then `closer`, in an object); `most`:
    the axes it may have; `offset`: where it starts in the file, for messages."""
    whose = f" for {name!r}" if name is not None else ""
    raw = np.frombuffer(view, np.uint8)
    spaces = _lookup(CLASS, raw) == SPACE
    if closer is not None:  # the byte after the value: the object's ',' or '}'
        last = raw.size - 1 - int(np.argmax(~spaces[::-1])) if raw.size else 0
        inside = closer == b"," and np.count_nonzero(raw == ord("[")) != np.count_nonzero(
            raw == ord("]"))  # the value stopped at a double quote inside its brackets
        if inside or (closer == b"," and spaces.all()):
            raise JsonInputError(f"not an array of numbers{whose}: a string at byte "
                                 f"{offset + raw.size} (give numbers, true or false)")
        if spaces.all() or raw[last] != closer[0]:
            raise JsonInputError(f"not JSON ({closer.decode()!r} expected after the value{whose})")
        raw, spaces = raw[:last], spaces[:last]
    kind = _lookup(CLASS, raw)
    b = raw[~spaces]  # a copy: keywords are rewritten in it
    if not b.size:
        raise JsonInputError(f"not JSON (no value{whose})")
    if (kind == STRAY).any():
        first = int(np.argmax(kind == STRAY))
        what = {ord('"'): "a string", ord("{"): "an object"}.get(
            int(raw[first]), repr(chr(raw[first])))
        raise JsonInputError(f"not an array of numbers{whose}: {what} at byte {offset + first} "
                             "(give numbers, true or false)")
    tokens = kind == TOKEN
    runs = np.count_nonzero(tokens[1:] & ~tokens[:-1]) + int(tokens[0])
    del raw, kind, spaces, tokens
    depth = int(np.argmax(b != ord("["))) if (b != ord("[")).any() else b.size
    if depth > most:
        raise JsonInputError(f"arrays nested {depth:,} deep{whose}, but the input has {most} axes "
                             "(a batch of samples; a single sample has one fewer)")
    b, counts = _keywords(b, whose)
    mark = _lookup(CLASS, b) == MARK
    starts = ~mark & np.concatenate(([True], mark[:-1]))  # each number's first byte
    if np.count_nonzero(starts) != runs:
        raise JsonInputError(f"not JSON (numbers{whose} separated by spaces, not commas)")
    _as_json_writes(b, starts, whose)
    shape = _shape(np.where(mark, b, ord("n"))[mark | starts].tobytes(), depth, whose)
    starts[:-1] = starts[1:]  # now: the byte before each number, which becomes its comma
    starts[-1] = False
    kept = np.where(mark, ord(","), b)[~mark | starts]
    del mark, starts, b
    array = _numbers(kept[1:] if kept.size and kept[0] == ord(",") else kept, counts, whose)
    if array.size != int(np.prod(shape)):
        raise JsonInputError(f"not JSON (a number{whose} that cannot be read)")
    return Numbers(array.reshape(shape))


def _as_json_writes(b: np.ndarray, starts: np.ndarray, whose: str) -> None:
    """Numbers as JSON writes them, which the number reader would read more loosely: a sign
    first (or after the exponent), a point between digits, no leading zero (no `+1`, `.5`,
    `1.`, `01`, `-`). One rule at a time, on views of one padded copy: a few bytes of
    memory per byte, never an 8-byte index of each."""
    pad = np.full(b.size + 2, ord(","), np.uint8)
    pad[1:-1] = b
    digits = _lookup(DIGIT, pad).view(bool)
    before, here, after = pad[:-2], pad[1:-1], pad[2:]
    digit_before, digit_after = digits[:-2], digits[2:]
    signed = np.concatenate(([False], starts[:-1]))  # after a number's first byte: its sign

    def exponent(side: np.ndarray) -> np.ndarray:
        return (side == ord("e")) | (side == ord("E"))

    rules = (
        lambda: (here == ord("-")) & ~((starts | exponent(before))
                                       & (digit_after | (after == ord("I")) | (after == ord("N")))),
        lambda: (here == ord("+")) & ~(exponent(before) & digit_after),
        lambda: (here == ord(".")) & ~(digit_before & digit_after),
        lambda: exponent(here) & ~(digit_before & (digit_after | (after == ord("+"))
                                                   | (after == ord("-")))),
        lambda: (here == ord("0")) & digit_after & (starts | ((before == ord("-")) & signed)),
    )
    for rule in rules:
        wrong = rule()
        if wrong.any():
            at = int(np.argmax(wrong))
            raise JsonInputError(f"not JSON (a number{whose} as JSON does not write one: "
                                 f"{bytes(b[max(0, at - 8):at + 8]).decode()!r})")


def _keywords(b: np.ndarray, whose: str) -> tuple[np.ndarray, dict[bytes, int]]:
    """`b` with true and false as 1 and 0, each word checked whole where a number may start
    (NaN and Infinity, signed or not, are left to the number reader). Any other letter than
    e and E, which numbers hold, is refused."""
    letters = _lookup(LETTER, b).view(bool)
    if not letters.any():
        return b, {}
    mark = _lookup(CLASS, b) == MARK
    first = np.concatenate(([True], mark[:-1]))  # a number may start here
    signed = np.concatenate(([False], (b[:-1] == ord("-")) & first[:-1]))
    counts: dict[bytes, int] = {}
    drop = np.zeros(b.size, bool)
    seen = 0
    for word, parsed in KEYWORDS.items():
        at = np.flatnonzero((b == word[0]) & (first | (signed & (parsed is None))))
        counts[word] = at.size
        ok = at + len(word) <= b.size
        for k, ch in enumerate(word):
            ok &= b[np.minimum(at + k, b.size - 1)] == ch
        ok &= (at + len(word) == b.size) | mark[np.minimum(at + len(word), b.size - 1)]
        if not ok.all():
            raise _word(whose)
        seen += at.size * sum(LETTER[ch] for ch in word)
        if parsed is not None and at.size:
            b[at] = parsed[0]
            for k in range(1, len(word)):
                drop[at + k] = True
    if seen != np.count_nonzero(letters):
        raise _word(whose)
    return (b[~drop] if drop.any() else b), counts


def _word(whose: str) -> JsonInputError:
    return JsonInputError(f"not an array of numbers{whose} (a word other than true, false, NaN "
                          "or Infinity: give numbers)")


def _shape(skeleton: bytes, depth: int, whose: str) -> tuple[int, ...]:
    """The shape of the rectangular array whose skeleton ('[', ']', ',' and an 'n' for each
    number) this is; refused unless the skeleton is exactly that array's."""
    for pair in (b"[,", b",]", b",,", b"n[", b"]n", b"][", b"nn"):
        if pair in skeleton:
            raise JsonInputError(f"not JSON (a value or a comma missing{whose}: {pair.decode()!r})")
    if skeleton[:1] not in (b"[", b"n") or skeleton[-1:] not in (b"]", b"n"):
        raise JsonInputError(f"not JSON (a comma or a bracket{whose} out of place)")
    if skeleton.count(b"[") != skeleton.count(b"]"):
        raise JsonInputError(f"not JSON (brackets{whose} that do not pair up)")
    if depth == 0:
        if skeleton != b"n":
            raise JsonInputError(f"not JSON (one value{whose} expected)")
        return ()
    inner = skeleton.find(b"]")
    sizes = [skeleton.count(b"n", depth - 1, inner)]  # the first innermost array's
    child = _of(b"n", sizes[0])
    for level in range(depth - 1, 0, -1):  # the first array at each level: its children
        close = skeleton.find(b"]" * (depth - level + 1), level - 1)
        count, extra = divmod(close + depth - level + 1 - (level - 1) - 1, len(child) + 1)
        if close < 0 or extra:
            raise _ragged(whose)
        sizes.insert(0, count)
        child = _of(child, count)
    if child != skeleton:
        raise _ragged(whose)
    return tuple(sizes)


def _of(child: bytes, count: int) -> bytes:
    """The skeleton of an array of `count` children like `child`."""
    return b"[" + (child + b",") * (count - 1) + child + b"]" if count else b"[]"


def _ragged(whose: str) -> JsonInputError:
    return JsonInputError(f"arrays{whose} of different lengths or depths: an input is one "
                          "rectangular array (every array at one depth as long as the others)")


def _numbers(text: np.ndarray, counts: dict[bytes, int], whose: str) -> np.ndarray:
    """The comma-separated numbers, in JSON's dtype: bool, int64 or float64."""
    if not text.size:
        return np.zeros(0, np.float64)  # as numpy.asarray([]) gives
    floats = bool(counts.get(b"NaN") or counts.get(b"Infinity")) or bool(
        ((text == ord(".")) | (text == ord("e")) | (text == ord("E"))).any())
    data = text.tobytes()
    try:
        with warnings.catch_warnings():  # numpy warns (rather than raises) at an unread rest
            warnings.simplefilter("error")
            array = np.fromstring(data, np.float64 if floats else np.int64, sep=",")
            top = np.iinfo(np.int64)
            if not floats and array.size and (array.max() == top.max or array.min() == top.min):
                # int64 saturates: a whole number past it is read as a float, as no input's
                # dtype holds it (the two ends themselves, +-2**63, read as floats too)
                wide = np.fromstring(data, np.float64, sep=",")
                if (np.abs(wide) >= 2.0**63).any():
                    array = wide
    except (ValueError, DeprecationWarning) as e:
        raise JsonInputError(f"not JSON (a number{whose} that cannot be read: {e})") from None
    if counts and counts.get(b"true", 0) + counts.get(b"false", 0) == array.size:
        return array.astype(bool)
    return array
