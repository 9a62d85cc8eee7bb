"""Small image folders and datasets for the data tests (issue 26): scripts/make_images.py
imported from its file, and a dataset that reports which process read it."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_images.py"


def make_images(root: Path, n: int = 120, size: int = 16, classes: int = 4, seed: int = 0) -> Path:
    spec = importlib.util.spec_from_file_location("make_images", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.make(root, n=n, size=size, classes=classes, seed=seed)
    return root


class WhoReads(torch.utils.data.Dataset):
    """Item i: (record i as read, the pid that read it, whether its handle was opened in this pid)."""

    def __init__(self, records):
        self.records = records

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        from gridrun.data import readers

        data, label = self.records[i]
        own = [key for key, r in readers._OPEN.items() if r is self.records.reader()]
        return (torch.frombuffer(bytearray(data), dtype=torch.uint8), label, os.getpid(),
                own[0][0] == os.getpid())


class Samples(torch.utils.data.Dataset):
    """Samples of every packable kind, one shape varying with i; `fail_at` raises there,
    `sleep` slows every sample."""

    def __init__(self, n: int = 12, fail_at: int = -1, sleep: float = 0.0):
        self.n, self.fail_at, self.sleep = n, fail_at, sleep

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import numpy as np

        if i == self.fail_at:
            raise RuntimeError(f"sample {i} cannot be made")
        if self.sleep:
            time.sleep(self.sleep)
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(3, 4, generator=g), "tokens": torch.arange(i % 5 + 1),
                "mask": np.arange(6, dtype=np.uint8) % 2 == 0, "label": i % 3, "weight": i / 7,
                "flag": bool(i % 2), "raw": bytes([i, 255 - i]), "half": torch.ones(2).half()}


def samples(n: int = 12) -> Samples:
    """For `gridrun pack tests.data_helpers:samples` (a function that returns a Dataset)."""
    return Samples(n)


def slow_augmented(sleep: float = 0.002, **kwargs):
    """helper_tasks.augmented (augmentation from python's, NumPy's and torch's global
    RNGs, its own drawing collate_fn, dropout, BatchNorm) whose every training sample
    takes `sleep` seconds to load: a run with workers to gain."""
    from helper_tasks import SlowData, augmented

    task = augmented(**kwargs)
    task.train_data = SlowData(task.train_data, sleep)
    return task


class FileLike(torch.utils.data.Dataset):
    """Says it reads one file per sample, as FolderDataset does."""

    storage = "files"


class Blocks(torch.utils.data.Dataset):
    """A dataset that hangs (issue 36): from its `after`-th item on (counted in each
    process) `__getitem__` blocks for good where `where` says: "main" (the training
    process only), "workers" (DataLoader workers only) or "anywhere". It blocks in
    `time.sleep`, or, with `fifo`, in a read of that FIFO (nobody writes it); `marker`,
    if given, is created the first time it blocks. Every item it gives takes `sleep` s."""

    def __init__(self, inner, where: str = "main", after: int = 0, fifo: str = "",
                 marker: str = "", sleep: float = 0.0):
        self.inner, self.where, self.after, self.fifo, self.marker = inner, where, after, fifo, marker
        self.sleep, self.served = sleep, 0

    def __len__(self):
        return len(self.inner)

    def blocks_here(self) -> bool:
        in_worker = torch.utils.data.get_worker_info() is not None
        return {"main": not in_worker, "workers": in_worker, "anywhere": True}[self.where]

    def __getitem__(self, i):
        if self.blocks_here():
            if self.served >= self.after:
                if self.marker:
                    Path(self.marker).touch()
                if self.fifo:
                    fd = os.open(self.fifo, os.O_RDWR)  # a writer of its own: no EOF, ever
                    try:
                        os.read(fd, 1)
                    finally:
                        os.close(fd)
                time.sleep(3600)
            self.served += 1
        if self.sleep:
            time.sleep(self.sleep)
        return self.inner[i]


def blocking(where: str = "main", after: int = 0, fifo: str = "", marker: str = "",
             sleep: float = 0.0, **kwargs):
    """helper_tasks.augmented whose training data blocks for good (`Blocks`)."""
    from helper_tasks import augmented

    task = augmented(**kwargs)
    task.train_data = Blocks(task.train_data, where, after, fifo, marker, sleep)
    return task


# ---- hostile inputs (issue 36): what runs in a child process, so that a hang before a
# fix is a failed test (the child is killed at the timeout), never a hung test session;
# each timeout is in quiet seconds (tests/patience.py), so a busy machine only stretches it

def gridrun_child(*args, timeout: float = 60, address_space: int | None = None,
                  cwd: str | os.PathLike | None = None) -> tuple[int, str, str, float]:
    """`python -m gridrun ARGS` in a child process: (exit code, stdout, stderr, seconds);
    `address_space` limits its virtual memory (RLIMIT_AS, as `ulimit -v`)."""
    import resource
    import subprocess
    import sys

    import patience

    def limit():
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    started = time.monotonic()
    try:
        done = patience.run([sys.executable, "-m", "gridrun", *map(str, args)], cwd=cwd,
                            capture_output=True, text=True, timeout=timeout, preexec_fn=limit,
                            stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"gridrun {' '.join(map(str, args))} still ran after {e.timeout} s "
                             f"(killed); stderr: {e.stderr!r}") from None
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def train_child(tmp_path: Path, name: str, data: str | os.PathLike, timeout: float = 120) -> dict:
    """A run of the `images` task on `data`, trained by a worker process as the engine
    starts one; its summary (the test fails if the worker still runs at `timeout`)."""
    import json
    import subprocess
    import sys

    import patience
    from test_resume import make_run

    from gridrun.runs import layout

    args = {"inner_task": "images", "step_sleep": 0.0, "data": str(data), "channels": 4}
    _, run_dir = make_run(tmp_path, name, args, epochs=1, batch_size=8)
    try:
        patience.run([sys.executable, "-m", "gridrun.train.worker", str(run_dir)],
                     capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"training on {data} still ran after {e.timeout} s (killed)") from None
    return json.loads((run_dir / layout.SUMMARY).read_text())


def meta_of(path: Path, name: str) -> bytes | None:
    """The metadata `name` (index, names, labels, crc32) of a packed file, as stored."""
    from gridrun.data import readers, stores

    readers.close_readers()  # py-lmdb refuses a second handle on a file in one process
    if stores.sniff(Path(path)) == stores.HDF5:
        import h5py

        with h5py.File(path, "r") as f:
            return f[f"meta/{name}"][()].tobytes() if f"meta/{name}" in f else None
    import lmdb

    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return txn.get(stores.META_PREFIX + name.encode())
    finally:
        env.close()


def set_meta(path: Path, name: str, data: bytes) -> None:
    """Replace the metadata `name` of a packed file in place (damage, for the tests)."""
    import numpy as np

    from gridrun.data import readers, stores

    readers.close_readers()
    if stores.sniff(Path(path)) == stores.HDF5:
        import h5py

        with h5py.File(path, "r+") as f:
            if f"meta/{name}" in f:
                del f[f"meta/{name}"]
            f[f"meta/{name}"] = np.frombuffer(data, dtype=np.uint8)
        return
    import lmdb

    end = getattr(stores, "LMDB_END", None)
    tail = end is not None and Path(path).read_bytes().endswith(end)
    env = lmdb.open(str(path), subdir=False, lock=False, map_size=64 << 20)
    try:
        with env.begin(write=True) as txn:
            txn.put(stores.META_PREFIX + name.encode(), data)
        pages = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    finally:
        env.close()
    if tail:  # its new pages took the place of the tail: write it again
        os.truncate(path, pages)
        with open(path, "ab") as f:
            f.write(bytes(stores.LMDB_TAIL - len(end)) + end)
