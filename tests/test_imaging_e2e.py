"""One conversion of a dirty folder: every file is converted correctly or listed with its reason."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from pipeline.sample_data import photo_like
from tests import image_cases as cases
from tests.conftest import convert
from tests.error_lines import unpublished
from tests.image_cases import BLUE, GREEN, RED, YELLOW
from transforms.base.examples import Example
from transforms.base.tfrecord import iter_records

SIZE = 32
NOISE = Image.effect_noise((80, 60), 50).convert("RGB")
UPRIGHT = cases.quadrants(64, 32)


def _good_files() -> dict[str, tuple[bytes, tuple[int, int, int] | None]]:
    """relpath -> (bytes, the colour the centre of the output must have, or None for 'any')."""
    red = (0, 255, 255, 0)
    files = {
        "odd/cmyk_adobe.jpg": (cases.cmyk_jpeg(red), RED),
        "odd/cmyk_plain.jpg": (cases.cmyk_jpeg(red, adobe=False), RED),
        "odd/ycck.jpg": (cases.ycck_jpeg(red), RED),
        "odd/cmyk.tif": (cases.encode(Image.new("CMYK", (16, 16), red), "TIFF"), RED),
        "odd/arithmetic.jpg": (cases.ARITHMETIC_JPEG, None),
        "odd/progressive.jpeg": (cases.jpeg(Image.new("RGB", (40, 30), BLUE), progressive=True), BLUE),
        "odd/png_named.jpg": (cases.encode(Image.new("RGB", (20, 20), GREEN), "PNG"), GREEN),
        "odd/webp_named.jpg": (cases.encode(Image.new("RGB", (20, 20), YELLOW), "WEBP", lossless=True), YELLOW),
        "odd/grey16.png": (cases.png(np.full((8, 8), 32896, np.uint16), 16, 0), (128, 128, 128)),
        "odd/rgb16.tif": (cases.tiff_rgb16(np.full((8, 8, 3), 65535, np.uint16)), (255, 255, 255)),
        "odd/palette_trns.png": (cases.png(np.zeros((8, 8), np.uint8), 4, 3, palette=b"\0\0\0", trns=b"\0"),
                                 (255, 255, 255)),
        "odd/la.png": (cases.encode(Image.new("LA", (8, 8), (0, 0)), "PNG"), (255, 255, 255)),
        "odd/rgba.webp": (cases.encode(Image.new("RGBA", (8, 8), (0, 0, 0, 0)), "WEBP", lossless=True),
                          (255, 255, 255)),
        "odd/animated.gif": (cases.animated("GIF"), RED),
        "odd/animated.webp": (cases.animated("WEBP"), RED),
        "odd/animated.png": (cases.animated("PNG"), RED),
        "odd/stereo.mpo": (cases.animated("MPO"), RED),
        "odd/pages.tiff": (cases.animated("TIFF"), RED),
        "odd/bitmap.bmp": (cases.encode(Image.new("RGB", (10, 10), GREEN), "BMP"), GREEN),
        "odd/grey.jpg": (cases.jpeg(Image.new("L", (10, 10), 200)), (200, 200, 200)),
        "odd/broken_exif.jpg": (cases.jpeg(Image.new("RGB", (10, 10), BLUE), exif=cases.BROKEN_EXIF), BLUE),
        "odd/UPPER.JPG": (cases.jpeg(Image.new("RGB", (10, 10), RED)), RED),
    }
    for orientation in range(1, 9):
        data = cases.jpeg(cases.oriented(UPRIGHT, orientation), exif=cases.exif_orientation(orientation))
        files[f"rotated/exif_{orientation}.jpg"] = (data, None)
    return files


def _bad_files() -> dict[str, tuple[bytes, str]]:
    """relpath -> (bytes, the rejection reason)."""
    jpeg = cases.jpeg(NOISE)
    png = cases.encode(NOISE, "PNG")
    corrupt = bytearray(png)
    corrupt[100] ^= 0xFF
    photo = cases.jpeg(photo_like(120, 90, np.random.default_rng(3)), quality=90)
    files = {
        "odd/empty.jpg": (b"", "empty_file"),
        "odd/text.jpg": (b"this is a text file, not a photo\n", "not_an_image"),
        "odd/error_page.png": (b"<html><body>403 Forbidden</body></html>", "not_an_image"),
        "odd/bomb.png": (cases.png_bomb(), "decompression_bomb"),
        "odd/jpeg2000.jpg": (cases.encode(Image.new("RGB", (8, 8)), "JPEG2000"), "unsupported_format"),
        "odd/corrupt.png": (bytes(corrupt), "decode_error"),
        "odd/flipped_scan.jpg": (cases.damaged_scan(photo), "corrupt_data"),  # libjpeg warns, Pillow does not
        "odd/lost_bytes.jpg": (cases.damaged_scan(photo, "lost"), "corrupt_data"),
    }
    for name, data in {"jpg": jpeg, "png": png, "gif": cases.encode(NOISE, "GIF"),
                       "webp": cases.encode(NOISE, "WEBP"), "tif": cases.encode(NOISE, "TIFF"),
                       "bmp": cases.encode(NOISE, "BMP")}.items():
        for keep in (0.4, 0.8):
            files[f"truncated/cut_{int(keep * 100)}.{name}"] = (data[: int(len(data) * keep)], "truncated")
    return files


@pytest.fixture(scope="module")
def dirty_run(tmp_path_factory):
    from pipeline.sample_data import generate_dataset

    root = tmp_path_factory.mktemp("dirty")
    photos = generate_dataset(str(root), images_per_class=45, classes=("cats", "dogs", "birds"), seed=5,
                              min_side=40, max_side=120)
    good, bad = _good_files(), _bad_files()
    for relpath, (data, _) in {**good, **bad}.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(data)
    (root / "cats" / "notes.txt").write_text("not an image")
    (root / "dogs" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    out = tmp_path_factory.mktemp("dirty_out")
    code = convert(root, out, f"--image_size={SIZE}", "--test_split=0.1")
    return code, out, photos, good, bad


def test_a_dirty_folder_converts_with_exit_0(dirty_run):
    code, out, photos, good, bad = dirty_run
    assert code == 0
    assert len(photos) + len(good) + len(bad) > 180  # a realistic mix, still fast


def test_every_file_is_a_record_or_a_listed_rejection(dirty_run):
    code, out, photos, good, bad = dirty_run
    info = json.loads((out / "image_tfrecords.json").read_text())
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    reasons = {e["relpath"]: e["reason"] for e in errors}
    assert all(e["detail"] for e in errors)
    # Every bad file is listed with its own reason; no good file is.
    assert {path: reasons.get(path) for path in bad} == {path: reason for path, (_, reason) in bad.items()}
    assert reasons.get("cats/notes.txt") == "not_an_image_extension"
    assert reasons.get("dogs/.DS_Store") == "hidden_file"
    assert len(errors) == len(bad) + 2
    # Every good file is exactly one record.
    records = _records(out, info)
    assert sorted(records) == sorted([*photos, *good])
    assert info["files"]["found"] == len(photos) + len(good) + len(bad) + 2
    assert info["files"]["written"] == len(records)
    assert info["files"]["rejected"] == len(bad)
    assert sum(split["records"] for split in info["splits"].values()) == len(records)


def test_odd_files_are_converted_correctly(dirty_run):
    code, out, photos, good, bad = dirty_run
    records = _records(out, json.loads((out / "image_tfrecords.json").read_text()))
    for relpath, (_, colour) in good.items():
        image = records[relpath]
        assert image.size == (SIZE, SIZE)
        if colour is not None:
            centre = np.asarray(image, int)[SIZE // 2, SIZE // 2]
            assert np.abs(centre - colour).max() <= 12, (relpath, centre, colour)
    for orientation in range(1, 9):  # every EXIF orientation ends up upright
        image = np.asarray(records[f"rotated/exif_{orientation}.jpg"], int)
        for (y, x), colour in {(8, 8): RED, (8, 24): GREEN, (24, 8): BLUE, (24, 24): YELLOW}.items():
            assert np.abs(image[y, x] - colour).max() <= 12, (orientation, (y, x), image[y, x])


def _records(out, info) -> dict[str, Image.Image]:
    records = {}
    for split in info["splits"].values():
        for shard in split["shards"]:
            for raw in iter_records(str(out / shard["file"])):
                feature = Example.FromString(raw).features.feature
                relpath = feature["source_path"].bytes_list.value[0].decode()
                assert relpath not in records
                records[relpath] = Image.open(io.BytesIO(feature["image"].bytes_list.value[0])).convert("RGB")
    return records


def test_the_time_limit_rejects_through_the_pipeline(tmp_path):
    for name in ("a", "b"):
        (tmp_path / "in" / "cls").mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / "cls" / f"{name}.jpg").write_bytes(cases.jpeg(UPRIGHT))
    # No conversion finishes within a microsecond: every image is rejected as timeout.
    assert convert(tmp_path / "in", tmp_path / "out", "--image_timeout_s=0.000001") == 1
    errors = [json.loads(line) for line in (unpublished(tmp_path / "out") / "errors.jsonl").read_text().splitlines()]
    assert sorted((e["relpath"], e["reason"]) for e in errors) == [("cls/a.jpg", "timeout"), ("cls/b.jpg", "timeout")]


def test_a_negative_time_limit_is_a_user_error(tmp_path):
    from pipeline.errors import UserError

    with pytest.raises(UserError, match="--image_timeout_s=-1.0 must be 0"):
        convert(tmp_path, tmp_path / "out", "--image_timeout_s=-1")
