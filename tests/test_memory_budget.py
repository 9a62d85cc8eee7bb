"""A run's memory budget (GRIDRUN_MEMORY_BUDGET, train/loop/memory.py): the engine packs
runs on one GPU by memory and each run enforces its own share. A run that outgrows its
budget fails itself, as "oom", with what it needed and its budget in the summary and one
line in output.log; a run that stays under it trains the same bits as without one.

The worker runs on the CPU here (no GPU hidden or not: CUDA_VISIBLE_DEVICES=""), where
the budget is checked against the process's resident memory at each log point. The
CUDA side (the allocator's cap, an out-of-memory the cap caused) is tested on its
arithmetic with torch.cuda's answers patched, and for real where there is a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import patience
import pytest
import torch
from test_engine_kit import make_run, prepare
from user_folder import user_package

from gridrun.runs import layout, states
from gridrun.runs.records import Summary
from gridrun.train.loop import memory
from gridrun.train.loop.memory import CONTEXT, ENV, MemoryBudget, OverBudget, budget_from_env
from gridrun.train.loop.trainer import record_exception

GIB, MIB = 1 << 30, 1 << 20

USER_TASK = '''\
"""spirals, whose model keeps 1 GiB of ones from its `hog_at_step`-th training step on."""
import torch
from torch import nn

from gridrun.tasks.spirals import spirals


class Hog(nn.Module):
    def __init__(self, inner: nn.Module, at: int):
        super().__init__()
        self.inner, self.at, self.calls, self.kept = inner, at, 0, []

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == self.at:  # filled, so every page is resident
                self.kept.append(torch.ones(1 << 28))
        return self.inner(x)


def make(hog_at_step: int = 0):
    task = spirals(train_size=256, val_size=64, hidden=16, depth=1)
    task.model = Hog(task.model, hog_at_step)
    return task
'''


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """The user's folder: their task package, the working directory of the worker."""
    with user_package(tmp_path, monkeypatch, "hoglab", {"hog": USER_TASK}) as folder:
        yield folder


def hog_run(hog_at_step: int):
    return make_run("hoglab.hog:make", experiment="mem", task_args={"hog_at_step": hog_at_step},
                    epochs=2, batch_size=64, log_every=1, threads=1)


def work(root: Path, run, budget: int | None) -> tuple[int, dict, str]:
    """The worker on `run` as a backend starts it (stdout to output.log), on the CPU:
    (exit code, summary.json, output.log)."""
    run_dir = prepare(root, run)
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, on any machine
    if budget is not None:
        env[ENV] = str(budget)
    with open(run_dir / layout.OUTPUT, "ab") as out:
        code = patience.run([sys.executable, "-m", "gridrun.train.worker", str(run_dir)],
                            stdout=out, stderr=subprocess.STDOUT, env=env, timeout=300).returncode
    summary = json.loads((run_dir / layout.SUMMARY).read_text())
    return code, summary, (run_dir / layout.OUTPUT).read_text()


# ---------------------------------------------------------------- the run's side, end to end

def test_a_run_that_outgrows_its_budget_fails_itself_as_oom_with_its_need(lab):
    code, summary, output = work(lab / "runs", hog_run(3), GIB)
    assert code == states.EXIT_CODES[states.OOM] == 4, output
    assert summary["status"] == states.OOM
    assert summary["memory_budget_bytes"] == GIB
    assert summary["memory_needed_bytes"] > GIB  # the 1 GiB of ones and the process beside it
    assert summary["error"].startswith("over its memory budget: it needed ")
    assert "the engine retries it once with the need it measured" in summary["error"]
    assert "\n" not in summary["error"]
    assert summary["peak_reserved_bytes"] is None  # the CPU: no CUDA cache
    assert ("memory budget: 1.0 GiB (on the CPU: checked against the process's resident memory "
            "at each log point)") in output
    assert summary["error"] in output.splitlines()
    assert "Traceback" not in output
    assert Summary.from_json(summary, strict=True) is not None


