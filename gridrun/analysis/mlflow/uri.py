"""The tracking URI of `gridrun mirror mlflow`: what of it may be shown, and where a local
store writes (no mlflow here).

A URI may carry credentials (`https://user:password@host`, `?token=...`), and every line
the mirror prints, its cursor and MLflow's own error messages (which quote the URL they
failed on) would otherwise repeat them. `redacted` is the URI as it is shown and kept:
user:password@ as `***@` and every query value as `***`; a `Scrubber` takes the URI's
secrets out of any text, and any `user:password@` or secret-named query value besides.

A local tracking store (a path, `file:`, `sqlite:`) is written where the URI says, on the
user's request: `check_local` applies the rule of userfiles.py to it (never into a system
folder, never through a link, a store file only a regular file and its folder there; a
store folder only a folder) and the root's (never inside the runs root). A sqlite store
keeps its runs' files in `./mlruns` (MLflow's default): that folder is checked too.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from gridrun import userfiles

HIDDEN = "***"
SQLITE_ARTIFACTS = "mlruns"  # where MLflow puts a sqlite store's files: ./mlruns
# in any text: the credentials of a URL, and the values of query keys that name a secret
_USERINFO = re.compile(r"(\b[a-zA-Z][\w+.-]*://)[^/\s@'\"]+@")
_SECRET_QUERY = re.compile(r"(?i)([?&;][\w.-]*(?:token|key|secret|passw|pwd|auth|sig|credential"
                           r"|session)[\w.-]*=)(?!\*\*\*)[^&;#\s'\"]+")  # not one hidden already
_SHORTEST_SECRET = 4  # a query value shorter than this is not looked for in free text


def redacted(uri: str) -> str:
    """`uri` as it may be shown and kept: `http://***@host:5000/?token=***`."""
    try:
        parts = urlsplit(uri)
    except ValueError:  # not a URL Python can split (a bad IPv6 host): the patterns still apply
        return _patterns(uri)
    shown = uri  # edited in place: urlunsplit would respell it (sqlite:////x as sqlite://x)
    if "@" in parts.netloc:
        shown = shown.replace(parts.netloc, f"{HIDDEN}@{parts.netloc.rsplit('@', 1)[1]}", 1)
    if parts.query:
        query = "&".join(f"{key}={HIDDEN}" for key, _ in parse_qsl(parts.query,
                                                                    keep_blank_values=True))
        shown = shown.replace(f"?{parts.query}", f"?{query or HIDDEN}", 1)
    return shown


def _patterns(text: str) -> str:
    return _SECRET_QUERY.sub(rf"\1{HIDDEN}", _USERINFO.sub(rf"\1{HIDDEN}@", text))


class Scrubber:
    """Takes `uri`'s secrets out of a text: the URI itself as `redacted` shows it, its
    user:password and query values wherever they appear (spelled as in the URI or decoded),
    and any URL credentials or secret-named query value."""

    def __init__(self, uri: str) -> None:
        self.uri, self.shown = uri, redacted(uri)
        secrets: set[str] = set()
        try:
            parts = urlsplit(uri)
        except ValueError:
            parts = None
        if parts is not None and "@" in parts.netloc:
            userinfo = parts.netloc.rsplit("@", 1)[0]
            secrets |= {userinfo, *userinfo.split(":", 1)}
        if parts is not None:
            secrets |= {value for _, value in parse_qsl(parts.query, keep_blank_values=True)}
        secrets |= {unquote(s) for s in secrets}
        # the longest first: a password is not left half shown by a shorter secret inside it
        self.secrets = sorted((s for s in secrets if len(s) >= _SHORTEST_SECRET), key=len,
                              reverse=True)

    def __call__(self, text: str) -> str:
        text = text.replace(self.uri, self.shown)
        for secret in self.secrets:
            text = text.replace(secret, HIDDEN)
        return _patterns(text)


# ---- a local store -------------------------------------------------------------------------


def local_store(uri: str) -> tuple[Path, bool] | None:
    """Where a local tracking store keeps its records, and whether that is a folder
    (a path or `file:`) rather than one file (`sqlite:`); None for a server."""
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if uri == "databricks":  # MLflow's name for a Databricks workspace, not a path
        return None
    if scheme in ("", "file") or not re.fullmatch(r"[a-z][\w+.-]*", scheme):
        path = urlsplit(uri).path if scheme == "file" else uri
        return Path(unquote(path) or "."), True
    if scheme == "sqlite" or scheme.startswith("sqlite+"):
        if ":///" not in uri:  # sqlite:// alone: a database in memory, no file
            return None
        path = uri.split(":///", 1)[1].split("?", 1)[0]
        return (Path(path), False) if path and path != ":memory:" else None
    return None


def check_local(uri: str, root: Path) -> None:
    """Refuses (userfiles.RefusedFile, one line) a local store that the write rule or the
    root's rule forbids; a server's URI passes."""
    found = local_store(uri)
    if found is None:
        return
    path, folder = found
    shown = redacted(uri)
    targets = [(path, folder)]
    if not folder and "_MLFLOW_SERVER_ARTIFACT_ROOT" not in os.environ:
        targets.append((Path.cwd() / SQLITE_ARTIFACTS, True))  # its runs' files
    for target, is_folder in targets:
        if target.resolve().is_relative_to(Path(root).resolve()):
            raise userfiles.RefusedFile(
                f"tracking store {shown}: {target} is inside the runs root {root}: the mirror "
                "writes nothing there but its cursor; choose a store outside it")
        try:
            if is_folder:
                _check_folder(target)
            else:
                userfiles.check_target(target, force=True)  # an existing store is the point
        except userfiles.RefusedFile as e:
            raise userfiles.RefusedFile(f"tracking store {shown}: {e}") from None


def _check_folder(folder: Path) -> None:
    """A folder MLflow may write into (and make): not a link, nothing but a folder, not in
    a system folder (userfiles.py's words)."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise userfiles.RefusedFile(f"cannot write into {folder}: {e.strerror or e}") from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise userfiles.RefusedFile(f"refusing to write {folder}: it is a symbolic link (gridrun "
                                    "never writes through one); name the folder itself")
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise userfiles.RefusedFile(f"refusing to write {folder}: it is "
                                    f"{userfiles.kind_of(st.st_mode)}, not a folder")
    tree = userfiles.system_tree(folder / "_")  # where its files would go
    if tree is not None:
        raise userfiles.RefusedFile(f"refusing to write {folder}: it is in the system folder "
                                    f"{tree}; write into a folder of your own")
