"""The documentation's pictures are what the interface draws (issue 46): each
docs/images/*.svg is drawn again here by the real app from the same fixed data
(scripts/docs_pictures.py) and compared as text, so a change to a screen, a widget or
its styles without `python scripts/docs.py pictures` fails here."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import docs_pictures  # noqa: E402

REGENERATE = "run `python scripts/docs.py pictures` and commit docs/images/"
# What legitimately varies: nothing between two drawings of one screen (Rich names its
# classes by a hash of what it draws), so only that name is masked, to keep a failure's
# difference to the lines that changed.
IDS = re.compile(r"terminal-\d+")


def normal(svg: str) -> str:
    return IDS.sub("terminal", svg)


@pytest.mark.parametrize("name", sorted(docs_pictures.SHOTS))
def test_committed_picture_is_what_the_app_draws(name):
    committed = (ROOT / f"docs/images/{name}.svg").read_text(encoding="utf-8")
    drawn = docs_pictures.picture(name)
    if normal(drawn) != normal(committed):
        changed = [(a, b) for a, b in zip(normal(committed).splitlines(), normal(drawn).splitlines(),
                                          strict=False) if a != b]
        pytest.fail(f"docs/images/{name}.svg is not what the app draws now ({len(changed)} lines "
                    f"differ, first: {changed[:1]}): {REGENERATE}")


def text_of(svg: str) -> str:
    """The characters the picture shows, as one string (Rich writes a span per style)."""
    import html

    return html.unescape("".join(re.findall(r">([^<]*)</text>", svg))).replace("\xa0", " ")


def test_the_pictures_show_what_the_pages_say():
    shown = {n: text_of((ROOT / f"docs/images/{n}.svg").read_text(encoding="utf-8"))
             for n in docs_pictures.SHOTS}
    for state in ("completed", "running", "queued", "failed", "cancelled"):
        assert state in shown["runs-table"]
    assert "width-lr" in shown["runs-table"] and "tricks" in shown["runs-table"]
    assert "curves" in shown["run-detail"] and "train loss" in shown["run-detail"]
    assert "compare: tricks" in shown["compare"] and "no-warmup" in shown["compare"]
    assert "gpu0 NVIDIA H100" in shown["machine-panel"] and "mem gridrun" in shown["machine-panel"]


def test_the_data_is_the_examples_runs_and_fixed():
    runs = docs_pictures.example_runs()
    rows = docs_pictures.rows(runs)
    assert len(rows) == 18 and [r.id for r in rows] == [r.id for r in runs]
    assert rows == docs_pictures.rows(docs_pictures.example_runs())  # no clock, no chance
    assert docs_pictures.records(runs[0], 100) == docs_pictures.records(runs[0], 100)
