"""`gridrun plan`: the table, the counts, --json, on the shipped example and a small file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from gridrun.cli import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "experiments.toml"


def plan(*args: str):
    return CliRunner().invoke(app, ["plan", *args])


def test_example_plans_a_grid_an_ablation_and_seeds():
    result = plan(str(EXAMPLE))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["EXPERIMENT", "VARIANT", "SEED", "ID"]
    assert "width-lr: 12 runs" in lines
    assert "tricks: 6 runs" in lines
    assert lines[-1] == "total: 18 runs in 2 experiments"
    assert any("baseline" in line for line in lines)
    assert any("hidden=32 lr=0.003" in line for line in lines)


def test_json_shape():
    result = plan("--json", str(EXAMPLE))
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert list(data) == ["runs"]
    runs = data["runs"]
    assert len(runs) == 18
    assert len({r["id"] for r in runs}) == 18
    for r in runs:
        assert {"id", "experiment", "variant", "seed", "config"} <= set(r)
        assert r["config"]["task"] == "spirals"
        assert "lr" in r["config"] and "hidden" in r["config"]
    tricks = [r for r in runs if r["experiment"] == "tricks"]
    assert {r["ablation"] for r in tricks} == {"baseline", "no-warmup", "sgd"}


def test_json_ids_match_the_table():
    table = plan(str(EXAMPLE)).stdout
    ids = [r["id"] for r in json.loads(plan("--json", str(EXAMPLE)).stdout)["runs"]]
    assert all(i in table for i in ids)


def test_single_run_file(tmp_path):
    f = tmp_path / "one.toml"
    f.write_text('[experiments.solo]\ntask = "spirals"\n')
    result = plan(str(f))
    assert result.exit_code == 0
    assert "solo: 1 run" in result.stdout
    assert result.stdout.rstrip().endswith("total: 1 run in 1 experiment")
    assert "-" in result.stdout.splitlines()[1]  # nothing varies: the variant shows as "-"


def test_plan_writes_nothing(tmp_path):
    f = tmp_path / "e.toml"
    f.write_text('[experiments.a]\ntask = "spirals"\nseeds = 2\n')
    before = sorted(tmp_path.rglob("*"))
    assert plan(str(f)).exit_code == 0
    assert sorted(tmp_path.rglob("*")) == before


def test_console_script_runs_without_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[experiments.a]\ntask = "spirals"\nlrr = 1\n')
    proc = subprocess.run([sys.executable, "-m", "gridrun", "plan", str(bad)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2
    assert "did you mean 'lr'?" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


PLAN_ROOT = """
[experiments.p]
task = "spirals"
train_size = 64
val_size = 32
epochs = 1
batch_size = 32
seeds = 4
"""


def test_plan_takes_a_root_and_says_what_is_new_there(tmp_path):
    from gridrun.runs import states
    from gridrun.runs.store import Store
    from gridrun.spec import load_runs

    file = tmp_path / "exp.toml"
    file.write_text(PLAN_ROOT)
    root = tmp_path / "runs"
    fresh = plan(str(file), "--root", str(root))
    assert fresh.exit_code == 0, fresh.output
    assert fresh.stdout.splitlines()[-1] == f"in {root}: 4 new"
    assert not root.exists()  # planning writes nothing
    runs = load_runs(file)
    with Store(root) as store:
        store.enqueue(runs[:3])
        store.transition(runs[0].id, states.QUEUED, states.RUNNING, slot="cpu0")
        store.transition(runs[0].id, states.RUNNING, states.COMPLETED)
        store.transition(runs[1].id, states.QUEUED, states.RUNNING, slot="cpu0")
        store.transition(runs[1].id, states.RUNNING, states.FAILED)
    result = plan(str(file), "--root", str(root))
    assert result.stdout.splitlines()[-1] == (
        f"in {root}: 1 new, 1 done, 1 queued or running, 1 ended without completing "
        "(`gridrun queue` runs these again; --force the done ones too)")
    as_json = json.loads(plan(str(file), "--root", str(root), "--json").stdout)
    assert as_json["root"] == {"path": str(root), "new": 1, "done": 1, "queued": 1, "again": 1}
    top = CliRunner().invoke(app, ["--root", str(root), "plan", str(file)])
    assert top.stdout.splitlines()[-1].startswith(f"in {root}: 1 new")
    assert plan(str(file)).stdout.splitlines()[-1].startswith("total:")  # no root: no counts
