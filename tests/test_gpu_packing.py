"""Issue 37: runs packed on a GPU by their memory, engines that share a machine.

- Two engines in two roots on the same fake 1-GPU machine, each with a queue of 20 runs
  of known budgets (`gpu_memory`): every launch is recorded with its budget, and the
  budgets of the runs running at once, both engines together, never pass the GPU's
  memory; every run completes once (engine/ledger.py, engine/sharing.py).
- A run that outgrows its budget fails alone with one line, is retried once with the
  need it measured, and its neighbours' weights are those of the same runs alone.
- `runs_per_gpu = "auto"`: a shape never measured starts alone on its GPU; once it has
  ended, the runs of its shape are packed by what it measured.

The GPUs are a fake NVML (tests/test_telemetry.py) and the runs train on the CPU
(GRIDRUN_FAKE_GPUS=1), where a run's memory is its resident memory.
"""

from __future__ import annotations

import sys
import threading
import time
import types

import patience
import pytest
from test_engine_kit import finished, make_run, summary
from test_memory_budget import USER_TASK
from test_telemetry import fake_nvml
from user_folder import user_package

from gridrun.engine import packing, placement
from gridrun.engine.backends.base import Slot
from gridrun.engine.backends.local import LocalBackend
from gridrun.engine.ledger import Ledger
from gridrun.engine.packing import GIB, Book, Room, shape
from gridrun.engine.scheduler import Engine
from gridrun.engine.telemetry import Telemetry
from gridrun.runs import states
from gridrun.runs.store import Store

TOTAL = 80 * GIB  # the fake NVML's GPU


# ---- shapes, budgets, placement: pure -------------------------------------------------


def test_a_shape_is_the_config_without_its_seed_and_what_never_changes_memory():
    base = make_run(seed=0, lr=0.01, epochs=2).to_dict()
    assert shape(base) == shape(make_run(seed=7, lr=0.1, epochs=9, experiment="other").to_dict())
    assert shape(base) != shape(make_run(seed=0, lr=0.01, epochs=2, batch_size=128).to_dict())
    assert shape(base) != shape(make_run(seed=0, lr=0.01, epochs=2,
                                         task_args={"hidden": 512}).to_dict())


def test_a_budget_is_the_retry_then_the_key_then_the_measured_need():
    book = Book("auto")
    config = make_run(seed=0).to_dict()
    assert book.budget(config) is None  # never measured: it starts alone
    book.learn(make_run(seed=3).to_dict(), {"step": 5, "peak_memory_bytes": GIB,
                                            "device": "cuda"})
    need = GIB + packing.CONTEXT
    assert book.budget(config) == packing.rounded(need * 1.1)
    book.learn(config, {"step": 0, "peak_memory_bytes": 40 * GIB})  # never trained: says nothing
    assert book.budget(config) == packing.rounded(need * 1.1)
    given = make_run(seed=0, gpu_memory=6.0).to_dict()
    assert book.budget(given) == 6 * GIB
    retry = [{"kind": "budget", "budget_bytes": [6 * GIB, 9 * GIB]}]
    assert book.budget(given, retry) == 9 * GIB
    assert Book(4).budget(config) == 0.25  # an integer runs_per_gpu: a share of the GPU


def test_placement_fits_best_and_an_unmeasured_shape_takes_a_gpu_alone():
    slots = [Slot(f"gpu{g}.{k}", g) for g in range(2) for k in range(4)]
    rooms = {0: Room(TOTAL, 30 * GIB, False), 1: Room(TOTAL, 50 * GIB, False)}
    wants = [placement.Want("a", budget=25 * GIB), placement.Want("b", budget=25 * GIB),
             placement.Want("c", budget=30 * GIB)]
    plan = placement.plan(wants, slots, [], [], 64, rooms=rooms)
    assert [(r, s.gpu) for r, s in plan.starts] == [("a", 0), ("b", 1)]  # the tightest fit first
    assert plan.memory == {"run_id": "c", "need": 30 * GIB, "free": 25 * GIB}
    assert plan.commits == {"a": 25 * GIB, "b": 25 * GIB}
    alone = placement.plan([placement.Want("x", budget=None), placement.Want("y", budget=None)],
                           slots, [], [], 64, rooms={0: Room(TOTAL, TOTAL, True),
                                                     1: Room(TOTAL, 70 * GIB, False)})
    assert [(r, s.gpu) for r, s in alone.starts] == [("x", 0)]
    assert alone.commits == {"x": TOTAL} and alone.memory["need"] is None


