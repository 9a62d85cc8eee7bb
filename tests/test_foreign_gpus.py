"""Issue 37: never place a run on a GPU someone else is using. With a fake 4-GPU NVML
where GPU 1 holds another user's 20 GiB process, no run starts on GPU 1 by default,
and `engine status`, `gridrun ls` and the interface name that GPU, the process's user
and its memory; `[engine] foreign = "share"` places runs there anyway
(engine/foreign.py, engine/placement.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import pwd
import signal
import subprocess
import sys
import time
import types

import patience
import pytest
from test_engine_kit import make_run, slow_run, wait_for
from test_telemetry import fake_nvml
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.engine import daemon, foreign
from gridrun.engine.backends.base import Slot
from gridrun.engine.backends.child import process_start_time
from gridrun.engine.backends.slots import slots_for
from gridrun.engine.placement import Want, plan
from gridrun.engine.scheduler import FOREIGN, Engine
from gridrun.engine.telemetry import GpuProcess, Telemetry
from gridrun.runs import states
from gridrun.runs.store import Store
from gridrun.spec import EngineConfig

GIB = 1 << 30
FOUR = [Slot(f"gpu{i}", i) for i in range(4)]
ME = pwd.getpwuid(os.getuid()).pw_name
# the colleague: `nobody` when the tests run as root, else ourselves (a process that is
# not this engine's run is foreign whoever owns it)
THEM = "nobody" if os.geteuid() == 0 else ME


# ---- a colleague's process, a fake NVML that lists it on GPU 1 ---------------------------


@pytest.fixture
def colleague():
    """A real process (`sleep 600`) as another user when we may (root: nobody)."""
    def become():
        if os.geteuid() == 0:
            os.setgid(pwd.getpwnam(THEM).pw_gid)
            os.setuid(pwd.getpwnam(THEM).pw_uid)
    proc = subprocess.Popen(["sleep", "600"], preexec_fn=become, stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        patience.wait(proc, 60)


class Lists(dict):
    """fake_nvml's `procs`, read at each call: the colleague's 20 GiB on GPU 1, and each
    of the engine's running runs (2 GiB) on the GPU its slot names, as NVML would."""

    def __init__(self, colleague_pid: int):
        super().__init__()
        self.colleague, self.engine = colleague_pid, None

    def get(self, gpu, default=None):
        out = [(self.colleague, 20 * GIB)] if gpu == 1 else []
        for act in list(self.engine.active.values()) if self.engine else []:
            if act.slot is not None and gpu in {p.gpu for p in act.slot.parts}:
                out.append((act.handle.pid, 2 * GIB))
        return out


@pytest.fixture
def nvml(monkeypatch, colleague):
    lists = Lists(colleague.pid)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(count=4, procs=lists))
    return lists


@pytest.fixture(scope="module")
def gpu_backend(stand_in_gpus, tmp_path_factory):
    """A fork server started with GRIDRUN_FAKE_GPUS=1: a run given a GPU trains on the CPU."""
    from gridrun.engine.backends.local import LocalBackend

    b = LocalBackend(log_path=tmp_path_factory.mktemp("fs") / "forkserver.log")
    b.start()
    yield b
    b.close()


