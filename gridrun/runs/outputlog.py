"""A run's output.log, capped: the keeper that writes it, and readers of its tail.

A run's stdout and stderr go into a pipe (backends/child.py); this file, run as a
script (`python -I -S outputlog.py PATH`: stdlib only, so it starts in
milliseconds), is the keeper process that copies the pipe into PATH. When the
file passes CAP bytes it is rewritten as its head (about the first HEAD bytes,
up to a line end), one marker line, and its last KEEP bytes (from a line
start), and renamed over PATH. So output.log never holds more than CAP bytes:
the first lines the run printed and at least its last KEEP bytes.

The trainer does no work per line: print() writes into a pipe as it wrote into
a file. The keeper is its own session and ignores SIGTERM, SIGINT and SIGHUP;
it ends at EOF, once every writer (the run and its DataLoader workers) has
gone, after writing what they printed: nothing is lost when a run is killed,
and a run never writes into a closed pipe. If the disk fails it keeps draining
the pipe, so the run never blocks on it.

Readers: `tail_lines` reads only the end of the file; `Follower` goes on from
there across cuts, mapping its place through the marker, which says where the
kept tail goes on in the run's whole output.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import signal
import sys
from collections.abc import Iterator

HEAD = 1 << 20  # the first lines a run printed: its set-up, the config, the first errors
CAP = 10 << 20  # output.log never grows past this
KEEP = 6 << 20  # what a cut keeps of the end; the file then grows back to CAP
LINE_MAX = 1 << 16  # a cut looks this far for a line end, then cuts mid-line
MARK = re.compile(rb"\[gridrun: output cut here: ([\d,]+) bytes left out; "
                  rb"the output goes on at byte ([\d,]+)\]\n")
TAIL_MAX = 16 << 20  # `tail_lines` reads at most this much, whatever the lines


def marker(left_out: int, goes_on_at: int) -> bytes:
    return (f"[gridrun: output cut here: {left_out:,} bytes left out; "
            f"the output goes on at byte {goes_on_at:,}]\n").encode()


def layout_of(f, head: int = HEAD) -> tuple[int, int, int, int] | None:
    """(marker start, tail start, bytes left out, stream position of the tail start)
    of an output.log that was cut, or None for one that never was."""
    f.seek(0)
    m = MARK.search(f.read(head + LINE_MAX + 256))
    if m is None:
        return None
    return (m.start(), m.end(), int(m.group(1).replace(b",", b"")),
            int(m.group(2).replace(b",", b"")))


# --------------------------------------------------------------------------- the keeper

def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _open(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)


def cut(path: str, out: int, head: int = HEAD, keep: int = KEEP) -> int:
    """Rewrite `path` (written through `out`) as head + marker + its last `keep`
    bytes, renamed over it; returns the fd to go on writing to."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.cut")
    with open(f"/proc/self/fd/{out}" if os.path.exists("/proc/self/fd") else path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        found = layout_of(f, head)
        if found is None:
            f.seek(0)
            start = f.read(head)
            end = start.rfind(b"\n") + 1 or len(start)
            head_bytes, tail_start, left_out, stream_at = start[:end], end, 0, end
        else:
            mark_start, tail_start, left_out, stream_at = found
            f.seek(0)
            head_bytes = f.read(mark_start)
        at = max(tail_start, size - keep)
        f.seek(at)
        at += f.read(LINE_MAX).find(b"\n") + 1  # from a line start (or mid-line, if none)
        if at <= tail_start:
            return out
        if not head_bytes.endswith(b"\n"):
            head_bytes += b"\n"
        new = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW,
                      0o600)
        try:
            _write_all(new, head_bytes + marker(left_out + at - tail_start,
                                                stream_at + at - tail_start))
            f.seek(at)
            while chunk := f.read(1 << 20):
                _write_all(new, chunk)
            os.replace(tmp, path)
        except BaseException:
            os.close(new)
            raise
    os.close(out)
    return new


