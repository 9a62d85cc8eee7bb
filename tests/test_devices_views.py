"""The views show a run's devices (issue 38): `gridrun ls`'s DEV column, the runs
table's slot, the machine panel's runs on each GPU a run holds, and `gridrun compare`
telling runs on other device counts apart. With every run on one device, every view
reads as it did before."""

import asyncio

from test_analysis import make_run as run_folder
from test_engine_kit import make_run
from typer.testing import CliRunner

from gridrun.analysis import ablation, frames
from gridrun.analysis.devices import devices_of, members, reduce_of, slot_gpu_names, slot_gpus
from gridrun.analysis.rowtable import RowTable
from gridrun.analysis.runlist import run_lines
from gridrun.cli import app
from gridrun.runs.store import Store
from gridrun.tui.app import GridrunApp
from gridrun.tui.source import RunRow
from gridrun.tui.store_source import StoreSource
from gridrun.tui.widgets import columns, fmt
from gridrun.tui.widgets.panels import MachinePanel

GANG = "gpu0+gpu1"


def two_devices(**trainer):
    return make_run(experiment="e", seed=0, devices=2, accumulate=2, variant="two", **trainer)


def one_device(seed: int):
    return make_run(experiment="e", seed=seed, variant="one")


def store_with(root, specs, running=(), slot="cpu0+cpu1", telemetry=None):
    with Store(root) as store:
        store.enqueue(specs)
        for spec in running:
            store.transition(spec.id, "queued", "running", slot=slot, started_at=1.0, pid=4242)
        if telemetry is not None:
            store.record_telemetry(telemetry, t=telemetry["t"])
    return root


def ls(root) -> list[str]:
    done = CliRunner().invoke(app, ["ls", "--root", str(root)])
    assert done.exit_code == 0, done.output
    return done.output.splitlines()


# ---- what a run's trainer keys and slot say -------------------------------------------

def test_devices_and_slots_are_read_one_way():
    assert devices_of({"devices": 2}) == 2 and devices_of({}) == 1  # a run from before: one
    assert devices_of({"devices": "2"}) == 1 and devices_of({"devices": True}) == 1
    assert reduce_of({}) == "ddp" and reduce_of({"reduce": "invariant"}) == "invariant"
    assert members("gpu0.0+gpu1.1") == ("gpu0.0", "gpu1.1") and members(None) == ()
    assert slot_gpus(GANG) == (0, 1) and slot_gpus("gpu0.0+gpu1.1") == (0, 1)
    assert slot_gpus("gpu3") == (3,) and slot_gpus("gpu1.2") == (1,)
    assert slot_gpus("cpu0+cpu1") == () and slot_gpus("fg") == () and slot_gpus(None) == ()


def test_a_ray_slot_names_its_nodes_gpus():
    # every node has a gpu0: a GPU is its node and index, never its index alone
    assert slot_gpu_names("node2:gpu1") == ("node2:gpu1",) == slot_gpu_names("node2:gpu1.0")
    assert slot_gpu_names("node1:gpu0+node2:gpu0") == ("node1:gpu0", "node2:gpu0")
    assert slot_gpu_names("node2:gpu0.0+node2:gpu0.1") == ("node2:gpu0",)
    assert slot_gpu_names(GANG) == ("gpu0", "gpu1") and slot_gpu_names("gpu1.2") == ("gpu1",)
    assert slot_gpu_names("node2:cpu0") == () == slot_gpu_names("cpu0") == slot_gpu_names(None)
    assert slot_gpus("node2:gpu1") == ()  # an index alone would name every node's GPU 1


# ---- gridrun ls -----------------------------------------------------------------------

def test_ls_shows_dev_when_a_run_spans_several_devices(tmp_path):
    two, ones = two_devices(), [one_device(0), one_device(1)]
    lines = ls(store_with(tmp_path, [two, *ones], running=[two]))
    head = lines[0].split()
    assert head[:6] == ["ID", "STATUS", "EXPERIMENT", "VARIANT", "SEED", "DEV"]
    dev = {line.split()[0]: line.split()[5] for line in lines[1:]}
    assert dev == {two.id: "2", ones[0].id: "1", ones[1].id: "1"}
    at = lines[0].index("DEV")  # right-aligned under its header
    assert sorted(line[at:at + 3] for line in lines[1:]) == ["  1", "  1", "  2"]


