"""GPU memory in the interface: the machine panel shows, under each GPU, what the engine's
memory book says (gridrun's runs, other engines, others' processes, free), why the queue
waits for memory and the ledger's problem; a run's detail shows its budget and its peak
(tui/memory.py, widgets/panels.py, screens/detail.py)."""

import json
import os
import time
from dataclasses import replace

import pytest
from tui_helpers import aio, settle, until

from gridrun.runs.store import Store
from gridrun.spec import RunSpec, run_id
from gridrun.tui import demo
from gridrun.tui.memory import MEMORY, book
from gridrun.tui.source import GpuMemory, MemoryWait, RunMemory
from gridrun.tui.store_source import StoreSource

GIB = 1 << 30
LEDGER = "the GPU ledger /dev/shm/gridrun-ledger cannot be written: Permission denied"
STATE = {"mode": "auto",
         "gpus": [{"gpu": 0, "total": 80 * GIB, "ours": 24 * GIB, "runs": 3, "others": 8 * GIB,
                   "foreign": 20 * GIB, "free": 28 * GIB},
                  {"gpu": 1, "total": 80 * GIB, "ours": 0, "runs": 0, "others": 0, "foreign": 0,
                   "free": None}],
         "waits": {"run_id": "3f2a9c01bd", "need": 40 * GIB, "free": 28 * GIB, "others": 8 * GIB},
         "ledger": LEDGER}
GPU0 = GpuMemory(ours=24 * GIB, runs=3, engines=8 * GIB, others=20 * GIB, free=28 * GIB)


def spec(seed: int) -> RunSpec:
    trainer = {"lr": 1e-3, "epochs": 2, "batch_size": 32}
    return RunSpec(id=run_id("exp", "spirals", trainer, {"hidden": 16}, seed), experiment="exp",
                   variant="lr=0.001", seed=seed, task="spirals", trainer=trainer,
                   task_args={"hidden": 16}, axes={"lr": 1e-3})


# ---- the source: the store's state as rows ------------------------------------------------


def running_engine(root) -> None:
    """engine.pid naming this process: a running engine to the source."""
    from gridrun.engine.backends.child import process_start_time

    pid = os.getpid()
    (root / "engine.pid").write_text(json.dumps({
        "pid": pid, "start_time": process_start_time(pid), "started_at": time.time(),
        "state": "running"}))


def telemetry(store, t: float) -> None:
    store.record_telemetry({"t": t, "gpus": [
        {"index": i, "uuid": f"GPU-000{i}", "name": "H100", "mem_total_bytes": 80 * GIB}
        for i in range(2)], "system": {}}, t=t)


def test_the_source_reads_the_book_of_a_running_engine(tmp_path):
    with Store(tmp_path) as store:
        telemetry(store, 1.0)
        store.set_state(MEMORY, STATE)
    src = StoreSource(tmp_path)
    m = src.poll().machine
    assert [g.memory for g in m.gpus] == [None, None] and m.memory_wait is None  # not running
    running_engine(tmp_path)
    m = src.poll().machine  # the same sample: the book alone makes a new machine
    assert m.gpus[0].memory == GPU0
    assert m.gpus[1].memory == GpuMemory(ours=0, runs=0, engines=0, others=0, free=None)
    assert m.memory_wait == MemoryWait("3f2a9c01bd", need=40 * GIB, free=28 * GIB, engines=8 * GIB)
    assert m.ledger == LEDGER
    assert src.poll().machine is None  # nothing changed
    with Store(tmp_path) as store:  # the engine cleared it (it stopped, or packs no more)
        store.set_state(MEMORY, None)
    m = src.poll().machine
    assert [g.memory for g in m.gpus] == [None, None] and not m.memory_wait and not m.ledger


def test_a_uuid_names_the_gpu_as_telemetry_does():
    gpus = book({"mode": "auto", "gpus": [{**STATE["gpus"][0], "gpu": "GPU-0000"}]}).gpus
    assert gpus == {"GPU-0000": GPU0}


def test_under_slots_only_the_gpus_other_engines_hold_show_memory():
    slots = {**STATE, "mode": "slots", "waits": None, "ledger": None}
    got = book(slots)
    assert set(got.gpus) == {0} and got.wait is None and got.ledger == ""


@pytest.mark.parametrize("state", [
    None, [], "x", {"gpus": "x"}, {"mode": "auto", "gpus": [None, 3, {"gpu": None}, {"ours": 1}]},
    {"waits": 7, "ledger": 3}])
def test_garbage_is_left_out(state):
    got = book(state)
    assert not got.gpus and got.wait is None and got.ledger == ""


def test_bad_numbers_read_as_unknown():
    gpu = {"gpu": 0, "ours": "lots", "runs": True, "others": -1, "foreign": float("nan"),
           "free": -2 * GIB}  # free below 0: more is committed than there is
    assert book({"mode": "auto", "gpus": [gpu]}).gpus[0] == GpuMemory(runs=0, free=0)
    busy = book({"waits": {"run_id": "abc", "busy": "the GPU ledger is locked"}}).wait
    assert busy == MemoryWait("abc", busy="the GPU ledger is locked")
    assert book({"waits": {"need": None}}).wait == MemoryWait("?")


