"""A run on several devices on Ray (issue 47): its gang of a node's GPUs is launched once,
in one placement group on that node that reserves a CPU for each rank; its process
starts the ranks itself, as on one server. Under `reduce = "invariant"` it ends with
the weights of the same run on one device here; a rank killed mid-run ends the run,
which resumes (a new group) to the same weights; a cancelled one checkpoints; no group
outlives its run.

A real one-node Ray cluster (2 CPUs, 2 stand-in GPUs: GRIDRUN_FAKE_GPUS=1, so the ranks
train on the CPU with gloo), real Ray tasks, the real scheduler. Skipped without Ray.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import patience
import psutil
import pytest
from test_devices import summary, trained
from test_engine_kit import TINY, drain, make_run, prepare, wait_exit, wait_for

from gridrun.engine.backends.base import Refused, Slot, gang
from gridrun.engine.scheduler import Engine
from gridrun.runs import layout, states
from gridrun.runs.store import Store

ray = pytest.importorskip("ray")
from ray.util.placement_group import placement_group_table  # noqa: E402


@pytest.fixture(scope="module")
def cluster(stand_in_gpus):
    """One head node: 2 CPUs and 2 stand-in GPUs, no dashboard, a small object store."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, connect=True, head_node_args={
        "num_cpus": 2, "num_gpus": 2, "object_store_memory": 80 * 1024**2,
        "include_dashboard": False})
    yield c
    ray.shutdown()
    c.shutdown()


def wide(devices: int, gate: Path | str = ""):
    """spirals on `devices` under the invariant sum, 30 steps, a checkpoint every 2; with
    `gate`, each process's 9th training micro-batch (step 9 on 2 devices) waits for that
    file, so a test looks at the run, or hits it, at a step the machine's speed does not
    move (helper_tasks.gated)."""
    return make_run("helper_tasks:gated_spirals", experiment="wide", epochs=2, batch_size=16,
                    accumulate=2, threads=1, reduce="invariant", devices=devices,
                    checkpoint_every=2, task_args={**TINY, "train_size": 512,
                                                   "gate": str(gate), "at": 9})


@pytest.fixture(scope="module")
def reference(tmp_path_factory, stand_in_gpus):
    """The run on one device, here, as the local backend's worker runs it: its weights."""
    root = tmp_path_factory.mktemp("one-device")
    run = wide(1)
    trained(root, run)
    return summary(root, run)["weights_sha256"]


def ray_engine(root) -> Engine:
    from gridrun.engine.backends.ray import RayBackend

    backend = RayBackend(root, log_path=root / "engine.log")
    return Engine(root, backend, backend.slots(), tick=0.1, telemetry_every=0.2,
                  processes_every=0.2, backoff=0.05)


def groups_of(run_id: str, but: frozenset[str] = frozenset()) -> list[dict]:
    """Every placement group this run had, alive or removed (Ray's table keeps both),
    but those of `but` (ids: an earlier test's launches of the same run)."""
    return [g for g in placement_group_table().values()
            if g["name"] == f"gridrun-{run_id}" and g["placement_group_id"] not in but]


def live_groups() -> list[dict]:
    return [g for g in placement_group_table().values() if g["state"] != "REMOVED"]


def waiting_at(engine: Engine, gate: Path) -> None:
    """Step the engine until the run's ranks wait at `gate`."""
    wait_for(lambda: (engine.step(0.05), Path(f"{gate}.reached").exists())[1], timeout=240)


def test_a_two_device_run_on_ray_is_one_group_on_its_node_with_the_weights_of_one_device(
        cluster, reference, tmp_path):
    gate = tmp_path / "gate"
    run = wide(2, gate)
    earlier = frozenset(g["placement_group_id"] for g in groups_of(run.id))
    with Store(tmp_path) as store:
        store.enqueue([run])
        engine = ray_engine(tmp_path)
        engine.start()
        try:
            node = ray.get_runtime_context().get_node_id()
            assert [(s.name.partition(":")[2], s.node) for s in engine.slots] == [
                ("gpu0", node), ("gpu1", node)]
            # launched once, on both GPUs of the node, inside its placement group there
            waiting_at(engine, gate)
            assert store.get_run(run.id).slot.count("+") == 1 and len(engine.backend.tasks) == 1
            [group] = groups_of(run.id, but=earlier)
            assert group["state"] == "CREATED"
            assert group["strategy"] == "STRICT_PACK"
            assert group["bundles"] == {0: {"CPU": 1.0}, 1: {"CPU": 1.0}}  # a CPU a rank, no GPU
            assert group["bundles_to_node_id"] == {0: node, 1: node}
            gate.touch()
            drain(engine, timeout=300)
            row = store.get_run(run.id)
        finally:
            engine.backend.close()
    assert row.status == states.COMPLETED, row.error
    output = (layout.run_dir(tmp_path, run.experiment, run.id) / layout.OUTPUT).read_text()
    assert "CUDA_VISIBLE_DEVICES=0,1 are stand-ins" in output  # the gang's two GPUs
    assert summary(tmp_path, run)["weights_sha256"] == reference
    assert [g["state"] for g in groups_of(run.id, but=earlier)] == ["REMOVED"]
    assert live_groups() == []


