"""The fast conversion core: libjpeg-turbo (simplejpeg) decode and encode, OpenCV's SIMD resize, on numpy arrays.

Plain functions on 8-bit RGB arrays, no decisions: `transforms.images.decode` decides
which images come here (8-bit JPEG, 8-bit PNG without alpha), checks them first,
and falls back to Pillow for anything else; `transforms.images.pixels` computes
every size and box.

Why these libraries and settings (measured in BENCHMARKS.md, "Fast conversion core"):
  * simplejpeg is libjpeg-turbo with its SIMD, as Pillow's JPEG codec is: with the
    accurate integer DCT and fancy upsampling, its decoded pixels are Pillow's, bit
    for bit (its encoder, a different libjpeg-turbo build, writes the same quality
    tables and subsampling, but not always the same bytes); it asks libjpeg for a
    DCT-scaled decode (`min_width`, `min_height`).
  * OpenCV resizes: INTER_AREA (the mean over each output pixel's footprint: no
    aliasing) wherever an axis shrinks, then the filter of --resample for any
    enlarging: by cv2.resize (separable) whenever the mapping starts on a whole pixel,
    by `warpAffine` (a per-pixel map, about twice the time) only for a fractional
    source box (a centre crop of an odd difference, a crop of a DCT-scaled decode).
  * The same bytes on every worker's CPU: OpenCV 4.10's uint8 resize and warpAffine
    are fixed-point (integer tables, exact SIMD), so they give the same bytes with
    its SIMD dispatch off or on (OPENCV_CPU_DISABLE). OpenCV 5.0's new warpAffine
    kernels do not (bilinear and bicubic differ by one level in some pixels with
    AVX2), and keeping 5.0 exact took cv2.setUseOptimized(False), at half the speed:
    hence the pinned 4.10 (setup.py). Intel IPP, bundled in the wheel with its own
    per-CPU code, is switched off in every thread that converts (`_exact_kernels`:
    OpenCV keeps that switch per thread, and a new thread starts with IPP on, whose
    bicubic enlarging gives other bytes), and OpenCV's own threads are off (the pool
    and Beam already run one conversion per thread). libjpeg-turbo's SIMD is exact: the same
    bytes with JSIMD_FORCENONE=1. tests/test_fast_imaging.py checks both.
"""

from __future__ import annotations

import math
import queue
import threading

import cv2
import numpy as np
import simplejpeg

__all__ = ["INTERPOLATIONS", "decode_jpeg", "encode_jpeg", "jpeg_warning", "orient", "resample", "sums_and_squares"]

cv2.setNumThreads(1)  # one conversion per worker thread already keeps the cores busy (a process-wide setting)
_thread = threading.local()


def _exact_kernels() -> None:
    """Intel IPP off in the calling thread, once: IPP's per-CPU code need not give the same bytes on every worker,
    and its bicubic resize does not give OpenCV's own bytes. OpenCV keeps the switch per thread (a new thread
    starts with IPP on), so every function here that calls OpenCV calls this first, in whatever thread converts:
    the pool's helpers, Beam's threads, the main thread."""
    if not getattr(_thread, "exact", False):
        cv2.ipp.setUseIPP(False)
        _thread.exact = True


_exact_kernels()

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

# EXIF orientation -> the cv2 operations that make the image upright (as pixels._ORIENTATION_TRANSPOSE).
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


def decode_jpeg(data: bytes, min_width: int, min_height: int) -> np.ndarray:
    """RGB pixels (height, width, 3) of an 8-bit JPEG, at the smallest DCT scale at least this large.

    Raises:
        ValueError: for any warning or error of libjpeg (strict): a corrupt or short stream is never padded.
    """
    return simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False,
                                  min_width=min_width, min_height=min_height, strict=True)


