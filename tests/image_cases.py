"""Generators of real-world image files for the imaging tests: every odd case, as bytes.

Everything is made here with Pillow (and a few bytes edited by hand where
Pillow cannot write a variant: raw PNG bit depths, 16-bit RGB TIFF, YCCK and
non-Adobe CMYK JPEGs). The one exception is arithmetic-coded JPEG, which no
Python library writes: it is embedded below, made once with libjpeg-turbo's
`jpegtran -arithmetic` from a Pillow JPEG of `quadrants()`.
"""

from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
from PIL import Image

RED, GREEN, BLUE, YELLOW = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)

# EXIF orientation -> what a camera stores for an upright scene (the inverse of
# the transpose a viewer applies). Orientations 6 and 8 are inverses of each other.
STORED_FOR_ORIENTATION = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}

# `jpegtran -arithmetic` (and `-arithmetic -progressive`) of
# `quadrants(32, 32).save(f, "JPEG", quality=95, subsampling=0)`.
ARITHMETIC_JPEG = base64.b64decode(
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAIBAQEBAQIBAQECAgICAgQDAgICAgUEBAMEBgUGBgYFBgYGBwkIBgcJBwYGCAsICQoKCgoK"
    "BggLDAsKDAkKCgr/2wBDAQICAgICAgUDAwUKBwYHCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoK"
    "Cgr/yQARCAAgACADAREAAhEBAxEB/8wACgAQEAUBEBEF/9oADAMBAAIRAxEAPwD/AOf5pm8y8XiyeZNoKJ/fCzCzdMrr+GaSOzqLQebI"
    "oAA2go0lYnzXyBLOmjj/2Q=="
)
ARITHMETIC_PROGRESSIVE_JPEG = base64.b64decode(
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAIBAQEBAQIBAQECAgICAgQDAgICAgUEBAMEBgUGBgYFBgYGBwkIBgcJBwYGCAsICQoKCgoK"
    "BggLDAsKDAkKCgr/2wBDAQICAgICAgUDAwUKBwYHCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoK"
    "Cgr/ygARCAAgACADAREAAhEBAxEB/8wABgAQARD/2gAMAwEAAhADEAAAAf8A0Atscy0n8PdLtlZSi8w6vhpd7TdeFy6sE4PJkbcTW1NT"
    "gjlXK4j/zAAEEAX/2gAIAQEAAQUCsP/MAAQRBf/aAAgBAwEBPwGw/8wABBEF/9oACAECAQE/AbD/zAAEEAX/2gAIAQEABj8CsP/MAAQQ"
    "Bf/aAAgBAQABPyGw/9oADAMBAAIAAwAAABBLxv/MAAQRBf/aAAgBAwEBPxCw/8wABBEF/9oACAECAQE/ELD/zAAEEAX/2gAIAQEAAT8Q"
    "sP/Z"
)


def quadrants(width: int = 32, height: int = 32) -> Image.Image:
    """Red top-left, green top-right, blue bottom-left, yellow bottom-right: shows any flip or rotation."""
    image = Image.new("RGB", (width, height), RED)
    half_w, half_h = width // 2, height // 2
    image.paste(GREEN, (half_w, 0, width, half_h))
    image.paste(BLUE, (0, half_h, half_w, height))
    image.paste(YELLOW, (half_w, half_h, width, height))
    return image


def encode(image: Image.Image, format: str, **params) -> bytes:
    out = io.BytesIO()
    image.save(out, format=format, **params)
    return out.getvalue()


def jpeg(image: Image.Image, **params) -> bytes:
    params.setdefault("quality", 95)
    params.setdefault("subsampling", 0)
    return encode(image, "JPEG", **params)


