"""The fast conversion core (transforms/images/fast.py) against the Pillow path: pixels, sizes, orientation,
aliasing, which files take it, and the same bytes across runs, processes and SIMD off or on."""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from PIL import Image

from tests import image_cases as cases
from transforms.images import fast as fast_imaging
from transforms.images.diagnosis import ImageRejected
from transforms.images.imaging import convert_image
from transforms.images.pixels import RESAMPLE_FILTERS, RESIZE_MODES
from transforms.images.pool import ConversionPool
from transforms.images.settings import ImageSettings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A smooth photo-like scene: colour gradients, soft blobs and mild texture, no pixel noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    pixels = np.empty((height, width, 3))
    for c in range(3):
        fx, fy, phase = rng.uniform(1, 4, 2).tolist() + [rng.uniform(0, 6.3)]
        pixels[..., c] = 120 + 60 * np.sin(xx / width * fx * np.pi + phase) * np.cos(yy / height * fy * np.pi)
        for _ in range(4):
            cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(0.05, 0.2) * min(width, height)
            pixels[..., c] += rng.uniform(-60, 60) * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))
        pixels[..., c] += 8 * np.sin(xx / 7.0 + c) * np.sin(yy / 9.0)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def pixels_of(encoded) -> Image.Image:
    return Image.open(io.BytesIO(encoded.data)).convert("RGB")


def both(data: bytes, **settings):
    """The fast path's and the Pillow path's outputs for the same file and settings."""
    fast = convert_image(data, ImageSettings(**settings))
    pillow = convert_image(data, ImageSettings(image_backend="pillow", **settings))
    return fast, pillow


SMALL = cases.jpeg(photo(300, 200, seed=1), quality=95)  # enlarged to 512 x 384
LARGE = cases.jpeg(photo(1400, 1000, seed=2), quality=95)  # shrunk, through a DCT-scaled decode
MIDDLE_PNG = cases.encode(photo(700, 500, seed=3), "PNG")  # shrunk without a scaled decode
MIXED = cases.jpeg(photo(640, 480, seed=4), quality=95)  # to 512 x 512: shrunk across, enlarged down


@pytest.mark.parametrize("source", ["enlarging", "shrinking", "shrinking_png", "mixed"])
@pytest.mark.parametrize("resample", sorted(RESAMPLE_FILTERS))
@pytest.mark.parametrize("resize_mode", [m for m in RESIZE_MODES if m != "none"])
def test_fast_pixels_match_pillow_within_40_db(source, resample, resize_mode):
    data = {"enlarging": SMALL, "shrinking": LARGE, "shrinking_png": MIDDLE_PNG, "mixed": MIXED}[source]
    height = {"enlarging": 384, "mixed": 512}.get(source, 256)
    fast, pillow = both(data, width=512, height=height, resize_mode=resize_mode,
                        resample=resample, image_format="png", background=(10, 200, 30))
    assert (fast.width, fast.height, fast.upscaled) == (pillow.width, pillow.height, pillow.upscaled)
    assert cases.psnr(pixels_of(fast), pixels_of(pillow)) >= 40.0


def test_resize_mode_none_keeps_the_pixels_and_passes_a_baseline_jpeg_through():
    fast, pillow = both(SMALL, resize_mode="none")
    assert fast.data == pillow.data == SMALL  # stored as it is: no generation loss
    fast, pillow = both(MIDDLE_PNG, resize_mode="none", image_format="png")
    assert fast.data == pillow.data  # the same pixels, the same PNG encoder


def test_the_jpeg_encoder_keeps_quality_and_subsampling():
    data = cases.encode(photo(512, 512, seed=4), "PNG")
    for subsampling, factors in (("4:4:4", (1, 1)), ("4:2:2", (2, 1)), ("4:2:0", (2, 2))):
        fast, pillow = both(data, chroma_subsampling=subsampling, jpeg_quality=87)
        for encoded in (fast, pillow):
            image = Image.open(io.BytesIO(encoded.data))
            assert image.layers == 3 and image.layer[0][1:3] == factors
        assert abs(len(fast.data) - len(pillow.data)) < 0.02 * len(pillow.data)
        assert cases.psnr(pixels_of(fast), pixels_of(pillow)) >= 45.0


