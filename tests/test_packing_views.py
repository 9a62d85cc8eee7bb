"""The memory book as `engine status` shows it: the engine's packing.STATE, written into a
real store with an engine.pid that names this process (the root's engine, as far as
`engine status` can tell), printed after the foreign-GPU lines and kept whole in --json."""

from __future__ import annotations

import json
import os
import time

import pytest
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.engine import daemon, foreign, packing
from gridrun.engine.backends.child import process_start_time
from gridrun.runs.store import Store
from gridrun.spec import RunSpec, run_id

GIB = 1 << 30
BOOK = {"mode": "auto",
        "gpus": [{"gpu": 0, "total": 80 * GIB, "ours": 24 * GIB, "runs": 3, "others": 8 * GIB,
                  "foreign": 20 * GIB, "free": 28 * GIB},
                 {"gpu": 1, "total": 80 * GIB, "ours": 0, "runs": 0, "others": 0,
                  "foreign": 0, "free": 80 * GIB}],
        "waits": {"run_id": "3f2a9c01bd", "need": 40 * GIB, "free": 28 * GIB, "others": 8 * GIB},
        "ledger": None}
TAKEN = {"policy": "avoid", "waits": None, "gpus": [{"gpu": 0, "uuid": "GPU-0000", "processes": [
    {"pid": 4242, "user": "alice", "mem_bytes": 20 * GIB}]}]}


def spec(seed: int) -> RunSpec:
    trainer = {"lr": 1e-3, "epochs": 2, "batch_size": 32}
    return RunSpec(id=run_id("exp", "spirals", trainer, {"hidden": 16}, seed), experiment="exp",
                   variant="lr=0.001", seed=seed, task="spirals", trainer=trainer,
                   task_args={"hidden": 16}, axes={"lr": 1e-3})


@pytest.fixture
def root(tmp_path):
    """A root whose store holds the book (and another user's process on GPU 0), with one
    queued run, and whose engine.pid names this process: a running engine to `status`."""
    with Store(tmp_path) as store:
        store.enqueue([spec(0)])
        store.set_state(packing.STATE, BOOK)
        store.set_state(foreign.STATE, TAKEN)
    pid = os.getpid()
    (tmp_path / daemon.PID).write_text(json.dumps({
        "pid": pid, "start_time": process_start_time(pid), "started_at": time.time(),
        "state": "running"}))
    yield tmp_path
    (tmp_path / daemon.PID).unlink(missing_ok=True)


def status(root, *args: str):
    result = CliRunner().invoke(app, ["engine", "status", *args, "--root", str(root)])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_status_prints_the_book_after_the_foreign_gpus(root):
    lines = status(root).splitlines()
    assert lines[0].startswith("engine: running")
    taken = foreign.gpu_lines(TAKEN)
    book = packing.book_lines(BOOK)
    assert lines[-len(book):] == book and lines[-len(book) - len(taken):-len(book)] == taken
    assert book == [
        "gpu0: 80.0 GiB: 24.0 GiB committed by 3 runs here, 8.0 GiB by other gridrun engines, "
        "20.0 GiB used by others' processes; 28.0 GiB free",
        "gpu1: 80.0 GiB: 0.0 GiB committed by 0 runs here, 0.0 GiB by other gridrun engines, "
        "0.0 GiB used by others' processes; 80.0 GiB free",
        "queue: no GPU has 40.0 GiB free for 3f2a9c01bd (the most free: 28.0 GiB; other gridrun "
        "engines commit 8.0 GiB): it and the runs after it wait"]


def test_status_json_holds_the_book_whole(root):
    got = json.loads(status(root, "--json"))
    assert got["running"] and got["gpu_memory"] == BOOK and got["foreign_gpus"] == TAKEN


def test_the_ledgers_problem_is_said(root):
    problem = "the GPU ledger /dev/shm/gridrun-ledger cannot be written: Permission denied"
    with Store(root) as store:
        store.set_state(packing.STATE, {**BOOK, "waits": None, "ledger": problem})
    lines = status(root).splitlines()
    assert lines[-1] == problem and not any(line.startswith("queue: no GPU") for line in lines)


