"""An experiment file -> its runs and its `[engine]` table: read once, validated
(every problem collected), expanded. Raises SpecError with every problem."""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridrun.spec.devices import check_devices
from gridrun.spec.engine_table import engine_config
from gridrun.spec.errors import LineIndex, Problem, SpecError
from gridrun.spec.expand import count_runs, expand
from gridrun.spec.model import EngineConfig, ExperimentSpec, RunSpec
from gridrun.spec.validate import (
    DEFAULT_CAP,
    Checker,
    check_experiments,
    check_size,
    check_top_level,
)

MAX_DEPTH = 32  # tables and arrays within each other; tomllib recurses once per level
MAX_FILE = 1 << 20  # bytes: an experiment file is a page of settings, not data


@dataclass(frozen=True)
class Loaded:
    """What one file says: its runs, and its `[engine]` table (None when it has none:
    queueing such a file leaves the engine's settings as they are)."""

    runs: list[RunSpec]
    engine: EngineConfig | None


class FileRefused(ValueError):
    """An experiment file that is not read: str() is the one line that says why."""


def read_text(path: str | Path, limit: int = MAX_FILE) -> str:
    """The text of an experiment file, read with a bound: only a regular file (a FIFO or a
    device such as /dev/zero is refused at once, never read) of at most `limit` bytes,
    UTF-8, a byte order mark at its start dropped. FileRefused or OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise FileRefused("is a folder: give an experiment file (TOML)")
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused("is not a regular file (a pipe, a device?): give an experiment "
                              "file (TOML)")
        if st.st_size > limit:
            raise FileRefused(f"is {st.st_size:,} bytes: an experiment file is at most "
                              f"{limit:,} bytes")
        os.set_blocking(fd, True)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileRefused(f"is more than {limit:,} bytes: an experiment file is at most "
                          f"{limit:,} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise FileRefused("not a TOML file: it is not UTF-8 text") from None
    return text[1:] if text.startswith("\ufeff") else text


def _read(path: Path) -> tuple[dict[str, Any] | None, str, list[Problem]]:
    file = str(path)
    try:
        text = read_text(path)
    except FileNotFoundError:
        return None, "", [Problem(file, "no such file")]
    except FileRefused as exc:
        return None, "", [Problem(file, str(exc))]
    except OSError as exc:
        return None, "", [Problem(file, f"cannot read the file: {exc.strerror}")]
    try:
        data = tomllib.loads(text)
    except RecursionError:
        return None, text, [Problem(file, "not valid TOML for gridrun: values are nested too "
                                    f"deeply (more than {MAX_DEPTH} levels)")]
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        line, col = (int(m.group(1)), int(m.group(2))) if m else (None, None)
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", msg)
        return None, text, [Problem(file, f"not valid TOML: {msg}", line=line, column=col)]
    deep = _too_deep(data)
    if deep is not None:
        return None, text, [Problem(file, f"not valid TOML for gridrun: {'.'.join(deep)} is nested "
                                    f"too deeply (more than {MAX_DEPTH} levels)",
                                    line=LineIndex(text).find(*deep))]
    return data, text, []


def _too_deep(data: dict[str, Any]) -> tuple[str, ...] | None:
    """The key path of a value nested more than MAX_DEPTH levels, if any (no recursion:
    later checks format values recursively)."""
    stack: list[tuple[Any, tuple[str, ...], int]] = [(data, (), 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            return path
        if isinstance(value, dict):
            stack += [(v, (*path, str(k)), depth + 1) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, path, depth + 1) for v in value]
    return None
def read(path: str | Path) -> tuple[dict[str, Any], Checker]:
    """The file's tables and a Checker over its text; SpecError when it is not TOML."""
    path = Path(path)
    data, text, problems = _read(path)
    c = Checker(str(path), text)
    if data is None:
        raise SpecError(problems)
    check_top_level(c, data)
    return data, c