def test_ls_without_a_run_on_several_devices_is_as_before(tmp_path):
    ones = [one_device(0), one_device(1)]
    lines = ls(store_with(tmp_path, ones))
    assert lines[0].split() == ["ID", "STATUS", "EXPERIMENT", "VARIANT", "SEED", "BEST", "NOTE"]
    assert lines == ["ID          STATUS  EXPERIMENT  VARIANT  SEED  BEST  NOTE",
                     f"{ones[0].id}  queued  e           one         0",
                     f"{ones[1].id}  queued  e           one         1"]
    assert "DEV" not in "\n".join(lines)


def test_ls_at_80_columns_cuts_lines_as_ever(tmp_path):
    two = two_devices()
    store_with(tmp_path, [two, one_device(0)], running=[two])
    with Store(tmp_path) as store:
        runs = store.list_runs()
    lines = run_lines(runs, lambda r: "a note long enough to be cut at the terminal's width " * 2,
                      80)
    assert all(len(line) <= 80 for line in lines) and lines[1].endswith("…")


# ---- the interface -------------------------------------------------------------------

def gpu(index: int, util: float) -> dict:
    return {"index": index, "name": "H100", "util_percent": util, "mem_used_bytes": 1 << 30,
            "mem_total_bytes": 80 << 30}


def telemetry(run_id: str) -> dict:
    # the engine knows the launched process (rank 0, on GPU 0); rank 1's it cannot name
    return {"t": 5.0, "gpus": [gpu(0, 90.0), gpu(1, 80.0)], "system": {"cpu_percent": 3.0},
            "processes": [{"pid": 4242, "gpu": 0, "run_id": run_id},
                          {"pid": 4243, "gpu": 1, "run_id": None}]}


def test_the_source_puts_a_run_on_every_gpu_its_slot_holds(tmp_path):
    two, one = two_devices(), one_device(0)
    root = store_with(tmp_path, [two, one], running=[two], slot=GANG, telemetry=telemetry(two.id))
    src = StoreSource(root)
    update = src.poll()
    assert [g.runs for g in update.machine.gpus] == [(two.id,), (two.id,)]
    assert {r.id: r.devices for r in update.runs} == {two.id: 2, one.id: 1}
    assert src.poll().machine is None  # nothing new: nothing sent
    with Store(root) as store:  # the run ends: its GPUs are free, with the same sample
        store.transition(two.id, "running", "completed", slot=None, ended_at=9.0)
    machine = src.poll().machine
    assert [g.runs for g in machine.gpus] == [(two.id,), ()]  # the process the engine last saw
    assert [g.history for g in machine.gpus] == [(90.0,), (80.0,)]  # no sample counted twice


def pilot_run(coro):
    return asyncio.run(coro)


async def settled(pilot, cond) -> None:
    for _ in range(250):
        if cond():
            break
        await pilot.pause(0.02)
    await pilot.pause()
    assert cond()


def test_the_machine_panel_and_the_runs_table_show_a_run_on_two_gpus(tmp_path):
    two, one = two_devices(), one_device(0)
    queued = make_run(experiment="e", seed=1, devices=2, accumulate=2, variant="two")
    root = store_with(tmp_path, [two, one, queued], running=[two], slot=GANG,
                      telemetry=telemetry(two.id))

    async def drive():
        gridrun = GridrunApp(StoreSource(root), live=False)
        async with gridrun.run_test(size=(180, 30)) as pilot:
            panel = gridrun.main.query_one(MachinePanel)
            await settled(pilot, lambda: "gpu1" in str(panel.render()))
            text = str(panel.render()).splitlines()
            assert text[0].startswith("gpu0") and text[0].endswith(two.id)
            assert text[1].startswith("gpu1") and text[1].endswith(two.id)
            table = gridrun.main.table
            await settled(pilot, lambda: len(table.order) == 3)
            assert table.columns["slot"] >= len(f"2× {GANG}")  # the gang's name whole
            rows = {run_id: table.render_line(table.position[run_id] + 1).text
                    for run_id in table.order}
            assert f"2× {GANG}" in rows[two.id] and "2×" in rows[queued.id]
            assert "×" not in rows[one.id]

    pilot_run(drive())


