"""Generated images for the detection tests: solid rectangles on black, stored under each EXIF orientation.

`oriented_file` draws the rectangles on the upright image, stores the pixels so that applying the orientation
gives that image back, and tags the file with the orientation: the upright boxes are where they were drawn, the
stored boxes are measured in the stored pixels by colour. `measured_box` finds a rectangle in a converted image
by its colour to a fraction of a pixel (the resize blurs its edges, but keeps its integral).
"""

from __future__ import annotations

import io
from typing import NamedTuple

import numpy as np
from PIL import Image

UPRIGHT_SIZE = (800, 480)
# colour channel -> (xmin, ymin, xmax, ymax) in the upright image. A centre crop to 4:3 cuts red on the left and
# green on the right, one to 3:1 cuts red at the top and blue at the bottom.
RECTANGLES = {
    0: (40, 60, 280, 220),
    1: (440, 120, 780, 400),
    2: (240, 320, 400, 460),
}
# The orientation's transpose (as transforms.images.pixels applies it) undone: stored pixels from upright ones.
_UNDO = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


class OrientedFile(NamedTuple):
    data: bytes
    stored_size: tuple[int, int]
    upright_boxes: dict[int, tuple[int, int, int, int]]  # channel -> box, in the upright image's pixels
    stored_boxes: dict[int, tuple[int, int, int, int]]  # channel -> box, in the stored pixels


def upright_pixels(size=UPRIGHT_SIZE, rectangles=RECTANGLES) -> np.ndarray:
    pixels = np.zeros((size[1], size[0], 3), np.uint8)
    for channel, (x0, y0, x1, y1) in rectangles.items():
        pixels[y0:y1, x0:x1, channel] = 255
    return pixels


def stored_pixels(upright: np.ndarray, orientation: int) -> np.ndarray:
    method = _UNDO.get(orientation)
    return upright if method is None else np.asarray(Image.fromarray(upright).transpose(method))


def extent(plane: np.ndarray) -> tuple[int, int, int, int]:
    """(xmin, ymin, xmax, ymax) of a plane's non-zero pixels, corners at whole numbers."""
    rows, cols = np.nonzero(plane)
    return int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1


def oriented_file(orientation: int, image_format: str = "JPEG", size=UPRIGHT_SIZE,
                  rectangles=RECTANGLES) -> OrientedFile:
    """A file whose upright image shows `rectangles` (channel -> box) on black, tagged with `orientation`."""
    stored = stored_pixels(upright_pixels(size, rectangles), orientation)
    image = Image.fromarray(stored)
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    if image_format == "JPEG":
        image.save(out, "JPEG", quality=100, subsampling=0, exif=exif)
    else:
        image.save(out, "PNG", exif=exif)
    stored_boxes = {channel: extent(stored[:, :, channel] == 255) for channel in rectangles}
    return OrientedFile(out.getvalue(), image.size, dict(rectangles), stored_boxes)


def measured_box(pixels: np.ndarray, channel: int, near: tuple[float, float, float, float]):
    """The box of the rectangle of `channel` in RGB `pixels`, to a fraction of a pixel, measured along the row and
    the column through the middle of `near` (the expected box): with f the channel's share of full intensity,
    xmin = c - sum(f[:c]) and xmax = c + sum(f[c:]) for a column c inside the rectangle (a resize's filter keeps
    that sum; the edges' blur does not move it)."""
    f = pixels[:, :, channel].astype(np.float64) / 255.0
    f[f < 0.02] = 0.0  # the codec's noise on black
    cx, cy = int((near[0] + near[2]) / 2), int((near[1] + near[3]) / 2)
    row, col = f[cy], f[:, cx]
    return cx - row[:cx].sum(), cy - col[:cy].sum(), cx + row[cx:].sum(), cy + col[cy:].sum()
