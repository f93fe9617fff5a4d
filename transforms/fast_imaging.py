"""The fast conversion core: libjpeg-turbo (simplejpeg) decode and encode, OpenCV's SIMD resize, on numpy arrays.

Plain functions on 8-bit RGB arrays, no decisions: `transforms.imaging` decides
which images come here (8-bit JPEG, 8-bit PNG without alpha), checks them first,
computes every size and box, and falls back to Pillow for anything else.

Why these libraries and settings (measured in BENCHMARKS.md, "Fast conversion core"):
  * simplejpeg is libjpeg-turbo with its SIMD, as Pillow's JPEG codec is: with the
    accurate integer DCT and fancy upsampling, its decoded pixels are Pillow's, bit
    for bit (its encoder, a different libjpeg-turbo build, writes the same quality
    tables and subsampling, but not always the same bytes); it asks libjpeg for a
    DCT-scaled decode (`min_width`, `min_height`).
  * OpenCV resizes: INTER_AREA (the mean over each output pixel's footprint: no
    aliasing) wherever an axis shrinks, the filter of --resample for enlarging; one
    cv2.resize at the box's exact scale where both axes enlarge or both shrink (a box
    that starts between pixels by a wider span, cut: `_anchored_axis`), else a
    reduction and `warpAffine` for the exact, fractional source box.
  * The same bytes on every worker's CPU: OpenCV 4.10's uint8 resize and warpAffine
    are fixed-point (integer tables, exact SIMD), so they give the same bytes with
    its SIMD dispatch off or on (OPENCV_CPU_DISABLE). OpenCV 5.0's new warpAffine
    kernels do not (bilinear and bicubic differ by one level in some pixels with
    AVX2), and keeping 5.0 exact took cv2.setUseOptimized(False), at half the speed:
    hence the pinned 4.10 (setup.py). Intel IPP, bundled in the wheel with its own
    per-CPU code, is switched off, and so are OpenCV's own threads (the pool and Beam
    already run one conversion per thread). libjpeg-turbo's SIMD is exact: the same
    bytes with JSIMD_FORCENONE=1. tests/test_fast_imaging.py checks both.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import simplejpeg

__all__ = ["INTERPOLATIONS", "PADDED_FILTERS", "decode_jpeg", "encode_jpeg", "histogram", "orient", "resample",
           "rgb"]

cv2.setNumThreads(1)  # one conversion per worker thread already keeps the cores busy
cv2.ipp.setUseIPP(False)  # IPP's per-CPU code paths need not give the same bytes on every worker

# --resample -> the OpenCV interpolation used for the fractional box and for enlarging. Pillow's "area" (a box
# filter) enlarges by repeating pixels: nearest neighbour. OpenCV's bicubic is a = -0.75 (Pillow's -0.5) and its
# Lanczos has 4 lobes (Pillow's 3): within 40 dB of Pillow on photos (tests/test_fast_imaging.py).
INTERPOLATIONS = {
    "bilinear": cv2.INTER_LINEAR,
    "area": cv2.INTER_NEAREST,
    "bicubic": cv2.INTER_CUBIC,
    "lanczos": cv2.INTER_LANCZOS4,
}
# The same for cv2.resize (a whole-pixel box, enlarging). Its INTER_NEAREST picks floor(X * scale), not the
# pixel under the output pixel's centre as Pillow does: INTER_NEAREST_EXACT does. Its 8-bit INTER_LINEAR
# rounds down: the pixels' mean comes out 0.13 lower (the dataset's statistics would show it);
# INTER_LINEAR_EXACT rounds to nearest, and is bit-exact on every CPU by design.
_RESIZE_INTERPOLATIONS = {**INTERPOLATIONS, "bilinear": cv2.INTER_LINEAR_EXACT, "area": cv2.INTER_NEAREST_EXACT}
_SUBSAMPLING = {"4:4:4": "444", "4:2:2": "422", "4:2:0": "420"}
# The filters whose enlarging is faster on RGBX than on RGB pixels (a 500 x 375 photo to 512 x 512, one thread:
# INTER_LINEAR_EXACT 0.86 against 1.36 ms, warpAffine 2.3 against 2.8 ms, the encoding 1.6 against 1.8 ms);
# INTER_AREA (shrinking), bicubic and Lanczos are 10-20 % slower on RGBX.
PADDED_FILTERS = ("bilinear", "area")

# EXIF orientation -> the cv2 operations that make the image upright (as imaging._ORIENTATION_TRANSPOSE).
_ORIENT = {
    2: lambda a: cv2.flip(a, 1),
    3: lambda a: cv2.rotate(a, cv2.ROTATE_180),
    4: lambda a: cv2.flip(a, 0),
    5: cv2.transpose,
    6: lambda a: cv2.rotate(a, cv2.ROTATE_90_CLOCKWISE),
    7: lambda a: cv2.flip(cv2.transpose(a), -1),
    8: lambda a: cv2.rotate(a, cv2.ROTATE_90_COUNTERCLOCKWISE),
}
_EXACT = 1e-9  # a scale or an offset this close to the identity is the identity
# A start this close to a whole pixel is one: 1/65536 of a pixel, the step of cv2.resize's own fixed-point positions.
_ALIGNED = 1 / 65536
# Source pixels each filter reads on either side of a sample when it enlarges.
# "area" (nearest) none, and only a box that starts on whole pixels: INTER_NEAREST_EXACT takes its scale from the
# sizes (count / output), not from `fx`, so only that span gives Pillow's exact picks.
_SUPPORT = {"bilinear": 1, "area": 0, "bicubic": 2, "lanczos": 4}


def decode_jpeg(data: bytes, min_width: int, min_height: int, padded: bool = False) -> np.ndarray:
    """RGB pixels (height, width, 3) of an 8-bit JPEG, at the smallest DCT scale at least this large; with `padded`
    RGBX (height, width, 4: the same RGB, a fourth byte the encoder ignores), which OpenCV's bilinear resize and
    warpAffine and libjpeg-turbo's encoder take faster than RGB (see `PADDED_FILTERS`).

    Raises:
        ValueError: for any warning or error of libjpeg (strict): a corrupt or short stream is never padded.
    """
    return simplejpeg.decode_jpeg(data, colorspace="RGBX" if padded else "RGB", fastdct=False, fastupsample=False,
                                  min_width=min_width, min_height=min_height, strict=True)


def encode_jpeg(pixels: np.ndarray, quality: int, chroma_subsampling: str) -> bytes:
    """Baseline JPEG of RGB (or RGBX) pixels, with the settings of Pillow's save(quality=, subsampling=): the same
    bytes either way."""
    return simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=quality,
                                  colorspace="RGBX" if pixels.shape[2] == 4 else "RGB",
                                  colorsubsampling=_SUBSAMPLING[chroma_subsampling], fastdct=False)


def rgb(pixels: np.ndarray) -> np.ndarray:
    """RGB pixels (height, width, 3) of RGB or RGBX ones."""
    return pixels if pixels.shape[2] == 3 else cv2.cvtColor(pixels, cv2.COLOR_RGBA2RGB)


def orient(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """The upright pixels for an EXIF orientation 1-8."""
    turn = _ORIENT.get(orientation)
    return pixels if turn is None else turn(pixels)


def histogram(pixels: np.ndarray) -> np.ndarray:
    """The (3, 256) counts of each of the R, G and B channels' values (of RGB or RGBX pixels)."""
    counts = [cv2.calcHist([pixels], [c], None, [256], [0, 256]).reshape(256) for c in range(3)]
    return np.stack(counts).astype(np.int64)