def test_a_slot_cell_says_how_many_devices_and_a_plain_one_stays():
    row = RunRow("a", "e", "", 0, "running", slot="cpu0")
    assert fmt.slot(row) == "cpu0" and columns.wants(row, columns.cells(row, 0.0, False)) == {
        "experiment": 1}
    gang = RunRow("b", "e", "", 0, "running", slot="gpu0.0+gpu1.1", devices=2)
    assert fmt.slot(gang) == "2× gpu0.0+gpu1.1"
    assert fmt.slot(RunRow("c", "e", "", 0, "completed", devices=4)) == "4×"
    plain = columns.fit(200, {"experiment": 8, "variant": 19})
    wide = columns.fit(200, {"experiment": 8, "variant": 19, "slot": 16})
    assert plain["slot"] == columns.WIDTHS["slot"] and wide["slot"] == 16
    assert columns.fit(200, {"experiment": 8, "variant": 19, "slot": 0}) == plain


# ---- gridrun compare -----------------------------------------------------------------

def grid_over_devices(root):
    for devices, losses in ((1, (0.30, 0.32)), (2, (0.40, 0.42))):
        for seed, loss in enumerate(losses):
            run_folder(root, "g", seed, trainer={"devices": devices, "accumulate": 2},
                       axes={"devices": devices}, variant=f"devices={devices}",
                       best={"loss": loss, "accuracy": 1 - loss})
    return root


def compare(root, *args) -> str:
    done = CliRunner().invoke(app, ["compare", *args, "--root", str(root)])
    assert done.exit_code == 0, done.output
    return done.output


def test_compare_a_grid_over_devices_shows_them_apart(tmp_path):
    text = compare(grid_over_devices(tmp_path), "g")
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["devices", "seeds"]
    assert lines[2].split()[:3] == ["1", "2", "0.310"]
    assert lines[3].split()[:3] == ["2", "2", "0.410"]


def test_runs_of_one_cell_on_other_device_counts_are_not_averaged_together(tmp_path):
    # `devices` edited in the file between two queues: the same cell, other runs
    for devices, loss in ((1, 0.3), (2, 0.5)):
        for seed in (0, 1):
            run_folder(tmp_path, "m", seed, trainer={"devices": devices, "accumulate": 2,
                                                     "lr": 0.1}, axes={"lr": 0.1},
                       variant="lr=0.1", best={"loss": loss + seed / 100})
    lines = compare(tmp_path, "m").splitlines()
    assert lines[0].split()[:2] == ["devices", "seeds"]
    assert [line.split()[:3] for line in lines[2:4]] == [["1", "2", "0.3050"], ["2", "2", "0.5050"]]
    table = ablation.ablation(frames.load_rows(tmp_path), "m", by=["lr"])  # asked: as asked
    assert table.attrs["keys"] == ["lr"] and len(table) == 1


def test_reduce_and_runs_from_before_devices(tmp_path):
    for reduce, seed in (("ddp", 0), ("invariant", 1)):
        run_folder(tmp_path, "r", seed, trainer={"devices": 2, "accumulate": 2, "reduce": reduce},
                   variant="two", best={"loss": 0.3})
    rows = frames.load_rows(tmp_path)
    table = ablation.ablation(rows, "r")
    assert [(r["reduce"], r["n"]) for r in table.rows] == [("ddp", 1), ("invariant", 1)]
    # a run queued before the keys existed trained on 1 device, summed as ddp: one cell
    old = {k: v for k, v in rows.rows[0].items() if k not in ("devices", "reduce")}
    new = {**rows.rows[1], "devices": 1, "reduce": "ddp"}
    mixed = ablation.ablation(RowTable([old, new], rows.columns, rows.attrs), "r")
    assert mixed.attrs["keys"] == [] and [r["n"] for r in mixed.rows] == [2]
    apart = ablation.ablation(RowTable([old, {**new, "devices": 2}], rows.columns, rows.attrs), "r")
    assert [(r["devices"], r["n"]) for r in apart.rows] == [(1, 1), (2, 1)]  # its 1 shown


def test_an_ablation_on_two_devices_keeps_its_deltas(tmp_path):
    for name, trainer, losses in (("baseline", {}, (0.5, 0.52)),
                                  ("two", {"devices": 2, "accumulate": 2}, (0.4, 0.42))):
        for seed, loss in enumerate(losses):
            run_folder(tmp_path, "a", seed, trainer=trainer, ablation=name, variant=name,
                       best={"loss": loss})
    table = ablation.ablation(frames.load_rows(tmp_path), "a")
    assert table.attrs["keys"] == ["ablation"]  # its name says it
    assert [r["ablation"] for r in table.rows] == ["baseline", "two"]
    assert round(table.rows[1]["loss_delta"], 6) == -0.1