def jpeg_warning(data: bytes) -> str | None:
    """libjpeg-turbo's warning on a JPEG's stream ("Corrupt JPEG data: 14 extraneous bytes before marker 0xd9",
    "... bad Huffman code", "... premature end of data segment", "Premature end of JPEG file"), or None when it
    decodes cleanly, or when libjpeg-turbo cannot decode it at all (a 12-bit JPEG: then Pillow's verdict stands).

    The stream is decoded at 1/8 scale in grey: every coefficient of every component is still Huffman-decoded (that
    is where damage shows), but no inverse DCT or colour conversion is done in full (about half a full decode's
    time). A warning is found by a strict decode failing where a lenient one of the same stream succeeds.
    """
    try:
        simplejpeg.decode_jpeg(data, colorspace="GRAY", min_width=1, min_height=1, strict=True)
        return None
    except ValueError as e:
        warning = str(e)
    try:
        simplejpeg.decode_jpeg(data, colorspace="GRAY", min_width=1, min_height=1, strict=False)
    except ValueError:
        return None  # an error, not a warning: libjpeg-turbo cannot decode this stream at all
    return warning


def encode_jpeg(pixels: np.ndarray, quality: int, chroma_subsampling: str) -> bytes:
    """Baseline JPEG of RGB pixels, with the settings of Pillow's save(quality=, subsampling=)."""
    return simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=quality, colorspace="RGB",
                                  colorsubsampling=_SUBSAMPLING[chroma_subsampling], fastdct=False)


