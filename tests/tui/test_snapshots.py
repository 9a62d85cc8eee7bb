"""Snapshots of the main screens with the scripted source and a frozen clock.

Update after a deliberate change: pytest tests/tui/test_snapshots.py --snapshot-update
"""

import pytest
from tui_helpers import settle, until

SIZES = [(80, 24), (120, 40), (200, 50)]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_main(snap_compare, make_app, size):
    app, _ = make_app(40)
    assert snap_compare(app, terminal_size=size, run_before=settle)


def test_main_without_gpu(snap_compare, make_app):
    app, _ = make_app(12, gpus=False)
    assert snap_compare(app, terminal_size=(80, 24), run_before=settle)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_detail(snap_compare, make_app, size):
    app, _ = make_app()

    async def open_detail(pilot):
        await settle(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: "train loss" in app.screen.data.series)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=open_detail)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_compare(snap_compare, make_app, size):
    app, _ = make_app()

    async def open_compare(pilot):
        await settle(pilot)
        await pilot.press("t")
        await until(pilot, lambda: getattr(app.screen, "shown", None) is not None)

    assert snap_compare(app, terminal_size=size, run_before=open_compare)


def test_overlay_smoothed_over_faint_raw(snap_compare, make_app):
    """Smoothing visible: the validation metric of two runs, EMA 0.8 over the dim raw curves."""
    app, _ = make_app()

    async def open_overlay(pilot):
        await settle(pilot)
        await pilot.press("space", "space", "v", "right_square_bracket")
        await until(pilot, lambda: all(d.series for d in app.screen.data.values()))
        app.clear_notifications()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 40), run_before=open_overlay)


def test_help(snap_compare, make_app):
    app, _ = make_app()

    async def open_help(pilot):
        await settle(pilot)
        await pilot.press("question_mark")

    assert snap_compare(app, terminal_size=(80, 24), run_before=open_help)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_grouped(snap_compare, make_app, size):
    """g: a header row per experiment with its run count and states."""
    app, _ = make_app(40)

    async def group(pilot):
        await settle(pilot)
        await pilot.press("g")
        app.clear_notifications()
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=group)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_detail_output_scrolled(snap_compare, make_app, size):
    """The output tab scrolled to a search match (highlighted), not at the tail."""
    app, src = make_app()
    for run_id in src._output:
        src._output[run_id] = "".join(f"train step {s:4d}/400  loss {1 / s:.4f}\n"
                                      for s in range(1, 401))

    async def open_output(pilot):
        await settle(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: "train loss" in app.screen.data.series)
        await pilot.press("tab")
        await until(pilot, lambda: app.screen.query_one("#output").line_count >= 400)
        await pilot.press("slash", *"step  120/", "enter")
        app.clear_notifications()
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=open_output)


def test_detail_diagnostics(snap_compare, make_app):
    """The diagnostics tab: grad norm (log, a spike), data wait and memory curves, the findings."""
    app, _ = make_app()

    async def open_diagnostics(pilot):
        from textual.widgets import TabbedContent

        await settle(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: "grad_norm" in app.screen.data.series)
        app.screen.query_one(TabbedContent).active = "diagnostics-tab"
        await pilot.pause()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 40), run_before=open_diagnostics)
