"""The engine loop in this process, with real workers: faults, retries, OOM,
priorities, pause, cancel, and a worker killed mid-run."""

from __future__ import annotations

import signal

import pytest
from test_engine_kit import (
    drain,
    engine_for,
    make_run,
    metrics_without_timing,
    slow_run,
    summary,
    wait_for,
)

from gridrun.engine.backends.slots import slots_for
from gridrun.runs import layout, states
from gridrun.runs.store import Store
from gridrun.spec import EngineConfig, read_run_config


def test_slots_from_the_engine_config():
    assert [s.name for s in slots_for(EngineConfig(gpus=(), cpu_slots=3))] == ["cpu0", "cpu1", "cpu2"]
    two = slots_for(EngineConfig(gpus=(0, 2), runs_per_gpu=2))
    assert [(s.name, s.cuda_visible_devices) for s in two] == [
        ("gpu0.0", "0"), ("gpu0.1", "0"), ("gpu2.0", "2"), ("gpu2.1", "2")]
    assert [s.name for s in slots_for(EngineConfig(gpus="auto"), gpus_available=1)] == ["gpu0"]
    assert slots_for(EngineConfig(gpus="auto"), gpus_available=0)[0].cuda_visible_devices == ""


@pytest.mark.slow
def test_faults_are_isolated_and_the_queue_completes(tmp_path, backend):
    ok = make_run(seed=0)
    crash = make_run("helper_tasks:crash", seed=1, task_args={"at_step": 3})
    crash_retried = make_run("helper_tasks:crash", seed=2, task_args={"at_step": 3}, max_retries=1)
    diverge = make_run(seed=3, optimizer="sgd", lr=1e30, momentum=0.9)
    oom = make_run("helper_tasks:oom_above", seed=4, task_args={"max_batch": 32}, batch_size=64)
    runs = [crash, diverge, oom, crash_retried, ok]
    with Store(tmp_path) as store:
        store.enqueue(runs)
        engine = engine_for(tmp_path, backend)
        engine.start()
        drain(engine)
        got = {r.id: r for r in store.list_runs()}
    assert got[ok.id].status == states.COMPLETED
    assert got[ok.id].summary["status"] == states.COMPLETED
    assert got[crash.id].status == states.FAILED
    assert "injected crash" in got[crash.id].error
    assert "last lines of output.log" in got[crash.id].error
    assert (got[crash_retried.id].status, got[crash_retried.id].retries) == (states.FAILED, 1)
    assert got[diverge.id].status == states.DIVERGED
    assert "diverged at step" in got[diverge.id].note
    o = got[oom.id]
    assert o.status == states.COMPLETED
    assert [(a["batch_size"], a["accumulate"]) for a in o.adjustments] == [([64, 32], [1, 2])]
    assert (o.config["trainer"]["batch_size"], o.config["trainer"]["accumulate"]) == (32, 2)
    written = read_run_config(layout.run_dir(tmp_path, "e", oom.id) / layout.CONFIG)
    assert (written.trainer["batch_size"], written.trainer["accumulate"]) == (32, 2)


def test_priority_first_then_first_in_and_pause(tmp_path, backend):
    runs = [make_run(seed=s, epochs=1) for s in range(3)]
    with Store(tmp_path) as store:
        store.enqueue(runs)
        store.set_priority([runs[2].id], 5)
        store.pause()
        engine = engine_for(tmp_path, backend, slots=1)
        engine.start()
        engine.step(0.01)
        assert store.counts() == {states.QUEUED: 3}
        store.resume()
        engine.step(0.01)
        assert [r.id for r in store.list_runs(status=states.RUNNING)] == [runs[2].id]
        drain(engine)
        order = [r.id for r in sorted(store.list_runs(), key=lambda r: r.started_at)]
        assert order == [runs[2].id, runs[0].id, runs[1].id]


def test_cancel_a_queued_and_a_running_run(tmp_path, backend):
    running, queued = slow_run(seed=0, sleep=0.05, epochs=30), make_run(seed=1)
    with Store(tmp_path) as store:
        store.enqueue([running, queued])
        engine = engine_for(tmp_path, backend, slots=1)
        engine.start()
        engine.step(0.01)
        run_dir = layout.run_dir(tmp_path, "e", running.id)
        wait_for(lambda: (run_dir / layout.METRICS).exists())
        assert store.cancel([queued.id, running.id]) == {
            queued.id: "cancelled", running.id: "cancelling"}
        drain(engine)
        got = {r.id: r.status for r in store.list_runs()}
    assert got == {running.id: states.CANCELLED, queued.id: states.CANCELLED}
    assert (run_dir / layout.CHECKPOINTS / "last.pt").exists()  # it stopped cleanly


@pytest.mark.slow
def test_a_killed_worker_resumes_from_its_checkpoint_and_others_are_untouched(tmp_path, backend):
    # one thread each: two runs side by side on two cores (the engine never oversubscribes)
    victim = slow_run(seed=0, sleep=0.05, epochs=6, threads=1)
    other = slow_run(seed=1, sleep=0.05, epochs=6, threads=1)
    reference = tmp_path / "reference"
    with Store(reference) as store:
        store.enqueue([victim, other])
        engine = engine_for(reference, backend)
        engine.start()
        drain(engine)
    root = tmp_path / "runs"
    with Store(root) as store:
        store.enqueue([victim, other])
        engine = engine_for(root, backend)
        engine.start()
        engine.step(0.01)
        ckpt = layout.run_dir(root, "e", victim.id) / layout.CHECKPOINTS / "last.pt"
        while not ckpt.exists():
            engine.step(0.02)
        pid = engine.active[victim.id].handle.pid
        other_pid = engine.active[other.id].handle.pid
        import os

        os.kill(pid, signal.SIGKILL)
        drain(engine)
        got = {r.id: r for r in store.list_runs()}
    assert got[victim.id].status == states.COMPLETED and got[victim.id].restarts == 1
    assert summary(root, victim)["resumed_from_step"] is not None
    assert got[other.id].restarts == 0 and got[other.id].pid is None
    assert summary(root, other)["resumed_from_step"] is None
    assert other_pid != pid
    for run in (victim, other):
        assert metrics_without_timing(root, run) == metrics_without_timing(reference, run)


def test_telemetry_lands_in_the_store_with_the_process_list(tmp_path, backend):
    from gridrun.engine.telemetry import Telemetry

    class FakeGpuTelemetry(Telemetry):
        def processes(self):  # as NVML would list our run's process on GPU 0
            return {pid: 0 for pid in pids}

    pids: list[int] = []
    run = slow_run(sleep=0.05, epochs=4)
    with Store(tmp_path) as store:
        store.enqueue([run])
        engine = engine_for(tmp_path, backend, slots=1, telemetry=FakeGpuTelemetry(),
                            telemetry_every=0.05, processes_every=0.05)
        engine.start()
        engine.step(0.01)
        pids.append(engine.active[run.id].handle.pid)
        for _ in range(5):
            engine.step(0.06)
        latest = store.latest_telemetry()
        history = store.telemetry_since(0)
        drain(engine)
    assert latest is not None and latest.data["system"]["cpu_percent"] is not None
    assert latest.data["processes"] == [{"pid": pids[0], "gpu": 0, "run_id": run.id}]
    assert len(history) >= 3
