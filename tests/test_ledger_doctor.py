"""Issue 45: `gridrun doctor` checks the GPU ledger: its folder (there, a real folder,
sticky, open to every user, whose), the free space of its file system, and the entry of
this root's engine; and it says the line the engine says when it cannot use the ledger.
It creates nothing."""

from __future__ import annotations

import json
import os

import pytest
import tmpfs_kit
from ledger_kit import GIB, NOBODY, Gpus, gpu_engine, needs_root, pretend_daemon
from typer.testing import CliRunner

from gridrun.checks.doctor import FAIL, OK, WARN, check_ledger
from gridrun.cli import app
from gridrun.engine import daemon
from gridrun.engine.ledger import Ledger
from gridrun.runs.store import Store


@pytest.fixture
def folder(tmp_path, monkeypatch):
    where = tmp_path / "ledger"
    monkeypatch.setenv("GRIDRUN_LEDGER", str(where))
    return where


def check(root):
    with Store(root) as store:
        return check_ledger(root, store)


def test_a_folder_not_made_yet_is_fine_and_stays_unmade(tmp_path, folder):
    got = check(tmp_path)
    assert got.status == OK and "not made yet" in got.message and "tmpfiles.d" in got.message
    assert not folder.exists()


def test_a_sound_folder_says_its_file_system_and_entries(tmp_path, folder):
    Ledger(folder).write({"GPU-a": GIB}, 1, [])
    got = check(tmp_path)
    assert got.status == (OK if os.geteuid() == 0 else WARN), got.message
    assert got.message.startswith(f"the GPU ledger {folder}: ")
    assert "% used" in got.message and "1 entry of 1 user" in got.message


@needs_root
def test_a_folder_another_user_owns_is_a_warning_with_what_an_admin_does(tmp_path, folder):
    folder.mkdir(mode=0o1777)
    folder.chmod(0o1777)
    os.chown(folder, NOBODY, NOBODY)
    got = check(tmp_path)
    assert got.status == WARN
    assert f"it belongs to nobody (uid {NOBODY}), who may remove or change any entry" in got.message
    assert f"d {folder} 1777 root root" in got.message


@pytest.mark.parametrize(("make", "says"), [
    (lambda f: (f.with_name("real").mkdir(mode=0o1777), f.symlink_to(f.with_name("real"))),
     "is a symlink: no engine starts a run on a GPU while it is"),
    (lambda f: (f.mkdir(), f.chmod(0o777)), "lacks the sticky bit (mode 777)"),
    (lambda f: f.write_text(""), "is not a directory"),
], ids=["symlink", "not sticky", "a file"])
def test_an_unsafe_folder_fails(tmp_path, folder, make, says):
    make(folder)
    got = check(tmp_path)
    assert got.status == FAIL and says in got.message, got.message


def test_a_folder_closed_to_other_users_is_a_warning(tmp_path, folder):
    folder.mkdir()
    folder.chmod(0o1755)
    got = check(tmp_path)
    assert got.status in (WARN, FAIL)
    assert "its mode is 1755, not 1777: other users' engines cannot write" in got.message


@needs_root
def test_a_full_file_system_fails_with_how_full(tmp_path, monkeypatch):
    with tmpfs_kit.mounted(tmp_path / "shm", "1m") as shm:
        folder = shm / "gridrun-ledger"
        monkeypatch.setenv("GRIDRUN_LEDGER", str(folder))
        Ledger(folder)
        tmpfs_kit.fill(shm)
        got = check(tmp_path)
    assert got.status == FAIL
    assert f"tmpfs at {shm}) is 100% used" in got.message
    assert "no engine can write its entry, so none starts a run on a GPU" in got.message


def test_the_engines_entry_and_its_word(tmp_path, folder):
    root = tmp_path / "runs"
    engine = gpu_engine(root, Gpus([8 * GIB]), ledger=Ledger(folder))
    pretend_daemon(root)
    try:
        engine.start()
        engine.step(0.01)
        got = check(root)
        assert f"this root's engine (pid {os.getpid()}) has its entry" in got.message
        result = CliRunner().invoke(app, ["doctor", "--json", "--root", str(root)])
        [ledger] = [c for c in json.loads(result.stdout) if c["check"] == "ledger"]
        assert ledger["message"] == got.message
        for entry in folder.glob("*.json"):  # gone, and the engine has not looked yet
            entry.unlink()
        got = check(root)
        assert got.status == FAIL
        assert f"this root's engine (pid {os.getpid()}) has no entry in it" in got.message
        blocked = (f"the GPU ledger {folder} cannot be written (Permission denied): ...; no run "
                   "starts on a GPU until this engine's entry is written")
        with Store(root) as store:  # what the engine says when it cannot use the ledger
            store.set_state("gpu_memory", {**store.get_state("gpu_memory"), "ledger": blocked})
        got = check(root)
        assert got.status == FAIL and blocked in got.message
    finally:
        (root / daemon.PID).unlink()
        engine.backend.close()
        engine.sharing.close()
        engine.store.close()
