"""Look at a sample of the input before converting: its image sizes, and the output bytes of an image.

Two samples, both spread evenly over the listing:

* **sizes**: up to `SIZE_SAMPLE` files' pixel sizes, read from their headers
  (Pillow's `Image.open(...).size` parses the header and decodes nothing), so
  the launcher can say *before* converting that most images are smaller than
  --image_size and would be upscaled;
* **bytes per image**: up to `ENCODE_SAMPLE` files read and converted with the
  run's own settings (`transforms.images.convert.read_bytes` and
  `transforms.images.imaging.convert_image`, what the workers run) and built into
  Examples, so that shard counts come from a measured size rather than a guess.

Every read goes through Beam's file systems (local or gs://) on helper threads
with a time limit (`transforms.images.pool.ConversionPool`), and local files that are
not regular files are never opened: a FIFO or a hung mount cannot stall the
launcher. A file that fails is left out of the sample; the run reports it.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import os
import stat
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image

from transforms.base.examples import build_example
from transforms.base.paths import display_path, is_local
from transforms.images.convert import read_bytes, read_head
from transforms.images.decode import DECODED_FORMATS
from transforms.images.imaging import convert_image
from transforms.images.pool import ConversionPool
from transforms.images.settings import ImageSettings

SIZE_SAMPLE = 200  # headers read to learn the input's image sizes
ENCODE_SAMPLE = 12  # images converted to measure the output bytes of one image
SAMPLE_LIMIT_S = 10.0  # per file: a slower read is left out of the sample
SAMPLE_THROTTLED_S = 5.0  # waits on throttling answers per sampled file: the sample is advice, the job waits longer
# The sample's reads from Cloud Storage: one burst of at most SIZE_SAMPLE + ENCODE_SAMPLE reads, before a
# Dataflow job's workers start (beside a local run's). They start at this rate (a tenth of a cold bucket's, or the
# run's own share if higher), not at one of 100 worker processes' shares (50 a second: 200 headers took 4 s), on
# this many threads (a read waits on the network: 200 headers at 100 ms each take 0.6 s).
LAUNCHER_READS_PER_S = 500.0
GCS_SAMPLE_THREADS = 32
HEADER_BYTES = 256 * 1024  # read of each file for its size: headers sit at the start (a TIFF's may not: skipped)
# The launcher converts its sample next to the workers already started: an image that needs more memory or a
# larger file than these is left out of the sample (the workers still convert it within the run's limits).
SAMPLE_MAX_IMAGE_MB = 64
SAMPLE_MAX_FILE_MB = 16
RECORD_FRAMING = 16  # a TFRecord's length, its CRC and the data's CRC


def spread(items: Sequence, count: int) -> list:
    """Up to `count` items spread evenly over `items` (the first, then every len/count-th)."""
    n = len(items)
    if n <= count:
        return list(items)
    return [items[i * n // count] for i in range(count)]


def _readable(path: str) -> bool:
    """A local path must be a regular file (no FIFO or device); gs:// objects always are."""
    if not is_local(path):
        return True
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def launcher_read_rate(settings: ImageSettings) -> float:
    """The first read rate of the launcher's sample reads (LAUNCHER_READS_PER_S, or the run's share if higher)."""
    return max(LAUNCHER_READS_PER_S, settings.reads_per_s_at_start or 0.0)


def header_size(path: str, max_bytes: int = HEADER_BYTES, start_rate: float | None = None) -> tuple[int, int] | None:
    """(width, height) from the image's header, or None when it cannot be read. Decodes no pixels.

    Only the first `max_bytes` of the file are read, so a hostile header (a TIFF
    tag claiming gigabytes) cannot take memory: one whose size is not in them is left out.
    """
    if not _readable(path):
        return None
    try:
        head = read_head(path, max_bytes, SAMPLE_THROTTLED_S, start_rate)
        with Image.open(io.BytesIO(head), formats=DECODED_FORMATS) as image:
            width, height = image.size
    except Exception:  # not an image, unreadable: the conversion rejects it with its reason
        return None
    return (width, height) if width > 0 and height > 0 else None


