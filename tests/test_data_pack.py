"""Packed datasets (issue 26): a folder or a Dataset packed into LMDB and HDF5 reads
back bit for bit; forked and persistent DataLoader workers each open their own
handle; packing is atomic; truncated, foreign and old files are refused in one line."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from data_helpers import Samples, WhoReads, make_images
from typer.testing import CliRunner

from gridrun.cli import app
from gridrun.data import (
    FolderDataset,
    PackedDataset,
    PackError,
    check,
    open_records,
    pack,
    readers,
    stores,
)

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("lmdb", "h5py", "PIL")),
    reason="needs the [data] extra: pip install -e '.[data]'")

FORMATS = ["lmdb", "hdf5"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_images(tmp_path_factory.mktemp("images") / "images", n=60, size=8, classes=3)


@pytest.fixture(scope="module")
def packed(folder, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("packed")
    return {fmt: Path(pack(folder, out / f"images.{fmt}", format=fmt)["out"]) for fmt in FORMATS}


def gridrun(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_folder_packs_into_the_same_bytes_with_an_index(folder, packed, fmt):
    files, ds = FolderDataset(folder), PackedDataset(packed[fmt])
    assert len(ds) == len(files) == 60
    assert [ds[i] for i in range(len(ds))] == [files[i] for i in range(len(files))]
    assert ds.class_names == files.class_names == ["disc", "square", "triangle"]
    assert ds.index.image == {"format": "PNG", "width": 8, "height": 8, "mode": "RGB"}
    assert ds.name(4) == files.name(4) and ds.storage == fmt
    # the content hash names the data, not the container
    assert ds.index.source_sha256 == PackedDataset(packed["lmdb"]).index.source_sha256
    assert check(packed[fmt])["ok"]
    assert isinstance(open_records(folder), FolderDataset)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_samples_of_a_dataset_come_back_with_their_types_and_bits(tmp_path, fmt):
    source = Samples(12)
    result = pack(source, tmp_path / f"s.{fmt}", format=fmt)
    ds = PackedDataset(result["out"])
    assert len(ds) == 12 and check(result["out"])["ok"]
    by_name = {f["name"]: f for f in ds.index.fields}
    assert by_name["x"]["shape"] == [3, 4] and by_name["tokens"]["shape"] is None  # varies
    for i in range(12):
        want, got = source[i], ds[i]
        assert list(got) == list(want)
        for key, value in want.items():
            assert type(got[key]) is type(value), key
            if isinstance(value, torch.Tensor):
                assert got[key].dtype == value.dtype and torch.equal(got[key], value)
            elif isinstance(value, np.ndarray):
                assert got[key].dtype == value.dtype and np.array_equal(got[key], value)
            else:
                assert got[key] == value


def test_unpackable_samples_say_which_and_why(tmp_path):
    with pytest.raises(PackError, match=r"sample 0, field '0': a object cannot be packed"):
        pack([(object(),)], tmp_path / "x.lmdb")
    with pytest.raises(PackError, match=r"sample 1 is a tuple .* but sample 0"):
        pack([(torch.zeros(2),), (torch.zeros(2, dtype=torch.int64),)], tmp_path / "y.lmdb")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("persistent", [False, True])
def test_forked_workers_open_their_own_handle(packed, fmt, persistent):
    """The main process reads first (its handle is open when the workers fork); each
    worker must open its own, and the main process's keeps working after."""
    ds = WhoReads(PackedDataset(packed[fmt]))
    expected = [ds[i] for i in range(len(ds))]
    assert all(own and pid == os.getpid() for _, _, pid, own in expected)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, collate_fn=list,
                                         persistent_workers=persistent)
    for _ in range(2):
        got = [item for batch in loader for item in batch]
        assert [(d.tolist(), y) for d, y, _, _ in got] == [(d.tolist(), y) for d, y, _, _ in expected]
        pids = {pid for _, _, pid, _ in got}
        assert len(pids) == 2 and os.getpid() not in pids
        assert all(own for _, _, _, own in got)
    assert ds[5][1] == expected[5][1]  # the parent's handle was left alone


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_spawned_worker_gets_no_handle_in_its_pickle(packed, fmt):
    import pickle

    ds = PackedDataset(packed[fmt])
    ds[0]
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._reader is None and clone[3] == ds[3]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("keep", [0.5, 0.02])
def test_a_truncated_file_is_refused_in_one_line(packed, tmp_path, fmt, keep):
    cut = tmp_path / packed[fmt].name
    data = packed[fmt].read_bytes()
    cut.write_bytes(data[:max(64, int(len(data) * keep))])
    with pytest.raises(PackError) as e:
        PackedDataset(cut)
    message = str(e.value)
    assert str(cut) in message and "truncated" in message and "re-pack" in message
    assert "\n" not in message
    code, _, err = gridrun("pack", "--check", str(cut))
    assert code == 2 and err.strip() == message


def test_a_file_of_another_version_says_how_to_repack(folder, tmp_path):
    old = tmp_path / "old.h5"
    pack(folder, old)
    import h5py

    with h5py.File(old, "r+") as f:
        index = json.loads(f["meta/index"][()].tobytes())
        index.update(version=0, gridrun="0.0.1")
        del f["meta/index"]
        f["meta/index"] = np.frombuffer(json.dumps(index).encode(), dtype=np.uint8)
    with pytest.raises(PackError, match="packed by gridrun 0.0.1 in format version 0; this "
                                        "gridrun reads version 1: re-pack it with `gridrun pack "
                                        f"{folder.resolve()} -o {old} --force`"):
        PackedDataset(old)


