"""The run detail follows its run: status, output and summary until it ends, then
its final state; Output and Config scroll and search; a queued run says where it
stands in the queue; the summary reads as dates, durations, MiB and units."""

from __future__ import annotations

from dataclasses import replace

from tui_helpers import aio, settle, until

from gridrun.tui.bridge import RunsChanged
from gridrun.tui.screens.detail import DetailScreen
from gridrun.tui.source import RunDetail
from gridrun.tui.widgets.textview import TextView

OUTPUT = "".join(f"step {s} loss {1 / s:.4f}\n" for s in range(1, 121))
FINAL = "final eval: accuracy 0.9412 loss 0.1873"


def output_of(app) -> TextView:
    return app.screen.query_one("#output", TextView)


def open_on(app, status):
    table = app.main.table
    table.move_cursor(row=next(i for i, k in enumerate(table.order) if table.runs[k].status == status))
    return table.current


@aio
async def test_detail_of_a_running_run_shows_completed_and_the_final_eval(make_app):
    app, src = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        run = open_on(app, "running")
        src._output[run.id] = OUTPUT
        await pilot.press("enter")
        assert isinstance(app.screen, DetailScreen)
        await until(pilot, lambda: output_of(app).line_count >= 120)
        assert "running" in str(app.screen.query_one("#title").render())
        # the run ends: its last lines and summary are written, the store row says completed
        src._output[run.id] = OUTPUT + FINAL + "\n"
        src._details[run.id] = RunDetail({"lr": 0.001}, {"status": "completed",
                                                         "ended_at": 1_767_000_100.0,
                                                         "wall_time_s": 754.2,
                                                         "peak_memory_bytes": 270225408,
                                                         "samples_per_s": 5210.4}, None)
        app.post_message(RunsChanged((replace(run, status="completed", ended_at=run.started_at + 60),)))
        await until(pilot, lambda: "completed" in str(app.screen.query_one("#title").render()))
        await until(pilot, lambda: FINAL in output_of(app).lines)
        summary = str(app.screen.query_one("#summary").render())
        assert "754" not in summary and "12m 34s" in summary  # a duration
        assert "258.1 MiB" in summary or "257.7 MiB" in summary
        assert "5,210 samples/s" in summary and "2025-12-29" in summary  # a rate, a date


@aio
async def test_output_scrolls_follows_and_finds(make_app):
    app, src = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        run = open_on(app, "completed")
        src._output[run.id] = OUTPUT + FINAL + "\n"
        await pilot.press("enter")
        await pilot.press("tab")  # curves -> output tab
        await until(pilot, lambda: output_of(app).line_count >= 121)
        view = output_of(app)
        await pilot.pause()
        assert app.focused is view
        assert view.following and view.scroll_offset.y > 0  # at the tail: the final eval shows
        await pilot.press("g")
        assert view.scroll_offset.y == 0
        await pilot.press("j", "j", "pagedown")
        assert view.scroll_offset.y > 2
        await pilot.press("G")
        await pilot.pause()
        assert view.scroll_offset.y == view.max_scroll_y
        await pilot.press("g", "slash", *"step 77 ", "enter")
        await pilot.pause()
        assert view.match == 76 and view.scroll_offset.y <= 76 < view.scroll_offset.y + view.size.height
        await pilot.press("slash", *"loss 0.0", "enter", "n")
        first = view.match
        await pilot.press("n")
        assert view.match > first
        await pilot.press("N")
        assert view.match == first
        # scrolled up, new output does not pull the view down
        await pilot.press("g")
        src._output[run.id] = OUTPUT + FINAL + "\nmore\n"
        await until(pilot, lambda: "more" in view.lines)
        assert view.scroll_offset.y == 0
        await pilot.press("tab", "tab")  # summary, then config
        assert app.focused is app.screen.query_one("#config", TextView)


@aio
async def test_queued_run_detail_says_where_it_is_in_the_queue(make_app):
    app, _ = make_app(24)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        run = open_on(app, "queued")
        await pilot.press("enter")
        await pilot.pause()
        text = str(app.screen.query_one("#waiting").render())
        queued = [r for r in app.main.table.runs.values() if r.status == "queued"]
        assert f"of {len(queued)}" in text and "position" in text and "free slot" in text
        assert not app.screen.query_one("#plots").display
        app.main.engine_changed(replace(app.main.engine, running=False))
        app.screen.show_waiting()
        assert "engine" in str(app.screen.query_one("#waiting").render())
        assert run.id in str(app.screen.query_one("#title").render())


@aio
async def test_a_run_removed_under_its_detail_stops_being_read(make_app):
    from gridrun.tui.bridge import RunsRemoved

    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        run = open_on(app, "failed")
        await pilot.press("enter")
        await pilot.pause()
        app.post_message(RunsRemoved((run.id,)))
        await until(pilot, lambda: "removed from the store" in str(app.screen.query_one("#title").render()))
        assert run.id not in app.main.table.runs and isinstance(app.screen, DetailScreen)
        await pilot.pause(1.2)  # a reader tick later: no error
        assert not [n for n in app._notifications if n.severity == "error"]
