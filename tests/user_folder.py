"""The user's own folder in a test: their task package in it, and it the working
directory and first import path of every process started from it, as where a user
runs `gridrun`; the package leaves `sys.modules` as it found it (another test's
package of the same name must import its own)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest


@contextlib.contextmanager
def user_package(folder: Path, monkeypatch: pytest.MonkeyPatch, package: str,
                 modules: Mapping[str, str]) -> Iterator[Path]:
    """`folder` holding `package` (its `modules`: name -> source), for the test's span."""
    (folder / package).mkdir()
    (folder / package / "__init__.py").write_text("")
    for name, text in modules.items():
        (folder / package / f"{name}.py").write_text(text)
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    try:
        yield folder
    finally:
        for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
            del sys.modules[name]