def zone_plate(size: int) -> Image.Image:
    """Rings whose frequency rises from 0 at the centre to the Nyquist frequency at the edge's midpoints."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64) - size / 2
    k = np.pi / size  # local frequency k * r / pi cycles per pixel: 0.5 at r = size / 2
    return Image.fromarray(np.clip(127.5 + 127.5 * np.cos(k * (xx * xx + yy * yy)), 0, 255).astype(np.uint8), "L")


@pytest.mark.parametrize("resample", sorted(RESAMPLE_FILTERS))
def test_a_zone_plate_shrunk_4x_does_not_alias(resample):
    size = 1024
    out = size // 4
    data = cases.encode(zone_plate(size), "PNG")
    fast = convert_image(data, ImageSettings(width=out, height=out, resample=resample, image_format="png"))
    shrunk = np.asarray(pixels_of(fast).convert("L"), np.float64)
    decimated = np.asarray(zone_plate(size), np.float64)[2::4, 2::4]  # plain point sampling: aliases
    yy, xx = np.mgrid[0:out, 0:out] - out / 2 + 0.5
    # Where the source's rings are over twice the output's Nyquist frequency: a filtered image is flat grey.
    beyond = np.hypot(xx, yy) > out / 2 * 0.5
    assert decimated[beyond].std() > 60  # the moire a sampling without a filter makes
    assert shrunk[beyond].std() < 0.2 * decimated[beyond].std()
    assert abs(shrunk[beyond].mean() - 127.5) < 4


@pytest.mark.parametrize("resample", sorted(RESAMPLE_FILTERS))
def test_a_zone_plate_shrunk_by_a_fractional_scale_under_2x_does_not_alias(resample):
    # 1024 to 640 (1.6x): low-passed by a Gaussian, then sampled. Where the source's rings are between the
    # output's Nyquist frequency (0.31 cycles per source pixel) and the source's own (0.5), point sampling makes
    # a strong moire (a std of 90); a filtered image keeps little of it (Pillow's antialiased filters 17-22, this
    # path 15-24, the area reduction it used before 29) and keeps the rings well below it. --resample=area asks
    # for the box filter itself, which keeps more (29 here; Pillow's own box filter 57).
    size, out = 1024, 640
    data = cases.encode(zone_plate(size), "PNG")
    fast = convert_image(data, ImageSettings(width=out, height=out, resample=resample, image_format="png"))
    shrunk = np.asarray(pixels_of(fast).convert("L"), np.float64)
    yy, xx = np.mgrid[0:out, 0:out] - out / 2 + 0.5
    cycles = np.hypot(xx, yy) / out  # the rings' frequency in cycles per source pixel
    sampled = np.asarray(zone_plate(size).resize((out, out), Image.Resampling.NEAREST), np.float64)
    folded, kept = (cycles > 0.35) & (cycles < 0.5), cycles < 0.15
    assert sampled[folded].std() > 80
    assert shrunk[folded].std() < (0.35 if resample == "area" else 0.3) * sampled[folded].std()
    assert shrunk[kept].std() > 0.8 * sampled[kept].std()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_sizes_and_orientation_match_pillow(orientation):
    upright = photo(96, 64, seed=5)
    upright.paste(cases.quadrants(48, 32), (0, 0))  # a corner that shows any flip or rotation
    data = cases.jpeg(cases.oriented(upright, orientation), exif=cases.exif_orientation(orientation))
    for resize_mode in ("stretch", "crop", "fit", "none"):
        fast, pillow = both(data, width=60, height=50, resize_mode=resize_mode, image_format="png")
        assert (fast.width, fast.height) == (pillow.width, pillow.height)
        assert fast.stats.source_width == pillow.stats.source_width == 96
        # The quadrants' sharp edges shrunk 1.6x: the area filter and Pillow's differ there by a few levels,
        # a wrong flip or turn by a hundred (under 15 dB).
        assert cases.psnr(pixels_of(fast), pixels_of(pillow)) >= 30.0
    fast = convert_image(data, ImageSettings(resize_mode="none", image_format="png"))
    assert pixels_of(fast).getpixel((2, 2)) == pytest.approx(cases.RED, abs=12)  # red top-left: upright


def test_statistics_are_those_of_the_stored_pixels():
    encoded = convert_image(LARGE, ImageSettings(width=200, height=150, image_format="png"))
    stored = np.asarray(pixels_of(encoded), np.int64).reshape(-1, 3)
    assert encoded.stats.sums == tuple(int(v) for v in stored.sum(0))
    assert encoded.stats.squares == tuple(int(v) for v in (stored * stored).sum(0))
    assert encoded.stats.pixels == 200 * 150



def _exact_sums(pixels: np.ndarray) -> tuple[tuple, tuple]:
    flat = np.asarray(pixels, np.int64).reshape(-1, 3)
    return tuple(int(v) for v in flat.sum(0)), tuple(int(v) for v in (flat * flat).sum(0))


def test_statistics_stay_exact_past_2_24_pixels():
    # 4201 x 4101 = 17,228,301 pixels, most of one value in each channel: a float32 count (cv2.calcHist's) holds
    # integers exactly only up to 2**24, and lost pixels (200 of the red sum, the pixel count itself).
    width, height = 4201, 4101
    source = np.empty((height, width, 3), np.uint8)
    source[..., 0] = 200
    source[:100, :, 0] = np.arange(width, dtype=np.uint64)[None, :] % 256
    source[..., 1] = (np.arange(width, dtype=np.uint64) % 256)[None, :]
    source[..., 2] = 255
    source[7, 11] = (1, 2, 3)
    encoded = convert_image(cases.encode(Image.fromarray(source), "PNG"),
                            ImageSettings(resize_mode="none", image_format="png"))
    stored = np.asarray(pixels_of(encoded))
    assert (stored == source).all()
    sums, squares = _exact_sums(source)
    assert sums[2] > 2**32  # the sums themselves are past what a float32 (or an int32) holds
    assert encoded.stats.pixels == width * height
    assert (encoded.stats.sums, encoded.stats.squares) == (sums, squares)


@pytest.mark.parametrize("shape", [(3, 5), (1000, 301), (2, (1 << 17) + 3), (64, 64)])
def test_sums_and_squares_are_numpys_exact_ones_band_by_band(shape):
    pixels = np.random.default_rng(shape[1]).integers(0, 256, (*shape, 3), dtype=np.uint8)
    assert fast_imaging.sums_and_squares(pixels) == _exact_sums(pixels)
    turned = pixels.transpose(1, 0, 2)  # a view that is not contiguous
    assert fast_imaging.sums_and_squares(turned) == _exact_sums(turned)


FAST = {
    "baseline RGB JPEG": cases.jpeg(photo(40, 30)),
    "progressive RGB JPEG": cases.jpeg(photo(40, 30), progressive=True),
    "4:2:0 JPEG": cases.jpeg(photo(40, 30), subsampling=2),
    "greyscale JPEG": cases.jpeg(photo(40, 30).convert("L")),
    "RGB PNG": cases.encode(photo(40, 30), "PNG"),
    "greyscale PNG": cases.encode(photo(40, 30).convert("L"), "PNG"),
}
PILLOW = {
    "CMYK JPEG": cases.cmyk_jpeg((0, 255, 255, 0)),
    "YCCK JPEG": cases.ycck_jpeg((0, 255, 255, 0)),
    "arithmetic JPEG": cases.ARITHMETIC_JPEG,
    "MPO": cases.animated("MPO"),
    "RGBA PNG": cases.encode(photo(40, 30).convert("RGBA"), "PNG"),
    "palette PNG": cases.encode(photo(40, 30).convert("P"), "PNG"),
    "16-bit PNG": cases.png(np.full((8, 8), 40000, np.uint16), 16, 0),
    "animated PNG": cases.animated("PNG"),
    "GIF": cases.encode(photo(40, 30).convert("P"), "GIF"),
    "TIFF": cases.encode(photo(40, 30), "TIFF"),
    "WebP": cases.encode(photo(40, 30), "WEBP"),
    "BMP": cases.encode(photo(40, 30), "BMP"),
}


def _fast_core_broken(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the fast core was used")

    monkeypatch.setattr(fast_imaging, "resample", broken)
    monkeypatch.setattr(fast_imaging, "encode_jpeg", broken)


@pytest.mark.parametrize("name", sorted(FAST))
def test_the_common_case_takes_the_fast_core(name, monkeypatch):
    _fast_core_broken(monkeypatch)
    with pytest.raises(ImageRejected) as error:
        convert_image(FAST[name], ImageSettings(width=64, height=64))
    assert error.value.reason == "internal_error" and "the fast core was used" in error.value.detail
    assert convert_image(FAST[name], ImageSettings(width=64, height=64, image_backend="pillow")).width == 64


@pytest.mark.parametrize("name", sorted(PILLOW))
def test_everything_else_stays_on_pillow(name, monkeypatch):
    _fast_core_broken(monkeypatch)
    assert convert_image(PILLOW[name], ImageSettings(width=64, height=64)).width == 64


def test_a_jpeg_libjpeg_turbo_refuses_gets_pillows_verdict():
    data = FAST["baseline RGB JPEG"]
    cut = data[: len(data) * 2 // 3]
    fast, pillow = (pytest.raises(ImageRejected), pytest.raises(ImageRejected))
    with fast as fast_error:
        convert_image(cut, ImageSettings())
    with pillow as pillow_error:
        convert_image(cut, ImageSettings(image_backend="pillow"))
    assert fast_error.value.reason == pillow_error.value.reason == "truncated"
    assert fast_error.value.detail == pillow_error.value.detail


_DIGEST_SCRIPT = """
import hashlib, itertools, sys
sys.path.insert(0, sys.argv[1])
from tests.test_fast_imaging import digest
print(digest())
"""


WIDE = cases.jpeg(photo(320, 100, seed=5), quality=95)  # to the records' 224 x 160: shrunk across, enlarged down


@pytest.mark.parametrize("resample", sorted(RESAMPLE_FILTERS))
def test_one_axis_shrinking_and_the_other_enlarging_is_two_separable_resizes(resample, monkeypatch):
    # 640 x 480 to 512 x 512, a common case: the area step across, then the filter down, both by cv2.resize
    # (separable); warpAffine, a per-pixel 2-D map at about twice the time, is not needed for it.
    pixels = np.asarray(photo(640, 480, seed=4))
    monkeypatch.setattr(fast_imaging.cv2, "warpAffine", lambda *a, **k: pytest.fail("warpAffine was called"))
    out = fast_imaging.resample(pixels, (0.0, 0.0, 640.0, 480.0), (512, 512), resample)
    assert out.shape == (512, 512, 3)
    reference = np.asarray(Image.fromarray(pixels).resize((512, 512), RESAMPLE_FILTERS[resample]))
    assert cases.psnr(Image.fromarray(out), Image.fromarray(reference)) >= 40.0


# Stored as it is in every mode (its image data only: no EXIF, no comment, nothing after its end).
AT_SIZE_WITH_METADATA = cases.jpeg(photo(224, 160, seed=6), quality=90, exif=cases.exif_orientation(1),
                                   comment=b"a note") + b"trailing bytes"


def records() -> dict:
    """Each record's image bytes by (source, resize mode, filter, format): every mode and filter, shrinking
    (the photos) and enlarging (the 40 x 30 JPEGs)."""
    sources = {"small photo": SMALL, "large photo": LARGE, "PNG photo": MIDDLE_PNG, "wide photo": WIDE,
               "40 x 30 RGB JPEG": FAST["baseline RGB JPEG"], "40 x 30 greyscale JPEG": FAST["greyscale JPEG"],
               "JPEG at the output size, with metadata": AT_SIZE_WITH_METADATA}
    out = {}
    for (name, data), mode, resample, image_format in itertools.product(
            sources.items(), RESIZE_MODES, sorted(RESAMPLE_FILTERS), ("jpeg", "png")):
        settings = ImageSettings(width=224, height=160, resize_mode=mode, resample=resample, image_format=image_format)
        out[name, mode, resample, image_format] = convert_image(data, settings).data
    return out


def digest() -> str:
    """SHA-256 of the records' image bytes (`records`), in order."""
    total = hashlib.sha256()
    for data in records().values():
        total.update(data)
    return total.hexdigest()