def test_a_budget_larger_than_every_gpu_is_refused_in_one_line_not_kept_waiting():
    slots = [Slot("gpu0.0", 0), Slot("gpu0.1", 0)]
    plan = placement.plan([placement.Want("big", budget=100 * GIB), placement.Want("ok", budget=GIB)],
                          slots, [], [], 64, rooms={0: Room(TOTAL, TOTAL, True)})
    assert [r for r, _ in plan.starts] == ["ok"]  # it holds nothing back
    ((run_id, why),) = plan.refused
    assert run_id == "big" and "\n" not in why
    assert why == ("its memory budget, 100.0 GiB, is more than any of this engine's GPUs has "
                   "(80.0 GiB): lower gpu_memory, or run it where the GPUs are larger")


# ---- engines in threads, on a fake GPU ------------------------------------------------


class Recorder:
    """A backend that records every launch (when, which engine, the budget it was given)
    and every end it reports; the engines' own backends do the work."""

    lock = threading.Lock()

    def __init__(self, inner, events: list[tuple[float, str, str, int]]):
        self.inner, self.events = inner, events  # (t, "start" | "end", run id, bytes)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def launch(self, run_id, run_dir, slot, *, fresh=False):
        with self.lock:  # recorded before the process exists: its commit is already made
            self.events.append((time.monotonic(), "start", run_id, slot.budget or 0))
        return self.inner.launch(run_id, run_dir, slot, fresh=fresh)

    def poll(self, timeout):
        ended = self.inner.poll(timeout)
        with self.lock:  # reported before the engine releases what it commits
            self.events.extend((time.monotonic(), "end", e.handle.run_id, 0) for e in ended)
        return ended


class OnTheGpu(dict):
    """fake_nvml's `procs`: every engine's running runs on GPU 0, 1 GiB each, as NVML lists
    them (each engine sees the other's as processes that are not its own)."""

    def __init__(self):
        super().__init__()
        self.engines: list[Engine] = []
        self.others: list[tuple[int, int]] = []  # someone else's processes: (pid, bytes)

    def get(self, gpu, default=None):
        if gpu != 0:
            return []
        return [(a.handle.pid, GIB) for e in list(self.engines)
                for a in list(e.active.values())] + self.others


@pytest.fixture
def one_gpu(monkeypatch, tmp_path):
    """A fake 1-GPU NVML (80 GiB); runs given a GPU train on the CPU; a user's folder with
    the hoglab package (tests/test_memory_budget.py), the engines' working directory."""
    procs = OnTheGpu()
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(count=1, procs=procs))
    monkeypatch.setenv("GRIDRUN_FAKE_GPUS", "1")
    with user_package(tmp_path, monkeypatch, "hoglab", {"hog": USER_TASK}):
        yield procs
    procs.engines.clear()


def packing_engine(root, procs: OnTheGpu, events: list, slots: int = 4, **kw) -> Engine:
    backend = LocalBackend(log_path=root.parent / "forkserver.log")
    engine = Engine(root, Recorder(backend, events), [Slot(f"gpu0.{k}", 0) for k in range(slots)],
                    backoff=0.05, telemetry=Telemetry(), telemetry_every=0.1,
                    processes_every=0.1, cores=16, runs_per_gpu="auto", **kw)
    procs.engines.append(engine)
    return engine


def drive(engine: Engine, ids: list[str], errors: list[BaseException], timeout: float = 420) -> None:
    """The engine's loop until every run of `ids` has ended (a thread's target)."""
    try:
        engine.start()
        deadline = patience.Deadline(timeout)
        while not finished(engine.store, ids):
            assert not deadline.passed(), "the queue did not finish"
            engine.step(0.05)
    except BaseException as e:  # the test's thread re-raises it
        errors.append(e)
    finally:
        engine.sharing.close()
        engine.backend.inner.close()


def most_at_once(events) -> int:
    """The largest sum of budgets of runs launched and not yet reported ended."""
    held, most = {}, 0
    for _, kind, run_id, n in sorted(events):
        if kind == "start":
            held[run_id] = n
        else:
            held.pop(run_id, None)
        most = max(most, sum(held.values()))
    return most


def together(events, a: set[str], b: set[str]) -> bool:
    """Whether a run of `a` and a run of `b` ever ran at once."""
    running: set[str] = set()
    for _, kind, run_id, _ in sorted(events):
        (running.add if kind == "start" else running.discard)(run_id)
        if running & a and running & b:
            return True
    return False


