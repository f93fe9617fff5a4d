"""Live progress of a local run: images converted out of the total, the rate and an ETA.

The local runner is Beam's FnApiRunner, which lives in the launcher process and
drives worker subprocesses over the Fn API control plane. It already asks each
running bundle for its progress every `progress_request_frequency` seconds, and
the workers answer with the bundle's metrics so far, user counters included
(`images_converted`, `rejected_<reason>` of transforms/images/convert.py). The runner
only throws those answers away: `BundleManager` builds its `ProgressRequester`
without the callback the class supports. `observe_bundles()` supplies that
callback, and reads each finished bundle's final counters, for the duration of
one run. No data leaves the Beam graph and the workers are not touched.

On a terminal the counts drive a tqdm bar; otherwise (a pipe, a file, a
scheduler's log) they become a plain log line every few seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator

from apache_beam.metrics import monitoring_infos as mi
from apache_beam.runners.portability.fn_api_runner import fn_runner

from transforms.base import counters
from transforms.base.counters import NAMESPACE

_LOG = logging.getLogger("pipeline.progress")

# How often the runner polls each running bundle, and how often the display redraws.
REQUEST_SECONDS = 1.0
REFRESH_SECONDS = 0.5
# Plain log lines: one every LOG_SECONDS, and one whenever another LOG_STEP of the images is done.
LOG_SECONDS = 10.0
LOG_STEP = 0.1



def processed_images(infos: Iterable) -> int:
    """Images that left conversion (converted or rejected), from one bundle's monitoring infos."""
    return bundle_counts(infos)[0]


def bundle_counts(infos: Iterable) -> tuple[int, int]:
    """(images converted or rejected, images labelled for conversion) in one bundle's monitoring infos."""
    processed = planned = 0
    for info in infos:
        if info.urn != mi.USER_COUNTER_URN or info.labels.get(mi.NAMESPACE_LABEL) != NAMESPACE:
            continue
        name = info.labels.get(mi.NAME_LABEL, "")
        if counters.leaves_conversion(name):
            processed += mi.extract_counter_value(info)
        elif name == counters.TO_CONVERT:
            planned += mi.extract_counter_value(info)
    return processed, planned


class BundleCounts:
    """Thread-safe sum of processed images over finished bundles and the latest report of running ones."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}
        self._finished: set[str] = set()
        self._finished_total = 0
        self._planned = 0  # from finished bundles only: a total must not move backwards

    def running(self, instruction_id: str, infos: Iterable) -> None:
        count = processed_images(infos)
        with self._lock:
            if instruction_id in self._finished:
                return  # a late answer of a bundle already counted in full
            # A bundle that has just finished answers with no metrics: keep its last count.
            self._running[instruction_id] = max(count, self._running.get(instruction_id, 0))

    def finished(self, instruction_id: str, infos: Iterable) -> None:
        count, planned = bundle_counts(infos)
        with self._lock:
            self._running.pop(instruction_id, None)
            if instruction_id not in self._finished:
                self._finished.add(instruction_id)
                self._finished_total += count
                self._planned += planned

    @property
    def processed(self) -> int:
        with self._lock:
            return self._finished_total + sum(self._running.values())

    @property
    def planned(self) -> int:
        """Images the job has listed and labelled for conversion so far (its total once listing has ended)."""
        with self._lock:
            return self._planned


@contextlib.contextmanager
def observe_bundles(counts: BundleCounts) -> Iterator[bool]:
    """Feed `counts` from every bundle the FnApiRunner runs inside the block; yields whether it could.

    Beam is pinned to one minor release (setup.py); should its internals move,
    the run goes on without live counts rather than failing.
    """
    requester = getattr(fn_runner, "ProgressRequester", None)
    manager = getattr(fn_runner, "BundleManager", None)
    process_bundle = getattr(manager, "process_bundle", None)
    if requester is None or process_bundle is None:
        _LOG.debug("FnApiRunner has no ProgressRequester/BundleManager hook; no live progress")
        yield False
        return

    class _CountingRequester(requester):
        def __init__(self, worker_handler, instruction_id, frequency, callback=None):
            def report(progress):
                counts.running(instruction_id, progress.monitoring_infos)
                if callback:
                    callback(progress)

            super().__init__(worker_handler, instruction_id, frequency, callback=report)

    def counting_process_bundle(self, *args, **kwargs):
        result, split_results = process_bundle(self, *args, **kwargs)
        counts.finished(result.instruction_id, result.process_bundle.monitoring_infos)
        return result, split_results

    fn_runner.ProgressRequester = _CountingRequester
    manager.process_bundle = counting_process_bundle
    try:
        yield True
    finally:
        fn_runner.ProgressRequester = requester
        manager.process_bundle = process_bundle


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

    def __init__(self, counts: BundleCounts, total: int | None = None, stream=None, interactive: bool | None = None):
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
def show_progress(runner, total: int | None = None, enabled: bool = True) -> Iterator[None]:
    """Show the progress of a local run for the duration of the block; a no-op when disabled or remote."""
    if not enabled or not isinstance(runner, fn_runner.FnApiRunner):
        yield
        return
    counts = BundleCounts()
    with observe_bundles(counts) as observed:
        if not observed:
            yield
            return
        with ProgressDisplay(counts, total):
            yield
