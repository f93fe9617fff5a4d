"""ConvertImages: read, decode, resize and encode each image, and wrap it in a tf.train.Example.

Each serialized Example leaves on the output named after its split, ready for
the TFRecord writer: no step between them touches every record again. Bad
images never fail the job: they leave on the REJECTED output with the reason
from the image layer, and are counted. The WRITTEN output carries one count
per (split, label, upscaled) and bundle, for the dataset description. Each
image gets at most --image_timeout_s seconds. Images are read and converted on
--conversion_threads helper threads per DoFn instance (see `transforms.pool`);
results leave in input order. A local file must be a regular file (checked
before opening: a FIFO or a device could block or never end), and no file is
read past --max_file_mb. A read that fails for a moment (429, 5xx, a timeout, a reset
connection) is tried again; one that keeps failing raises `TransientReadError`,
which fails the bundle instead of rejecting the image (see `transforms.transient`).
"""

from __future__ import annotations

import collections
import functools
import os
import stat
import threading

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.gcp import gcsio
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.windowed_value import WindowedValue

from transforms import counters, imaging
from transforms.examples import build_example
from transforms.imaging import (
    DECODE_ERROR,
    FILE_TOO_LARGE,
    NOT_A_REGULAR_FILE,
    READ_ERROR,
    EncodedImage,
    ImageRejected,
    ImageSettings,
)
from transforms.layout import SPLITS, display_path
from transforms.listing import file_kind
from transforms.pool import ConversionPool, time_limit
from transforms.records import ImageRef, Rejection
from transforms.transient import TransientReadError, describe, with_retries

REJECTED = "rejected"
WRITTEN = "written"
_gcs_clients = threading.local()  # one GCS client a conversion thread, reused for every image it reads


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


def read_bytes(path: str, max_bytes: int, size: int | None = None, deadline: float | None = None) -> bytes:
    """The whole file at `path` (local or gs://), if it is at most `max_bytes`.

    `size` is the size the listing gave. Never reads more than `max_bytes` + 1
    bytes, so a file that grew, or one that reports no size, cannot fill memory.
    A read that fails with a transient error (429, 5xx, a timeout, a reset
    connection) is tried again with backoff, within the image's `deadline`
    (see `transforms.transient`).

    Raises:
        ImageRejected: `not_a_regular_file` (local paths), `file_too_large`.
        TransientReadError: the read still failed with a transient error after every retry.
        OSError, google.api_core.exceptions.GoogleAPICallError: any other read error (a missing file, 403, ...).
    """
    if FileSystems.get_scheme(path) is None:  # a local path
        size = check_regular_file(path)
    if size is not None and size > max_bytes:
        raise _too_large(size, max_bytes, "the file has")
    if FileSystems.get_scheme(path) == "gs":
        read = functools.partial(_read_gcs, path, max_bytes)
    else:
        read = lambda _timeout: _read_file(path, max_bytes, size)  # noqa: E731
    data = with_retries(read, path, deadline)
    if len(data) > max_bytes:
        raise _too_large(len(data), max_bytes, "reading stopped at")
    return data


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
    return _gcs_client(path).bucket(bucket).blob(name).download_as_bytes(
        start=0, end=max_bytes, raw_download=True, checksum=None, retry=None, timeout=timeout)


def _gcs_client(path: str):
    """The GCS client of this thread, made once from Beam's GCS file system (as its open() makes one per call).

    A client per image would open a new connection (and TLS session) for every image. The client is
    keyed by the storage host, which tests point at an emulator or a proxy.
    """
    key = os.environ.get("STORAGE_EMULATOR_HOST")
    cached = getattr(_gcs_clients, "by_host", None)
    if cached is None:
        cached = _gcs_clients.by_host = {}
    if key not in cached:
        cached[key] = FileSystems.get_filesystem(path)._gcsIO().client  # Beam 2.77's private accessor
    return cached[key]


