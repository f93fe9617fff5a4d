"""Conversions on a few long-lived helper threads, each with a time limit per image.

No Beam here. Two reasons for helper threads:

* **The time limit.** Signals (SIGALRM) only reach a process's main thread,
  and Beam runs DoFns on its own worker threads, so a conversion runs on a
  helper thread and its caller waits at most `timeout_s` for the result. A C
  decoder, or a read of a hung network mount, cannot be interrupted: a
  conversion that overruns is abandoned with its thread (the image is rejected
  as `timeout`), stops at its next step once past its deadline, and a fresh
  helper takes its place. Nothing ever waits for an abandoned thread.
* **Bounded threads, and no hang.** At most `threads + max_abandoned` threads
  exist at once, so stuck conversions cannot pile up without limit (each holds
  at most one conversion's memory). Once abandoned threads fill the spare
  places, a further overrun is not replaced: the pool works on with fewer
  helpers, and when every helper is stuck it rejects the images still waiting
  at once as `stalled_worker` instead of waiting for threads that may never
  return. An abandoned thread that does return frees its place again.
* **Keeping every core busy.** Pillow releases the GIL while it decodes and
  resizes (not while it encodes a JPEG: two threads encode no faster than
  one), so two conversions per worker process overlap one image's encoding and
  Python steps with another's decoding and resizing. And when one worker
  process runs out of images before the others (cores of a shared machine do
  not run at the same speed), the operating system gives its cores to the
  busy processes instead of leaving them idle. The conversions at once in a
  process are bounded by `core_slot`; more helpers can then wait on reads
  (`grow`), so a read's latency never idles a core.

* **Memory.** Before decoding, each conversion reserves the memory it will
  need from its worker process's one budget, `--worker_memory_mb`, shared by
  every pool of the process (see `transforms.base.memory`), and waits while others
  hold it. That wait is not the image's fault: its clock stops while it waits
  (`Job.memory_wait_since`, `Job.memory_waited`), here and in the conversion's
  own deadline.

Handing an image to a waiting thread costs microseconds; starting a thread
per image cost about 1.3 ms, a fifth of a typical conversion.
"""

from __future__ import annotations

import collections
import contextlib
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from transforms.base import memory
from transforms.images.diagnosis import STALLED_WORKER, TIMEOUT, ImageRejected
from transforms.images.settings import ImageSettings

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741
# work(deadline) -> result; `deadline` is a time.monotonic() value or None.
Work = Callable[[float | None], T]


class Job(Generic[T]):
    """One submitted piece of work and, once `done` is set, its outcome."""

    __slots__ = ("work", "started", "thread", "done", "outcome", "cancelled", "memory_wait_since", "memory_waited",
                 "slot")

    def __init__(self, work: Work):
        self.work = work
        self.cancelled = False  # given up before it started: a helper that finds it later skips it
        self.started: float | None = None  # the pool's clock (time.monotonic) when a helper took it
        self.thread: threading.Thread | None = None
        self.done = threading.Event()
        self.outcome: T | BaseException | None = None
        # Set by `transforms.base.memory` while the job waits for memory; that time does not count against its limit.
        self.memory_wait_since: float | None = None
        self.memory_waited = 0.0  # seconds waited for memory so far
        self.slot: _Slot | None = None  # the place for CPU work it holds (`core_slot`), if any

    def deadline(self, limit: float) -> float:
        """When the job's time is up: `limit` seconds after it started, plus its waits for memory."""
        return self.started + self.memory_waited + limit


_slots: dict[int, threading.BoundedSemaphore] = {}
_slots_lock = threading.Lock()


class _Slot:
    """One held place of a `core_slot` gate, given back once: by its holder, or for it when it is abandoned."""

    def __init__(self, gate: threading.BoundedSemaphore):
        self._gate = gate
        self._lock = threading.Lock()
        self._held = True

    def release(self) -> None:
        with self._lock:
            if self._held:
                self._held = False
                self._gate.release()


@contextlib.contextmanager
def core_slot(slots: int | None) -> Iterator[float]:
    """Hold one of this process's `slots` places for CPU-bound work (None: no limit) for a `with` block, which
    gets the seconds waited for it.

    Helpers that read files can then outnumber the cores: a helper whose file
    has arrived waits here, and that wait is not the image's fault (its clock
    stops, see `transforms.base.memory.paused`). A conversion abandoned past its
    time limit gives its place back at once (`ConversionPool.result`), so
    stuck decoders never hold the process's places.
    """
    if not slots:
        yield 0.0
        return
    with _slots_lock:
        gate = _slots.setdefault(slots, threading.BoundedSemaphore(slots))
    if gate.acquire(blocking=False):
        waited = 0.0
    else:
        with memory.paused() as pause:
            gate.acquire()
        waited = pause.waited
    slot = _Slot(gate)
    job = memory.current_job()
    if job is not None:
        job.slot = slot
    try:
        yield waited
    finally:
        slot.release()
        if job is not None:
            job.slot = None


def time_limit(settings: ImageSettings) -> float | None:
    """The limit per image in seconds, or None for no limit."""
    limit = settings.timeout_s
    if not limit or limit <= 0 or not math.isfinite(limit):
        return None
    return min(limit, threading.TIMEOUT_MAX)


