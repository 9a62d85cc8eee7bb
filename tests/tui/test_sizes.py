"""The interface at every size: columns by priority, the key bar, curve smoothing."""

import pytest
from tui_helpers import aio, settle, until

from gridrun.tui import demo
from gridrun.tui.screens.detail import DetailScreen
from gridrun.tui.screens.overlay import OverlayScreen
from gridrun.tui.widgets import fmt
from gridrun.tui.widgets.columns import COLUMNS, CORE, GAP, fit
from gridrun.tui.widgets.curves import SMOOTHING, ema, step_smoothing
from gridrun.tui.widgets.keys import KeyBar


@pytest.mark.parametrize("width", [78, 100, 118, 158, 198])
def test_fit_keeps_the_core_and_adds_by_priority(width):
    columns = fit(width, {"experiment": 8, "variant": 19})
    assert set(CORE) <= set(columns)
    assert list(columns) == [c for c in COLUMNS if c in columns]  # display order
    assert sum(columns.values()) + GAP * (len(columns) - 1) <= width
    # the names first (whole: 8 + 19 cells), then id: from 92 columns with these names
    assert ("id" in columns) == (width >= 92)
    if width >= 80:
        assert columns["variant"] >= 18 and columns["experiment"] >= 8  # whole; its name at 10
    if width >= 158:
        assert list(columns) == list(COLUMNS) and columns["variant"] >= 19


def test_ema_is_debiased_and_zero_is_raw():
    points = [(s, float(s % 2)) for s in range(1, 101)]
    assert ema(points, 0.0) == points
    smooth = ema(points, 0.9)
    assert smooth[0] == points[0]  # starts at the first value, not at 0
    assert all(0.3 < y < 0.7 for _, y in smooth[40:])  # the zigzag flattened to its mean
    assert ema([(1, 2.0), (2, 2.0), (3, 2.0)], 0.6) == pytest.approx([(1, 2.0), (2, 2.0), (3, 2.0)])
    assert step_smoothing(0.0, -1) == 0.0 and step_smoothing(SMOOTHING[-1], 1) == SMOOTHING[-1]
    assert step_smoothing(0.6, 1) == 0.8 and step_smoothing(0.6, -1) == 0.3


@aio
async def test_every_row_shows_loss_and_best_at_80_columns(make_app):
    app, _ = make_app(40)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        table = app.main.table
        assert table.region.width <= 80
        header = table.render_line(0).text
        assert "loss" in header and "best" in header and "progress" in header
        for y in range(1, table.scrollable_content_region.height):
            run = table.runs[table.order[table.scroll_offset.y + y - 1]]
            line = table.render_line(y).text
            assert fmt.num(run.train_loss) in line and fmt.num(run.best) in line, line
            assert run.experiment in line and fmt.status(run.status).plain in line


@aio
async def test_key_bar_shows_what_fits_and_help_shows_all(make_app):
    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        bar = app.main.query_one(KeyBar)
        text = bar.render().plain
        assert len(text) <= 80
        for shown in ("⏎ open", "space mark", "a queue", "c cancel", "r retry", "/ find",
                      "s sort", "? help", "q quit"):  # the short words: all of them fit
            assert shown in text
        assert "g group" not in text  # no room at 80 columns
        await pilot.resize_terminal(200, 50)
        await pilot.pause()
        wide = bar.render().plain
        assert "g group" in wide and "⏎ detail" in wide and "a queue file" in wide
        await pilot.press("question_mark")
        help_text = str(app.screen.query_one("#help").render())
        assert "group" in help_text and "quit (the engine is left as it is)" in help_text
        assert "best↑ (best accuracy↑) = the best validation value" in help_text  # the legend


@aio
async def test_smoothing_keys_and_overlay_defaults_to_validation(make_app):
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        assert isinstance(app.screen, DetailScreen)
        await until(pilot, lambda: "train loss" in app.screen.data.series)
        assert app.screen.smoothing == 0.6
        await pilot.press("right_square_bracket")
        assert app.screen.smoothing == 0.8
        await pilot.press(*["left_square_bracket"] * 9)
        assert app.screen.smoothing == 0.0
        await pilot.press("escape", "space", "space", "v")
        assert isinstance(app.screen, OverlayScreen)
        await until(pilot, lambda: all(d.series for d in app.screen.data.values()))
        assert app.screen.metric == "val accuracy"  # the runs' tracked metric (best_name)
        await pilot.press("m", "down", "enter")
        assert app.screen.metric != "val accuracy"


def example_rows():
    """The example file's 18 finished runs, as the interface gets them."""
    import dataclasses

    cells = [("width-lr", f"hidden={h} lr={lr}", s) for h in (32, 128) for lr in ("0.003", "0.01")
             for s in range(3)]
    cells += [("tricks", v, s) for v in ("baseline", "no-warmup", "sgd") for s in range(2)]
    base = demo.rows(1)[0]
    return [dataclasses.replace(base, id=f"{i:010x}", experiment=e, variant=v, seed=s,
                                best_name="loss", best_direction="lower")
            for i, (e, v, s) in enumerate(cells)]


@aio
async def test_at_80x24_the_example_rows_differ_in_their_variant_cell():
    """Issue 25: `hidden=32 l…` for both learning rates told two cells apart by nothing."""
    from gridrun.tui.app import GridrunApp
    from gridrun.tui.source import EngineState, FakeSource, Machine, Update

    rows = example_rows()
    src = FakeSource([Update(runs=tuple(rows), engine=EngineState(True, False, {"completed": 18}),
                             machine=Machine((), 50.0, 1e9, 8e9, ()))])
    app = GridrunApp(src, clock=lambda: demo.NOW, live=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        table = app.main.table
        keys = list(table.columns)
        start = sum(table.columns[k] + GAP for k in keys[:keys.index("variant")])
        width = table.columns["variant"]
        shown = {}
        for y in range(1, len(rows) + 1):
            line = table.render_line(y).text
            run = table.runs[table.order[y - 1]]
            shown[(run.variant, run.seed)] = line[start:start + width].strip()
        def values(label: str) -> set[str]:  # `hid=32 lr=0.003` -> {"32", "0.003"}
            return {w.partition("=")[2] or w for w in label.split()}

        for (variant, _), cell in shown.items():
            assert values(variant) == values(cell), cell  # every value (or ablation name) whole
            assert "…" not in cell
        per_variant = {}
        for (variant, _), cell in shown.items():
            per_variant.setdefault(variant, set()).add(cell)
        assert all(len(cells) == 1 for cells in per_variant.values())  # one form per variant
        assert len({next(iter(c)) for c in per_variant.values()}) == len(per_variant)  # apart
        header = table.render_line(0).text
        assert "variant" in header and "best↓" in header and "loss" in header
        assert "accura" not in header and "…" not in header
