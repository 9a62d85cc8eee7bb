"""The Ray backend on a real local Ray cluster with fake GPUs: real Ray tasks, real
worker processes, the real scheduler. Skipped when Ray is not installed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from search_kit import SMALL, decided_locally, drained, search_runs
from test_engine_kit import (
    TINY,
    drain,
    make_run,
    metrics_without_timing,
    prepare,
    wait_exit,
    wait_for,
)

from gridrun.engine.backends.base import Slot
from gridrun.engine.backends.registry import BackendError, make_backend, slots_for_backend
from gridrun.engine.scheduler import Engine
from gridrun.runs import layout, states
from gridrun.runs.store import Store
from gridrun.spec import EngineConfig


def probe_run(seed: int = 0, sleep: float = 0.0, epochs: int = 2, **trainer):
    return make_run("ray_tasks:probe", seed, epochs=epochs, checkpoint_every=2,
                    task_args={**TINY, "step_sleep": sleep}, **trainer)


def test_choosing_ray_without_ray_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['ray'] = None\n"
            "from gridrun.engine.backends.registry import make_backend\n"
            "from gridrun.spec import EngineConfig\n"
            "make_backend(EngineConfig(backend='ray'), '.')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode != 0 and "pip install 'gridrun[ray]'" in proc.stderr
    with pytest.raises(BackendError, match="unknown"):
        make_backend(EngineConfig(backend="slrum"), tmp_path)


def test_a_broken_ray_install_is_a_clear_error(tmp_path):
    fake = tmp_path / "ray"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('libray.so: cannot open shared object')\n")
    code = ("from gridrun.engine.backends.registry import BackendError, make_backend\n"
            "from gridrun.spec import EngineConfig\n"
            "try:\n    make_backend(EngineConfig(backend='ray'), '.')\n"
            "except BackendError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"})
    assert proc.returncode == 0, proc.stderr
    assert "does not import" in proc.stdout and "libray.so" in proc.stdout


@pytest.fixture(scope="module")
def cluster(stand_in_gpus):
    """One head node: 2 CPUs and 2 fake GPUs, no dashboard, a small object store."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, connect=True, head_node_args={
        "num_cpus": 2, "num_gpus": 2, "object_store_memory": 80 * 1024**2,
        "include_dashboard": False})
    yield c
    import ray

    ray.shutdown()
    c.shutdown()


@pytest.fixture
def backend(cluster, tmp_path):
    made = make_backend(EngineConfig(backend="ray"), tmp_path, tmp_path / "engine.log")
    made.start()
    yield made
    import ray

    for task in made.tasks.values():
        ray.cancel(task.gen, force=True)
    made.close()


def test_the_root_must_be_shared(backend, tmp_path):
    from gridrun.engine.backends.ray.agent import node_name

    # the node's two GPUs (Ray's count: no NVML here), named by the node, pinned to it
    assert [s.name for s in backend.slots()] == [f"{node_name()}:gpu0", f"{node_name()}:gpu1"]
    assert {s.node for s in backend.slots()} == {n.id for n in backend.nodes.alive.values()}
    backend.check_root_shared()  # one machine: trivially shared; a probe file went and came back
    assert not list(tmp_path.glob(".gridrun-probe*"))


