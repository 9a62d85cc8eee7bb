"""ARCHITECTURE.md stays true: its code map names every package of gridrun, and
names none that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

import gridrun

GRIDRUN = Path(gridrun.__file__).parent
DOC = GRIDRUN.parent / "ARCHITECTURE.md"


def packages() -> set[str]:
    return {str(p.parent.relative_to(GRIDRUN.parent)) + "/" for p in GRIDRUN.rglob("__init__.py")
            if p.parent != GRIDRUN}


def code_map() -> str:
    text = DOC.read_text(encoding="utf-8")
    return text[text.index("## Code map"):text.index("## Boundaries")]


def test_the_code_map_names_every_package_and_only_those():
    named = set(re.findall(r"`(gridrun/[a-z_/]+/)`", code_map()))
    assert named, "no package named in the code map"
    assert named - packages() == set(), "named but missing"
    assert packages() - named == set(), "packages the code map does not name"


def test_every_top_level_package_has_its_own_heading():
    headings = set(re.findall(r"^### `(gridrun/[a-z_]+/)`$", code_map(), re.M))
    top = {p for p in packages() if p.count("/") == 2}
    assert headings == top


def test_the_page_stays_short():
    assert len(DOC.read_text(encoding="utf-8").splitlines()) < 250


def test_no_package_holds_more_than_fifteen_modules_side_by_side():
    crowded = {}
    for init in GRIDRUN.rglob("__init__.py"):
        modules = [p for p in init.parent.glob("*.py") if p.name != "__init__.py"]
        if len(modules) > 15:
            crowded[str(init.parent.relative_to(GRIDRUN.parent))] = len(modules)
    assert crowded == {}, "split these packages by concern"


def test_no_module_is_over_450_lines():
    long = {str(p.relative_to(GRIDRUN.parent)): n for p in GRIDRUN.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 450}
    assert long == {}, "split these modules where a second concern has grown inside"
