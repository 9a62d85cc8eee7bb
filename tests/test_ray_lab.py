"""Issue 47: a lab of GPU servers on Ray keeps the promises of one server. A real Ray
cluster of two nodes on this machine (tests/ray_lab.py), each with two stand-in GPUs
seen through its own NVML; real Ray tasks, real workers, the real scheduler.

- another user's process on node2's gpu0: no run is placed there under "avoid", and
  `engine status` and `gridrun ls` name it by node, user, pid and memory; the stored
  telemetry the machine panel draws holds every node's GPUs by node;
- two queues (two engines) of runs with known budgets never commit more than a GPU's
  memory on any node: each node's own ledger is shared by every engine placing there;
- a node removed mid-queue: every run completes once, with the weights of the same
  queue undisturbed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import pytest
from test_engine_kit import TINY, drain, make_run, wait_for
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.engine.foreign import STATE as FOREIGN
from gridrun.engine.scheduler import Engine
from gridrun.runs import layout, runlog, states
from gridrun.runs.store import Store

ray = pytest.importorskip("ray")
from ray_lab import GIB, GPU_BYTES, start_lab, stop_lab  # noqa: E402
from test_foreign_gpus import THEM, colleague, pretend_daemon  # noqa: E402, F401 (a fixture)


@pytest.fixture(scope="module")
def lab(tmp_path_factory, stand_in_gpus):
    made = start_lab(tmp_path_factory.mktemp("lab"))
    yield made
    stop_lab(made)


def ray_engine(root, **kw) -> Engine:
    from gridrun.engine.backends.ray import RayBackend

    backend = RayBackend(root, log_path=root / "engine.log")
    return Engine(root, backend, backend.slots(), tick=0.1, telemetry_every=0.2,
                  processes_every=0.2, backoff=0.05, **kw)


def brief(seed: int, experiment: str = "lab", sleep: float = 0.05, **trainer):
    trainer = {"epochs": 1, "checkpoint_every": 2, **trainer}
    return make_run("ray_tasks:probe", seed, experiment=experiment,
                    task_args={**TINY, "step_sleep": sleep}, **trainer)


class Launches:
    """Every launch's slot and budget, as the engine hands it to the backend."""

    def __init__(self, engine: Engine):
        self.seen: list[tuple[str, str, int | None]] = []
        self.lock = threading.Lock()
        inner = engine.backend.launch

        def launch(run_id, run_dir, slot, *, fresh=False):
            with self.lock:
                self.seen.append((run_id, slot.name, slot.budget))
            return inner(run_id, run_dir, slot, fresh=fresh)

        engine.backend.launch = launch


def test_no_run_goes_to_the_gpu_another_user_holds_on_node2(lab, tmp_path, colleague):  # noqa: F811
    lab.put("node2", {0: [(colleague.pid, 70 * GIB)]})
    root = tmp_path / "runs"
    runs = [brief(s) for s in range(6)]
    try:
        with Store(root) as store:
            store.enqueue(runs)
            engine = ray_engine(root)
            launches = Launches(engine)
            engine.start()
            assert sorted(s.name for s in engine.slots) == [
                "node1:gpu0", "node1:gpu1", "node2:gpu0", "node2:gpu1"]
            wait_for(lambda: (engine.step(0.05), store.get_state(FOREIGN))[1])
            state = store.get_state(FOREIGN)
            assert state["gpus"] == [{"gpu": 0, "uuid": "GPU-node2-0", "node": "node2", "processes": [
                {"pid": colleague.pid, "user": THEM, "mem_bytes": 70 * GIB}]}]
            # the machine panel draws the stored telemetry: every node's GPUs, by node
            gpus = {(g["node"], g["index"]): g for g in store.latest_telemetry().data["gpus"]}
            assert set(gpus) == {("node1", 0), ("node1", 1), ("node2", 0), ("node2", 1)}
            assert gpus["node2", 0]["uuid"] == "GPU-node2-0"
            assert gpus["node2", 0]["mem_used_bytes"] == 70 * GIB
            assert all(g["mem_total_bytes"] == GPU_BYTES for g in gpus.values())
            pretend_daemon(root)
            status = CliRunner().invoke(app, ["engine", "status", "--root", str(root)]).output
            ls = CliRunner().invoke(app, ["ls", "--root", str(root)]).output
            drain(engine, timeout=600)
            rows = store.list_runs()
            after = CliRunner().invoke(app, ["ls", "--root", str(root)]).output
        assert {r.status for r in rows} == {states.COMPLETED}
        # each run says where it ran: its node and GPU (ls, the run's detail: Run.where)
        assert {r.where for r in rows} <= {"ray on node1:gpu0", "ray on node1:gpu1",
                                           "ray on node2:gpu1"}, {r.where for r in rows}
        assert "ray on node1:gpu" in after
        used = {slot for _, slot, _ in launches.seen}
        assert "node2:gpu0" not in used and len(launches.seen) == 6
        assert used <= {"node1:gpu0", "node1:gpu1", "node2:gpu1"}
        line = f"node2:gpu0: taken by {THEM} (pid {colleague.pid}, 70.0 GiB)"
        assert line in status, status
        assert line in ls, ls
    finally:
        lab.put("node2", {})
        with contextlib.suppress(Exception):
            engine.backend.close()