def orient(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """The upright pixels for an EXIF orientation 1-8."""
    _exact_kernels()
    turn = _ORIENT.get(orientation)
    return pixels if turn is None else turn(pixels)


# The statistics split at most this many pixels at a time (a band of rows; a 512 x 512 image at once) into three
# planes, reused by the next conversion whose band has the same size (with a fixed --image_size, every one): at most
# one set per conversion running at once (never one per thread), of 3 x 2**18 bytes or less (or one row of an image
# wider than that).
_BAND = 1 << 18
_bands: queue.SimpleQueue = queue.SimpleQueue()


def sums_and_squares(pixels: np.ndarray) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Per channel (R, G, B), the exact sum and the exact sum of squares of an RGB array's values.

    Band by band, `cv2.split` into three planes, then per plane OpenCV's L1 norm (the sum, for 8-bit values) and
    squared L2 norm: both add up in integers, then in float64, which is exact to 2**53 (over 10**11 pixels).
    A float32 histogram (`cv2.calcHist`) loses counts past 2**24 pixels; this takes 0.4-0.6x its time too
    (BENCHMARKS.md, benchmarks/stats_bench.py).
    """
    _exact_kernels()
    height, width = pixels.shape[:2]
    rows = min(height, max(1, _BAND // width))
    try:
        planes = _bands.get_nowait()
    except queue.Empty:
        planes = None
    if planes is None or planes[0].shape != (rows, width):  # made for another size (the output's is the same)
        planes = [np.empty((rows, width), np.uint8) for _ in range(3)]
    sums, squares = [0, 0, 0], [0, 0, 0]
    try:
        for top in range(0, height, rows):
            band = pixels[top:top + rows]
            parts = planes if band.shape[0] == rows else [plane[:band.shape[0]] for plane in planes]
            cv2.split(band, parts)
            for c, part in enumerate(parts):
                sums[c] += int(cv2.norm(part, cv2.NORM_L1))
                squares[c] += int(cv2.norm(part, cv2.NORM_L2SQR))
    finally:
        _bands.put(planes)
    return (sums[0], sums[1], sums[2]), (squares[0], squares[1], squares[2])


def _axis_steps(start: float, end: float, limit: int, out: int) -> tuple[int, int, int]:
    """For one axis: the whole-pixel span [first, last) that holds [start, end), and its length after the
    area reduction (the output's scale when it shrinks, else unchanged)."""
    first, last = max(0, math.floor(start + _EXACT)), min(limit, math.ceil(end - _EXACT))
    last = max(last, first + 1)
    span = last - first
    scale = out / (end - start)
    return first, last, (max(1, round(span * scale)) if scale < 1 else span)


# A shrink by under 2x at a fractional scale is low-passed by a Gaussian of this many source pixels per source
# pixel of output spacing, not by INTER_AREA: OpenCV's area resize has fast code for whole factors only, and at
# 1.25x (a 640 x 480 photo to 512 x 512) took 3.1 ms against 0.34 ms at 2x. A Gaussian of sigma 0.4 x the scale
# has about the variance of Pillow's antialiased bilinear (a triangle of that half-width: s / sqrt(6) = 0.41 s);
# OpenCV's 8-bit GaussianBlur is fixed-point, the same bytes on every CPU. Measured in BENCHMARKS.md.
_BLUR_SIGMA_PER_SCALE = 0.4
_BLUR_BELOW = 2.0  # from 2x on, INTER_AREA's whole-factor reduction comes first, as before


def _is_whole(scale: float) -> bool:
    return abs(scale - round(scale)) < _EXACT


def _blurs(ax: float, ay: float, resample_filter: str) -> bool:
    """Whether a shrink by these scales (source pixels per output pixel) is low-passed by `_antialias`: every axis
    under 2x, and one that shrinks at a fractional scale. Not with --resample=area, which asks for the area
    filter itself (Pillow's box filter is the exact mean over each output pixel's footprint)."""
    if resample_filter == "area":
        return False
    shrinking = [a for a in (ax, ay) if a > 1 + _EXACT]
    return bool(shrinking) and max(shrinking) < _BLUR_BELOW and not all(_is_whole(a) for a in shrinking)


def _antialias(region: np.ndarray, ax: float, ay: float) -> np.ndarray:
    """`region` low-passed along each axis that shrinks (scale a > 1) by a Gaussian of sigma 0.4 a, before it is
    sampled at the output's spacing; edges replicated, within the region."""
    def kernel(a: float) -> tuple[int, float]:
        if a <= 1 + _EXACT:
            return 1, 0.0
        sigma = _BLUR_SIGMA_PER_SCALE * a
        return 2 * math.ceil(3 * sigma) + 1, sigma
    (kx, sx), (ky, sy) = kernel(ax), kernel(ay)
    # A sigma of 0 with a kernel size of 1 leaves that axis as it is.
    return cv2.GaussianBlur(region, (kx, ky), sigmaX=sx or 1e-6, sigmaY=sy or 1e-6,
                            borderType=cv2.BORDER_REPLICATE | cv2.BORDER_ISOLATED)


def _direct_resize(pixels: np.ndarray, box: tuple[float, float, float, float], size: tuple[int, int],
                   resample_filter: str) -> np.ndarray | None:
    """The box resized by one cv2.resize (twice warpAffine's speed), when its mapping can be Pillow's exactly:
    the box starts on whole pixels and both axes enlarge (the filter's interpolation) or both shrink
    (INTER_AREA). The scales are passed as `fx`, `fy`, so a fractional end (a DCT-scaled decode covers its
    last pixels only in part) keeps its exact scale; the output is cut to `size`. None otherwise."""
    x0, y0, x1, y1 = box
    width, height = size
    if abs(x0 - round(x0)) > _EXACT or abs(y0 - round(y0)) > _EXACT:
        return None
    ax, ay = (x1 - x0) / width, (y1 - y0) / height  # source pixels per output pixel
    enlarges, shrinks = ax <= 1 + _EXACT and ay <= 1 + _EXACT, ax >= 1 - _EXACT and ay >= 1 - _EXACT
    if not (enlarges or shrinks):
        return None
    region = pixels[round(y0):min(pixels.shape[0], math.ceil(y1 - _EXACT)),
                    round(x0):min(pixels.shape[1], math.ceil(x1 - _EXACT))]
    if not enlarges and _blurs(ax, ay, resample_filter):
        return None  # INTER_AREA at a fractional scale is OpenCV's slow generic code: `resample` blurs instead
    interpolation = _RESIZE_INTERPOLATIONS[resample_filter] if enlarges else cv2.INTER_AREA
    out = cv2.resize(region, None, fx=1 / ax, fy=1 / ay, interpolation=interpolation)
    if out.shape[0] < height or out.shape[1] < width:
        return None
    return np.ascontiguousarray(out[:height, :width])


def _whole_pixel_resize(region: np.ndarray, x_map: tuple[float, float], y_map: tuple[float, float],
                        size: tuple[int, int], interpolation: int) -> np.ndarray | None:
    """The mapping output pixel X -> region pixel a * X + b (per axis, centres at integers) done by one cv2.resize
    (separable: about half warpAffine's time), when cv2.resize can map it exactly; None otherwise.

    cv2.resize with the inverse scale fx = 1 / a maps X to a * X + a / 2 - 0.5 + k over a region starting at its
    pixel k: so it applies when, on both axes, k = b - a / 2 + 0.5 is a whole, non-negative number. This is the
    case after the area step when one axis shrinks and the other enlarges (a 640 x 480 photo to 512 x 512), the
    axis that shrank then mapped one to one (a = 1). An axis with a = 1 at a whole offset is copied as it is by
    every interpolation (its weights are 1 and 0)."""
    starts = []
    for a, b in (x_map, y_map):
        k = b - a / 2 + 0.5
        if abs(k - round(k)) > _EXACT or round(k) < 0:
            return None
        starts.append(round(k))
    (left, top), (width, height) = starts, size
    part = region[top:, left:]
    if part.size == 0:
        return None
    out = cv2.resize(part, None, fx=1 / x_map[0], fy=1 / y_map[0], interpolation=interpolation)
    if out.shape[0] < height or out.shape[1] < width:
        return None
    return np.ascontiguousarray(out[:height, :width])


def resample(pixels: np.ndarray, box: tuple[float, float, float, float], size: tuple[int, int],
             resample_filter: str) -> np.ndarray:
    """The source `box` (x0, y0, x1, y1, fractional) of `pixels` resized to `size` (width, height).

    Pillow's convention: output pixel centre X + 0.5 samples the source at x0 + (X + 0.5) * (x1 - x0) / width.
    An axis that shrinks is first reduced over the box's whole pixels by INTER_AREA to about the output's
    scale (no aliasing); what is left (the fractional offset, a scale near 1, or an enlarging) is one
    cv2.resize when it starts on a whole pixel (`_whole_pixel_resize`), else one `warpAffine`, with the filter's
    interpolation, and skipped when it would be the identity.
    """
    _exact_kernels()
    x0, y0, x1, y1 = box
    width, height = size
    direct = _direct_resize(pixels, box, size, resample_filter)
    if direct is not None:
        return direct
    fx, lx, mid_w = _axis_steps(x0, x1, pixels.shape[1], width)
    fy, ly, mid_h = _axis_steps(y0, y1, pixels.shape[0], height)
    region = pixels[fy:ly, fx:lx]
    if _blurs((x1 - x0) / width, (y1 - y0) / height, resample_filter):
        region = _antialias(region, (x1 - x0) / width, (y1 - y0) / height)
        mid_w, mid_h = lx - fx, ly - fy  # sampled at the output's spacing below, not reduced first
    elif (mid_w, mid_h) != (lx - fx, ly - fy):
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
    separable = _whole_pixel_resize(region, (ax, bx), (ay, by), size,
                                    cv2.INTER_LINEAR_EXACT if shrinks and resample_filter == "area"
                                    else _RESIZE_INTERPOLATIONS[resample_filter])
    if separable is not None:
        return separable
    interpolation = INTERPOLATIONS[resample_filter]
    if interpolation == cv2.INTER_NEAREST and shrinks:
        interpolation = cv2.INTER_LINEAR  # only the fractional offset is left of the reduction: no pixel picking
    matrix = np.array([[ax, 0.0, bx], [0.0, ay, by]])
    return cv2.warpAffine(region, matrix, (width, height), flags=interpolation | cv2.WARP_INVERSE_MAP,
                          borderMode=cv2.BORDER_REPLICATE)