def test_a_run_under_its_budget_trains_the_same_bits_as_without_one(lab):
    run = hog_run(0)
    code, budgeted, output = work(lab / "budget", run, 8 * GIB)
    assert code == 0, output
    assert budgeted["status"] == states.COMPLETED
    assert budgeted["memory_budget_bytes"] == 8 * GIB and budgeted["memory_needed_bytes"] is None
    assert "memory budget: 8.0 GiB (on the CPU" in output
    code, plain, output = work(lab / "plain", run, None)
    assert code == 0, output
    assert plain["memory_budget_bytes"] is None and "memory budget" not in output
    assert budgeted["weights_sha256"] == plain["weights_sha256"] is not None


# ---------------------------------------------------------------- the pieces

@pytest.mark.parametrize(("value", "expected"), [
    (None, None), ("", None), ("  ", None), ("abc", None), ("0", None), ("-4096", None),
    ("1.5", None), ("4 GiB", None), ("4096", 4096), (" 4294967296\n", 4 * GIB),
])
def test_budget_from_env_takes_positive_whole_bytes_only(value, expected):
    environ = {} if value is None else {ENV: value}
    assert budget_from_env(environ) == expected


def test_over_budget_says_it_in_one_line_with_both_numbers():
    exc = OverBudget(int(5.2 * GIB), 4 * GIB)
    assert isinstance(exc, RuntimeError) and (exc.needed, exc.budget) == (int(5.2 * GIB), 4 * GIB)
    assert str(exc) == ("over its memory budget: it needed 5.2 GiB and its budget is 4.0 GiB; "
                        "the engine retries it once with the need it measured")


def cuda_oom(tried: str) -> torch.OutOfMemoryError:
    """What the caching allocator raises, in its own words."""
    return torch.OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {tried}. GPU 0 has a total capacity of 79.10 GiB "
        "of which 70.02 GiB is free. Including non-PyTorch memory, this process has 3.92 GiB "
        "memory in use. Of the allocated memory 3.40 GiB is allocated by PyTorch, and 12.50 MiB "
        "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
        "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html"
        "#environment-variables)")


