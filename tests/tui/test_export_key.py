"""`x` on a finished run's detail screen exports its model (a subprocess in the real
source); on a live run the key is greyed out and does nothing."""

from tui_helpers import aio, settle, until

from gridrun.tui.screens.detail import DetailScreen


async def open_row_with(app, pilot, statuses):
    table = app.main.table
    for row in range(table.row_count):
        table.move_cursor(row=row)
        if table.current.status in statuses:
            break
    run = table.current
    await pilot.press("enter")
    assert isinstance(app.screen, DetailScreen)
    return run


@aio
async def test_export_key_on_a_finished_run(make_app):
    app, src = make_app()
    noticed, notify = [], app.notify

    def recording(message, **kwargs):
        noticed.append(str(message))
        notify(message, **kwargs)

    app.notify = recording
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        run = await open_row_with(app, pilot, ("completed",))
        await pilot.press("x")
        await until(pilot, lambda: ("export_model", run.id) in src.actions)
        await until(pilot, lambda: any("parity ok" in m for m in noticed))


@aio
async def test_export_key_is_greyed_out_on_a_running_run(make_app):
    app, src = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await open_row_with(app, pilot, ("running",))
        assert app.screen.check_action("export_model", ()) is None
        await pilot.press("x")
        await pilot.pause()
        assert not [a for a in src.actions if a[0] == "export_model"]
