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
