"""MLflow's HTTP requests for `gridrun mirror mlflow`, bounded: one deadline for a whole
request and a cap on the size of an answer (issue 45).

MLflow's own timeout (MLFLOW_HTTP_REQUEST_TIMEOUT, passed to requests) bounds each read,
not a request: a server that sends one byte a second keeps a request, and the mirror, going
for ever. And it reads an answer whole into memory, whatever its size. So every request
goes through `BoundedAdapter`, a requests transport adapter (requests' public extension
point), which

- cuts a request off at its deadline: DEADLINE_S in all (MLFLOW_HTTP_REQUEST_TIMEOUT sets
  it), one second more for each MB it uploads (an export's model). A timer shuts the
  request's socket down, which ends a read or a write blocked on it at once; `TooSlow`.
- refuses an answer larger than ANSWER_CAP: unread when its Content-Length says so,
  else once that much was read; `TooLarge`.
- never retries (a create_run retried after a lost answer makes a second run; the mirror
  tries again itself, after reading what the server holds), and hands an HTTP error
  answer back as it is, so MLflow reports its status and the server's reason (urllib3's
  retries turned a 500 into "Max retries exceeded").

This is the one module that touches MLflow's private HTTP layer (STYLE.md 17): MLflow makes
each REST request through a requests Session it caches
(`mlflow.utils.request_utils._get_request_session`); `install` wraps that function so each
session it returns sends through a BoundedAdapter. When an MLflow version moves it,
`install` says so and the requests are bounded per read only, as MLflow bounds them.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import socket
import threading
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

DEADLINE_S = 30.0  # a whole request, unless MLFLOW_HTTP_REQUEST_TIMEOUT says otherwise
SECONDS_PER_MB = 1.0  # a second more per MB uploaded: an export sent at 1 MB/s still arrives
ANSWER_CAP = 64_000_000  # an MLflow answer is a page of runs (PAGE in mirror.py): MBs
TIMEOUT_VARIABLE = "MLFLOW_HTTP_REQUEST_TIMEOUT"
_CHUNK = 1 << 16


class BoundExceeded(requests.exceptions.RequestException):
    """A request cut off by a bound of this module; str() is the one line that says which."""


class TooSlow(BoundExceeded, requests.exceptions.Timeout):
    pass


class TooLarge(BoundExceeded):
    pass


def deadline_s() -> float:
    """The deadline of a request that uploads nothing: MLFLOW_HTTP_REQUEST_TIMEOUT seconds,
    else DEADLINE_S."""
    try:
        seconds = float(os.environ.get(TIMEOUT_VARIABLE) or DEADLINE_S)
    except ValueError:
        return DEADLINE_S
    return seconds if 0 < seconds < float("inf") else DEADLINE_S


def size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


# ---- the deadline: a timer that shuts the request's socket ----------------------------------

_sending = threading.local()  # the _Watch of the request this thread sends


class _Watch:
    """Cuts the request this thread sends once `seconds` have passed: shuts down the socket
    it goes over (its connection says which, `watching`)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.fired, self.sock = seconds, False, None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True

    def watching(self, sock: socket.socket) -> None:
        with self._lock:
            self.sock = sock
            if self.fired:  # it connected after the deadline
                _shut(sock)

    def _cut(self) -> None:
        with self._lock:
            self.fired = True
            if self.sock is not None:
                _shut(self.sock)

    def __enter__(self) -> _Watch:
        _sending.watch = self
        self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._timer.cancel()
        _sending.watch = None

    def too_slow(self) -> TooSlow:
        return TooSlow(f"no whole answer within {self.seconds:g} s: cut off "
                       f"({TIMEOUT_VARIABLE} sets the limit)")


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _watched(connection: HTTPConnection) -> None:
    # the socket itself, not the connection: http.client lets go of it (connection.sock =
    # None) once an answer that closes the connection has its headers, the body still unread
    watch = getattr(_sending, "watch", None)
    if watch is not None and connection.sock is not None:
        watch.watching(connection.sock)


class _Watched:
    """A connection that tells the watch of the request it sends which socket to shut."""

    def connect(self) -> None:
        super().connect()
        _watched(self)  # its socket now exists (shut at once if the deadline passed)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _watched(self)  # a connection kept from an earlier request: connect is not called
        super().request(*args, **kwargs)
        _watched(self)


