"""`gridrun verify`: a replay in a scratch folder, compared bit for bit with what the run
recorded; one-ulp tampering with a metrics line or the weights is named; `weights_sha256`."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from gridrun.checks import verdict
from gridrun.checks.verify import VerifyError, verify
from gridrun.cli import app
from gridrun.runs import layout, runlog, states
from gridrun.runs.store import Store
from gridrun.spec import TRAINER_KEYS, RunSpec, read_run_config, write_run_config
from gridrun.train import checkpoint, worker
from gridrun.train.checkpoint import weights_sha256
from gridrun.train.loop.trainer import train

QUIET = {"log": lambda s: None}


def make_run(folder: Path, task: str = "spirals", **trainer) -> tuple[RunSpec, Path]:
    cfg = {k: key.default for k, key in TRAINER_KEYS.items()}
    cfg.update(epochs=2, batch_size=32, lr=3e-3, log_every=2)
    cfg.update(trainer)
    run = RunSpec(id=folder.name, experiment="verify", variant="", seed=1, task=task, trainer=cfg,
                  task_args={"train_size": 256, "val_size": 64}, axes={})
    layout.make_private_dir(folder)
    write_run_config(folder / layout.CONFIG, run)
    return run, folder


def finish(run: RunSpec, folder: Path, **kwargs) -> dict:
    """Train as the worker does: the summary lands in summary.json."""
    summary = worker.json_safe(train(run, folder, **QUIET, **kwargs))
    worker.write_summary(folder, summary)
    return summary


@pytest.fixture(scope="module")
def spirals_run(tmp_path_factory) -> Path:
    run, folder = make_run(tmp_path_factory.mktemp("recorded") / "spirals")
    assert finish(run, folder)["status"] == states.COMPLETED
    return folder


@pytest.fixture
def copy(spirals_run, tmp_path) -> Path:
    return Path(shutil.copytree(spirals_run, tmp_path / "copy"))


def files(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in folder.rglob("*") if p.is_file()}


def tamper(folder: Path, index: int, field: str = "loss") -> dict:
    """Move one value of metrics line `index` by one ulp; the line as it was."""
    lines = (folder / layout.METRICS).read_text().splitlines()
    record = json.loads(lines[index])
    lines[index] = json.dumps({**record, field: math.nextafter(record[field], math.inf)})
    (folder / layout.METRICS).write_text("\n".join(lines) + "\n")
    return record


def train_lines(folder: Path) -> list[tuple[int, dict]]:
    return [(i, r) for i, r in enumerate(runlog.read_all(folder / layout.METRICS))
            if r["split"] == "train"]


# ---- identical replays


@pytest.mark.parametrize("task", ["spirals", "shapes", "sort"])
def test_a_run_of_each_builtin_task_replays_bitwise_identically(tmp_path, task):
    run, folder = make_run(tmp_path / task, task)
    summary = finish(run, folder)
    assert summary["status"] == states.COMPLETED, summary["error"]
    assert summary["weights_sha256"] == weights_sha256(checkpoint.load(
        folder / layout.CHECKPOINTS / "last.pt")["model"])
    before = files(folder)
    result = verify(folder)
    after = files(folder)
    assert result["ok"], verdict.describe(result)
    assert result["steps"] == summary["step"] == summary["total_steps"]
    assert result["lines"] == len(runlog.read_all(folder / layout.METRICS))
    assert result["weights"] == "identical"
    assert result["weights_sha256"] == summary["weights_sha256"]
    # the run's own files are untouched; the verdict is the one file added
    assert after.pop(layout.VERIFY) and after == before
    assert verdict.read(folder) == json.loads(json.dumps(result))
    assert verdict.describe(result).startswith(f"bitwise identical over {summary['step']} steps")


def test_cli_says_identical_and_exits_0(copy):
    result = CliRunner().invoke(app, ["verify", str(copy)])
    assert result.exit_code == 0, result.output
    steps = json.loads((copy / layout.SUMMARY).read_text())["step"]
    assert f"bitwise identical over {steps} steps" in result.stdout
    assert "final weights sha256" in result.stdout


# ---- tampering is named


def test_one_ulp_in_one_metrics_line_names_its_step_and_field(copy):
    index, line = train_lines(copy)[2]
    tamper(copy, index)
    result = CliRunner().invoke(app, ["verify", str(copy)])
    assert result.exit_code == 1, result.output
    assert (f"differs at step {line['step']} (train): loss recorded "
            f"{math.nextafter(line['loss'], math.inf)!r}, replayed {line['loss']!r}") in result.stdout
    saved = verdict.read(copy)
    assert saved["ok"] is False and saved["difference"]["step"] == line["step"]
    assert saved["difference"]["field"] == "loss" and saved["difference"]["replayed"] == line["loss"]


def test_a_tampered_validation_metric_is_named(copy):
    index, line = next((i, r) for i, r in enumerate(runlog.read_all(copy / layout.METRICS))
                       if r["split"] == "val")
    field = next(k for k in line if k not in ("t", "step", "epoch", "split"))
    tamper(copy, index, field)
    result = verify(copy)
    assert not result["ok"]
    assert result["difference"]["split"] == "val" and result["difference"]["field"] == field
    assert result["difference"]["step"] == line["step"]


def test_tampered_weights_sha256_is_reported_on_the_weights(copy):
    summary = json.loads((copy / layout.SUMMARY).read_text())
    summary["weights_sha256"] = "0" * 64
    (copy / layout.SUMMARY).write_text(json.dumps(summary))
    result = CliRunner().invoke(app, ["verify", str(copy)])
    assert result.exit_code == 1
    assert f"differs at step {summary['step']} (weights): weights_sha256 recorded {'0' * 64}" in result.stdout


def test_without_a_recorded_hash_one_ulp_in_last_pt_names_the_tensor(copy):
    summary = json.loads((copy / layout.SUMMARY).read_text())
    del summary["weights_sha256"]  # a run recorded before weights_sha256 existed
    (copy / layout.SUMMARY).write_text(json.dumps(summary))
    assert verify(copy)["weights"] == "identical"  # compared with last.pt, tensor by tensor

    path = copy / layout.CHECKPOINTS / "last.pt"
    state = checkpoint.load(path)
    key = sorted(state["model"])[-1]
    flat = state["model"][key].view(-1)
    flat[1] = torch.nextafter(flat[1], torch.tensor(math.inf))
    checkpoint.save(state, path)
    result = verify(copy)
    assert not result["ok"] and result["weights"] == "differs"
    assert result["difference"]["field"] == f"{key}[1]"
    assert result["difference"]["split"] == "weights"


# ---- shorter replays, interrupted runs, checkpoints


def test_steps_compares_only_the_lines_up_to_that_step(copy):
    lines = runlog.read_all(copy / layout.METRICS)
    late_index, late = train_lines(copy)[-1]
    tamper(copy, late_index)  # after step 4: not replayed, so not compared
    result = verify(copy, steps=4)
    assert result["ok"], verdict.describe(result)
    assert (result["steps"], result["to_step"]) == (4, 4)
    assert result["lines"] == sum(r["step"] <= 4 for r in lines) < len(lines)
    assert result["weights"] == "not compared"  # the run went on past step 4
    assert verdict.read(copy)["args"] == {"steps": 4, "from_checkpoint": False}
    assert not verify(copy, steps=late["step"])["ok"]


def test_an_interrupted_run_is_replayed_to_where_it_stopped(tmp_path):
    run, folder = make_run(tmp_path / "stopped")
    calls = []
    summary = finish(run, folder, should_stop=lambda: calls.append(1) or len(calls) >= 5)
    assert summary["status"] == states.INTERRUPTED and summary["step"] == 5
    result = verify(folder)
    assert result["ok"], verdict.describe(result)
    assert result["steps"] == 5 and result["weights"] == "identical"  # vs summary.json at step 5


def test_from_checkpoint_resumes_and_compares_what_was_recorded_after_it(tmp_path):
    # A run killed after its step-3 checkpoint with every later line on disk: keep a copy of
    # last.pt as it was at step 4 (the next checkpoint replaces it), put it back at the end.
    run, folder = make_run(tmp_path / "killed", checkpoint_every=3)
    kept = tmp_path / "step3.pt"

    def keep_step3() -> bool:
        last = folder / layout.CHECKPOINTS / "last.pt"
        if not kept.exists() and last.exists():
            shutil.copyfile(last, kept)
        return False

    summary = finish(run, folder, should_stop=keep_step3)
    assert checkpoint.load(kept)["step"] == 3
    shutil.copyfile(kept, folder / layout.CHECKPOINTS / "last.pt")
    offset = checkpoint.load(kept)["metrics_offset"]
    before = [i for i, r in train_lines(folder) if r["step"] <= 3]
    tamper(folder, before[-1])  # recorded before the checkpoint: not replayed

    result = verify(folder, from_checkpoint=True)
    assert result["ok"], verdict.describe(result)
    assert (result["from_step"], result["to_step"]) == (3, summary["step"])
    assert result["steps"] == summary["step"] - 3
    assert result["lines"] == len(runlog.read_from(folder / layout.METRICS, offset)[0]) > 0
    assert result["weights"] == "identical"
    assert not verify(folder)["ok"]  # from the start, the tampered early line is compared

    index, line = next((i, r) for i, r in train_lines(folder) if r["step"] > 3)
    tamper(folder, index)
    result = verify(folder, from_checkpoint=True)
    assert result["difference"]["step"] == line["step"]
    assert result["difference"]["field"] == "loss"


# ---- bad input: exit 2, one line


def test_bad_input_exits_2_with_one_line(copy, tmp_path):
    def run(*args):
        result = CliRunner().invoke(app, ["verify", *args])
        assert result.exit_code == 2, result.output
        return result.stderr.strip()

    # a completed run's last.pt is its end: there is nothing after it to replay
    assert "nothing to compare" in run(str(copy), "--from-checkpoint")
    last = copy / layout.CHECKPOINTS / "last.pt"
    last.write_bytes(b"garbage")
    assert "last.pt cannot be loaded" in run(str(copy), "--from-checkpoint")
    torch.save({"model": {}}, last)
    assert "holds no step" in run(str(copy), "--from-checkpoint")
    shutil.rmtree(copy / layout.CHECKPOINTS)
    assert "no checkpoint" in run(str(copy), "--from-checkpoint")
    assert "no such root" in run("abc", "--root", str(tmp_path / "empty"))  # created by nothing
    (tmp_path / "empty").mkdir(mode=0o700)
    assert "neither a run folder" in run("abc", "--root", str(tmp_path / "empty"))
    damaged = layout.make_private_dir(tmp_path / "damaged")
    (damaged / layout.DB_NAME).write_bytes(b"not a database " * 100)
    assert "is not a SQLite database" in run("abc", "--root", str(damaged))
    with pytest.raises(VerifyError, match="at least 1"):
        verify(copy, steps=0)
    config = (copy / layout.CONFIG).read_text().replace('task = "spirals"', 'task = "no_such_module:task"')
    (copy / layout.CONFIG).write_text(config)
    message = run(str(copy))
    assert "the replay could not start: " in message and "no_such_module" in message
    assert "Traceback" not in message
    assert not (copy / layout.VERIFY).exists()


def test_run_ids_and_prefixes_resolve_through_the_store(spirals_run, tmp_path):
    root = tmp_path / "root"
    run = dataclasses.replace(read_run_config(spirals_run / layout.CONFIG), id="abc123")
    shutil.copytree(spirals_run, layout.run_dir(root, run.experiment, run.id))
    with Store(root) as store:
        store.enqueue([run])
        store.transition(run.id, states.QUEUED, states.COMPLETED)
    result = CliRunner().invoke(app, ["verify", "abc", "--root", str(root)])
    assert result.exit_code == 0, result.output
    assert "bitwise identical" in result.stdout
    assert (layout.run_dir(root, run.experiment, run.id) / layout.VERIFY).exists()
    unknown = CliRunner().invoke(app, ["verify", "zzz", "--root", str(root)])
    assert unknown.exit_code == 2 and "no run matches 'zzz'" in unknown.stderr


# ---- the hash


def test_weights_sha256_ignores_key_order_and_sees_one_element():
    a = {"w": torch.tensor([[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]), "b": torch.ones(3, dtype=torch.bfloat16),
         "n": torch.tensor(7)}
    strided = torch.arange(6, dtype=torch.float32).reshape(3, 2).t()  # the same values, not contiguous
    reordered = {"n": torch.tensor(7), "b": torch.ones(3, dtype=torch.bfloat16), "w": strided}
    assert list(a) != list(reordered) and not strided.is_contiguous()
    assert weights_sha256(a) == weights_sha256(reordered)
    changed = {**a, "w": a["w"].clone()}
    changed["w"][1, 2] = torch.nextafter(changed["w"][1, 2], torch.tensor(math.inf))
    assert weights_sha256(changed) != weights_sha256(a)
    assert weights_sha256({**a, "w": a["w"].reshape(3, 2)}) != weights_sha256(a)  # same bytes, shape
    assert weights_sha256({**a, "n": torch.tensor(7, dtype=torch.int32)}) != weights_sha256(a)
    assert weights_sha256({"x": a["w"]}) != weights_sha256({"y": a["w"]})