class ConversionPool:
    """Run work on `threads` helper threads; `result()` enforces the time limit per job.

    Jobs start in submission order. Not thread-safe: one caller thread
    submits and collects (a DoFn instance is only ever used by one thread).
    `clock` (time.monotonic) times the jobs and gives the deadline handed to
    each; tests inject one that only they move on.
    """

    _POLL_S = 0.05  # how often a caller waiting for a queued (not yet started) job looks again

    def __init__(self, limit_s: float | None, threads: int = 1, max_abandoned: int = 2, *,
                 clock: Callable[[], float] = time.monotonic):
        self._limit = limit_s
        self._clock = clock
        self._threads = max(1, threads)
        self._max_abandoned = max_abandoned
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._helpers: list[threading.Thread] = []
        self._abandoned: list[threading.Thread] = []
        self._quit: set[threading.Thread] = set()  # helpers to end once their current job returns

    def _serve(self) -> None:
        me = threading.current_thread()
        while me not in self._quit:
            job = self._jobs.get()
            if job is None:  # close()
                return
            if job.cancelled:
                continue
            job.thread = me
            job.started = self._clock()
            try:
                with memory.track(job):
                    job.outcome = job.work(job.started + self._limit if self._limit else None)
            except BaseException as e:  # handed to the caller's thread
                job.outcome = e
            job.done.set()

    def _start_helpers(self) -> None:
        """Fill the helpers up to `threads`, within `threads + max_abandoned` threads in all. Never blocks."""
        self._abandoned = [t for t in self._abandoned if t.is_alive()]
        self._quit.intersection_update(self._abandoned)
        while (len(self._helpers) < self._threads
               and len(self._helpers) + len(self._abandoned) < self._threads + self._max_abandoned):
            helper = threading.Thread(target=self._serve, name="convert-image", daemon=True)
            helper.start()
            self._helpers.append(helper)

    @property
    def threads(self) -> int:
        return self._threads

    def grow(self, threads: int) -> None:
        """Have `threads` helpers from now on, if more than now (a pool never shrinks: idle helpers cost nothing)."""
        if threads > self._threads:
            self._threads = threads
            self._start_helpers()

    def submit(self, work: Work) -> Job:
        self._start_helpers()
        job = Job(work)
        self._jobs.put(job)
        return job

    def in_order(self, items: Iterable[I], work_of: Callable[[I], Work], ahead: int | None = None
                 ) -> Iterator[tuple[I, Job]]:
        """Submit `work_of(item)` for each item, keeping `ahead` jobs queued (two per helper by default),
        and yield (item, job) in the order of `items`, each once its job is done or first in line.

        The caller takes each outcome with `result(job)`, which applies the time limit.
        """
        ahead = 2 * self._threads if ahead is None else max(1, ahead)
        pending: collections.deque = collections.deque()
        for item in items:
            pending.append((item, self.submit(work_of(item))))
            while len(pending) > ahead or (pending and pending[0][1].done.is_set()):
                yield pending.popleft()
        while pending:
            yield pending.popleft()

    def result(self, job: Job):
        """The job's result; re-raises its exception. Returns within the time limit of the job's start,
        not counting the time it waited for memory (a wait that is bounded in `transforms.base.memory`).

        Raises:
            ImageRejected: `timeout` when the job ran longer than the limit;
                `stalled_worker`, at once, when the job has not started and every helper is stuck.
        """
        while not job.done.is_set():
            if job.started is None:  # queued behind other jobs: its clock has not started
                self._start_helpers()  # an abandoned helper that returned frees its place
                if not self._helpers:
                    job.cancelled = True
                    raise ImageRejected(
                        STALLED_WORKER,
                        f"not tried: {len(self._abandoned)} earlier images on this worker are stuck past the time "
                        "limit and never returned (a FIFO, a hung network mount or a decoder that does not end: see "
                        "their `timeout` lines); no more threads are started for this worker, so that stuck ones "
                        "cannot pile up. Remove or fix those files and run again",
                    )
                job.done.wait(self._POLL_S)
            elif self._limit is None:
                job.done.wait()
            elif job.memory_wait_since is not None:  # waiting for memory: its clock has stopped
                job.done.wait(self._POLL_S)
            elif not job.done.wait(max(0.0, job.deadline(self._limit) - self._clock())):
                if job.memory_wait_since is not None or self._clock() < job.deadline(self._limit):
                    continue  # it waited for memory meanwhile: its time is not up yet
                if job.slot is not None:  # its place for CPU work goes to the next conversion
                    job.slot.release()
                self._abandon(job.thread)
                raise ImageRejected(TIMEOUT, f"no result within the time limit of {self._limit:g} s per image")
        if isinstance(job.outcome, BaseException):
            raise job.outcome
        return job.outcome

    def _abandon(self, helper: threading.Thread) -> None:
        # The helper is stuck in a C call or a read: it ends quietly once that
        # returns (if ever), and a new one takes its place now if there is room.
        self._quit.add(helper)
        self._helpers.remove(helper)
        self._abandoned.append(helper)
        self._start_helpers()  # jobs already queued must not wait for the stuck one

    def close(self) -> None:
        """Let idle helpers end; abandoned ones end when their stuck call returns."""
        for _ in self._helpers:
            self._jobs.put(None)
        self._helpers = []
