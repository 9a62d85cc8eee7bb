"""Issue 45: the ledger is a boundary between users. NVML is the truth and an entry only
adds: another user's entry cannot pass their GPU process off as their engine's run, nor
lower what a GPU really uses; an engine that cannot write its entry places no GPU run
and says why; its entry, removed, is back within a tick; an entry's claims are capped
and whatever it makes an engine wait for is named with its owner, pid and file; the
entries read a pass are bounded per owner; `share` counts every foreign byte.

Another user is `nobody` (tests run as root here): a file chowned to them is their
entry, a process started with setuid their engine or their GPU process
(tests/ledger_kit.py). The GPUs are the kit's stand-in telemetry; runs are `sleep`s."""

from __future__ import annotations

import json
import os

import pytest
import tmpfs_kit
from ledger_kit import (
    GIB,
    NOBODY,
    Gpus,
    Users,
    committed,
    gpu_engine,
    needs_root,
    plant,
    pretend_daemon,
)
from test_engine_kit import make_run
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.engine import daemon, foreign, packing
from gridrun.engine.ledger import Ledger
from gridrun.engine.scheduler import CPU_CAP
from gridrun.engine.telemetry import GpuProcess
from gridrun.runs.store import Store


@pytest.fixture
def users():
    kept = Users()
    yield kept
    kept.close()


@pytest.fixture
def folder(tmp_path):
    return tmp_path / "ledger"


def queue(root, *runs) -> list:
    with Store(root) as store:
        store.enqueue(list(runs))
    return list(runs)


def runs(n: int, gib: float, experiment: str = "e") -> list:
    return [make_run(seed=s, experiment=experiment, epochs=1, threads=1, gpu_memory=gib)
            for s in range(n)]


def status(root) -> list[str]:
    pretend_daemon(root)
    try:
        result = CliRunner().invoke(app, ["engine", "status", "--root", str(root)])
    finally:
        (root / daemon.PID).unlink()
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def steps(*engines, n: int = 3) -> None:
    for _ in range(n):
        for engine in engines:
            engine.step(0.01)


def stop(*engines) -> None:
    for engine in engines:
        engine.request_stop()
        engine.backend.close()
        if engine.sharing:
            engine.sharing.close()
        engine.store.close()


# ---- NVML is the truth; the ledger only adds ----------------------------------------------


@needs_root
@pytest.mark.parametrize("engine_pid", ["the hog itself", "another of their processes"])
@pytest.mark.parametrize(("policy", "per_gpu"), [("avoid", "auto"), ("share", "auto"),
                                                 ("avoid", 1), ("share", 1)])
def test_an_entry_naming_their_own_gpu_process_leaves_that_gpu_full(
        tmp_path, folder, users, policy, per_gpu, engine_pid):
    """nobody's 7 GiB process on the 8 GiB GPU, and nobody's 84-byte entry naming it as
    their engine's run: it is foreign all the same (not descended from a live engine of
    theirs), so no 3 GiB run starts there, under any policy, and status names it."""
    hog, hog_start = users.process(NOBODY)
    gpus = Gpus([8 * GIB])
    gpus.procs.append((hog, 0, 7 * GIB))
    engine_at = (hog, hog_start) if engine_pid == "the hog itself" else users.process(NOBODY)
    plant(folder, NOBODY, pid=engine_at[0], start_time=engine_at[1], pids=[hog])
    root = tmp_path / "runs"
    queue(root, *runs(2, 3.0))
    engine = gpu_engine(root, gpus, slots=2 if per_gpu == 1 else 4, runs_per_gpu=per_gpu,
                        foreign=policy, ledger=Ledger(folder))
    try:
        engine.start()
        steps(engine)
        assert engine.active == {}
        lines = status(root)
    finally:
        stop(engine)
    named = f"nobody (pid {hog}, 7.0 GiB)"
    if policy == "avoid":
        assert f"gpu0: taken by {named}: no new run starts there ([engine] foreign = \"share\" " \
               "to use it anyway)" in lines, lines
    else:
        assert f"gpu0: shared with {named}: runs start there beside them ([engine] foreign " \
               "= \"share\")" in lines, lines
        assert any("7.0 GiB used by others' processes" in line for line in lines), lines


