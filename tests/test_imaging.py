"""The image layer on its own: every real-world case decodes to the right pixels, or is rejected with its reason."""

from __future__ import annotations

import io
import random
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin

from tests import image_cases as cases
from tests.conftest import REPO
from tests.image_cases import BLUE, GREEN, RED, YELLOW
from transforms.images import decode, diagnosis, encode
from transforms.images import pixels as pixel_steps
from transforms.images.diagnosis import ImageRejected
from transforms.images.imaging import convert_image
from transforms.images.settings import ImageSettings

# Lossless output at the source size, so pixels can be compared exactly.
AS_IS = ImageSettings(resize_mode="none", image_format="png")


def pixels(data: bytes, settings: ImageSettings = AS_IS) -> np.ndarray:
    """The converted image as an H x W x 3 int array."""
    encoded = convert_image(data, settings)
    image = Image.open(io.BytesIO(encoded.data))
    assert image.mode == "RGB"
    assert image.size == (encoded.width, encoded.height)
    return np.asarray(image).astype(int)


def rejection(data: bytes, settings: ImageSettings = AS_IS) -> ImageRejected:
    with pytest.raises(ImageRejected) as caught:
        convert_image(data, settings)
    assert caught.value.detail
    return caught.value


def assert_colour(actual, expected, tolerance=6):
    assert np.abs(np.asarray(actual, int) - np.asarray(expected, int)).max() <= tolerance, (actual, expected)


