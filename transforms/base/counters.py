"""Beam counters under one namespace, so a job's progress reads the same locally and on Dataflow.

A local run's launcher names a folder in PROGRESS_DIR_ENV before it starts its
workers; each worker process then also keeps its own two totals of the images
(left conversion, labelled for conversion) and writes them to a small file of
its own there, a few times a second, for the progress line
(`pipeline.local.progress`). No Beam internals are involved: a change of Beam
can only cost the progress line, never the run. Dataflow workers have no such
folder, and the Dataflow console shows the counters themselves.
"""

import os
import threading

from apache_beam.metrics import Metrics

NAMESPACE = "image_tfrecords"
# The counters the progress line adds up (pipeline/local/progress.py): an image leaves conversion either converted
# or rejected (under a name `rejected(reason)` gives), out of the images labelled for conversion.
CONVERTED = "images_converted"
RESUMED = "images_resumed"  # records taken, checked, from an interrupted run's chunks (output.resume)
TO_CONVERT = "images_to_convert"  # counted by AssignLabels (or the manifest's labels): the job's own total
_REJECTED_PREFIX = "rejected_"
_counters = {}


def rejected(reason: str) -> str:
    """The counter of the images rejected for `reason` after they were labelled for conversion."""
    return _REJECTED_PREFIX + reason


def leaves_conversion(name: str) -> bool:
    """Whether counter `name` counts images that left conversion (converted, resumed, or rejected after labelling)."""
    return name in (CONVERTED, RESUMED) or name.startswith(_REJECTED_PREFIX)


def inc(name: str, value: int = 1) -> None:
    counter = _counters.get(name)
    if counter is None:
        counter = _counters[name] = Metrics.counter(NAMESPACE, name)
    counter.inc(value)
    progress = _progress()
    if progress is not None:
        if leaves_conversion(name):
            progress.add(value, 0)
        elif name == TO_CONVERT:
            progress.add(0, value)


PROGRESS_DIR_ENV = "IMAGE_TFRECORDS_PROGRESS_DIR"
PROGRESS_SECONDS = 0.25  # how often a worker writes its totals, when they changed
PROGRESS_SUFFIX = ".progress"


class _Progress:
    """This process's totals for the local progress line, written to `<folder>/<pid>.progress` ("done planned")."""

    def __init__(self, folder: str) -> None:
        self._path = os.path.join(folder, f"{os.getpid()}{PROGRESS_SUFFIX}")
        self._lock = threading.Lock()
        self._counts = [0, 0]
        self._written = (0, 0)
        self._wake = threading.Event()
        threading.Thread(target=self._loop, name="progress-counts", daemon=True).start()

    def add(self, done: int, planned: int) -> None:
        with self._lock:
            self._counts[0] += done
            self._counts[1] += planned

    def flush(self) -> None:
        with self._lock:
            counts = tuple(self._counts)
        if counts == self._written:
            return
        try:
            temporary = f"{self._path}.{threading.get_ident()}.tmp"
            with open(temporary, "w", encoding="ascii") as out:
                out.write(f"{counts[0]} {counts[1]}\n")
            os.replace(temporary, self._path)  # the launcher never reads half a file
            self._written = counts
        except OSError:
            pass  # the folder is gone (the run ended) or the disk is full: only the progress line misses it

    def _loop(self) -> None:
        while True:
            self._wake.wait(PROGRESS_SECONDS)
            self.flush()


_progress_state: tuple = (None, None)  # (pid, _Progress or None) of this process


def _progress():
    global _progress_state
    pid, progress = _progress_state
    if pid != os.getpid():  # first use in this process (a forked worker inherits its launcher's state)
        folder = os.environ.get(PROGRESS_DIR_ENV)
        progress = _Progress(folder) if folder and os.path.isdir(folder) else None
        _progress_state = os.getpid(), progress
    return progress


def flush_progress() -> None:
    """Write this process's totals now (at the end of a bundle), if it keeps them for a local progress line."""
    pid, progress = _progress_state
    if progress is not None and pid == os.getpid():
        progress.flush()