class Kept:
    """The module's backend, which an engine that stops must not close; it keeps the
    slot of each launch."""

    def __init__(self, inner):
        self.inner, self.launched = inner, {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def launch(self, run_id, run_dir, slot, *, fresh=False):
        self.launched.setdefault(run_id, []).append(slot.name)
        return self.inner.launch(run_id, run_dir, slot, fresh=fresh)

    def close(self) -> None:
        pass


def four_gpu_engine(root, backend, nvml, **kw) -> Engine:
    engine = Engine(root, Kept(backend), list(FOUR), backoff=0.05, telemetry=Telemetry(),
                    telemetry_every=0.1, processes_every=0.1, **kw)
    nvml.engine = engine
    return engine


def tiny(seed: int):
    return make_run(seed=seed, epochs=1, threads=1)


def brief(seed: int):
    """A run that lasts long enough (about 8 steps of 0.05 s) for samples to see it."""
    return slow_run(seed=seed, sleep=0.05, epochs=1, threads=1)


def pretend_daemon(root) -> None:
    """engine.pid naming this process: the in-process engine is the root's engine for
    `engine status`, `ls` and the interface (its loop writes the heartbeat)."""
    pid = os.getpid()
    (root / daemon.PID).write_text(json.dumps({"pid": pid, "start_time": process_start_time(pid),
                                               "started_at": time.time(), "state": "running"}))


# ---- telemetry, the ancestry check, the rule, the placement: pure or nearly -------------


def test_telemetry_lists_each_gpus_processes_with_memory_and_user(monkeypatch, colleague):
    procs = {0: [(os.getpid(), 3 * GIB)], 1: [(colleague.pid, 20 * GIB), (999_999_999, None)]}
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(count=2, procs=procs))
    t = Telemetry()
    assert t.gpu_processes() == [
        GpuProcess(os.getpid(), 0, 3 * GIB, ME, "GPU-0000"),
        GpuProcess(colleague.pid, 1, 20 * GIB, THEM, "GPU-0001"),
        GpuProcess(999_999_999, 1, None, "?", "GPU-0001")]  # gone or another PID namespace
    assert t.processes() == {os.getpid(): 0, colleague.pid: 1, 999_999_999: 1}
    # NVML failing on every query of the listing: nothing listed, nothing raised
    broken = {"nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetUUID"}
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(count=2, procs=procs, broken=broken))
    assert Telemetry().gpu_processes() == []
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML at all
    assert Telemetry().gpu_processes() == []


def test_a_runs_own_children_are_not_foreign():
    """A multi-device run's ranks are children of its process: the ancestry says so."""
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                               "c = subprocess.Popen(['sleep', '600']); print(c.pid, flush=True); "
                               "sys.stdin.read(); c.kill()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert foreign.owner(child, {parent.pid}) is True  # its rank: ours
        assert foreign.owner(parent.pid, {parent.pid}) is True
        assert foreign.owner(parent.pid, {child}) is False  # a parent is no descendant
        assert foreign.owner(child, {1_000_000_000}) is False  # nobody's run: foreign
        assert foreign.owner(999_999_999, {parent.pid}) is None  # cannot be seen here
    finally:
        patience.communicate(parent, 60, "")


def test_what_takes_a_gpu():
    procs = [GpuProcess(10, 0, 2 * GIB, "me"),  # the engine's run
             GpuProcess(11, 0, 100 << 20, "bob"),  # a small context: below the threshold
             GpuProcess(12, 1, 20 * GIB, "alice", "GPU-b"),
             GpuProcess(13, 2, None, "carol"),  # memory not reported: counts as above
             GpuProcess(14, 3, 20 * GIB, "?")]  # cannot be seen, on a GPU a run holds
    ours = {10: True}
    got = foreign.taken(procs, {10}, ours=lambda pid, runs: ours.get(pid, None if pid == 14 else False))
    assert [g["gpu"] for g in got] == [1, 2, 3]
    assert got[0] == {"gpu": 1, "uuid": "GPU-b",
                      "processes": [{"pid": 12, "user": "alice", "mem_bytes": 20 * GIB}]}
    # in a PID namespace of its own, what cannot be seen on a GPU a run holds is the run's
    blind = foreign.taken(procs, {10}, held={3}, blind=True,
                          ours=lambda pid, runs: ours.get(pid, None if pid == 14 else False))
    assert [g["gpu"] for g in blind] == [1, 2]
    # only the GPUs the engine has (gpus = [0, 2])
    assert [g["gpu"] for g in foreign.taken(procs, {10}, keys={0, 2}, ours=lambda p, r: p == 10)] == [2]


def test_the_placement_offers_no_slot_of_a_taken_gpu():
    four = slots_for(EngineConfig(gpus=(0, 1, 2, 3)))
    p = plan([Want(f"r{i}") for i in range(4)], four, (), (), 8, avoid={1})
    assert [(r, s.name) for r, s in p.starts] == [("r0", "gpu0"), ("r1", "gpu2"), ("r2", "gpu3")]
    # r3 waits only because every free GPU is taken: said
    assert p.taken == {"run_id": "r3", "gpus": ["gpu1"]}
    # a run already on the taken GPU goes on; one that waits for a slot like any other
    # (none is free) is not said to wait for the taken GPU
    p = plan([Want("r4")], four, {"gpu0", "gpu1", "gpu2", "gpu3"}, (), 8, avoid={1})
    assert p.starts == [] and p.taken is None
    # a gang takes distinct GPUs none of which is taken; runs_per_gpu = 2 slots share it
    p = plan([Want("g", devices=2)], slots_for(EngineConfig(gpus=(0, 1, 2), runs_per_gpu=2)),
             (), (), 8, avoid={1})
    assert [s.name for s in p.starts[0][1].parts] == ["gpu0.0", "gpu2.0"]
    # a GPU given by UUID is matched by its UUID
    uuids = [Slot("gpu0", 0, "GPU-a"), Slot("gpu1", 1, "GPU-b")]
    assert [s.name for _, s in plan([Want("u")], uuids, (), (), 8, avoid={1, "GPU-a"}).starts] == ["gpu1"]
    # nothing to avoid: as before
    assert len(plan([Want(f"r{i}") for i in range(4)], four, (), (), 8).starts) == 4


