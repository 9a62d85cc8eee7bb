"""Curves people can read: a `step` x label with whole-number ticks, y labels of one
width (the plot does not move between refreshes), the legend under the plot, and a
wall-clock x axis on `w`."""

from tui_helpers import aio, settle, until

from gridrun.tui.widgets.curves import Y_LABEL_WIDTH, Curves, nice_ticks, tick_label


def test_ticks_are_round_and_whole_on_the_step_axis():
    ticks = nice_ticks(10, 928, 5, integer=True)
    assert ticks == [200, 400, 600, 800] and all(float(t).is_integer() for t in ticks)
    assert nice_ticks(0, 7, 5, integer=True) == [0, 2, 4, 6]  # never 1.4, 2.8, ...
    assert {len(tick_label(v)) for v in (0.001234, 1.5, 1234.5, -0.2)} == {Y_LABEL_WIDTH}


@aio
async def test_detail_curves_label_steps_keep_the_legend_outside_and_w_switches_to_time(make_app):
    app, _ = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: "train loss" in app.screen.data.series)
        await pilot.pause()
        plot = app.screen.query_one("#loss", Curves)
        text = plot.render().plain
        lines = text.splitlines()
        assert "step" in lines[-2] or "step" in text
        assert "train loss" in lines[-1] and "val loss" in lines[-1]  # the legend's own line
        assert "92.8" not in text and not any(c in text for c in "L⅃")
        await pilot.press("w")
        await pilot.pause()
        assert "seconds since start" in plot.render().plain


def test_a_long_legend_takes_lines_up_to_a_third_of_the_plot_and_says_what_is_left_out():
    from rich.text import Text

    plot = Curves()
    plot.entries = tuple(Text(f"━━ t{i} lr=0.0{i} hidden={i * 16} seed 0 ({i:06x})")
                         for i in range(1, 7))
    lines = [line.plain for line in plot.legend_lines(81, 2)]  # two entries to a line
    assert len(lines) == 2 and all(len(line) <= 81 for line in lines)
    assert lines[0] == "━━ t1 lr=0.01 hidden=16 seed 0 (000001)   ━━ t2 lr=0.02 hidden=32 seed 0 (000002)"
    assert lines[1].startswith("━━ t3 ") and lines[1].endswith("…")  # t5 and t6 are left out
    assert [line.plain.count("━━") for line in plot.legend_lines(130, 2)] == [3, 3]