def summary_of(root, run) -> dict:
    import json

    return json.loads((layout.run_dir(root, run.experiment, run.id) / layout.SUMMARY).read_text())


def weights_of(root, run) -> str:
    return summary_of(root, run)["weights_sha256"]


class Ledgered:
    """Every launch and every end the engine sees, stamped, with the GPUs and budget."""

    def __init__(self, engine: Engine, events: list, lock: threading.Lock):
        backend = engine.backend
        launch, poll = backend.launch, backend.poll

        def launched(run_id, run_dir, slot, *, fresh=False):
            handle = launch(run_id, run_dir, slot, fresh=fresh)
            with lock:
                events.append((time.monotonic(), "start", run_id,
                               tuple(p.name.partition(".")[0] for p in slot.parts), slot.budget))
            return handle

        def polled(timeout):
            ended = poll(timeout)
            with lock:
                events.extend((time.monotonic(), "end", e.handle.run_id, (), 0) for e in ended)
            return ended

        backend.launch, backend.poll = launched, polled


def most_on_a_gpu(events) -> dict[str, int]:
    """Per GPU, the largest sum of budgets of runs launched there and not yet ended."""
    held: dict[str, tuple[tuple[str, ...], int]] = {}
    most: dict[str, int] = {}
    for _, kind, run_id, gpus, budget in sorted(events, key=lambda e: (e[0], e[1] == "start")):
        if kind == "start":
            held[run_id] = (gpus, budget or 0)
        else:
            held.pop(run_id, None)
        for gpu in {g for gs, _ in held.values() for g in gs}:
            now = sum(b for gs, b in held.values() if gpu in gs)
            most[gpu] = max(most.get(gpu, 0), now)
    return most


