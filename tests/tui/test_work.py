"""The work an update costs follows what changed, not how many rows there are."""

from dataclasses import replace

from tui_helpers import aio, settle

from gridrun.tui.widgets import columns
from gridrun.tui.widgets.keys import KeyBar


def _cancel_disabled(app) -> bool:
    return not app.main.query_one(KeyBar).enabled("cancel")


@aio
async def test_footer_repaints_only_when_a_key_changes(make_app):
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        bar = app.main.query_one(KeyBar)
        start = bar.changes
        table = app.main.table
        current = table.current
        assert current.status == "completed" and _cancel_disabled(app)
        others = [r for r in table.runs.values() if r.status == "running"]
        for k in range(3):  # a tick of progress elsewhere: the same keys apply
            app.main.runs_changed(tuple(replace(r, step=r.step + k + 1) for r in others))
            await pilot.pause()
        assert bar.changes == start
        app.main.runs_changed((replace(current, status="running", ended_at=None),))
        await pilot.pause()
        assert bar.changes == start + 1 and not _cancel_disabled(app)  # the run under the cursor can be cancelled


@aio
async def test_footer_follows_the_cursor(make_app):
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        assert table.current.status == "completed" and _cancel_disabled(app)
        rows = [table.runs[i] for i in table.order]
        steps = next(i for i, r in enumerate(rows) if r.status == "running")
        await pilot.press(*["j"] * steps)
        await settle(pilot)
        assert table.current.status == "running" and not _cancel_disabled(app)


@aio
async def test_queue_order_after_sorting_keeps_the_file_order(make_app):
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        some = next(iter(table.runs.values()))
        # two runs queued together (same moment, same priority), ids not in file order
        late = tuple(replace(some, id=i, status="queued", priority=0, queued_at=some.queued_at + 1e6)
                     for i in ("zz-first", "aa-second"))
        app.main.runs_changed(late)
        await settle(pilot)
        before = list(table.order)
        assert before[-2:] == ["zz-first", "aa-second"]
        from gridrun.tui.screens.sort import CHOICES
        for column in (*columns.SORTABLE, None):  # every column, then queue order again
            await pilot.press("s", CHOICES[column][0])
        await settle(pilot)
        after = list(table.order)
        assert table.sort_column is None and after.index("zz-first") < after.index("aa-second")


@aio
async def test_a_tick_renders_only_visible_changed_lines(make_app):
    app, _ = make_app(500)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        assert table.row_count == 500
        assert tuple(table.virtual_size)[1] == 500 + 1  # every row, and the header
        running = [r for r in table.runs.values() if r.status == "running"]
        visible = {table.order[i] for i in range(table.scrollable_content_region.height - 1)}
        rendered = table.lines_rendered
        app.main.runs_changed(tuple(replace(r, step=r.step + 1) for r in running))
        await pilot.pause()
        assert len(running) > 50
        assert table.lines_rendered - rendered == len(visible & {r.id for r in running})
        rendered = table.lines_rendered
        await pilot.press("j", "j", "k")  # the cursor moves: its lines come from the cache
        await pilot.pause()
        assert table.lines_rendered == rendered


@aio
async def test_a_line_rendered_at_another_width_is_rendered_once_at_the_new_one(make_app):
    # The table's first frame can come before its scrollbar takes two columns.
    # Textual's LRUCache.set keeps an existing key's value, so the line of the
    # old width stayed cached and was rendered again on every paint.
    app, _ = make_app(500)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        table.render_line(1)
        stale = table._lines.get(table.order[0])
        table._lines.discard(table.order[0])
        table._lines.set(table.order[0], stale.adjust_cell_length(stale.cell_length + 2))
        rendered = table.lines_rendered
        for _ in range(3):
            assert table.render_line(1).cell_length == stale.cell_length
        assert table.lines_rendered == rendered + 1
