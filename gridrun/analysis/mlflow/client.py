"""MLflow's client for `gridrun mirror mlflow`: made with its requests bounded
(bounds.py: a deadline per request, a cap on an answer, no retry of its own), and
what a failed request means, in one line: a bound it passed, a full disk under a local
store, an HTTP error with the server's own reason, a server that does not answer; and
whether it refuses one run (`refused`) or the mirror as a whole."""

from __future__ import annotations

import errno
import os
import re
from http import HTTPStatus
from typing import Any

from gridrun import userfiles

# no retry inside the client (a create_run retried after a lost answer makes a second run;
# the mirror tries again itself, after finding what the server holds), and no URL printed
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
                 "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
REASON_MAX = 300
_DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # a local store that cannot be written
# MLflow's words for an answer that was not JSON: the status and the body it quotes
_NOT_JSON = re.compile(r"failed with error code (\d{3}) != \d{3}\. Response body: '(.*)'\s*$",
                       re.DOTALL)
_URLLIB3_STATUS = re.compile(r"too many (\d{3}) error responses")  # a retry that gave up


class MLflowMissing(ImportError):
    """The mlflow package is not installed; str() says how to get it."""


def client_for(uri: str, note: Any = None) -> Any:
    """MLflow's client on `uri`, its HTTP requests bounded (bounds.py); `note(line)`
    hears when this MLflow's requests cannot be."""
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise MLflowMissing("gridrun mirror mlflow needs the mlflow package: "
                            "pip install 'gridrun[mlflow]'") from None
    from gridrun.analysis.mlflow import bounds

    # MLflow's own timeout, each read's, where this MLflow's requests cannot be bounded whole
    os.environ.setdefault(bounds.TIMEOUT_VARIABLE, f"{bounds.DEADLINE_S:g}")
    why = bounds.install()
    if why and note is not None:
        note(why)
    return MlflowClient(tracking_uri=uri)


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and what raised it (its cause, else its context), each once."""
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def _one_line(text: str) -> str:
    return " ".join(text.split())


def reason(error: BaseException) -> str:
    """One line for a failed request."""
    from gridrun.analysis.mlflow.bounds import BoundExceeded

    chain = _chain(error)
    for e in chain:
        if isinstance(e, BoundExceeded):
            return str(e)
    for e in chain:
        if isinstance(e, OSError) and e.errno in _DISK_ERRORS:
            return userfiles.write_error(e)
    http = _http_error(chain)
    if http is not None:
        return http
    text = _one_line(str(error))
    if "database or disk is full" in text:  # sqlite, under a local store
        return userfiles.write_error(OSError(errno.ENOSPC, "full"))
    if "Connection aborted" in text or "RemoteDisconnected" in text:
        return "no answer (the server closed the connection)"
    if "Max retries exceeded" in text or "Connection" in type(error).__name__:
        why = "connection refused" if "refused" in text.lower() else \
            "timed out" if "timed out" in text.lower() else "no connection"
        return f"no answer ({why})"
    return (text or type(error).__name__)[:REASON_MAX]


def _http_error(chain: list[BaseException]) -> str | None:
    """`HTTP 500 (Internal Server Error): the server's reason`, for an answer that said
    the request failed; None for any other failure."""
    from mlflow.exceptions import MlflowException, RestException

    for e in chain:
        if isinstance(e, RestException):  # a JSON error, as an MLflow server sends them
            return _status_line(e.get_http_status_code(), e.message)
        response = getattr(e, "response", None)  # requests' HTTPError (an artifact upload)
        if response is not None and getattr(response, "status_code", 0) >= 400:
            return _status_line(response.status_code, response.text)
        if isinstance(e, MlflowException) and (found := _NOT_JSON.search(e.message)):
            return _status_line(int(found[1]), found[2])
        if found := _URLLIB3_STATUS.search(str(e)):
            return _status_line(int(found[1]), "")
    return None


def _status_line(status: int, body: str) -> str:
    try:
        phrase = f" ({HTTPStatus(status).phrase})"
    except ValueError:
        phrase = ""
    said = next((line for line in (_one_line(re.sub(r"<[^>]*>", " ", part))
                                   for part in body.splitlines()) if line), "")
    return f"HTTP {status}{phrase}: {said[:REASON_MAX]}" if said else \
        f"HTTP {status}{phrase}, with no reason given"


def refused(error: BaseException) -> bool:
    """The server answered, and refuses this run's request (a 4xx): retrying it would not
    help. Not a refusal of the mirror itself (401, 403: every run waits) nor a wait (408, 429)."""
    from mlflow.exceptions import RestException

    return isinstance(error, RestException) and 400 <= error.get_http_status_code() < 500 \
        and error.get_http_status_code() not in (401, 403, 408, 429)