def test_a_rank_killed_on_ray_resumes_to_the_same_weights_and_leaves_no_group(
        cluster, reference, tmp_path):
    gate = tmp_path / "gate"
    run = wide(2, gate)
    earlier = frozenset(g["placement_group_id"] for g in groups_of(run.id))
    # a group is reserved only where the node's CPUs can ever hold it: else one line
    node = ray.get_runtime_context().get_node_id()
    from gridrun.engine.backends.ray.gangs import Gangs

    three = gang([Slot(f"n:gpu{i}", i, node=node) for i in range(3)])
    with pytest.raises(Refused, match=r"devices = 3 reserves 3 CPUs on one Ray node .* n has 2"):
        Gangs().submit("x", three, 3, lambda **_: None)
    with Store(tmp_path) as store:
        store.enqueue([run])
        engine = ray_engine(tmp_path)
        engine.start()
        try:
            waiting_at(engine, gate)  # at step 9, its checkpoint of step 8 written
            task = engine.backend.tasks[run.id]
            ranks = [p for p in psutil.Process(task.pid).children(recursive=True)
                     if "--rank" in p.cmdline()]
            assert len(ranks) == 1  # rank 1; rank 0 is the run's process
            os.kill(ranks[0].pid, signal.SIGKILL)
            gate.touch()
            restart = patience.Deadline(60)
            while store.get_run(run.id).restarts == 0:
                assert not restart.passed(), f"a dead rank left the run hanging for {restart}"
                engine.step(0.05)
            drain(engine, timeout=300)
            row = store.get_run(run.id)
        finally:
            engine.backend.close()
    assert row.status == states.COMPLETED, row.error
    assert row.restarts == 1
    output = (layout.run_dir(tmp_path, run.experiment, run.id) / layout.OUTPUT).read_text()
    assert "rank 1 of 2 died (signal 9)" in output and "resumed from step 8" in output
    assert summary(tmp_path, run)["weights_sha256"] == reference
    # a group for each launch, each removed when its launch ended
    assert [g["state"] for g in groups_of(run.id, but=earlier)] == ["REMOVED", "REMOVED"]
    assert live_groups() == []


def test_a_cancelled_two_device_run_checkpoints_and_its_group_goes_with_it(cluster, tmp_path):
    from gridrun.engine.backends.ray import RayBackend

    gate = tmp_path / "gate"
    run = wide(2, gate)
    backend = RayBackend(tmp_path, log_path=tmp_path / "engine.log")
    backend.start()
    try:
        run_dir = prepare(tmp_path, run)
        handle = backend.launch(run.id, run_dir, gang(backend.slots()[:2]))
        wait_for(lambda: (backend.poll(0.05), Path(f"{gate}.reached").exists())[1], timeout=240)
        [group] = groups_of(run.id)
        assert group["state"] == "CREATED"
        sent, submit = [], backend._submit  # the cancel's SIGTERM: a task on the run's node

        def recorded(name, *args, **options):
            ref = submit(name, *args, **options)
            sent.extend([ref] if name == "signal" else [])
            return ref

        backend._submit = recorded
        backend.cancel(handle, grace=120)
        wait_for(lambda: ray.wait(sent, timeout=0)[0], timeout=120)
        assert ray.get(sent) == [True]  # delivered while the ranks wait at the gate
        gate.touch()
        [event] = wait_exit(backend, timeout=240)
    finally:
        backend.close()
    assert event.code == states.EXIT_CODES[states.INTERRUPTED]
    assert (run_dir / layout.CHECKPOINTS / "last.pt").exists()
    assert [g["state"] for g in groups_of(run.id)] == ["REMOVED"]
    assert live_groups() == []
