"""Where things live under a runs root (see DESIGN.md "Runs on disk"), and the
checks that keep the root private.

A root belongs to one user: gridrun refuses a root (or anything in it) that
another user owns or that group or others can write, and never follows a
symlink inside it. Run folders are made and opened one component at a time
with O_NOFOLLOW from a descriptor of the root, so a symlink swapped in
between a check and a use is refused as well.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import stat
import sys
from pathlib import Path

DEFAULT_ROOT = "runs"
DB_NAME = "gridrun.db"
CONFIG = "config.toml"
METRICS = "metrics.jsonl"
OUTPUT = "output.log"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
VERIFY = "verify.json"  # the last `gridrun verify` verdict (gridrun/engine/verdict.py)
# gridrun's own files at the top of a root (the engine's are named in daemon.py)
ROOT_FILES = (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm", "engine.log", "engine.pid",
              "engine.lock")

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(Exception):
    """A path under the root that gridrun will not use; str() is one line with the fix."""


class UnsafeRoot(UnsafePath):
    """The root itself is not private to this user. `problems`: one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class NoSuchRoot(Exception):
    """A root that does not exist where only commands that queue may create one, or
    one that cannot be created there. str() is one line."""


# Folders of the system itself: never a runs root (nor anything under the second set:
# proc, sys and device folders are not storage, /etc is the system's configuration).
SYSTEM_FOLDERS = frozenset({"/", "/etc", "/proc", "/sys", "/dev", "/usr", "/bin", "/sbin",
                            "/boot", "/lib", "/lib32", "/lib64", "/libx32", "/var", "/run",
                            "/home", "/opt", "/srv", "/mnt", "/media", "/tmp", "/root"})
SYSTEM_TREES = ("/proc", "/sys", "/dev", "/etc", "/boot")


def private_umask() -> None:
    """Files and folders this process creates are the user's alone (0600 / 0700),
    whatever umask the shell had: every gridrun process calls it first."""
    os.umask(0o077)


def default_root() -> Path:
    return Path(os.environ.get("GRIDRUN_ROOT", DEFAULT_ROOT))


def run_dir(root: str | os.PathLike, experiment: str, run_id: str) -> Path:
    # experiment names are validated as safe folder names by spec.py
    return Path(root) / experiment / run_id


def make_private_dir(path: str | os.PathLike) -> Path:
    """Create `path` (and parents) with mode 0700, whatever the umask."""
    path = Path(path)
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):  # parents too: mkdir(parents=True) would give them the umask
        p.mkdir(mode=0o700, exist_ok=True)
        os.chmod(p, 0o700)
    return path


# ---- what is wrong with a path ----------------------------------------------------------


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def problem(path: str | os.PathLike, st: os.stat_result, *, folder: bool,
            follow: bool = False) -> str | None:
    """What makes `path` (whose lstat is `st`) unfit for gridrun, with the fix; None if fine."""
    if stat.S_ISLNK(st.st_mode) and not follow:
        return (f"{path} is a symlink: gridrun never follows a symlink inside its root; "
                f"remove it (rm {path})")
    if folder and not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder (something else is in the way): move it away"
    if not folder and not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file: move it away"
    if st.st_uid != os.geteuid():
        return (f"{path} belongs to {_owner(st.st_uid)}, not to you ({_owner(os.geteuid())}): "
                "use a runs root of your own (--root or GRIDRUN_ROOT) or move it away")
    # A file's own mode bits let no one in when its folder is private (others
    # cannot reach it), so only folders are refused for them: a umask of 002
    # must not make gridrun refuse the files it wrote itself.
    if folder and st.st_mode & 0o022:
        return (f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
                f"another user could plant files or symlinks; fix it with "
                f"`chmod 700 {path}`")
    return None


def _entries(path: Path) -> list[tuple[Path, os.stat_result]]:
    out = []
    with contextlib.suppress(OSError), os.scandir(path) as it:
        for entry in it:
            with contextlib.suppress(OSError):
                out.append((path / entry.name, entry.stat(follow_symlinks=False)))
    return out


def root_problems(root: str | os.PathLike, *, deep: bool = False,
                  experiments: bool = True) -> list[str]:
    """Everything that makes `root` unsafe to use, one line each with its fix.

    The root itself may be a symlink (`runs -> /scratch/me/runs`); nothing in it
    may be. Checks the root, gridrun's files in it and (with `experiments`) each
    experiment folder; `deep` also checks every run folder and what it holds.
    A root that does not exist yet has no problems: it is created 0700.
    """
    root = Path(root)
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return []
    except OSError as e:
        return [f"{root} cannot be read: {e.strerror}"]
    found = problem(root, st, folder=True, follow=True)
    if found:
        return [found]  # nothing inside a root others can write can be trusted
    problems = []
    for path, st in _entries(root):
        if path.name in ROOT_FILES or path.name.startswith(DB_NAME):
            found = problem(path, st, folder=False)
        elif stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode):
            if not experiments:
                continue
            found = problem(path, st, folder=True)
            if not found and deep:
                problems += _run_folder_problems(path)
        else:
            continue  # a file of the user's own (runs/README.md)
        if found:
            problems.append(found)
    return problems


