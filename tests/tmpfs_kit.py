"""A small tmpfs for tests of a full disk (no tests here).

Mounting needs root (CI runs as root): elsewhere the tests that use `tmpfs`
skip with the reason. Every mount is undone, whatever the test did.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted(where: Path, size: str = "20m"):
    """A tmpfs of `size` at `where` (made if missing) for the block; skips without root."""
    if os.geteuid() != 0:
        pytest.skip("a full disk is made with a tmpfs, which needs root (CI runs as root)")
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                           str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {(done.stderr or done.stdout).strip()}")
    try:
        yield where
    finally:
        for _ in range(50):  # a process of the test may still be closing its files
            if subprocess.run(["umount", str(where)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(where: Path) -> Path:
    """A file that takes every free byte of the file system holding `where`."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 1 << 16, 1 << 12, 1):
            block = b"\0" * size
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, block)
    finally:
        os.close(fd)
    return filler


def free(where: Path) -> int:
    st = os.statvfs(where)
    return st.f_bfree * st.f_frsize
