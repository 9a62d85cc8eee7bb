"""The `images` task (issue 26): a CNN on image files read from disk. The folder,
its LMDB and its HDF5 packs train to bitwise the same metrics and weights, with
or without (forked, persistent) DataLoader workers; bad input ends in one line."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
from data_helpers import make_images
from test_resume import make_run, metrics_without_timing
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.data import pack
from gridrun.runs import states
from gridrun.train.loop.trainer import train

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("lmdb", "h5py", "PIL")),
    reason="needs the [data] extra: pip install -e '.[data]'")

QUIET = {"log": lambda s: None}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("imgs")
    folder = make_images(root / "images", n=120, size=16, classes=4)
    return {"folder": folder, "lmdb": pack(folder, root / "images.lmdb")["out"],
            "hdf5": pack(folder, root / "images.h5")["out"]}


def run_images(tmp_path, name, data, **trainer):
    args = {"inner_task": "images", "step_sleep": 0.0, "data": str(data), "channels": 4}
    run, run_dir = make_run(tmp_path, name, args, epochs=2, batch_size=16, log_every=2, **trainer)
    summary = train(run, run_dir, **QUIET)
    assert summary["status"] == states.COMPLETED, summary["error"]
    return summary, metrics_without_timing(run_dir)


def test_folder_lmdb_and_hdf5_train_to_the_same_bits(tmp_path, sources):
    ends = {}
    for name, data, loader in [("folder", sources["folder"], {}),
                               ("lmdb", sources["lmdb"], {}),
                               ("hdf5", sources["hdf5"], {}),
                               ("lmdb-workers", sources["lmdb"],
                                {"num_workers": 2, "persistent_workers": True}),
                               ("hdf5-workers", sources["hdf5"], {"num_workers": 2})]:
        summary, lines = run_images(tmp_path, name, data, **loader)
        ends[name] = (summary["weights_sha256"], lines)
    reference = ends.pop("folder")
    assert len(reference[1]) >= 6 and any(line.get("split") == "val" for line in reference[1])
    for name, end in ends.items():
        assert end == reference, name


def test_the_task_check_passes_an_images_experiment(tmp_path, sources):
    spec = tmp_path / "exp.toml"
    spec.write_text(f'[experiments.img]\ntask = "images"\ndata = "{sources["lmdb"]}"\n'
                    "channels = 4\n")
    result = CliRunner().invoke(app, ["plan", "--check", "--json", str(spec)])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["check"]["problems"] == []
    spec.write_text('[experiments.img]\ntask = "images"\n')
    result = CliRunner().invoke(app, ["plan", str(spec)])
    assert result.exit_code == 2 and "data" in result.stderr


def test_a_bad_image_ends_the_run_naming_the_file(tmp_path, sources):
    broken = tmp_path / "broken"
    shutil.copytree(sources["folder"], broken)
    victim = sorted((broken / "square").iterdir())[3]
    victim.write_bytes(victim.read_bytes()[:50])
    args = {"inner_task": "images", "step_sleep": 0.0, "data": str(broken), "channels": 4}
    run, run_dir = make_run(tmp_path, "broken", args, epochs=1, batch_size=16)
    summary = train(run, run_dir, log=lambda s: None)
    assert summary["status"] == states.FAILED
    assert f"{victim}: not a readable image" in summary["error"]
    missing = {**args, "data": str(tmp_path / "nothing.lmdb")}
    run, run_dir = make_run(tmp_path, "missing", missing, epochs=1)
    summary = train(run, run_dir, log=lambda s: None)
    assert summary["status"] == states.FAILED and "nothing.lmdb: no such file" in summary["error"]
