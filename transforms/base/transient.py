"""Reads that fail for a moment are tried again; a read that keeps failing fails the bundle, never drops the image.

Under load GCS answers 429 (slow down) or 500/502/503/504, and a connection can
time out or be reset. None of that is the file's fault, so such an error must
not make the image a rejection (the job would succeed with the image silently
missing). Waits are exponential with full jitter (google.api_core's
generator, the one google-cloud-storage and Beam's gcsio retry with):

- a throttling answer (429, 503: the bucket's read capacity is still ramping
  up) is retried for up to --throttled_retry_s seconds of waits (10 minutes by
  default), and it halves this process's read rate (`ReadRate`, a token
  bucket that starts low and doubles every 20 minutes, as GCS asks). Those
  waits do not count against the image's --image_timeout_s;
- any other transient error is tried up to `READ_ATTEMPTS` times, and not
  past `RETRY_BUDGET_S` or half of what is left of the image's time limit.

When they are used up, `TransientReadError` is raised: the DoFn fails its
bundle, Dataflow retries the bundle, and a local run stops with one `error:` line.

A missing file (404, FileNotFoundError) or one that may not be read (403,
PermissionError) is not transient: it stays a `read_error` rejection.
"""

from __future__ import annotations

import errno
import http.client
import json
import math
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import requests
import urllib3
from google.api_core import exceptions as api_exceptions
from google.api_core.retry import exponential_sleep_generator
from google.auth import exceptions as auth_exceptions
from google.resumable_media.common import InvalidResponse

from transforms.base import memory
from transforms.base.paths import is_gcs

T = TypeVar("T")

READ_ATTEMPTS = 5  # tries of one read in all, the first included
RETRY_BASE_S = 1.0  # the first wait is random in [0, this); each later one doubles its bound
RETRY_MAX_S = 16.0  # bound of any one wait
RETRY_BUDGET_S = 60.0  # no attempt starts after this long since the first one
DEADLINE_SHARE = 0.5  # retries use at most this part of the time left before the image's deadline
REQUEST_TIMEOUT_S = 60.0  # connect and read timeout of one GCS request (google-cloud-storage's default)
THROTTLE_STATUSES = frozenset({429, 503})  # "slow down": retried for minutes (`THROTTLED_RETRY_S`), see is_throttled
THROTTLED_RETRY_S = 600.0  # waits after throttling answers, per read, before the bundle fails (--throttled_retry_s)
JOB_READS_PER_S = 5000.0  # a job's reads a second at first (--initial_read_rate): a cold bucket's read capacity
ASSUMED_PROCESSES = 100  # the job's worker processes when its launch does not say (no --max_num_workers)
INITIAL_READS_PER_S = JOB_READS_PER_S / ASSUMED_PROCESSES  # one worker process's first rate when nothing else is known
RAMP_DOUBLING_S = 20 * 60.0  # the rate doubles this often, GCS's ramp rule
MOST_READS_PER_S = 2000.0  # bound of one process's rate (far above what it converts)
LEAST_READS_PER_S = 5.0  # halving on throttling stops here
LEAST_START_PER_S = 1.0  # a process's share of the job's first rate is at least this
SLOW_DOWN_GAP_S = 1.0  # the rate is halved at most this often
RECOVERY_DOUBLING_S = 60.0  # after a slow-down the rate doubles this often, back to the rate that was throttled
INITIAL_RATE_ENV = "IMAGE_TFRECORDS_INITIAL_READS_PER_S"  # tests: a fast start
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


def is_throttled(error: BaseException) -> bool:
    """Whether `error` is the store asking to slow down (429, 503): worth waiting minutes for, not seconds."""
    if isinstance(error, api_exceptions.GoogleAPICallError):
        return error.code in THROTTLE_STATUSES
    if isinstance(error, InvalidResponse):
        return getattr(error.response, "status_code", None) in THROTTLE_STATUSES
    return False


def _base_delay() -> float:
    try:
        base = float(os.environ.get(RETRY_BASE_ENV, RETRY_BASE_S))
    except ValueError:
        return RETRY_BASE_S
    return base if base > 0 else RETRY_BASE_S


