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

    assert ("Stored as they were: 2 images already at the output size (upright baseline JPEGs), byte for byte, "
            "without a second JPEG generation; --reencode re-encodes them.") in format_summary(info)


def test_reencode_re_encodes_them(tmp_path):
    files = _tree(tmp_path / "in")
    out = tmp_path / "out"
    assert convert(tmp_path / "in", out, "--image_size=64x48", "--validation_split=0", "--reencode") == 0
    stored = {r["source_path"]: r["image"] for r in read_records(out)["train"]}
    assert all(stored[relpath] != data for relpath, data in files.items())
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["statistics"]["splits"]["train"]["kept"] == 0
    assert info["options"]["reencode"] is True
