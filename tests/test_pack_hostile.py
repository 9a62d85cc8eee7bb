"""Hostile pack sources and packed files (issue 36): links to devices, FIFOs, sockets and
names that are not UTF-8 end `pack` and training at once, all named, nothing written; a
packed file that is a FIFO or a device or whose metadata is damaged, a dataset that
raises, a full disk, `ulimit -v`: one line each. A fuzz test: truncations and flipped
bytes end in a read or in one line (each case in a child process)."""

from __future__ import annotations

import importlib.util
import json
import os
import select
import shutil
import signal
import stat
import sys
import tempfile
import textwrap
from pathlib import Path

import patience
import pytest
from data_helpers import Samples, gridrun_child, make_images, meta_of, set_meta, train_child
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tmpfs_kit import fill, mounted

from gridrun.data import FolderDataset, PackedDataset, PackError, check, pack, stores
from gridrun.userfiles import RefusedFile

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("lmdb", "h5py", "PIL")),
    reason="needs the [data] extra: pip install -e '.[data]'")

FORMATS = ["lmdb", "hdf5"]
SUFFIX = {"lmdb": "lmdb", "hdf5": "h5"}
GB = 1 << 30


def header(root: Path, n: int) -> str:
    return (f"{root}: {n} {'entry' if n == 1 else 'entries'} that gridrun does not read (it "
            "reads regular files and folders, and links to regular files inside the folder); "
            "nothing was read or written:")


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture
def source(tmp_path) -> Path:
    return make_images(tmp_path / "src", n=24, size=8, classes=2)  # disc/, square/


# ---- 1, 2: links to devices, FIFOs, sockets: refused at once, all named, nothing written

@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_link_to_a_device_ends_pack_at_once_writing_nothing(source, tmp_path, device):
    """It grew `pack` to 23 GB (/dev/zero) or ran until killed (/dev/urandom); the child
    runs under a 1 GiB address space so the old behaviour fails fast."""
    link = source / "disc" / "zz.png"
    link.symlink_to(device)
    out = tmp_path / "out.lmdb"
    code, _, err, _ = gridrun_child("pack", source, "-o", out, address_space=GB, timeout=60)
    assert code == 2, err
    assert err.strip().splitlines() == [
        header(source, 1),
        f"{link}: a symbolic link to {device}, a character device: links are followed only "
        "to regular files"]
    assert listing(tmp_path) == ["src"]
    with pytest.raises(PackError) as e:
        FolderDataset(source)  # training on the folder: refused as it is built
    assert str(e.value) == err.strip()


def test_the_link_policy_names_every_problem_at_once(source, tmp_path):
    square = source / "square"
    first = sorted((source / "disc").iterdir())[0]
    outside = tmp_path / "outside.png"
    shutil.copy(first, outside)
    (square / "a_inside.png").symlink_to(first)  # a regular file inside: followed
    (square / "b_outside.png").symlink_to(outside)
    (square / "c_folder.png").symlink_to(source / "disc")
    (square / "d_dangling.png").symlink_to(tmp_path / "nothing.png")
    os.mkfifo(square / "e_fifo.png")
    os.mknod(square / "f_socket.png", stat.S_IFSOCK | 0o600)
    (square / "g_loop.png").symlink_to(square / "g_loop.png")
    os.mkfifo(square / ".hidden.png")  # hidden: never read, not a problem
    (source / "notes.txt").symlink_to("/dev/zero")  # beside the classes: a problem too
    with pytest.raises(PackError) as e:
        FolderDataset(source)
    assert str(e.value).splitlines() == [
        header(source, 7),
        f"{source / 'notes.txt'}: a symbolic link to /dev/zero, a character device: links are "
        "followed only to regular files",
        f"{square / 'b_outside.png'}: a symbolic link to {outside}, outside the source folder: "
        "copy the file in (links are followed only to regular files inside the folder)",
        f"{square / 'c_folder.png'}: a symbolic link to {source / 'disc'}, a folder: links are "
        "followed only to regular files",
        f"{square / 'd_dangling.png'}: a symbolic link to {tmp_path / 'nothing.png'}, which "
        "does not exist",
        f"{square / 'e_fifo.png'}: a FIFO (named pipe), not a regular file: move it out of the "
        "folder",
        f"{square / 'f_socket.png'}: a socket, not a regular file: move it out of the folder",
        f"{square / 'g_loop.png'}: a symbolic link to {square / 'g_loop.png'}, which cannot be "
        "followed (Too many levels of symbolic links)"]
    for bad in ("b_outside", "c_folder", "d_dangling", "e_fifo", "f_socket", "g_loop"):
        (square / f"{bad}.png").unlink()
    (source / "notes.txt").unlink()
    folder = FolderDataset(source)
    assert "square/a_inside.png" in [folder.name(i) for i in range(len(folder))]
    assert pack(source, tmp_path / "ok.h5")["records"] == 25