def _run_folder_problems(experiment_dir: Path) -> list[str]:
    problems = []
    for run, st in _entries(experiment_dir):
        found = problem(run, st, folder=True)
        if found:
            problems.append(found)
            continue
        inside = _entries(run)
        inside += [e for path, st in inside if path.name == CHECKPOINTS
                   and stat.S_ISDIR(st.st_mode) for e in _entries(path)]
        for path, st in inside:
            found = problem(path, st, folder=stat.S_ISDIR(st.st_mode))
            if found:
                problems.append(found)
    return problems


def system_folder(root: str | os.PathLike) -> str | None:
    """Why `root` can never be a runs root (a system folder, the home folder itself), or None."""
    real = os.path.realpath(root)
    shown = str(root) if os.fspath(root) == real else f"{root} (that is {real})"
    if real in SYSTEM_FOLDERS or real.startswith(tuple(t + "/" for t in SYSTEM_TREES)):
        return (f"{shown} is a system folder: gridrun never uses it as a runs root; give a "
                "folder of your own (--root DIR or GRIDRUN_ROOT)")
    home = os.path.realpath(os.path.expanduser("~"))
    if real == home:
        return (f"{shown} is your home folder itself: gridrun would mix its files with yours; "
                "give a folder for runs (--root ~/runs, say)")
    return None


def cannot_create(root: str | os.PathLike) -> str | None:
    """Why a missing root could not be created (its parent is missing), or None."""
    parent = Path(root).absolute().parent
    if parent.is_dir():
        return None
    return (f"cannot create the root {root}: its parent folder {parent} does not exist "
            "(a typo in --root?); create it first")


def refusal(root: str | os.PathLike, *, experiments: bool = True) -> list[str]:
    """Why `root` would be refused, one line each with its fix, creating nothing: a
    system folder or the home folder, something that is not a folder, a root (or, with
    `experiments`, a folder in it) that is not private to this user, or a missing root
    whose parent folder is missing. [] for a root a command may use (or create)."""
    special = system_folder(root)
    if special:
        return [special]
    if not os.path.lexists(root):
        why = cannot_create(root)
        return [why] if why else []
    if not os.path.isdir(root):
        return [f"{root} is not a folder: give a folder as the runs root"]
    return root_problems(root, experiments=experiments)


def _make_root(root: Path, create: bool) -> None:
    if not create:
        raise NoSuchRoot(f"no such root: {root}")
    why = cannot_create(root)
    if why:
        raise NoSuchRoot(why)
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        return
    except OSError as e:
        raise NoSuchRoot(f"cannot create the root {root}: {e.strerror}") from e
    os.chmod(root, 0o700)


def check_root(root: str | os.PathLike, *, create: bool = True, experiments: bool = False,
               claim: bool = False) -> Path:
    """Open a root: create it (0700, only under a folder that exists) if it is missing
    and `create` (else NoSuchRoot); raise UnsafeRoot, before anything is created in it,
    for what `refusal` names. `experiments`: the folders in the root are checked too,
    as every command does (commands/common.open_root, the engine's start); the store's
    own check leaves them to each run (a running engine fails only the runs of a bad
    experiment folder). `claim`: gridrun is about to write its store there (see
    `claim_root`). A gridrun root that group or others can read is used, with one
    warning on stderr per process (see `readable_warning`)."""
    root = Path(root)
    if not os.path.lexists(root) and not system_folder(root):
        _make_root(root, create)
    problems = refusal(root, experiments=experiments)
    if problems:
        raise UnsafeRoot(problems)
    if claim:
        claim_root(root)
    warning = readable_warning(root, claim=claim)
    key = os.path.realpath(root)  # `runs`, `./runs` and the engine's absolute path alike
    if warning and key not in _WARNED:
        _WARNED.add(key)
        print(warning, file=sys.stderr, flush=True)
    return root


_WARNED: set[str] = set()  # roots (real paths) this process has warned about

# What a folder may hold and still be a fresh runs folder gridrun may make private:
# a checkout's runs/README.md, git's placeholders, and gridrun's own files.
_FRESH = (".gitignore", ".gitkeep", ".keep", *ROOT_FILES)


