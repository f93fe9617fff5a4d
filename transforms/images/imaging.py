"""The conversion of one image: `convert_image` takes a file's bytes through decode, pixels and encode.

No Beam here. `convert_image` either returns the encoded image or raises
`ImageRejected` with a short machine-readable reason; it never lets a decoder
error escape, so one bad file can never fail a job.

The steps, in order, each in its module of `transforms.images`:
  1. identify the format from the bytes (never the file name) and check the
     header before any pixel is decoded (`diagnosis`, `decode.open_image`);
  2. draft a JPEG that will shrink and check the memory the conversion will
     need (`decode`); then reserve it from the worker process's budget of
     `worker_memory_mb` (`transforms.base.memory`), waiting while other
     conversions hold it; it is returned when the conversion ends (here);
  3. decode the first frame, through the fast core for the common case
     (`decode`, `transforms.images.fast`);
  4. to 8-bit RGB (`decode.to_rgb`);
  5. apply the EXIF orientation (`pixels`);
  6. resize (`pixels`);
  7. encode, or store the source's own image data as it is, without its metadata (`encode`).
"""

from __future__ import annotations

import functools
import math
import time
from typing import NamedTuple

from PIL import Image

from transforms.base import memory
from transforms.images import decode, diagnosis, encode, pixels
from transforms.images import fast as fast_imaging
from transforms.images.diagnosis import DECOMPRESSION_BOMB, INTERNAL_ERROR, STALLED_WORKER, TIMEOUT, ImageRejected
from transforms.images.settings import ImageSettings
from transforms.images.stats import ImageStats, image_stats


class EncodedImage(NamedTuple):
    """An encoded output image and the facts the Example records about it."""

    data: bytes
    width: int
    height: int
    format: str  # 'jpeg' or 'png'
    upscaled: bool
    sha256: str = ""  # hex SHA-256 of the source file's bytes, set by transforms.images.convert.read_and_convert
    stats: ImageStats | None = None  # the source's upright size and the stored pixels' sums (transforms.images.stats)
    kept: bool = False  # the source's own image data is stored (`encode.passes_through`): no decode-encode loss
    # Where the source's pixels went (orientation, kept box, output box): what annotations follow
    # (transforms.detection.geometry); set by `convert_image`.
    placement: pixels.Placement | None = None


@functools.cache
def converter_libraries() -> dict[str, str]:
    """The versions of the libraries whose code decides a record's bytes (decoders, resizers, encoders): Pillow and
    the codecs it was built with (libjpeg-turbo, zlib for PNG), simplejpeg, OpenCV, numpy. Part of a resume's plan
    (`pipeline.plan.plan_record`) and of each chunk's done record (`transforms.output.resume.chunk_digest`, on the
    worker that converts it), and recorded in image_tfrecords.json: a chunk converted with other versions is
    converted again, never mixed with this process's."""
    import cv2
    import numpy
    import PIL
    import simplejpeg
    from PIL import features

    def codec(name: str) -> str:
        try:
            return str(features.version(name) or "")
        except Exception:  # noqa: BLE001 - a Pillow that does not know the name: no version to record
            return ""

    return {"pillow": PIL.__version__, "libjpeg_turbo": codec("libjpeg_turbo"), "zlib": codec("zlib"),
            "simplejpeg": simplejpeg.__version__, "opencv": cv2.__version__, "numpy": numpy.__version__}


def _check_deadline(deadline: float | None, stage: str) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise ImageRejected(TIMEOUT, f"over the time limit per image after {stage}")


def convert_image(data: bytes, settings: ImageSettings, deadline: float | None = None) -> EncodedImage:
    """Decode `data` by content and return it upright, RGB, resized and re-encoded.

    `deadline` (a `time.monotonic()` value) makes the conversion give up
    between steps once it has passed; `transforms.images.pool` sets it.

    Raises:
        ImageRejected: for any input that cannot be converted, with its reason.
    """
    try:
        return _convert(data, settings, deadline)
    except ImageRejected:
        raise
    except MemoryError:
        raise ImageRejected(DECOMPRESSION_BOMB, "out of memory while converting the image") from None
    except Exception as e:  # an unforeseen decoder failure rejects this image only
        raise diagnosis.classify(e, "image", data) from None


def _stall_s(settings: ImageSettings) -> float | None:
    """How long a wait for memory may see no conversion end or start: the time limit per image (None: no limit)."""
    limit = settings.timeout_s
    return limit if limit and limit > 0 and math.isfinite(limit) else None


