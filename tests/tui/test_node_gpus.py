"""The machine panel on a Ray cluster (issue 47): every node has a gpu0, so a GPU is its
node and index (`node2:gpu0`) or its UUID, never its index alone. The telemetry sample,
the running runs' slots, the engine's FOREIGN state and its memory book each name a GPU
their own way; the panel puts each on its own GPU (tui/gpus.py) and names it by its node
(GpuRow.label), and on one machine reads as before."""

from dataclasses import replace

from test_gpu_memory import running_engine, spec
from tui_helpers import aio, settle

from gridrun.runs.store import Store
from gridrun.tui import gpus
from gridrun.tui.app import GridrunApp
from gridrun.tui.memory import MEMORY, book
from gridrun.tui.source import GpuMemory, GpuRow
from gridrun.tui.store_source import FOREIGN, StoreSource
from gridrun.tui.widgets.panels import gpu_line

GIB = 1 << 30
LABELS = ["node1:gpu0", "node1:gpu1", "node2:gpu0", "node2:gpu1"]
# node2's GPU 0 is taken by alice; node1's GPU 0, with the same index, by nobody
TAKEN = {"policy": "avoid", "waits": None, "gpus": [
    {"gpu": 0, "uuid": "GPU-b0", "node": "node2",
     "processes": [{"pid": 4242, "user": "alice", "mem_bytes": 20 * GIB}]}]}
# the book keys a node's GPU by its UUID and names it; an index alone (0) names no node's GPU
BOOK = {"mode": "auto", "gpus": [
    {"gpu": "GPU-a0", "name": "node1:gpu0", "total": 80 * GIB, "ours": 24 * GIB, "runs": 1,
     "others": 0, "foreign": 0, "free": 56 * GIB},
    {"gpu": "GPU-b0", "name": "node2:gpu0", "total": 80 * GIB, "ours": 0, "runs": 0,
     "others": 0, "foreign": 20 * GIB, "free": 60 * GIB},
    {"gpu": 0, "total": 80 * GIB, "ours": 8 * GIB, "runs": 9, "others": 0, "foreign": 0,
     "free": 1}]}


def sample(t: float, util: dict[str, float]) -> dict:
    """Two nodes, two GPUs each; A's process seen on node1:gpu0 (by UUID, as on Ray)."""
    return {"t": t, "system": {}, "gpus": [
        {"index": i, "uuid": f"GPU-{'ab'[n]}{i}", "node": f"node{n + 1}",
         "name": "NVIDIA H100 80GB HBM3", "util_percent": util.get(f"node{n + 1}:gpu{i}", 0.0),
         "mem_total_bytes": 80 * GIB, "mem_used_bytes": 10 * GIB, "power_w": 310.0,
         "temperature_c": 64.0} for n in range(2) for i in range(2)],
        "processes": [{"pid": 11, "gpu": "GPU-a0", "run_id": spec(0).id}]}


def cluster(root, *, states: bool = True) -> tuple[str, str]:
    """A store with run A on node1:gpu0 and run B on node2's two GPUs (a gang), a sample,
    and (`states`) who takes node2:gpu0 and the memory book."""
    a, b = spec(0), spec(1)
    with Store(root) as store:
        store.enqueue([a, b])
        store.transition(a.id, "queued", "running", slot="node1:gpu0", started_at=1.0)
        store.transition(b.id, "queued", "running", slot="node2:gpu0+node2:gpu1", started_at=1.0)
        store.record_telemetry(sample(1.0, {"node1:gpu0": 90.0, "node2:gpu0": 10.0}), t=1.0)
        if states:
            store.set_state(FOREIGN, TAKEN)
            store.set_state(MEMORY, BOOK)
    running_engine(root)
    return a.id, b.id


