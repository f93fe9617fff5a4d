"""Converting images: read each file, decode, resize and encode it, and wrap it in a tf.train.Example.

Plain functions, no Beam: `transforms.output.write` starts a chunk's conversions with
`start_conversions` and writes them as `collect_in_order` gives them. Bad images never fail the
job: they come out as a Rejection with the reason from the image layer, and
are counted. Each image gets at most --image_timeout_s seconds. Images are read
and converted on helper threads (see `transforms.images.pool`): --conversion_threads
convert at once in a worker process, and more read ahead of them, as many as the
read latency asks for (`ReadPacing`); outcomes come out in input order. A local file must be a regular file (checked
before opening: a FIFO or a device could block or never end), and no file is
read past --max_file_mb. A read that fails for a moment (429, 5xx, a timeout, a reset
connection) is tried again; one that keeps failing raises `TransientReadError`,
which fails the bundle instead of rejecting the image (see `transforms.base.transient`).
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from apache_beam.io.filesystems import FileSystems
from apache_beam.io.gcp import gcsio

from transforms.base import counters, gcs, memory
from transforms.base.examples import build_example
from transforms.base.paths import display_path, file_kind, is_gcs, is_local
from transforms.base.records import ImageRef, Rejection
from transforms.base.transient import THROTTLED_RETRY_S, TransientReadError, describe, with_retries
from transforms.images import imaging
from transforms.images.diagnosis import DECODE_ERROR, FILE_TOO_LARGE, NOT_A_REGULAR_FILE, READ_ERROR, ImageRejected
from transforms.images.imaging import EncodedImage
from transforms.images.pool import ConversionPool, Job, core_slot, time_limit
from transforms.images.settings import ImageSettings
from transforms.images.stats import ImageStats


def check_regular_file(path: str) -> int:
    """The size of the local file at `path` (symbolic links followed), which must be a regular file.

    Checked before opening: reading a FIFO or a device (a link to /dev/zero, say)
    can block forever or never end.

    Raises:
        ImageRejected: `not_a_regular_file`; OSError when `path` cannot be looked at.
    """
    info = os.stat(path)
    mode = info.st_mode
    if not stat.S_ISREG(mode):
        kind = file_kind(mode)
        raise ImageRejected(NOT_A_REGULAR_FILE, f"the path is {kind}, not a regular file: it is not opened")
    return info.st_size


def _too_large(size: int, limit: int, how: str) -> ImageRejected:
    return ImageRejected(
        FILE_TOO_LARGE,
        f"{how} {size:,} bytes, over --max_file_mb={limit // 1_000_000} ({limit:,} bytes); "
        "raise it to convert this file",
    )


def read_bytes(path: str, max_bytes: int, size: int | None = None, deadline: float | None = None,
               throttled_s: float = THROTTLED_RETRY_S, start_rate: float | None = None) -> bytes:
    """The whole file at `path` (local or gs://), if it is at most `max_bytes`.

    `size` is the size the listing gave. Never reads more than `max_bytes` + 1
    bytes, so a file that grew, or one that reports no size, cannot fill memory.
    A read that fails with a transient error (429, 5xx, a timeout, a reset
    connection) is tried again with backoff, within the image's `deadline`
    (see `transforms.base.transient`), at this process's read rate (which starts at `start_rate`).

    Raises:
        ImageRejected: `not_a_regular_file` (local paths), `file_too_large`.
        TransientReadError: the read still failed with a transient error after every retry.
        OSError, google.api_core.exceptions.GoogleAPICallError: any other read error (a missing file, 403, ...).
    """
    if is_local(path):
        size = check_regular_file(path)
    if size is not None and size > max_bytes:
        raise _too_large(size, max_bytes, "the file has")
    if is_gcs(path):
        read = functools.partial(_read_gcs, path, max_bytes)
    else:
        read = lambda _timeout: _read_file(path, max_bytes, size)  # noqa: E731
    data = with_retries(read, path, deadline, throttled_s, start_rate=start_rate)
    if len(data) > max_bytes:
        raise _too_large(len(data), max_bytes, "reading stopped at")
    return data


def read_head(path: str, count: int, throttled_s: float = THROTTLED_RETRY_S, start_rate: float | None = None
              ) -> bytes:
    """The first `count` bytes of the file at `path` (local or gs://): on GCS one ranged GET of just those.

    Beam's GCS reader would fetch its whole 16 MiB buffer for them. A transient
    error is retried as an image read is (`transforms.base.transient`), a fixed number of times, at this
    process's read rate (which starts at `start_rate`).
    """
    if is_gcs(path):
        bucket, name = gcsio.parse_gcs_path(path)

        def head(timeout: float) -> bytes:
            return gcs.client().bucket(bucket).blob(name).download_as_bytes(
                start=0, end=count - 1, raw_download=True, checksum=None, retry=None, timeout=timeout)

        return with_retries(head, path, throttled_s=throttled_s, start_rate=start_rate)
    with FileSystems.open(path, compression_type="uncompressed") as f:
        return f.read(count)


def _read_file(path: str, max_bytes: int, size: int | None) -> bytes:
    """Up to `max_bytes` + 1 bytes of `path` through Beam's file systems."""
    first = max_bytes if size is None else min(size, max_bytes)
    with FileSystems.open(path, compression_type="uncompressed") as f:
        parts = [f.read(first + 1)]
        total = len(parts[0])
        while first < total <= max_bytes:  # the file grew since it was listed: read on, up to the limit
            part = f.read(min(1 << 20, max_bytes + 1 - total))
            if not part:
                break
            parts.append(part)
            total += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _read_gcs(path: str, max_bytes: int, timeout: float) -> bytes:
    """Up to `max_bytes` + 1 bytes of the object at gs:// `path`: one ranged GET, not retried here.

    Beam's FileSystems.open would retry inside for up to 120 s (google-cloud-storage's
    default), past the image's time limit, and then the image would be rejected as
    `timeout`; `with_retries` retries instead, within it. The client is the one
    Beam's GCS file system uses (the run's credentials, --no_auth, STORAGE_EMULATOR_HOST),
    and the bytes are the object's stored bytes, as Beam reads them (raw_download).
    """
    bucket, name = gcsio.parse_gcs_path(path)
    return gcs.client().bucket(bucket).blob(name).download_as_bytes(
        start=0, end=max_bytes, raw_download=True, checksum=None, retry=None, timeout=timeout)


def read_room(settings: ImageSettings) -> int:
    """The bytes of files that may be held, read ahead of their conversions, in one worker process: the budget less
    the most one conversion may need (`transforms.base.memory.MemoryBudget.hold_for_read`); 0 with no budget."""
    if not settings.worker_memory_bytes:
        return 0
    return max(0, settings.worker_memory_bytes - settings.max_image_bytes - settings.max_file_bytes)


class ReadPacing:
    """How many helpers keep `slots` conversions busy: as many as wait on reads, from the measured seconds of a
    read and of a conversion (Little's law), so reads in flight follow the read latency, not the core count."""

    _WEIGHT = 0.1  # of each new measurement in the running averages

    def __init__(self, slots: int, most: int = 64):
        self.slots = max(1, slots)
        self.most = max(self.slots, most)
        self._read_s: float | None = None
        self._convert_s: float | None = None

    def add(self, read_s: float, convert_s: float) -> None:
        """One image's read and conversion times (helpers call this; a lost update under a race is harmless)."""
        if self._read_s is None:
            self._read_s, self._convert_s = read_s, convert_s
            return
        self._read_s += self._WEIGHT * (read_s - self._read_s)
        self._convert_s += self._WEIGHT * (convert_s - self._convert_s)

    def helpers(self) -> int:
        """Helpers for the slots and the reads that keep them fed: slots + slots x read / conversion time."""
        if self._read_s is None:
            return self.slots
        reading = math.ceil(self.slots * self._read_s / max(self._convert_s, 1e-4))
        return min(self.most, self.slots + max(1, reading))


WINDOWS_PATH_HINT = "the path holds '\\' separators (Windows); write paths with '/'"


def windows_path_hint(path: str, error: Exception) -> str:
    """'; the path holds '\\' separators ...' when a file that is not found has a backslash in its path (a
    manifest written on Windows), else ''."""
    missing = isinstance(error, FileNotFoundError) or type(error).__name__ == "NotFound" or \
        getattr(error, "code", None) == 404
    return f"; {WINDOWS_PATH_HINT}" if missing and "\\" in path else ""


def read_and_convert(path: str, settings: ImageSettings, deadline: float | None, size: int | None = None,
                     slots: int | None = None, pacing: ReadPacing | None = None) -> EncodedImage:
    """Read one file (listed with `size` bytes) and convert it; the result carries the SHA-256 of the bytes read.

    The file's listed bytes are held from the worker process's memory budget
    while it is read ahead (`read_room`); the conversion itself then takes one
    of the process's `slots` places for CPU work (`transforms.images.pool.core_slot`),
    so that more helpers can read than convert. Neither wait counts against the
    image's time limit. `pacing` gets the read's and the conversion's times.

    Raises:
        ImageRejected: `read_error` when the file cannot be read (missing, not allowed, ...),
            `not_a_regular_file`, `file_too_large`, or the image layer's reason.
        TransientReadError: the read kept failing with transient errors: not the file's fault,
            so the bundle fails (and is retried) instead of the image becoming a rejection.
    """
    budget = memory.budget(settings.worker_memory_bytes)
    held, waited = False, 0.0
    if budget is not None:
        held, waited = budget.hold_for_read(size or 0, read_room(settings), time_limit(settings))
    try:
        if deadline is not None:
            deadline += waited
        started = time.monotonic()
        job = memory.current_job()
        paused_before = job.memory_waited if job is not None else 0.0
        try:
            data = read_bytes(path, settings.max_file_bytes, size, deadline, settings.throttled_retry_s,
                              settings.reads_per_s_at_start)
        except (ImageRejected, TransientReadError):
            raise
        except Exception as e:  # a vanished or unreadable file is this file's problem only
            raise ImageRejected(READ_ERROR, describe(e, limit=1000) + windows_path_hint(path, e)) from None
        if deadline is not None and job is not None:  # waits for the read rate or a throttled store: not its time
            deadline += job.memory_waited - paused_before
        read_s = time.monotonic() - started
        digest = hashlib.sha256(data).hexdigest()  # the bytes already read: exact duplicates are found by this
        with core_slot(slots) as waited:
            if held:  # the conversion reserves the file's bytes with the rest of what it needs
                budget.release_read(size)
                held = False
            if deadline is not None:
                deadline += waited
            started = time.monotonic()
            try:
                image = imaging.convert_image(data, settings, deadline)
            except ImageRejected as e:  # read whole, then refused: its SHA-256 is known (output/resume.py)
                e.sha256 = digest
                raise
            if pacing is not None:
                pacing.add(read_s, time.monotonic() - started)
        return image._replace(sha256=digest)
    finally:
        if held:
            budget.release_read(size)


class Built(NamedTuple):
    """What a record builder other than the classification one (`build` of `start_conversions`: a detection
    record, transforms.detection.conversion) made of one converted image, on the helper that converted it: its
    serialized Example, or the Rejection that skips it instead (`skipped`); the objects it holds, and what it set
    aside (Rejections of stage 'annotation': not images)."""

    image: EncodedImage
    example: bytes | None
    objects: int = 0
    set_aside: tuple = ()
    skipped: Rejection | None = None
    classes: tuple = ()  # the class name of each object it holds, in order


class Converted(NamedTuple):
    """One image's outcome: its serialized Example, whether it was upscaled, its source's SHA-256; or its Rejection
    (with its source's SHA-256 when it was read whole before it was refused, else '')."""

    ref: ImageRef
    example: bytes | None
    upscaled: bool
    rejection: Rejection | None
    sha256: str = ""
    stats: ImageStats | None = None  # its source's size and its stored pixels' sums (transforms.images.stats)
    kept: bool = False  # its source's own bytes were stored (already at the output size)
    objects: int | None = None  # a detection record's objects (Built.objects); None for a classification record
    set_aside: tuple = ()  # Built.set_aside: its annotations that are not in the record
    classes: tuple = ()  # Built.classes: its objects' class names


def convert_in_order(pool: ConversionPool, refs: Iterable[ImageRef], settings: ImageSettings, schema: str
                     ) -> Iterator[Converted]:
    """Convert `refs` on the pool's helpers, a few ahead, and yield each outcome in the order of `refs`.

    Bad images come out as a Rejection with the image layer's reason, counted;
    a read that keeps failing with a transient error raises `TransientReadError`
    (the bundle fails and is retried: the image is not the problem).
    """
    return collect_in_order(pool, pool.in_order(refs, lambda ref: _work(ref, settings)), schema)


def start_conversions(pool: ConversionPool, refs: Iterable[ImageRef], settings: ImageSettings,
                      slots: int | None = None, pacing: ReadPacing | None = None,
                      build: Callable[[ImageRef, EncodedImage], Built] | None = None) -> list[tuple[ImageRef, Job]]:
    """Submit every one of `refs` to the pool at once (references only: a job reads its file once a helper takes
    it); collect the outcomes, in order, with `collect_in_order`. See `read_and_convert` for `slots` and `pacing`.
    `build`: the record of each converted image is made by it, on the same helper (a detection record), instead
    of the classification Example `collect_in_order` builds."""
    return [(ref, pool.submit(_work(ref, settings, slots, pacing, build))) for ref in refs]


def _work(ref: ImageRef, settings: ImageSettings, slots: int | None = None, pacing: ReadPacing | None = None,
          build: Callable[[ImageRef, EncodedImage], Built] | None = None):
    convert = functools.partial(read_and_convert, ref.path, settings, size=ref.size, slots=slots, pacing=pacing)
    return convert if build is None else functools.partial(_convert_and_build, convert, build, ref)


def _convert_and_build(convert, build, ref: ImageRef, deadline: float | None) -> Built:
    return build(ref, convert(deadline))


def collect_in_order(pool: ConversionPool, jobs: Iterable[tuple[ImageRef, Job]], schema: str
                     ) -> Iterator[Converted]:
    """Each (ref, job)'s outcome, in order: a Converted with its serialized Example, or with its Rejection.

    Raises:
        TransientReadError: a read kept failing with a transient error.
    """
    for ref, job in jobs:
        try:
            image = pool.result(job)
        except ImageRejected as e:
            yield _rejected(ref, e.reason, e.detail, getattr(e, "sha256", ""))
            continue
        except TransientReadError:
            raise  # not the image's fault: the bundle fails, and is retried, instead of the image being rejected
        except Exception as e:  # convert_image maps every decoder error; this is a last line of defence
            yield _rejected(ref, DECODE_ERROR, f"{type(e).__name__}: {e}")
            continue
        if isinstance(image, Built):  # made by `build` on the helper (start_conversions)
            built, image = image, image.image
            if built.skipped is not None:
                counters.inc(counters.rejected(built.skipped.reason))  # it leaves conversion (the progress line)
                yield Converted(ref, None, False, built.skipped, image.sha256, set_aside=built.set_aside)
                continue
            counters.inc(counters.CONVERTED)
            yield Converted(ref, built.example, image.upscaled, None, image.sha256, stats=image.stats,
                            kept=image.kept, objects=built.objects, set_aside=built.set_aside,
                            classes=built.classes)
            continue
        serialized = build_example(
            image=image.data,
            image_format=image.format,
            label=ref.label,
            class_name=ref.class_name,
            height=image.height,
            width=image.width,
            source_path=display_path(ref.relpath),
            schema=schema,
            sha256=image.sha256,
            labels=ref.labels,
            label_names=ref.label_names,
            extras=ref.extras,
        )
        counters.inc(counters.CONVERTED)
        yield Converted(ref, serialized, image.upscaled, None, image.sha256, stats=image.stats, kept=image.kept)


def _rejected(ref: ImageRef, reason: str, detail: str, sha256: str = "") -> Converted:
    """`sha256`: of the file's bytes, when they were read whole before the image was refused; '' when not."""
    counters.inc(counters.rejected(reason))
    return Converted(ref, None, False, Rejection(ref.relpath, "rejected", reason, detail), sha256)
