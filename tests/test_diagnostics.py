"""Every run diagnoses itself (issue 14): diagnostics on every train line and in
the summary at no extra host sync, unused parameters, input-bound runs, the
environment, divergence explained by a replay, and the memory levers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from test_trainer import QUIET, spec

from gridrun.runs import layout, progress, records, runlog, states
from gridrun.spec import TRAINER_KEYS, write_run_config
from gridrun.train import worker
from gridrun.train.loop.trainer import train


def train_lines(run_dir):
    return [r for r in runlog.read_all(run_dir / layout.METRICS) if r["split"] == records.TRAIN]


def run_worker(run_dir, run) -> dict:
    write_run_config(run_dir / layout.CONFIG, run)
    code = worker.main(run_dir)
    summary = json.loads((run_dir / layout.SUMMARY).read_text())
    assert code == states.EXIT_CODES[summary["status"]]
    return summary


# ---- per log point and per run

def test_every_train_line_and_the_summary_carry_the_diagnostics(tmp_path):
    s = train(spec(clip_grad=1e-4), tmp_path, **QUIET)
    assert s["status"] == states.COMPLETED, s["error"]
    lines = train_lines(tmp_path)
    assert lines
    for line in lines:
        assert line[records.GRAD_NORM] > 1e-4  # before clipping: above the clip, so clipping bit
        assert line[records.CLIPPED] == 1.0
        assert 0 <= line[records.DATA_WAIT] <= 1
        assert line[records.RSS] > 0  # the CPU's memory figure
    assert s["parameters"]["total"] == s["parameters"]["trainable"] > 0
    assert s["dtype"] == "float32" and s["unused_parameters"] == []
    assert 0 <= s["data_wait"] <= 1
    env = s["environment"]
    assert env["torch"] == torch.__version__ and "CUDA_VISIBLE_DEVICES" in env
    assert env["determinism"]["use_deterministic_algorithms"] is True
    assert records.Summary.from_json(worker.json_safe(s), strict=True).environment == env


def test_without_clipping_the_norm_is_still_recorded_and_clipping_never_bit(tmp_path):
    train(spec(clip_grad=1e9), tmp_path / "a", **QUIET)
    train(spec(), tmp_path / "b", **QUIET)
    clipped, plain = train_lines(tmp_path / "a"), train_lines(tmp_path / "b")
    assert all(line[records.CLIPPED] == 0.0 for line in clipped)
    assert all(records.CLIPPED not in line for line in plain)
    # the same run either way: a clip that never bites changes nothing, and the norms agree
    assert [line[records.GRAD_NORM] for line in plain] == pytest.approx(
        [line[records.GRAD_NORM] for line in clipped], rel=1e-6)
    assert [line["loss"] for line in plain] == [line["loss"] for line in clipped]


def test_a_parameter_outside_the_module_list_is_named_as_getting_no_gradient(tmp_path):
    logged = []
    s = train(spec("helper_tasks:unused_parameters", {}), tmp_path, log=logged.append)
    assert s["status"] == states.COMPLETED, s["error"]
    assert s["unused_parameters"] == ["scale", "spare.weight", "spare.bias"]
    assert any("no gradient" in w and "scale" in w for w in s["warnings"])
    assert any(line.startswith("warning:") and "spare.weight" in line for line in logged)


def test_a_task_whose_data_loading_sleeps_is_flagged_input_bound(tmp_path, virtual_sleep):
    s = train(spec("helper_tasks:slow_data", {"sleep": 0.02}, epochs=1), tmp_path, **QUIET)
    assert s["status"] == states.COMPLETED, s["error"]
    lines = runlog.read_all(tmp_path / layout.METRICS)
    assert s["data_wait"] > 0.5
    assert progress.INPUT_BOUND in progress.fold(lines).flags
    # a model that takes 50 ms a step (virtually, as the loading above): the share of
    # waiting for its in-memory batches is small however busy the machine is (a tiny
    # spirals step beside a CPU-bound process measured 76% waiting)
    fast = tmp_path / "fast"
    train(spec("helper_tasks:slow", {"inner_task": "spirals", "step_sleep": 0.05}, epochs=1),
          fast, **QUIET)
    assert progress.INPUT_BOUND not in progress.fold(runlog.read_all(fast / layout.METRICS)).flags


# ---- the faults the issue names: each test failed before its fix

def test_a_worker_given_a_gpu_without_cuda_fails_with_the_environment_error(tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    s = run_worker(tmp_path, spec())
    assert s["status"] == states.FAILED
    assert s["error"].startswith("environment:") and "CUDA_VISIBLE_DEVICES='0'" in s["error"]
    assert "torch.cuda.device_count() is 0" in s["error"] and "NVML" in s["error"]
    assert not runlog.read_all(tmp_path / layout.METRICS)  # not one step on the CPU


def test_gpus_declared_stand_ins_train_on_the_cpu_and_say_so(tmp_path, monkeypatch):
    # a test cluster's fake GRES (SLURM) or num_gpus (Ray) on a CPU machine
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("GRIDRUN_FAKE_GPUS", "1")
    s = run_worker(tmp_path, spec())
    assert s["status"] == states.COMPLETED and s["device"] == "cpu"
    assert any("CUDA_VISIBLE_DEVICES=1 are stand-ins" in w for w in s["warnings"])


def test_detect_anomaly_ends_as_diverged_with_the_op_not_failed(tmp_path):
    with pytest.warns(UserWarning, match="Error detected in"):  # anomaly mode says where, with the forward's traceback
        s = run_worker(tmp_path, spec("helper_tasks:nan_at", {"step": 3}, detect_anomaly=True))
    assert s["status"] == states.DIVERGED  # the scheduler does not retry a diverged run
    assert s["diverged_step"] == 3
    d = s["divergence"]
    assert d["step"] == 3 and d["op"] and d["op"].endswith("Backward0")
    assert d["module"] == "body.2" and d["phase"] == "forward"


# ---- divergence explained

def test_the_replay_names_the_layer_the_phase_and_the_step(tmp_path):
    # step 11: after the checkpoint at the end of epoch 0 (7 steps: spirals keeps 510 of
    # 512 samples), so the replay resumes from it
    with pytest.warns(UserWarning, match="Error detected in"):  # the replay runs in anomaly mode
        s = run_worker(tmp_path, spec("helper_tasks:nan_at", {"step": 11}, log_every=1))
    assert s["status"] == states.DIVERGED and s["diverged_step"] == 11
    d = s["divergence"]
    assert (d["module"], d["type"], d["phase"], d["step"]) == ("body.2", "Poison", "forward", 11)
    assert d["batch_finite"] is True and d["replayed_from_step"] == 7
    assert d["op"]  # anomaly mode's name for the first backward op that returned NaN
    assert not (tmp_path / "replay").exists()
    assert any("body.2 (Poison)" in w for w in s["warnings"])


def test_a_nan_made_in_the_backward_is_named_there(tmp_path):
    with pytest.warns(UserWarning, match="Error detected in _BadGradBackward"):
        s = run_worker(tmp_path, spec("helper_tasks:nan_grad_at", {"step": 3}, log_every=1))
    d = s["divergence"]
    assert (d.get("module"), d["phase"], d["step"]) == ("mid", "backward", 3), d
    assert d["op"] == "_BadGradBackward"


def test_weights_broken_by_an_update_are_named_with_the_update_phase(tmp_path):
    with pytest.warns(UserWarning, match="Error detected in"):
        s = run_worker(tmp_path, spec("helper_tasks:blowup", {"at": 4}, optimizer="sgd", lr=0.1,
                                      log_every=1))
    assert s["status"] == states.DIVERGED and s["diverged_step"] in (4, 5)
    d = s["divergence"]
    assert (d["phase"], d["step"], d["module"], d["parameter"]) == ("update", 4, "0", "0.bias")


def test_a_nan_planted_in_the_input_batch_is_reported_as_such(tmp_path):
    with pytest.warns(UserWarning, match="Error detected in"):
        s = run_worker(tmp_path, spec("helper_tasks:nan_sample", {"index": 100}, log_every=1))
    assert s["status"] == states.DIVERGED
    d = s["divergence"]
    assert d["batch_finite"] is False and d["step"] == s["diverged_step"]
    assert d["phase"] == "forward" and d["module"] == "0"  # the MLP's first layer saw it


# ---- memory levers

def test_checkpoint_modules_on_sort_gives_the_same_loss(tmp_path):
    args = {"train_size": 256, "val_size": 64}
    plain = train(spec("sort", args, epochs=2, batch_size=32), tmp_path / "a", **QUIET)
    ckpt = train(spec("sort", args, epochs=2, batch_size=32,
                      checkpoint_modules=["TransformerEncoderLayer"]),
                 tmp_path / "b", **QUIET)
    assert ckpt["status"] == states.COMPLETED, ckpt["error"]
    a, b = train_lines(tmp_path / "a"), train_lines(tmp_path / "b")
    assert [x["loss"] for x in b] == pytest.approx([x["loss"] for x in a], rel=1e-6, abs=1e-7)
    assert ckpt["final"] == pytest.approx(plain["final"], rel=1e-6)
    if not torch.cuda.is_available():  # bitwise on the CPU: the key is not part of the run id
        assert ckpt["weights_sha256"] == plain["weights_sha256"]


def test_checkpoint_modules_naming_no_class_of_the_model_fails_clearly(tmp_path):
    s = train(spec(checkpoint_modules=["NoSuchBlock"]), tmp_path, **QUIET)
    assert s["status"] == states.FAILED and "NoSuchBlock" in s["error"] and "Linear" in s["error"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peak memory is measurable on CUDA")
def test_checkpoint_modules_lowers_peak_memory_on_cuda(tmp_path):
    args = {"train_size": 512, "val_size": 64, "dim": 256, "layers": 4}
    plain = train(spec("sort", args, epochs=1, batch_size=128), tmp_path / "a", **QUIET)
    ckpt = train(spec("sort", args, epochs=1, batch_size=128,
                      checkpoint_modules=["TransformerEncoderLayer"]), tmp_path / "b", **QUIET)
    assert ckpt["peak_memory_bytes"] < plain["peak_memory_bytes"]


def test_compile_mode_is_in_the_run_id_only_when_compiling():
    from gridrun.spec.model import run_id

    cfg = {k: key.default for k, key in TRAINER_KEYS.items()}

    def rid(**changes):
        return run_id("e", "spirals", {**cfg, **changes}, {}, 0)

    assert rid(compile_mode="max-autotune") == rid()
    assert rid(compile=True, compile_mode="max-autotune") != rid(compile=True)
    assert rid(compile=True, compile_mode="default") == rid(compile=True)
    assert rid(checkpoint_modules=["Linear"]) == rid()


# ---- start-up

def test_determinism_without_compile_sets_the_eager_flag_without_importing_inductor():
    code = ("import sys, torch\n"
            "from gridrun.train.seeding import set_determinism\n"
            "set_determinism(True)\n"
            "assert torch.are_deterministic_algorithms_enabled()\n"
            "assert not torch.is_deterministic_algorithms_warn_only_enabled()\n"
            "print('torch._inductor' in sys.modules)\n"
            "set_determinism(False)\n"
            "assert not torch.are_deterministic_algorithms_enabled()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_memory_creep_is_steady_growth_over_the_last_points():
    def lines(memory):
        return [{"t": float(i), "step": i, "epoch": 0, "split": records.TRAIN, "loss": 1.0,
                 records.RSS: m, records.DATA_WAIT: 0.01} for i, m in enumerate(memory, 1)]

    creeping = [100 + 3 * i for i in range(12)]
    assert progress.fold(lines(creeping)).flags == (progress.MEMORY_CREEP,)
    flat = [100] * 4 + [200] * 8  # a step up, then flat: not creep
    assert progress.fold(lines(flat)).flags == ()
    noisy = [100 + 3 * i + (5 if i % 2 else 0) for i in range(12)]
    assert progress.fold(lines(noisy)).flags == ()
    # incremental: the same as folding everything at once
    p = progress.fold(lines(creeping)[:5])
    assert progress.fold(lines(creeping)[5:], previous=p).flags == (progress.MEMORY_CREEP,)


def test_the_runs_table_marks_flagged_runs():
    from gridrun.tui.source import RunRow
    from gridrun.tui.widgets.columns import cells

    row = RunRow(id="a", experiment="e", variant="", seed=0, status="running", samples_per_s=5200.0,
                 flags=(progress.INPUT_BOUND, progress.MEMORY_CREEP))
    assert "5.2k io mem↑" in cells(row, 0.0, False)