def read_and_convert(path: str, settings: ImageSettings, deadline: float | None, size: int | None = None
                     ) -> EncodedImage:
    """Read one file (listed with `size` bytes) and convert it.

    Raises:
        ImageRejected: `read_error` when the file cannot be read (missing, not allowed, ...),
            `not_a_regular_file`, `file_too_large`, or the image layer's reason.
        TransientReadError: the read kept failing with transient errors: not the file's fault,
            so the bundle fails (and is retried) instead of the image becoming a rejection.
    """
    try:
        data = read_bytes(path, settings.max_file_bytes, size, deadline)
    except (ImageRejected, TransientReadError):
        raise
    except Exception as e:  # a vanished or unreadable file is this file's problem only
        raise ImageRejected(READ_ERROR, describe(e, limit=1000)) from None
    return imaging.convert_image(data, settings, deadline)


class _ConvertImage(beam.DoFn):
    def __init__(self, settings: ImageSettings, schema: str, threads: int):
        self._settings = settings
        self._schema = schema
        self._threads = threads
        self._pool: ConversionPool | None = None
        self._pending: collections.deque = collections.deque()

    def setup(self):
        self._pool = ConversionPool(time_limit(self._settings), threads=self._threads)

    def start_bundle(self):
        self._pending.clear()
        # (split, label, upscaled) -> records emitted in this bundle
        self._written: collections.Counter = collections.Counter()

    def process(self, ref: ImageRef, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam):
        job = self._pool.submit(functools.partial(read_and_convert, ref.path, self._settings, size=ref.size))
        self._pending.append((ref, job, timestamp, window))
        # Keep one image queued behind every busy helper; emit finished ones in input order.
        while len(self._pending) > 2 * self._threads or (self._pending and self._pending[0][1].done.is_set()):
            ref, job, _, _ = self._pending.popleft()
            yield self._outcome(ref, job)

    def finish_bundle(self):
        while self._pending:
            ref, job, timestamp, window = self._pending.popleft()
            output = self._outcome(ref, job)
            yield beam.pvalue.TaggedOutput(output.tag, WindowedValue(output.value, timestamp, [window]))
        for key, count in self._written.items():
            # ((split, label, upscaled), records)
            yield beam.pvalue.TaggedOutput(WRITTEN, GlobalWindows.windowed_value((key, count)))

    def teardown(self):
        if self._pool is not None:
            self._pool.close()

    def _outcome(self, ref: ImageRef, job) -> beam.pvalue.TaggedOutput:
        """The serialized Example for `ref` on its split's output, or its Rejection on REJECTED."""
        try:
            image = self._pool.result(job)
        except ImageRejected as e:
            return self._reject(ref, e.reason, e.detail)
        except TransientReadError:
            raise  # not the image's fault: the bundle fails, and is retried, instead of the image being rejected
        except Exception as e:  # convert_image maps every decoder error; this is a last line of defence
            return self._reject(ref, DECODE_ERROR, f"{type(e).__name__}: {e}")
        serialized = build_example(
            image=image.data,
            image_format=image.format,
            label=ref.label,
            class_name=ref.class_name,
            height=image.height,
            width=image.width,
            source_path=display_path(ref.relpath),
            schema=self._schema,
        )
        counters.inc("images_converted")
        self._written[(ref.split, ref.label, image.upscaled)] += 1
        return beam.pvalue.TaggedOutput(ref.split, serialized)

    @staticmethod
    def _reject(ref: ImageRef, reason: str, detail: str):
        counters.inc(f"rejected_{reason}")
        return beam.pvalue.TaggedOutput(REJECTED, Rejection(ref.relpath, "rejected", reason, detail))


class ConvertImages(beam.PTransform):
    """ImageRef -> serialized tf.train.Example bytes on one output per split.

    Outputs, by tag: each split in `SPLITS` (bytes), REJECTED (Rejection) and
    WRITTEN (((split, label, upscaled), records), a few per bundle).
    """

    def __init__(self, settings: ImageSettings, schema: str, threads: int = 2):
        super().__init__()
        self._fn = _ConvertImage(settings, schema, threads)

    def expand(self, refs):
        return refs | "ConvertImage" >> beam.ParDo(self._fn).with_outputs(*SPLITS, REJECTED, WRITTEN)
