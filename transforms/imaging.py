"""Plain image functions: decode any supported image by content, orient, flatten, resize, encode.

No Beam here. `convert_image` either returns the encoded image or raises
`ImageRejected` with a short machine-readable reason; it never lets a decoder
error escape, so one bad file can never fail a job.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import NamedTuple

from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

# Truncated files are rejected, never padded with grey.
ImageFile.LOAD_TRUNCATED_IMAGES = False

RESIZE_MODES = ("stretch", "crop", "pad", "fit", "none")
RESAMPLE_FILTERS = {
    "bilinear": Image.Resampling.BILINEAR,
    "area": Image.Resampling.BOX,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}
IMAGE_FORMATS = ("jpeg", "png")
CHROMA_SUBSAMPLING = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2}

# Rejection reasons: short, stable, machine-readable.
EMPTY_FILE = "empty_file"
NOT_AN_IMAGE = "not_an_image"
UNSUPPORTED_FORMAT = "unsupported_format"
TRUNCATED = "truncated"
DECOMPRESSION_BOMB = "decompression_bomb"
DECODE_ERROR = "decode_error"
READ_ERROR = "read_error"


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
    background: tuple[int, int, int] = (255, 255, 255)
    max_pixels: int = 178_956_970  # Pillow's own bomb limit: ~537 MB of RGB pixels


class EncodedImage(NamedTuple):
    """An encoded output image and the facts the Example records about it."""

    data: bytes
    width: int
    height: int
    format: str  # 'jpeg' or 'png'
    upscaled: bool


def _open(data: bytes, settings: ImageSettings) -> Image.Image:
    if not data:
        raise ImageRejected(EMPTY_FILE, "the file is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError as e:
        raise ImageRejected(NOT_AN_IMAGE, f"not a recognised image ({e})") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageRejected(DECOMPRESSION_BOMB, str(e)) from None
    except Exception as e:  # any header parser error is this file's problem, not the job's
        raise ImageRejected(DECODE_ERROR, f"{type(e).__name__}: {e}") from None
    w, h = image.size
    if w <= 0 or h <= 0:
        raise ImageRejected(DECODE_ERROR, f"the image declares an empty size {w}x{h}")
    if w * h > settings.max_pixels:
        raise ImageRejected(
            DECOMPRESSION_BOMB,
            f"{w}x{h} = {w * h:,} pixels is over --max_pixels={settings.max_pixels:,}",
        )
    return image


def _load(image: Image.Image) -> Image.Image:
    """Decode the pixels, mapping decoder failures to rejection reasons."""
    try:
        image.load()
    except OSError as e:
        text = str(e)
        if "truncated" in text.lower() or "broken data stream" in text.lower():
            raise ImageRejected(TRUNCATED, text) from None
        raise ImageRejected(DECODE_ERROR, text) from None
    except Exception as e:
        raise ImageRejected(DECODE_ERROR, f"{type(e).__name__}: {e}") from None
    return image


def _to_rgb(image: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    """RGB with alpha composited onto the background, never dropped to black."""
    if image.mode == "RGB":
        return image
    has_alpha = image.mode in ("RGBA", "LA", "PA") or (
        image.mode == "P" and "transparency" in image.info
    )
    if has_alpha:
        rgba = image.convert("RGBA")
        canvas = Image.new("RGB", rgba.size, background)
        canvas.paste(rgba, mask=rgba.getchannel("A"))
        return canvas
    return image.convert("RGB")


def _resize(image: Image.Image, settings: ImageSettings) -> tuple[Image.Image, bool]:
    mode = settings.resize_mode
    target = (settings.width, settings.height)
    resample = RESAMPLE_FILTERS[settings.resample]
    w, h = image.size
    if mode == "none":
        return image, False
    if mode == "stretch":
        if (w, h) == target:
            return image, False
        return image.resize(target, resample), target[0] > w or target[1] > h
    raise ImageRejected(UNSUPPORTED_FORMAT, f"resize mode {mode!r} is not implemented")


def _encode(image: Image.Image, settings: ImageSettings) -> bytes:
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


def convert_image(data: bytes, settings: ImageSettings) -> EncodedImage:
    """Decode `data` by content and return it oriented, RGB, resized and re-encoded.

    Raises:
        ImageRejected: for any input that cannot be converted, with its reason.
    """
    image = _open(data, settings)
    image = _load(image)
    try:
        image = ImageOps.exif_transpose(image)
    except Exception:  # a broken EXIF block must not lose an otherwise good image
        pass
    image = _to_rgb(image, settings.background)
    image, upscaled = _resize(image, settings)
    return EncodedImage(_encode(image, settings), image.width, image.height, settings.image_format, upscaled)