def _fresh(root: Path) -> bool:
    """Whether `root` holds nothing but README files, git's placeholders and
    gridrun's own files (each a plain file): a runs folder nothing else uses."""
    return all(stat.S_ISREG(st.st_mode)
               and (path.name in _FRESH or path.name.lower().startswith("readme"))
               for path, st in _entries(root))


def claim_root(root: str | os.PathLike) -> None:
    """gridrun is about to make `root` (checked: this user's) its root. A folder with
    no store yet that group or others can read (a fresh clone's `runs/` is 0755, git
    keeps no folder mode; a `mkdir runs` under umask 022) and that holds nothing but
    README files, git's placeholders and gridrun's own files is made private (0700)
    silently, as gridrun makes a root it creates. Any other folder keeps its mode:
    it is not gridrun's to change (`readable_warning` says so once)."""
    root = Path(root)
    if os.path.lexists(root / DB_NAME):
        return
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(os.stat(root).st_mode)
        if mode & 0o077 and _fresh(root):
            os.chmod(root, mode & 0o700)


def readable_warning(root: str | os.PathLike, *, claim: bool = False) -> str | None:
    """One line with the chmod to run when group or others can read a gridrun root:
    one that holds gridrun's store, or (`claim`) that gridrun is making its root. A
    folder that is only read (`gridrun ls --root /usr/share`) is no gridrun root:
    no warning, no chmod advised."""
    try:
        mode = stat.S_IMODE(os.stat(root).st_mode)
    except OSError:
        return None
    if not mode & 0o077 or not (claim or os.path.lexists(Path(root) / DB_NAME)):
        return None
    return (f"warning: the runs root {root} is readable by group or others (mode {mode:04o}); "
            f"make it private with `chmod 700 {shlex.quote(str(root))}`")


# ---- making and reading run folders without following symlinks ---------------------------


def _open_dir(parent_fd: int, name: str, shown: Path, *, create: bool) -> int:
    """A descriptor of the folder `name` in `parent_fd`, made 0700 if missing and
    `create`; refuses a symlink, another user's folder or one others can write."""
    created = False
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
            created = True
        except FileExistsError:
            pass
    found = problem(shown, os.stat(name, dir_fd=parent_fd, follow_symlinks=False), folder=True)
    if found:
        raise UnsafePath(found)
    try:
        fd = os.open(name, _DIR, dir_fd=parent_fd)
    except OSError as e:  # swapped for a symlink or a file since the check
        raise UnsafePath(f"{shown} changed while gridrun opened it ({e.strerror}): "
                         "check who else writes in the runs root") from e
    if created:
        os.fchmod(fd, 0o700)  # whatever the umask
    found = problem(shown, os.fstat(fd), folder=True)
    if found:
        os.close(fd)
        raise UnsafePath(found)
    return fd


def _open_run_dir(path: Path, *, create: bool) -> int:
    root_fd = os.open(path.parent.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        exp_fd = _open_dir(root_fd, path.parent.name, path.parent, create=create)
    finally:
        os.close(root_fd)
    try:
        return _open_dir(exp_fd, path.name, path, create=create)
    finally:
        os.close(exp_fd)


def make_run_dir(root: str | os.PathLike, experiment: str, run_id: str) -> Path:
    """ROOT/EXPERIMENT/RUN_ID and its checkpoints folder, made 0700 if missing,
    never through a symlink. Raises UnsafePath (with the fix) for a symlink,
    another user's folder, one others can write or something else in the way,
    inside the run folder too; OSError for what the system refuses."""
    path = run_dir(root, experiment, run_id)
    fd = _open_run_dir(path, create=True)
    try:
        os.close(_open_dir(fd, CHECKPOINTS, path / CHECKPOINTS, create=True))
        for name in os.listdir(fd):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:  # renamed meanwhile (an orphaned run's .tmp), say
                continue
            found = problem(path / name, st, folder=stat.S_ISDIR(st.st_mode))
            if found:
                raise UnsafePath(found)
    finally:
        os.close(fd)
    return path


def read_private(path: str | os.PathLike) -> bytes:
    """The bytes of ROOT/EXPERIMENT/RUN_ID/NAME, read only if the experiment
    folder, the run folder and the file are this user's and not symlinks, and
    the folders not writable by group or others, all checked on the descriptors
    that are read (a path swapped after the check is refused, not read)."""
    path = Path(path)
    dir_fd = _open_run_dir(path.parent, create=False)
    try:
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as e:
            if e.errno == errno.ELOOP:  # a symlink
                raise UnsafePath(problem(path, os.stat(path.name, dir_fd=dir_fd,
                                                       follow_symlinks=False), folder=False)) from e
            raise
    finally:
        os.close(dir_fd)
    try:
        found = problem(path, os.fstat(fd), folder=False)
        if found:
            raise UnsafePath(found)
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)
