"""Live progress of a local run: images converted out of the total, the rate and an ETA.

The counts come from the workers themselves, not from Beam's runner: each
worker process keeps its totals of the images that left conversion and of the
images labelled for conversion, and writes them to a file of its own in a
folder the launcher made for the run (`transforms.base.counters`,
PROGRESS_DIR_ENV). `FileCounts` adds those files up, a few small files a
second, however many images there are. Nothing here touches Beam: should Beam
change, the run goes on exactly as before.

On a terminal the counts drive a tqdm bar; otherwise (a pipe, a file, a
scheduler's log) they become a plain log line every few seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator

from transforms.base.counters import PROGRESS_DIR_ENV, PROGRESS_SUFFIX

_LOG = logging.getLogger("pipeline.progress")

# How often the display redraws.
REFRESH_SECONDS = 0.5
# Plain log lines: one every LOG_SECONDS, and one whenever another LOG_STEP of the images is done.
LOG_SECONDS = 10.0
LOG_STEP = 0.1


class FileCounts:
    """The workers' totals in `folder`: images that left conversion, and images labelled for conversion."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._last = (0, 0)

    def _read(self) -> tuple[int, int]:
        done = planned = 0
        try:
            names = os.listdir(self.folder)
        except OSError:
            return self._last
        for name in names:
            if not name.endswith(PROGRESS_SUFFIX):
                continue
            try:
                with open(os.path.join(self.folder, name), encoding="ascii") as counts:
                    worker_done, worker_planned = (int(n) for n in counts.read().split())
            except (OSError, ValueError):
                continue  # gone, or not one of ours
            done += worker_done
            planned += worker_planned
        # A worker's file can only grow; never show a count that goes back.
        self._last = max(done, self._last[0]), max(planned, self._last[1])
        return self._last

    @property
    def processed(self) -> int:
        return self._read()[0]

    @property
    def planned(self) -> int:
        """Images the job has labelled for conversion so far (its total once listing has ended)."""
        return self._read()[1]


@contextlib.contextmanager
def progress_folder(enabled: bool = True) -> Iterator[str | None]:
    """For the block, a folder where this run's workers write their counts (named in PROGRESS_DIR_ENV, which
    worker processes started in the block inherit); None when disabled. Removed at the end."""
    if not enabled:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="image-tfrecords-progress-")
    previous = os.environ.get(PROGRESS_DIR_ENV)
    os.environ[PROGRESS_DIR_ENV] = folder
    try:
        yield folder
    finally:
        if previous is None:
            os.environ.pop(PROGRESS_DIR_ENV, None)
        else:
            os.environ[PROGRESS_DIR_ENV] = previous
        shutil.rmtree(folder, ignore_errors=True)


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return "under 1 s"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class _Rate:
    """Images per second over the last `window` seconds, for a steady ETA."""

    def __init__(self, window: float = 30.0) -> None:
        self._window = window
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, count: int) -> float:
        if count == 0:
            self._samples.clear()  # start the clock when conversion starts, not when workers do
        self._samples.append((now, count))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self._window:
            self._samples.popleft()
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


def progress_line(done: int, total: int, rate: float) -> str:
    """One plain progress line, e.g. 'Converted 120/400 images (30%), 40.1 images/s, about 7 s left'."""
    share = done / total if total else 1.0
    line = f"Converted {done}/{total} images ({share:.0%})"
    if rate > 0:
        line += f", {rate:.1f} images/s"
        if done < total:
            left = (total - done) / rate
            line += ", under 1 s left" if left < 1 else f", about {format_duration(left)} left"
    if total and done >= total:
        line += "; writing shards and image_tfrecords.json"
    return line


def _terminal_width(stream) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


class ProgressDisplay:
    """Shows `counts.processed` out of `total`: a tqdm bar on a terminal, plain log lines otherwise.

    Without `total`, the total is the job's own count (`counts.planned`), known once the input is listed.
    """

    def __init__(self, counts: FileCounts, total: int | None = None, stream=None, interactive: bool | None = None):
        self._counts = counts
        self._fixed_total = total
        self._stream = stream if stream is not None else sys.stderr
        isatty = getattr(self._stream, "isatty", None)
        self._interactive = bool(isatty and isatty()) if interactive is None else interactive
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="progress-display", daemon=True)
        self._bar = None
        self._logged = -1  # the count of the last plain line
        self._rate = _Rate()

    @property
    def _total(self) -> int:
        return self._fixed_total if self._fixed_total is not None else self._counts.planned

    def __enter__(self) -> ProgressDisplay:
        if self._interactive:
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            # Log records of the launcher go above the bar instead of through it.
            self._redirect = logging_redirect_tqdm()
            self._redirect.__enter__()
            # A terminal that reports no size (a bare pty) would get an empty bar: assume 80x24.
            width = _terminal_width(self._stream)
            self._bar = tqdm(total=self._total or None, desc="Listing", unit="img", file=self._stream,
                             dynamic_ncols=bool(width), ncols=None if width else 80,
                             nrows=None if width else 24, smoothing=0.1,
                             mininterval=REFRESH_SECONDS)
        self._thread.start()
        return self

    def __exit__(self, exc_type, *_) -> None:
        self._stop.set()
        self._thread.join()
        done = self._counts.processed
        if self._bar is None and exc_type is None and done != self._logged:
            # The run can end between two looks: the last count gets its line all the same.
            _LOG.info(progress_line(done, self._total, self._rate.add(time.monotonic(), done)))
        if self._bar is not None:
            if exc_type is None:
                self._update_bar(self._counts.processed)
            self._bar.close()
            self._redirect.__exit__(None, None, None)

    def _update_bar(self, done: int) -> None:
        bar = self._bar
        total = self._total
        if total and bar.total != total:
            bar.total = total
        if done and not bar.n:
            bar.reset()  # time and rate from the first image on, not from the workers' start-up
            bar.n = bar.last_print_n = bar.initial = done  # the rate starts with the next report, not this jump
        if done > bar.n:
            bar.update(done - bar.n)
        stage = "Writing" if total and done >= total else "Converting" if done else "Starting" if total else "Listing"
        if bar.desc != stage:
            if stage == "Writing":
                # Keep the conversion rate in view; the clock goes on while the shards are finished.
                rate = bar.format_dict.get("rate") or bar.n / max(bar.format_dict["elapsed"], 1e-9)
                bar.bar_format = "{desc}{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}, " \
                                 f"converted at {rate:.1f}img/s]"
            bar.set_description(stage, refresh=False)
        bar.refresh()

    def _loop(self) -> None:
        rate = self._rate
        last_line, last_step = time.monotonic(), 0
        while not self._stop.wait(REFRESH_SECONDS):
            done = self._counts.processed
            if self._bar is not None:
                self._update_bar(done)
                continue
            if not self._total:
                continue  # still listing: no line until there is a total to count against
            now = time.monotonic()
            per_second = rate.add(now, done)
            step = int(done / self._total / LOG_STEP) if self._total else 0
            if now - last_line >= LOG_SECONDS or step > last_step:
                _LOG.info(progress_line(done, self._total, per_second))
                last_line, last_step, self._logged = now, step, done


@contextlib.contextmanager
def show_progress(folder: str | None, total: int | None = None) -> Iterator[None]:
    """Show the progress of a local run whose workers count into `folder` for the block; a no-op without one."""
    if folder is None:
        yield
        return
    with ProgressDisplay(FileCounts(folder), total):
        yield