def test_a_stopped_engine_says_nothing_of_memory(root):
    (root / daemon.PID).unlink()  # the book is still there: an engine that died without clearing
    out = status(root)
    assert "engine: not running" in out and "committed by" not in out
    assert json.loads(status(root, "--json"))["gpu_memory"] is None


def test_help_names_gpu_memory():
    result = CliRunner().invoke(app, ["engine", "status", "--help"], env={"COLUMNS": "200"})
    assert "gpu_memory" in result.output


def test_ls_json_carries_a_runs_placement(root):
    placement = {"backend": "local", "budget_bytes": 4 * GIB, "commit_bytes": 4 * GIB + (64 << 20)}
    with Store(root) as store:
        store.set_placement(spec(0).id, placement)
    result = CliRunner().invoke(app, ["ls", "--json", "--root", str(root)])
    assert result.exit_code == 0, result.output
    assert [r["placement"] for r in json.loads(result.stdout)] == [placement]


# ---- a Ray cluster (issue 47): every node has a gpu0, named by its node --------------------

NODE_BOOK = {"mode": "auto", "ledger": None,
             "gpus": [{"gpu": "GPU-a0", "name": "node1:gpu0", "total": 80 * GIB, "ours": 24 * GIB,
                       "runs": 1, "others": 0, "foreign": 0, "free": 56 * GIB},
                      {"gpu": "GPU-b0", "name": "node2:gpu0", "total": None, "free": None}],
             "waits": {"run_id": "3f2a9c01bd", "need": 60 * GIB, "free": 56 * GIB,
                       "others": 8 * GIB, "holders": [
                           {"gpu": "GPU-a0", "bytes": 8 * GIB, "user": "bob", "pid": 77}]}}
NODE_TAKEN = {"policy": "avoid", "waits": None, "gpus": [
    {"gpu": 0, "uuid": "GPU-b0", "node": "node2",
     "processes": [{"pid": 4242, "user": "alice", "mem_bytes": 20 * GIB}]}]}


def test_status_names_each_nodes_gpu(root):
    with Store(root) as store:
        store.set_state(packing.STATE, NODE_BOOK)
        store.set_state(foreign.STATE, NODE_TAKEN)
    lines = status(root).splitlines()
    book = packing.book_lines(NODE_BOOK)
    assert lines[-len(book) - 1:] == [*foreign.gpu_lines(NODE_TAKEN), *book]
    assert lines[-len(book) - 1] == (
        "node2:gpu0: taken by alice (pid 4242, 20.0 GiB): no new run starts there ([engine] "
        'foreign = "share" to use it anyway)')
    assert book[0].startswith("node1:gpu0: 80.0 GiB: 24.0 GiB committed by 1 run here, ")
    assert book[1].startswith("node2:gpu0: its memory size is unknown")
    assert book[2].startswith("queue: no GPU has 60.0 GiB free for 3f2a9c01bd (the most free: "
                              "56.0 GiB; other gridrun engines commit 8.0 GiB: ")
    assert book[2].endswith(" commits 8.0 GiB on node1:gpu0): it and the runs after it wait")
    assert "GPU-" not in "\n".join(lines)  # a UUID is the engine's key, not a name for people


def test_a_book_without_names_reads_as_before():
    assert packing.gpu_name({"gpu": 1}) == "gpu1"  # one machine: the index
    assert packing.gpu_name({"gpu": "node2:gpu1"}) == "node2:gpu1"  # a node's GPU without a UUID
    assert packing.gpu_name({"gpu": 1, "name": 3}) == "gpu1"  # a name that is not one
    holders = {**BOOK["waits"], "holders": [{"gpu": 0, "bytes": 8 * GIB, "pid": 7}]}
    assert packing.book_lines({**BOOK, "waits": holders})[-1].endswith(
        " commits 8.0 GiB on gpu0): it and the runs after it wait")


def test_ls_names_the_nodes_gpu_others_take(root):
    with Store(root) as store:
        store.set_state(foreign.STATE, NODE_TAKEN)
    result = CliRunner().invoke(app, ["ls", "--root", str(root)])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        "node2:gpu0: taken by alice (pid 4242, 20.0 GiB): no new run starts there ([engine] "
        'foreign = "share" to use it anyway)']
    assert spec(0).id in result.stdout and "node2" not in result.stdout
