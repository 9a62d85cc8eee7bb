"""The reference pages are what the code says (issue 46): docs/reference/*.md regenerated in
memory equal the committed pages, so a key's default changed in the spec, a key added, or a
command's help changed without `python scripts/docs.py references` fails here."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import docs_reference  # noqa: E402

from gridrun.spec import engine_table, search, validate  # noqa: E402
from gridrun.spec.keys import RESERVED, TRAINER_KEYS  # noqa: E402

REGENERATE = "out of date: run `python scripts/docs.py references` and commit the pages"


@pytest.mark.parametrize("rel", sorted(docs_reference.PAGES))
def test_committed_page_is_what_the_code_gives(rel):
    committed = (ROOT / rel).read_text(encoding="utf-8")
    assert committed == docs_reference.PAGES[rel](), f"{rel} {REGENERATE}"


def test_a_default_changed_in_the_spec_changes_the_page(monkeypatch):
    page = docs_reference.experiment_keys_page()
    assert "| `lr` | float | `0.001` |" in page
    monkeypatch.setitem(TRAINER_KEYS, "lr", dataclasses.replace(TRAINER_KEYS["lr"], default=0.002))
    changed = docs_reference.experiment_keys_page()
    assert "| `lr` | float | `0.002` |" in changed and changed != page


def test_every_key_has_a_meaning_and_a_row():
    assert set(engine_table.DOCS) == set(engine_table.NAMES)
    assert set(search.DOCS) == set(search.TABLE_KEYS)
    assert set(search.DEFAULTS) <= set(search.TABLE_KEYS)
    assert set(validate.RESERVED_DOCS) == set(RESERVED)
    page = (ROOT / "docs/reference/experiment-keys.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `([\w-]+)` \|", page, re.M))
    assert rows == {*TRAINER_KEYS, *engine_table.NAMES, *search.TABLE_KEYS, *RESERVED}


def sections(page: str) -> dict[str, str]:
    """{"gridrun plan": the help block under its heading} of the CLI page."""
    found = re.findall(r"^## `([^`]+)`\n\n```text\n(.*?)\n```$", page, re.M | re.S)
    return dict(found)


def test_cli_page_is_every_commands_help():
    page = (ROOT / "docs/reference/cli.md").read_text(encoding="utf-8")
    shown = sections(page)
    every = [" ".join(["gridrun", *p]) for p in docs_reference.commands()]
    assert list(shown) == every, f"the page's commands are not the app's: {REGENERATE}"
    assert len(every) > 20 and "gridrun engine start" in every
    for name, block in shown.items():
        expected = docs_reference.help_text(name.split()[1:])
        assert block == expected, f"`{name} --help` changed: {REGENERATE}"
        assert block.startswith(f"Usage: {name}") or f"Usage: {name} " in block


def test_help_does_not_depend_on_the_terminal_or_the_root(monkeypatch):
    before = docs_reference.help_text(["plan"])
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("GRIDRUN_ROOT", "/somewhere/else")
    after = docs_reference.help_text(["plan"])
    assert after == before
    assert max(len(line) for line in before.splitlines()) <= docs_reference.WIDTH
    assert "\x1b[" not in before


def test_a_changed_help_changes_the_page(monkeypatch):
    real = docs_reference.help_text
    monkeypatch.setattr(docs_reference, "help_text",
                        lambda path: real(path) + ("\nnew option" if path == ["ls"] else ""))
    page = docs_reference.cli_page()
    assert sections(page)["gridrun ls"].endswith("new option")
    assert page != (ROOT / "docs/reference/cli.md").read_text(encoding="utf-8")
