"""Encoding: the stored bytes of the output image, or the source's own image data when it can be stored as it is.

The output is encoded as JPEG or PNG, with no metadata (so no orientation tag);
an upright RGB baseline JPEG that needs no resizing is stored as it is
(`passes_through`), its image data only (`image_data_only`): no metadata either.
"""

from __future__ import annotations

import io
import re

from PIL import Image

from transforms.images import decode, pixels
from transforms.images import fast as fast_imaging
from transforms.images.diagnosis import TOO_LARGE_FOR_JPEG, ImageRejected
from transforms.images.settings import ImageSettings

IMAGE_FORMATS = ("jpeg", "png")
CHROMA_SUBSAMPLING = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2}
JPEG_MAX_SIDE = 65500  # the JPEG format's own limit on either side


def passes_through(image: Image.Image, data: bytes, orientation: int, settings: ImageSettings) -> bool:
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
        and decode.jpeg_frame_type(data) == 0xC0
    )


# In a scan's entropy-coded data a 0xFF byte is followed by 0x00 (a stuffed byte), a restart marker (0xD0-0xD7) or
# another 0xFF (fill); anything else is the marker that ends the scan.
_SCAN_END = re.compile(rb"\xff[\x01-\xcf\xd8-\xfe]")
_APP0, _APP14, _COM, _SOS, _EOI = 0xE0, 0xEE, 0xFE, 0xDA, 0xD9


def image_data_only(data: bytes) -> bytes | None:
    """A JPEG's bytes without its metadata: its tables, frame and scans, from its start to its end-of-image marker.

    Left out: every APPn segment (EXIF with its GPS position and camera serial number, XMP, ICC profiles,
    Photoshop's, JFIF's thumbnails) and every comment, and whatever follows the end of the image (a payload, a
    second JPEG). Two say how the colours are coded, and so stay, cut to the fields that say it: JFIF's APP0
    (YCbCr; its version and pixel density, without a thumbnail: 16 bytes) and Adobe's APP14 (its colour transform:
    14 bytes); without either a decoder guesses from the components' ids, as it would for the source. The pixels
    decode as the source's, bit for bit; a Pillow JPEG, which holds nothing else, comes out byte for byte.

    None when the segments cannot be followed to an end-of-image marker (then the image is re-encoded).
    """
    out, pos, jfif, adobe = [data[:2]], 2, False, False
    while True:
        while data[pos:pos + 2] == b"\xff\xff":  # fill bytes before a marker
            pos += 1
        if pos + 2 > len(data) or data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == _EOI:
            out.append(b"\xff\xd9")
            return b"".join(out)
        end = pos + 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
        if pos + 4 > len(data) or end > len(data):
            return None
        segment = data[pos:end]
        if marker == _APP0 and segment[4:9] == b"JFIF\x00" and len(segment) >= 16 and not jfif:
            out.append(b"\xff\xe0\x00\x10" + segment[4:16] + b"\x00\x00")  # no thumbnail
            jfif = True
        elif marker == _APP14 and segment[4:9] == b"Adobe" and len(segment) >= 16 and not adobe:
            out.append(b"\xff\xee\x00\x0e" + segment[4:16])
            adobe = True
        elif not (0xE0 <= marker <= 0xEF or marker == _COM):
            out.append(segment)
        pos = end
        if marker == _SOS:
            scan_end = _SCAN_END.search(data, pos)
            if scan_end is None:
                return None
            out.append(data[pos:scan_end.start()])
            pos = scan_end.start()


def _check_jpeg_side(width: int, height: int, settings: ImageSettings) -> None:
    if settings.image_format == "jpeg" and max(width, height) > JPEG_MAX_SIDE:
        raise ImageRejected(
            TOO_LARGE_FOR_JPEG,
            f"{width}x{height} is over JPEG's limit of {JPEG_MAX_SIDE} pixels a side; resize it "
            "(--resize_mode other than none) or store it losslessly with --image_format=png",
        )


def encode_image(image, settings: ImageSettings) -> bytes:
    """The stored bytes of a PIL image or of the fast path's RGB array (a JPEG through libjpeg-turbo either
    way, with the same settings; a PNG always through Pillow)."""
    _check_jpeg_side(*pixels.size_of(image), settings)
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