def test_records_are_byte_identical_in_a_worker_thread():
    # OpenCV keeps its IPP switch per thread, and a new thread starts with IPP on: its bicubic resize wrote
    # other bytes in the pool's helper threads than in the thread that imported the fast core.
    here = records()
    in_thread = {}
    worker = threading.Thread(target=lambda: in_thread.update(records()))
    worker.start()
    worker.join()
    pool = ConversionPool(None, threads=1)
    try:
        in_pool = pool.result(pool.submit(lambda _deadline: records()))
    finally:
        pool.close()
    assert len(in_thread) == len(in_pool) == len(here) == 7 * len(RESIZE_MODES) * len(RESAMPLE_FILTERS) * 2
    assert [key for key in here if in_thread[key] != here[key]] == []
    assert [key for key in here if in_pool[key] != here[key]] == []


# /proc/cpuinfo flag -> OpenCV's name of the CPU feature it may dispatch to.
_OPENCV_FEATURES = {"ssse3": "SSSE3", "sse4_1": "SSE4.1", "popcnt": "POPCNT", "sse4_2": "SSE4.2", "f16c": "FP16",
                    "fma": "FMA3", "avx": "AVX", "avx2": "AVX2", "avx512bw": "AVX512-SKX"}


def _opencv_cpu_features() -> str:
    """OpenCV's names of the optional CPU features this machine has (OPENCV_CPU_DISABLE turns them off)."""
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return ",".join(name for flag, name in _OPENCV_FEATURES.items() if flag in flags)