def _acquire(budget: memory.MemoryBudget | None, need: int, settings: ImageSettings) -> float:
    """Reserve `need` bytes of the worker process's budget (--worker_memory_mb); the seconds waited for them.

    Raises:
        ImageRejected: `stalled_worker` when the memory is held by conversions stuck past the time limit.
    """
    if budget is None:
        return 0.0
    try:
        return budget.acquire(need, _stall_s(settings))
    except memory.BudgetStalled as e:
        raise ImageRejected(
            STALLED_WORKER,
            f"not converted: it needs {e.need / 1e6:,.0f} MB of --worker_memory_mb={settings.worker_memory_mb}, "
            f"but for {settings.timeout_s:g} s (the time limit per image) no conversion on this worker returned "
            f"any: {e.holders} earlier image(s) stuck past the time limit hold {e.held / 1e6:,.0f} MB (see their "
            "`timeout` lines). Remove or fix those files and run again",
        ) from None


def _convert(data: bytes, settings: ImageSettings, deadline: float | None) -> EncodedImage:
    image = decode.open_image(data, settings)
    orientation = decode.exif_orientation(image) if image.format in ("JPEG", "MPO") else 1  # JPEG EXIF is in the header
    stored_size = image.size
    box = decode.draft(image, orientation, settings)
    # After the draft: a large JPEG decoded at 1/8 scale needs 1/64 of the memory.
    need = decode.check_memory(image, orientation if image.format in ("JPEG", "MPO") else None, stored_size, settings)
    need += len(data)  # the file's bytes stay in memory until the conversion ends
    budget = memory.budget(settings.worker_memory_bytes)
    waited = _acquire(budget, need, settings)
    try:
        if deadline is not None:
            deadline += waited  # waiting for memory is not the image's fault
        return _decode_and_encode(image, data, orientation, stored_size, box, settings, deadline)
    finally:
        # The pixels go before the memory is given back: Image.load decodes into `image`, which this frame holds
        # until it ends, and a conversion waiting for the memory would decode its own beside them, over the budget.
        image.close()
        if budget is not None:
            budget.release(need)


def _stats(image, source_size: tuple[int, int]) -> ImageStats:
    """The statistics' figures of the stored pixels (a PIL image, or the fast path's RGB array)."""
    if isinstance(image, Image.Image):
        return image_stats(image, source_size)
    sums, squares = fast_imaging.sums_and_squares(image)
    return ImageStats(int(source_size[0]), int(source_size[1]), image.shape[0] * image.shape[1], sums, squares)


def _decode_and_encode(image: Image.Image, data: bytes, orientation: int, stored_size: tuple[int, int], box,
                       settings: ImageSettings, deadline: float | None) -> EncodedImage:
    kind = decode.fast_kind(image, data, settings)
    rgb = None  # the fast core's RGB array, when it decoded the image
    if kind:
        rgb, image, fast_box = decode.fast_pixels(image, data, kind, stored_size, orientation, settings)
        box = fast_box if rgb is not None else box
    if rgb is None:
        image = decode.load(image, data)
    _check_deadline(deadline, "decoding")
    if image.format not in ("JPEG", "MPO"):
        orientation = decode.exif_orientation(image)  # PNG and WebP may keep EXIF after the pixels
    kept = encode.image_data_only(data) if encode.passes_through(image, data, orientation, settings) else None
    if kept is not None:  # upright, at the output size or --resize_mode=none: the placement is the identity
        return EncodedImage(kept, image.width, image.height, "jpeg", False,
                            stats=_stats(image if rgb is None else rgb, image.size), kept=True,
                            placement=pixels.placement(stored_size, orientation, settings))
    try:
        if rgb is None:
            image = decode.to_rgb(image, settings.background)
            image, box = pixels.orient(image, orientation, box)
        else:
            box = pixels.oriented_box(orientation, pixels.size_of(rgb), box)
            image = fast_imaging.orient(rgb, orientation)
        upright_size = stored_size[::-1] if pixels.transposes(orientation) else stored_size
        image, upscaled = pixels.resize(image, box, upright_size, settings)
        _check_deadline(deadline, "resizing")
        stats = _stats(image, upright_size)  # of the pixels as resized, before the encoding's loss
        encoded = encode.encode_image(image, settings)
    except (ImageRejected, MemoryError):
        raise
    except Exception as e:  # the pixels are decoded: what fails now is this code, not the file
        raise ImageRejected(
            INTERNAL_ERROR, f"{type(e).__name__} after decoding: {e} (a bug in the converter: please report it)"
        ) from None
    width, height = pixels.size_of(image)
    placement = pixels.placement(stored_size, orientation, settings)
    if placement.output_size != (width, height):  # the pixels and the annotations must follow one mapping
        raise ImageRejected(INTERNAL_ERROR, f"the output is {width}x{height}, its placement says "
                            "{}x{} (a bug in the converter: please report it)".format(*placement.output_size))
    return EncodedImage(encoded, width, height, settings.image_format, upscaled, stats=stats, placement=placement)
