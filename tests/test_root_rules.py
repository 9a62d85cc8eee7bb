"""One way to open a root (issue 24, finding 3): every command, reader or writer,
refuses a system folder, the home folder, a root others can write and another
user's root in one line, creating nothing; readers never create a root (a
missing one is "no such root"); only commands that queue or start the engine
create one, and only under a folder that exists; `--root ''` is refused."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.runs import layout

ONE_RUN = """
[experiments.solo]
task = "spirals"
train_size = 64
val_size = 32
epochs = 1
batch_size = 32
"""
GRIDRUN_FILES = ("gridrun.db", "gridrun.db-wal", "gridrun.db-shm", "engine.lock", "engine.log",
                 "engine.pid")


def commands(root: str, exp: Path, out: Path) -> dict[str, list[str]]:
    """Every command that takes a root, readers and writers, as a user types them."""
    return {
        "engine start": ["engine", "start", "--root", root],
        "engine status": ["engine", "status", "--root", root],
        "engine stop": ["engine", "stop", "--root", root],
        "ls": ["ls", "--root", root],
        "compare": ["compare", "--root", root],
        "export": ["export", "-o", str(out), "--root", root],
        "logs": ["logs", "abc", "--root", root],
        "cancel": ["cancel", "abc", "--root", root],
        "pause": ["pause", "--root", root],
        "rm": ["rm", "abc", "--root", root],
        "queue": ["queue", str(exp), "--no-check", "--root", root],
        "train": ["train", str(exp), "--root", root],
        "verify": ["verify", "abc", "--root", root],
    }


@pytest.fixture
def exp(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(ONE_RUN)
    return path


def refused_by_all(root: Path, exp: Path, tmp_path: Path, says: str) -> None:
    before = sorted(os.listdir(root)) if root.is_dir() else None
    for name, args in commands(str(root), exp, tmp_path / "out.csv").items():
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, (name, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], (name, result.output)
        assert (sorted(os.listdir(root)) if root.is_dir() else None) == before, name
    assert not (tmp_path / "out.csv").exists()


def test_a_system_folder_is_refused_by_every_command_and_nothing_is_written(exp, tmp_path):
    etc = Path("/etc")
    there = [n for n in GRIDRUN_FILES if (etc / n).exists()]
    try:
        refused_by_all(etc, exp, tmp_path, "/etc is a system folder")
    finally:  # a regression must not leave gridrun's files in the system's configuration
        for name in GRIDRUN_FILES:
            if name not in there:
                with contextlib.suppress(OSError):
                    (etc / name).unlink()
    for folder in ("/", "/proc", "/proc/self", "/sys", "/dev", "/usr", "/var", "/boot"):
        result = CliRunner().invoke(app, ["ls", "--root", folder])
        assert result.exit_code == 2 and "is a system folder" in result.output, folder
        assert len(result.output.strip().splitlines()) == 1, result.output


def test_a_link_to_a_system_folder_is_one_too(tmp_path):
    (tmp_path / "sneaky").symlink_to("/etc")
    result = CliRunner().invoke(app, ["ls", "--root", str(tmp_path / "sneaky")])
    assert result.exit_code == 2 and "(that is /etc) is a system folder" in result.output


def test_the_home_folder_itself_is_refused(exp, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    refused_by_all(home, exp, tmp_path, "is your home folder itself")
    # a folder in it is a root like any other
    result = CliRunner().invoke(app, ["queue", str(exp), "--no-check", "--root",
                                      str(home / "runs")])
    assert result.exit_code == 0, result.output


def test_a_root_others_can_write_is_refused_by_every_command(exp, tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    refused_by_all(root, exp, tmp_path, "is writable by group or others (mode 0777)")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_another_users_root_is_refused_by_every_command(exp, tmp_path):
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    refused_by_all(root, exp, tmp_path, "belongs to")


def test_readers_never_create_a_root(exp, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "typo" / "nested" / "runs"
    for args in (["ls"], ["compare"], ["export", "-o", str(tmp_path / "o.csv")], ["logs", "abc"],
                 ["engine", "status"], ["engine", "stop"], ["verify", "abc"], ["cancel", "abc"],
                 ["pause"], ["rm", "abc"]):
        result = CliRunner().invoke(app, [*args, "--root", str(missing)])
        assert result.exit_code == 2, (args, result.output)
        assert result.output == f"no such root: {missing}\n", (args, result.output)
    assert not (tmp_path / "typo").exists() and not (tmp_path / "runs").exists()


def test_an_existing_root_without_a_store_reads_as_empty_and_stays_empty(tmp_path):
    root = tmp_path / "runs"
    root.mkdir(mode=0o700)
    for args in (["ls"], ["engine", "status"], ["ls", "--json"]):
        result = CliRunner().invoke(app, [*args, "--root", str(root)])
        assert result.exit_code == 0, result.output
    assert os.listdir(root) == []


def test_only_commands_that_queue_create_a_root_and_only_under_a_folder_that_exists(exp, tmp_path):
    nested = tmp_path / "typo" / "runs"
    for args in (["queue", str(exp), "--no-check"], ["train", str(exp)]):
        result = CliRunner().invoke(app, [*args, "--root", str(nested)])
        assert result.exit_code == 2, result.output
        assert "its parent folder" in result.output and "does not exist" in result.output
        assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "typo").exists()
    root = tmp_path / "runs"
    result = CliRunner().invoke(app, ["queue", str(exp), "--no-check", "--root", str(root)])
    assert result.exit_code == 0, result.output
    assert oct(root.stat().st_mode & 0o777) == "0o700"


def test_an_empty_root_option_is_refused(exp, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args in (["ls"], ["queue", str(exp), "--no-check"], ["engine", "start"]):
        for given in (["--root", ""], ["--root="]):
            result = CliRunner().invoke(app, [*args, *given])
            assert result.exit_code == 2 and "--root is empty" in result.output, result.output
    assert sorted(os.listdir(tmp_path)) == ["exp.toml"]


def test_layout_refuses_before_it_creates(tmp_path):
    with pytest.raises(layout.NoSuchRoot, match="no such root"):
        layout.check_root(tmp_path / "missing", create=False)
    with pytest.raises(layout.NoSuchRoot, match="parent folder"):
        layout.check_root(tmp_path / "a" / "b")
    assert not (tmp_path / "missing").exists() and not (tmp_path / "a").exists()
    with pytest.raises(layout.UnsafeRoot, match="system folder"):
        layout.check_root("/etc")
