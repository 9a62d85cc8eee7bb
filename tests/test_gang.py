"""Runs on several devices take that many slots at once (distinct GPUs), in queue order:
a run waiting for its slots is not overtaken, one that can never fit fails at once with
one line; the engine adopts such a run after a restart, SLURM gives it one job of its
own, Ray n GPUs of one node; and a rank's death is a process's death (engine/placement.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from test_engine_kit import drain, engine_for, make_run, slow_run, wait_for
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.engine import daemon
from gridrun.engine.backends.base import Backend, Exited, Handle, Slot, gang
from gridrun.engine.backends.local import LocalBackend
from gridrun.engine.backends.slots import slots_for
from gridrun.engine.placement import Want, plan, recovered, slots_wait_note
from gridrun.engine.scheduler import SLOTS_WAIT, Engine
from gridrun.runs import states
from gridrun.runs.store import Store
from gridrun.spec import EngineConfig

CPUS = slots_for(EngineConfig(gpus=(), cpu_slots=2))
TOO_MANY = ("devices = 3 needs 3 slots and this engine has 2 (cpu_slots = 2): lower devices "
            "or raise cpu_slots")


def gpus(ids=(0, 1), per: int = 1) -> list[Slot]:
    return slots_for(EngineConfig(gpus=tuple(ids), runs_per_gpu=per))


def started(p) -> list[tuple[str, str]]:
    return [(run_id, slot.name) for run_id, slot in p.starts]


# ---- the placement, pure ----------------------------------------------------------------


def test_a_two_device_run_never_gets_one_slot():
    assert started(plan([Want("g", 2)], CPUS, used={"cpu0"}, holding=[1], cores=8)) == []
    both = plan([Want("g", 2)], CPUS, used=(), holding=(), cores=8)
    [(_, slot)] = both.starts
    assert (slot.name, [p.name for p in slot.parts], slot.cuda_visible_devices) == (
        "cpu0+cpu1", ["cpu0", "cpu1"], "")
    assert plan([Want("one", 1)], CPUS, (), (), 8).starts[0][1] == CPUS[0]  # a plain slot


def test_a_gang_is_on_distinct_gpus():
    shared = gpus(per=2)  # gpu0.0 gpu0.1 gpu1.0 gpu1.1
    assert started(plan([Want("g", 2)], shared, (), (), 8)) == [("g", "gpu0.0+gpu1.0")]
    assert plan([Want("g", 2)], shared, (), (), 8).starts[0][1].cuda_visible_devices == "0,1"
    # two free slots, both on GPU 0: not two devices
    held = plan([Want("g", 2), Want("one", 1)], shared, used={"gpu1.0", "gpu1.1"}, holding=(),
                cores=8)
    assert held.starts == [] and held.short == {"run_id": "g", "devices": 2, "free": 1,
                                                "unit": "GPUs"}
    uuids = gang([Slot("gpu0", 0, "GPU-aa"), Slot("gpu1", 1, "GPU-bb")])
    assert uuids.cuda_visible_devices == "GPU-aa,GPU-bb"


def test_queue_order_holds_freed_slots_for_the_first_run():
    queue = [Want("a", 1), Want("g", 2), Want("b", 1)]
    first = plan(queue, CPUS, (), (), 8)
    assert started(first) == [("a", "cpu0")]
    assert first.short == {"run_id": "g", "devices": 2, "free": 1, "unit": "slots"}
    # a ended, the other slot went to nobody in between: g gets both, b still waits
    assert started(plan(queue[1:], CPUS, (), (), 8)) == [("g", "cpu0+cpu1")]
    assert slots_wait_note(first.short) == (
        "slots: waiting for 2 free slots for g (devices = 2): 1 free; the runs queued after it "
        "wait too")


def test_a_gang_holds_its_threads_against_the_cores():
    four = slots_for(EngineConfig(gpus=(), cpu_slots=4))
    capped = plan([Want("g", 2, threads=1), Want("b", 1, threads=1)], four, used={"cpu0"},
                  holding=[1], cores=2)
    assert capped.starts == [] and capped.cap == {"run_id": "g", "threads": 2, "holding": 1,
                                                  "cores": 2, "cpu_slots": 4}
    alone = plan([Want("g", 2, threads=2)], four, (), (), cores=2)  # more than the machine: alone
    assert started(alone) == [("g", "cpu0+cpu1")]


def test_a_run_that_can_never_fit_fails_and_blocks_nothing():
    p = plan([Want("x", 3), Want("a", 1)], CPUS, (), (), 8)
    assert p.refused == [("x", TOO_MANY)] and started(p) == [("a", "cpu0")]
    [(_, why)] = plan([Want("x", 3)], gpus(per=2), (), (), 8).refused
    assert why.startswith("devices = 3 needs 3 distinct GPUs and this engine has 2 (GPUs 0, 1, "
                          "4 slots): lower devices")
    # where a slot is a job (SLURM, Ray) the scheduler asks for one: never refused here
    assert plan([Want("x", 1)], [Slot("slurm0")], (), (), 8).refused == []


def test_an_adopted_gang_holds_the_slots_the_store_names():
    assert recovered(CPUS, (), "cpu0+cpu1", 2).name == "cpu0+cpu1"
    assert recovered(CPUS, (), "cpu1", 1).name == "cpu1"
    four = slots_for(EngineConfig(gpus=(), cpu_slots=4))
    assert recovered(four, {"cpu0"}, "cpu7+cpu8", 2).name == "cpu1+cpu2"  # slots changed
    assert recovered(CPUS, {"cpu0"}, "cpu0+cpu1", 2).name == "cpu1"  # what is left is counted
    assert recovered(CPUS, {"cpu0", "cpu1"}, "cpu0", 1) is None


# ---- the engine, with real workers -------------------------------------------------------


class Recording:
    """A backend, with the launches (each with its plain slots) and the ends it reported,
    in the order the engine's one thread saw them."""

    def __init__(self, inner):
        self.inner, self.events = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def launch(self, run_id, run_dir, slot, *, fresh=False):
        handle = self.inner.launch(run_id, run_dir, slot, fresh=fresh)
        self.events.append(("launch", run_id, [p.name for p in slot.parts]))
        return handle

    def poll(self, timeout):
        ended = self.inner.poll(timeout)
        self.events += [("end", e.handle.run_id, []) for e in ended]
        return ended