@pytest.mark.timeout(300)
def test_records_are_byte_identical_across_runs_processes_and_simd_off_or_on():
    here = digest()
    assert digest() == here  # across runs

    def child(**env) -> str:
        out = subprocess.run([sys.executable, "-c", _DIGEST_SCRIPT, ROOT], env={**os.environ, **env},
                             capture_output=True, text=True, check=True, timeout=240)
        assert "CPU feature" not in out.stderr  # OpenCV took every name (it warns of one it does not know)
        return out.stdout.strip().splitlines()[-1]

    assert child() == here  # another process
    assert child(OPENCV_CPU_DISABLE=_opencv_cpu_features(), JSIMD_FORCENONE="1") == here  # no SIMD at all


@pytest.mark.parametrize("resample", sorted(RESAMPLE_FILTERS))
def test_enlarging_keeps_the_mean_of_the_pillow_path(resample):
    # OpenCV's 8-bit INTER_LINEAR rounds down (the mean 0.13 lower): the statistics would show it.
    fast, pillow = both(SMALL, width=640, height=480, resample=resample, image_format="png")
    for fast_sum, pillow_sum in zip(fast.stats.sums, pillow.stats.sums, strict=True):
        assert abs(fast_sum - pillow_sum) / fast.stats.pixels < 0.05  # cubic and Lanczos kernels differ: 0.03