@pytest.mark.parametrize(("tried", "expected"), [
    ("512 bytes", 512), ("3.50 KiB", 3584), ("20.00 MiB", 20 * MIB), ("1.25 GiB", 5 * GIB // 4),
])
def test_what_an_out_of_memory_asked_for_is_read_from_its_message(tried, expected):
    assert memory.requested_bytes(str(cuda_oom(tried))) == expected


def test_no_size_in_the_message_reads_as_none():
    assert memory.requested_bytes("CUDA error: an illegal memory access was encountered") is None


@pytest.fixture
def reserved(monkeypatch):
    """torch.cuda.memory_reserved answering what the test sets, no GPU needed."""
    answer = {"bytes": 0, "peak": None}
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: answer["bytes"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved",
                        lambda device=None: answer["bytes"] if answer["peak"] is None else answer["peak"])
    return answer


def test_an_oom_the_cap_caused_after_the_allocator_let_its_cache_go_is_the_budget_s(reserved):
    """Before it raises, the allocator frees its cached blocks and tries again: what is
    reserved then may be far under the cap; the peak it reserved is not."""
    budget = MemoryBudget(4 * GIB, torch.device("cuda", 0))
    reserved["bytes"], reserved["peak"] = 1 * GIB, int(3.4 * GIB)
    over = budget.from_oom(cuda_oom("200.00 MiB"))
    assert isinstance(over, OverBudget)
    assert over.needed == int(3.4 * GIB) + 200 * MIB + CONTEXT


def test_an_oom_the_cap_caused_is_the_budget_s_and_a_full_gpu_s_is_not(reserved):
    budget = MemoryBudget(4 * GIB, torch.device("cuda", 0))
    reserved["bytes"] = int(3.4 * GIB)  # the cap is budget - CONTEXT = 3.5 GiB
    over = budget.from_oom(cuda_oom("200.00 MiB"))
    assert isinstance(over, OverBudget)
    assert (over.needed, over.budget) == (int(3.4 * GIB) + 200 * MIB + CONTEXT, 4 * GIB)
    assert budget.over(over) is over
    reserved["bytes"] = 1 * GIB  # far under the cap: the GPU itself is full
    assert budget.from_oom(cuda_oom("200.00 MiB")) is None
    assert budget.over(cuda_oom("200.00 MiB")) is None


def test_without_a_budget_or_on_the_cpu_an_oom_stays_an_oom(reserved):
    reserved["bytes"] = 100 * GIB
    assert MemoryBudget(None, torch.device("cuda", 0)).from_oom(cuda_oom("2.00 GiB")) is None
    assert MemoryBudget(4 * GIB, torch.device("cpu")).from_oom(cuda_oom("2.00 GiB")) is None
    assert MemoryBudget(4 * GIB, torch.device("cuda", 0)).from_oom(ValueError("no")) is None
    assert MemoryBudget().over(OverBudget(2, 1)) is not None  # raised by a check: always the budget's


def test_the_trainer_records_the_budget_s_oom_and_leaves_a_plain_one_as_it_was(reserved):
    budget, lines = MemoryBudget(4 * GIB, torch.device("cuda", 0)), []
    reserved["bytes"] = int(3.4 * GIB)
    summary: dict = {"memory_budget_bytes": 4 * GIB}
    record_exception(summary, cuda_oom("200.00 MiB"), torch.device("cpu"), None, False,
                     lines.append, budget)
    assert summary["status"] == states.OOM and summary["memory_budget_bytes"] == 4 * GIB
    assert summary["memory_needed_bytes"] == int(3.4 * GIB) + 200 * MIB + CONTEXT
    assert lines == [summary["error"]] and summary["error"].startswith("over its memory budget")
    reserved["bytes"] = GIB
    summary, lines = {"memory_budget_bytes": 4 * GIB}, []
    record_exception(summary, cuda_oom("200.00 MiB"), torch.device("cpu"), None, False,
                     lines.append, budget)
    assert summary["status"] == states.OOM and "memory_needed_bytes" not in summary
    assert summary["error"].startswith("out of memory: CUDA out of memory. Tried to allocate")
    assert summary["memory_budget_bytes"] == 4 * GIB


def test_the_cpu_check_compares_resident_memory_and_says_so_once():
    lines: list[str] = []
    roomy = MemoryBudget(1 << 50, torch.device("cpu"))
    roomy.apply(lines.append)
    roomy.check()
    assert lines == ["memory budget: 1048576.0 GiB (on the CPU: checked against the process's "
                     "resident memory at each log point)"]
    with pytest.raises(OverBudget) as caught:
        MemoryBudget(MIB, torch.device("cpu")).check()  # any Python with torch is over 1 MiB
    assert caught.value.budget == MIB and caught.value.needed > MIB
    MemoryBudget().check()  # no budget: nothing to check
    MemoryBudget().apply(lines.append)
    assert len(lines) == 1


def test_on_cuda_the_allocator_is_capped_at_the_budget_less_the_context(monkeypatch):
    set_to = []
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=80 * GIB))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device=None: set_to.append((fraction, device)))
    lines: list[str] = []
    device = torch.device("cuda", 0)
    MemoryBudget(4 * GIB, device).apply(lines.append)
    MemoryBudget(CONTEXT, device).apply(lines.append)  # nothing left for tensors: the floor
    MemoryBudget(200 * GIB, device).apply(lines.append)  # more than the GPU: all of it
    assert set_to == [((4 * GIB - CONTEXT) / (80 * GIB), device), (0.01, device), (1.0, device)]
    assert lines[0] == "memory budget: 4.0 GiB (CUDA: 3.5 GiB for tensors, fraction 0.044 of 80.0 GiB)"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the allocator's cap needs a GPU")
def test_on_a_gpu_an_allocation_past_the_cap_is_the_budget_s_oom():
    device = torch.device("cuda", 0)
    total = torch.cuda.get_device_properties(device).total_memory
    budget = MemoryBudget(CONTEXT + total // 20, device)  # 5% of the GPU for tensors
    budget.apply(lambda line: None)
    try:
        with pytest.raises(torch.OutOfMemoryError) as caught:
            torch.empty(total // 10, dtype=torch.uint8, device=device)
        over = budget.from_oom(caught.value)
        assert over is not None and over.needed >= total // 10 + CONTEXT and over.budget == budget.budget
        budget.check()  # what it holds is still under the budget
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()