def test_detail_reads_a_runs_budget_peak_need_and_retry(tmp_path):
    a, b = spec(0), spec(1)
    with Store(tmp_path) as store:
        store.enqueue([a, b])
        store.set_placement(a.id, {"backend": "local", "budget_bytes": 6 * GIB,
                                   "commit_bytes": 6 * GIB})
        store.transition(a.id, "queued", "completed", summary={
            "status": "completed", "step": 40, "peak_memory_bytes": int(2.5 * GIB),
            "peak_reserved_bytes": int(3.1 * GIB), "memory_needed_bytes": int(5.2 * GIB)},
            adjustments=[{"kind": "budget", "t": 1.0, "budget_bytes": [4 * GIB, 6 * GIB]}])
        store.transition(b.id, "queued", "completed", summary={"status": "completed", "step": 40})
    src = StoreSource(tmp_path)
    assert src.detail(a.id).memory == RunMemory(budget=6 * GIB, peak=int(3.1 * GIB),
                                                needed=int(5.2 * GIB), retried=6 * GIB)
    assert src.detail(b.id).memory is None  # neither a budget nor a peak: no line


# ---- the panel and the detail line --------------------------------------------------------


def with_book(n: int = 12):
    """The demo source whose machine carries the book: GPU 0 shared, GPU 1 empty, a run
    waiting for memory, and the ledger's problem."""
    src = demo.source(n)
    first = src._snapshots[0]
    gpus = (replace(first.machine.gpus[0], memory=GPU0),
            replace(first.machine.gpus[1], memory=GpuMemory(0, 0, 0, 0, 80 * GIB)))
    machine = replace(first.machine, gpus=gpus, ledger=LEDGER,
                      memory_wait=MemoryWait("3f2a9c01bd", need=40 * GIB, free=80 * GIB))
    src._snapshots[0] = replace(first, machine=machine)
    return src


@aio
async def test_the_panel_shows_each_gpus_memory_in_80_columns(make_app):
    app, _ = make_app(source=with_book())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        panel = app.main.query_one("#machine")
        lines = str(panel.render()).splitlines()
        height = panel.size.height
    assert height == 6, lines
    assert lines[1] == "     mem gridrun 24.0 GiB (3) · engines 8.0 · others 20.0 · free 28.0 GiB"
    assert lines[3] == "     mem gridrun 0.0 GiB (0) · engines 0.0 · others 0.0 · free 80.0 GiB"
    assert lines[4] == "waits: 3f2a9c01bd needs 40.0 GiB free, most free 80.0"
    assert lines[5] == LEDGER
    assert lines[0].startswith("gpu0 ") and lines[2].startswith("gpu1 ")
    assert all(len(lines[i]) <= 78 for i in (1, 3, 4))  # the panel's width, less its padding


@aio
async def test_with_more_gpus_than_fit_the_notes_stay(make_app):
    src = with_book()
    first = src._snapshots[0]
    gpus = tuple(replace(first.machine.gpus[0], index=i) for i in range(4))
    src._snapshots[0] = replace(first, machine=replace(first.machine, gpus=gpus))
    app, _ = make_app(source=src)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        lines = str(app.main.query_one("#machine").render()).splitlines()
    assert [line[:5] for line in lines] == ["gpu0 ", "     ", "gpu1 ", "     ", "waits", "the G"]


@aio
async def test_without_the_book_the_panel_is_as_before(make_app):
    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        panel = app.main.query_one("#machine")
        lines = str(panel.render()).splitlines()
        assert not panel.has_class("-book") and panel.size.height == 2
    assert [line[:5] for line in lines] == ["gpu0 ", "gpu1 "]


def test_the_panel_with_the_book(snap_compare, make_app):
    app, _ = make_app(source=with_book(40))
    assert snap_compare(app, terminal_size=(80, 24), run_before=settle)


@aio
async def test_the_detail_shows_the_budget_and_the_peak(make_app):
    from textual.widgets import Static

    app, src = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        shown = app.main.table.current.id
        src._details[shown] = replace(src._details[shown], memory=RunMemory(
            budget=4 * GIB, peak=3.1 * GIB, needed=5.2 * GIB, retried=6 * GIB))
        await pilot.press("enter")
        await until(pilot, lambda: "memory:" in str(app.screen.query_one("#summary", Static).render()))
        text = str(app.screen.query_one("#summary", Static).render())
    assert "memory: budget 4.0 GiB · peak 3.1 GiB · needed 5.2 GiB · retried with 6.0 GiB" in text


@aio
async def test_a_run_without_budget_or_peak_has_no_memory_line(make_app):
    from textual.widgets import Static

    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: "parameters" in str(app.screen.query_one("#summary", Static).render()))
        text = str(app.screen.query_one("#summary", Static).render())
    assert "memory:" not in text