def _engine(c: Checker, data: dict[str, Any]) -> EngineConfig | None:
    return engine_config(data["engine"], c) if "engine" in data else None


def _why_same(a: RunSpec, b: RunSpec) -> str:
    """Why two cells that differ are one run: the keys they differ in are not in the run id."""
    keys = [k for k in dict.fromkeys([*a.trainer, *b.trainer]) if a.trainer.get(k) != b.trainer.get(k)]
    if not keys:
        return ""
    why = (f" ({', '.join(keys)} {'is' if len(keys) == 1 else 'are'} not part of the run id: "
           "how a run executes, not what it computes")
    if "devices" in keys and a.trainer.get("reduce") == "invariant":
        why += "; under reduce = \"invariant\" the device count changes no bit"
    return why + ")"


def _expand_all(c: Checker, experiments: list[ExperimentSpec]
                ) -> list[tuple[ExperimentSpec, list[RunSpec]]]:
    expanded = []
    for exp in experiments:
        exp_runs = expand(exp)
        expanded.append((exp, exp_runs))
        seen: dict[str, RunSpec] = {}
        for run in exp_runs:
            if run.id in seen:
                c.add(f"two cells resolve to the same config: {seen[run.id].variant or 'baseline'!r} "
                      f"and {run.variant or 'baseline'!r} (seed {run.seed}); remove one"
                      + _why_same(seen[run.id], run), "experiments", exp.name, experiment=exp.name)
                break
            seen[run.id] = run
    return expanded


def load(path: str | Path, *, force: bool = False, cap: int = DEFAULT_CAP,
         gpus_here: Callable[[], int] | None = None) -> Loaded:
    """Read, validate and expand an experiment file: its runs and its `[engine]` table.

    The run count is checked before anything is built: from the raw axis lengths
    before validation imports the task (a refusal costs milliseconds, whatever
    the product), and again from the validated experiments before expanding.
    With `gpus_here` (the most GPUs an engine started on this machine could take,
    asked only where the file's [engine] leaves it to them), a run whose `devices` can
    never fit that table is refused too (spec/devices.py): for the commands that queue."""
    data, c = read(path)
    experiments = check_experiments(c, data, cap=cap, force=force)
    if experiments is None:  # refused for its size, alone
        raise SpecError(c.unique())
    engine = _engine(c, data)
    if c.problems:
        raise SpecError(c.unique())
    check_size(c, {exp.name: count_runs(exp) for exp in experiments}, cap=cap, force=force)
    if c.problems:
        raise SpecError(c.problems)
    expanded = _expand_all(c, experiments)
    gpus_written = isinstance(data.get("engine"), dict) and "gpus" in data["engine"]
    check_devices(c, expanded, engine, gpus_written=gpus_written, gpus_here=gpus_here)
    if c.problems:
        raise SpecError(c.unique())  # a value in [defaults] is found by every experiment
    return Loaded([run for _, runs in expanded for run in runs], engine)


def load_runs(path: str | Path, *, force: bool = False, cap: int = DEFAULT_CAP,
              gpus_here: Callable[[], int] | None = None) -> list[RunSpec]:
    """Parse, validate and expand an experiment file (`gpus_here`: as `load`). Raises
    SpecError with every problem."""
    return load(path, force=force, cap=cap, gpus_here=gpus_here).runs


def load_experiments(path: str | Path) -> list[ExperimentSpec]:
    """The file's experiments, validated; raises SpecError with every problem."""
    data, c = read(path)
    experiments = check_experiments(c, data, cap=None) or []
    _engine(c, data)
    if c.problems:
        raise SpecError(c.unique())
    return experiments


def load_engine_config(path: str | Path) -> EngineConfig:
    """The file's `[engine]` table (defaults where absent); raises SpecError when invalid
    (its experiments are not checked: no task is imported)."""
    data, c = read(path)
    config = _engine(c, data) or EngineConfig()
    if c.problems:
        raise SpecError(c.problems)
    return config