@pytest.mark.parametrize("policy", ["avoid", "share"])
def test_two_engines_on_one_gpu_never_commit_more_than_its_memory(tmp_path, one_gpu, policy):
    """Each engine sees the other's runs on the GPU (NVML, 1 GiB each): the ledger makes
    them the other engine's, counted by their budgets, not someone else's to avoid
    ("avoid") or to count by what they use now ("share")."""
    events: list[tuple[float, str, str, int]] = []
    sizes = [10.0, 20.0, 30.0, 40.0]  # GiB; four at once would be 100 of its 80
    queues, engines = {}, []
    for name in ("alice", "bob"):
        root = tmp_path / name / "runs"
        root.parent.mkdir()
        queues[name] = [make_run(seed=s, experiment=name, epochs=1, threads=1,
                                 gpu_memory=sizes[s % 4]) for s in range(20)]
        with Store(root) as store:
            store.enqueue(queues[name])
        engines.append(packing_engine(root, one_gpu, events, foreign=policy))
    errors: list[BaseException] = []
    threads = [threading.Thread(target=drive, args=(e, [r.id for r in queues[n]], errors))
               for e, n in zip(engines, queues, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    starts = [e for e in events if e[1] == "start"]
    assert len(starts) == 40 and len({e[2] for e in starts}) == 40  # every run launched once
    assert all(e[3] in {int(g * GIB) for g in sizes} for e in starts)  # each with its budget
    assert most_at_once(events) <= TOTAL
    assert most_at_once(events) >= 50 * GIB  # they did share the GPU
    assert together(events, *({r.id for r in q} for q in queues.values()))
    for name in queues:
        with Store(tmp_path / name / "runs") as store:
            rows = store.list_runs()
        assert {r.status for r in rows} == {states.COMPLETED}
        assert all(r.attempt == 1 and r.restarts == 0 and not r.adjustments for r in rows)


def test_a_run_that_outgrows_its_budget_fails_alone_and_is_retried_with_its_need(tmp_path, one_gpu):
    events: list[tuple[float, str, str, int]] = []
    hog = make_run("hoglab.hog:make", experiment="mem", task_args={"hog_at_step": 3},
                   epochs=2, batch_size=64, log_every=1, threads=1, gpu_memory=1.0)
    neighbours = [make_run(seed=s, experiment="mem", epochs=2, threads=1, gpu_memory=2.0)
                  for s in range(7)]  # the hog and 7 others on one GPU
    root = tmp_path / "packed" / "runs"
    root.parent.mkdir()
    with Store(root) as store:
        store.enqueue([hog, *neighbours])
    engine = packing_engine(root, one_gpu, events, slots=8)
    errors: list[BaseException] = []
    drive(engine, [r.id for r in (hog, *neighbours)], errors)
    assert not errors, errors
    with Store(root) as store:
        rows = {r.id: r for r in store.list_runs()}
    # the same runs alone, one at a time, without a budget
    alone = tmp_path / "alone" / "runs"
    alone.parent.mkdir()
    with Store(alone) as store:
        store.enqueue([hog, *neighbours])
    single = Engine(alone, LocalBackend(log_path=tmp_path / "fs-alone.log"), [Slot("gpu0", 0)],
                    backoff=0.05, cores=16, runs_per_gpu=1)
    drive_plain(single, [r.id for r in (hog, *neighbours)])

    row = rows[hog.id]
    assert row.status == states.COMPLETED, row.error
    (change,) = [a for a in row.adjustments if a["kind"] == "budget"]
    first, second = change["budget_bytes"]
    assert first == GIB and second > GIB
    launches = [e for e in events if e[1] == "start" and e[2] == hog.id]
    assert [e[3] for e in launches] == [GIB, second]  # retried once, with the need it measured
    output = (root / "mem" / hog.id / "output.log").read_text()
    said = [line for line in output.splitlines() if line.startswith("over its memory budget")]
    assert len(said) == 1 and "needed" in said[0], output
    for run in neighbours:  # packed beside it, they never noticed
        assert rows[run.id].status == states.COMPLETED and not rows[run.id].adjustments
        assert rows[run.id].restarts == 0 and rows[run.id].attempt == 1
        assert summary(root, run)["weights_sha256"] == summary(alone, run)["weights_sha256"]
    assert summary(root, hog)["weights_sha256"] == summary(alone, hog)["weights_sha256"]
    neighbours_at_once = max_overlap(events, {r.id for r in neighbours} | {hog.id})
    assert neighbours_at_once >= 2  # it was packed with them


def max_overlap(events, ids) -> int:
    running, most = set(), 0
    for _, kind, run_id, _ in sorted(events):
        if run_id in ids:
            (running.add if kind == "start" else running.discard)(run_id)
            most = max(most, len(running))
    return most


def drive_plain(engine: Engine, ids: list[str]) -> None:
    engine.start()
    deadline = patience.Deadline(420)
    while not finished(engine.store, ids):
        assert not deadline.passed(), "the queue did not finish"
        engine.step(0.05)
    engine.backend.close()


def test_an_unmeasured_shape_runs_alone_then_its_shape_is_packed_by_what_it_measured(
        tmp_path, one_gpu):
    events: list[tuple[float, str, str, int]] = []
    runs = [make_run(seed=s, experiment="auto", epochs=1, threads=1) for s in range(5)]
    root = tmp_path / "auto" / "runs"
    root.parent.mkdir()
    with Store(root) as store:
        store.enqueue(runs)
    engine = packing_engine(root, one_gpu, events)
    errors: list[BaseException] = []
    drive(engine, [r.id for r in runs], errors)
    assert not errors, errors
    starts = sorted(e for e in events if e[1] == "start")
    first = starts[0][2]
    ended_first = min(e[0] for e in events if e[1] == "end" and e[2] == first)
    # the GPU to itself: all NVML says is free (the fake says 3 GiB are used), less the
    # headroom, and no more
    assert starts[0][3] == TOTAL - 3 * GIB - packing.HEADROOM
    assert all(t > ended_first for t, *_ in starts[1:])  # nothing beside it
    with Store(root) as store:
        measured = packing.measured(store.list_runs(ids=[first])[0].summary)
    budget = packing.rounded(measured * (1 + packing.MARGIN))
    assert {e[3] for e in starts[1:]} == {budget}  # the rest: its need and the margin
    assert max_overlap(events, {r.id for r in runs}) >= 2  # and packed
    ledger = Ledger()
    assert ledger.others() == []  # the engine's entry went with it


def test_engine_status_says_why_a_run_waits_for_memory():
    state = {"mode": "auto", "gpus": [{"gpu": 0, "total": TOTAL, "ours": 48 * GIB, "runs": 2,
                                       "others": 24 * GIB, "foreign": 0, "free": 8 * GIB}],
             "waits": {"run_id": "abc", "need": 12 * GIB, "free": 8 * GIB, "others": 24 * GIB},
             "ledger": None}
    assert packing.book_lines(state) == [
        "gpu0: 80.0 GiB: 48.0 GiB committed by 2 runs here, 24.0 GiB by other gridrun engines, "
        "0.0 GiB used by others' processes; 8.0 GiB free",
        "queue: no GPU has 12.0 GiB free for abc (the most free: 8.0 GiB; other gridrun engines "
        "commit 24.0 GiB): it and the runs after it wait"]
    state["waits"] = {"run_id": "new", "need": None, "free": 8 * GIB, "others": 0}
    assert packing.book_lines(state)[-1] == (
        "queue: new waits for a GPU of its own (its shape was never measured): it and the runs "
        "after it wait; gpu_memory = N (GiB) in the file lets it start beside others")
    assert packing.book_lines(None) == [] and packing.book_lines({"gpus": "x"}) == []


def test_an_engine_restart_adopts_a_run_with_its_commitment(tmp_path, one_gpu):
    """A killed engine's runs outlive it: the next engine adopts them with the memory they
    commit (the store keeps it), writes it in the ledger, and places the queue around it."""
    from test_engine_kit import slow_run

    long = slow_run(seed=0, sleep=0.1, epochs=3, threads=1, gpu_memory=50.0)
    after = make_run(seed=1, epochs=1, threads=1, gpu_memory=40.0)  # 50 + 40 > 80
    root = tmp_path / "runs"
    with Store(root) as store:
        store.enqueue([long])
        first = Engine(root, LocalBackend(forkserver=False), [Slot(f"gpu0.{k}", 0) for k in range(4)],
                       telemetry=Telemetry(), cores=16, runs_per_gpu="auto")
        one_gpu.engines.append(first)
        first.start()
        first.step(0.01)
        assert store.get_run(long.id).placement["commit_bytes"] == 50 * GIB
        first.backend.close()  # killed: its run goes on, its ledger entry dies with it
        first.sharing.ledger.close()
        first.store.close()
        one_gpu.engines.remove(first)
        store.enqueue([after])

        events: list[tuple[float, str, str, int]] = []
        engine = packing_engine(root, one_gpu, events)
        engine.start()
        assert engine.active[long.id].commit == 50 * GIB  # adopted with what it commits
        engine.step(0.01)
        seen = Ledger().others()
        assert [e.gpus for e in seen] == [{"GPU-0000": 50 * GIB}]  # what other engines now see
        assert store.get_run(after.id).status == states.QUEUED  # 30 GiB free, it needs 40
        errors: list[BaseException] = []
        drive(engine, [long.id, after.id], errors)
        assert not errors, errors
        got = {r.id: r for r in store.list_runs()}
    assert {r.status for r in got.values()} == {states.COMPLETED}
    assert got[long.id].restarts == 0 and got[after.id].started_at >= got[long.id].ended_at


def test_under_share_an_unmeasured_run_is_held_to_the_room_beside_others(tmp_path, one_gpu):
    """Beside a colleague's 70 GiB, a run nobody measured takes the 10 GiB left, and no
    more: its budget is that room, enforced, so it can outgrow only itself."""
    import subprocess

    colleague = subprocess.Popen(["sleep", "600"])
    try:
        one_gpu.others.append((colleague.pid, 70 * GIB))
        run = make_run(seed=0, experiment="beside", epochs=1, threads=1)
        root = tmp_path / "runs"
        with Store(root) as store:
            store.enqueue([run])
        events: list[tuple[float, str, str, int]] = []
        engine = packing_engine(root, one_gpu, events, foreign="share")
        errors: list[BaseException] = []
        drive(engine, [run.id], errors)
        assert not errors, errors
    finally:
        colleague.kill()
        colleague.wait()
    (start,) = [e for e in events if e[1] == "start"]
    assert start[3] == 10 * GIB
    with Store(root) as store:
        assert store.get_run(run.id).status == states.COMPLETED


def test_a_budget_the_engine_works_out_is_never_more_than_its_largest_gpu():
    """A shape that filled most of a GPU runs alone on one, held to all of it: its
    measured need plus the margin (or a retry's 1.5 times) never makes it too big to run."""
    book = Book("auto")
    book.sizes([{"index": 0, "mem_total_bytes": TOTAL, "uuid": "GPU-0000"}])
    config = make_run(seed=0).to_dict()
    book.learn(make_run(seed=1).to_dict(), {"step": 9, "peak_reserved_bytes": 73 * GIB,
                                            "device": "cuda"})
    assert book.budget(config) == TOTAL and book.whole(book.budget(config))
    assert book.budget(config, [{"kind": "budget", "budget_bytes": [GIB, 120 * GIB]}]) == TOTAL
    assert book.budget(make_run(seed=0, gpu_memory=100.0).to_dict()) == 100 * GIB  # the user's


def test_the_sharing_writes_again_what_it_could_not_write():
    """A ledger write that failed (a full /dev/shm) is tried again at the next publish."""
    from gridrun.engine.sharing import Sharing

    class Flaky:
        problem = busy = unread = None

        def intact(self):
            return True

        def __init__(self):
            self.tries, self.written = 0, []

        def write(self, gpus, threads, pids):
            self.tries += 1
            if self.tries == 1:
                return False
            self.written.append(gpus)
            return True

    ledger = Flaky()
    sharing = Sharing("auto", [Slot("gpu0.0", 0)], ledger)
    sharing.publish({})
    sharing.publish({})
    assert ledger.tries == 2 and ledger.written == [{}]
    sharing.publish({})
    assert ledger.tries == 2  # nothing new: nothing written


def test_a_run_held_to_a_whole_gpu_that_runs_out_has_its_batch_halved(tmp_path, one_gpu):
    """An unmeasured run alone on a GPU is held to all of it: over that, it is out of
    memory like any run (a smaller batch), not given a larger budget than the GPU."""
    gpu = sys.modules["pynvml"]
    small = int(1.2 * GIB)  # the hog's 1 GiB and its process do not fit
    gpu.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=0, total=small, free=small)
    hog = make_run("hoglab.hog:make", experiment="whole", task_args={"hog_at_step": 3},
                   epochs=1, batch_size=64, log_every=1, threads=1)
    root = tmp_path / "runs"
    with Store(root) as store:
        store.enqueue([hog])
    events: list[tuple[float, str, str, int]] = []
    engine = packing_engine(root, one_gpu, events)
    errors: list[BaseException] = []
    drive(engine, [hog.id], errors)
    assert not errors, errors
    with Store(root) as store:
        row = store.get_run(hog.id)
    # all of the GPU NVML says is free, less the headroom, and no more
    assert next(e[3] for e in events if e[1] == "start") == small - packing.HEADROOM
    assert row.status == states.OOM
    assert [a["kind"] for a in row.adjustments] == ["oom"]  # the batch halved, once
    assert row.adjustments[0]["batch_size"] == [64, 32]