def _run_all(jobs: list, limit_s: float, threads: int) -> list:
    """Each work function's result, or None when it failed or overran `limit_s`."""
    pool = ConversionPool(limit_s, threads=threads)
    try:
        submitted = [pool.submit(work) for work in jobs]
        results = []
        for job in submitted:
            try:
                results.append(pool.result(job))
            except Exception:
                results.append(None)
        return results
    finally:
        pool.close()


def sample_sizes(paths: Sequence[str], settings: ImageSettings, count: int = SIZE_SAMPLE) -> list[tuple[int, int]]:
    """The header sizes of up to `count` of `paths`, spread over them; unreadable files are left out."""
    chosen = spread(paths, count)
    rate = launcher_read_rate(settings)
    jobs = [lambda _deadline, path=path: header_size(path, start_rate=rate) for path in chosen]
    threads = GCS_SAMPLE_THREADS if any(not is_local(p) for p in chosen[:1]) else 2  # remote reads wait on the network
    return [size for size in _run_all(jobs, SAMPLE_LIMIT_S, threads) if size]


@dataclass(frozen=True)
class OutputSample:
    """What converting a few images with the run's settings gave."""

    images: int  # converted (of those tried)
    record_bytes: int  # their TFRecord records, after --compression
    source_bytes: int  # their files' sizes

    @property
    def bytes_per_image(self) -> float:
        return self.record_bytes / self.images


def measure_output(files: Sequence[tuple[str, str, int]], settings: ImageSettings, schema: str, compression: str,
                   count: int = ENCODE_SAMPLE) -> OutputSample | None:
    """Convert up to `count` of `files` ((path, relpath, size)) as the workers would; None if none converts.

    The records are built with `schema`'s keys and, for gzip, compressed
    together as the shard writer does, so the figure is bytes of a shard.
    """
    chosen = spread(files, count)
    settings = dataclasses.replace(settings, max_image_mb=min(settings.max_image_mb, SAMPLE_MAX_IMAGE_MB),
                                   max_file_mb=min(settings.max_file_mb, SAMPLE_MAX_FILE_MB))

    def work(path, relpath, size):
        def convert(deadline):
            image = convert_image(read_bytes(path, settings.max_file_bytes, size, throttled_s=SAMPLE_THROTTLED_S,
                                             start_rate=launcher_read_rate(settings)), settings, deadline)
            return size, build_example(
                image=image.data, image_format=image.format, label=0, class_name=relpath.split("/")[-2],
                height=image.height, width=image.width, source_path=display_path(relpath), schema=schema,
                sha256="0" * 64,  # the records' hex digest: its size, not its value, matters here
            )
        return convert

    jobs = [work(path, relpath, size) if _readable(path) else (lambda _deadline: None)
            for path, relpath, size in chosen]
    limit = min(settings.timeout_s or SAMPLE_LIMIT_S, SAMPLE_LIMIT_S)
    done = [result for result in _run_all(jobs, limit, threads=2) if result]
    if not done:
        return None
    records = [record for _, record in done]
    record_bytes = sum(len(record) + RECORD_FRAMING for record in records)
    if compression == "gzip":
        record_bytes = len(gzip.compress(b"".join(records), compresslevel=6))
    return OutputSample(images=len(done), record_bytes=record_bytes, source_bytes=sum(size for size, _ in done))


def typical_size(sizes: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The median width and the median height."""
    return (int(statistics.median(w for w, _ in sizes)), int(statistics.median(h for _, h in sizes)))


def smaller_than_output(sizes: Sequence[tuple[int, int]], settings: ImageSettings) -> int:
    """How many of `sizes` the resize mode would enlarge to reach --image_size (both sides smaller)."""
    if settings.resize_mode in ("fit", "none"):
        return 0  # fit never enlarges, none keeps the size
    return sum(1 for w, h in sizes if w < settings.width and h < settings.height)


def size_text(width: int, height: int) -> str:
    return str(width) if width == height else f"{width}x{height}"


def at_size(settings: ImageSettings, width: int, height: int) -> ImageSettings:
    return dataclasses.replace(settings, width=width, height=height)
