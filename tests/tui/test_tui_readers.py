"""The interface's reader is total (bad metrics lines, a garbage summary) and its CSV
export asks before it replaces a file and never writes through a symlink."""

import json

import pytest
from tui_helpers import aio, settle, until

from gridrun.runs import layout
from gridrun.runs.store import Store
from gridrun.spec import RunSpec, run_id, write_run_config
from gridrun.tui.screens.compare import CompareScreen
from gridrun.tui.screens.dialogs import Confirm
from gridrun.tui.store_source import StoreSource

LINES = [b'{"t": 1, "step": 0, "epoch": 0, "split": "start", "total_steps": 40}',
         b"123", b"[1,2]", b'"x"', b"{}", b'{"step": "3", "split": "train", "loss": 1.0}',
         b"\xff\xfe\x00garbage",
         b'{"t": 2, "step": 10, "epoch": 0, "split": "train", "loss": 0.5, "samples_per_s": 900}',
         b'{"t": 3, "step": 20, "epoch": 1, "split": "val", "loss": 0.4, "accuracy": 0.8}']
BAD = 6


def spec(seed: int) -> RunSpec:
    trainer = {"lr": 1e-3, "epochs": 2, "batch_size": 32}
    return RunSpec(id=run_id("exp", "spirals", trainer, {"hidden": 16}, seed), experiment="exp",
                   variant="", seed=seed, task="spirals", trainer=trainer,
                   task_args={"hidden": 16}, axes={})


def test_bad_lines_are_skipped_and_counted(tmp_path):
    s = spec(0)
    with Store(tmp_path) as store:
        store.enqueue([s])
        store.transition(s.id, "queued", "running", slot="cpu0", started_at=1.0)
    folder = layout.make_private_dir(layout.run_dir(tmp_path, "exp", s.id))
    write_run_config(folder / layout.CONFIG, s)
    (folder / layout.METRICS).write_bytes(b"\n".join(LINES) + b"\n")
    (folder / layout.SUMMARY).write_bytes(b"[1, 2]")
    src = StoreSource(tmp_path)
    row = src.poll().runs[0]
    assert (row.step, row.train_loss, row.best, row.total_steps) == (20, 0.5, 0.4, 40)
    records, _ = src.metrics(s.id, 0)
    assert [r["step"] for r in records] == [0, 10, 20]
    d = src.detail(s.id)
    assert d.summary is None
    note = f"{BAD} unreadable lines skipped in {folder / layout.METRICS}"
    assert d.notes == (note,)
    assert note in src.compare("exp").note


@pytest.mark.parametrize("summary", [[1, 2], {"best": [1], "early_stop_metric": 5, "step": "x"},
                                     {"metrics": "lower", "total_steps": {}}])
def test_a_garbage_summary_in_the_store_is_shown_without_a_crash(tmp_path, summary):
    s = spec(0)
    with Store(tmp_path) as store:
        store.enqueue([s])
        store.transition(s.id, "queued", "completed", summary=summary)
    src = StoreSource(tmp_path)
    row = src.poll().runs[0]
    assert row.status == "completed" and row.step == 0
    d = src.detail(s.id)
    assert json.dumps(d.summary) and not isinstance(d.summary, list)


def test_export_csv_refuses_an_existing_file_and_a_symlink(tmp_path):
    with Store(tmp_path) as store:
        store.enqueue([spec(0)])
    src = StoreSource(tmp_path)
    out = tmp_path / "out.csv"
    out.write_text("precious\n")
    with pytest.raises(FileExistsError, match="exists"):
        src.export_csv("exp", str(out))
    assert out.read_text() == "precious\n"
    assert src.export_csv("exp", str(out), force=True) == str(out)
    assert out.read_text().startswith("experiment,")
    link = tmp_path / "link.csv"
    link.symlink_to(out)
    with pytest.raises(ValueError, match="symbolic link"):
        src.export_csv("exp", str(link), force=True)


@aio
async def test_compare_export_over_a_file_asks_first(make_app, tmp_path):
    app, _ = make_app()
    out = tmp_path / "out.csv"
    out.write_text("precious\n")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("t")
        assert isinstance(app.screen, CompareScreen)
        await until(pilot, lambda: app.screen.shown is not None)
        for answer in ("n", "y"):
            await pilot.press("e")
            app.screen.query_one("Input").value = str(out)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, Confirm))
            assert str(out) in str(app.screen.question) and "replace" in str(app.screen.question)
            await pilot.press(answer)
            await app.workers.wait_for_complete()
            await settle(pilot)
            if answer == "n":
                assert out.read_text() == "precious\n"
        await until(pilot, lambda: out.read_text().startswith("lr,hidden,seeds"))
