"""One memory budget per worker process for the conversions running in it (admission control).

No Beam here. `--max_image_mb` bounds one conversion, but a worker process runs
several at once: `--conversion_threads` (its places for CPU work,
`transforms.images.pool.core_slot`), up to two more left behind stuck past the time
limit per Beam worker thread (DoFn instance), and files read ahead of them by
more helpers (`hold_for_read`, within the budget's room for them). So before an image is
decoded, its conversion reserves the memory it will need (`decode.working_bytes`
from the header, plus the file's bytes) from the process's one budget, and
returns it when the conversion ends:

* **First come, first served.** A conversion that does not fit waits, and so
  does every one after it, so a large image is never overtaken for ever by
  small ones.
* **No deadlock.** An image larger than the whole budget (possible only when the
  budget is below `--max_image_mb`) is admitted when nothing else holds any of it,
  and runs alone.
* **No wait for ever.** Every admitted conversion returns its memory when it ends.
  One stuck in a decoder past its time limit keeps it (the memory is really in
  use); when no memory has come back and no conversion has been admitted for a whole
  time limit, the waiting one gives up with `BudgetStalled` (the image becomes a
  `stalled_worker` rejection) instead of waiting for threads that may never return.
* **The wait is not the image's fault.** The time spent waiting does not count
  against the image's time limit: the waiting job reports it through the object
  that `track` registers for its thread (`transforms.images.pool.Job`), and the
  conversion moves its own deadline on by as much.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator

_local = threading.local()  # .job: the pool's Job that this thread is running, if any
_budgets: dict[int, MemoryBudget] = {}
_budgets_lock = threading.Lock()


class BudgetStalled(Exception):
    """No memory came back for a whole stall period: the holders are stuck."""

    def __init__(self, need: int, held: int, holders: int, capacity: int, waited_s: float):
        super().__init__(f"waited {waited_s:.1f} s for {need / 1e6:,.0f} MB while {holders} conversion(s) held "
                         f"{held / 1e6:,.0f} MB of {capacity / 1e6:,.0f} MB")
        self.need, self.held, self.holders, self.capacity, self.waited_s = need, held, holders, capacity, waited_s


class MemoryBudget:
    """`capacity` bytes shared by the conversions of one process; thread-safe."""

    _POLL_S = 1.0  # how often a waiter looks at the clock for a stall (a release wakes it at once)

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._cond = threading.Condition()
        self._held = 0  # bytes reserved now
        self._holders = 0  # reservations held now
        self._queue: collections.deque = collections.deque()  # tickets of the waiting reservations, in order
        self._progress = 0  # reservations admitted or returned so far: a stall is a period with none
        self._read_held = 0  # of `_held`, the bytes of files held for reading ahead (`hold_for_read`)
        self.peak = 0  # the most bytes ever reserved at once (for tests and reports)

    @property
    def held(self) -> int:
        return self._held

    @property
    def holders(self) -> int:
        return self._holders

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def _fits(self, nbytes: int) -> bool:
        return self._holders == 0 or self._held + nbytes <= self.capacity

    def _take(self, nbytes: int) -> None:
        self._held += nbytes
        self._holders += 1
        self._progress += 1
        self.peak = max(self.peak, self._held)

    def acquire(self, nbytes: int, stall_s: float | None = None) -> float:
        """Reserve `nbytes`, waiting for them if need be; returns the seconds waited.

        Raises:
            BudgetStalled: while waiting, nothing was admitted or returned for `stall_s`
                seconds (None: wait as long as it takes).
        """
        nbytes = max(0, int(nbytes))
        with self._cond:
            if not self._queue and self._fits(nbytes):
                self._take(nbytes)
                return 0.0
            ticket = object()
            self._queue.append(ticket)
            try:
                with paused() as pause:
                    for now, quiet_since in self._waits(lambda: self._queue[0] is ticket and self._fits(nbytes),
                                                        stall_s):
                        if stall_s is not None and now - quiet_since >= stall_s:
                            raise BudgetStalled(nbytes, self._held, self._holders, self.capacity,
                                                now - pause.since)
                self._queue.popleft()
                self._take(nbytes)
            finally:
                if ticket in self._queue:  # gave up (a stall or an exception): let the next one try
                    self._queue.remove(ticket)
                    self._cond.notify_all()
            self._cond.notify_all()  # the next in line may fit too
            return pause.waited

    def _waits(self, ready, stall_s: float | None) -> Iterator[tuple[float, float]]:
        """While `ready()` is false (the condition's lock held), wait for a change and yield (now, the time since
        which nothing was admitted or returned); the caller gives up by leaving the loop."""
        seen, quiet_since = self._progress, time.monotonic()
        while not ready():
            now = time.monotonic()
            if self._progress != seen:
                seen, quiet_since = self._progress, now
            yield now, quiet_since
            wait = self._POLL_S if stall_s is None else min(self._POLL_S, quiet_since + stall_s - now)
            self._cond.wait(max(0.001, wait))

    def hold_for_read(self, nbytes: int, room: int, stall_s: float | None = None) -> tuple[bool, float]:
        """Reserve `nbytes` for a file about to be read ahead of its conversion; returns (held, seconds waited).

        Read-ahead never queues in front of a conversion: it waits, outside the
        queue, until no conversion is waiting, the bytes fit, and the files held
        for reading stay within `room` bytes in all. `room` is the budget less
        the most one conversion may need, so a conversion that waits behind
        files read ahead always fits once the conversions before it end. A file
        larger than `room`, or a wait that sees nothing admitted or returned for
        `stall_s`, is read without a hold (False), as a conversion's own read is.
        """
        nbytes = max(0, int(nbytes))
        if nbytes == 0 or nbytes > room:
            return False, 0.0
        def fits() -> bool:
            return not self._queue and self._held + nbytes <= self.capacity and self._read_held + nbytes <= room

        with self._cond:
            waited = 0.0
            if not fits():
                with paused() as pause:
                    for now, quiet_since in self._waits(fits, stall_s):
                        if stall_s is not None and now - quiet_since >= stall_s:
                            return False, now - pause.since
                waited = pause.waited
            self._take(nbytes)
            self._read_held += nbytes
        return True, waited

    def release_read(self, nbytes: int) -> None:
        with self._cond:
            self._read_held -= max(0, int(nbytes))
        self.release(nbytes)

    def release(self, nbytes: int) -> None:
        with self._cond:
            self._held -= max(0, int(nbytes))
            self._holders -= 1
            self._progress += 1
            self._cond.notify_all()


def budget(capacity: int) -> MemoryBudget | None:
    """This process's budget of `capacity` bytes (one per capacity, made on first use); None for 0, no budget."""
    if capacity <= 0:
        return None
    with _budgets_lock:
        found = _budgets.get(capacity)
        if found is None:
            found = _budgets[capacity] = MemoryBudget(capacity)
        return found