def test_slots_runs_and_metrics_match_local(backend, tmp_path):
    runs = [probe_run(seed=s, sleep=0.1, epochs=2) for s in range(3)]
    with Store(tmp_path) as store:
        store.enqueue(runs)
        engine = Engine(tmp_path, backend, slots_for_backend(backend, None), tick=0.1)
        engine.start()
        engine.step(0.05)
        counts = store.counts()
        assert counts == {states.RUNNING: 2, states.QUEUED: 1}  # the third waits in gridrun
        assert len(backend.tasks) == 2  # ... and was never given to Ray
        first = next(iter(engine.active))
        metrics = layout.run_dir(tmp_path, "e", first) / layout.METRICS
        wait_for(lambda: (engine.step(0.05), metrics.exists() and metrics.stat().st_size)[1])
        assert store.list_runs(ids=[first])[0].status == states.RUNNING  # lines land mid-run
        wait_for(lambda: (engine.step(0.05), backend.tasks.get(first) is None
                          or backend.tasks[first].step)[1])
        drain(engine)
        assert {r.status for r in store.list_runs()} == {states.COMPLETED}
    seen = [(layout.run_dir(tmp_path, "e", r.id) / layout.OUTPUT).read_text() for r in runs]
    devices = [line.split("=")[1] for out in seen for line in out.splitlines()
               if line.startswith("CUDA_VISIBLE_DEVICES=")]
    assert sorted(devices[:2]) == ["'0'", "'1'"] or len(set(devices[:2])) == 2

    from gridrun.engine.backends.local import LocalBackend

    local_root = tmp_path / "local"
    local = LocalBackend(forkserver=False)
    with Store(local_root) as store:
        store.enqueue(runs)
        engine = Engine(local_root, local, [Slot("cpu0"), Slot("cpu1")], tick=0.1)
        engine.start()
        drain(engine)
    local.close()
    for run in runs:
        assert metrics_without_timing(tmp_path, run) == metrics_without_timing(local_root, run)


def test_cancel_checkpoints(backend, tmp_path):
    run = probe_run(sleep=0.05, epochs=20)
    run_dir = prepare(tmp_path, run)
    handle = backend.launch(run.id, run_dir, Slot("ray0"))
    wait_for(lambda: (backend.poll(0.05), (run_dir / layout.CHECKPOINTS / "last.pt").exists())[1])
    backend.cancel(handle, grace=30)
    [event] = wait_exit(backend)
    assert event.code == states.EXIT_CODES[states.INTERRUPTED]
    assert (run_dir / layout.CHECKPOINTS / "last.pt").exists()
    assert backend.reattach(run.id, run_dir, 0, 0.0) is None  # nothing of it runs now


def test_a_lost_node_interrupts_and_the_run_resumes_elsewhere(backend, cluster, tmp_path):
    node = cluster.add_node(num_cpus=1, num_gpus=1, object_store_memory=80 * 1024**2)
    try:
        run = probe_run(seed=7, sleep=0.1, epochs=10)
        run_dir = prepare(tmp_path, run)
        # gridrun pins a run to the node its slot is on: here the new node's GPU
        handle = backend.launch(run.id, run_dir, Slot("new:gpu0", 0, node=node.node_id))
        checkpoint = run_dir / layout.CHECKPOINTS / "last.pt"
        wait_for(lambda: (backend.poll(0.05), checkpoint.exists())[1])
        assert handle.extra.node == node.node_id
        cluster.remove_node(node, allow_graceful=False)
        node = None
        [event] = wait_exit(backend)
        assert event.code == states.EXIT_CODES[states.INTERRUPTED]
    finally:
        if node is not None:
            cluster.remove_node(node)
    backend.launch(run.id, run_dir, Slot("ray0"))  # what the scheduler does next
    reference = tmp_path / "reference"
    other = make_backend(EngineConfig(backend="ray"), reference)
    other.start()
    other.launch(run.id, prepare(reference, run), Slot("ray1"))
    assert [e.code for e in wait_exit(backend)] == [0]
    assert [e.code for e in wait_exit(other)] == [0]
    other.close()
    assert metrics_without_timing(tmp_path, run) == metrics_without_timing(reference, run)


def test_a_search_decides_on_ray_what_it_decides_locally(backend, tmp_path):
    """A small ASHA search (4 trials, rungs at 1, 2 and 4 epochs) on Ray's two slots
    (trials pausing at their rungs, promoted by resuming their checkpoints in new Ray
    tasks) gives the trials, promotions, stops, winner and winner's
    weights of the local backend: a decision depends on trial indices and rung
    results, never on which backend finished first."""
    runs = search_runs(tmp_path, SMALL)
    on_ray = drained(tmp_path, Engine(tmp_path, backend, slots_for_backend(backend, None),
                                      tick=0.1, backoff=0.05), runs)
    here = decided_locally(tmp_path / "local", runs)
    assert len(on_ray["promotions"]) == 2 + 1 and len(on_ray["stopped"]) == 3  # 4 -> 2 -> 1
    assert on_ray == here