def test_at_most_twenty_problems_are_listed_then_a_count(source):
    for i in range(27):
        os.mkfifo(source / "disc" / f"fifo{i:02}.png")
    with pytest.raises(PackError) as e:
        FolderDataset(source)
    lines = str(e.value).splitlines()
    assert lines[0] == header(source, 27)
    assert len(lines) == 1 + 20 + 1 and lines[-1] == "... and 7 more"


def test_a_fifo_in_the_source_never_hangs_pack_check_or_training(source, tmp_path):
    """`open()` of a FIFO waited for a writer forever, deaf to SIGTERM and SIGINT."""
    fifo = source / "square" / "x.png"
    os.mkfifo(fifo)
    want = [header(source, 1), f"{fifo}: a FIFO (named pipe), not a regular file: move it out "
            "of the folder"]
    for args in (["-o", tmp_path / "out.lmdb"], ["-o", tmp_path / "out.h5", "--check"]):
        code, _, err, _ = gridrun_child("pack", source, *args, timeout=30)
        assert (code, err.strip().splitlines()) == (2, want)
    assert listing(tmp_path) == ["src"]
    summary = train_child(tmp_path / "runs", "fifo", source, timeout=90)
    assert summary["status"] == "failed"
    assert summary["error"].splitlines()[1:] == want[1:]


@pytest.mark.parametrize("what", ["fifo", "/dev/zero"])
def test_a_fifo_or_a_device_as_the_packed_file_is_refused_at_once(tmp_path, what):
    if what == "fifo":
        path = tmp_path / "x.lmdb"
        os.mkfifo(path)
        kind = "a FIFO (named pipe)"
    else:
        path, kind = Path(what), "a character device"
    want = f"packed file {path} is {kind}, not a regular file: not read"
    code, _, err, _ = gridrun_child("pack", "--check", path, timeout=30)
    assert (code, err.strip()) == (2, want)
    summary = train_child(tmp_path / "runs", "packed", path, timeout=90)
    assert summary["status"] == "failed" and want in summary["error"]


# ---- 3: names that are not UTF-8

def test_a_name_that_is_not_utf8_is_refused_shown_escaped(source, tmp_path):
    first = sorted((source / "disc").iterdir())[0]
    shutil.copy(first, os.path.join(os.fsencode(source / "disc"), b"\xff.png"))
    want = [header(source, 1),
            f"{source / 'disc'}/\\xff.png: a name that is not UTF-8 (shown escaped): rename it"]
    for fmt in FORMATS:
        with pytest.raises(PackError) as e:
            pack(source, tmp_path / f"o.{SUFFIX[fmt]}")
        assert str(e.value).splitlines() == want
    with pytest.raises(PackError) as e:
        FolderDataset(source)
    assert str(e.value).splitlines() == want
    code, _, err, _ = gridrun_child("pack", source, "-o", tmp_path / "o.lmdb", timeout=60)
    assert (code, err.strip().splitlines()) == (2, want)
    assert listing(tmp_path) == ["src"]
    summary = train_child(tmp_path / "runs", "name", source, timeout=90)
    assert summary["status"] == "failed" and summary["error"].splitlines()[1:] == want[1:]


