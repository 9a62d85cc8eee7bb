"""The work an update costs follows what changed, not how many rows there are."""

from dataclasses import replace

from textual.widgets import Footer
from textual.widgets._footer import FooterKey
from tui_helpers import aio, settle

from gridrun.tui.widgets import runs_table


def _cancel_disabled(app) -> bool:
    key = next(k for k in app.main.query(FooterKey) if k.action == "cancel")
    return key.has_class("-disabled")


@aio
async def test_footer_rebuilds_only_when_a_key_changes(make_app):
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        footer = app.main.query_one(Footer)
        builds = []
        compose = footer.compose
        footer.compose = lambda: (builds.append(1), compose())[1]
        table = app.main.table
        current = table.current
        assert current.status == "completed" and _cancel_disabled(app)
        others = [r for r in table.runs.values() if r.status == "running"]
        for k in range(3):  # a tick of progress elsewhere: the same keys apply
            app.main.runs_changed(tuple(replace(r, step=r.step + k + 1) for r in others))
            await pilot.pause()
        assert builds == []
        app.main.runs_changed((replace(current, status="running", ended_at=None),))
        await pilot.pause()
        assert builds == [1] and not _cancel_disabled(app)  # the run under the cursor can be cancelled


@aio
async def test_footer_follows_the_cursor(make_app):
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        assert table.current.status == "completed" and _cancel_disabled(app)
        rows = [table.runs[r.key.value] for r in table.ordered_rows]
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
        late = tuple(replace(some, id=i, status="queued", queued_at=some.queued_at + 1e6)
                     for i in ("zz-first", "aa-second"))
        app.main.runs_changed(late)
        await settle(pilot)
        before = [r.key.value for r in table.ordered_rows]
        assert before[-2:] == ["zz-first", "aa-second"]
        for _ in range(len(runs_table.SORTABLE) + 1):  # every column, then queue order again
            await pilot.press("s")
        await settle(pilot)
        after = [r.key.value for r in table.ordered_rows]
        assert table.sort_column is None and after.index("zz-first") < after.index("aa-second")


@aio
async def test_new_rows_are_not_measured(make_app, monkeypatch):
    import textual.widgets._data_table as data_table

    calls = []
    measure = data_table.measure
    monkeypatch.setattr(data_table, "measure", lambda *a, **k: (calls.append(1), measure(*a, **k))[1])
    app, _ = make_app(500)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.main.table
        assert table.row_count == 500
        assert len(calls) < len(runs_table.COLUMNS) * 2  # the header labels, not 7,000 cells
        width = sum(c.get_render_width(table) for c in table.columns.values())
        assert tuple(table.virtual_size) == (width, 500 + 1)  # every row, and the header