def test_paths_that_are_not_packed_datasets(tmp_path, folder):
    import h5py
    import lmdb

    (tmp_path / "notes.txt").write_text("not a dataset")
    env = lmdb.open(str(tmp_path / "plain.lmdb"), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v")
    env.close()
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["x"] = np.zeros(3)
    cases = {"notes.txt": "is not a packed dataset: neither an LMDB nor an HDF5 file",
             "plain.lmdb": "is an LMDB file but not a packed dataset",
             "plain.h5": "is an HDF5 file but not a packed dataset",
             "missing.lmdb": "no such file"}
    for name, words in cases.items():
        with pytest.raises(PackError, match=words):
            open_records(tmp_path / name)
    with pytest.raises(PackError, match="is a folder, not a packed file"):
        PackedDataset(folder)


def test_a_bad_folder_names_the_file(folder, tmp_path):
    import shutil

    from PIL import Image

    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    victim = sorted((broken / "square").iterdir())[2]
    victim.write_bytes(victim.read_bytes()[:60])
    with pytest.raises(PackError, match=f"{victim}: not a readable image"):
        pack(broken, tmp_path / "b.lmdb")
    mixed = tmp_path / "mixed"
    shutil.copytree(folder, mixed)
    odd = sorted((mixed / "triangle").iterdir())[1]
    Image.fromarray(np.zeros((5, 7, 3), dtype=np.uint8)).save(odd)
    with pytest.raises(PackError, match=f"{odd} is 7x5 RGB but .*disc.* is 8x8 RGB: images of "
                                        "one size are expected"):
        pack(mixed, tmp_path / "m.lmdb")
    assert pack(mixed, tmp_path / "m.lmdb", any_size=True)["records"] == 60
    assert PackedDataset(tmp_path / "m.lmdb").index.image is None
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.png").write_bytes(b"x")
    with pytest.raises(PackError, match="no class folders"):
        pack(tmp_path / "flat", tmp_path / "f.lmdb")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_failed_pack_leaves_the_old_file_and_no_temporary(tmp_path, fmt):
    out = tmp_path / f"s.{fmt}"
    pack(Samples(4), out)
    before = out.read_bytes()
    with pytest.raises(PackError, match=r"^sample 5 of a Samples raised RuntimeError: sample 5 "
                                        r"cannot be made$"):
        pack(Samples(8, fail_at=5), out, force=True)
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    with pytest.raises(PackError, match="exists; add --force to replace it"):
        pack(Samples(4), out)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_pack_killed_midway_leaves_nothing_that_reads_as_good(tmp_path, fmt):
    out = tmp_path / f"s.{fmt}"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from data_helpers import Samples; "
            "from gridrun.data import pack; "
            f"pack(Samples(400, sleep=0.01), {str(out)!r}, progress=lambda d, t: print(d, flush=True))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(Path(__file__).parent)],
                            stdout=subprocess.PIPE, text=True)
    for _ in range(30):  # some records written
        proc.stdout.readline()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    temps = [p for p in tmp_path.iterdir() if p.name.startswith(f".{out.name}.tmp-")]
    assert temps
    for temp in temps:
        if not temp.name.endswith(".spool"):
            with pytest.raises(PackError):
                PackedDataset(temp)
    pack(Samples(3), out)  # the next pack of the target clears what the dead one left
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


@pytest.mark.parametrize("fmt", FORMATS)
def test_check_finds_a_damaged_record_and_names_it(packed, tmp_path, fmt):
    ds = PackedDataset(packed[fmt])
    record = ds.raw(7)
    data = bytearray(packed[fmt].read_bytes())
    at = bytes(data).index(record)
    data[at + len(record) // 2] ^= 0xFF
    damaged = tmp_path / packed[fmt].name
    damaged.write_bytes(bytes(data))
    report = check(damaged)
    assert not report["ok"] and report["bad_records"] == 1 and report["first_bad"] == [ds.name(7)]
    code, out, _ = gridrun("pack", "--check", str(damaged))
    assert code == 1 and f"is damaged: 1 records differ from what was packed (first: {ds.name(7)})" in out
    assert "re-pack it (`gridrun pack" in out


def test_the_command_packs_checks_and_reports(folder, tmp_path, monkeypatch):
    out = tmp_path / "cli.lmdb"
    code, stdout, err = gridrun("pack", str(folder), "-o", str(out), "--check")
    assert code == 0, err
    first, second = stdout.strip().splitlines()
    assert first.startswith(f"packed 60 files in 3 classes, 8x8 RGB PNG from {folder.resolve()} "
                            f"into {out} (lmdb): ")
    assert second.startswith(f"{out}: all 60 records intact, the content hash matches")
    code, stdout, err = gridrun("pack", str(folder), "-o", str(tmp_path / "cli.h5"), "--json")
    assert code == 0 and json.loads(stdout)["pack"]["records"] == 60
    code, _, err = gridrun("pack", str(folder))
    assert code == 2 and "name the file to write: -o OUT" in err
    code, _, err = gridrun("pack", str(folder), "-o", str(tmp_path / "x.bin"))
    assert code == 2 and "--format lmdb or --format hdf5" in err
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    code, stdout, err = gridrun("pack", "data_helpers:samples", "-o", str(tmp_path / "s.h5"))
    assert code == 0, err
    assert "packed 12 samples (dict: x: float32(3, 4), tokens: int64(varies)" in stdout


def test_readers_share_one_handle_per_file_and_process(packed):
    train, val = PackedDataset(packed["lmdb"]), PackedDataset(packed["lmdb"])
    assert train.reader() is val.reader()  # py-lmdb refuses a second handle on one file
    first = train.reader()
    readers.close_readers()
    assert train.reader() is not first and train[0] == val[0]
    assert isinstance(stores.sniff(packed["lmdb"]), str)