def replay(events, slots: int = 2) -> list[str]:
    """The launch order; asserts no launch took a slot in use or more slots than free."""
    held: dict[str, list[str]] = {}
    order = []
    for kind, run_id, parts in events:
        if kind == "end":
            held.pop(run_id)
            continue
        in_use = {p for ps in held.values() for p in ps}
        assert not in_use & set(parts) and len(in_use) + len(parts) <= slots, (run_id, held)
        held[run_id] = parts
        order.append(run_id)
    return order


def multi(seed: int, devices: int = 2, **trainer):
    return make_run(seed=seed, **{"epochs": 1, "threads": 1, "accumulate": 2, "devices": devices,
                                  **trainer})


def test_a_mixed_queue_on_two_cpu_slots_completes_in_queue_order(tmp_path, backend):
    queue = [multi(0), multi(1, 1), multi(2, 1), multi(3), multi(4, 1), multi(5), multi(6, 1)]
    recording = Recording(backend)
    with Store(tmp_path) as store:
        store.enqueue(queue)
        engine = engine_for(tmp_path, recording, slots=2, cores=2)
        engine.start()
        drain(engine, timeout=300)
        got = {r.id: r for r in store.list_runs()}
    assert {r.status for r in got.values()} == {states.COMPLETED}
    assert all((r.restarts, r.retries, r.attempt) == (0, 0, 1) for r in got.values())
    # each launched once, in queue order (nothing overtook a run waiting for two slots),
    # never onto a slot in use: a two-device run started only with both slots free
    assert replay(recording.events) == [r.id for r in queue]
    launched = {run_id: parts for kind, run_id, parts in recording.events if kind == "launch"}
    assert all(len(launched[r.id]) == r.trainer["devices"] for r in queue)


def test_a_run_on_more_devices_than_slots_fails_at_once_and_the_queue_completes(tmp_path, backend):
    too_many, rest = multi(0, 3, accumulate=3), [multi(1, 1), multi(2)]
    with Store(tmp_path) as store:
        store.enqueue([too_many, *rest])
        engine = engine_for(tmp_path, backend, slots=2, cores=2)
        engine.start()
        engine.step(0.01)
        failed = store.get_run(too_many.id)
        assert (failed.status, failed.error, failed.note) == (states.FAILED, TOO_MANY, TOO_MANY)
        assert store.get_run(rest[0].id).status == states.RUNNING
        drain(engine, timeout=300)
        assert [store.get_run(r.id).status for r in rest] == [states.COMPLETED] * 2


def test_an_engine_restart_adopts_a_gang_and_counts_both_slots(tmp_path, backend):
    long = slow_run(seed=0, sleep=0.1, epochs=4, threads=1, accumulate=2, devices=2)
    after = multi(1, 1)
    first = LocalBackend(forkserver=False)  # its runs outlive it, as a killed engine's
    with Store(tmp_path) as store:
        store.enqueue([long, after])
        engine = engine_for(tmp_path, first, slots=2, cores=2)
        engine.start()
        engine.step(0.01)
        assert store.get_run(long.id).slot == "cpu0+cpu1"
        first.close()
        engine.store.close()

        engine = engine_for(tmp_path, backend, slots=2, cores=2)
        engine.start()  # adopts it: both of its slots are held again
        assert engine.active[long.id].slot.name == "cpu0+cpu1"
        assert engine.active[long.id].threads == 2
        engine.step(0.01)
        assert store.get_run(after.id).status == states.QUEUED  # no slot for it meanwhile
        drain(engine, timeout=300)
        got = {r.id: r for r in store.list_runs()}
    assert {r.status for r in got.values()} == {states.COMPLETED}
    assert got[long.id].restarts == 0 and got[after.id].started_at >= got[long.id].ended_at