def test_two_nodes_gpu0_never_mix(tmp_path):
    a, b = cluster(tmp_path)
    src = StoreSource(tmp_path)
    rows = src.poll().machine.gpus
    assert [g.label for g in rows] == LABELS and [g.node for g in rows] == ["node1"] * 2 + ["node2"] * 2
    assert [g.runs for g in rows] == [(a,), (), (b,), (b,)]  # A's process and slot; B's gang
    assert [g.others for g in rows] == [(), (), ("alice (pid 4242, 20.0 GiB)",), ()]
    assert not any(g.shared for g in rows)
    assert rows[0].memory == GpuMemory(ours=24 * GIB, runs=1, engines=0, others=0, free=56 * GIB)
    assert rows[2].memory == GpuMemory(ours=0, runs=0, engines=0, others=20 * GIB, free=60 * GIB)
    assert rows[1].memory is None and rows[3].memory is None  # the index-keyed entry: no node's
    with Store(tmp_path) as store:  # a second sample: each GPU's own minute of history
        store.record_telemetry(sample(2.0, {"node1:gpu0": 80.0, "node2:gpu0": 20.0}), t=2.0)
    rows = src.poll().machine.gpus
    assert [g.history for g in rows] == [(90.0, 80.0), (0.0, 0.0), (10.0, 20.0), (0.0, 0.0)]


def test_shared_with_says_so_on_its_node_only(tmp_path):
    cluster(tmp_path)
    with Store(tmp_path) as store:
        store.set_state(FOREIGN, {**TAKEN, "policy": "share"})
    rows = StoreSource(tmp_path).poll().machine.gpus
    assert [(g.shared, g.others) for g in rows] == [
        (False, ()), (False, ()), (True, ("alice (pid 4242, 20.0 GiB)",)), (False, ())]


def test_a_uuid_tells_apart_what_a_name_cannot():
    # two servers of one hostname: each has a "host:gpu0", and only the UUID says which
    a, b = {"index": 0, "uuid": "GPU-a0", "node": "host"}, {"index": 0, "uuid": "GPU-b0", "node": "host"}
    table = gpus.taken({"gpus": [{"gpu": 0, "uuid": "GPU-b0", "node": "host", "processes": [
        {"user": "alice", "mem_bytes": GIB}]}]})
    assert gpus.taken_of(table, a) == (False, ()) and gpus.taken_of(table, b) == (False, ("alice (1.0 GiB)",))
    # an entry, or a sample, without a UUID is found by its name
    bare = gpus.taken({"gpus": [{"gpu": 0, "node": "host", "processes": [{"user": "bob"}]}]})
    assert gpus.taken_of(bare, a) == (False, ("bob (memory n/a)",))
    assert gpus.taken_of(bare, {"index": 1, "node": "host"}) == (False, ())
    assert gpus.taken_of(table, {"index": 0, "node": "host"}) == (False, ("alice (1.0 GiB)",))
    assert gpus.keys(b) == ("GPU-b0", "host:gpu0")  # no index: every node has a GPU 0
    assert gpus.keys({"index": 0, "uuid": "GPU-0"}) == ("GPU-0", "gpu0", 0)
    assert gpus.keys({"index": 0, "node": 3, "uuid": 5}) == ("gpu0", 0)  # not a node, nor a UUID


def test_the_book_finds_a_gpu_by_its_name():
    got = book(BOOK).gpus
    assert got["node2:gpu0"] is got["GPU-b0"] and got["node1:gpu0"] is got["GPU-a0"]
    assert set(book({"mode": "auto", "gpus": [{"gpu": True}]}).gpus) == set()  # not GPU 1


