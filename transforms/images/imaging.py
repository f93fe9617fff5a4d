"""Plain image functions: decode any supported image by content, orient, flatten, resize, encode.

No Beam here. `convert_image` either returns the encoded image or raises
`ImageRejected` with a short machine-readable reason; it never lets a decoder
error escape, so one bad file can never fail a job.

The steps, in order:
  1. identify the format from the bytes (never the file name) and check the
     declared size against `max_pixels` before any pixel is decoded (and a
     TIFF's strip count and directory size before Pillow reads them);
  2. for a JPEG that will shrink, ask libjpeg for a scaled-down decode (draft
     mode: 1/2, 1/4 or 1/8 in the DCT), which is fast and needs little memory;
     then check the memory the conversion will need (`working_bytes`) against
     `max_image_mb`, and reserve it from the worker process's budget of
     `worker_memory_mb` (`transforms.base.memory`), waiting while other conversions
     hold it; it is returned when the conversion ends;
  3. decode the first frame; a short or corrupt stream is rejected, never padded;
  4. scale 16-bit and float samples to 8 bits, fix CMYK polarity, composite
     alpha onto the background, giving RGB;
  5. apply the EXIF orientation;
  6. resize (stretch, crop, pad, fit or none), reducing in integer steps first;
  7. encode as JPEG or PNG, with no metadata (so no orientation tag).
"""

from __future__ import annotations

import io
import math
import time
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from PIL import ExifTags, Image, ImageFile, UnidentifiedImageError

from transforms.base import memory
from transforms.base.dataset_format import DEFAULT_MAX_IMAGE_MB, DEFAULT_MAX_PIXELS
from transforms.images import fast as fast_imaging
from transforms.images.stats import ImageStats, image_stats

# Truncated files are rejected, never padded with grey.
ImageFile.LOAD_TRUNCATED_IMAGES = False
# A broken EXIF block is ignored (see `_orientation`); Pillow's warning about it
# would only print noise on the user's terminal, once per such file.
warnings.filterwarnings("ignore", message="(Corrupt EXIF data|Truncated File Read)", category=UserWarning,
                        module="PIL.TiffImagePlugin")
# Pillow's own process-wide bomb check warns at 89 MP and refuses at 179 MP
# whatever --max_pixels says; `_open` applies --max_pixels instead.
Image.MAX_IMAGE_PIXELS = None

RESIZE_MODES = ("stretch", "crop", "pad", "fit", "none")
RESAMPLE_FILTERS = {
    "bilinear": Image.Resampling.BILINEAR,
    "area": Image.Resampling.BOX,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}
IMAGE_FORMATS = ("jpeg", "png")
IMAGE_BACKENDS = ("auto", "pillow")
CHROMA_SUBSAMPLING = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2}

# Formats decoded, by Pillow's format name. An MPO (a JPEG with more images
# appended) is opened by the JPEG plugin, which reports format "MPO".
DECODED_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "DIB", "TIFF", "WEBP")

# Rejection reasons: short, stable, machine-readable.
EMPTY_FILE = "empty_file"
NOT_AN_IMAGE = "not_an_image"
UNSUPPORTED_FORMAT = "unsupported_format"
TRUNCATED = "truncated"
DECOMPRESSION_BOMB = "decompression_bomb"
DECODE_ERROR = "decode_error"
READ_ERROR = "read_error"
TIMEOUT = "timeout"
INTERNAL_ERROR = "internal_error"  # a bug here, not a problem of the file: report it
TOO_LARGE_FOR_JPEG = "too_large_for_jpeg"
NOT_A_REGULAR_FILE = "not_a_regular_file"  # a FIFO, socket or device: never opened, as a read could block forever
FILE_TOO_LARGE = "file_too_large"  # over --max_file_mb: never read past the limit
IMAGE_TOO_LARGE_IN_MEMORY = "image_too_large_in_memory"  # converting would need more than --max_image_mb
TIFF_LAYOUT_TOO_LARGE = "tiff_layout_too_large"  # over MAX_TIFF_STRIPS strips or tiles, or MAX_TIFF_NUMBERS numbers
STALLED_WORKER = "stalled_worker"  # not tried: this worker's threads are all stuck in earlier images
JPEG_MAX_SIDE = 65500  # the JPEG format's own limit on either side

# Pillow keeps every strip or tile of a TIFF as a Python object (a few hundred bytes, and
# microseconds, each) before it decodes any pixel: 4 million one-row strips in a 32 MB file
# took 1.5 GB and 42 s. Real TIFFs use strips of 8-64 kB or tiles of 256x256 pixels: a
# 179-megapixel image in 64 kB strips has about 8,000.
MAX_TIFF_STRIPS = 65_536
# The same for the numbers in a TIFF directory's other tags (a colour map or transfer
# function of a 16-bit image has 196,608; private tags can hold millions, each a Python int).
MAX_TIFF_NUMBERS = 1_000_000

