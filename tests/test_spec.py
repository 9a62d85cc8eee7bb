"""Expansion of experiment files into runs: grid, zip, ablations, seeds, precedence, ids."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridrun.spec import (
    TRAINER_KEYS,
    EngineConfig,
    RunSpec,
    SpecError,
    load_engine_config,
    load_runs,
    read_run_config,
    write_run_config,
)


def runs_of(tmp_path: Path, text: str, name: str = "e.toml") -> list[RunSpec]:
    f = tmp_path / name
    f.write_text(text)
    return load_runs(f)


def test_grid_is_a_cartesian_product(tmp_path):
    runs = runs_of(tmp_path, """
[experiments.g]
task = "spirals"
grid = { lr = [1e-3, 3e-3], hidden = [32, 64, 128] }
seeds = 2
""")
    assert len(runs) == 2 * 3 * 2
    cells = {(r.trainer["lr"], r.task_args["hidden"], r.seed) for r in runs}
    assert len(cells) == 12
    assert runs[0].variant == "lr=0.001 hidden=32"
    assert runs[0].axes == {"lr": 0.001, "hidden": 32}
    assert {r.seed for r in runs} == {0, 1}
    assert all(r.ablation == "" for r in runs)


def test_zip_varies_lists_together_and_combines_with_grid(tmp_path):
    runs = runs_of(tmp_path, """
[experiments.z]
task = "spirals"
zip = { lr = [1e-3, 1e-2], batch_size = [32, 256] }
grid = { depth = [2, 3] }
""")
    assert len(runs) == 4
    pairs = {(r.trainer["lr"], r.trainer["batch_size"]) for r in runs}
    assert pairs == {(1e-3, 32), (1e-2, 256)}
    assert {r.task_args["depth"] for r in runs} == {2, 3}
    assert runs[0].variant == "depth=2 lr=0.001 batch_size=32"


def test_ablations_run_the_baseline_too(tmp_path):
    runs = runs_of(tmp_path, """
[experiments.a]
task = "spirals"
warmup = 0.1
seeds = [7]
ablations.no-warmup = { warmup = 0 }
ablations.sgd = { optimizer = "sgd", lr = 0.05 }
""")
    assert [(r.variant, r.ablation) for r in runs] == [
        ("baseline", "baseline"), ("no-warmup", "no-warmup"), ("sgd", "sgd")]
    base, nowarm, sgd = runs
    assert base.trainer["warmup"] == 0.1 and nowarm.trainer["warmup"] == 0
    assert sgd.trainer["optimizer"] == "sgd" and sgd.trainer["lr"] == 0.05
    assert sgd.trainer["warmup"] == 0.1  # only the named change
    assert all(r.seed == 7 for r in runs)


def test_ablations_with_a_grid_append_the_axes(tmp_path):
    runs = runs_of(tmp_path, """
[experiments.a]
task = "spirals"
grid = { hidden = [32, 64] }
ablations.sgd = { optimizer = "sgd" }
""")
    assert [r.variant for r in runs] == [
        "baseline hidden=32", "baseline hidden=64", "sgd hidden=32", "sgd hidden=64"]


def test_precedence_defaults_experiment_ablation_cell(tmp_path):
    runs = runs_of(tmp_path, """
[defaults]
task = "spirals"
lr = 0.1
epochs = 3
batch_size = 16
hidden = 8

