"""Every action echoes: refused keys say why, dialogs keep the cursor and the marks,
priority moves the row and says the new value, rm (x) asks and removes; the filter
closes on enter and the header counts what it shows; g draws group rows; s sorts
from a menu and shows the top; state persists per root."""

from __future__ import annotations

from tui_helpers import aio, settle, until

from gridrun.tui import demo, state
from gridrun.tui.app import GridrunApp
from gridrun.tui.screens.dialogs import Confirm, RemoveConfirm
from gridrun.tui.screens.sort import SortMenu
from gridrun.tui.widgets.columns import GROUP
from gridrun.tui.widgets.panels import StatusHeader


def messages(app) -> list[str]:
    return [n.message for n in app._notifications]


def row_of(table, status: str, nth: int = 0) -> int:
    return [table.position[i] for i in table.run_order if table.runs[i].status == status][nth]


@aio
async def test_refused_keys_say_why(make_app):
    app, src = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        table.move_cursor(row=row_of(table, "completed"))
        await pilot.press("c")
        await pilot.pause()
        assert not isinstance(app.screen, Confirm) and src.actions == []
        assert any("only queued or running runs can be cancelled" in m for m in messages(app))
        await pilot.press("plus", "r", "v")
        await pilot.pause()
        text = "\n".join(messages(app))
        assert "only queued runs" in text and "r retries" in text and "mark runs with space" in text


@aio
async def test_cancel_dialog_keeps_cursor_and_marks_and_sits_by_the_footer(make_app):
    app, src = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        first, second = row_of(table, "running"), row_of(table, "queued", 1)
        table.move_cursor(row=first)
        await pilot.press("space")
        table.move_cursor(row=second)
        await pilot.press("space")
        marked = set(table.marked)
        table.move_cursor(row=second + 2)
        cursor_run = table.current.id
        await pilot.press("c")
        assert isinstance(app.screen, Confirm)
        dialog = app.screen.query_one(".dialog")
        assert dialog.region.bottom >= app.screen.size.height - 3  # anchored near the footer
        await pilot.press("y")
        await until(pilot, lambda: src.actions)
        await settle(pilot, 2)
        app.nudge()
        await pilot.pause(0.1)
        assert table.current.id == cursor_run and table.marked == marked


@aio
async def test_priority_moves_the_row_and_says_the_new_value(make_app):
    app, src = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        last_queued = [i for i in table.run_order if table.runs[i].status == "queued"][-1]
        table.move_cursor(row=table.position[last_queued])
        before = table.position[last_queued]
        await pilot.press("plus")
        await until(pilot, lambda: len(src.actions) == 1)
        app.nudge()
        await until(pilot, lambda: table.runs[last_queued].priority == 1)
        await pilot.press("plus")
        await until(pilot, lambda: len(src.actions) == 2)
        app.nudge()
        await until(pilot, lambda: table.runs[last_queued].priority == 2)
        await pilot.pause()
        assert table.position[last_queued] < before and table.current.id == last_queued
        assert any(f"priority of {last_queued}: 2" in m for m in messages(app))


@aio
async def test_x_removes_after_asking(make_app):
    app, src = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        table.move_cursor(row=row_of(table, "failed"))
        run = table.current.id
        await pilot.press("x")
        assert isinstance(app.screen, RemoveConfirm)
        await pilot.press("n")
        assert src.actions == []
        await pilot.press("x", "D")
        await until(pilot, lambda: src.actions)
        assert src.actions == [("remove", (run,), True)]
        app.nudge()
        await until(pilot, lambda: run not in table.runs)
        table.move_cursor(row=row_of(table, "running"))
        await pilot.press("x")
        assert not isinstance(app.screen, RemoveConfirm)
        assert any("cancel it first" in m for m in messages(app))


@aio
async def test_filter_closes_on_enter_and_the_header_counts(make_app):
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("slash", *"failed", "enter")
        box = app.main.query_one("#filter")
        assert not box.display and app.main.table.row_count == 3
        header = str(app.main.query_one(StatusHeader).render())
        assert "3 of 24 shown" in header
        await pilot.press("escape")
        assert app.main.table.row_count == 24
        assert "shown" not in str(app.main.query_one(StatusHeader).render())


@aio
async def test_g_draws_group_rows_with_counts(make_app):
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        await pilot.press("g")
        await pilot.pause()
        groups = [i for i in table.order if i.startswith(GROUP)]
        assert [g[1:] for g in groups] == ["lr-sweep", "tricks", "widths"]
        line = table.render_line(1 + table.position[groups[0]] - table.scroll_offset.y).text
        n = sum(r.experiment == "lr-sweep" for r in table.runs.values())
        assert "lr-sweep" in line and f"{n} runs" in line and "✓" in line
        await pilot.press("home")
        assert table.current is not None  # the cursor skips header rows


@aio
async def test_sort_menu_goes_to_the_top_and_shows_the_column(make_app):
    app, _ = make_app(40)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        table = app.main.table
        await pilot.press("end")
        assert table.scroll_offset.y > 0
        await pilot.press("s")
        assert isinstance(app.screen, SortMenu)
        await pilot.press("r")  # priority: off-screen at 80 columns
        await pilot.pause()
        assert table.sort_column == "prio" and table.cursor_row == 0 and table.scroll_offset.y == 0
        assert "prio" in table.columns and "status" in table.columns and "id" in table.columns
        assert "▲" in table.render_line(0).text
        await pilot.press("left", "left", "left")
        await pilot.press("right")
        assert table.skip > 0 and "status" in table.columns and "id" in table.columns


@aio
async def test_right_reaches_prio_in_two_presses_at_80_columns(make_app):
    app, _ = make_app(40)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        table = app.main.table
        await pilot.pause()
        assert "prio" not in table.columns
        await pilot.press("right", "right")
        await pilot.pause()
        table.render_line(0)
        assert "prio" in table.columns and list(table.columns)[:3] == ["mark", "status", "id"]


@aio
async def test_filter_sort_group_marks_and_cursor_survive_quit_and_reopen(tmp_path):
    src = demo.source(24)
    src.root = tmp_path
    app = GridrunApp(src, clock=lambda: demo.NOW, live=False, persist=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        await pilot.press("slash", *"lr-sweep", "enter", "s", "l", "g")
        await pilot.pause()
        await pilot.press("home", "space", "j", "j")
        marked, cursor = set(table.marked), table.current.id
        await pilot.press("q")
    assert (tmp_path / state.FILE).exists()

    src = demo.source(24)
    src.root = tmp_path
    app = GridrunApp(src, clock=lambda: demo.NOW, live=False, persist=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        assert table.needle == "lr-sweep" and table.sort_column == "loss" and table.grouped
        assert table.marked == marked and table.current.id == cursor
        assert "of 24 shown" in str(app.main.query_one(StatusHeader).render())


@aio
async def test_a_corrupt_state_file_is_ignored_with_a_notification(tmp_path):
    (tmp_path / state.FILE).write_text("{not json")
    src = demo.source(24)
    src.root = tmp_path
    app = GridrunApp(src, clock=lambda: demo.NOW, live=False, persist=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.main.table.row_count == 24
        assert any("ignored" in m and state.FILE in m for m in messages(app))
