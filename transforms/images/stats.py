"""Statistics of the converted dataset: pixel mean and standard deviation per channel, source sizes, upscaling.

Plain functions, no Beam. Each image's figures (`ImageStats`) come from the
conversion itself (`transforms.images.imaging`): the source's upright width and
height before resizing, and per channel the sum and the sum of squares of the
stored pixels, exact integers: on the Pillow path from Pillow's 256-bin histogram
of the resized RGB image, on the fast core from OpenCV's L1 and squared L2 norms
of its planes (`transforms.images.fast.sums_and_squares`; a float32 histogram
would lose pixels past 2**24). Both are C code, nearly free next to the resize
and the encoding. The shard writer adds
up its images per split (`StatsTally`), so one `SplitStats` per shard leaves it;
the description step merges them per split (`merge`, exact integer sums: the
result is the same in any order) and describes them (`describe`).

What the figures are:

* `mean`, `std`: per channel (R, G, B), in 0-255, over every pixel of every
  stored image of the split (the population standard deviation; divide by 255
  for 0-1 inputs). They are computed on the resized pixels *before* encoding:
  exact for PNG output and for JPEG files stored as they are (--resize_mode=none);
  for JPEG output the decoded pixels differ from them by JPEG's loss, which moves
  a mean by well under one unit (tests/test_stats.py measures it).
* `source_width`, `source_height`: histograms of the sources' upright sizes
  (after the EXIF orientation, before resizing), counts per bucket of
  `SIZE_EDGES`: bucket i holds the sides s with SIZE_EDGES[i-1] < s <= SIZE_EDGES[i]
  (the first: s <= 32), the last bucket every side over SIZE_EDGES[-1]. The
  edges are common image sizes, so "at most E pixels" is read off exactly.
* `upscaled`, `upscaled_share`: images the resize enlarged (smaller than --image_size).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import NamedTuple

import numpy as np

from transforms.base.dataset_format import SPLITS

__all__ = ["BYTES_EXPONENT", "CHANNELS", "SIZE_EDGES", "ImageStats", "SplitStats", "StatsTally", "bucket",
           "describe", "histogram_stats", "image_stats", "merge", "quantile_side", "suggest_image_size"]

CHANNELS = ("R", "G", "B")
# Upper edges (inclusive) of the source-size buckets: common image sizes.
SIZE_EDGES = (32, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 1024, 1280, 1536, 2048, 3072,
              4096, 8192)
BUCKETS = len(SIZE_EDGES) + 1
# The suggestion's size keeps this share of the sources whole (no side larger than it).
SUGGESTION_QUANTILE = 0.75
# ... and is suggested only when it has at most this share of the current size's pixels: a small step is noise.
SUGGESTION_MAX_PIXEL_RATIO = 0.5
# Bytes per image grow more slowly than its pixels (an enlarged image is smooth and compresses well), by the
# pixel ratio to a power measured between these: 128 px flowers stored at 512 px took 9x the bytes of 128 px
# for 16x the pixels (16 ** 0.79), 128 px photos 6x (16 ** 0.65), and at 256 px 2.2x (4 ** 0.56).
BYTES_EXPONENT = (0.55, 0.8)
_VALUES = np.arange(256, dtype=np.int64)
_SQUARES = _VALUES * _VALUES


class ImageStats(NamedTuple):
    """One stored image's figures: its source's upright size, and per channel (R, G, B) the pixel sum and the
    sum of squares of the stored (resized) pixels."""

    source_width: int
    source_height: int
    pixels: int  # width x height of the stored image
    sums: tuple[int, int, int]
    squares: tuple[int, int, int]


def image_stats(image, source_size: tuple[int, int]) -> ImageStats:
    """The figures of the RGB (PIL) `image` about to be stored, whose source was `source_size` upright."""
    if image.mode != "RGB":  # the converter stores RGB; anything else is made so for the figures only
        image = image.convert("RGB")
    return histogram_stats(np.asarray(image.histogram(), dtype=np.int64).reshape(3, 256), source_size)


def histogram_stats(counts: np.ndarray, source_size: tuple[int, int]) -> ImageStats:
    """The figures of a stored RGB image from its (3, 256) histogram, its source being `source_size` upright."""
    counts = np.asarray(counts, dtype=np.int64)
    sums, squares = counts @ _VALUES, counts @ _SQUARES  # at most 2**32 x 255**2 per channel: within int64
    return ImageStats(int(source_size[0]), int(source_size[1]), int(counts[0].sum()),
                      tuple(int(v) for v in sums), tuple(int(v) for v in squares))


def bucket(side: int) -> int:
    """The index of the SIZE_EDGES bucket that holds `side`."""
    return bisect_left(SIZE_EDGES, side)


class SplitStats(NamedTuple):
    """The figures of some images of one split, added up: what one shard sends, and what a split's merge gives."""

    images: int = 0
    upscaled: int = 0
    pixels: int = 0
    sums: tuple = (0, 0, 0)
    squares: tuple = (0, 0, 0)
    source_width: tuple = (0,) * BUCKETS  # images per SIZE_EDGES bucket
    source_height: tuple = (0,) * BUCKETS
    kept: int = 0  # images stored as they were (already at the output size)


def _add(a: tuple, b: tuple) -> tuple:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def merge(parts) -> SplitStats:
    """The sum of `parts` (SplitStats), field by field; exact, so in any order the same."""
    total = SplitStats()
    for part in parts:
        total = SplitStats(*(x + y if isinstance(x, int) else _add(x, y) for x, y in zip(total, part, strict=True)))
    return total