def _axis_steps(start: float, end: float, limit: int, out: int) -> tuple[int, int, int]:
    """For one axis: the whole-pixel span [first, last) that holds [start, end), and its length after the
    area reduction (the output's scale when it shrinks, else unchanged)."""
    first, last = max(0, math.floor(start + _EXACT)), min(limit, math.ceil(end - _EXACT))
    last = max(last, first + 1)
    span = last - first
    scale = out / (end - start)
    return first, last, (max(1, round(span * scale)) if scale < 1 else span)


def _anchored_axis(start: float, end: float, limit: int, out: int, support: int) -> tuple[int, int, int] | None:
    """For one axis of the box [start, end) to `out` pixels: (first, count, skip) such that cv2.resize of the source
    pixels [first, first + count) at the box's exact scale puts the box's output pixel X at its pixel X + skip.

    cv2.resize samples output pixel i at first + (i + 0.5) * a - 0.5 (a = source pixels per output pixel), the
    box at start + (X + 0.5) * a - 0.5: the two agree where start - skip * a is a whole pixel `first`. A box that
    starts on a whole pixel has skip 0; a centre crop of an odd difference (start k + 0.5) to 512 has skip 256
    (256 * a is then a whole number plus a half). `first` may lie before the image and first + count past it (the
    caller pads by repeating the edge pixels, as the filters do at an edge); the span reaches `support` pixels
    past the box where the image has them, so the filter sees the pixels around the box, as Pillow's does.
    None when no skip up to `out` // 2 aligns (the extra output would cost more than warpAffine saves).
    """
    a = (end - start) / out
    if abs(start - round(start)) < _ALIGNED:
        skip, first = 0, round(start)
    else:
        firsts = start - np.arange(out // 2 + 1) * a  # every skip up to out / 2
        aligned = np.flatnonzero(np.abs(firsts - np.rint(firsts)) < _ALIGNED)
        if not aligned.size:
            return None
        skip = int(aligned[0])
        first = round(float(firsts[skip]))
    count = max(math.ceil((skip + out) * a - _EXACT), min(limit, math.ceil(end - _EXACT) + support) - first)
    return first, count, skip


def _padded(pixels: np.ndarray, rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
    """pixels[rows[0]:rows[1], cols[0]:cols[1]], its parts outside the image the nearest edge pixels (a view when
    it lies inside)."""
    height, width = pixels.shape[:2]
    top, bottom, left, right = max(0, -rows[0]), max(0, rows[1] - height), max(0, -cols[0]), max(0, cols[1] - width)
    inside = pixels[max(0, rows[0]):min(height, rows[1]), max(0, cols[0]):min(width, cols[1])]
    if top == bottom == left == right == 0:
        return inside
    return cv2.copyMakeBorder(inside, top, bottom, left, right, cv2.BORDER_REPLICATE)


def _direct_resize(pixels: np.ndarray, box: tuple[float, float, float, float], size: tuple[int, int],
                   resample_filter: str) -> np.ndarray | None:
    """The box resized by one cv2.resize (twice warpAffine's speed, or more), when its mapping can be Pillow's
    exactly: both axes enlarge (the filter's interpolation) or both shrink (INTER_AREA). The scales are passed as
    `fx`, `fy`, so a fractional end (a DCT-scaled decode covers its last pixels only in part) keeps its exact
    scale; a fractional start is placed by resizing a wider span and cutting the output (`_anchored_axis`).
    None otherwise, or when the extra output would cost more than 60 % of the output's own."""
    x0, y0, x1, y1 = box
    width, height = size
    ax, ay = (x1 - x0) / width, (y1 - y0) / height  # source pixels per output pixel
    enlarges, shrinks = ax <= 1 + _EXACT and ay <= 1 + _EXACT, ax >= 1 - _EXACT and ay >= 1 - _EXACT
    if not (enlarges or shrinks):
        return None
    support = _SUPPORT[resample_filter] if enlarges else 0
    across = _anchored_axis(x0, x1, pixels.shape[1], width, support)
    down = _anchored_axis(y0, y1, pixels.shape[0], height, support)
    if across is None or down is None or (width + across[2]) * (height + down[2]) > 1.6 * width * height:
        return None
    if enlarges and resample_filter == "area" and across[2] + down[2] > 0:
        return None
    (left, columns, skip_x), (top, rows, skip_y) = across, down
    region = _padded(pixels, (top, top + rows), (left, left + columns))
    interpolation = _RESIZE_INTERPOLATIONS[resample_filter] if enlarges else cv2.INTER_AREA
    out = cv2.resize(region, None, fx=1 / ax, fy=1 / ay, interpolation=interpolation)
    if out.shape[0] < skip_y + height or out.shape[1] < skip_x + width:
        return None
    return np.ascontiguousarray(out[skip_y:skip_y + height, skip_x:skip_x + width])


def resample(pixels: np.ndarray, box: tuple[float, float, float, float], size: tuple[int, int],
             resample_filter: str) -> np.ndarray:
    """The source `box` (x0, y0, x1, y1, fractional) of `pixels` resized to `size` (width, height).

    Pillow's convention: output pixel centre X + 0.5 samples the source at x0 + (X + 0.5) * (x1 - x0) / width.
    An axis that shrinks is first reduced over the box's whole pixels by INTER_AREA to about the output's
    scale (no aliasing); what is left (the fractional offset, a scale near 1, or an enlarging) is one
    `warpAffine` with the filter's interpolation, skipped when it would be the identity.
    """
    x0, y0, x1, y1 = box
    width, height = size
    direct = _direct_resize(pixels, box, size, resample_filter)
    if direct is not None:
        return direct
    fx, lx, mid_w = _axis_steps(x0, x1, pixels.shape[1], width)
    fy, ly, mid_h = _axis_steps(y0, y1, pixels.shape[0], height)
    region = pixels[fy:ly, fx:lx]
    if (mid_w, mid_h) != (lx - fx, ly - fy):
        region = cv2.resize(region, (mid_w, mid_h), interpolation=cv2.INTER_AREA)
    rx, ry = mid_w / (lx - fx), mid_h / (ly - fy)  # reduced pixels per source pixel
    # Output pixel X -> reduced-image pixel coordinate (centres at integers), per axis: X * a + b.
    ax, ay = (x1 - x0) / width * rx, (y1 - y0) / height * ry
    bx, by = (x0 - fx + 0.5 * (x1 - x0) / width) * rx - 0.5, (y0 - fy + 0.5 * (y1 - y0) / height) * ry - 0.5
    if (abs(ax - 1) < _EXACT and abs(ay - 1) < _EXACT and abs(bx - round(bx)) < _EXACT
            and abs(by - round(by)) < _EXACT and 0 <= round(bx) and round(bx) + width <= region.shape[1]
            and 0 <= round(by) and round(by) + height <= region.shape[0]):
        left, top = round(bx), round(by)
        return np.ascontiguousarray(region[top:top + height, left:left + width])
    shrinks = ax > 1 + _EXACT or ay > 1 + _EXACT
    interpolation = INTERPOLATIONS[resample_filter]
    if interpolation == cv2.INTER_NEAREST and shrinks:
        interpolation = cv2.INTER_LINEAR  # only the fractional offset is left of the reduction: no pixel picking
    matrix = np.array([[ax, 0.0, bx], [0.0, ay, by]])
    return cv2.warpAffine(region, matrix, (width, height), flags=interpolation | cv2.WARP_INVERSE_MAP,
                          borderMode=cv2.BORDER_REPLICATE)