@needs_root
def test_an_entry_can_never_lower_what_the_gpu_really_uses(tmp_path, folder, users):
    """A run of nobody's that is verifiably their engine's (their process, a child of their
    live engine process) is not foreign, and its entry commits nothing: NVML still says
    its 7 GiB are used, and the GPU's room is what NVML says is free."""
    engine_pid, start, child = users.family(NOBODY)
    gpus = Gpus([8 * GIB])
    gpus.procs.append((child, 0, 7 * GIB))
    plant(folder, NOBODY, pid=engine_pid, start_time=start, pids=[child])
    root = tmp_path / "runs"
    queue(root, *runs(2, 3.0))
    engine = gpu_engine(root, gpus, ledger=Ledger(folder))
    try:
        engine.start()
        steps(engine)
        assert engine.active == {}
        assert engine.others.gpus == []  # their engine's run: not someone else's process
        lines = status(root)
    finally:
        stop(engine)
    assert any(line.startswith("gpu0: 8.0 GiB:") and "NVML reports 7.0 GiB used" in line
               for line in lines), lines
    assert any(line.startswith("queue: no GPU has 3.0 GiB free") for line in lines), lines


def test_share_counts_every_foreign_byte(tmp_path, users):
    """30 processes of 250 MiB each (under the 256 MiB that takes a GPU from "avoid")
    fill 7.3 of the 8 GiB: under "share" no 3 GiB run is packed beside them."""
    gpus = Gpus([8 * GIB])
    for _ in range(30):
        gpus.procs.append((users.process(os.geteuid())[0], 0, 250 << 20))
    watch = foreign.Watch("share")
    watch.sample(gpus, {}, {0}, set())
    assert watch.memory()[0] == 30 * (250 << 20)
    root = tmp_path / "runs"
    queue(root, *runs(1, 3.0))
    engine = gpu_engine(root, gpus, foreign="share")
    try:
        engine.start()
        steps(engine)
        assert engine.active == {}
    finally:
        stop(engine)


def test_where_nvml_lists_no_process_its_used_memory_counts(tmp_path):
    gpus = Gpus([8 * GIB], used=[7 * GIB])  # a process NVML does not list (a container's)
    root = tmp_path / "runs"
    queue(root, *runs(1, 3.0))
    engine = gpu_engine(root, gpus, foreign="share")
    try:
        engine.start()
        steps(engine)
        assert engine.active == {}
        lines = status(root)
    finally:
        stop(engine)
    assert any("NVML reports 7.0 GiB used" in line for line in lines), lines


def test_a_gpu_of_unknown_size_says_so_instead_of_0_gib_free(tmp_path):
    gpus = Gpus([None])
    root = tmp_path / "runs"
    engine = gpu_engine(root, gpus)
    try:
        engine.start()
        steps(engine, n=1)
        lines = status(root)
    finally:
        stop(engine)
    [line] = [line for line in lines if line.startswith("gpu0")]
    assert "free" not in line and "size is unknown" in line, line
    assert packing.book_lines({"gpus": [{"gpu": 1, "total": None, "free": None}]}) == [
        "gpu1: its memory size is unknown (NVML does not report it): runs are placed there "
        "by slots alone, one at a time under runs_per_gpu = \"auto\""]


