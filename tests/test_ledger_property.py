"""Issue 45, as a property: over random ledgers written by several users (entries naming
real processes of theirs, claiming runs and bytes and threads, sane or absurd) and random
NVML reports (GPU sizes, used memory NVML may not list or not report, other users'
processes), two engines placing runs side by side never commit, between them and beside
what is really used, more than a GPU has; and each engine, after each step, has either
launched its queue or named what it waits for.

The truth the test holds the engines to, known from how each example was built: a GPU's
used memory is what NVML reports (listed processes and what it does not list), or where
it reports none, what the listed processes use that are not verifiably another engine's
runs (a child of that engine's live process, its owner's, named by its entry). The
engines' own runs are `sleep`s that use nothing yet (just launched).

Derandomized with a bounded number of examples: the same examples on every machine.
Other users are played by `nobody` and `daemon` (tests/ledger_kit.py): needs root."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledger_kit import DAEMON, GIB, NOBODY, Gpus, Users, committed, gpu_engine, needs_root, plant
from test_engine_kit import make_run

from gridrun.engine import foreign, packing
from gridrun.engine.ledger import Ledger
from gridrun.engine.scheduler import CPU_CAP, SLOTS_WAIT
from gridrun.runs import states
from gridrun.runs.store import Store

pytestmark = needs_root
UIDS = (NOBODY, DAEMON)
SIZES = (8 * GIB, 16 * GIB)


@pytest.fixture(scope="module")
def pool():
    """Per other user: an engine-like process with a child (`family`) and a lone one."""
    users = Users()
    made = {uid: {"family": users.family(uid), "lone": users.process(uid)} for uid in UIDS}
    yield made
    users.close()


def processes(pool) -> list[tuple[int, int]]:
    """(pid, uid) of every process of the pool that may be listed on a GPU."""
    return [(p, uid) for uid, m in pool.items() for p in (m["family"][2], m["lone"][0])]


gpu_reports = st.lists(st.tuples(st.sampled_from([*SIZES, None]),  # its size, or not reported
                                 st.sampled_from([0, GIB // 2, 3 * GIB, "n/a"])),  # unlisted used
                       min_size=1, max_size=2)
listed = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1),  # which process, which GPU
                            st.sampled_from([100 << 20, 250 << 20, 2 * GIB, 7 * GIB, None])),
                  max_size=4)
entries = st.lists(st.fixed_dictionaries({
    "uid": st.sampled_from(UIDS),
    "engine": st.sampled_from(["family", "lone", "child"]),  # which of its processes it names
    "bytes": st.lists(st.sampled_from([0, GIB, 4 * GIB, 1 << 50]), min_size=2, max_size=2),
    "threads": st.sampled_from([0, 1, 8, 1 << 20]),
    "claims": st.lists(st.integers(0, 3), max_size=2),  # processes it names as its runs
}), max_size=4)
queues = st.lists(st.lists(st.sampled_from([1.0, 3.0, 5.0, 9.0, None]), min_size=1, max_size=4),
                  min_size=2, max_size=2)
policies = st.tuples(st.sampled_from(["avoid", "share"]), st.sampled_from(["auto", 2]))


def truly_used(gpus: Gpus, index: int, verified: set[int]) -> int:
    """What the test knows is used on GPU `index` beside the two engines' commitments."""
    reported = gpus._used(index)
    if reported is not None:
        return reported
    return sum(n or 0 for pid, g, n in gpus.procs if g == index and pid not in verified)


def says_why(engine) -> bool:
    """Whether the engine's store says why its first queued run waits."""
    state = engine.store.get_state
    book = state(packing.STATE) or {}
    taken = state(foreign.STATE) or {}
    return bool(state(CPU_CAP) or state(SLOTS_WAIT) or taken.get("waits") or book.get("waits")
                or book.get("ledger"))


def names_its_holders(engine) -> bool:
    """A wait for memory other engines commit names them; one for threads they hold too."""
    book = engine.store.get_state(packing.STATE) or {}
    wait = book.get("waits") or {}
    if wait.get("others") and not all(h.get("file") for h in wait.get("holders") or [{}]):
        return False
    cap = engine.store.get_state(CPU_CAP) or {}
    return not (cap and cap.get("holding", 0) and "others" in cap
                and not all(h.get("file") for h in cap["others"]))


@settings(max_examples=40, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(reports=gpu_reports, on_gpus=listed, written=entries, wants=queues, policy=policies)
def test_two_engines_never_overcommit_and_always_say_why(pool, reports, on_gpus, written, wants,
                                                        policy):
    procs = processes(pool)
    base = Path(tempfile.mkdtemp(prefix="ledger-property-"))
    folder = base / "ledger"
    gpus = Gpus([size for size, _ in reports])
    for which, gpu, n in on_gpus:
        if gpu < len(reports):
            gpus.procs.append((procs[which][0], gpu, n))
    for i, (size, unlisted) in enumerate(reports):
        if unlisted == "n/a":
            gpus.used[i] = "n/a"
        elif size is not None:
            gpus.used[i] = sum(n or 0 for _, g, n in gpus.procs if g == i) + unlisted
    verified: set[int] = set()  # the processes that are another engine's runs, by construction
    Ledger(folder)
    for k, e in enumerate(written):
        parent, start, child = pool[e["uid"]]["family"]
        lone, lone_start = pool[e["uid"]]["lone"]
        pid, begun = {"family": (parent, start), "lone": (lone, lone_start),
                      "child": (child, pool[e["uid"]]["family"][1])}[e["engine"]]
        claims = [procs[c][0] for c in e["claims"]]
        if e["engine"] == "family" and child in claims:
            verified.add(child)
        plant(folder, e["uid"], pid=pid, start_time=begun, threads=e["threads"], pids=claims,
              gpus={f"GPU-{g:04d}": n for g, n in enumerate(e["bytes"]) if n}, token=f"{k:04x}")
    engines = []
    try:
        for name, budgets in zip("ab", wants, strict=True):
            root = base / name
            with Store(root) as store:
                # under an integer runs_per_gpu a run without gpu_memory commits a share
                # of its GPU, slots kept apart from other engines': bytes only here
                budgets = [b or (None if policy[1] == "auto" else 1.0) for b in budgets]
                store.enqueue([make_run(seed=s, experiment=name, epochs=1, threads=1,
                                        **({"gpu_memory": b} if b else {}))
                               for s, b in enumerate(budgets)])
            engines.append(gpu_engine(root, gpus, slots=4, foreign=policy[0],
                                      runs_per_gpu=policy[1], cores=16, ledger=Ledger(folder)))
        for engine in engines:
            engine.start()
        for _ in range(3):
            for engine in engines:
                engine.step(0.0)
                together = committed(*engines)
                for i, (size, _) in enumerate(reports):
                    if size is not None and together.get(i):  # (NVML may report a full GPU)
                        assert together[i] + truly_used(gpus, i, verified) <= size, (
                            i, together, gpus.procs, gpus.used)
                queued = engine.store.list_runs(status=states.QUEUED)
                assert not queued or says_why(engine), engine.store.get_state(packing.STATE)
                assert names_its_holders(engine), engine.store.get_state(packing.STATE)
    finally:
        for engine in engines:
            engine.backend.close()
            engine.sharing.close()
            engine.store.close()
        shutil.rmtree(base, ignore_errors=True)
