"""`gridrun doctor`'s look at the machine's GPU ledger (engine/ledger.py), creating,
removing and locking nothing: its folder (there, a real folder, sticky and open to every
user, whose), the free space of its file system, its entries, and this root's engine's
entry (with what that engine says of the ledger). Pure of doctor's verdicts: doctor turns
a Survey into its Check."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from gridrun.engine.entries import ENTRY_NAME, MAX_ENTRY, PER_OWNER, user_name
from gridrun.engine.ledger import ADMIN, FIX, default_folder, filesystem


@dataclass
class Survey:
    """The ledger as `gridrun doctor` sees it: what stops engines from placing GPU runs
    (`problems`), what weakens it (`warnings`), and what is fine (`facts`)."""

    folder: Path
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)


def survey(folder: str | os.PathLike | None = None, engine_pid: int | None = None,
           said: str | None = None) -> Survey:
    """The folder (there, a real folder, sticky and open to every user, whose), its file
    system's free space, its entries, and the entry of the engine `engine_pid` (with the
    line that engine says of the ledger, `said`). Creates, removes and locks nothing."""
    out = Survey(Path(folder) if folder else default_folder())
    try:
        st = os.lstat(out.folder)
    except FileNotFoundError:
        out.facts.append(f"not made yet: the first engine with GPUs makes it; {ADMIN.format(folder=out.folder)}")
        return out
    except OSError as e:
        out.problems.append(f"cannot be looked at ({e.strerror})")
        return out
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        out.problems.append(f"is {kind}: no engine starts a run on a GPU while it is; {FIX}")
        return out
    mode = stat.S_IMODE(st.st_mode)
    if not mode & stat.S_ISVTX:
        out.problems.append(f"lacks the sticky bit (mode {mode:o}): anyone could replace another's "
                            f"entry, so no engine starts a run on a GPU; {FIX}")
    elif mode & 0o777 != 0o777:
        out.warnings.append(f"its mode is {mode:o}, not 1777: other users' engines cannot write "
                            f"their entry there and start no run on a GPU (chmod 1777 {out.folder})")
    if not os.access(out.folder, os.W_OK | os.X_OK):
        out.problems.append("this user cannot write in it: this user's engines start no run on a GPU")
    if st.st_uid == 0:
        out.facts.append("mode 1777, owned by root" if mode == 0o1777 else "owned by root")
    else:
        out.warnings.append(f"it belongs to {user_name(st.st_uid)} (uid {st.st_uid}), who may remove "
                            f"or change any entry in it; {ADMIN.format(folder=out.folder)}")
    vfs = os.statvfs(out.folder)
    space = filesystem(None, out.folder)
    if vfs.f_bavail * vfs.f_frsize < 2 * MAX_ENTRY or (vfs.f_files and not vfs.f_favail):
        out.problems.append(f"{space}: no engine can write its entry, so none starts a run on a "
                            "GPU; free space there")
    else:
        out.facts.append(space)
    _survey_entries(out, engine_pid)
    if said:  # the engine's own word on it (engine status's line)
        (out.problems if "no run starts on a GPU" in said else out.warnings).append(said)
    return out


def _survey_entries(out: Survey, engine_pid: int | None) -> None:
    try:
        names = [m for n in os.listdir(out.folder) if (m := ENTRY_NAME.fullmatch(n))]
    except OSError as e:
        out.problems.append(f"cannot be read ({e.strerror}): what engines commit is unknown")
        return
    owners: dict[int, int] = {}
    for m in names:
        owners[int(m["uid"])] = owners.get(int(m["uid"]), 0) + 1
    out.facts.append(f"{len(names)} entr{'y' if len(names) == 1 else 'ies'} of "
                     f"{len(owners)} user{'s' * (len(owners) != 1)}")
    out.warnings += [f"{n} entries of {user_name(uid)}: engines read only the first {PER_OWNER}"
                     for uid, n in sorted(owners.items()) if n > PER_OWNER]
    if engine_pid is not None:
        if any(int(m["pid"]) == engine_pid for m in names):
            out.facts.append(f"this root's engine (pid {engine_pid}) has its entry")
        else:
            out.problems.append(f"this root's engine (pid {engine_pid}) has no entry in it: other "
                                "engines cannot see what it commits")
