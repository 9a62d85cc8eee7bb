"""The real source over a real SQLite store and real run folders (no torch, no engine)."""

import json

from tui_helpers import aio, settle, until

from gridrun.runs import layout
from gridrun.runs.runlog import MetricsWriter
from gridrun.runs.store import Store
from gridrun.spec import RunSpec, run_id
from gridrun.tui.app import GridrunApp
from gridrun.tui.store_source import StoreSource


def spec(seed: int, lr: float = 1e-3) -> RunSpec:
    trainer = {"lr": lr, "epochs": 2, "batch_size": 32}
    return RunSpec(id=run_id("exp", "spirals", trainer, {"hidden": 16}, seed), experiment="exp",
                   variant=f"lr={lr:g}", seed=seed, task="spirals", trainer=trainer,
                   task_args={"hidden": 16}, axes={"lr": lr})


def test_poll_reads_only_what_changed(tmp_path):
    with Store(tmp_path) as store:
        store.enqueue([spec(0), spec(1)])
    src = StoreSource(tmp_path)
    first = src.poll()
    assert sorted(r.seed for r in first.runs) == [0, 1]
    assert first.engine.counts == {"queued": 2} and not first.engine.running
    again = src.poll()
    assert again.runs == () and again.engine is None
    a = spec(0).id
    assert src.cancel([a]).startswith(f"{a}: cancelled")
    changed = src.poll()
    assert [(r.id, r.status) for r in changed.runs] == [(a, "cancelled")]


def test_running_run_follows_its_metrics_log(tmp_path):
    s = spec(0)
    with Store(tmp_path) as store:
        store.enqueue([s])
        store.transition(s.id, "queued", "running", slot="cpu0", started_at=1.0)
    folder = layout.make_private_dir(layout.run_dir(tmp_path, "exp", s.id))
    src = StoreSource(tmp_path)
    assert src.poll().runs[0].step == 0
    with MetricsWriter(folder / layout.METRICS) as w:
        w.write({"t": 1, "step": 0, "epoch": 0, "split": "start", "total_steps": 40})
    assert src.poll().runs[0].total_steps == 40  # a bar from the start, not at the end
    with MetricsWriter(folder / layout.METRICS) as w:
        w.write({"t": 2, "step": 10, "epoch": 0, "split": "train", "loss": 0.5, "samples_per_s": 900})
        w.write({"t": 3, "step": 20, "epoch": 1, "split": "val", "loss": 0.4, "accuracy": 0.8})
    row = src.poll().runs[0]
    assert (row.step, row.epoch, row.train_loss, row.samples_per_s) == (20, 1, 0.5, 900)
    assert (row.best_name, row.best, row.total_steps) == ("loss", 0.4, 40)
    assert src.poll().runs == ()  # nothing new, nothing sent
    records, offset = src.metrics(s.id, 0)
    assert [r["step"] for r in records] == [0, 10, 20]
    assert src.metrics(s.id, offset) == ([], offset)


def test_telemetry_becomes_gpu_rows(tmp_path):
    with Store(tmp_path) as store:
        store.record_telemetry({"t": 5.0, "gpus": [{"index": 0, "name": "H100", "util_percent": 70,
                                                   "mem_used_bytes": 1, "mem_total_bytes": 2}],
                                "system": {"cpu_percent": 12.0},
                                "processes": [{"pid": 1, "gpu": 0, "run_id": "abc"}]}, t=5.0)
    m = StoreSource(tmp_path).poll().machine
    assert m.gpus[0].name == "H100" and m.gpus[0].runs == ("abc",) and m.gpus[0].history == (70,)
    assert m.cpu_percent == 12.0


def test_clone_queues_a_new_cell(tmp_path):
    with Store(tmp_path) as store:
        store.enqueue([spec(0)])
    src = StoreSource(tmp_path)
    assert "queued clone" in src.clone(spec(0).id, "lr=0.01")
    with Store(tmp_path) as store:
        runs = store.list_runs()
    clone = next(r for r in runs if r.id != spec(0).id)
    assert clone.config["trainer"]["lr"] == 0.01 and clone.variant == "lr=0.01"
    assert clone.id == spec(0, lr=0.01).id  # the same cell a matrix would give