def test_on_one_machine_the_rows_are_as_before(tmp_path):
    with Store(tmp_path) as store:  # what an engine before Ray writes: no "node" anywhere
        store.record_telemetry({"t": 5.0, "system": {}, "gpus": [
            {"index": i, "uuid": f"GPU-{i}", "name": "H100", "util_percent": 70 - i}
            for i in range(2)], "processes": [{"pid": 1, "gpu": 1, "run_id": "abc"}]}, t=5.0)
        store.set_state(FOREIGN, {"policy": "avoid", "gpus": [
            {"gpu": 0, "uuid": "GPU-0", "processes": [{"pid": 9, "user": "bob"}]}]})
        store.set_state(MEMORY, {"mode": "auto", "gpus": [
            {"gpu": 1, "total": 8 * GIB, "ours": 0, "runs": 0, "others": 0, "foreign": 0,
             "free": 8 * GIB}]})
    running_engine(tmp_path)
    rows = StoreSource(tmp_path).poll().machine.gpus
    assert [(g.label, g.node, g.runs, g.others, g.history) for g in rows] == [
        ("gpu0", None, (), ("bob (pid 9, memory n/a)",), (70,)), ("gpu1", None, ("abc",), (), (69,))]
    assert rows[0].memory is None and rows[1].memory.free == 8 * GIB


# ---- the panel's line ---------------------------------------------------------------------

GPU = GpuRow(0, "NVIDIA H100 80GB HBM3", 87.0, 41e9, 80e9, 310.0, 64.0, ("3f2a9c01bd",),
             tuple(float(k) for k in range(60)))  # a minute of history, 0 to 59%


def test_a_line_without_others_is_as_before():
    old = "gpu0 NVIDIA H100 80GB H  87% ▄▄▄▄▄▄▄▄▄▄▄▅▅▅▅▅▅▅▅▅ 38.2G/74.5G 310W 64°C  3f2a9c01bd"
    assert gpu_line(GPU, 20, 78) == gpu_line(GPU, 20, 0) == old  # as the panel drew it before
    assert gpu_line(replace(GPU, node="node2"), 20, 78) == "node2:" + old


def test_taken_by_stays_on_the_line_at_80_columns():
    taken = replace(GPU, node="node2", others=("alice 20.0 GiB",))
    # the history, then the model's name, give way; the runs after it are cut by the panel
    assert gpu_line(taken, 20, 78) == ("node2:gpu0 NVIDIA H100 80  87% 38.2G/74.5G 310W 64°C  "
                                       "taken by alice 20.0 GiB  3f2a9c01bd")
    assert gpu_line(replace(taken, node=None), 20, 78) == (
        "gpu0 NVIDIA H100 80GB H  87% ▅▅ 38.2G/74.5G 310W 64°C  taken by alice 20.0 GiB  3f2a9c01bd")
    # room enough, or not known yet: as it always was
    assert gpu_line(taken, 60, 158) == gpu_line(taken, 60, 0) == (
        "node2:gpu0 NVIDIA H100 80GB H  87% ▂▃▃▃▃▃▃▃▃▃▃▃▃▄▄▄▄▄▄▄▄▄▄▄▄▄▅▅▅▅▅▅▅▅▅ 38.2G/74.5G 310W "
        "64°C  taken by alice 20.0 GiB  3f2a9c01bd")


@aio
async def test_the_panel_at_80_columns_names_each_nodes_gpu(tmp_path):
    a, b = cluster(tmp_path, states=False)
    with Store(tmp_path) as store:
        store.set_state(FOREIGN, TAKEN)
    app = GridrunApp(StoreSource(tmp_path), live=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        panel = app.main.query_one("#machine")
        lines = str(panel.render()).splitlines()
        room = panel.content_size.width
    assert room == 78 and [line.split(" ")[0] for line in lines] == LABELS, lines
    # what the panel shows of each line: its first 78 columns, the last one "…" where cut
    assert "  taken by alice (pid 4242, 20.0 GiB)" in lines[2][:room - 1], lines
    # the model's name gives way to who takes it: user, pid and memory
    assert lines[2].startswith("node2:gpu0 NV ") and lines[2].endswith(b), lines
    assert not any("taken by" in line for i, line in enumerate(lines) if i != 2), lines
    assert lines[0] == f"node1:gpu0 NVIDIA H100 80GB H  90% █ 10.0G/80.0G 310W 64°C  {a}", lines
