"""MLflow's client for `gridrun mirror mlflow`: made with a short timeout and no retry
of its own, and what a failed request means (one line; a refusal of one run, or a
server that does not answer)."""

from __future__ import annotations

import os
from typing import Any

# a server that does not answer fails a request in seconds, not after minutes of retries
# (no retry inside the client: a create_run retried after a lost answer makes a second run;
# the mirror tries again itself, after finding what the server holds)
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
                 "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}


class MLflowMissing(ImportError):
    """The mlflow package is not installed; str() says how to get it."""


def client_for(uri: str) -> Any:
    """MLflow's client on `uri`: a 10 s HTTP timeout and no retry inside it, unless the
    environment sets them (MLFLOW_HTTP_REQUEST_TIMEOUT, MLFLOW_HTTP_REQUEST_MAX_RETRIES)."""
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise MLflowMissing("gridrun mirror mlflow needs the mlflow package: "
                            "pip install 'gridrun[mlflow]'") from None
    return MlflowClient(tracking_uri=uri)


def reason(error: BaseException) -> str:
    """One line for a failed request."""
    text = " ".join(str(error).split())
    if "Max retries exceeded" in text or "Connection" in type(error).__name__:
        why = "connection refused" if "refused" in text.lower() else \
            "timed out" if "timed out" in text.lower() else "no connection"
        return f"no answer ({why})"
    return (text or type(error).__name__)[:300]


def refused(error: BaseException) -> bool:
    """The server answered, and refuses this run's request (a 4xx): retrying it would not
    help. Not a refusal of the mirror itself (401, 403: every run waits) nor a wait (408, 429)."""
    from mlflow.exceptions import RestException

    return isinstance(error, RestException) and 400 <= error.get_http_status_code() < 500 \
        and error.get_http_status_code() not in (401, 403, 408, 429)