def test_two_queues_with_known_budgets_never_commit_more_than_a_gpu_on_any_node(lab, tmp_path):
    """Two engines (two roots) on the cluster, packing by memory: each node's ledger is
    where both write what they commit on that node's GPUs, so together they never commit
    more than a stand-in GPU's 80 GiB there; every placement is recorded."""
    sizes = [20, 30, 50]  # GiB: 30 + 50 leaves no headroom on 80, 50 + 50 is over
    events: list = []
    lock = threading.Lock()
    queues, engines = {}, []
    for name in ("alice", "bob"):
        root = tmp_path / name / "runs"
        root.parent.mkdir()
        queues[name] = [brief(s, experiment=name, sleep=0.1, gpu_memory=sizes[s % 3])
                        for s in range(4)]
        with Store(root) as store:
            store.enqueue(queues[name])
        engine = ray_engine(root, runs_per_gpu="auto")
        Ledgered(engine, events, lock)
        engines.append(engine)
    errors: list[BaseException] = []

    def drive(engine):
        try:
            engine.start()
            drain(engine, timeout=900)
        except BaseException as e:  # re-raised by the test's thread
            errors.append(e)
        finally:
            engine.sharing.close() if engine.sharing else None
            engine.backend.close()

    threads = [threading.Thread(target=drive, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    starts = [e for e in events if e[1] == "start"]
    assert len(starts) == 8 and len({e[2] for e in starts}) == 8  # each run placed once
    assert {e[4] for e in starts} == {g * GIB for g in sizes}  # each with its own budget
    most = most_on_a_gpu(events)
    assert max(most.values()) <= GPU_BYTES, most
    assert max(most.values()) >= 50 * GIB, most  # they did share a GPU
    assert {g.partition(":")[0] for g in most} == {"node1", "node2"}  # on both nodes
    for name in queues:
        with Store(tmp_path / name / "runs") as store:
            assert {r.status for r in store.list_runs()} == {states.COMPLETED}


def test_a_node_whose_agent_hangs_gets_no_new_run_and_stalls_nothing(lab, tmp_path):
    """node2's agent stopped (SIGSTOP: a hung server): the queue goes on on node1, node2's
    slots are offered to no run; when it answers again its slots come back."""
    root = tmp_path / "runs"
    runs = [brief(s) for s in range(2)]
    with Store(root) as store:
        engine = ray_engine(root)
        launches = Launches(engine)
        engine.start()
        backend = engine.backend
        node2 = next(n for n in backend.nodes.alive.values() if n.name == "node2")
        pid = ray.get(node2.agent.pid.remote())
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: (engine.step(0.05), node2.id in backend.nodes.silent)[1], timeout=120)
            backend.refresh_slots(force=True)
            assert {s.name for s in engine.slots} == {"node1:gpu0", "node1:gpu1"}
            store.enqueue(runs)
            drain(engine, timeout=600)
            assert {r.status for r in store.list_runs()} == {states.COMPLETED}
            assert {slot.partition(":")[0] for _, slot, _ in launches.seen} == {"node1"}
        finally:
            os.kill(pid, signal.SIGCONT)

        def back():
            engine.step(0.05)
            backend.refresh_slots(force=True)
            return any(s.node == node2.id for s in engine.slots)
        wait_for(back, timeout=120)
        backend.close()


def test_a_node_removed_mid_queue_every_run_completes_once_with_undisturbed_weights(lab, tmp_path):
    """node2 goes away while runs are there (its runs' processes killed with it, as a
    server's power cut would): they resume on node1 from their checkpoints and every
    run ends as the same queue on the local backend does, bit for bit. Last in the
    module: node2 does not come back."""
    from gridrun.engine.backends.base import Slot
    from gridrun.engine.backends.local import LocalBackend

    runs = [brief(s, sleep=0.2, epochs=6, checkpoint_every=1) for s in range(3)]
    root = tmp_path / "runs"
    with Store(root) as store:
        store.enqueue(runs)
        engine = ray_engine(root)
        engine.start()
        backend = engine.backend
        node2 = next(n.id for n in backend.nodes.alive.values() if n.name == "node2")

        def checkpointed_on_node2():
            engine.step(0.05)
            return [t for t in backend.tasks.values() if t.node == node2 and t.pid and
                    (t.handle.run_dir / layout.CHECKPOINTS / "last.pt").exists()]
        there = wait_for(checkpointed_on_node2, timeout=300)
        for task in there:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(task.pid, signal.SIGKILL)
        lab.remove("node2")
        drain(engine, timeout=900)
        rows = store.list_runs()
        backend.close()
    assert {r.status for r in rows} == {states.COMPLETED}
    # some run did move: its loop started again, from its checkpoint (summary's attempts)
    assert any(len(summary_of(root, r).get("attempts", [])) > 1 for r in runs)
    assert all(s.node != node2 for s in engine.slots)

    local_root = tmp_path / "local"
    local = LocalBackend(forkserver=False)
    with Store(local_root) as store:
        store.enqueue(runs)
        undisturbed = Engine(local_root, local, [Slot("gpu0", 0), Slot("gpu1", 1)], tick=0.1)
        undisturbed.start()
        drain(undisturbed, timeout=600)
    local.close()
    for run in runs:
        assert weights_of(root, run) == weights_of(local_root, run)
        steps = [r["step"] for r in runlog.read_all(layout.run_dir(
            root, run.experiment, run.id) / layout.METRICS) if r.get("split") == "train"]
        assert steps == sorted(set(steps))  # each step once: nothing trained twice