class _Log:
    """`path` appended to, and cut when it passes `cap`; a file that cannot be written
    is skipped, so that the run never blocks on it."""

    def __init__(self, path: str, head: int, cap: int, keep: int) -> None:
        self.path, self.head, self.cap, self.keep = path, head, cap, keep
        self.out: int | None = None
        try:
            self.out = _open(path)
            self.size = os.fstat(self.out).st_size
        except OSError:
            self.size = 0
        self.next_cut = cap

    def write(self, data: bytes) -> None:
        if self.out is None:
            return
        try:
            _write_all(self.out, data)
            self.size += len(data)
            if self.size > self.next_cut:
                self.out = cut(self.path, self.out, self.head, self.keep)
                self.size = os.fstat(self.out).st_size
                # a cut that failed waits a while
                self.next_cut = max(self.cap, self.size + (self.cap - self.keep) // 2)
        except OSError:
            self.next_cut = self.size + (self.cap - self.keep) // 2


def keep_output(fd_in: int, path: str, head: int = HEAD, cap: int = CAP, keep: int = KEEP) -> None:
    """Copy `fd_in` into `path` until EOF, cutting the file when it passes `cap`."""
    log = _Log(path, head, cap, keep)
    while data := os.read(fd_in, 1 << 16):
        log.write(data)


def tee_output(pairs: list[tuple[int, int]], path: str, head: int = HEAD, cap: int = CAP,
               keep: int = KEEP) -> None:
    """Copy each input of `pairs` (input fd, echo fd) into `path` and to its echo fd,
    until EOF on all of them. An echo that fails (the terminal gone, a closed pipe) is
    dropped: output.log still gets everything."""
    import selectors

    log = _Log(path, head, cap, keep)
    echo = dict(pairs)
    with selectors.DefaultSelector() as sel:
        for fd_in in echo:
            sel.register(fd_in, selectors.EVENT_READ)
        while sel.get_map():
            for key, _ in sel.select():
                data = os.read(key.fd, 1 << 16)
                if not data:
                    sel.unregister(key.fd)
                    continue
                log.write(data)
                if echo[key.fd] is not None:
                    try:
                        _write_all(echo[key.fd], data)
                    except OSError:
                        echo[key.fd] = None


def main(argv: list[str]) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only EOF ends the keeper
    if argv[0] == "--tee":
        pairs = [tuple(map(int, pair.split(":"))) for pair in argv[1].split(",")]
        path, *sizes = argv[2:]
        tee_output(pairs, path, *map(int, sizes))  # type: ignore[arg-type]
        return
    path, *sizes = argv
    keep_output(0, path, *map(int, sizes))


TEE_WAIT = 10.0  # as the engine's child: a DataLoader worker may outlive the run, holding the pipe


@contextlib.contextmanager
def teed(path: str | os.PathLike, wait: float = TEE_WAIT) -> Iterator[None]:
    """This process's stdout and stderr (fds 1 and 2, so its subprocesses' too) into
    output.log at `path`, capped as an engine run's, and still where they went before
    (a foreground run's terminal). The keeper echoes each to its own fd, so stderr stays
    stderr; between the two the order is the order the keeper reads them in. On leaving,
    waits until the keeper has written and echoed everything (at most `wait` seconds).
    If the keeper cannot start, output goes to the terminal only."""
    import subprocess

    _flush()
    try:
        saved = [os.dup(1), os.dup(2)]  # where the output went: echoed there
    except OSError:  # a closed stdout or stderr: nothing to echo to, nothing changed
        yield
        return
    pipes = [os.pipe(), os.pipe()]
    try:
        keeper = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__, "--tee",
             ",".join(f"{r}:{s}" for (r, _), s in zip(pipes, saved, strict=True)), os.fspath(path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=[*saved, *(r for r, _ in pipes)], start_new_session=True)
    except OSError:
        keeper = None
    for r, w in pipes:
        os.close(r)
        if keeper is None:
            os.close(w)
    if keeper is not None:
        for fd, (_, w) in zip((1, 2), pipes, strict=True):
            os.dup2(w, fd)
            os.close(w)
    try:
        yield
    finally:
        _flush()
        for fd, s in zip((1, 2), saved, strict=True):
            os.dup2(s, fd)
            os.close(s)
        if keeper is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                keeper.wait(wait)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()


# --------------------------------------------------------------------------- readers

def _tail(f, lines: int) -> tuple[bytes, int]:
    """The last `lines` lines of an open file, and the offset of its end; read
    backwards in blocks, at most TAIL_MAX bytes whatever the lines' length."""
    end = f.seek(0, 2)
    if lines <= 0:
        return b"", end
    blocks: list[bytes] = []
    pos, newlines = end, 0
    while pos > 0 and end - pos < TAIL_MAX and newlines <= lines:
        step = min(1 << 16, pos)
        pos -= step
        f.seek(pos)
        blocks.append(f.read(step))
        newlines += blocks[-1].count(b"\n")
    data = b"".join(reversed(blocks))
    at = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(lines):  # the start of the last `lines` lines: after that many newlines
        at = data.rfind(b"\n", 0, at)
        if at < 0:
            break
    return data[at + 1:], end


def _open_nofollow(path: str | os.PathLike):
    """`path` opened for reading, never through a link (nofollow.py; the package is
    imported here, not at the top: the keeper runs this file without it)."""
    from gridrun.runs import nofollow

    return nofollow.open_file(path)


def tail_lines(path: str | os.PathLike, lines: int) -> str:
    """The last `lines` lines of `path` ("" if it does not exist). A link, or a run folder
    that is one, is not followed: layout.UnsafePath."""
    try:
        with _open_nofollow(path) as f:
            return _tail(f, lines)[0].decode(errors="replace")
    except FileNotFoundError:
        return ""


class Follower:
    """`gridrun logs -f`: the last `lines` lines, then whatever is appended. When the
    keeper cuts the file (a new file renamed over it) the follower finishes the old
    one, then goes on in the new one at the same place in the run's output. A link
    (the file, or its run folder) is never followed: `read` raises layout.UnsafePath."""

    def __init__(self, path: str | os.PathLike, lines: int = 200) -> None:
        self.path, self.lines = os.fspath(path), lines
        self.f = None
        self.pos = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read(self) -> str:
        """What is new since the last call (the tail, on the first)."""
        out: list[bytes] = []
        if self.f is None:
            try:
                self.f = _open_nofollow(self.path)  # kept open between calls
            except FileNotFoundError:
                return ""
            data, self.pos = _tail(self.f, self.lines)
            out.append(data)
        while True:
            self.f.seek(self.pos)
            data = self.f.read()
            self.pos += len(data)
            out.append(data)
            try:
                now = os.lstat(self.path)
            except (FileNotFoundError, NotADirectoryError):
                break
            if now.st_ino == os.fstat(self.f.fileno()).st_ino:
                if now.st_size < self.pos:
                    self.pos = 0  # truncated in place: start again
                    continue
                break
            # cut: the old file is complete; find the same place in the new one
            found = layout_of(self.f)
            stream = self.pos if found is None or self.pos < found[1] else \
                found[3] + self.pos - found[1]
            self.f.close()
            try:
                self.f = _open_nofollow(self.path)
            except FileNotFoundError:
                self.f, self.pos = None, 0
                break
            found = layout_of(self.f)
            if found is None:
                self.pos = 0  # a new file altogether
            elif stream >= found[3]:
                self.pos = found[1] + stream - found[3]
            else:
                self.pos = found[1]
                out.append(f"[gridrun logs: {found[3] - stream:,} bytes were cut before "
                           "they could be shown]\n".encode())
        return self.decoder.decode(b"".join(out))

    @property
    def opened(self) -> bool:
        """Whether the file was there at the last read (False: no such file, yet)."""
        return self.f is not None

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


OUTPUT_TAIL_LINES = 30
OUTPUT = "output.log"  # layout.OUTPUT: this module runs as a script without the package


def missing(run_id: str, status: str, run_dir: os.PathLike | str, follow: bool = False) -> str:
    """One line for `gridrun logs` on a run without an output.log: why, and what to do."""
    from gridrun.runs import states

    if follow:
        return f"{run_id} has no output.log yet ({status}): waiting for its first output (ctrl-c stops)"
    if status not in states.FINISHED:
        return (f"{run_id} has no output.log yet: it is {status} and has printed nothing; "
                f"`gridrun logs -f {run_id}` waits for its output")
    return (f"{run_id} has no output.log: it is {status} and none was kept (it never started, "
            "trained in the foreground before gridrun kept one, or the file was removed); its "
            f"summary.json and metrics are in {os.fspath(run_dir)}")


def output_tail(run_dir: os.PathLike | str, lines: int = OUTPUT_TAIL_LINES) -> str:
    """The last lines a run printed, for its error (read from the end: a big log costs
    nothing); "" when there are none or output.log is a link (never followed)."""
    try:
        return tail_lines(os.path.join(run_dir, OUTPUT), lines).rstrip("\n")
    except Exception:  # OSError, or layout.UnsafePath: a link is not followed
        return ""


if __name__ == "__main__":
    main(sys.argv[1:])

