"""Reads that fail for a moment are tried again; a read that keeps failing fails the bundle, never drops the image.

Under load GCS answers 429 (slow down) or 500/502/503/504, and a connection can
time out or be reset. None of that is the file's fault, so such an error must
not make the image a rejection (the job would succeed with the image silently
missing). A read is tried up to `READ_ATTEMPTS` times, with exponential backoff
and full jitter between attempts: google.api_core's retry helpers, the ones
google-cloud-storage and Beam's gcsio retry with. The retries stop early
rather than run past `RETRY_BUDGET_S`, or past half of what is left of the
image's --image_timeout_s (the other half is for converting it). When they are
used up, `TransientReadError` is raised: the DoFn fails its bundle, Dataflow
retries the bundle, and a local run stops with one `error:` line.

A missing file (404, FileNotFoundError) or one that may not be read (403,
PermissionError) is not transient: it stays a `read_error` rejection.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import time
from collections.abc import Callable
from typing import TypeVar

import requests
import urllib3
from google.api_core import exceptions as api_exceptions
from google.api_core.retry import RetryFailureReason, exponential_sleep_generator, retry_target
from google.auth import exceptions as auth_exceptions
from google.resumable_media.common import InvalidResponse

T = TypeVar("T")

READ_ATTEMPTS = 5  # tries of one read in all, the first included
RETRY_BASE_S = 1.0  # the first wait is random in [0, this); each later one doubles its bound
RETRY_MAX_S = 16.0  # bound of any one wait
RETRY_BUDGET_S = 60.0  # no attempt starts after this long since the first one
DEADLINE_SHARE = 0.5  # retries use at most this part of the time left before the image's deadline
REQUEST_TIMEOUT_S = 60.0  # connect and read timeout of one GCS request (google-cloud-storage's default)
# Tests set the first wait's bound through the environment, which reaches worker processes too.
RETRY_BASE_ENV = "IMAGE_TFRECORDS_RETRY_BASE_S"

# HTTP statuses that mean "try again": request timeout, too many requests, server errors.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# OSError numbers of a network that failed for a moment (sockets, or a network file system).
TRANSIENT_ERRNOS = frozenset({
    errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EPIPE,
    errno.ENETDOWN, errno.ENETUNREACH, errno.ENETRESET, errno.EHOSTUNREACH,
})
# Exception types that are transient whatever they carry (as google-cloud-storage's own retry predicate).
_TRANSIENT_TYPES = (
    ConnectionError,  # reset, aborted, refused, broken pipe; http.client.RemoteDisconnected
    TimeoutError,  # socket.timeout
    requests.exceptions.ConnectionError,
    requests.exceptions.ChunkedEncodingError,
    requests.exceptions.Timeout,
    http.client.BadStatusLine,
    http.client.IncompleteRead,
    http.client.ResponseNotReady,
    urllib3.exceptions.PoolError,
    urllib3.exceptions.ProtocolError,
    urllib3.exceptions.TimeoutError,
    urllib3.exceptions.SSLError,
)


class TransientReadError(Exception):
    """A read still failed with a transient error after every retry: the bundle fails, the image is not rejected."""

    def __init__(self, path: str, attempts: int, seconds: float, last_error: str):
        super().__init__(f"reading {path} failed {attempts} times with a transient error over {seconds:.1f} s "
                         f"(retried with backoff); the last error: {last_error}")
        self.path = path
        self.attempts = attempts
        self.seconds = seconds
        self.last_error = last_error

    def __reduce__(self):  # the default would call __init__ with the message only
        return type(self), (self.path, self.attempts, self.seconds, self.last_error)


def describe(error: BaseException, limit: int = 300) -> str:
    """`Type: message` of `error` on one line, at most `limit` characters.

    For an error answer of GCS: its status, the request and the message of its JSON body.
    """
    message = str(error)
    if isinstance(error, api_exceptions.GoogleAPICallError):
        # google-cloud-storage's message: "GET URL: BODY: (the transport's own tuple)"
        request, _, rest = error.message.partition(": ")
        body = rest.split(": ('Request failed", 1)[0]
        try:
            body = json.loads(body)["error"]["message"]
        except (ValueError, TypeError, KeyError):
            pass
        message = f"{error.code} {request}: {body}" if rest else f"{error.code} {request}"
    text = " ".join(f"{type(error).__name__}: {message}".split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def is_transient(error: BaseException) -> bool:
    """Whether a read that raised `error` may succeed if tried again (429, 5xx, timeouts, resets)."""
    if isinstance(error, TransientReadError):
        return False  # retries already used up
    if isinstance(error, api_exceptions.RetryError):
        return True  # a library's own retries ran out: only transient errors are retried
    if isinstance(error, api_exceptions.GoogleAPICallError):
        return error.code in TRANSIENT_STATUSES  # 404 NotFound, 403 Forbidden: not transient
    if isinstance(error, InvalidResponse):
        return getattr(error.response, "status_code", None) in TRANSIENT_STATUSES
    if isinstance(error, auth_exceptions.TransportError):  # wraps the transport's own error
        cause = error.args[0] if error.args and isinstance(error.args[0], BaseException) else error.__cause__
        return cause is not None and is_transient(cause)
    if isinstance(error, _TRANSIENT_TYPES):
        return True
    return isinstance(error, OSError) and error.errno in TRANSIENT_ERRNOS


def _base_delay() -> float:
    try:
        base = float(os.environ.get(RETRY_BASE_ENV, RETRY_BASE_S))
    except ValueError:
        return RETRY_BASE_S
    return base if base > 0 else RETRY_BASE_S


def with_retries(read: Callable[[float], T], path: str, deadline: float | None = None) -> T:
    """`read(timeout)`, tried again on transient errors; `timeout` is for each request it makes.

    `deadline` (a time.monotonic() value, or None) is the image's: the retries end
    well before it. Any other error is raised at once, unchanged.

    Raises:
        TransientReadError: when the last try failed with a transient error too.
    """
    start = time.monotonic()
    budget = RETRY_BUDGET_S
    if deadline is not None:
        budget = min(budget, max(0.0, deadline - start) * DEADLINE_SHARE)
    attempts = 0

    def attempt() -> T:
        nonlocal attempts
        attempts += 1
        left = REQUEST_TIMEOUT_S if deadline is None else (deadline - time.monotonic()) * DEADLINE_SHARE
        return read(max(1.0, min(REQUEST_TIMEOUT_S, left)))

    def used_up(error: BaseException) -> TransientReadError:
        return TransientReadError(path, attempts, time.monotonic() - start, describe(error))

    def on_error(error: Exception) -> None:  # each transient error, before the wait; what it raises is not caught
        if attempts >= READ_ATTEMPTS:
            raise used_up(error) from error

    def give_up(errors: list[Exception], reason: RetryFailureReason, _timeout) -> tuple[Exception, Exception | None]:
        if reason == RetryFailureReason.TIMEOUT:  # the next wait would end past the budget
            return used_up(errors[-1]), errors[-1]
        return errors[-1], None  # not transient: the caller's problem, unchanged

    return retry_target(attempt, is_transient, exponential_sleep_generator(_base_delay(), RETRY_MAX_S),
                        timeout=budget, on_error=on_error, exception_factory=give_up)
