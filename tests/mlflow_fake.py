"""A hostile tracking server for the MLflow mirror's tests (no tests here): a tiny
http.server on 127.0.0.1, in a thread, that answers every request the one way it was
told to (trickle, fail, send too much), counts what it sent, and ends by itself
(`close`, or its own bound: a trickle stops after TRICKLE_END_S, a flood after its
bytes), so a test that goes wrong never leaves it running."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TRICKLE_END_S = 600.0  # a trickle's own end: far past any deadline the mirror has


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request a connection: an answer ends with it

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.fake.requests.append(f"{self.command} {self.path}")
        with contextlib.suppress(OSError):  # the mirror hung up: what it was told to do
            getattr(self.server.fake, self.server.fake.mode)(self)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:  # quiet: the test reads what the mirror says
        pass


class FakeServer:
    """Answers every request as `mode` says: "trickle_headers" (the status line one byte
    per `every` s), "trickle_body" (headers at once, then the body one byte per `every` s),
    "error" (`status` with `body` at once), "flood" (a 200 whose Content-Length says
    `declared`, or nothing when None, then zeros until `flood_bytes` or the mirror hangs up)."""

    def __init__(self, mode: str, *, every: float = 0.5, status: int = 500,
                 body: bytes = b"", content_type: str = "text/plain",
                 declared: int | None = None, flood_bytes: int = 0) -> None:
        self.mode, self.every, self.status, self.body = mode, every, status, body
        self.content_type, self.declared, self.flood_bytes = content_type, declared, flood_bytes
        self.requests: list[str] = []
        self.sent = 0  # body bytes written into the socket
        self.finished = threading.Event()  # set when a flood was sent whole
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.fake = self
        self.uri = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- the modes -----------------------------------------------------------------------

    def _trickle(self, handler: BaseHTTPRequestHandler, data: bytes) -> None:
        end = time.monotonic() + TRICKLE_END_S
        for i in range(len(data)):
            if self._stop.is_set() or time.monotonic() > end:
                return
            handler.wfile.write(data[i:i + 1])
            handler.wfile.flush()
            self._stop.wait(self.every)

    def trickle_headers(self, handler: BaseHTTPRequestHandler) -> None:
        self._trickle(handler, b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n"
                               + b"X-Slow: " + b"z" * 100_000 + b"\r\n\r\n{}")

    def trickle_body(self, handler: BaseHTTPRequestHandler) -> None:
        body = b"{" + b" " * 100_000 + b"}"
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        self._trickle(handler, body)

    def error(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(self.status)
        handler.send_header("Content-Type", self.content_type)
        handler.send_header("Content-Length", str(len(self.body)))
        handler.end_headers()
        handler.wfile.write(self.body)

    def flood(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        if self.declared is not None:
            handler.send_header("Content-Length", str(self.declared))
        handler.end_headers()
        block = b"0" * (1 << 16)
        while self.sent < self.flood_bytes and not self._stop.is_set():
            handler.wfile.write(block)
            self.sent += len(block)
        self.finished.set()


def mlflow_error(code: str, message: str) -> bytes:
    """An error body as an MLflow server writes one."""
    return json.dumps({"error_code": code, "message": message}).encode()
