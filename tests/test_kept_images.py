"""Images that already fit are stored as they are (issue 30): a folder of 512x512 JPEGs converted at 512 came out
53 % larger and slightly worse, re-encoded at quality 95."""

from __future__ import annotations

import io
import json

from PIL import Image

from tests.conftest import convert
from tests.datasets import read_records
from tests.image_cases import exif_orientation


def _photo(size, seed: int) -> Image.Image:
    import numpy as np

    from pipeline.sample_data import photo_like

    return photo_like(*size, np.random.default_rng(seed), hue=seed / 7)


def _jpeg(image: Image.Image, **params) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=85, **params)
    return out.getvalue()


def _tree(root):
    files = {
        "a/fits.jpg": _jpeg(_photo((64, 48), 1)),
        "a/fits_too.jpg": _jpeg(_photo((64, 48), 2)),
        "b/progressive.jpg": _jpeg(_photo((64, 48), 3), progressive=True),
        "b/rotated.jpg": _jpeg(_photo((64, 48), 4), exif=exif_orientation(3)),
        "b/larger.jpg": _jpeg(_photo((128, 96), 5)),
    }
    png = io.BytesIO()
    _photo((64, 48), 6).save(png, format="PNG")
    files["a/fits.png"] = png.getvalue()
    for relpath, data in files.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(data)
    return files


def test_jpegs_already_at_the_output_size_are_stored_byte_for_byte(tmp_path):
    files = _tree(tmp_path / "in")
    out = tmp_path / "out"
    assert convert(tmp_path / "in", out, "--image_size=64x48", "--validation_split=0", "--resize_mode=crop") == 0
    stored = {r["source_path"]: r["image"] for r in read_records(out)["train"]}
    assert set(stored) == set(files)
    for relpath in ("a/fits.jpg", "a/fits_too.jpg"):
        assert stored[relpath] == files[relpath]  # the source's own bytes: no second JPEG generation
    for relpath in ("b/progressive.jpg", "b/rotated.jpg", "b/larger.jpg", "a/fits.png"):
        assert stored[relpath] != files[relpath]
        assert Image.open(io.BytesIO(stored[relpath])).size == (64, 48)
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["statistics"]["splits"]["train"]["kept"] == 2
    from pipeline.report import format_summary

    assert ("Stored as they were: 2 images already at the output size (upright baseline JPEGs), their image data "
            "as it was (no metadata), without a second JPEG generation; --reencode re-encodes them."
            ) in format_summary(info)


def test_reencode_re_encodes_them(tmp_path):
    files = _tree(tmp_path / "in")
    out = tmp_path / "out"
    assert convert(tmp_path / "in", out, "--image_size=64x48", "--validation_split=0", "--reencode") == 0
    stored = {r["source_path"]: r["image"] for r in read_records(out)["train"]}
    assert all(stored[relpath] != data for relpath, data in files.items())
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["statistics"]["splits"]["train"]["kept"] == 0
    assert info["options"]["reencode"] is True


def test_images_stored_as_they_are_carry_no_metadata_and_nothing_after_them(tmp_path):
    # Issue 47: they kept EXIF GPS and the camera's serial, ICC, comments, a payload after the end and a second JPEG.
    from PIL import ImageCms

    exif = Image.Exif()
    exif[0x010F], exif[0xA431] = "SecretCam", "SERIAL-12345"
    exif[0x8825] = {1: "N", 2: (52.0, 22.0, 1.5), 3: "E", 4: (4.0, 53.0, 2.0)}
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    files = {
        "a/gps.jpg": _jpeg(_photo((64, 48), 1), exif=exif.tobytes()),
        "a/trailing.jpg": _jpeg(_photo((64, 48), 2)) + b"PK\x03\x04SECRET-PAYLOAD" * 100,
        "b/icc.jpg": _jpeg(_photo((64, 48), 3), icc_profile=icc, comment=b"patient John Doe"),
        "b/concat.jpg": _jpeg(_photo((64, 48), 4)) + _jpeg(Image.new("RGB", (64, 48), "red")),
    }
    for relpath, data in files.items():
        (tmp_path / "in" / relpath).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / relpath).write_bytes(data)
    out = tmp_path / "out"
    assert convert(tmp_path / "in", out, "--image_size=64x48", "--validation_split=0") == 0
    stored = {r["source_path"]: r["image"] for r in read_records(out)["train"]}
    assert sorted(stored) == sorted(files)
    for relpath, image in stored.items():
        found = [s for s in (b"Exif", b"SERIAL-12345", b"ICC_PROFILE", b"John Doe", b"SECRET-PAYLOAD") if s in image]
        assert found == [] and image.count(b"\xff\xd8") == 1 and image.endswith(b"\xff\xd9"), relpath
        assert (Image.open(io.BytesIO(image)).tobytes()
                == Image.open(io.BytesIO(files[relpath])).convert("RGB").tobytes())  # the same pixels
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["statistics"]["splits"]["train"]["kept"] == 4