def test_the_state_and_its_lines():
    watch = foreign.Watch("avoid")
    t = types.SimpleNamespace(processes=lambda: {4242: 1},
                              gpu_processes=lambda: [GpuProcess(4242, 1, 20 * GIB, "alice")])
    assert watch.sample(t, {}, {0, 1}, set()) is True
    assert watch.avoid() == {1} and watch.sample(t, {}, {0, 1}, set()) is False  # no change
    state = watch.state({"run_id": "abc", "gpus": ["gpu1"]})
    assert foreign.gpu_lines(state) == [
        'gpu1: taken by alice (pid 4242, 20.0 GiB): no new run starts there ([engine] foreign '
        '= "share" to use it anyway)']
    assert foreign.waits_line(state) == (
        'queue: every free GPU (gpu1) is taken by others: abc and the runs after it wait until '
        'one is free ([engine] foreign = "share" to use them anyway)')
    share = foreign.Watch("share")
    share.sample(t, {}, {0, 1}, set())
    assert share.avoid() == frozenset() and share.state({"run_id": "abc"})["waits"] is None
    assert foreign.gpu_lines(share.state())[0].startswith("gpu1: shared with alice (pid 4242, ")
    # a state written by hand or another version says nothing rather than fail
    assert foreign.gpu_lines({"gpus": [1, {"gpu": 2}]}) == [] and foreign.gpu_lines("x") == []