# Draft-decode a JPEG to at least this many times the pixels the output needs
# along each side, then let resize() reduce by whole factors until it is within
# this many times the output size: fast, and no visible loss (54-58 dB PSNR
# against a full decode and resize, measured on 3000x2000 photo-like JPEGs).
REDUCING_GAP = 2.0

# EXIF orientation -> the transpose that makes the image upright.
_ORIENTATION_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}

# Formats recognised by their first bytes but not decoded here, for a clearer reason than not_an_image.
_OTHER_FORMATS = (
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG 2000"),
    (b"\xff\x4f\xff\x51", "JPEG 2000 codestream"),
    (b"\xff\x0a", "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL \r\n\x87\n", "JPEG XL"),
    (b"8BPS", "Photoshop PSD"),
    (b"\x00\x00\x01\x00", "Windows icon"),
    (b"%PDF", "PDF"),
    (b"%!PS", "PostScript"),
    (b"qoif", "QOI"),
    (b"II\x2b\x00", "BigTIFF"),
    (b"MM\x00\x2b", "BigTIFF"),
)
_ISO_BRANDS = {b"avif": "AVIF", b"avis": "AVIF", b"heic": "HEIC", b"heix": "HEIC", b"mif1": "HEIF",
               b"msf1": "HEIF", b"hevc": "HEIC", b"heim": "HEIC", b"heis": "HEIC"}


