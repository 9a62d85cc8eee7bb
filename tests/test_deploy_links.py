"""`load_run` and `export-model` read a run's config.toml and checkpoints without
following a link: whoever can write in a run folder must not make another user's
gridrun load (and print, and export) a file of theirs."""

from __future__ import annotations

import shutil

import pytest
from test_deploy import make_run

import gridrun
from gridrun.deploy.model import DeployError
from gridrun.runs import layout
from gridrun.train import checkpoint


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("root"), "spirals", "linked")


def test_a_config_that_is_a_link_is_refused_in_one_line(folder, tmp_path):
    other = tmp_path / "run"
    shutil.copytree(folder, other / "deploy" / "run")
    run = other / "deploy" / "run"
    (tmp_path / "elsewhere.toml").write_bytes((run / layout.CONFIG).read_bytes())
    (run / layout.CONFIG).unlink()
    (run / layout.CONFIG).symlink_to(tmp_path / "elsewhere.toml")
    with pytest.raises(DeployError, match="is a symbolic link") as e:
        gridrun.load_run(run)
    assert "\n" not in str(e.value)


def test_a_checkpoint_that_is_a_link_is_refused_in_one_line(folder, tmp_path):
    run = tmp_path / "deploy" / "run"
    shutil.copytree(folder, run)
    best = run / layout.CHECKPOINTS / checkpoint.BEST
    target = tmp_path / "weights.pt"
    best.rename(target)
    best.symlink_to(target)
    loaded = gridrun.load_run(run)
    with pytest.raises(DeployError, match="is a symbolic link") as e:
        loaded.model("best")
    assert "\n" not in str(e.value)
    assert loaded.model("last") is not None  # the real file beside it is still read


def test_a_run_folder_named_through_a_link_of_the_users_own_is_read(folder, tmp_path):
    """A path the user typed is theirs to resolve: only what is inside the run is never followed."""
    (tmp_path / "mine").symlink_to(folder)
    assert gridrun.load_run(tmp_path / "mine").id == "linked"