def test_a_commitment_not_in_use_yet_is_counted_beside_memory_nvml_lists_nowhere():
    """Found by the property test: another engine commits 1 GiB it does not use yet, and
    NVML reports 0.5 GiB used that no listed process holds; both are out of the room.
    A run's listed use within its commitment counts once; beyond it, on top."""
    book = packing.Book("auto")
    book.sizes([{"index": 0, "mem_total_bytes": 8 * GIB, "mem_used_bytes": GIB // 2,
                 "uuid": "GPU-0000"}])
    [room] = book.rooms({}, {"GPU-0000": GIB}, {}, [0]).values()
    assert room.free == 8 * GIB - GIB - GIB // 2 - packing.HEADROOM
    book.sizes([{"index": 0, "mem_total_bytes": 8 * GIB, "mem_used_bytes": 3 * GIB,
                 "uuid": "GPU-0000"}])
    # our 2 GiB commitment, 2.5 GiB of what NVML reports used by our run's process
    [room] = book.rooms({0: 2 * GIB}, {}, {}, [0], {"GPU-0000": (2 * GIB, GIB // 2)}).values()
    assert room.free == 8 * GIB - 2 * GIB - (3 * GIB - 2 * GIB) - packing.HEADROOM


# ---- fail closed, and say so -----------------------------------------------------------------


@needs_root
def test_a_full_ledger_file_system_never_over_commits(tmp_path):
    """Anyone can fill /dev/shm: two engines whose entries cannot be written place no GPU
    run (each would think the GPU its own) and say why; once there is space they place
    as one: never 5 + 5 GiB on the 8 GiB GPU."""
    gpus = Gpus([8 * GIB])
    with tmpfs_kit.mounted(tmp_path / "shm", "1m") as shm:
        folder = shm / "gridrun-ledger"
        engines = []
        for name in ("alice", "bob"):
            root = tmp_path / name
            queue(root, *runs(2, 5.0, experiment=name))
            engines.append(gpu_engine(root, gpus, ledger=Ledger(folder)))
        filler = tmpfs_kit.fill(shm)
        try:
            for engine in engines:
                engine.start()
            steps(*engines)
            assert [e.active for e in engines] == [{}, {}]
            lines = status(tmp_path / "alice")
            said = [line for line in lines if "cannot be written" in line]
            assert len(said) == 1, lines
            assert f"the GPU ledger {folder} cannot be written (No space left on device)" in said[0]
            assert f"tmpfs at {shm}" in said[0] and "100% used" in said[0]
            assert "no run starts on a GPU until" in said[0]
            filler.unlink()
            steps(*engines)
            assert committed(*engines) == {0: 5 * GIB}
            assert [line for line in status(tmp_path / "alice") if "cannot be written" in line] == []
        finally:
            stop(*engines)


def test_a_ledger_that_cannot_be_read_places_nothing(tmp_path, folder, monkeypatch):
    """Others' commitments unknown (the folder cannot be listed): nothing is placed."""
    real = os.listdir
    gpus = Gpus([8 * GIB])
    root = tmp_path / "runs"
    queue(root, *runs(1, 1.0))
    engine = gpu_engine(root, gpus, ledger=Ledger(folder))

    def unreadable(path="."):
        if path == engine.sharing.ledger._dir:  # the ledger's folder, by its descriptor
            raise PermissionError(13, "Permission denied")
        return real(path)

    try:
        monkeypatch.setattr(os, "listdir", unreadable)
        engine.start()
        steps(engine)
        assert engine.active == {}
        monkeypatch.setattr(os, "listdir", real)
        lines = status(root)
    finally:
        stop(engine)
    assert any(f"the GPU ledger {folder} cannot be read (Permission denied)" in line
               for line in lines), lines


def test_a_removed_entry_is_back_within_one_tick(tmp_path, folder):
    gpus = Gpus([8 * GIB])
    root = tmp_path / "runs"
    queue(root, *runs(1, 2.0))
    engine = gpu_engine(root, gpus, ledger=Ledger(folder))
    try:
        engine.start()
        engine.step(0.01)
        [entry] = folder.glob("*.json")
        written = json.loads(entry.read_text())
        assert written["gpus"] == {"GPU-0000": 2 * GIB}
        entry.unlink()  # the folder's owner may remove any entry in it
        engine.step(0.01)
        assert json.loads(entry.read_text()) == written
        entry.write_text(json.dumps({**written, "gpus": {}}))  # or change it in place
        engine.step(0.01)
        assert json.loads(entry.read_text()) == written
    finally:
        stop(engine)


@needs_root
def test_status_says_whose_folder_removed_the_entry(tmp_path, folder):
    folder.mkdir(mode=0o1777)
    folder.chmod(0o1777)
    os.chown(folder, NOBODY, NOBODY)
    gpus = Gpus([8 * GIB])
    root = tmp_path / "runs"
    engine = gpu_engine(root, gpus, ledger=Ledger(folder))
    try:
        engine.start()
        engine.step(0.01)
        [entry] = folder.glob("*.json")
        entry.unlink()
        engine.step(0.01)
        assert entry.exists()
        lines = status(root)
    finally:
        stop(engine)
    [said] = [line for line in lines if "was removed" in line]
    assert f"the GPU ledger {folder} belongs to nobody (uid {NOBODY})" in said, said
    assert "tmpfiles.d" in said


# ---- bounds, and names for what an entry makes us wait for ----------------------------------


@needs_root
def test_an_entry_claiming_every_thread_names_its_owner_and_file(tmp_path, folder, users):
    pid, start = users.process(NOBODY)
    path = plant(folder, NOBODY, pid=pid, start_time=start, threads=1 << 20)
    gpus = Gpus([8 * GIB])
    root = tmp_path / "runs"
    queue(root, *runs(1, 1.0))
    engine = gpu_engine(root, gpus, cores=4, ledger=Ledger(folder))
    try:
        engine.start()
        steps(engine)
        assert engine.active == {}
        cap = engine.store.get_state(CPU_CAP)
        assert cap["holding"] == 4  # capped at the machine's cores, not 1048576
        lines = status(root)
    finally:
        stop(engine)
    [line] = [line for line in lines if line.startswith("cpu:")]
    assert f"nobody's engine (pid {pid}, {path}) holds 4" in line, line
    assert 'threads = "auto"' not in line and "threads = 1" not in line, line


@needs_root
def test_an_entry_claiming_2_50_bytes_names_its_owner_and_file(tmp_path, folder, users):
    pid, start = users.process(NOBODY)
    path = plant(folder, NOBODY, pid=pid, start_time=start, gpus={"GPU-0000": 1 << 50})
    gpus = Gpus([8 * GIB])
    root = tmp_path / "runs"
    queue(root, *runs(1, 1.0))
    engine = gpu_engine(root, gpus, ledger=Ledger(folder))
    try:
        engine.start()
        steps(engine)
        assert engine.active == {}
        lines = status(root)
    finally:
        stop(engine)
    assert any(line.startswith("gpu0: 8.0 GiB:") and "8.0 GiB by other gridrun engines" in line
               for line in lines), lines  # capped at the GPU's size
    [line] = [line for line in lines if line.startswith("queue: no GPU has 1.0 GiB free")]
    assert f"nobody's engine (pid {pid}, {path}) commits 8.0 GiB on gpu0" in line, line


@needs_root
def test_the_entries_read_a_pass_are_bounded_per_owner(folder, users):
    from gridrun.engine.entries import PER_OWNER

    pid, start = users.process(NOBODY)
    for i in range(PER_OWNER * 4):
        plant(folder, NOBODY, pid=pid, start_time=start, gpus={"GPU-x": 1}, token=f"{i:04x}")
    ours = Ledger(folder)
    ours.write({}, 0, [])
    seen = ours.others()
    assert len(seen) == PER_OWNER and ours.opened == PER_OWNER
    assert ours.passed_over == {NOBODY: PER_OWNER * 3}
    assert ours.others(max_age=3600) == seen and ours.opened == 0  # nothing changed: none read
    assert ours.notes() == [f"the GPU ledger {folder} holds {PER_OWNER * 4} entries of nobody: "
                            f"only the first {PER_OWNER} are read"]


def test_what_a_gpu_process_is_to_the_watch():
    """Every foreign byte counts under "share", a small process takes no GPU under
    "avoid", and memory NVML does not report takes it."""
    procs = [GpuProcess(11, 0, 100 << 20, "bob"), GpuProcess(12, 0, 100 << 20, "bob"),
             GpuProcess(13, 1, None, "carol")]
    t = type("T", (), {"processes": lambda self: {}, "gpu_processes": lambda self: procs})()
    for policy in ("avoid", "share"):
        watch = foreign.Watch(policy)
        watch.sample(t, {}, {0, 1}, set())
        assert [g["gpu"] for g in watch.gpus] == [1]
        assert watch.memory().get(0) == 200 << 20


# ---- NVML that is there but answers nothing -------------------------------------------------


NVML_CALLS = ("nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName",
              "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUUID", "nvmlDeviceGetComputeRunningProcesses",
              "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage",
              "nvmlDeviceGetTemperature", "nvmlDeviceGetClockInfo")


def test_an_nvml_that_fails_every_call_is_said_not_silently_the_cpu(tmp_path, monkeypatch, caplog):
    import logging
    import sys

    from ledger_kit import Sleepers
    from test_telemetry import fake_nvml

    from gridrun.engine.backends.base import Slot
    from gridrun.engine.backends.slots import gpu_count
    from gridrun.engine.scheduler import Engine
    from gridrun.engine.telemetry import Telemetry

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(count=1, broken=set(NVML_CALLS)))
    assert gpu_count() == 0  # the engine's slots are the CPU's
    root = tmp_path / "runs"
    engine = Engine(root, Sleepers(), [Slot("cpu0")], telemetry=Telemetry(), telemetry_every=0.0)
    try:
        with caplog.at_level(logging.WARNING, logger="gridrun.engine"):
            engine.start()
            steps(engine)
        lines = status(root)
    finally:
        stop(engine)
    said = ("gpus: NVML is installed but fails (NVML unavailable: nvmlDeviceGetCount: Not "
            "Supported): no GPU is seen or measured, so runs use the CPU")
    [line] = [line for line in lines if line.startswith("gpus:")]
    [logged] = [r.getMessage() for r in caplog.records if "NVML" in r.getMessage()]  # once
    assert line.startswith(said) and logged == line, (lines, logged)
    # a machine without an NVIDIA driver says nothing of it: there is no GPU, and no fault
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(count=1, init_error=True))
    assert Telemetry().failing is None