class ReadRate:
    """A token bucket for one worker process's reads: a cold bucket is ramped up, not hammered.

    Cloud Storage starts a bucket at about 5,000 object reads per second and
    asks clients to at most double their rate every 20 minutes
    (https://cloud.google.com/storage/docs/request-rate). A process starts at
    `initial_per_s` reads a second (5,000 shared by 100 worker processes), and
    its rate doubles every `doubling_s`, up to `most_per_s`, with a burst of
    one second's reads. A throttling answer (429, 503) halves the rate (at
    most once per `SLOW_DOWN_GAP_S`, never below `least_per_s`); it then
    climbs back to the rate that was throttled, doubling every
    `RECOVERY_DOUBLING_S`, and on from there at the 20-minute ramp.
    `clock` and `sleep` are injectable (tests).
    """

    def __init__(self, initial_per_s: float = INITIAL_READS_PER_S, doubling_s: float = RAMP_DOUBLING_S,
                 most_per_s: float = MOST_READS_PER_S, least_per_s: float = LEAST_READS_PER_S,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self._clock, self._sleep = clock, sleep
        self.doubling_s, self.most_per_s, self.least_per_s = doubling_s, most_per_s, least_per_s
        self._lock = threading.Lock()
        self._base, self._since = initial_per_s, clock()
        self._ceiling = initial_per_s  # the rate last throttled: climbed back to quickly
        self._slowed = -math.inf  # when the rate was last halved
        self._tokens, self._filled = max(1.0, initial_per_s), self._since

    def rate(self) -> float:
        """Reads a second allowed now."""
        with self._lock:
            return self._rate(self._clock())

    def _rate(self, now: float) -> float:
        rate, elapsed = self._base, now - self._since
        if self._ceiling > rate:  # climbing back after a slow-down
            climb = RECOVERY_DOUBLING_S * math.log2(self._ceiling / rate)
            if elapsed < climb:
                return min(self.most_per_s, rate * 2 ** (elapsed / RECOVERY_DOUBLING_S))
            rate, elapsed = self._ceiling, elapsed - climb
        return min(self.most_per_s, rate * 2 ** min(64.0, elapsed / self.doubling_s))  # 2**64: past any bound

    def wait(self) -> float:
        """Take one read's token, sleeping until there is one; returns the seconds slept."""
        with self._lock:
            now = self._clock()
            rate = self._rate(now)
            self._tokens = min(max(1.0, rate), self._tokens + (now - self._filled) * rate)  # a second's burst
            self._filled = now
            self._tokens -= 1.0
            delay = -self._tokens / rate if self._tokens < 0 else 0.0
        if delay > 0:
            self._sleep(delay)
        return delay

    def slow_down(self) -> None:
        """The store said 429 or 503: halve the rate (once per `SLOW_DOWN_GAP_S`: the answers of reads
        already sent at the old rate say nothing new)."""
        with self._lock:
            now = self._clock()
            if now - self._slowed < SLOW_DOWN_GAP_S:
                return
            current = self._rate(now)
            self._ceiling, self._base = current, max(self.least_per_s, current / 2)
            self._since, self._slowed = now, now


_rates: dict[int, ReadRate] = {}
_rates_lock = threading.Lock()


def process_start_rate(job_reads_per_s: float = JOB_READS_PER_S, processes: int | None = None) -> float:
    """One worker process's first reads a second: its share of the job's `job_reads_per_s`, over the job's
    `processes` at most (ASSUMED_PROCESSES when unknown), within [LEAST_START_PER_S, MOST_READS_PER_S]."""
    share = job_reads_per_s / (processes or ASSUMED_PROCESSES)
    return min(MOST_READS_PER_S, max(LEAST_START_PER_S, share))


def read_rate(start_per_s: float | None = None) -> ReadRate:
    """This process's ReadRate (a forked child gets its own), made at its first call: starting at `start_per_s`
    (the launcher's `process_start_rate`; INITIAL_READS_PER_S when None); the environment can set it (tests)."""
    with _rates_lock:
        if os.getpid() not in _rates:
            initial = _env_float(INITIAL_RATE_ENV, INITIAL_READS_PER_S if start_per_s is None else start_per_s)
            _rates.clear()
            _rates[os.getpid()] = ReadRate(initial_per_s=initial, least_per_s=min(LEAST_READS_PER_S, initial))
        return _rates[os.getpid()]


def _env_float(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 and math.isfinite(value) else default


def with_retries(read: Callable[[float], T], path: str, deadline: float | None = None,
                 throttled_s: float = THROTTLED_RETRY_S, rate: ReadRate | None = None,
                 start_rate: float | None = None) -> T:
    """`read(timeout)`, tried again on transient errors; `timeout` is for each request it makes.

    `deadline` (a time.monotonic() value, or None) is the image's: the retries of
    other transient errors end well before it. A throttling answer (429, 503)
    is the store's load, not the image's: it is retried for up to `throttled_s`
    seconds of waits, and those waits (and the read rate's, see `ReadRate`) do
    not count against the image's time limit (`memory.paused`). Any other error
    is raised at once, unchanged.

    The read rate (`ReadRate`, the process's own unless `rate` is given; made
    at `start_rate` if this is the process's first read) paces gs:// reads
    only: its ramp is a rule of Cloud Storage, and a local file read at 50 a
    second would cap a worker process far below its cores.

    Raises:
        TransientReadError: when the last try failed with a transient error too.
    """
    if rate is None and is_gcs(path):
        rate = read_rate(start_rate)
    start = time.monotonic()
    budget = RETRY_BUDGET_S if deadline is None else min(RETRY_BUDGET_S, max(0.0, deadline - start) * DEADLINE_SHARE)
    delays = exponential_sleep_generator(_base_delay(), RETRY_MAX_S)
    attempts = others = 0
    throttled_waited = paused = 0.0
    while True:
        if rate is not None:
            with memory.paused() as pause:
                rate.wait()
            paused += pause.waited
        attempts += 1
        if deadline is None:
            left = REQUEST_TIMEOUT_S
        else:
            left = (deadline + paused - time.monotonic()) * DEADLINE_SHARE
        try:
            return read(max(1.0, min(REQUEST_TIMEOUT_S, left)))
        except Exception as error:
            if not is_transient(error):
                raise
            delay = next(delays)
            if is_throttled(error):
                if rate is not None:
                    rate.slow_down()
                if throttled_waited + delay > throttled_s:
                    raise TransientReadError(path, attempts, time.monotonic() - start, describe(error)) from error
                with memory.paused() as pause:
                    time.sleep(delay)
                throttled_waited += pause.waited
                paused += pause.waited
                continue
            others += 1
            if others >= READ_ATTEMPTS or time.monotonic() - start - paused + delay > budget:
                raise TransientReadError(path, attempts, time.monotonic() - start, describe(error)) from error
            time.sleep(delay)
