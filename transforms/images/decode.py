"""Decoding: open the image by content, decide how to decode it, and decode its first frame to 8-bit RGB.

The steps, in the order the conversion takes them:
  1. open the file by content (`open_image`, after the checks of
     `transforms.images.diagnosis`) and check the declared size against
     `max_pixels` before any pixel is decoded; read the EXIF orientation;
  2. for a JPEG that will shrink, ask libjpeg for a scaled-down decode (`draft`:
     1/2, 1/4 or 1/8 in the DCT), which is fast and needs little memory; then
     check the memory the conversion will need (`working_bytes`) against
     `max_image_mb` (`check_memory`);
  3. decode the first frame: through the fast core (`transforms.images.fast`)
     for the common case (`fast_kind`, `fast_pixels`), else through Pillow
     (`load`); a short or corrupt stream is rejected, never padded, and so is
     a JPEG whose decode warns (`corrupt_data`);
  4. scale 16-bit and float samples to 8 bits, fix CMYK polarity, composite
     alpha onto the background, giving RGB (`to_rgb`).
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import ExifTags, Image, ImageFile, UnidentifiedImageError

from transforms.images import diagnosis, pixels
from transforms.images import fast as fast_imaging
from transforms.images.diagnosis import (
    DECODE_ERROR,
    DECOMPRESSION_BOMB,
    EMPTY_FILE,
    IMAGE_TOO_LARGE_IN_MEMORY,
    NOT_AN_IMAGE,
    UNSUPPORTED_FORMAT,
    ImageRejected,
)
from transforms.images.settings import ImageSettings

# Truncated files are rejected, never padded with grey.
ImageFile.LOAD_TRUNCATED_IMAGES = False
# A broken EXIF block is ignored (see `exif_orientation`); Pillow's warning about it
# would only print noise on the user's terminal, once per such file.
warnings.filterwarnings("ignore", message="(Corrupt EXIF data|Truncated File Read)", category=UserWarning,
                        module="PIL.TiffImagePlugin")
# Pillow's own process-wide bomb check warns at 89 MP and refuses at 179 MP
# whatever --max_pixels says; `open_image` applies --max_pixels instead.
Image.MAX_IMAGE_PIXELS = None

IMAGE_BACKENDS = ("auto", "pillow")

# Formats decoded, by Pillow's format name. An MPO (a JPEG with more images
# appended) is opened by the JPEG plugin, which reports format "MPO".
DECODED_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "DIB", "TIFF", "WEBP")


# ---------------------------------------------------------------------------
# 1. Open and check the header.


def open_image(data: bytes, settings: ImageSettings) -> Image.Image:
    """The opened, not yet decoded, image, identified by content and its declared size checked against
    --max_pixels."""
    if not data:
        raise ImageRejected(EMPTY_FILE, "the file is empty (0 bytes)")
    diagnosis.check_layout(data)
    try:
        image = Image.open(io.BytesIO(data), formats=DECODED_FORMATS)
    except UnidentifiedImageError as e:
        claimed = diagnosis.format_by_magic(data)
        if claimed:  # the right signature, but Pillow could not read the header
            raise diagnosis.classify(diagnosis.header_error(data, claimed) or e, f"{claimed} header", data) from None
        other = diagnosis.sniff_other_format(data)
        if other:
            raise ImageRejected(
                UNSUPPORTED_FORMAT, f"{other} is not decoded; supported: JPEG, PNG, GIF, BMP, TIFF, WebP"
            ) from None
        raise ImageRejected(
            NOT_AN_IMAGE, f"the content is not a JPEG, PNG, GIF, BMP, TIFF or WebP image (starts {data[:8]!r})"
        ) from None
    except Exception as e:  # any header parser error is this file's problem, not the job's
        raise diagnosis.classify(e, "header", data) from None
    w, h = image.size
    if w <= 0 or h <= 0:
        raise ImageRejected(DECODE_ERROR, f"the image declares an empty size {w}x{h}")
    if w * h > settings.max_pixels:
        raise ImageRejected(
            DECOMPRESSION_BOMB,
            f"{w}x{h} = {w * h:,} pixels is over --max_pixels={settings.max_pixels:,}",
        )
    return image


def exif_orientation(image: Image.Image) -> int:
    """The EXIF orientation 1-8; 1 when absent, unreadable or out of range."""
    try:
        value = image.getexif().get(ExifTags.Base.Orientation, 1)
    except Exception:  # a broken EXIF block must not lose an otherwise good image
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def jpeg_frame(data: bytes) -> tuple[int, int] | None:
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


def jpeg_frame_type(data: bytes) -> int | None:
    """The SOFn marker of a JPEG, or None."""
    frame = jpeg_frame(data)
    return frame[0] if frame else None


# ---------------------------------------------------------------------------
# 2. Draft, and the memory the conversion needs.


def draft(image: Image.Image, orientation: int, settings: ImageSettings) -> tuple[float, float, float, float]:
    """Let libjpeg decode a JPEG at 1/2, 1/4 or 1/8 scale when the output is that much smaller.

    Returns the box, in the decoded (stored-orientation) pixels, that holds the
    whole source: a scaled decode rounds its size up, so its last row and
    column may be only partly covered.
    """
    w, h = image.size
    full = (0.0, 0.0, float(w), float(h))
    if image.format not in ("JPEG", "MPO") or settings.resize_mode == "none":
        return full
    need = pixels.needed_pixels(image.size, orientation, settings, pixels.REDUCING_GAP)
    if need[0] * 2 > w or need[1] * 2 > h:
        return full  # not even a 1/2 scale decode would keep enough pixels
    result = image.draft(None, need)
    return tuple(float(v) for v in result[1]) if result else full


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


def check_memory(image: Image.Image, orientation: int | None, stored_size: tuple[int, int],
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


# ---------------------------------------------------------------------------
# 3. Decode: the fast core for the common case, else Pillow.


def fast_kind(image: Image.Image, data: bytes, settings: ImageSettings) -> str | None:
    """'JPEG' or 'PNG' when the opened, not yet decoded, image takes the fast path; None for Pillow's.

    The fast path (transforms.images.fast) takes the common case only: an 8-bit greyscale or YCbCr JPEG,
    baseline or progressive, and an 8-bit greyscale or RGB PNG without transparency or animation. Every
    other file (CMYK and YCCK, Adobe RGB, arithmetic-coded, 12-bit, MPO, 16-bit, alpha, palette, GIF, BMP,
    TIFF, WebP, ...) stays on Pillow's path, as does everything with --image_backend=pillow.
    """
    if settings.image_backend != "auto":
        return None
    if image.format == "JPEG":
        frame = jpeg_frame(data)
        eligible = (image.mode == "L" or (image.mode == "RGB" and image.info.get("adobe_transform", 1) == 1))
        return "JPEG" if eligible and frame is not None and frame[0] in (0xC0, 0xC1, 0xC2) and frame[1] == 8 else None
    if image.format == "PNG":
        bit_depth, colour_type = data[24], data[25]  # IHDR, which Pillow has read
        eligible = (image.mode in ("L", "RGB") and bit_depth == 8 and colour_type in (0, 2)
                    and "transparency" not in image.info and not getattr(image, "is_animated", False))
        return "PNG" if eligible else None
    return None


def fast_pixels(image: Image.Image, data: bytes, kind: str, stored_size: tuple[int, int], orientation: int,
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
        image = load(image, data)
        return np.asarray(image.convert("RGB") if image.mode != "RGB" else image), image, full
    need = (0, 0) if settings.resize_mode == "none" else pixels.needed_pixels(stored_size, orientation, settings, 1.0)
    if need[0] * 2 > stored_size[0] or need[1] * 2 > stored_size[1]:
        need = (0, 0)  # a scale over 1/2 (5/8-7/8) is slower than a full decode and loses more against Pillow's
    try:
        rgb = fast_imaging.decode_jpeg(data, *need)
    except ValueError:
        return None, image, full
    width, height = stored_size
    for eighths in range(1, 9):  # libjpeg's scaled size is the full size times M/8, rounded up
        if (-(-width * eighths // 8), -(-height * eighths // 8)) == (rgb.shape[1], rgb.shape[0]):
            return rgb, image, (0.0, 0.0, width * eighths / 8, height * eighths / 8)
    return None, image, full


def load(image: Image.Image, data: bytes) -> Image.Image:
    """Decode the pixels of the first frame, mapping decoder failures to rejection reasons.

    Pillow lets libjpeg's warnings pass without a word (it fills in what it could not read): a JPEG it decoded is
    checked by libjpeg-turbo too (`fast.jpeg_warning`), and a warning is a rejection (`diagnosis.warned`). The fast
    core's own decodes are strict already; this is the Pillow path's, on either backend.
    """
    try:
        image.load()
    except MemoryError:
        raise ImageRejected(DECOMPRESSION_BOMB, "out of memory while decoding the pixels") from None
    except Exception as e:
        raise diagnosis.classify(e, "pixels", data) from None
    if image.format in ("JPEG", "MPO"):
        warning = fast_imaging.jpeg_warning(data)
        if warning:
            raise diagnosis.warned(warning, data)
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


def to_rgb(image: Image.Image, background: tuple[int, int, int]) -> Image.Image:
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