class ImageRejected(Exception):
    """An input that cannot become a dataset image; `reason` is machine-readable."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ImageSettings:
    """How every image is converted. Defaults match the seed notebook."""

    width: int = 512
    height: int = 512
    resize_mode: str = "stretch"
    resample: str = "bilinear"
    image_format: str = "jpeg"
    jpeg_quality: int = 95
    chroma_subsampling: str = "4:2:0"
    image_backend: str = "auto"  # "auto": the fast core for the common case (see `_fast_kind`); "pillow": never
    reencode: bool = False  # True: an image already at the output size is re-encoded, not stored as it is
    background: tuple[int, int, int] = (255, 255, 255)
    max_pixels: int = DEFAULT_MAX_PIXELS  # Pillow's own bomb limit: ~537 MB of RGB pixels
    timeout_s: float = 60.0  # per image, enforced by `transforms.images.pool`; 0 = no limit
    throttled_retry_s: float = 600.0  # waits after 429/503 answers per read (`transforms.base.transient`), not timed
    reads_per_s_at_start: float | None = None  # this process's first read rate (`transient.process_start_rate`)
    max_file_mb: int = 256  # larger files are rejected by their listed size, and never read past it
    max_image_mb: int = DEFAULT_MAX_IMAGE_MB  # memory a conversion may need (`working_bytes`), checked before decoding
    # Memory all the conversions of one worker process may hold at once (see `transforms.base.memory`); 0 = no budget.
    # Dataflow runs one SDK process per vCPU and a standard machine has 3.75-4 GB per vCPU: 2 GB for
    # conversions leaves room for the process itself (~170 MB), the files being read and Beam's buffers.
    worker_memory_mb: int = 2048

    @property
    def max_file_bytes(self) -> int:
        return self.max_file_mb * 1_000_000

    @property
    def max_image_bytes(self) -> int:
        return self.max_image_mb * 1_000_000

    @property
    def worker_memory_bytes(self) -> int:
        return self.worker_memory_mb * 1_000_000


class EncodedImage(NamedTuple):
    """An encoded output image and the facts the Example records about it."""

    data: bytes
    width: int
    height: int
    format: str  # 'jpeg' or 'png'
    upscaled: bool
    sha256: str = ""  # hex SHA-256 of the source file's bytes, set by transforms.images.convert.read_and_convert
    stats: ImageStats | None = None  # the source's upright size and the stored pixels' sums (transforms.images.stats)
    kept: bool = False  # the source's own bytes are stored (`_passes_through`): no decode-encode loss


# ---------------------------------------------------------------------------
# 1. Identify and check the header.


def _sniff_other_format(data: bytes) -> str | None:
    """The name of a known image format that is not decoded here, from its first bytes."""
    for magic, name in _OTHER_FORMATS:
        if data.startswith(magic):
            return name
    if data[4:8] == b"ftyp" and data[8:12] in _ISO_BRANDS:
        return _ISO_BRANDS[data[8:12]]
    head = data[:256].lstrip().lower()
    if head.startswith(b"<svg") or (head.startswith(b"<?xml") and b"<svg" in data[:4096].lower()):
        return "SVG"
    return None


def _format_by_magic(data: bytes) -> str | None:
    """The decoded format this file claims to be by its first bytes, or None."""
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if data.startswith(b"BM"):
        return "BMP"
    if data.startswith((b"II*\x00", b"MM\x00*")):
        return "TIFF"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "WEBP"
    return None


_TIFF_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4}


def _tiff_truncation(data: bytes) -> str | None:
    """Whether the first TIFF directory, a value it points to, or its pixel data lies past the end of the file."""
    order = "little" if data[:2] == b"II" else "big"

    def number(at: int, size: int) -> int:
        return int.from_bytes(data[at:at + size], order)

    past_end = f"past the end of the file ({len(data):,} bytes)"
    ifd = number(4, 4)
    if ifd + 2 > len(data) or ifd + 2 + 12 * number(ifd, 2) + 4 > len(data):
        return f"the TIFF directory at byte {ifd:,} lies {past_end}"
    values = {}
    for i in range(number(ifd, 2)):
        entry = ifd + 2 + 12 * i
        tag, kind, count = number(entry, 2), number(entry + 2, 2), number(entry + 4, 4)
        size = _TIFF_TYPE_SIZES.get(kind, 1)
        at = entry + 8 if count * size <= 4 else number(entry + 8, 4)
        if at + count * size > len(data):
            return f"the value of TIFF tag {tag} at byte {at:,} lies {past_end}"
        if tag in (273, 279, 324, 325) and kind in (3, 4):  # strip/tile offsets and byte counts
            values[tag] = [number(at + size * j, size) for j in range(count)]
    for offsets_tag, counts_tag in ((273, 279), (324, 325)):
        ends = [o + c for o, c in zip(values.get(offsets_tag, []), values.get(counts_tag, []), strict=False)]
        if ends and max(ends) > len(data):
            return f"the TIFF pixel data ends at byte {max(ends):,}, {past_end}"
    return None


def _truncation(data: bytes) -> str | None:
    """Evidence, from the file's own structure, that it was cut short; None when there is none.

    Asked only after a decoder failed, to tell `truncated` from `decode_error`.
    """
    kind = _format_by_magic(data)
    if kind == "JPEG" and not data.rstrip(b"\x00")[-2:] == b"\xff\xd9":
        return "the JPEG has no end-of-image marker"
    if kind == "PNG" and b"IEND" not in data[-16:]:
        return "the PNG has no IEND chunk"
    if kind == "GIF" and not data.rstrip(b"\x00")[-1:] == b";":
        return "the GIF has no trailer byte"
    if kind == "BMP" and int.from_bytes(data[2:6], "little") > len(data):
        return f"the BMP header declares {int.from_bytes(data[2:6], 'little'):,} bytes but the file has {len(data):,}"
    if kind == "WEBP" and int.from_bytes(data[4:8], "little") + 8 > len(data):
        declared = int.from_bytes(data[4:8], "little") + 8
        return f"the RIFF header declares {declared:,} bytes but the file has {len(data):,}"
    if kind == "TIFF":
        try:
            return _tiff_truncation(data)
        except Exception:
            return None
    return None


_TRUNCATION_WORDS = ("truncated", "premature end", "unexpected end", "not enough data", "ran out of data")


def _classify(error: BaseException, stage: str, data: bytes) -> ImageRejected:
    """Map a decoder exception to a rejection reason, keeping the decoder's message."""
    text = str(error) or type(error).__name__
    if isinstance(error, UnidentifiedImageError):  # its message names a memory address, not the problem
        text = "Pillow cannot read the header"
    lower = text.lower()
    detail = f"{type(error).__name__} while decoding the {stage}: {text}"
    if isinstance(error, Image.DecompressionBombError) or "decompressed data too large" in lower:
        return ImageRejected(DECOMPRESSION_BOMB, detail)
    evidence = _truncation(data)
    if evidence:
        return ImageRejected(TRUNCATED, f"{evidence}; {detail}")
    if isinstance(error, EOFError) or any(word in lower for word in _TRUNCATION_WORDS):
        return ImageRejected(TRUNCATED, detail)
    if "cannot handle" in lower or "unsupported" in lower or "not supported" in lower:
        return ImageRejected(UNSUPPORTED_FORMAT, detail)
    return ImageRejected(DECODE_ERROR, detail)


def _header_error(data: bytes, claimed: str) -> Exception | None:
    """The format plugin's own error for a header it cannot read (Image.open hides it)."""
    try:
        factory = Image.OPEN[claimed][0]
        factory(io.BytesIO(data), "")
    except Exception as e:
        return e
    return None


_TIFF_PIECES = (273, 279, 324, 325)  # StripOffsets, StripByteCounts, TileOffsets, TileByteCounts
_TIFF_BYTE_TYPES = (1, 2, 7)  # BYTE, ASCII, UNDEFINED: read as one bytes object, whatever their count