# ---- 4: LMDB under `ulimit -v`

def test_lmdb_packs_under_a_small_address_space_limit(tmp_path):
    """A 1 TiB map failed under any `ulimit -v` below it (lmdb.MemoryError, a temporary
    left): 300 images (1.3 MB) pack and check under 1 GiB, as 20,000 (179 MB) under 4 GB."""
    src = make_images(tmp_path / "src", n=300, size=32, classes=10)
    out = tmp_path / "out.lmdb"
    code, stdout, err, _ = gridrun_child("pack", src, "-o", out, "--check",
                                         address_space=GB, timeout=120)
    assert code == 0, err
    assert "all 300 records intact" in stdout
    assert listing(tmp_path) == ["out.lmdb", "src"]


@pytest.mark.parametrize("commit", [4096, 64 << 20])
def test_a_full_lmdb_map_grows_and_the_transaction_is_written_again(tmp_path, monkeypatch,
                                                                      commit):
    from gridrun.data import writers

    monkeypatch.setattr(writers, "map_size_for", lambda *a, **k: 64 << 10)  # far too small
    monkeypatch.setattr(writers, "COMMIT_BYTES", commit)
    src = make_images(tmp_path / "src", n=120, size=32, classes=4)
    done = pack(src, tmp_path / "f.lmdb")
    assert check(done["out"])["ok"] and PackedDataset(done["out"])[7] == FolderDataset(src)[7]
    done = pack(Samples(200), tmp_path / "s.lmdb")  # its size unknown before it is read
    assert check(done["out"])["ok"]
    assert listing(tmp_path) == ["f.lmdb", "s.lmdb", "src"]


# ---- 5: a full disk