class Pause:
    """A wait that is not the image's fault: `since` when it began, `waited` seconds once it ended."""

    __slots__ = ("since", "waited")

    def __init__(self):
        self.since = time.monotonic()
        self.waited = 0.0


@contextlib.contextmanager
def paused() -> Iterator[Pause]:
    """Stop the clock of the pool's job running on this thread, if any, for a `with` block that waits.

    The job shows the wait while it lasts (`memory_wait_since`) and adds it to
    `memory_waited` once it ends, so the pool does not count it against the
    image's time limit; the block's caller moves the conversion's own deadline
    on by `Pause.waited`.
    """
    job = current_job()
    pause = Pause()
    if job is not None:
        job.memory_wait_since = pause.since
    try:
        yield pause
    finally:
        pause.waited = time.monotonic() - pause.since
        if job is not None:  # the waited time first, then the flag: the pool reads them in that order
            job.memory_waited += pause.waited
            job.memory_wait_since = None


def current_job():
    """The pool's job running on this thread (`track`), or None."""
    return getattr(_local, "job", None)


@contextlib.contextmanager
def track(job) -> Iterator[None]:
    """Let a wait for memory on this thread show on `job` (`memory_wait_since`, `memory_waited`)."""
    _local.job = job
    try:
        yield
    finally:
        _local.job = None
