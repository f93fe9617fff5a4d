"""Property-based fuzzing of the image layer over mutated bytes of real image files.

Every input must either convert to a valid image of the promised size or raise
ImageRejected with a known reason: no other exception, no hang, no memory
blow-up. Seeds are small real files of every decoded format, written by Pillow
in many variants; hypothesis flips, overwrites, truncates, inserts, deletes and
duplicates their bytes, favouring the headers, where the parsers live.

CI runs a bounded, reproducible sample (derandomized, about 200 examples).
A longer, random run, e.g. overnight:

    FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest tests/test_fuzz_imaging.py --timeout=0    # or: make fuzz
"""

from __future__ import annotations

import base64
import io
import os
import re
import struct
import threading
import time

import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from PIL import Image

from transforms.images.diagnosis import INTERNAL_ERROR, ImageRejected
from transforms.images.encode import IMAGE_FORMATS
from transforms.images.imaging import convert_image
from transforms.images.pixels import RESIZE_MODES
from transforms.images.settings import ImageSettings

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # Pillow warns about corrupt EXIF

FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0") or 0)
LONG_RUN = FUZZ_EXAMPLES > 0
# A conversion of these tiny inputs takes milliseconds: one that runs for this long is hung.
HANG_SECONDS = 30.0
# Inputs are at most about 100 KB and max_pixels below keeps a decoded frame under 16 MB.
MAX_RSS_GROWTH = 256 << 20
MAX_PIXELS = 2_000_000


