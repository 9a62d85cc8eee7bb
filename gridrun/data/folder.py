"""A source folder of images (the ImageFolder layout), walked under one policy
for every entry that is not a plain file or folder.

ROOT/CLASS/.../IMAGE: one folder per class, classes and files in sorted order;
names that start with "." are skipped, and files without an image extension
are listed as skipped. Every other entry must be a regular file or a folder:

- a symbolic link is followed only when it resolves to a regular file inside
  the source folder (ROOT, resolved). A link to a folder, to anything outside
  ROOT, to a device, FIFO or socket, a dangling link or a loop is a problem
  (a `.png` linking to /dev/zero would feed a pack forever);
- a FIFO, a socket or a device is a problem (opening a FIFO waits for a writer
  that never comes);
- a name that is not UTF-8 is a problem (records are named in UTF-8): it is
  shown escaped (`\\xff.png`), to be renamed; so is a folder that cannot be
  listed, and an image larger than IMAGE_LIMIT.

The scan looks at each entry with lstat/stat, which never open a file, so it
cannot hang. It collects every problem and refuses the folder with all of
them, one line each (the first MAX_SHOWN, then how many more), before anything
is read or written: `gridrun pack` writes nothing, and a run on the folder
(`FolderDataset`) fails as it is built. The reads that follow open each file
through `userfiles.open_regular` (non-blocking, regular files only, at most
IMAGE_LIMIT bytes), so a file swapped for a FIFO or a device after the scan is
refused too.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from gridrun.data.index import PackError
from gridrun.userfiles import RefusedFile, kind_of, open_regular

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff",
                              ".ppm", ".pgm"})
IMAGE_LIMIT = 1 << 30  # one image file, at most (a larger one is refused, not read)
MAX_SHOWN = 20  # problems listed, at most; then how many more


@dataclass(frozen=True)
class Folder:
    root: Path
    class_names: list[str]
    names: list[str]  # the image files, relative to root, in record order
    labels: list[int]
    skipped: list[str]  # files that are not images (by their extension)
    bytes: int = 0  # the image files' sizes, all together


class SourceProblems(PackError):
    """Entries of a source folder that break the policy: str() is one line per problem."""

    def __init__(self, root: Path, problems: list[str]):
        self.root, self.problems = root, problems
        shown = problems[:MAX_SHOWN]
        more = len(problems) - len(shown)
        head = (f"{shown_path(root)}: {len(problems)} "
                f"{'entry' if len(problems) == 1 else 'entries'} that gridrun does not read "
                "(it reads regular files and folders, and links to regular files inside the "
                "folder); nothing was read or written:")
        lines = [head, *shown] + ([f"... and {more} more"] if more else [])
        super().__init__("\n".join(lines))


def shown_path(path: str | os.PathLike) -> str:
    """A path as it can be printed: bytes that are not UTF-8 escaped (`\\xff`)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_image(path: Path) -> bytes:
    """The bytes of one image file of a source: a regular file, at most IMAGE_LIMIT."""
    try:
        with open_regular(path, limit=IMAGE_LIMIT, what="image") as f:
            # read(n) allocates n bytes first: ask for the size the file has (and a byte
            # more, to see it grew), then a MiB at a time up to the limit
            want, parts, total = os.fstat(f.fileno()).st_size + 1, [], 0
            while total <= IMAGE_LIMIT and (part := f.read(min(want, IMAGE_LIMIT + 1 - total))):
                parts.append(part)
                total += len(part)
                want = 1 << 20
    except RefusedFile as e:
        raise PackError(str(e)) from None
    except OSError as e:
        raise PackError(f"{shown_path(path)}: cannot read it ({e.strerror or e})") from None
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if len(data) > IMAGE_LIMIT:
        raise PackError(f"image {shown_path(path)} grew past {IMAGE_LIMIT:,} bytes while read")
    return data