@pytest.mark.parametrize("tall", [False, True])
def test_a_centre_crop_of_an_odd_difference_keeps_the_exact_centre(tall):
    # A ramp of 2 levels a pixel, 101 x 60: the crop keeps 60 x 60 from x = 20.5, enlarged to 512 x 512. Bilinear
    # interpolation of a ramp is exact, so each output pixel X holds the ramp at 20.5 + (X + 0.5) * 60 / 512 - 0.5
    # (Pillow's convention), to the output's rounding: a crop rounded to whole pixels would be 1 level off.
    ramp = np.repeat((np.arange(101, dtype=np.uint8) * 2)[None, :], 60, axis=0)
    image = np.stack([ramp, ramp[:, ::-1], np.full_like(ramp, 90)], axis=-1)
    if tall:
        image = image.transpose(1, 0, 2)
    encoded = convert_image(cases.encode(Image.fromarray(image), "PNG"),
                            ImageSettings(resize_mode="crop", image_format="png"))
    out = np.asarray(pixels_of(encoded), np.float64)
    if tall:
        out = out.transpose(1, 0, 2)
    expected = 2 * (20.5 + (np.arange(512) + 0.5) * 60 / 512 - 0.5)
    # Within the rounding and warpAffine's 1/32-pixel positions (at most 1/16 of a level here); whole pixels: 1.
    assert np.abs(out[:, :, 0] - expected[None, :]).max() <= 0.57
    assert np.abs(out[:, :, 1] - (200 - expected)[None, :]).max() <= 0.57
    assert (out[:, :, 2] == 90).all()
