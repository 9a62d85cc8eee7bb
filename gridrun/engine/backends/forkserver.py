"""A warm process that has imported torch and the worker, and forks runs.

A fresh interpreter spends seconds importing torch; a fork of this one starts
the next run in milliseconds. CUDA is never initialised here (a forked CUDA
context is unusable), so each child can still choose its GPU through
CUDA_VISIBLE_DEVICES.

Protocol, one JSON object a line. The engine writes
`{"run_dir", "fresh", "cuda"}` to its stdin; the server hands it to a
child forked ahead of time and answers `{"pid", "start_time"}` and, when a child ends, `{"exit": pid, "code": c}`
(a negative code is the signal that killed it). At EOF on stdin (the engine
went away) it exits; its running children keep going on their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from gridrun.engine.backends import child


def _preload() -> None:
    import psutil  # noqa: F401 - used by every child for its start time
    import torch  # noqa: F401

    # torch.use_deterministic_algorithms imports torch._inductor (seconds): do it once here.
    # None of these initialise CUDA.
    for name in ("torch._dynamo", "torch._inductor", "gridrun.train.worker",
                 "gridrun.train.loop.trainer", "gridrun.tasks.spirals"):
        with contextlib.suppress(Exception):
            __import__(name)


def serve() -> None:
    # the protocol gets private fds; stray prints (from imports) go to stderr
    proto_in, proto_out = os.dup(0), os.dup(1)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    _preload()

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the engine decides; EOF ends us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = os.fdopen(proto_out, "w", buffering=1)
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    private = (proto_in, proto_out, wake_r, wake_w)
    # forking a process that has imported torch takes tens of milliseconds (page
    # tables), so a spare child is forked ahead of time and handed the next run
    spare = _fork_spare(private)
    buf = b""
    while True:
        readable, _, _ = select.select([proto_in, wake_r], [], [])
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError, InterruptedError):
                os.read(wake_r, 512)
        _reap(out, spare[0])
        if proto_in in readable:
            data = os.read(proto_in, 65536)
            if not data:
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                pid, start_time, assign = spare
                try:
                    os.write(assign, line + b"\n")
                except OSError:  # the spare died (killed from outside): fork another
                    os.close(assign)
                    pid, start_time, assign = _fork_spare(private)
                    os.write(assign, line + b"\n")
                os.close(assign)
                out.write(json.dumps({"pid": pid, "start_time": start_time}) + "\n")
                spare = _fork_spare(private)


def _fork_spare(private: tuple[int, ...]) -> tuple[int, float | None, int]:
    """A child that waits for its run: (pid, start time, the fd to send it the request on)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(w)
            data = b""
            while not data.endswith(b"\n"):
                chunk = os.read(r, 65536)
                if not chunk:
                    os._exit(0)  # the server went away before giving us a run
                data += chunk
            os.close(r)
            req = json.loads(data)
            env = req["env"]
            code = child.run(req["run_dir"], fresh=req["fresh"],
                             cuda_visible_devices=env.pop("CUDA_VISIBLE_DEVICES", ""),
                             close_fds=private, env=env)
        finally:
            os._exit(code)
    os.close(r)
    return pid, child.process_start_time(pid), w


def _reap(out, spare: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid != spare:
            out.write(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")


class ForkServer:
    """The engine's side: starts the server and talks to it."""

    def __init__(self, log: Path | None = None, ready_timeout: float = 120.0):
        err = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gridrun.engine.backends.forkserver"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        if log:
            err.close()
        self.fd = self.proc.stdout.fileno()
        self._buf = b""
        self.exits: dict[int, int] = {}
        hello = self._read_message(ready_timeout)
        if hello is None or "ready" not in hello:
            self.close()
            raise RuntimeError("the fork server did not start")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def launch(self, run_dir: Path, *, fresh: bool, env: dict[str, str]) -> tuple[int, float | None]:
        """Fork a run on `run_dir`; `env`: its CUDA_VISIBLE_DEVICES and memory budget (Slot.env)."""
        req = {"run_dir": str(run_dir), "fresh": fresh, "env": dict(env)}
        self.proc.stdin.write(json.dumps(req).encode() + b"\n")
        self.proc.stdin.flush()
        while True:
            msg = self._read_message(30.0)
            if msg is None:
                raise RuntimeError("the fork server did not answer")
            if "pid" in msg:
                return msg["pid"], msg["start_time"]

    def drain(self, timeout: float) -> None:
        """Read whatever arrived (waiting up to `timeout` for the first) into `exits`."""
        self._read_message(timeout)
        while self._read_message(0) is not None:
            pass

    def _read_message(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = max(0.0, deadline - time.monotonic())
            if not select.select([self.fd], [], [], left)[0]:
                return None
            data = os.read(self.fd, 65536)
            if not data:
                return None
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        msg = json.loads(line)
        if "exit" in msg:
            self.exits[msg["exit"]] = msg["code"]
        return msg

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):
        serve()  # a broken pipe: the engine went away before us