class _Walk:
    """One scan: the accepted entries, and every problem met."""

    def __init__(self, root: Path):
        self.root = root
        self.real = os.path.realpath(root)
        self.problems: list[str] = []

    def problem(self, path: str, why: str) -> None:
        self.problems.append(f"{shown_path(path)}: {why}")

    def entries(self, folder: str) -> list[os.DirEntry]:
        try:
            with os.scandir(folder) as it:
                found = [e for e in it if not e.name.startswith(".")]
        except OSError as e:
            self.problem(folder, f"cannot list it ({e.strerror or e})")
            return []
        bad = [e for e in found if not _utf8(e.name)]
        for e in bad:
            self.problem(e.path, "a name that is not UTF-8 (shown escaped): rename it")
        return sorted((e for e in found if e not in bad), key=lambda e: e.name)

    def kind(self, entry: os.DirEntry) -> tuple[str, int]:
        """("dir" | "file" | "bad", size): a link counts as a file only when it resolves
        to a regular file inside the source folder."""
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as e:
            self.problem(entry.path, f"cannot read it ({e.strerror or e})")
            return "bad", 0
        if stat.S_ISDIR(st.st_mode):
            return "dir", 0
        if stat.S_ISREG(st.st_mode):
            return "file", st.st_size
        if not stat.S_ISLNK(st.st_mode):
            self.problem(entry.path, f"{kind_of(st.st_mode)}, not a regular file: move it out "
                         "of the folder")
            return "bad", 0
        target = os.path.realpath(entry.path)
        try:
            st = os.stat(entry.path)
        except OSError as e:
            what = "which does not exist" if isinstance(e, FileNotFoundError) else (
                f"which cannot be followed ({e.strerror or e})")
            self.problem(entry.path, f"a symbolic link to {shown_path(target)}, {what}")
            return "bad", 0
        if not stat.S_ISREG(st.st_mode):
            self.problem(entry.path, f"a symbolic link to {shown_path(target)}, "
                         f"{kind_of(st.st_mode)}: links are followed only to regular files")
            return "bad", 0
        if not (target == self.real or target.startswith(self.real.rstrip("/") + "/")):
            self.problem(entry.path, f"a symbolic link to {shown_path(target)}, outside the "
                         "source folder: copy the file in (links are followed only to regular "
                         "files inside the folder)")
            return "bad", 0
        return "file", st.st_size


def scan_folder(root: str | Path) -> Folder:
    """The images under `root` in the ImageFolder layout, in a fixed order, or
    SourceProblems naming every entry the policy refuses (see the module's docstring)."""
    root = Path(root)
    try:
        st = os.stat(root)
    except FileNotFoundError:
        raise PackError(f"{shown_path(root)}: no such folder") from None
    except OSError as e:
        raise PackError(f"{shown_path(root)}: cannot read it ({e.strerror or e})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise PackError(f"{shown_path(root)} is not a folder of images (ROOT/CLASS/IMAGE)")
    if not _utf8(str(root)):
        raise SourceProblems(root, [f"{shown_path(root)}: a name that is not UTF-8 (shown "
                                    "escaped): rename it"])
    walk = _Walk(root)
    classes = []
    for entry in walk.entries(str(root)):
        if walk.kind(entry)[0] == "dir":  # files beside the class folders are not read
            classes.append(entry.name)
    if not classes and not walk.problems:
        raise PackError(f"{root}: no class folders: expected {root}/CLASS/IMAGE, one folder per "
                        "class (the ImageFolder layout)")
    names: list[str] = []
    labels: list[int] = []
    skipped: list[str] = []
    total = 0
    empty: list[str] = []
    for label, name in enumerate(classes):
        found = 0
        stack = [os.path.join(root, name)]
        while stack:  # depth first, files before subfolders: the order os.walk gives
            folder = stack.pop()
            subfolders = []
            for entry in walk.entries(folder):
                kind, size = walk.kind(entry)
                if kind == "dir":
                    subfolders.append(entry.path)
                elif kind == "file":
                    rel = Path(entry.path).relative_to(root).as_posix()
                    if os.path.splitext(entry.name)[1].lower() not in IMAGE_EXTENSIONS:
                        skipped.append(rel)
                    elif size > IMAGE_LIMIT:
                        walk.problem(entry.path, f"{size:,} bytes, more than the {IMAGE_LIMIT:,} "
                                     "gridrun reads for one image")
                    else:
                        names.append(rel)
                        labels.append(label)
                        total += size
                        found += 1
            stack.extend(reversed(subfolders))
        if not found:
            empty.append(name)
    if walk.problems:
        raise SourceProblems(root, walk.problems)
    if empty:
        raise PackError(f"{root / empty[0]}: a class folder without image files "
                        f"({' '.join(sorted(IMAGE_EXTENSIONS))})")
    return Folder(root, classes, names, labels, skipped, total)
