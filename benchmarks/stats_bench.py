"""The per-image statistics' cost (issue 28): ways to take an RGB array's per-channel sums and sums of squares.

    python -m benchmarks.stats_bench                  # 224x224, 512x512, 1800x1200; 5 alternating rounds
    python -m benchmarks.stats_bench --rounds 9 --json out.json

One thread, one process, the contenders in alternating rounds on the same photo-like
pixels; the figure is CPU ms per image (`time.process_time`), so other load on a shared
machine moves it little. Each contender's result is checked against numpy's int64 sums
first, on an image of over 2**24 pixels too, where a float32 count is no longer exact.
  * calcHist_float32: three `cv2.calcHist` calls, counts times values (the fast core before
    issue 28's exactness fix: a float32 count past 2**24 loses pixels, so it fails the check);
  * calcHist_chunks: the same over row bands of at most 2**24 pixels, counts added in int64;
  * split_norms: `cv2.split` into whole per-thread planes, then per plane `cv2.norm` L1 (the sum)
    and L2SQR (the sum of squares), both accumulated in integers, then float64;
  * split_norms_fresh: the same with planes allocated for each image;
  * sums_and_squares: what the fast core does (`transforms.images.fast.sums_and_squares`): the
    same band by band (at most 2**18 pixels), in planes reused by the next conversion whose band
    has the same size (at most one set per conversion at once, never one per thread);
  * split_sumElems: `cv2.sumElems` of the interleaved array for the sums, L2SQR per plane;
  * numpy_uint64: `np.sum(dtype=uint64)` and `np.einsum` of the squares.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import cv2
import numpy as np

from transforms.images import fast as fast_imaging

cv2.setNumThreads(1)
cv2.ipp.setUseIPP(False)  # as the fast core converts (transforms.images.fast)
_local = threading.local()
_CHUNK = 1 << 24
_VALUES = np.arange(256, dtype=np.int64)


def _planes(pixels: np.ndarray) -> list[np.ndarray]:
    shape = pixels.shape[:2]
    planes = getattr(_local, "planes", None)
    if planes is None or planes[0].shape != shape:
        planes = _local.planes = [np.empty(shape, np.uint8) for _ in range(3)]
    cv2.split(pixels, planes)
    return planes


def _from_counts(counts: np.ndarray):
    return tuple(int(v) for v in counts @ _VALUES), tuple(int(v) for v in counts @ (_VALUES * _VALUES))


def calcHist_float32(pixels):
    return _from_counts(np.stack([cv2.calcHist([pixels], [c], None, [256], [0, 256]).reshape(256)
                                  for c in range(3)]).astype(np.int64))


def calcHist_chunks(pixels):
    step = max(1, _CHUNK // pixels.shape[1])
    counts = np.zeros((3, 256), np.int64)
    for top in range(0, pixels.shape[0], step):
        band = pixels[top:top + step]
        for c in range(3):
            counts[c] += cv2.calcHist([band], [c], None, [256], [0, 256]).reshape(256).astype(np.int64)
    return _from_counts(counts)


def split_norms(pixels):
    planes = _planes(pixels)
    return (tuple(int(cv2.norm(p, cv2.NORM_L1)) for p in planes),
            tuple(int(cv2.norm(p, cv2.NORM_L2SQR)) for p in planes))


def split_norms_fresh(pixels):
    planes = cv2.split(pixels)
    return (tuple(int(cv2.norm(p, cv2.NORM_L1)) for p in planes),
            tuple(int(cv2.norm(p, cv2.NORM_L2SQR)) for p in planes))


def split_sumElems(pixels):
    planes = _planes(pixels)
    return (tuple(int(v) for v in cv2.sumElems(pixels)[:3]),
            tuple(int(cv2.norm(p, cv2.NORM_L2SQR)) for p in planes))


def numpy_uint64(pixels):
    flat = pixels.reshape(-1, 3)
    return (tuple(int(v) for v in flat.sum(0, dtype=np.uint64)),
            tuple(int(v) for v in np.einsum("ij,ij->j", flat, flat, dtype=np.uint64)))


def sums_and_squares(pixels):
    return fast_imaging.sums_and_squares(pixels)


CONTENDERS = {f.__name__: f for f in (calcHist_float32, calcHist_chunks, split_norms, split_norms_fresh,
                                      sums_and_squares, split_sumElems, numpy_uint64)}


def photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients and mild texture (a histogram's cost does not depend on the values, a check's might)."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    rng = np.random.default_rng(seed)
    out = np.empty((height, width, 3), np.uint8)
    for c in range(3):
        fx, fy = rng.uniform(1, 4, 2)
        out[..., c] = np.clip(128 + 90 * np.sin(xx / width * fx * np.pi) * np.cos(yy / height * fy * np.pi)
                              + 10 * np.sin(xx / 5.0 + c), 0, 255)
    return out


def reference(pixels: np.ndarray):
    flat = pixels.reshape(-1, 3).astype(np.int64)
    return tuple(int(v) for v in flat.sum(0)), tuple(int(v) for v in (flat * flat).sum(0))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="224x224,512x512,1800x1200")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    big = np.full((4101, 4201, 3), 200, np.uint8)  # 17,228,301 pixels: odd counts over 2**24
    big[:50, :, 1] = np.arange(4201, dtype=np.uint64)[None, :] % 256
    exact = {name: f(big) == reference(big) for name, f in CONTENDERS.items()}
    results = {"exact_past_2**24_pixels": exact, "ms_per_image": {}}
    for size in args.sizes.split(","):
        width, height = (int(v) for v in size.split("x"))
        pixels = photo(width, height)
        for name, f in CONTENDERS.items():
            assert f(pixels) == reference(pixels), name  # below 2**24 pixels every way is exact
        repeat = max(3, int(2e7 // (width * height)))
        times = {name: [] for name in CONTENDERS}
        for _ in range(args.rounds):
            for name, f in CONTENDERS.items():
                started = time.process_time()
                for _ in range(repeat):
                    f(pixels)
                times[name].append((time.process_time() - started) / repeat * 1000)
        results["ms_per_image"][size] = {name: {"min": round(min(t), 4), "median": round(statistics.median(t), 4),
                                                "max": round(max(t), 4)} for name, t in times.items()}
    print(f"exact past 2**24 pixels: {exact}")
    for size, figures in results["ms_per_image"].items():
        base = figures["calcHist_float32"]["median"]
        for name, f in figures.items():
            print(f"{size:>10} {name:>17}: {f['median']:.3f} ms (min {f['min']:.3f}, max {f['max']:.3f}), "
                  f"{f['median'] / base:.2f}x calcHist_float32")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
