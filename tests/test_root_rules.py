"""One way to open a root (issue 24, finding 3): every command, reader or writer,
refuses a system folder, the home folder, a root others can write and another
user's root in one line, creating nothing; readers never create a root (a
missing one is "no such root"); only commands that queue or start the engine
create one, and only under a folder that exists; `--root ''` is refused."""

from __future__ import annotations

import contextlib
import os
import stat
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


# ---- issue 35: one rule for a root holding another user's folder -------------------------

SIX = ("engine start", "ls", "compare", "export", "logs", "queue")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
@pytest.mark.parametrize("name", SIX)
def test_a_root_holding_another_users_folder_is_refused_alike_and_left_as_it_was(name, exp,
                                                                                  tmp_path):
    from gridrun.engine import daemon

    root = tmp_path / "runs"
    root.mkdir(mode=0o700)
    (root / "theirs").mkdir(mode=0o700)
    os.chown(root / "theirs", 65534, 65534)
    expected = (f"{root / 'theirs'} belongs to {layout._owner(65534)}, not to you "
                f"({layout._owner(os.geteuid())}): use a runs root of your own (--root or "
                "GRIDRUN_ROOT) or move it away")
    args = commands(str(root), exp, tmp_path / "out.csv")[name]
    try:
        result = CliRunner().invoke(app, args)
    finally:  # a regression must not leave an engine running
        if daemon.status(root).running:
            daemon.stop(root, force=True)
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [expected], result.output
    assert os.listdir(root) == ["theirs"]  # no store, no engine file: nothing created
    assert not (tmp_path / "out.csv").exists()


# ---- issue 35: the warning that a root is readable by others -----------------------------


@pytest.fixture
def invoke(monkeypatch):
    """The CLI in this process, each call as a fresh process (its own warnings)."""
    def run(args: list[str], code: int = 0):
        monkeypatch.setattr(layout, "_WARNED", set())
        result = CliRunner().invoke(app, args)
        assert result.exit_code == code, (args, result.output)
        return result.output
    return run


@pytest.fixture
def clone(tmp_path, monkeypatch):
    """A fresh clone: `runs/` holds only README.md, mode 0755 (git stores no folder mode)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GRIDRUN_ROOT", raising=False)
    (tmp_path / "runs").mkdir()
    os.chmod(tmp_path / "runs", 0o755)
    (tmp_path / "runs" / "README.md").write_text("Runs land here.\n")
    (tmp_path / "experiments.toml").write_text(ONE_RUN)
    return tmp_path


def test_a_fresh_clone_says_nothing_about_its_runs_folder(clone, invoke):
    runs = clone / "runs"
    for args in (["plan", "experiments.toml"], ["ls"], ["engine", "status"], ["compare"]):
        out = invoke(args, code=2 if args == ["compare"] else 0)  # compare: "no runs yet"
        assert "readable by" not in out and "chmod" not in out, (args, out)
    assert stat.S_IMODE(runs.stat().st_mode) == 0o755  # reading changes nothing
    assert os.listdir(runs) == ["README.md"]
    out = invoke(["queue", "experiments.toml", "--no-check"])
    assert "readable by" not in out and "chmod" not in out, out
    # gridrun made it its root: private now, as a root it creates itself, the README kept
    assert stat.S_IMODE(runs.stat().st_mode) == 0o700
    assert (runs / "README.md").read_text() == "Runs land here.\n"
    for args in (["ls"], ["engine", "status"], ["queue", "experiments.toml", "--no-check"]):
        out = invoke(args)
        assert "readable by" not in out and "chmod" not in out, (args, out)


def test_engine_start_in_a_fresh_clone_says_nothing_either(clone, invoke):
    from gridrun.engine import daemon

    runs = clone / "runs"
    try:
        out = invoke(["engine", "start"])
    finally:
        daemon.stop(runs, force=True)
    assert "readable by" not in out and "chmod" not in out, out
    assert stat.S_IMODE(runs.stat().st_mode) == 0o700
    assert "readable by" not in (runs / "engine.log").read_text()


def test_reading_a_folder_that_is_no_runs_root_never_advises_a_chmod(tmp_path, invoke):
    share = tmp_path / "share"  # like /usr/share: the user's, readable by all, no store
    for sub in ("doc", "man", "zoneinfo"):
        (share / sub).mkdir(parents=True)
    (share / "notes.txt").write_text("")
    for path in (share, *share.iterdir()):
        os.chmod(path, 0o755)
    for args in (["ls"], ["ls", "--json"], ["engine", "status"]):
        out = invoke([*args, "--root", str(share)])
        assert "chmod" not in out and "readable by" not in out, (args, out)
    assert stat.S_IMODE(share.stat().st_mode) == 0o755
    assert sorted(os.listdir(share)) == ["doc", "man", "notes.txt", "zoneinfo"]


def test_ls_on_usr_share_never_advises_a_chmod(invoke):
    if not os.path.isdir("/usr/share"):
        pytest.skip("no /usr/share")
    result = CliRunner().invoke(app, ["ls", "--root", "/usr/share"])
    assert "chmod 700 /usr/share`" not in result.output, result.output


def test_a_runs_root_others_can_read_is_warned_about_once_per_command(exp, tmp_path, invoke):
    root = tmp_path / "runs"
    root.mkdir(mode=0o700)
    assert invoke(["queue", str(exp), "--no-check", "--root", str(root)]).count("chmod") == 0
    os.chmod(root, 0o750)  # the user's gridrun root, opened to the group
    warning = (f"warning: the runs root {root} is readable by group or others (mode 0750); "
               f"make it private with `chmod 700 {root}`")
    for args in (["ls"], ["engine", "status"], ["queue", str(exp), "--no-check"]):
        out = invoke([*args, "--root", str(root)])
        assert out.splitlines().count(warning) == 1 and out.count("readable by") == 1, (args, out)
    assert stat.S_IMODE(root.stat().st_mode) == 0o750  # an existing root is never changed


def test_the_same_root_by_another_path_is_warned_about_once(tmp_path, monkeypatch, capsys):
    root = tmp_path / "runs"
    layout.make_private_dir(root)
    (root / layout.DB_NAME).write_bytes(b"")
    os.chmod(root, 0o755)
    monkeypatch.setattr(layout, "_WARNED", set())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to(root)
    for path in (Path("runs"), root, Path("./runs/"), tmp_path / "." / "runs", Path("link")):
        layout.check_root(path)  # `run`: the queue's path, then the engine start's absolute one
    assert capsys.readouterr().err.count("readable by group or others") == 1


def test_a_folder_with_more_than_runs_in_it_keeps_its_mode_and_gets_the_warning(exp, tmp_path,
                                                                                  invoke):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("")
    os.chmod(mine, 0o755)
    out = invoke(["queue", str(exp), "--no-check", "--root", str(mine)])
    assert out.count("readable by group or others") == 1, out
    assert stat.S_IMODE(mine.stat().st_mode) == 0o755  # not gridrun's to change