class StatsTally:
    """Adds up the images of one shard as they are written; `result()` is their SplitStats."""

    def __init__(self):
        self.images = self.upscaled = self.pixels = self.kept = 0
        self.sums, self.squares = [0, 0, 0], [0, 0, 0]
        self.widths, self.heights = [0] * BUCKETS, [0] * BUCKETS

    def add(self, stats: ImageStats | None, upscaled: bool, kept: bool = False) -> None:
        if stats is None:
            return
        self.images += 1
        self.upscaled += bool(upscaled)
        self.kept += bool(kept)
        self.pixels += stats.pixels
        for c in range(3):
            self.sums[c] += stats.sums[c]
            self.squares[c] += stats.squares[c]
        self.widths[bucket(stats.source_width)] += 1
        self.heights[bucket(stats.source_height)] += 1

    def result(self) -> SplitStats:
        return SplitStats(self.images, self.upscaled, self.pixels, tuple(self.sums), tuple(self.squares),
                          tuple(self.widths), tuple(self.heights), self.kept)


def mean_std(stats: SplitStats) -> tuple[list[float], list[float]]:
    """Per channel, the mean and the population standard deviation of the pixels, in 0-255 (zeros for none)."""
    n = stats.pixels
    if not n:
        return [0.0] * 3, [0.0] * 3
    means = [s / n for s in stats.sums]
    # n^2 var = n * sum(x^2) - (sum x)^2, exactly in integers: no cancellation
    stds = [float(np.sqrt((n * q - s * s) / (n * n))) for s, q in zip(stats.sums, stats.squares, strict=True)]
    return means, stds


def quantile_side(counts, quantile: float) -> int | None:
    """The smallest SIZE_EDGES edge that at least `quantile` of the counted sides are at most; None when that
    takes the bucket over the last edge (or nothing is counted)."""
    total = sum(counts)
    if not total:
        return None
    running = 0
    for edge, count in zip(SIZE_EDGES, counts, strict=False):
        running += count
        if running >= quantile * total:
            return edge
    return None


def _share(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def _size_text(width: int, height: int) -> str:
    return str(width) if width == height else f"{width}x{height}"


def _within(counts, side: int) -> float:
    """The share of the counted sides that are at most `side` (a SIZE_EDGES edge)."""
    total = sum(counts)
    return _share(sum(counts[:bucket(side) + 1]), total)


def suggest_image_size(total: SplitStats, width: int, height: int, resize_mode: str, total_bytes: int
                       ) -> dict | None:
    """A smaller --image_size when most images were upscaled to `width` x `height`; None otherwise.

    The size is, per side, the smallest common size (a SIZE_EDGES edge) that
    SUGGESTION_QUANTILE of the sources' sides are at most, never larger than the
    current one; square when the current size is; and only when it has at most
    SUGGESTION_MAX_PIXEL_RATIO of the current pixels. The bytes are an estimate, a range:
    the dataset's `total_bytes` scaled by the pixel ratio to each BYTES_EXPONENT.
    """
    if resize_mode in ("fit", "none") or not total.images or total.upscaled * 2 <= total.images:
        return None
    new_w = min(width, quantile_side(total.source_width, SUGGESTION_QUANTILE) or width)
    new_h = min(height, quantile_side(total.source_height, SUGGESTION_QUANTILE) or height)
    if width == height:
        new_w = new_h = max(new_w, new_h)
    ratio = new_w * new_h / (width * height)
    if ratio > SUGGESTION_MAX_PIXEL_RATIO:
        return None
    return {
        "image_size": _size_text(new_w, new_h),
        "width": new_w,
        "height": new_h,
        "upscaled_share": _share(total.upscaled, total.images),
        "sources_within": {"width": _within(total.source_width, new_w),
                           "height": _within(total.source_height, new_h)},
        "pixel_ratio": round(ratio, 4),
        "bytes": total_bytes,
        "estimated_bytes": sorted(int(total_bytes * ratio ** power) for power in BYTES_EXPONENT),
    }


def from_description(split: dict) -> SplitStats | None:
    """A split's SplitStats as `describe` recorded it (an earlier dataset's, for an append); None without its sums."""
    try:
        return SplitStats(split["images"], split["upscaled"], split["pixels"], tuple(split["sums"]),
                          tuple(split["squares"]), tuple(split["source_width"]), tuple(split["source_height"]),
                          split.get("kept", 0))
    except (KeyError, TypeError):
        return None


def describe(per_split: dict, width: int | None, height: int | None, resize_mode: str, total_bytes: int,
             splits_order=SPLITS) -> dict:
    """The "statistics" object of the dataset description, from each split's merged SplitStats.

    `width`, `height`: the output size (--image_size); `total_bytes`: the shards' bytes.
    """
    splits = {}
    for split in [s for s in splits_order if s in per_split] + sorted(set(per_split) - set(splits_order)):
        stats = per_split[split]
        means, stds = mean_std(stats)
        splits[split] = {
            "images": stats.images,
            "pixels": stats.pixels,
            "mean": [round(v, 4) for v in means],
            "std": [round(v, 4) for v in stds],
            "upscaled": stats.upscaled,
            "upscaled_share": _share(stats.upscaled, stats.images),
            "kept": stats.kept,
            "sums": list(stats.sums),  # exact integers, so that an append adds its images' (`from_description`)
            "squares": list(stats.squares),
            "source_width": list(stats.source_width),
            "source_height": list(stats.source_height),
        }
    total = merge(per_split.values())
    suggestion = None
    if width and height:
        suggestion = suggest_image_size(total, width, height, resize_mode, total_bytes)
    return {
        "channels": list(CHANNELS),
        "size_edges": list(SIZE_EDGES),
        "splits": splits,
        "suggested_image_size": suggestion,
    }