class _WatchedHTTPConnection(_Watched, HTTPConnection):
    pass


class _WatchedHTTPSConnection(_Watched, HTTPSConnection):
    pass


class _WatchedPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_WATCHED_POOLS = {"http": _WatchedPool, "https": _WatchedHTTPSPool}


def _watch_pools(manager: Any) -> Any:
    """A pool manager's connections made watched ones (not a SOCKS manager's: its own)."""
    if manager.pool_classes_by_scheme.get("http") is HTTPConnectionPool:
        manager.pool_classes_by_scheme = dict(_WATCHED_POOLS)
    return manager


# ---- the adapter ---------------------------------------------------------------------------


class BoundedAdapter(HTTPAdapter):
    """requests' HTTPAdapter with no retry (its default), a deadline per request and a
    cap on what an answer may hold (a streamed answer, read later by its caller, is
    bounded by the deadline up to its headers only: the mirror streams none)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        _watch_pools(self.poolmanager)

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        return _watch_pools(super().proxy_manager_for(proxy, **kwargs))

    def send(self, request: requests.PreparedRequest, stream: bool = False,
             timeout: Any = None, verify: Any = True, cert: Any = None,
             proxies: Any = None) -> requests.Response:
        seconds = deadline_s() + _upload_bytes(request) / 1e6 * SECONDS_PER_MB
        with _Watch(seconds) as watch:
            try:
                response = super().send(request, stream=True, timeout=seconds, verify=verify,
                                        cert=cert, proxies=proxies)
                if not stream:
                    _read_bounded(response)
                return response
            except BoundExceeded:
                raise
            except Exception:
                if watch.fired:  # what the shut socket raised: the deadline is the reason
                    raise watch.too_slow() from None
                raise


def _upload_bytes(request: requests.PreparedRequest) -> int:
    declared = request.headers.get("Content-Length") or ""
    return int(declared) if declared.isdigit() else 0


def _read_bounded(response: requests.Response) -> None:
    """The answer's body read into memory, at most ANSWER_CAP bytes of it (TooLarge past
    that, the connection closed unread); the response then reads it as requests would."""
    raw = response.raw
    declared = response.headers.get("Content-Length") or ""
    if declared.isdigit() and int(declared) > ANSWER_CAP:
        response.close()
        raise TooLarge(f"the server's answer is {size(int(declared))}, more than the "
                       f"{size(ANSWER_CAP)} the mirror reads: refused unread")
    parts, held = [], 0
    try:
        while chunk := raw.read(_CHUNK, decode_content=True):
            parts.append(chunk)
            held += len(chunk)
            if held > ANSWER_CAP:
                response.close()
                raise TooLarge(f"the server's answer is more than the {size(ANSWER_CAP)} "
                               "the mirror reads: refused, the rest unread")
    except urllib3.exceptions.HTTPError as e:  # as requests' own reading turns them
        response.close()
        raise requests.exceptions.ConnectionError(e, request=response.request) from e
    raw.release_conn()
    response.raw = io.BytesIO(b"".join(parts))


# ---- MLflow's sessions ---------------------------------------------------------------------


def install() -> str | None:
    """Every session MLflow's REST client sends through, from now on, bounded; None, or
    why not (this MLflow keeps its sessions elsewhere: requests are bounded per read only)."""
    try:
        from mlflow.utils import request_utils

        make_session = request_utils._get_request_session
    except (ImportError, AttributeError) as e:
        return (f"this mlflow's HTTP layer is not the one gridrun knows ({e}): a request is "
                f"bounded per read only, not as a whole")
    if getattr(make_session, "gridrun_bounded", False):
        return None

    @functools.wraps(make_session)
    def bounded_session(*args: Any, **kwargs: Any) -> requests.Session:
        session = make_session(*args, **kwargs)
        if not isinstance(session.get_adapter("http://"), BoundedAdapter):
            adapter = BoundedAdapter()
            session.mount("http://", adapter)
            session.mount("https://", adapter)
        return session

    bounded_session.gridrun_bounded = True
    request_utils._get_request_session = bounded_session
    return None