def test_a_bad_value_of_the_key_is_one_line(tmp_path):
    f = tmp_path / "e.toml"
    f.write_text('[experiments.a]\ntask = "spirals"\n\n[engine]\nforeign = "shared"\n')
    result = CliRunner().invoke(app, ["plan", str(f)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    line = result.stderr.splitlines()[0]
    assert line == (f'{f}:5: engine.foreign: expected "avoid" (no new run on a GPU where another '
                    'user\'s process computes) or "share" (runs start there beside it), got '
                    "'shared' (did you mean 'share'?)")
    f.write_text('[experiments.a]\ntask = "spirals"\n\n[engine]\nforeign = "share"\n')
    from gridrun.spec import load

    assert load(f).engine.foreign == "share" and EngineConfig().foreign == "avoid"


# ---- the engine, with real workers --------------------------------------------------------


def test_no_run_starts_on_the_gpu_a_colleague_uses(tmp_path, gpu_backend, nvml, colleague):
    root = tmp_path / "runs"
    runs = [brief(s) for s in range(5)]
    with Store(root) as store:
        store.enqueue(runs)
        engine = four_gpu_engine(root, gpu_backend, nvml)
        engine.start()
        engine.step(0.01)
        # three runs on the three free GPUs; the fourth waits, and says why
        assert sorted(a.slot.name for a in engine.active.values()) == ["gpu0", "gpu2", "gpu3"]
        state = store.get_state(FOREIGN)
        assert state["gpus"] == [{"gpu": 1, "uuid": "GPU-0001", "processes": [
            {"pid": colleague.pid, "user": THEM, "mem_bytes": 20 * GIB}]}]
        assert state["waits"] == {"run_id": runs[3].id, "gpus": ["gpu1"]}
        pretend_daemon(root)
        status = CliRunner().invoke(app, ["engine", "status", "--root", str(root)])
        ls = CliRunner().invoke(app, ["ls", "--root", str(root)])
        seen, slots, ours = set(), {}, set()
        deadline = patience.Deadline(300)
        while not engine.idle():  # drain, watching what the engine takes for foreign
            assert not deadline.passed(), "the queue did not drain"
            engine.step()
            seen |= {g["gpu"] for g in engine.others.gpus}
            ours |= {p["run_id"] for p in engine.others.listed if p["run_id"]}
            slots |= {r.id: {r.slot} | slots.get(r.id, set())
                      for r in store.list_runs(status=states.RUNNING)}
        got = store.list_runs()
        engine.request_stop()
        engine.run()  # stops at once: nothing runs; clears what it said
        assert store.get_state(FOREIGN) is None
        cleared = CliRunner().invoke(app, ["ls", "--root", str(root)])
    (root / daemon.PID).unlink()
    assert {r.status for r in got} == {states.COMPLETED}
    launched = engine.backend.launched
    assert set(launched) == {r.id for r in runs} and all(len(s) == 1 for s in launched.values())
    assert "gpu1" not in {s for each in launched.values() for s in each}
    assert not any("gpu1" in s for s in slots.values())  # as the store said while they ran
    # the engine's own runs, listed by NVML too (2 GiB each), were never foreign
    assert seen == {1} and ours, "no sample saw a run of the engine's"
    line = (f"gpu1: taken by {THEM} (pid {colleague.pid}, 20.0 GiB): no new run starts there "
            '([engine] foreign = "share" to use it anyway)')
    assert status.exit_code == 0 and line in status.stdout.splitlines(), status.output
    assert (f"queue: every free GPU (gpu1) is taken by others: {runs[3].id} and the runs after "
            "it wait") in status.stdout
    assert json.loads(CliRunner().invoke(app, ["engine", "status", "--json", "--root", str(root)])
                      .stdout)["foreign_gpus"] is None  # the engine is gone: nothing said
    assert ls.exit_code == 0 and ls.stderr.splitlines() == [line] and "gpu1" not in ls.stdout
    assert "taken by" not in cleared.output


def test_share_starts_runs_beside_them(tmp_path, gpu_backend, nvml, colleague):
    root = tmp_path / "runs"
    runs = [tiny(s) for s in range(4)]
    with Store(root) as store:
        store.enqueue(runs)
        engine = four_gpu_engine(root, gpu_backend, nvml, foreign="share")
        engine.start()
        engine.step(0.01)
        assert sorted(a.slot.name for a in engine.active.values()) == ["gpu0", "gpu1", "gpu2", "gpu3"]
        assert store.get_state(FOREIGN)["policy"] == "share"
        wait_for(lambda: engine.step() or engine.idle(), timeout=300)
        assert {r.status for r in store.list_runs()} == {states.COMPLETED}


def test_the_table_key_sets_the_engines_policy(tmp_path, gpu_backend, nvml):
    for saved, policy in (({"foreign": "share"}, "share"), ({}, "avoid")):
        with Store(tmp_path) as store:
            store.set_state("engine_config", saved)  # as `gridrun queue` keeps the table
        engine = four_gpu_engine(tmp_path, gpu_backend, nvml)
        engine.store.close()
        assert engine.others.policy == policy


# ---- the interface ------------------------------------------------------------------------


def aio(fn):  # as tests/tui/tui_helpers.py: each Pilot test runs its own loop
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


async def settle(pilot) -> None:
    """Until the bridge has delivered a poll and the screen caught up."""
    for _ in range(250):
        if pilot.app.ticks >= 1:
            break
        await pilot.pause(0.02)
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


@aio
async def test_the_machine_panel_names_the_colleague_and_the_memory(tmp_path, gpu_backend, nvml,
                                                                    colleague):
    from gridrun.tui.app import GridrunApp
    from gridrun.tui.store_source import FOREIGN as TUI_FOREIGN
    from gridrun.tui.store_source import StoreSource

    assert TUI_FOREIGN == FOREIGN  # the interface reads the state the engine writes
    engine = four_gpu_engine(tmp_path, gpu_backend, nvml)
    engine.start()
    engine.step(0.01)  # nothing queued: it samples the GPUs, says who takes one
    engine.store.close()
    pretend_daemon(tmp_path)
    try:
        app = GridrunApp(StoreSource(tmp_path), live=False)
        async with app.run_test(size=(160, 40)) as pilot:
            await settle(pilot)
            lines = str(app.main.query_one("#machine").render()).splitlines()
    finally:
        (tmp_path / daemon.PID).unlink()
    assert len(lines) == 4, lines
    assert lines[1].startswith("gpu1 ") and f"taken by {THEM} (pid {colleague.pid}, 20.0 GiB)" in lines[1], lines
    assert not any("taken by" in line for i, line in enumerate(lines) if i != 1)