def test_engine_status_says_why_a_run_on_two_devices_waits(tmp_path):
    root = tmp_path / "runs"
    busy = slow_run(seed=0, sleep=0.2, epochs=40, threads=1)
    waits = multi(1)
    with Store(root) as store:
        store.enqueue([busy, waits, multi(2, 1)])
    daemon.start(root, EngineConfig(gpus=(), cpu_slots=2))
    try:
        with Store(root) as store:
            wait_for(lambda: store.get_state(SLOTS_WAIT), timeout=120)
            assert store.get_run(waits.id).status == states.QUEUED
        result = CliRunner().invoke(app, ["engine", "status", "--root", str(root)])
        assert (f"slots: waiting for 2 free slots for {waits.id} (devices = 2): 1 free"
                in result.stdout), result.output
    finally:
        with contextlib.suppress(RuntimeError):
            daemon.stop(root, timeout=120)


# ---- endings, SLURM, Ray -------------------------------------------------------------------


class Scripted(Backend):
    """No process: each launched run ends at the next poll with the next scripted code."""

    name = "scripted"

    def __init__(self, codes):
        self.codes, self.live = list(codes), []

    def launch(self, run_id, run_dir, slot, *, fresh=False):
        handle = Handle(run_id, Path(run_dir), 0, 0.0, slot)
        self.live.append(handle)
        return handle

    def poll(self, timeout):
        ended, self.live = [Exited(h, self.codes.pop(0)) for h in self.live], []
        return ended

    def cancel(self, handle, grace=30.0):
        pass

    def reattach(self, run_id, run_dir, pid, start_time, slot=None):
        return None


def test_a_rank_that_died_is_a_process_that_died(tmp_path):
    run = multi(0)
    with Store(tmp_path) as store:
        store.enqueue([run])
        engine = Engine(tmp_path, Scripted([states.EXIT_RANK_DIED, 0]), [Slot("cpu0")],
                        backoff=0.05)
        engine.start()
        engine.step(0.01)
        again = store.get_run(run.id)
        assert (again.status, again.restarts, again.note) == (
            states.QUEUED, 1, "a rank of the run died; resumes from its checkpoint")
        engine.step(0.01)
        assert store.get_run(run.id).status == states.COMPLETED


def test_a_multi_device_run_is_one_slurm_job_of_its_own():
    from gridrun.engine.backends.slurm import job_size

    gpu, cpu = EngineConfig(backend="slurm", cpus_per_run=4), EngineConfig(backend="slurm",
                                                                           gpus_per_run=0)
    assert job_size(gpu, {"devices": 1}) == (1, 4)
    assert job_size(gpu, {"devices": 2}) == (2, 8)  # one GPU a rank, cpus_per_run each
    assert job_size(cpu, {"devices": 2, "threads": 3}) == (0, 6)
    assert job_size(cpu, {"devices": 2, "threads": "auto"}) == (0, 2)
    assert job_size(cpu, {}) == (0, 1)  # a run queued before `devices` existed


def ray_node(name: str, gpus: int) -> list[Slot]:
    """A Ray node's slots, as the Ray backend makes them (`node2:gpu1`, pinned to it)."""
    return [Slot(f"{name}:gpu{i}", i, f"GPU-{name}-{i}", node=f"id-{name}") for i in range(gpus)]


def test_ray_takes_a_slot_a_device_on_one_node_and_slurm_one_job():
    from gridrun.engine.placement import devices_wanted, never

    config = {"trainer": {"devices": 2}}
    assert [devices_wanted(config, b) for b in ("local", "ray", "slurm")] == [2, 2, 1]
    lab = ray_node("node1", 1) + ray_node("node2", 2)
    [(_, slot)] = plan([Want("g", 2)], lab, (), (), 8).starts
    assert (slot.name, slot.node, slot.cuda_visible_devices) == (
        "node2:gpu0+node2:gpu1", "id-node2", "GPU-node2-0,GPU-node2-1")  # never across nodes
    held = plan([Want("g", 2)], lab, used={"node2:gpu1"}, holding=(), cores=8)
    assert held.starts == [] and held.short["free"] == 2  # two free GPUs, on two nodes
    assert never(2, lab) is None
    assert never(3, lab) == (
        "devices = 3 needs 3 distinct GPUs on one Ray node (its ranks share a machine) and the "
        "largest of the 2 nodes, node2, has 2: lower devices to at most 2, or add a node with "
        "3 GPUs to the cluster")
    refused = plan([Want("wide", 3), Want("one", 1)], lab, (), (), 8)
    assert refused.refused == [("wide", never(3, lab))] and started(refused) == [
        ("one", "node1:gpu0")]
