"""Encoding: the stored bytes of the output image, or the source's own bytes when they can be stored as they are.

The output is encoded as JPEG or PNG, with no metadata (so no orientation tag);
an upright RGB baseline JPEG that needs no resizing is stored as it is
(`passes_through`).
"""

from __future__ import annotations

import io

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