def exif_orientation(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def oriented(upright: Image.Image, orientation: int) -> Image.Image:
    """The pixels a camera stores for an upright scene under this EXIF orientation."""
    method = STORED_FOR_ORIENTATION[orientation]
    return upright if method is None else upright.transpose(method)


# A TIFF header and IFD that claims five entries and then ends: a broken EXIF block.
BROKEN_EXIF = b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x05\x01\x12"


# --- JPEG colour variants -------------------------------------------------------------------------


def _segments(data: bytes):
    """(marker, start, end) of each JPEG marker segment up to the first scan."""
    pos = 2
    while pos < len(data):
        marker = data[pos + 1]
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        yield marker, pos, pos + 2 + length
        if marker == 0xDA:
            return
        pos += 2 + length


def cmyk_jpeg(cmyk: tuple[int, int, int, int], size=(16, 16), adobe: bool = True) -> bytes:
    """A CMYK JPEG of one ink colour (0 = no ink), with Adobe's inverted samples or, without the
    Adobe marker, plain samples as some non-Adobe software writes them."""
    if adobe:
        return jpeg(Image.new("CMYK", size, cmyk))
    # Pillow stores CMYK inverted (Adobe style); invert first so the stored samples are the plain inks.
    data = jpeg(Image.new("CMYK", size, tuple(255 - v for v in cmyk)))
    for marker, start, end in _segments(data):
        if marker == 0xEE:  # APP14 "Adobe"
            return data[:start] + data[end:]
    raise AssertionError("Pillow wrote no Adobe marker")


def ycck_jpeg(cmyk: tuple[int, int, int, int], size=(16, 16)) -> bytes:
    """An Adobe YCCK JPEG (transform 2, as Photoshop writes) of one ink colour.

    Photoshop stores inverted inks, and YCCK codes those as YCbCr of (255 - C',
    255 - M', 255 - Y') = (C, M, Y), plus the inverted K.
    """
    c, m, y, k = cmyk
    ycc = Image.new("RGB", (1, 1), (c, m, y)).convert("YCbCr").getpixel((0, 0))
    stored = (*ycc, 255 - k)
    data = jpeg(Image.new("CMYK", size, tuple(255 - v for v in stored)))  # Pillow inverts once more
    for marker, start, end in _segments(data):
        if marker == 0xEE:
            segment = bytearray(data[start:end])
            segment[-1] = 2  # the transform flag: YCCK
            return data[:start] + bytes(segment) + data[end:]
    raise AssertionError("Pillow wrote no Adobe marker")


def damaged_scan(data: bytes, damage: str = "flipped") -> bytes:
    """A JPEG with bytes of its entropy-coded data flipped (every 10th of its last 200: a bad disk or transfer) or
    lost (37 bytes of its middle), as libjpeg still decodes it, with a warning. (Flips far from the end of a scan
    may be silent: the Huffman code falls back into step and the scan ends where it should; no decoder can tell.)"""
    d = bytearray(data)
    if damage == "flipped":
        for k in range(len(d) - 200, len(d) - 2, 10):
            if d[k] != 0xFF and d[k - 1] != 0xFF and d[k] ^ 0x5A != 0xFF:
                d[k] ^= 0x5A
    else:
        middle = (d.find(b"\xff\xda") + len(d)) // 2
        del d[middle:middle + 37]
    return bytes(d)


# --- PNG at any bit depth -------------------------------------------------------------------------


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(samples: np.ndarray, bit_depth: int, color_type: int, palette: bytes | None = None,
        trns: bytes | None = None, width: int | None = None, height: int | None = None) -> bytes:
    """A PNG of `samples` (H x W x channels, or H x W) at any bit depth, written by hand.

    `width`/`height` override the header's declared size (for bombs).
    """
    samples = np.asarray(samples)
    if samples.ndim == 2:
        samples = samples[:, :, None]
    h, w, _ = samples.shape
    rows = []
    for row in samples:
        flat = row.reshape(-1)
        if bit_depth == 16:
            raw = flat.astype(">u2").tobytes()
        elif bit_depth == 8:
            raw = flat.astype(np.uint8).tobytes()
        else:
            raw = np.packbits(np.unpackbits(flat.astype(np.uint8)[:, None], axis=1)[:, 8 - bit_depth:]).tobytes()
        rows.append(b"\x00" + raw)
    header = struct.pack(">IIBBBBB", width or w, height or h, bit_depth, color_type, 0, 0, 0)
    body = _chunk(b"IHDR", header)
    if palette is not None:
        body += _chunk(b"PLTE", palette)
    if trns is not None:
        body += _chunk(b"tRNS", trns)
    body += _chunk(b"IDAT", zlib.compress(b"".join(rows))) + _chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def png_bomb(width: int = 40_000, height: int = 40_000) -> bytes:
    """A 100-byte PNG whose header declares width x height pixels."""
    return png(np.zeros((1, 1), np.uint8), 8, 0, width=width, height=height)


# --- TIFF -----------------------------------------------------------------------------------------


def tiff_rgb16(samples: np.ndarray) -> bytes:
    """An uncompressed little-endian 16-bit RGB TIFF of H x W x 3 uint16 samples (Pillow cannot write one)."""
    h, w, _ = samples.shape
    pixels = samples.astype("<u2").tobytes()
    entries = [  # (tag, type, count, value); type 3 = SHORT, 4 = LONG
        (256, 4, 1, w), (257, 4, 1, h), (258, 3, 3, None), (259, 3, 1, 1), (262, 3, 1, 2),
        (273, 4, 1, None), (277, 3, 1, 3), (278, 4, 1, h), (279, 4, 1, len(pixels)), (284, 3, 1, 1),
    ]
    ifd_offset = 8
    ifd_size = 2 + 12 * len(entries) + 4
    bits_offset = ifd_offset + ifd_size
    pixel_offset = bits_offset + 6
    ifd = struct.pack("<H", len(entries))
    for tag, kind, count, value in entries:
        if tag == 258:
            value = bits_offset
            ifd += struct.pack("<HHII", tag, kind, count, value)
        elif tag == 273:
            ifd += struct.pack("<HHII", tag, kind, count, pixel_offset)
        elif kind == 3:
            ifd += struct.pack("<HHIHH", tag, kind, count, value, 0)
        else:
            ifd += struct.pack("<HHII", tag, kind, count, value)
    ifd += struct.pack("<I", 0)
    return b"II*\x00" + struct.pack("<I", ifd_offset) + ifd + struct.pack("<HHH", 16, 16, 16) + pixels


# --- Multi-frame ----------------------------------------------------------------------------------


def animated(format: str, colours=(RED, BLUE, GREEN), size=(24, 16), **params) -> bytes:
    """A multi-frame file (GIF, WEBP, PNG = APNG, TIFF, MPO) whose first frame is colours[0]."""
    frames = [Image.new("RGB", size, colour) for colour in colours]
    return encode(frames[0], format, save_all=True, append_images=frames[1:], **params)


def psnr(a: Image.Image, b: Image.Image) -> float:
    """Peak signal-to-noise ratio in dB of two same-size RGB images."""
    x = np.asarray(a, np.float64)
    y = np.asarray(b, np.float64)
    mse = float(np.mean((x - y) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)