def assert_quadrants(image: np.ndarray, tolerance=6):
    """Red top-left, green top-right, blue bottom-left, yellow bottom-right (checked at quadrant centres)."""
    h, w, _ = image.shape
    assert_colour(image[h // 4, w // 4], RED, tolerance)
    assert_colour(image[h // 4, 3 * w // 4], GREEN, tolerance)
    assert_colour(image[3 * h // 4, w // 4], BLUE, tolerance)
    assert_colour(image[3 * h // 4, 3 * w // 4], YELLOW, tolerance)


# --- Formats, decoded by content ------------------------------------------------------------------

QUADRANTS = cases.quadrants(64, 48)
FORMATS = {
    "jpeg_baseline": lambda: cases.jpeg(QUADRANTS),
    "jpeg_progressive": lambda: cases.jpeg(QUADRANTS, progressive=True),
    "jpeg_420": lambda: cases.jpeg(QUADRANTS, subsampling=2),
    "png": lambda: cases.encode(QUADRANTS, "PNG"),
    "png_palette": lambda: cases.encode(QUADRANTS.convert("P"), "PNG"),
    "gif": lambda: cases.encode(QUADRANTS, "GIF"),
    "bmp": lambda: cases.encode(QUADRANTS, "BMP"),
    "bmp_palette": lambda: cases.encode(QUADRANTS.convert("P"), "BMP"),
    "tiff": lambda: cases.encode(QUADRANTS, "TIFF"),
    "tiff_lzw": lambda: cases.encode(QUADRANTS, "TIFF", compression="tiff_lzw"),
    "tiff_jpeg": lambda: cases.encode(QUADRANTS, "TIFF", compression="jpeg"),
    "webp_lossy": lambda: cases.encode(QUADRANTS, "WEBP", quality=95),
    "webp_lossless": lambda: cases.encode(QUADRANTS, "WEBP", lossless=True),
}


@pytest.mark.parametrize("name", FORMATS)
def test_each_format_decodes_to_the_right_pixels(name):
    image = pixels(FORMATS[name]())
    assert image.shape == (48, 64, 3)
    assert_quadrants(image, tolerance=12)


@pytest.mark.parametrize("data", [cases.ARITHMETIC_JPEG, cases.ARITHMETIC_PROGRESSIVE_JPEG],
                         ids=["sequential", "progressive"])
def test_arithmetic_coded_jpeg_decodes(data):
    assert decode.jpeg_frame_type(data) in (0xC9, 0xCA)
    assert_quadrants(pixels(data))


def test_png_behind_a_jpg_name_decodes_by_content():
    # convert_image never sees a name; the end-to-end test puts such files behind .jpg names.
    assert_quadrants(pixels(cases.encode(QUADRANTS, "PNG")), tolerance=0)


def test_greyscale_becomes_rgb_with_equal_channels():
    grey = Image.fromarray(np.tile(np.linspace(0, 255, 64).astype(np.uint8), (16, 1)))
    for data in (cases.jpeg(grey), cases.encode(grey, "PNG"), cases.encode(grey, "TIFF")):
        image = pixels(data)
        assert image.shape == (16, 64, 3)
        assert (image[..., 0] == image[..., 1]).all() and (image[..., 1] == image[..., 2]).all()
        assert image[:, 0, 0].max() < 10 and image[:, -1, 0].min() > 245  # left dark, right light


# --- CMYK and YCCK ---------------------------------------------------------------------------------

INKS = {  # CMYK ink amounts (0 = no ink) -> the RGB they must become
    "red": ((0, 255, 255, 0), RED),
    "blue": ((255, 255, 0, 0), BLUE),
    "yellow": ((0, 0, 255, 0), YELLOW),
    "white": ((0, 0, 0, 0), (255, 255, 255)),
    "black": ((0, 0, 0, 255), (0, 0, 0)),
    "grey": ((0, 0, 0, 128), (127, 127, 127)),
}
CMYK_FILES = {
    "jpeg_adobe": lambda ink: cases.cmyk_jpeg(ink),
    "jpeg_no_adobe_marker": lambda ink: cases.cmyk_jpeg(ink, adobe=False),
    "jpeg_ycck": lambda ink: cases.ycck_jpeg(ink),
    "jpeg_adobe_progressive": lambda ink: cases.jpeg(Image.new("CMYK", (16, 16), ink), progressive=True),
    "tiff": lambda ink: cases.encode(Image.new("CMYK", (16, 16), ink), "TIFF"),
}


@pytest.mark.parametrize("kind", CMYK_FILES)
@pytest.mark.parametrize("ink", INKS)
def test_cmyk_and_ycck_give_the_right_rgb(kind, ink):
    cmyk, rgb = INKS[ink]
    image = pixels(CMYK_FILES[kind](cmyk))
    assert_colour(image[8, 8], rgb, tolerance=4)


# --- Bit depths and 16-bit scaling ----------------------------------------------------------------


@pytest.mark.parametrize("bits", [1, 2, 4, 8, 16])
def test_png_greyscale_bit_depths_span_black_to_white(bits):
    top = (1 << bits) - 1
    levels = np.arange(top + 1) if bits < 16 else np.array([0, 257 * 85, 257 * 170, 65535])
    samples = np.tile(levels, (2, 1))
    image = pixels(cases.png(samples, bits, 0))
    expected = np.rint(levels * 255 / top)
    assert (image[0, :, 0] == expected).all()


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_png_palette_bit_depths(bits):
    colours = [RED, GREEN, BLUE, YELLOW][: 1 << bits] if bits > 1 else [RED, GREEN]
    palette = bytes(v for colour in colours for v in colour)
    indices = np.tile(np.arange(len(colours)), (2, 1))
    image = pixels(cases.png(indices, bits, 3, palette=palette))
    assert [tuple(p) for p in image[0]] == colours


GRADIENT_16 = np.tile(np.arange(256, dtype=np.uint16) * 257, (4, 1))  # 0 .. 65535 in 256 steps
SIXTEEN_BIT = {
    "png_grey": lambda: cases.png(GRADIENT_16, 16, 0),
    "png_rgb": lambda: cases.png(np.stack([GRADIENT_16] * 3, -1), 16, 2),
    "png_rgba_opaque": lambda: cases.png(np.stack([GRADIENT_16] * 3 + [GRADIENT_16 * 0 + 65535], -1), 16, 6),
    "png_grey_alpha_opaque": lambda: cases.png(np.stack([GRADIENT_16, GRADIENT_16 * 0 + 65535], -1), 16, 4),
    "tiff_grey": lambda: cases.encode(Image.fromarray(GRADIENT_16), "TIFF"),
    "tiff_rgb": lambda: cases.tiff_rgb16(np.stack([GRADIENT_16] * 3, -1)),
}


@pytest.mark.parametrize("kind", SIXTEEN_BIT)
def test_16_bit_is_scaled_to_8_bit_not_clipped(kind):
    image = pixels(SIXTEEN_BIT[kind]())
    assert image.shape == (4, 256, 3)
    # A clipping conversion makes everything from 256/65535 up white; scaling keeps the ramp.
    assert (image[0, :, 0] == np.arange(256)).all()
    assert (image[..., 0] == image[..., 2]).all()


def test_16_bit_values_between_steps_round_to_the_nearest_8_bit_value():
    samples = np.array([[0, 128, 129, 1000, 32767, 32768, 65406, 65535]], np.uint16)
    image = pixels(cases.png(samples, 16, 0))
    assert list(image[0, :, 0]) == [round(int(v) * 255 / 65535) for v in samples[0]]


# --- Alpha -----------------------------------------------------------------------------------------

CLEAR_BLACK = Image.new("RGBA", (8, 8), (0, 0, 0, 0))  # transparent pixels whose colour is black
ALPHA_FILES = {
    "png_rgba": lambda: cases.encode(CLEAR_BLACK, "PNG"),
    "png_la": lambda: cases.encode(Image.new("LA", (8, 8), (0, 0)), "PNG"),
    "png_palette_trns": lambda: cases.png(np.zeros((8, 8), np.uint8), 8, 3, palette=b"\x00\x00\x00", trns=b"\x00"),
    "png_palette_4bit_trns": lambda: cases.png(np.zeros((8, 8), np.uint8), 4, 3, palette=b"\x00\x00\x00",
                                               trns=b"\x00"),
    "png_grey_trns": lambda: cases.png(np.zeros((8, 8), np.uint8), 8, 0, trns=b"\x00\x00"),
    "png_rgb_trns": lambda: cases.png(np.zeros((8, 8, 3), np.uint8), 8, 2, trns=b"\x00" * 6),
    "png_16bit_rgba": lambda: cases.png(np.zeros((8, 8, 4), np.uint16), 16, 6),
    "png_16bit_grey_trns": lambda: cases.png(np.zeros((8, 8), np.uint16), 16, 0, trns=b"\x00\x00"),
    "gif": lambda: cases.encode(CLEAR_BLACK, "GIF"),
    "webp": lambda: cases.encode(CLEAR_BLACK, "WEBP", lossless=True),
    "tiff": lambda: cases.encode(CLEAR_BLACK, "TIFF"),
}


@pytest.mark.parametrize("kind", ALPHA_FILES)
def test_transparent_pixels_become_the_background_never_black(kind):
    data = ALPHA_FILES[kind]()
    assert (pixels(data) == 255).all()
    black_background = ImageSettings(resize_mode="none", image_format="png", background=(0, 0, 0))
    assert (pixels(data, black_background) == 0).all()
    teal = ImageSettings(resize_mode="none", image_format="png", background=(0, 128, 128))
    assert (pixels(data, teal) == (0, 128, 128)).all()


def test_half_transparent_red_is_blended_with_the_background():
    data = cases.encode(Image.new("RGBA", (8, 8), (255, 0, 0, 128)), "PNG")
    assert_colour(pixels(data)[4, 4], (255, 127, 127), tolerance=1)


def test_alpha_survives_resizing_without_dark_fringes():
    # A red square on transparent black: resampling must not mix the hidden black into the edge.
    image = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    image.paste((255, 0, 0, 255), (16, 16, 48, 48))
    out = pixels(cases.encode(image, "PNG"), ImageSettings(width=23, height=23, image_format="png"))
    assert out.min(axis=(0, 1))[0] == 255  # the red channel never dips below white/red


# --- Multi-frame files -----------------------------------------------------------------------------


@pytest.mark.parametrize("format", ["GIF", "WEBP", "PNG", "TIFF", "MPO"])
def test_multi_frame_files_use_the_first_frame(format):
    data = cases.animated(format)
    if format == "PNG":
        assert b"acTL" in data  # really an APNG
    if format == "WEBP":
        assert b"ANIM" in data
    image = pixels(data)
    assert image.shape == (16, 24, 3)
    assert_colour(image[8, 12], RED, tolerance=4)


# --- Orientation -----------------------------------------------------------------------------------

UPRIGHT = cases.quadrants(64, 32)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_makes_the_image_upright(orientation):
    stored = cases.oriented(UPRIGHT, orientation)
    data = cases.jpeg(stored, exif=cases.exif_orientation(orientation))
    image = pixels(data)
    assert image.shape == (32, 64, 3)
    assert_quadrants(image)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_is_applied_before_resizing(orientation):
    # The upright image is 64x32; a 40x20 stretch keeps its aspect ratio, so each
    # quadrant must be where it is in the upright image, whatever was stored.
    stored = cases.oriented(UPRIGHT, orientation)
    data = cases.jpeg(stored, exif=cases.exif_orientation(orientation))
    encoded = convert_image(data, ImageSettings(width=40, height=20, image_format="png"))
    assert (encoded.width, encoded.height) == (40, 20)
    assert_quadrants(np.asarray(Image.open(io.BytesIO(encoded.data))).astype(int))


@pytest.mark.parametrize("container", ["PNG", "WEBP", "TIFF"])
def test_orientation_is_read_from_png_webp_and_tiff_too(container):
    stored = cases.oriented(UPRIGHT, 6)
    if container == "TIFF":
        data = cases.encode(stored, "TIFF", tiffinfo={0x0112: 6})
    else:
        data = cases.encode(stored, container, exif=cases.exif_orientation(6), lossless=True)
    assert_quadrants(pixels(data))


def test_output_carries_no_orientation_tag():
    data = cases.jpeg(cases.oriented(UPRIGHT, 6), exif=cases.exif_orientation(6))
    encoded = convert_image(data, ImageSettings(width=32, height=16))
    output = Image.open(io.BytesIO(encoded.data))
    assert 0x0112 not in output.getexif()
    assert output.size == (32, 16)


@pytest.mark.parametrize("container", ["JPEG", "PNG", "WEBP"])
def test_broken_exif_does_not_fail_a_good_image(container):
    params = {"exif": cases.BROKEN_EXIF}
    if container == "WEBP":
        params["lossless"] = True
    data = cases.encode(UPRIGHT, container, **params)
    assert b"MM\x00*" in data
    assert_quadrants(pixels(data))


def test_out_of_range_orientation_is_ignored():
    data = cases.jpeg(UPRIGHT, exif=cases.exif_orientation(9))
    assert_quadrants(pixels(data))


# --- Resize modes ----------------------------------------------------------------------------------


def bands(width=200, height=100) -> bytes:
    """Vertical bands: red first quarter, green middle half, blue last quarter (lossless PNG)."""
    image = Image.new("RGB", (width, height), GREEN)
    image.paste(RED, (0, 0, width // 4, height))
    image.paste(BLUE, (width - width // 4, 0, width, height))
    return cases.encode(image, "PNG")


def converted(data, **settings):
    settings.setdefault("image_format", "png")
    encoded = convert_image(data, ImageSettings(**settings))
    image = np.asarray(Image.open(io.BytesIO(encoded.data))).astype(int)
    assert image.shape == (encoded.height, encoded.width, 3)
    return encoded, image


@pytest.mark.parametrize("resample", list(pixel_steps.RESAMPLE_FILTERS))
def test_stretch_fills_the_size_and_distorts(resample):
    encoded, image = converted(bands(), width=64, height=64, resize_mode="stretch", resample=resample)
    assert (encoded.width, encoded.height) == (64, 64)
    assert_colour(image[32, 4], RED)
    assert_colour(image[32, 32], GREEN)
    assert_colour(image[32, 60], BLUE)
    assert not encoded.upscaled


def test_crop_takes_the_centre_at_the_target_aspect_ratio():
    encoded, image = converted(bands(), width=50, height=50, resize_mode="crop")
    assert (encoded.width, encoded.height) == (50, 50)
    # The centre 100x100 of the source is all green; the outermost output pixels
    # may blend in a little of what lies just outside (as resizing then cropping would).
    assert (np.abs(image[1:-1, 1:-1] - GREEN) <= 2).all()
    tall = bands(100, 200)  # bands run across the width: cropping the height keeps all three
    encoded, image = converted(tall, width=40, height=40, resize_mode="crop")
    assert_colour(image[20, 2], RED)
    assert_colour(image[20, 20], GREEN)
    assert_colour(image[20, 37], BLUE)


def test_pad_letterboxes_on_the_background():
    magenta = (255, 0, 255)
    encoded, image = converted(bands(), width=64, height=64, resize_mode="pad", background=magenta)
    assert (encoded.width, encoded.height) == (64, 64)
    assert (image[:16] == magenta).all() and (image[48:] == magenta).all()  # 64x32 content, centred
    assert_colour(image[32, 4], RED)
    assert_colour(image[32, 32], GREEN)
    assert_colour(image[32, 60], BLUE)
    encoded, image = converted(bands(100, 200), width=64, height=64, resize_mode="pad")
    assert (image[:, :16] == 255).all() and (image[:, 48:] == 255).all()  # pillarbox, white default
    assert_colour(image[32, 32], GREEN)


def test_fit_keeps_the_aspect_ratio_and_never_enlarges():
    encoded, image = converted(bands(), width=64, height=64, resize_mode="fit")
    assert (encoded.width, encoded.height) == (64, 32)
    assert_colour(image[16, 4], RED)
    assert_colour(image[16, 60], BLUE)
    encoded, _ = converted(bands(), width=64, height=16, resize_mode="fit")
    assert (encoded.width, encoded.height) == (32, 16)
    encoded, image = converted(bands(20, 10), width=64, height=64, resize_mode="fit")
    assert (encoded.width, encoded.height) == (20, 10) and not encoded.upscaled


def test_none_keeps_the_size():
    encoded, image = converted(bands(), resize_mode="none")
    assert (encoded.width, encoded.height) == (200, 100) and not encoded.upscaled
    assert (image[:, 60:140] == GREEN).all()


@pytest.mark.parametrize("mode, upscaled", [("stretch", True), ("crop", True), ("pad", True), ("fit", False),
                                            ("none", False)])
def test_small_images_are_upscaled_and_flagged(mode, upscaled):
    encoded, image = converted(bands(20, 10), width=64, height=64, resize_mode=mode)
    assert encoded.upscaled == upscaled
    if mode in ("stretch", "crop", "pad"):
        assert (encoded.width, encoded.height) == (64, 64)
    big, _ = converted(bands(), width=64, height=64, resize_mode=mode)
    assert not big.upscaled


def test_stretch_flags_an_image_enlarged_along_one_side_only():
    encoded, _ = converted(bands(200, 40), width=64, height=64, resize_mode="stretch")
    assert encoded.upscaled


def test_every_mode_converts_any_size_to_the_promised_size():
    # Sizes whose scale factors are not exact in floating point once broke the crop box.
    rng = random.Random(5)
    sizes = [(1336, 386), (386, 1336), (1, 1), (1, 300), (300, 1), (997, 13)]
    sizes += [(rng.randint(1, 700), rng.randint(1, 700)) for _ in range(10)]
    for i, (width, height) in enumerate(sizes):
        source = Image.new("RGB", (width, height), GREEN)
        for data in (cases.jpeg(source), cases.encode(source, "PNG")):
            target_w, target_h = (224, 224) if i < 2 else rng.choice([(224, 224), (17, 31), (64, 48), (500, 3)])
            for mode in pixel_steps.RESIZE_MODES:
                settings = ImageSettings(width=target_w, height=target_h, resize_mode=mode)
                encoded = convert_image(data, settings)
                size = (encoded.width, encoded.height)
                if mode in ("stretch", "crop", "pad"):
                    assert size == (target_w, target_h), (width, height, mode)
                elif mode == "none":
                    assert size == (width, height)
                else:
                    assert size[0] <= max(target_w, width) and size[1] <= max(target_h, height)
                    assert size[0] == min(width, target_w) or size[1] == min(height, target_h)
                assert Image.open(io.BytesIO(encoded.data)).size == size


# --- Output options --------------------------------------------------------------------------------


def test_png_output_is_lossless():
    encoded, image = converted(cases.encode(QUADRANTS, "PNG"), resize_mode="none")
    assert encoded.data.startswith(b"\x89PNG") and encoded.format == "png"
    assert (image == np.asarray(QUADRANTS)).all()


def test_jpeg_quality_and_chroma_subsampling_are_applied():
    photo = cases.jpeg(Image.effect_noise((96, 96), 40).convert("RGB"), quality=100)
    sizes = {}
    for quality in (50, 95):
        encoded = convert_image(photo, ImageSettings(width=96, height=96, jpeg_quality=quality, reencode=True))
        sizes[quality] = len(encoded.data)
    assert sizes[50] < sizes[95]
    for name, code in encode.CHROMA_SUBSAMPLING.items():
        encoded = convert_image(photo, ImageSettings(width=96, height=96, chroma_subsampling=name, reencode=True))
        assert encoded.format == "jpeg"
        assert JpegImagePlugin.get_sampling(Image.open(io.BytesIO(encoded.data))) == code


def test_baseline_rgb_jpeg_passes_through_byte_for_byte():
    data = cases.jpeg(QUADRANTS)
    encoded = convert_image(data, ImageSettings(resize_mode="none"))
    assert encoded.data == data
    assert (encoded.width, encoded.height, encoded.format, encoded.upscaled) == (64, 48, "jpeg", False)


@pytest.mark.parametrize("kind", ["progressive", "rotated", "greyscale", "cmyk", "resized", "png_output", "mpo"])
def test_other_jpegs_are_re_encoded(kind):
    data = {
        "progressive": lambda: cases.jpeg(QUADRANTS, progressive=True),
        "rotated": lambda: cases.jpeg(QUADRANTS, exif=cases.exif_orientation(3)),
        "greyscale": lambda: cases.jpeg(QUADRANTS.convert("L")),
        "cmyk": lambda: cases.jpeg(QUADRANTS.convert("CMYK")),
        "resized": lambda: cases.jpeg(QUADRANTS),
        "png_output": lambda: cases.jpeg(QUADRANTS),
        "mpo": lambda: cases.animated("MPO"),
    }[kind]()
    settings = ImageSettings(
        resize_mode="stretch" if kind == "resized" else "none",
        width=32 if kind == "resized" else 64, height=24 if kind == "resized" else 48,
        image_format="png" if kind == "png_output" else "jpeg",
    )
    encoded = convert_image(data, settings)
    assert encoded.data != data
    assert Image.open(io.BytesIO(encoded.data)).mode == "RGB"


def test_a_truncated_baseline_jpeg_is_not_passed_through():
    data = cases.jpeg(Image.effect_noise((64, 64), 40).convert("RGB"))
    assert rejection(data[: len(data) * 2 // 3], ImageSettings(resize_mode="none")).reason == "truncated"


# --- JPEG draft decoding: fast, no visible loss ----------------------------------------------------


@pytest.fixture(scope="module")
def big_photo() -> bytes:
    from pipeline.sample_data import photo_like

    image = photo_like(3000, 2000, np.random.default_rng(7))
    return cases.jpeg(image, quality=90, subsampling=2)


def full_resolution_reference(data: bytes, settings: ImageSettings, monkeypatch) -> np.ndarray:
    """The same conversion with no scaled decode and no reduce steps."""
    with monkeypatch.context() as patch:
        patch.setattr(decode, "draft", lambda image, orientation, s: (0.0, 0.0, *map(float, image.size)))
        patch.setattr(pixel_steps, "REDUCING_GAP", None)
        return pixels(data, settings)


@pytest.mark.parametrize("mode, size", [("stretch", 384), ("crop", 224), ("pad", 256), ("fit", 300)])
def test_draft_decoding_costs_no_visible_quality(big_photo, monkeypatch, mode, size):
    settings = ImageSettings(width=size, height=size, resize_mode=mode, image_format="png")
    drafted = []
    real_draft = decode.draft

    def spy(image, orientation, s):
        box = real_draft(image, orientation, s)
        drafted.append(image.size)
        return box

    monkeypatch.setattr(decode, "draft", spy)
    fast = pixels(big_photo, settings)
    monkeypatch.undo()
    assert drafted and drafted[0][0] < 3000  # libjpeg decoded at reduced scale
    reference = full_resolution_reference(big_photo, settings, monkeypatch)
    assert fast.shape == reference.shape
    assert cases.psnr(Image.fromarray(fast.astype(np.uint8)), Image.fromarray(reference.astype(np.uint8))) >= 40


@pytest.mark.parametrize("orientation", [3, 6, 7])
def test_draft_decoding_with_orientation_matches_full_decoding(monkeypatch, orientation):
    from pipeline.sample_data import photo_like

    # Odd sizes: the scaled decode's last row and column are only partly covered.
    upright = photo_like(1203, 803, np.random.default_rng(orientation))
    data = cases.jpeg(cases.oriented(upright, orientation), quality=90, exif=cases.exif_orientation(orientation))
    settings = ImageSettings(width=96, height=72, resize_mode="crop", image_format="png")
    fast = pixels(data, settings)
    reference = full_resolution_reference(data, settings, monkeypatch)
    assert cases.psnr(Image.fromarray(fast.astype(np.uint8)), Image.fromarray(reference.astype(np.uint8))) >= 40


def test_50_megapixel_jpeg_to_512_needs_little_memory(tmp_path):
    """Peak resident memory of the conversion alone, measured in a fresh process."""
    from pipeline.sample_data import photo_like

    small = photo_like(1083, 722, np.random.default_rng(0))
    path = tmp_path / "50mp.jpg"
    small.resize((8660, 5774), Image.Resampling.BILINEAR).save(path, quality=85)
    script = (
        "import resource, sys\n"
        "from transforms.images.imaging import convert_image\n"
        "from transforms.images.settings import ImageSettings\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "out = convert_image(data, ImageSettings())\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(out.width, out.height, (after - before) // 1024)\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(path)], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    width, height, extra_mb = map(int, result.stdout.split())
    assert (width, height) == (512, 512)
    assert extra_mb < 200, f"the conversion raised peak RSS by {extra_mb} MB"


# --- Rejections ------------------------------------------------------------------------------------


def test_empty_text_and_random_files_are_rejected():
    assert rejection(b"").reason == "empty_file"
    assert rejection(b"Just some text, not an image.\n" * 20).reason == "not_an_image"
    assert rejection(bytes(random.Random(1).randrange(256) for _ in range(4096))).reason == "not_an_image"
    assert rejection(b"<html><body>404 Not Found</body></html>").reason == "not_an_image"


@pytest.mark.parametrize("data", [
    cases.encode(Image.new("RGB", (16, 16)), "JPEG2000"),
    cases.encode(Image.new("RGB", (16, 16)), "ICO"),
    b"%PDF-1.4\n%...",
    b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1",
    b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic",
    b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"/>',
    b"8BPS\x00\x01" + bytes(40),
], ids=["jpeg2000", "ico", "pdf", "avif", "heic", "svg", "psd"])
def test_known_but_unsupported_formats_say_so(data):
    error = rejection(data)
    assert error.reason == "unsupported_format"
    assert "supported: JPEG, PNG" in error.detail


def test_a_12_bit_jpeg_is_unsupported_with_the_decoders_reason():
    data = bytearray(cases.jpeg(QUADRANTS))
    data[data.find(b"\xff\xc0") + 4] = 12  # the frame header's sample precision
    error = rejection(bytes(data))
    assert error.reason == "unsupported_format"
    assert "12-bit" in error.detail


def test_decompression_bomb_is_rejected_before_decoding(monkeypatch):
    loads = []
    monkeypatch.setattr(decode, "load", lambda image, data: loads.append(image) or image)
    error = rejection(cases.png_bomb(40_000, 40_000))
    assert error.reason == "decompression_bomb"
    assert "40000x40000" in error.detail and "--max_pixels" in error.detail
    assert not loads  # no pixel was decoded
    gif = bytearray(cases.encode(Image.new("P", (4, 4)), "GIF"))
    gif[6:10] = (30_000).to_bytes(2, "little") * 2  # logical screen 30000x30000
    assert rejection(bytes(gif)).reason == "decompression_bomb"


def test_max_pixels_is_configurable():
    data = cases.encode(QUADRANTS, "PNG")  # 64x48 = 3072 pixels
    assert rejection(data, ImageSettings(max_pixels=3071)).reason == "decompression_bomb"
    assert convert_image(data, ImageSettings(max_pixels=3072)).width == 512


MEGAPIXEL = (1000, 1000)  # so that MB to convert = bytes per pixel


def _megapixel(mode: str, format: str = "PNG", **params) -> bytes:
    return cases.encode(Image.new(mode, MEGAPIXEL), format, **params)


# (file, MB its conversion is counted as needing): the decoded pixels by mode and bit depth, plus copies.
MEMORY_BY_MODE = {
    "L": (lambda: _megapixel("L"), 5),  # 1 decoded + 4 for the RGB copy
    "P": (lambda: _megapixel("P"), 5),
    "RGB png": (lambda: _megapixel("RGB"), 8),  # 4 + 4: its EXIF orientation is unknown until decoded
    "RGB jpeg upright": (lambda: _megapixel("RGB", "JPEG"), 4),  # no copy at all
    "RGB jpeg rotated": (lambda: cases.jpeg(Image.new("RGB", MEGAPIXEL), exif=cases.exif_orientation(6)), 8),
    "RGBA": (lambda: _megapixel("RGBA"), 8),
    "LA": (lambda: _megapixel("LA"), 12),  # + an RGBA copy to composite
    "P transparent": (lambda: _megapixel("P", "GIF", transparency=0), 9),
    "I;16": (lambda: cases.png(np.zeros((1000, 1000), np.uint16), 16, 0), 9),  # 2 + copy 2 + 8-bit 1 + 4
    "CMYK": (lambda: _megapixel("CMYK", "JPEG"), 8),
    "F": (lambda: _megapixel("F", "TIFF"), 13),
}


@pytest.mark.parametrize("case", MEMORY_BY_MODE)
def test_the_memory_budget_counts_the_pixel_mode_and_depth(case, monkeypatch):
    make, megabytes = MEMORY_BY_MODE[case]
    data = make()
    loads = []
    real_load = decode.load
    monkeypatch.setattr(decode, "load", lambda image, data: loads.append(1) or real_load(image, data))
    error = rejection(data, ImageSettings(resize_mode="none", max_image_mb=megabytes - 1))
    assert error.reason == "image_too_large_in_memory"
    assert "1000x1000" in error.detail and f"about {megabytes} MB" in error.detail
    assert f"--max_image_mb={megabytes - 1}" in error.detail
    assert not loads  # refused from the header: no pixel decoded
    assert convert_image(data, ImageSettings(resize_mode="none", max_image_mb=megabytes)).width == 1000


def test_an_rgba_bomb_under_max_pixels_is_refused_unless_the_memory_limit_is_raised():
    from tests.hostile_files import png_rgba_bomb

    data = png_rgba_bomb(2000, 2000)  # 4 MP: 16 MB decoded, 32 MB to convert
    error = rejection(data, ImageSettings(max_image_mb=31))
    assert error.reason == "image_too_large_in_memory"
    assert "2000x2000 RGBA would need about 32 MB" in error.detail
    assert convert_image(data, ImageSettings(max_image_mb=32)).width == 512


def test_a_large_jpeg_is_counted_at_its_scaled_decode():
    data = cases.jpeg(Image.new("RGB", (4000, 3000), RED), quality=50)  # 48 MB decoded in full
    small = ImageSettings(max_image_mb=12)  # enough for the 1/2-scale decode (2000x1500) to 512x512
    assert pixels(data, small).shape == (512, 512, 3)
    assert rejection(data, ImageSettings(max_image_mb=11)).detail.startswith(
        "2000x1500 RGB (decoded at reduced scale from 4000x3000) would need about 12 MB")
    error = rejection(data, ImageSettings(resize_mode="none", max_image_mb=12))
    assert error.reason == "image_too_large_in_memory"
    assert "4000x3000 RGB would need about 48 MB" in error.detail


def test_a_tiff_in_tiff_layout_too_large_is_rejected_before_pillow_reads_its_layout(monkeypatch):
    from tests.hostile_files import many_strips_tiff

    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    error = rejection(many_strips_tiff(diagnosis.MAX_TIFF_STRIPS + 1))
    assert error.reason == "tiff_layout_too_large"
    assert "65,537 strips or tiles, over the limit of 65,536" in error.detail
    assert not opened
    converted = pixels(many_strips_tiff(diagnosis.MAX_TIFF_STRIPS, width=4))  # the limit itself is fine
    assert converted.shape == (diagnosis.MAX_TIFF_STRIPS, 4, 3)
    assert converted[0, :, 0].tolist() == [0, 4, 8, 12]


def test_a_tiff_with_a_tag_of_millions_of_numbers_is_rejected_before_pillow_reads_it(monkeypatch):
    from tests.hostile_files import tiff_with_a_huge_tag

    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    error = rejection(tiff_with_a_huge_tag(diagnosis.MAX_TIFF_NUMBERS + 1))
    assert error.reason == "tiff_layout_too_large"
    assert f"tag 65000 holds {diagnosis.MAX_TIFF_NUMBERS + 1:,} numbers" in error.detail
    assert not opened
    assert pixels(tiff_with_a_huge_tag(1000)).shape == (16, 16, 3)  # a large private tag within the limit


NOISE = Image.effect_noise((96, 64), 60).convert("RGB")
TRUNCATABLE = {
    "jpeg": lambda: cases.jpeg(NOISE),
    "jpeg_progressive": lambda: cases.jpeg(NOISE, progressive=True),
    "png": lambda: cases.encode(NOISE, "PNG"),
    "gif": lambda: cases.encode(NOISE, "GIF"),
    "webp": lambda: cases.encode(NOISE, "WEBP"),
    "tiff": lambda: cases.encode(NOISE, "TIFF"),
    "tiff_jpeg": lambda: cases.encode(NOISE, "TIFF", compression="jpeg"),
    "bmp": lambda: cases.encode(NOISE, "BMP"),
    "png_16bit": lambda: cases.png(np.asarray(NOISE).astype(np.uint16) * 257, 16, 2),
}


@pytest.mark.parametrize("kind", TRUNCATABLE)
@pytest.mark.parametrize("keep", [0.3, 0.7, 0.95])
def test_truncated_files_are_rejected_never_padded(kind, keep):
    data = TRUNCATABLE[kind]()
    assert pixels(data).shape == (64, 96, 3)  # the whole file is fine
    error = rejection(data[: int(len(data) * keep)])
    assert error.reason == "truncated", error


def test_corrupt_data_is_a_decode_error_with_the_decoders_message():
    data = bytearray(cases.encode(NOISE, "PNG"))
    data[100] ^= 0xFF  # inside the image data: the chunk's CRC no longer matches
    error = rejection(bytes(data))
    assert error.reason == "decode_error"
    assert "broken data stream" in error.detail  # Pillow's own words


def test_a_failure_after_decoding_is_reported_as_an_internal_error(monkeypatch):
    def broken(image, box, upright_size, settings):
        raise ValueError("box offset can't be negative")

    monkeypatch.setattr(pixel_steps, "resize", broken)
    error = rejection(cases.encode(QUADRANTS, "PNG"), ImageSettings())
    assert error.reason == "internal_error"
    assert "box offset" in error.detail and "please report" in error.detail


def test_no_mangled_file_escapes_as_anything_but_a_rejection():
    rng = random.Random(3)
    names = ("jpeg_baseline", "jpeg_progressive", "png", "gif", "tiff", "webp_lossy", "bmp")
    sources = [FORMATS[name]() for name in names] + [cases.ARITHMETIC_JPEG, cases.ycck_jpeg((0, 255, 255, 0))]
    outcomes = set()
    for source in sources:
        for _ in range(25):
            data = bytearray(source)
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            if rng.random() < 0.3:
                data = data[: rng.randrange(1, len(data))]
            try:
                convert_image(bytes(data), ImageSettings(width=32, height=32))
                outcomes.add("converted")
            except ImageRejected as e:
                assert e.reason in {"truncated", "decode_error", "corrupt_data", "not_an_image", "unsupported_format",
                                    "decompression_bomb"}
                outcomes.add(e.reason)
    assert "converted" in outcomes and len(outcomes) > 2


# --- The time limit --------------------------------------------------------------------------------


def test_a_passed_deadline_rejects_as_timeout():
    assert convert_image(cases.encode(QUADRANTS, "PNG"), ImageSettings(), deadline=time.monotonic() + 60)
    with pytest.raises(ImageRejected) as caught:
        convert_image(cases.encode(QUADRANTS, "PNG"), ImageSettings(), deadline=time.monotonic() - 1)
    assert caught.value.reason == "timeout"