@pytest.mark.parametrize("fmt", FORMATS)
def test_a_full_disk_is_one_line_and_leaves_no_temporary(tmp_path, fmt):
    src = make_images(tmp_path / "src", n=200, size=32, classes=4)  # about 0.5 MB
    disk = tmp_path / "disk"
    with mounted(disk, "4m"):
        filler = fill(disk)
        os.truncate(filler, filler.stat().st_size - (200 << 10))  # 200 kB left
        out = disk / f"out.{SUFFIX[fmt]}"
        code, _, err, _ = gridrun_child("pack", src, "-o", out, timeout=120)
        listed = listing(disk)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cannot write {out}: the disk is full (")
    assert lines[0].endswith("; nothing was written (free space or pick another -o)")
    assert listed == ["filler"]


# ---- 6: damaged metadata

@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    """12 images and 12 samples, packed into each format: "lmdb", "hdf5", "samples-lmdb", ..."""
    root = tmp_path_factory.mktemp("packs")
    folder = make_images(root / "images", n=12, size=8, classes=2)
    return {f"{kind}{fmt}": Path(pack(src, root / f"{kind}p.{SUFFIX[fmt]}")["out"])
            for fmt in FORMATS for kind, src in (("", folder), ("samples-", Samples(12)))}


def damaged_copy(packs, tmp_path, fmt, name, edit) -> Path:
    copy = tmp_path / packs[fmt].name
    shutil.copy(packs[fmt], copy)
    set_meta(copy, name, edit(meta_of(copy, name)))
    return copy


def index_edit(**change):
    def edit(raw: bytes) -> bytes:
        index = json.loads(raw)
        for key, value in change.items():
            if key == "image_without_width":
                del index["image"]["width"]
            else:
                index[key] = value
        return json.dumps(index).encode()
    return edit


DAMAGE = {
    "names that do not parse": ("names", lambda raw: raw[:-3],
                                "its record names do not parse"),
    "names of another length": ("names", lambda raw: b'["a.png"]',
                                "its record names hold 1 entries for 12 records"),
    "an image without its width": ("index", index_edit(image_without_width=True),
                                   "its gridrun index is damaged (image width None)"),
    "a negative length": ("index", index_edit(length=-3),
                          "its gridrun index is damaged (length -3)"),
    "class names that are not names": ("index", index_edit(class_names=[1, 2]),
                                       "its gridrun index is damaged (class_names is not a list "
                                       "of names)"),
    "a label naming no class": ("labels", lambda raw: b"\x07" + raw[1:],
                                "record 0 has the label 7, which names none of its 2 classes"),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_metadata_is_one_line_naming_the_file(packs, tmp_path, fmt, damage):
    name, edit, words = DAMAGE[damage]
    copy = damaged_copy(packs, tmp_path, fmt, name, edit)
    with pytest.raises(PackError) as e:
        ds = PackedDataset(copy)
        [ds.name(i) for i in range(len(ds))]
        ds.index.describe()
    message = str(e.value)
    assert "\n" not in message and message.startswith(str(copy)) and words in message
    code, _, err, _ = gridrun_child("pack", "--check", copy, timeout=60)
    if name == "labels":  # --check reads on, and counts every label that names no class
        assert code == 1 and err == ""
    else:
        assert (code, err.strip()) == (2, message)


# ---- 7: a dataset that raises; 9: `pack module:attr` imports from the current folder

DATASET = textwrap.dedent("""
    import torch

    class Rows(torch.utils.data.Dataset):
        classes = ["a", "b", "c"]

        def __len__(self):
            return 30

        def __getitem__(self, i):
            if i == 17:
                raise ValueError(f"row {i} is not a row\\nsecond line")
            return torch.full((3,), float(i)), i % 3

    rows = Rows()
""")


def test_a_dataset_that_raises_is_one_line_naming_the_sample(tmp_path, monkeypatch):
    (tmp_path / "hostile_rows.py").write_text(DATASET)
    out = tmp_path / "rows.h5"
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    code, _, err, _ = gridrun_child("pack", "hostile_rows:rows", "-o", out)
    assert (code, err.strip()) == (
        2, "sample 17 of hostile_rows:rows raised ValueError: row 17 is not a row")
    assert listing(tmp_path) == ["hostile_rows.py"]


def test_pack_imports_a_dataset_from_the_current_folder_as_train_does(tmp_path):
    """The console script starts with its bin folder first on sys.path, not the current
    folder: `train` puts it there (tasks.use_working_directory), and so does `pack`."""
    script = Path(sys.executable).with_name("gridrun")
    if not script.exists():
        pytest.skip("no gridrun console script beside this Python")
    (tmp_path / "cwd_rows.py").write_text(DATASET.replace("i == 17", "i == -1"))
    done = patience.run([str(script), "pack", "cwd_rows:rows", "-o", "rows.lmdb"],
                        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert PackedDataset(tmp_path / "rows.lmdb").class_names == ["a", "b", "c"]


# ---- 8: --check covers the class names

@pytest.mark.parametrize("fmt", FORMATS)
def test_check_compares_the_class_names_with_the_sources(packs, tmp_path, fmt):
    swapped = damaged_copy(packs, tmp_path, fmt, "index",
                           index_edit(class_names=["disc", "triangle"]))
    report = check(swapped)
    assert not report["ok"] and report["sha256_matches"]
    assert report["class_names"] == ("class 1 is stored as 'triangle' but the source's class "
                                     "folder 1 is 'square'")
    code, out, _, _ = gridrun_child("pack", "--check", swapped, timeout=60)
    assert code == 1 and out.startswith(f"{swapped} is damaged: class 1 is stored as 'triangle'")

    class Named(Samples):
        classes = ("cat", "dog")

    samples = Path(pack(Named(6), tmp_path / f"s.{SUFFIX[fmt]}")["out"])
    assert check(samples)["ok"]
    set_meta(samples, "index", index_edit(class_names=["cat", "dig"])(meta_of(samples, "index")))
    report = check(samples)
    assert not report["ok"] and report["class_names"] == (
        "the class names stored differ from the dataset's when it was packed")


# ---- the fuzz test: truncations, flipped bytes, random index and names

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                    | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
INDEX_KEYS = ["kind", "length", "source", "source_sha256", "bytes", "class_names", "image",
              "structure", "fields", "format", "version", "class_names_sha256"]
MUTATION = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("flip"), st.lists(st.tuples(st.floats(0, 1, exclude_max=True),
                                                  st.integers(1, 255)), min_size=1, max_size=6)),
    st.tuples(st.just("index"), st.sampled_from(INDEX_KEYS), JSON),
    st.tuples(st.just("names"), st.integers(0, 11), JSON),
    st.tuples(st.just("meta bytes"), st.sampled_from(["index", "names", "labels", "crc32"]),
              st.binary(max_size=64)),
)


def read_everything(path: Path) -> None:
    """What a user does with a packed file: open it, read every record and name, check it."""
    ds = PackedDataset(path)
    for i in range(len(ds)):
        ds[i], ds.name(i)
    repr(ds), check(path)


def outcome(path: Path, timeout: float = 30) -> str:
    """read_everything in a forked child: "ok", "refused: LINE", or what went wrong
    (another exception, a signal, a hang)."""
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(reading)
            try:
                read_everything(path)
                said = "ok"
            except (PackError, RefusedFile) as e:
                said = f"refused: {e}"
            except BaseException as e:  # what the test is there to catch
                said = f"another exception: {type(e).__name__}: {e}"
            os.write(writing, said.encode("utf-8", "backslashreplace")[:4000])
        finally:
            os._exit(0)
    os.close(writing)
    deadline, ready = patience.Deadline(timeout), []  # quiet seconds: a busy machine stretches them
    while not ready and not deadline.passed():
        ready, _, _ = select.select([reading], [], [], patience.SLICE_S)
    said = os.read(reading, 4000).decode() if ready else None
    os.close(reading)
    if said is None:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if said is None:
        return f"a hang (killed after {deadline})"
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return said or "the child said nothing"


def mutate(path: Path, mutation) -> None:
    what = mutation[0]
    data = bytearray(path.read_bytes())
    if what == "truncate":
        path.write_bytes(bytes(data[:int(len(data) * mutation[1])]))
    elif what == "flip":  # in what a reader reads: not in an LMDB file's tail of zeros
        end = getattr(stores, "LMDB_END", None)
        span = len(data) - (stores.LMDB_TAIL if end and data.endswith(end) else 0)
        for where, mask in mutation[1]:
            data[int(span * where)] ^= mask
        path.write_bytes(bytes(data))
    elif what == "index":
        index = json.loads(meta_of(path, "index"))
        index[mutation[1]] = mutation[2]
        set_meta(path, "index", json.dumps(index).encode())
    elif what == "names":  # (samples have none: then a list of 12 is written)
        names = json.loads(meta_of(path, "names") or b"[0,0,0,0,0,0,0,0,0,0,0,0]")
        names[mutation[1]] = mutation[2]
        set_meta(path, "names", json.dumps(names).encode())
    else:
        set_meta(path, mutation[1], mutation[2])


@pytest.mark.parametrize("fmt", [*FORMATS, "samples-lmdb", "samples-hdf5"])
@settings(max_examples=50, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(mutation=MUTATION)
def test_a_damaged_packed_file_reads_or_is_refused_in_one_line(packs, tmp_path, fmt, mutation):
    case = Path(tempfile.mkdtemp(dir=tmp_path))
    path = case / packs[fmt].name
    shutil.copy(packs[fmt], path)
    mutate(path, mutation)
    before = path.read_bytes()
    said = outcome(path)
    assert said == "ok" or (said.startswith("refused: ") and "\n" not in said), (mutation, said)
    assert listing(case) == [path.name] and path.read_bytes() == before  # nothing written