@aio
async def test_keys_write_intents_into_the_store(tmp_path):
    with Store(tmp_path) as store:
        store.enqueue([spec(0), spec(1)])
    app = GridrunApp(StoreSource(tmp_path), live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        first = app.main.table.current.id
        await pilot.press("plus")
        await pilot.press("c", "y")
        await pilot.press("p")
        await app.workers.wait_for_complete()
        with Store(tmp_path) as store:
            await until(pilot, lambda: store.paused)
            run = store.get_run(first)
            assert run.priority == 1 and run.status == "cancelled"
            kinds = [i.kind for i in store.intents()]
        assert kinds == ["priority", "cancel", "pause"]
        app.nudge()  # poll again: the table shows the store's new state
        await until(pilot, lambda: app.main.table.runs[first].status == "cancelled")
        await pilot.press("r")
        await app.workers.wait_for_complete()
        with Store(tmp_path) as store:
            assert store.get_run(first).status == "queued"


def test_detail_and_output_tail(tmp_path):
    s = spec(0)
    with Store(tmp_path) as store:
        store.enqueue([s])
        store.transition(s.id, "queued", "failed", error="ValueError: boom",
                         summary={"status": "failed", "traceback": "Traceback...\nValueError: boom"})
    folder = layout.make_private_dir(layout.run_dir(tmp_path, "exp", s.id))
    (folder / layout.OUTPUT).write_text("x" * 10_000 + "last line\n")
    src = StoreSource(tmp_path)
    d = src.detail(s.id)
    assert d.config["lr"] == 1e-3 and "boom" in d.summary["traceback"] and d.error
    assert src.output_tail(s.id, 100).endswith("last line\n")
    assert len(src.output_tail(s.id, 100)) == 100
    assert json.dumps(d.summary)


def lost_queue_root(tmp_path):
    """Run folders with no store beside them: the queue was lost (a deleted or truncated gridrun.db)."""
    from gridrun.spec import write_run_config

    for seed in (0, 1):
        folder = layout.make_private_dir(layout.run_dir(tmp_path, "exp", spec(seed).id))
        write_run_config(folder / layout.CONFIG, spec(seed))
    return tmp_path


def test_an_empty_store_beside_run_folders_is_noticed_once(tmp_path):
    src = StoreSource(lost_queue_root(tmp_path))
    first = src.poll()
    assert first.runs == () and "the store has no runs but" in first.notice
    assert "holds 2 run folders" in first.notice and "gridrun doctor --rebuild" in first.notice
    assert src.poll().notice is None


@aio
async def test_the_interface_shows_the_lost_queue_warning(tmp_path):
    app = GridrunApp(StoreSource(lost_queue_root(tmp_path)), live=False)
    noticed, notify = [], app.notify

    def recording(message, **kwargs):
        noticed.append((message, kwargs.get("severity")))
        notify(message, **kwargs)

    app.notify = recording
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await until(pilot, lambda: noticed)
        (text, severity), = noticed
        assert "holds 2 run folders" in text and severity == "warning"


def test_compare_by_source_over_run_folders(tmp_path):
    from test_bysource import build  # tests/ is on sys.path (conftest.py)

    build(tmp_path)
    with Store(tmp_path):
        pass
    src = StoreSource(tmp_path)
    table = src.compare_sources("src")
    assert table.columns[:3] == ("source", "seeds", "loss ↓ mean ± 95% CI")
    assert [r[0] for r in table.rows] == ["init", "order", "init+order", "all"]
    assert "(the others at the first seed)" in table.note
    assert "does not vary its sources" in src.compare_sources("plain").note


@aio
async def test_the_detail_says_a_run_was_resumed_in_another_environment(tmp_path):
    s = spec(0)
    change = {"field": "threads", "from": 2, "to": 1, "step": 6}
    with Store(tmp_path) as store:
        store.enqueue([s])
        store.transition(s.id, "queued", "completed",
                         summary={"status": "completed", "environment_changes": [change]})
    src = StoreSource(tmp_path)
    note = "resumed in another environment: threads 2 -> 1 at step 6"
    assert note in src.detail(s.id).notes
    app = GridrunApp(src)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.main.table.row_count == 1)
        await pilot.press("enter")
        await until(pilot, lambda: note in str(app.screen.query_one("#summary").render()))