def _picture(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    rgb = np.stack([xx * 255 // max(width - 1, 1), yy * 255 // max(height - 1, 1), (xx ^ yy) * 16 % 256], -1)
    rgb = np.clip(rgb + rng.integers(-20, 20, rgb.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(rgb, "RGB")
    if mode == "RGBA":
        alpha = Image.fromarray((xx * 255 // max(width - 1, 1)).astype(np.uint8), "L")
        image = image.copy()
        image.putalpha(alpha)
        return image
    return image.convert(mode)


def _save(image: Image.Image, fmt: str, **params) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **params)
    return out.getvalue()


def _seeds() -> dict[str, bytes]:
    """Small real files: every decoded format, with the variants their decoders branch on."""
    rgb, wide = _picture(24, 18), _picture(80, 60, seed=1)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate
    palette = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    seeds = {
        "jpeg_baseline": _save(rgb, "JPEG", quality=90),
        "jpeg_large_draft": _save(wide, "JPEG", quality=80),
        "jpeg_progressive_444": _save(rgb, "JPEG", progressive=True, subsampling=0),
        "jpeg_grey": _save(rgb.convert("L"), "JPEG"),
        "jpeg_cmyk": _save(rgb.convert("CMYK"), "JPEG"),
        "jpeg_exif_rotated": _save(rgb, "JPEG", exif=exif),
        "png_rgb": _save(rgb, "PNG"),
        "png_rgba": _save(_picture(20, 14, "RGBA"), "PNG"),
        "png_palette_transparent": _save(palette, "PNG", transparency=0),
        "png_grey16": _save(Image.fromarray((np.arange(300, dtype=np.uint16) * 200).reshape(15, 20)), "PNG"),
        "png_la": _save(_picture(12, 10, "RGBA").convert("LA"), "PNG"),
        "png_1bit": _save(rgb.convert("1"), "PNG"),
        "gif": _save(palette, "GIF"),
        "gif_animated_transparent": _save(palette, "GIF", save_all=True, transparency=0, duration=50,
                                          append_images=[_picture(24, 18, seed=2).convert("P")]),
        "webp_lossy": _save(rgb, "WEBP", quality=70),
        "webp_lossless_rgba": _save(_picture(20, 14, "RGBA"), "WEBP", lossless=True),
        "webp_animated": _save(rgb, "WEBP", save_all=True, append_images=[_picture(24, 18, seed=3)], duration=50),
        "tiff_raw": _save(rgb, "TIFF"),
        "tiff_lzw": _save(rgb, "TIFF", compression="tiff_lzw"),
        "tiff_deflate_rgba": _save(_picture(20, 14, "RGBA"), "TIFF", compression="tiff_adobe_deflate"),
        "tiff_packbits_grey": _save(rgb.convert("L"), "TIFF", compression="packbits"),
        "tiff_jpeg": _save(wide, "TIFF", compression="jpeg"),
        "tiff_cmyk": _save(rgb.convert("CMYK"), "TIFF"),
        "tiff_grey16": _save(Image.fromarray((np.arange(300, dtype=np.uint16) * 200).reshape(15, 20)), "TIFF"),
        "tiff_float": _save(Image.fromarray(np.linspace(0, 1, 300, dtype=np.float32).reshape(15, 20)), "TIFF"),
        "tiff_multipage": _save(rgb, "TIFF", save_all=True, append_images=[_picture(10, 8, seed=4)]),
        "bmp_rgb": _save(rgb, "BMP"),
        "bmp_palette": _save(palette, "BMP"),
        "bmp_1bit": _save(rgb.convert("1"), "BMP"),
        "bmp_rgba": _save(_picture(20, 14, "RGBA"), "BMP"),
    }
    return seeds


SEEDS = _seeds()
# Values that break size and offset fields: zero, one, sign bits, all ones, huge.
INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]

position = st.one_of(st.integers(0, 96), st.integers(0, 1 << 17))  # headers first, then anywhere
mutation = st.one_of(
    st.tuples(st.just("flip"), position, st.integers(0, 7)),
    st.tuples(st.just("set"), position, st.integers(0, 255)),
    st.tuples(st.just("int"), position, st.sampled_from(INTERESTING), st.sampled_from(["<H", ">H", "<I", ">I"])),
    st.tuples(st.just("truncate"), position),
    st.tuples(st.just("insert"), position, st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), position, st.integers(1, 64)),
    st.tuples(st.just("repeat"), position, st.integers(1, 256), position),
)
image_settings = st.builds(
    ImageSettings,
    width=st.just(16),
    height=st.just(12),
    resize_mode=st.sampled_from(RESIZE_MODES),
    image_format=st.sampled_from(IMAGE_FORMATS),
    max_pixels=st.just(MAX_PIXELS),
    timeout_s=st.just(0.0),
)


def mutate(data: bytes, mutations) -> bytes:
    """Apply (kind, position, ...) edits in order; positions wrap around the current length."""
    buf = bytearray(data)
    for kind, pos, *args in mutations:
        pos %= max(len(buf), 1)
        if kind == "flip":
            if buf:
                buf[pos] ^= 1 << args[0]
        elif kind == "set":
            if buf:
                buf[pos] = args[0]
        elif kind == "int":
            value, fmt = args
            packed = struct.pack(fmt, value & (0xFFFF if fmt.endswith("H") else 0xFFFFFFFF))
            buf[pos:pos + len(packed)] = packed
        elif kind == "truncate":
            del buf[pos:]
        elif kind == "insert":
            buf[pos:pos] = args[0]
        elif kind == "delete":
            del buf[pos:pos + args[0]]
        elif kind == "repeat":
            length, target = args
            chunk = bytes(buf[pos:pos + length])
            target %= max(len(buf), 1)
            buf[target:target] = chunk
    return bytes(buf)


class _RssWatch:
    """Samples this process's resident memory on a thread; `peak` is the highest seen since `reset`."""

    def __init__(self):
        self._process = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def reset(self) -> int:
        self.peak = self._process.memory_info().rss
        return self.peak

    def __enter__(self):
        self.reset()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def convert_watched(data: bytes, image_settings: ImageSettings, watch: _RssWatch):
    """convert_image on a helper thread: returns ('ok', EncodedImage) or ('raised', exception).

    Fails the test if the conversion does not finish (a hang) or the process grows too much.
    """
    before = watch.reset()
    outcome = []

    def work():
        try:
            outcome.append(("ok", convert_image(data, image_settings)))
        except BaseException as e:  # judged by the caller
            outcome.append(("raised", e))

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(HANG_SECONDS)
    assert not thread.is_alive(), f"convert_image hung for {HANG_SECONDS:g} s on {len(data)} bytes: {data!r}"
    time.sleep(0.005)  # let the sampler see the last allocation
    growth = watch.peak - before
    assert growth < MAX_RSS_GROWTH, f"convert_image grew the process by {growth >> 20} MB on {data!r}"
    return outcome[0]


def check_outcome(outcome, image_settings: ImageSettings, data: bytes) -> None:
    kind, value = outcome
    if kind == "raised":
        if not isinstance(value, ImageRejected):
            raise AssertionError(f"convert_image raised {type(value).__name__}, not ImageRejected, on {data!r}") \
                from value
        assert re.fullmatch(r"[a-z_]+", value.reason) and value.detail, value
        # The image layer's own word for "a bug in the converter": a rejection the fuzzer must never provoke.
        assert value.reason != INTERNAL_ERROR, f"{value.detail} on {data!r}"
        return
    encoded = value
    assert encoded.format == image_settings.image_format
    decoded = Image.open(io.BytesIO(encoded.data))
    decoded.load()  # the stored bytes must decode in full
    assert decoded.format == encoded.format.upper()
    assert decoded.size == (encoded.width, encoded.height)
    mode = image_settings.resize_mode
    if mode in ("stretch", "crop", "pad"):
        assert decoded.size == (image_settings.width, image_settings.height)
    elif mode == "fit":
        assert 0 < decoded.width <= image_settings.width and 0 < decoded.height <= image_settings.height


@pytest.fixture(scope="module")
def rss_watch():
    with _RssWatch() as watch:
        yield watch


def test_every_seed_converts_unmutated(rss_watch):
    """The seeds are real, valid files: the fuzzing starts from inputs that convert."""
    for name, data in SEEDS.items():
        outcome = convert_watched(data, ImageSettings(width=16, height=12, max_pixels=MAX_PIXELS), rss_watch)
        assert outcome[0] == "ok", (name, outcome[1])
        check_outcome(outcome, ImageSettings(width=16, height=12), data)


@settings(
    max_examples=FUZZ_EXAMPLES or 200,
    derandomize=not LONG_RUN,  # CI: the same examples on every run; long runs explore
    deadline=None,  # hangs are caught by HANG_SECONDS; the suite asserts on no elapsed time
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(seed=st.sampled_from(sorted(SEEDS)), mutations=st.lists(mutation, min_size=1, max_size=4),
       image_settings=image_settings)
def test_mutated_images_convert_or_are_rejected(rss_watch, seed, mutations, image_settings):
    data = mutate(SEEDS[seed], mutations)
    note(f"input bytes: {data!r}")
    check_outcome(convert_watched(data, image_settings, rss_watch), image_settings, data)


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_every_truncation_point_of_the_header(rss_watch, name):
    """Cutting a file anywhere in its first 64 bytes and at a few later points: never a crash."""
    data = SEEDS[name]
    cuts = list(range(0, min(64, len(data)))) + [len(data) // 4, len(data) // 2, len(data) - 1]
    image_settings = ImageSettings(width=16, height=12, max_pixels=MAX_PIXELS)
    for cut in cuts:
        outcome = convert_watched(data[:cut], image_settings, rss_watch)
        check_outcome(outcome, image_settings, data[:cut])


# Found by `make fuzz` (seed 'gif', the logical screen width set to 65535): a GIF whose canvas is 65535 x 18.
WIDE_GIF = base64.b64decode(
    "R0lGODdh//8SAIMAAN/hhJ/idF/heR7od+OitZihWDCxozmOg+ZeUaVfd+IaP54bnFtbjx5aWV0bjBwYKiwAAAAAGAASAEAI1gAfCBzo"
    "oGDBBQgRKljIcOGBBgciGjDAoIBFiwkyaiTAkeOAjyAHCBgpIEDJAAQKBAgAoGXLBw1iDmzA4KCDhAhyMsw5ceKBnheDFuhIAEDHgQId"
    "PDB4MGHDhjFlymRAlarGjDmzIvD5E6jQiymJEuhpYEBZAyMLCAjK0WhbAkiTMk2o8OlCpDKX1rzpdCfDqA0ExqzKIOMCrAkQKNAJGDDh"
    "wle15pTYdWIDoRsTiCVL9qtFjkOJcu5Jci3Yji7HTjRbOu3KlahdAgj5UYDIkSZRvl4pOyAAOw=="
)


@pytest.mark.parametrize("name", ["fuzzed_gif", "wide_png"])
def test_an_image_wider_than_jpeg_allows_is_rejected_with_a_reason(name):
    if name == "wide_png":
        data = _save(Image.new("RGB", (65501, 2), (1, 2, 3)), "PNG")  # a real panorama strip hits it too
    else:
        data = WIDE_GIF
    image_settings = ImageSettings(width=16, height=12, resize_mode="none", image_format="jpeg",
                                   max_pixels=MAX_PIXELS, timeout_s=0.0)
    with pytest.raises(ImageRejected) as rejected:
        convert_image(data, image_settings)
    assert rejected.value.reason == "too_large_for_jpeg", rejected.value.detail
    assert "--image_format=png" in rejected.value.detail
