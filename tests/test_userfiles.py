"""The one rule for files gridrun writes and reads on a user's request (userfiles.py):
no existing file replaced without force, no link written through, no system folder,
a full disk leaving the old file whole; only regular files read, a FIFO never hanging."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
from tmpfs_kit import fill, mounted

from gridrun.userfiles import RefusedFile, TargetExists, atomic_write, read_regular


def write(out, data=b"new", force=False):
    with atomic_write(out, force=force) as f:
        f.write(data)


def test_an_existing_file_is_replaced_only_with_force(tmp_path):
    out = tmp_path / "model.onnx"
    out.write_bytes(b"mine")
    with pytest.raises(TargetExists, match="exists; add --force"):
        write(out)
    assert out.read_bytes() == b"mine" and os.listdir(tmp_path) == ["model.onnx"]
    write(out, force=True)
    assert out.read_bytes() == b"new"


def test_a_link_is_never_written_through_nor_replaced(tmp_path):
    target = tmp_path / "precious"
    target.write_bytes(b"precious")
    link = tmp_path / "out"
    link.symlink_to(target)
    for force in (False, True):
        with pytest.raises(RefusedFile, match="symbolic link"):
            write(link, force=force)
    assert target.read_bytes() == b"precious" and link.is_symlink()


@pytest.mark.parametrize("where", ["/etc/gridrun-test-file", "/proc/self/gridrun", "/usr/x"])
def test_a_system_folder_is_never_written(where):
    with pytest.raises(RefusedFile, match="system folder"):
        write(where, force=True)
    assert not os.path.lexists(where)


def test_a_file_in_a_folder_just_under_the_root_is_written():
    """/tmp/x.lmdb and /data/x.onnx are users' places: only /x itself is the root's."""
    out = Path(tempfile.gettempdir()) / f"gridrun-userfiles-{os.getpid()}.bin"
    try:
        write(out)
        assert out.read_bytes() == b"new"
    finally:
        out.unlink(missing_ok=True)


def test_a_folder_or_a_device_is_not_a_target(tmp_path):
    with pytest.raises(RefusedFile, match="a folder"):
        write(tmp_path, force=True)
    with pytest.raises(RefusedFile, match=r"character device|system folder"):
        write("/dev/null", force=True)


def test_a_full_disk_leaves_the_old_file_whole_and_says_so(tmp_path):
    with mounted(tmp_path / "small", "2m") as small:
        out = small / "repro.py"
        out.write_bytes(b"# hand-edited\n" * 100)
        fill(small)
        with pytest.raises(RefusedFile, match="the disk is full") as e:
            write(out, b"x" * (1 << 20), force=True)
        assert "\n" not in str(e.value)
        assert out.read_bytes() == b"# hand-edited\n" * 100
        assert sorted(os.listdir(small)) == ["filler", "repro.py"]  # no temporary left


def test_a_fifo_is_refused_at_once_not_read(tmp_path):
    fifo = tmp_path / "input.json"
    os.mkfifo(fifo)
    with pytest.raises(RefusedFile, match="FIFO"):
        read_regular(fifo)  # no writer: a blocking open would hang here


def test_devices_folders_and_sizes_are_refused_in_one_line(tmp_path):
    with pytest.raises(RefusedFile, match="character device"):
        read_regular("/dev/zero")
    with pytest.raises(RefusedFile, match="a folder"):
        read_regular(tmp_path)
    big = tmp_path / "big.json"
    big.write_bytes(b"0" * 2000)
    with pytest.raises(RefusedFile, match=r"2\.0 kB, more than the 1\.0 kB"):
        read_regular(big, limit=1000)
    assert read_regular(big, limit=2000) == b"0" * 2000
    assert read_regular(big, limit=1 << 40) == b"0" * 2000  # a big limit allocates nothing
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing")
    assert stat.S_ISREG(os.stat(big).st_mode)