def _tiff_layout(data: bytes) -> tuple[int, int, int, int]:
    """From the first TIFF directory: (strips or tiles, numbers in its other tags, the tag with most, its count).

    Zeros when the data is not a TIFF. Only the directory's entries are read, never their values.
    """
    if not data.startswith((b"II*\x00", b"MM\x00*")):
        return 0, 0, 0, 0
    order = "little" if data[:2] == b"II" else "big"
    ifd = int.from_bytes(data[4:8], order)
    entries = min(int.from_bytes(data[ifd:ifd + 2], order), max(0, (len(data) - ifd - 2) // 12))
    pieces = numbers = biggest = biggest_count = 0
    for i in range(entries):
        entry = ifd + 2 + 12 * i
        tag = int.from_bytes(data[entry:entry + 2], order)
        kind = int.from_bytes(data[entry + 2:entry + 4], order)
        count = int.from_bytes(data[entry + 4:entry + 8], order)
        if tag in _TIFF_PIECES:
            pieces = max(pieces, count)
        elif kind not in _TIFF_BYTE_TYPES:
            numbers += count
            if count > biggest_count:
                biggest, biggest_count = tag, count
    return pieces, numbers, biggest, biggest_count


def _check_layout(data: bytes) -> None:
    """Reject what would cost memory and time before Pillow decodes a single pixel: a TIFF whose
    directory holds millions of numbers (Pillow makes each one a Python object when it opens the file)."""
    pieces, numbers, tag, count = _tiff_layout(data)
    if pieces > MAX_TIFF_STRIPS:
        raise ImageRejected(
            TIFF_LAYOUT_TOO_LARGE,
            f"the TIFF stores its pixels in {pieces:,} strips or tiles, over the limit of {MAX_TIFF_STRIPS:,} "
            "(reading its layout alone would take gigabytes); save it again with ordinary strips or tiles",
        )
    if numbers > MAX_TIFF_NUMBERS:
        raise ImageRejected(
            TIFF_LAYOUT_TOO_LARGE,
            f"the TIFF directory holds {numbers:,} numbers besides its strip and tile tables (tag {tag} holds "
            f"{count:,} numbers), over the limit of {MAX_TIFF_NUMBERS:,}: reading them would take far more memory "
            "than the image; save it again without that metadata",
        )


def _stored_bytes_per_pixel(mode: str) -> int:
    """Bytes a pixel takes in Pillow's memory: 1 for 1/L/P, 2 for I;16, 4 for I and F and for every
    multi-band mode (Pillow keeps RGB, LA and YCbCr in 4 bytes a pixel, like RGBA and CMYK)."""
    if mode in ("1", "L", "P"):
        return 1
    if mode.startswith("I;16"):
        return 2
    return 4


def working_bytes(image: Image.Image, orientation: int | None = None) -> int:
    """About the most memory converting this opened, not yet decoded, image takes at once.

    The decoded pixels (their size after a JPEG's scaled decode), plus one 8-bit
    RGB copy (4 bytes a pixel in Pillow) for any mode but RGB, plus the
    intermediate copies of the modes that need them: 16-bit and float samples go
    through a copy and an 8-bit image, alpha other than RGBA through an RGBA copy.
    An RGB image needs one more copy when its EXIF orientation turns or flips it;
    `orientation` None (not known before decoding, as in a PNG) counts that copy.
    The resized output is small next to these.
    """
    pixels = image.width * image.height
    stored = _stored_bytes_per_pixel(image.mode)
    has_alpha = image.mode in ("RGBA", "RGBa", "LA", "La", "PA") or "transparency" in image.info
    if image.mode == "RGB" and not has_alpha:
        return pixels * (stored + (0 if orientation == 1 else 4))
    per_pixel = stored + 4
    if image.mode in ("I", "F") or image.mode.startswith("I;16"):
        per_pixel += stored + 1
    if has_alpha and image.mode != "RGBA":
        per_pixel += 4
    return pixels * per_pixel


def _check_memory(image: Image.Image, orientation: int | None, stored_size: tuple[int, int],
                  settings: ImageSettings) -> int:
    """The memory converting the image needs (`working_bytes`), if it is within --max_image_mb."""
    need = working_bytes(image, orientation)
    if need > settings.max_image_bytes:
        scaled = "" if image.size == stored_size else " (decoded at reduced scale from {}x{})".format(*stored_size)
        raise ImageRejected(
            IMAGE_TOO_LARGE_IN_MEMORY,
            f"{image.width}x{image.height} {image.mode}{scaled} would need about {need / 1e6:,.0f} MB to convert, over "
            f"--max_image_mb={settings.max_image_mb}; raise it if the machine has the memory",
        )
    return need


def _open(data: bytes, settings: ImageSettings) -> Image.Image:
    if not data:
        raise ImageRejected(EMPTY_FILE, "the file is empty (0 bytes)")
    _check_layout(data)
    try:
        image = Image.open(io.BytesIO(data), formats=DECODED_FORMATS)
    except UnidentifiedImageError as e:
        claimed = _format_by_magic(data)
        if claimed:  # the right signature, but Pillow could not read the header
            raise _classify(_header_error(data, claimed) or e, f"{claimed} header", data) from None
        other = _sniff_other_format(data)
        if other:
            raise ImageRejected(
                UNSUPPORTED_FORMAT, f"{other} is not decoded; supported: JPEG, PNG, GIF, BMP, TIFF, WebP"
            ) from None
        raise ImageRejected(
            NOT_AN_IMAGE, f"the content is not a JPEG, PNG, GIF, BMP, TIFF or WebP image (starts {data[:8]!r})"
        ) from None
    except Exception as e:  # any header parser error is this file's problem, not the job's
        raise _classify(e, "header", data) from None
    w, h = image.size
    if w <= 0 or h <= 0:
        raise ImageRejected(DECODE_ERROR, f"the image declares an empty size {w}x{h}")
    if w * h > settings.max_pixels:
        raise ImageRejected(
            DECOMPRESSION_BOMB,
            f"{w}x{h} = {w * h:,} pixels is over --max_pixels={settings.max_pixels:,}",
        )
    return image


def _orientation(image: Image.Image) -> int:
    """The EXIF orientation 1-8; 1 when absent, unreadable or out of range."""
    try:
        value = image.getexif().get(ExifTags.Base.Orientation, 1)
    except Exception:  # a broken EXIF block must not lose an otherwise good image
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _transposes(orientation: int) -> bool:
    """Whether this orientation swaps width and height."""
    return orientation in (5, 6, 7, 8)


# ---------------------------------------------------------------------------
# 2-3. Draft and decode.


def _scale_factors(width: int, height: int, settings: ImageSettings) -> tuple[float, float]:
    """Output pixels per upright source pixel along x and y, for the resize mode."""
    sx, sy = settings.width / width, settings.height / height
    mode = settings.resize_mode
    if mode == "stretch":
        return sx, sy
    if mode == "crop":
        return (max(sx, sy),) * 2
    if mode == "pad":
        return (min(sx, sy),) * 2
    if mode == "fit":
        return (min(1.0, sx, sy),) * 2  # fit never enlarges
    return 1.0, 1.0


def _needed_pixels(size: tuple[int, int], orientation: int, settings: ImageSettings, gap: float) -> tuple[int, int]:
    """The decoded (stored-orientation) size that keeps `gap` times the pixels the output needs along each side."""
    upright = size[::-1] if _transposes(orientation) else size
    sx, sy = _scale_factors(*upright, settings)
    need = (math.ceil(upright[0] * sx * gap), math.ceil(upright[1] * sy * gap))
    return need[::-1] if _transposes(orientation) else need


def _draft(image: Image.Image, orientation: int, settings: ImageSettings) -> tuple[float, float, float, float]:
    """Let libjpeg decode a JPEG at 1/2, 1/4 or 1/8 scale when the output is that much smaller.

    Returns the box, in the decoded (stored-orientation) pixels, that holds the
    whole source: a scaled decode rounds its size up, so its last row and
    column may be only partly covered.
    """
    w, h = image.size
    full = (0.0, 0.0, float(w), float(h))
    if image.format not in ("JPEG", "MPO") or settings.resize_mode == "none":
        return full
    need = _needed_pixels(image.size, orientation, settings, REDUCING_GAP)
    if need[0] * 2 > w or need[1] * 2 > h:
        return full  # not even a 1/2 scale decode would keep enough pixels
    result = image.draft(None, need)
    return tuple(float(v) for v in result[1]) if result else full


def _load(image: Image.Image, data: bytes) -> Image.Image:
    """Decode the pixels of the first frame, mapping decoder failures to rejection reasons."""
    try:
        image.load()
    except MemoryError:
        raise ImageRejected(DECOMPRESSION_BOMB, "out of memory while decoding the pixels") from None
    except Exception as e:
        raise _classify(e, "pixels", data) from None
    return image


# ---------------------------------------------------------------------------
# 4. Pixels to 8-bit RGB.


def _wide_to_8bit(image: Image.Image) -> Image.Image:
    """Greyscale 16-bit, 32-bit integer or float samples scaled (not clipped) to 8-bit 'L' or 'LA'.

    16-bit data (the I;16 modes, and 'I' within 0-65535) is scaled by 255/65535;
    wider integer or float data by its own value range (floats within 0-1 by 255).
    """
    pixels = np.asarray(image)
    if image.mode.startswith("I;16") or (image.mode == "I" and pixels.min() >= 0 and pixels.max() <= 65535):
        low, high = 0.0, 65535.0
    elif image.mode == "F" and pixels.min() >= 0.0 and pixels.max() <= 1.0:
        low, high = 0.0, 1.0
    else:
        low, high = float(pixels.min()), float(pixels.max())
        high = high if high > low else low + 1.0
    out = np.empty(pixels.shape, np.uint8)
    rows = max(1, (1 << 22) // max(1, pixels.shape[1]))  # bounded temporaries: ~4M samples at a time
    for top in range(0, pixels.shape[0], rows):
        chunk = pixels[top:top + rows].astype(np.float64)
        out[top:top + rows] = np.clip(np.rint((chunk - low) * (255.0 / (high - low))), 0, 255)
    grey = Image.fromarray(out, "L")
    transparent = image.info.get("transparency")
    if isinstance(transparent, int):  # tRNS of a 16-bit greyscale PNG: one grey value is transparent
        alpha = Image.fromarray((pixels != transparent).astype(np.uint8) * np.uint8(255), "L")
        grey = Image.merge("LA", (grey, alpha))
    return grey


def _to_rgb(image: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    """RGB with alpha composited onto the background, never dropped to black."""
    if image.mode in ("I", "F") or image.mode.startswith("I;16"):
        try:
            image = _wide_to_8bit(image)
        except (ValueError, TypeError) as e:
            raise ImageRejected(UNSUPPORTED_FORMAT, f"pixel mode {image.mode} cannot become 8-bit ({e})") from None
    if image.mode == "CMYK" and image.format in ("JPEG", "MPO") and "adobe" not in image.info:
        # Pillow reads every CMYK JPEG with Adobe's inverted polarity; without an
        # Adobe marker the samples are plain ink amounts (as Chrome and libvips assume).
        image = image.point(lambda v: 255 - v)
    has_alpha = image.mode in ("RGBA", "RGBa", "LA", "La", "PA") or "transparency" in image.info
    if image.mode == "RGB" and not has_alpha:
        return image
    try:
        if has_alpha:
            rgba = image if image.mode == "RGBA" else image.convert("RGBA")  # no copy of a large RGBA image
            canvas = Image.new("RGB", rgba.size, background)
            canvas.paste(rgba, mask=rgba)
            return canvas
        # CMYK -> RGB is R = 255 * (1 - C) * (1 - K): no ICC profile is applied.
        return image.convert("RGB")
    except ValueError as e:
        raise ImageRejected(UNSUPPORTED_FORMAT, f"pixel mode {image.mode} cannot become RGB ({e})") from None


# ---------------------------------------------------------------------------
# 5-6. Orientation and geometry.


def _oriented_box(orientation: int, size: tuple[int, int], box: tuple[float, float, float, float]):
    """Where the box (in an image of `size`, as stored) lands once the orientation is applied."""
    method = _ORIENTATION_TRANSPOSE.get(orientation)
    if method is None:
        return box
    w, h = size
    x0, y0, x1, y1 = box

    def point(x, y):
        return {
            Image.Transpose.FLIP_LEFT_RIGHT: (w - x, y),
            Image.Transpose.ROTATE_180: (w - x, h - y),
            Image.Transpose.FLIP_TOP_BOTTOM: (x, h - y),
            Image.Transpose.TRANSPOSE: (y, x),
            Image.Transpose.ROTATE_270: (h - y, x),
            Image.Transpose.TRANSVERSE: (h - y, w - x),
            Image.Transpose.ROTATE_90: (y, w - x),
        }[method]

    (ax, ay), (bx, by) = point(x0, y0), point(x1, y1)
    return min(ax, bx), min(ay, by), max(ax, bx), max(ay, by)


def _orient(image: Image.Image, orientation: int, box: tuple[float, float, float, float]):
    """The upright image, and where the source box lands in it."""
    method = _ORIENTATION_TRANSPOSE.get(orientation)
    if method is None:
        return image, box
    return image.transpose(method), _oriented_box(orientation, image.size, box)


def _size_of(image) -> tuple[int, int]:
    """(width, height) of a PIL image or of an RGB array (the fast path's)."""
    return image.size if isinstance(image, Image.Image) else (image.shape[1], image.shape[0])


def _resampled(image, size: tuple[int, int], box: tuple[float, float, float, float], settings: ImageSettings):
    """The box (in `image`'s pixels) resized to `size`: Pillow's filter for a PIL image, the fast core's
    (transforms.images.fast) for an array."""
    if size == _size_of(image) and box == (0, 0, *size):
        return image
    if isinstance(image, Image.Image):
        return image.resize(size, RESAMPLE_FILTERS[settings.resample], box=box, reducing_gap=REDUCING_GAP)
    return fast_imaging.resample(image, box, size, settings.resample)


def _on_canvas(content, size: tuple[int, int], background: tuple[int, int, int]):
    """The content centred on a canvas of `size` in the background colour (for pad)."""
    at = ((size[0] - _size_of(content)[0]) // 2, (size[1] - _size_of(content)[1]) // 2)
    if isinstance(content, Image.Image):
        canvas = Image.new("RGB", size, background)
        canvas.paste(content, at)
        return canvas
    canvas = np.empty((size[1], size[0], 3), np.uint8)
    canvas[:] = background
    canvas[at[1]:at[1] + content.shape[0], at[0]:at[0] + content.shape[1]] = content
    return canvas


def _resize(image, box, upright_size: tuple[int, int], settings: ImageSettings):
    """Resize the upright image (a PIL image, or the fast path's RGB array) for the resize mode;
    returns (image, upscaled).

    Sizes and crops are computed on `upright_size`, the source's full size, so
    the output does not depend on whether the JPEG was decoded at reduced scale;
    `box` is where that full source lies in `image`.
    """
    mode = settings.resize_mode
    if mode == "none":
        return image, False
    w, h = upright_size
    target_w, target_h = settings.width, settings.height
    bx0, by0, bx1, by1 = box
    kx, ky = (bx1 - bx0) / w, (by1 - by0) / h  # decoded pixels per source pixel
    image_w, image_h = _size_of(image)

    def resized(size, src_box):
        # Source box (x0, y0, x1, y1) in source pixels -> decoded pixels.
        x0, y0, x1, y1 = src_box
        decoded_box = (  # clamped: float rounding must not step outside the image
            max(0.0, bx0 + x0 * kx), max(0.0, by0 + y0 * ky),
            min(float(image_w), bx0 + x1 * kx), min(float(image_h), by0 + y1 * ky),
        )
        return _resampled(image, size, decoded_box, settings)

    sx, sy = _scale_factors(w, h, settings)
    if mode == "stretch":
        return resized((target_w, target_h), (0, 0, w, h)), sx > 1 or sy > 1
    if mode == "crop":
        crop_w, crop_h = min(w, target_w / sx), min(h, target_h / sy)
        left, top = (w - crop_w) / 2, (h - crop_h) / 2
        return resized((target_w, target_h), (left, top, left + crop_w, top + crop_h)), sx > 1
    content = (min(target_w, max(1, round(w * sx))), min(target_h, max(1, round(h * sy))))
    if mode == "fit":
        return resized(content, (0, 0, w, h)), False
    # pad: letterbox, the content centred on the background colour
    return _on_canvas(resized(content, (0, 0, w, h)), (target_w, target_h), settings.background), sx > 1


# ---------------------------------------------------------------------------
# 7. Encode.


def _jpeg_frame(data: bytes) -> tuple[int, int] | None:
    """The SOFn marker (0xC0 baseline, 0xC2 progressive, 0xC9 arithmetic, ...) of a JPEG and its sample
    precision in bits, or None."""
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return (marker, data[pos + 4]) if pos + 4 < len(data) else None
        if marker == 0xDA:
            return None
        pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
    return None


def _jpeg_frame_type(data: bytes) -> int | None:
    """The SOFn marker of a JPEG, or None."""
    frame = _jpeg_frame(data)
    return frame[0] if frame else None


def _passes_through(image: Image.Image, data: bytes, orientation: int, settings: ImageSettings) -> bool:
    """Whether the source bytes can be stored as they are: an upright RGB baseline JPEG that needs no resizing
    (--resize_mode=none, or already at the output size unless --reencode). Re-encoding it would only add a
    generation of JPEG loss, and bytes (a 512x512 JPEG of quality 90 re-encoded at 95 grows by about half)."""
    at_size = not settings.reencode and image.size == (settings.width, settings.height)
    return (
        (settings.resize_mode == "none" or at_size)
        and settings.image_format == "jpeg"
        and image.format == "JPEG"  # not MPO: its extra images would ride along
        and image.mode == "RGB"
        and orientation == 1
        and image.info.get("adobe_transform", 1) == 1  # YCbCr, the colour space every decoder assumes
        and _jpeg_frame_type(data) == 0xC0
    )


def _check_jpeg_side(width: int, height: int, settings: ImageSettings) -> None:
    if settings.image_format == "jpeg" and max(width, height) > JPEG_MAX_SIDE:
        raise ImageRejected(
            TOO_LARGE_FOR_JPEG,
            f"{width}x{height} is over JPEG's limit of {JPEG_MAX_SIDE} pixels a side; resize it "
            "(--resize_mode other than none) or store it losslessly with --image_format=png",
        )


def _encode(image, settings: ImageSettings) -> bytes:
    """The stored bytes of a PIL image or of the fast path's RGB array (a JPEG through libjpeg-turbo either
    way, with the same settings; a PNG always through Pillow)."""
    _check_jpeg_side(*_size_of(image), settings)
    if not isinstance(image, Image.Image):
        if settings.image_format == "jpeg":
            return fast_imaging.encode_jpeg(image, settings.jpeg_quality, settings.chroma_subsampling)
        image = Image.fromarray(image, "RGB")
    out = io.BytesIO()
    if settings.image_format == "png":
        image.save(out, format="PNG", compress_level=1)
    else:
        image.save(
            out,
            format="JPEG",
            quality=settings.jpeg_quality,
            subsampling=CHROMA_SUBSAMPLING[settings.chroma_subsampling],
        )
    return out.getvalue()


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
        raise _classify(e, "image", data) from None


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
    image = _open(data, settings)
    orientation = _orientation(image) if image.format in ("JPEG", "MPO") else 1  # JPEG EXIF is in the header
    stored_size = image.size
    box = _draft(image, orientation, settings)
    # After the draft: a large JPEG decoded at 1/8 scale needs 1/64 of the memory.
    need = _check_memory(image, orientation if image.format in ("JPEG", "MPO") else None, stored_size, settings)
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


def _fast_kind(image: Image.Image, data: bytes, settings: ImageSettings) -> str | None:
    """'JPEG' or 'PNG' when the opened, not yet decoded, image takes the fast path; None for Pillow's.

    The fast path (transforms.images.fast) takes the common case only: an 8-bit greyscale or YCbCr JPEG,
    baseline or progressive, and an 8-bit greyscale or RGB PNG without transparency or animation. Every
    other file (CMYK and YCCK, Adobe RGB, arithmetic-coded, 12-bit, MPO, 16-bit, alpha, palette, GIF, BMP,
    TIFF, WebP, ...) stays on Pillow's path, as does everything with --image_backend=pillow.
    """
    if settings.image_backend != "auto":
        return None
    if image.format == "JPEG":
        frame = _jpeg_frame(data)
        eligible = (image.mode == "L" or (image.mode == "RGB" and image.info.get("adobe_transform", 1) == 1))
        return "JPEG" if eligible and frame is not None and frame[0] in (0xC0, 0xC1, 0xC2) and frame[1] == 8 else None
    if image.format == "PNG":
        bit_depth, colour_type = data[24], data[25]  # IHDR, which Pillow has read
        eligible = (image.mode in ("L", "RGB") and bit_depth == 8 and colour_type in (0, 2)
                    and "transparency" not in image.info and not getattr(image, "is_animated", False))
        return "PNG" if eligible else None
    return None


def _fast_pixels(image: Image.Image, data: bytes, kind: str, stored_size: tuple[int, int], orientation: int,
                 settings: ImageSettings) -> tuple[np.ndarray | None, Image.Image, tuple[float, float, float, float]]:
    """A fast-path image's RGB pixels, the image (loaded, for a PNG), and the box that holds the whole source in
    the pixels; None for the pixels when libjpeg-turbo refused the stream, so that Pillow decodes it and gives
    its own verdict.

    A JPEG is decoded at the smallest DCT scale (M/8, M = 1-4) that keeps the output's pixels, or whole: the scaled
    IDCT is itself a low-pass filter, and it is the cheapest step (a 2,600 x 1,900 photo to 512 x 512
    decodes at 3/8 in about two thirds of the time of the Pillow path's 1/2, within 43-53 dB of it).
    The memory reserved before is the Pillow path's estimate, never less than this needs.
    """
    full = (0.0, 0.0, float(image.width), float(image.height))
    if kind == "PNG":
        image = _load(image, data)
        return np.asarray(image.convert("RGB") if image.mode != "RGB" else image), image, full
    need = (0, 0) if settings.resize_mode == "none" else _needed_pixels(stored_size, orientation, settings, 1.0)
    if need[0] * 2 > stored_size[0] or need[1] * 2 > stored_size[1]:
        need = (0, 0)  # a scale over 1/2 (5/8-7/8) is slower than a full decode and loses more against Pillow's
    try:
        pixels = fast_imaging.decode_jpeg(data, *need)
    except ValueError:
        return None, image, full
    width, height = stored_size
    for eighths in range(1, 9):  # libjpeg's scaled size is the full size times M/8, rounded up
        if (-(-width * eighths // 8), -(-height * eighths // 8)) == (pixels.shape[1], pixels.shape[0]):
            return pixels, image, (0.0, 0.0, width * eighths / 8, height * eighths / 8)
    return None, image, full


def _decode_and_encode(image: Image.Image, data: bytes, orientation: int, stored_size: tuple[int, int], box,
                       settings: ImageSettings, deadline: float | None) -> EncodedImage:
    kind = _fast_kind(image, data, settings)
    pixels = None
    if kind:
        pixels, image, fast_box = _fast_pixels(image, data, kind, stored_size, orientation, settings)
        box = fast_box if pixels is not None else box
    if pixels is None:
        image = _load(image, data)
    _check_deadline(deadline, "decoding")
    if image.format not in ("JPEG", "MPO"):
        orientation = _orientation(image)  # PNG and WebP may keep EXIF after the pixels
    if _passes_through(image, data, orientation, settings):
        return EncodedImage(data, image.width, image.height, "jpeg", False,
                            stats=_stats(image if pixels is None else pixels, image.size), kept=True)
    try:
        if pixels is None:
            image = _to_rgb(image, settings.background)
            image, box = _orient(image, orientation, box)
        else:
            box = _oriented_box(orientation, _size_of(pixels), box)
            image = fast_imaging.orient(pixels, orientation)
        upright_size = stored_size[::-1] if _transposes(orientation) else stored_size
        image, upscaled = _resize(image, box, upright_size, settings)
        _check_deadline(deadline, "resizing")
        stats = _stats(image, upright_size)  # of the pixels as resized, before the encoding's loss
        encoded = _encode(image, settings)
    except (ImageRejected, MemoryError):
        raise
    except Exception as e:  # the pixels are decoded: what fails now is this code, not the file
        raise ImageRejected(
            INTERNAL_ERROR, f"{type(e).__name__} after decoding: {e} (a bug in the converter: please report it)"
        ) from None
    width, height = _size_of(image)
    return EncodedImage(encoded, width, height, settings.image_format, upscaled, stats=stats)