[experiments.p]
lr = 0.2
batch_size = 32
ablations.big = { batch_size = 64, lr = 0.3 }
grid = { lr = [0.4] }
""")
    base, big = runs
    assert base.trainer["epochs"] == 3                 # from defaults
    assert base.task_args["hidden"] == 8               # task key from defaults
    assert base.trainer["batch_size"] == 32            # experiment beats defaults
    assert big.trainer["batch_size"] == 64             # ablation beats experiment
    assert base.trainer["lr"] == big.trainer["lr"] == 0.4  # cell beats ablation
    assert base.variant == "baseline" and big.variant == "big"  # one-value axis: not named


def test_seeds_count_list_and_default(tmp_path):
    text = '[experiments.s]\ntask = "spirals"\n'
    assert [r.seed for r in runs_of(tmp_path, text)] == [0]
    assert [r.seed for r in runs_of(tmp_path, text + "seeds = 3\n")] == [0, 1, 2]
    assert [r.seed for r in runs_of(tmp_path, text + "seeds = [5, 9]\n")] == [5, 9]
    assert [r.seed for r in runs_of(tmp_path, "[defaults]\nseeds = 2\n" + text)] == [0, 1]


def test_resolved_config_holds_every_trainer_key_and_task_defaults(tmp_path):
    (run,) = runs_of(tmp_path, '[experiments.c]\ntask = "spirals"\nhidden = 16\n')
    assert set(run.trainer) == set(TRAINER_KEYS)
    assert run.trainer["optimizer"] == TRAINER_KEYS["optimizer"].default
    assert run.task_args["hidden"] == 16
    assert run.task_args["depth"] == 3  # the factory's default
    assert run.config["task"] == "spirals" and run.config["hidden"] == 16
    assert run.variant == ""


def test_ints_become_floats_for_float_keys(tmp_path):
    (a,) = runs_of(tmp_path, '[experiments.c]\ntask = "spirals"\nlr = 1\n', "a.toml")
    (b,) = runs_of(tmp_path, '[experiments.c]\ntask = "spirals"\nlr = 1.0\n', "b.toml")
    assert isinstance(a.trainer["lr"], float)
    assert a.id == b.id


def test_kwargs_factory_takes_any_key(tmp_path):
    (tmp_path / "kwtask.py").write_text("def make(**kw):\n    return kw\n")
    import sys
    sys.path.insert(0, str(tmp_path))
    try:
        (run,) = runs_of(tmp_path, '[experiments.k]\ntask = "kwtask:make"\nanything = "x"\n')
    finally:
        sys.path.remove(str(tmp_path))
    assert run.task_args == {"anything": "x"}


# ------------------------------------------------------------------ ids

BASE = """
[experiments.same]
task = "spirals"
lr = {lr}
hidden = 32
epochs = 2
"""


def test_id_ignores_key_order_float_spelling_and_file_location(tmp_path):
    (a,) = runs_of(tmp_path, BASE.format(lr="1e-3"))
    reordered = '[experiments.same]\nepochs = 2\nhidden = 32\nlr = 0.001\ntask = "spirals"\n'
    (sub := tmp_path / "moved" / "deeper").mkdir(parents=True)
    (b,) = runs_of(tmp_path, reordered, "other.toml")
    (c,) = runs_of(sub, BASE.format(lr="0.0010"))
    assert a.id == b.id == c.id


def test_id_ignores_engine_table_and_non_result_keys(tmp_path):
    (a,) = runs_of(tmp_path, BASE.format(lr="1e-3"))
    (b,) = runs_of(tmp_path, BASE.format(lr="1e-3") + "num_workers = 2\nmax_retries = 3\n"
                   "\n[engine]\ncpu_slots = 4\n", "b.toml")
    assert a.id == b.id


def test_id_changes_with_config_seed_and_experiment(tmp_path):
    (a,) = runs_of(tmp_path, BASE.format(lr="1e-3"))
    (b,) = runs_of(tmp_path, BASE.format(lr="2e-3"), "b.toml")
    (c,) = runs_of(tmp_path, BASE.format(lr="1e-3") + "seeds = [1]\n", "c.toml")
    (d,) = runs_of(tmp_path, BASE.format(lr="1e-3").replace("same", "other"), "d.toml")
    assert len({a.id, b.id, c.id, d.id}) == 4


def test_run_config_round_trips(tmp_path):
    runs = runs_of(tmp_path, '[experiments.r]\ntask = "spirals"\n'
                   'grid = { lr = [1e-3, 1e-2] }\nablations.x = { betas = [0.8, 0.9] }\n')
    for run in runs:
        write_run_config(tmp_path / "config.toml", run)
        assert read_run_config(tmp_path / "config.toml") == run


# ------------------------------------------------------------------ random matrices

AXES = {  # key -> strategy of valid values
    "lr": st.floats(1e-5, 1.0, allow_nan=False),
    "batch_size": st.integers(1, 512),
    "epochs": st.integers(1, 50),
    "weight_decay": st.floats(0.0, 0.5, allow_nan=False),
    "optimizer": st.sampled_from(["adamw", "adam", "sgd"]),
    "hidden": st.integers(1, 256),
    "depth": st.integers(1, 6),
    "dropout": st.floats(0.0, 0.9, allow_nan=False),
}


def toml_value(v) -> str:
    return f'"{v}"' if isinstance(v, str) else repr(v)


@st.composite
def matrices(draw):
    keys = draw(st.lists(st.sampled_from(sorted(AXES)), min_size=0, max_size=4, unique=True))
    n_grid = draw(st.integers(0, len(keys)))
    grid = {k: draw(st.lists(AXES[k], min_size=1, max_size=3, unique=True)) for k in keys[:n_grid]}
    zip_len = draw(st.integers(1, 3))
    zipped = {k: draw(st.lists(AXES[k], min_size=zip_len, max_size=zip_len, unique=True))
              for k in keys[n_grid:]}
    seeds = draw(st.one_of(st.integers(1, 3),
                           st.lists(st.integers(0, 99), min_size=1, max_size=3, unique=True)))
    return grid, zipped, seeds


def inline(table: dict) -> str:
    return "{ " + ", ".join(f"{k} = [{', '.join(map(toml_value, v))}]" for k, v in table.items()) + " }"


@settings(max_examples=40, deadline=None)
@given(matrices())
def test_random_matrices_expand_to_product_times_seeds(matrix):
    grid, zipped, seeds = matrix
    text = '[experiments.m]\ntask = "spirals"\n'
    text += f"seeds = {seeds!r}\n"
    if grid:
        text += f"grid = {inline(grid)}\n"
    if zipped:
        text += f"zip = {inline(zipped)}\n"
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "m.toml"
        f.write_text(text)
        runs = load_runs(f)
    n_seeds = seeds if isinstance(seeds, int) else len(seeds)
    n_zip = len(next(iter(zipped.values()))) if zipped else 1
    expected = math.prod(len(v) for v in grid.values()) * n_zip * n_seeds
    assert len(runs) == expected
    assert len({r.id for r in runs}) == expected
    for r in runs:
        for k, values in {**grid, **zipped}.items():
            assert r.config[k] in values or r.config[k] in [float(v) for v in values
                                                            if not isinstance(v, str)]


# ------------------------------------------------------------------ [engine]

def test_engine_config(tmp_path):
    f = tmp_path / "e.toml"
    f.write_text('[experiments.a]\ntask = "spirals"\n[engine]\ngpus = [0, 2]\nruns_per_gpu = 2\n'
                 'cpu_slots = 3\nbackend = "ray"\nray_address = "ray://head:10001"\n')
    assert load_engine_config(f) == EngineConfig(gpus=(0, 2), runs_per_gpu=2, cpu_slots=3,
                                                 backend="ray", ray_address="ray://head:10001")
    f.write_text('[experiments.a]\ntask = "spirals"\n')
    assert load_engine_config(f) == EngineConfig.default() == EngineConfig()
    assert EngineConfig.default().gpus == "auto" and EngineConfig.default().cpu_slots == 2
    f.write_text('[engine]\ngpus = []\n')
    assert load_engine_config(f).gpus == ()
    f.write_text('[engine]\ngpus = "all"\n')
    with pytest.raises(SpecError, match='expected "auto"'):
        load_engine_config(f)
    f.write_text('[engine]\nruns_per_gpu = "auto"\n')
    assert load_engine_config(f).runs_per_gpu == "auto"  # packed by memory (engine/packing.py)
    f.write_text('[engine]\nruns_per_gpu = "max"\n')
    with pytest.raises(SpecError, match='runs_per_gpu: expected an integer >= 1 or "auto"'):
        load_engine_config(f)


def test_gpu_memory_is_gib_or_auto_and_a_size_written_with_its_unit_gets_a_suggestion(tmp_path):
    f = tmp_path / "e.toml"
    f.write_text('[experiments.a]\ntask = "spirals"\ngpu_memory = 6\n')
    (run,) = load_runs(f)
    assert run.trainer["gpu_memory"] == 6.0
    assert run.id == runs_of(tmp_path, '[experiments.a]\ntask = "spirals"\n', "other.toml")[0].id
    f.write_text('[experiments.a]\ntask = "spirals"\ngpu_memory = "6GB"\n')
    with pytest.raises(SpecError) as err:
        load_runs(f)
    assert "e.toml:3:" in str(err.value)
    assert 'gpu_memory: expected "auto" or a number of GiB > 0' in str(err.value)
    assert "did you mean gpu_memory = 6, in GiB?" in str(err.value)
    f.write_text('[experiments.a]\ntask = "spirals"\ngpu_memory = "512 MiB"\n')
    with pytest.raises(SpecError, match=r"did you mean gpu_memory = 0\.5, in GiB"):
        load_runs(f)


def test_spec_never_imports_torch():
    import subprocess
    import sys
    code = ("import sys, gridrun.spec, gridrun.commands.plan, gridrun.cli; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
