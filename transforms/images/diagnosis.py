"""Why an input cannot become a dataset image: the rejection reasons, and what the bytes themselves say.

`ImageRejected` carries a short, machine-readable reason. The format is
identified from the bytes (never the file name): the decoded formats by their
magic bytes, other known formats (JPEG 2000, HEIC, PSD, ...) for a clearer
reason than not_an_image. Before Pillow reads a TIFF, its strip count and
directory size are checked (`check_layout`), since Pillow would make each entry a
Python object. After a decoder failed, `classify` maps its exception to a
reason, telling a file cut short (`truncated`, from the file's own structure)
from a corrupt one (`decode_error`), and keeps the decoder's message. A decode that only warns is a rejection
too (`corrupt_data`, `warned`).
"""

from __future__ import annotations

import io

from PIL import Image, UnidentifiedImageError

# Rejection reasons: short, stable, machine-readable.
EMPTY_FILE = "empty_file"
NOT_AN_IMAGE = "not_an_image"
UNSUPPORTED_FORMAT = "unsupported_format"
TRUNCATED = "truncated"
DECOMPRESSION_BOMB = "decompression_bomb"
DECODE_ERROR = "decode_error"
CORRUPT_DATA = "corrupt_data"  # the decoder warned (and would fill in or guess what it could not read)
READ_ERROR = "read_error"
TIMEOUT = "timeout"
INTERNAL_ERROR = "internal_error"  # a bug here, not a problem of the file: report it
TOO_LARGE_FOR_JPEG = "too_large_for_jpeg"
NOT_A_REGULAR_FILE = "not_a_regular_file"  # a FIFO, socket or device: never opened, as a read could block forever
FILE_TOO_LARGE = "file_too_large"  # over --max_file_mb: never read past the limit
IMAGE_TOO_LARGE_IN_MEMORY = "image_too_large_in_memory"  # converting would need more than --max_image_mb
TIFF_LAYOUT_TOO_LARGE = "tiff_layout_too_large"  # over MAX_TIFF_STRIPS strips or tiles, or MAX_TIFF_NUMBERS numbers
STALLED_WORKER = "stalled_worker"  # not tried: this worker's threads are all stuck in earlier images

# Pillow keeps every strip or tile of a TIFF as a Python object (a few hundred bytes, and
# microseconds, each) before it decodes any pixel: 4 million one-row strips in a 32 MB file
# took 1.5 GB and 42 s. Real TIFFs use strips of 8-64 kB or tiles of 256x256 pixels: a
# 179-megapixel image in 64 kB strips has about 8,000.
MAX_TIFF_STRIPS = 65_536
# The same for the numbers in a TIFF directory's other tags (a colour map or transfer
# function of a 16-bit image has 196,608; private tags can hold millions, each a Python int).
MAX_TIFF_NUMBERS = 1_000_000

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


def sniff_other_format(data: bytes) -> str | None:
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


def format_by_magic(data: bytes) -> str | None:
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
    kind = format_by_magic(data)
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


def classify(error: BaseException, stage: str, data: bytes) -> ImageRejected:
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


def warned(warning: str, data: bytes) -> ImageRejected:
    """The rejection of a file that decoded, but with a decoder's warning: `truncated` when the file itself shows
    that it was cut short, else `corrupt_data`."""
    detail = (f"the decoder warns: {warning}; it would fill in or guess what it could not read, so the image is "
              "not stored (a decode that warns is a rejection)")
    evidence = _truncation(data)
    return ImageRejected(TRUNCATED, f"{evidence}; {detail}") if evidence else ImageRejected(CORRUPT_DATA, detail)


def header_error(data: bytes, claimed: str) -> Exception | None:
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


def check_layout(data: bytes) -> None:
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
