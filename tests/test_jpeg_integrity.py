"""A JPEG is stored only when it decodes cleanly, and a JPEG stored as it is keeps only its image data
(issue 47, findings 2 and 6).

A decode that warns (libjpeg's "Corrupt JPEG data: ... extraneous bytes", "bad Huffman code", "premature end of
data segment") is a rejection, `corrupt_data`, on every backend: the decoder fills in or guesses the damaged part.
A JPEG already at the output size is stored without its metadata (EXIF, GPS, ICC, XMP, comments) and without
anything after its end-of-image marker (a payload, a second JPEG), its pixels unchanged.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageCms

from tests import image_cases as cases
from transforms.images import encode
from transforms.images.diagnosis import ImageRejected
from transforms.images.imaging import convert_image
from transforms.images.settings import ImageSettings

BACKENDS = ("auto", "pillow")


def _photo(width: int, height: int, seed: int) -> Image.Image:
    from pipeline.sample_data import photo_like

    return photo_like(width, height, np.random.default_rng(seed), hue=seed / 7)


def _damaged(data: bytes, damage: str = "flipped") -> bytes:
    """`cases.damaged_scan`, checked to be damage that libjpeg warns of."""
    damaged = cases.damaged_scan(data, damage)
    with pytest.raises(ValueError, match="Corrupt JPEG data"):  # libjpeg itself warns of it
        simplejpeg.decode_jpeg(damaged, strict=True)
    simplejpeg.decode_jpeg(damaged, strict=False)  # and decodes it, filling in what it could not read
    return damaged


def _rejection(data: bytes, settings: ImageSettings) -> ImageRejected:
    with pytest.raises(ImageRejected) as caught:
        convert_image(data, settings)
    return caught.value


SOURCES = {
    "baseline, shrunk": (lambda: cases.jpeg(_photo(400, 300, 1), quality=90), dict(width=128, height=96)),
    "progressive, shrunk": (lambda: cases.jpeg(_photo(400, 300, 2), quality=90, progressive=True),
                            dict(width=128, height=96)),
    "baseline, at the output size": (lambda: cases.jpeg(_photo(160, 120, 3), quality=90),
                                     dict(width=160, height=120)),
    "baseline, --resize_mode=none": (lambda: cases.jpeg(_photo(160, 120, 4), quality=90),
                                     dict(resize_mode="none")),
    "CMYK (Pillow on both backends)": (lambda: cases.jpeg(_photo(200, 150, 5).convert("CMYK"), quality=90),
                                       dict(width=64, height=48)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("damage", ["flipped", "lost"])
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_a_jpeg_whose_decode_warns_is_rejected_as_corrupt_data(name, damage, backend):
    make, sizes = SOURCES[name]
    data = make()
    settings = ImageSettings(image_backend=backend, **sizes)
    assert convert_image(data, settings).width  # the undamaged file converts
    error = _rejection(_damaged(data, damage), settings)
    assert error.reason == "corrupt_data", error
    assert "Corrupt JPEG data" in error.detail  # libjpeg's own words


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_damaged_jpeg_is_never_stored_as_it_is(backend):
    data = cases.jpeg(_photo(64, 64, 6), quality=90)
    damaged = _damaged(data)
    assert damaged.endswith(b"\xff\xd9")  # it ends as a whole JPEG does
    for settings in (ImageSettings(width=64, height=64, image_backend=backend),
                     ImageSettings(resize_mode="none", image_backend=backend)):
        assert convert_image(data, settings).kept
        assert _rejection(damaged, settings).reason == "corrupt_data"


def test_a_jpeg_cut_short_is_still_truncated_on_both_backends():
    data = cases.jpeg(_photo(160, 120, 7), quality=90)
    for backend in BACKENDS:
        error = _rejection(data[: len(data) * 2 // 3], ImageSettings(width=64, height=64, image_backend=backend))
        assert error.reason == "truncated", error


# --- Stored as they are: the image data only -------------------------------------------------------


def _exif_with_gps_and_serial() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 1
    exif[0x010F] = "SecretCam"
    exif[0xA431] = "SERIAL-12345"
    exif[0x8825] = {1: "N", 2: (52.0, 22.0, 1.5), 3: "E", 4: (4.0, 53.0, 2.0)}
    return exif.tobytes()


_XMP = b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:Description GPSLatitude="52,22N" Owner="Jane"/></x:xmpmeta>'
_SECRETS = (b"Exif\x00\x00", b"SecretCam", b"SERIAL-12345", b"ICC_PROFILE", b"John Doe", b"xmpmeta", b"Jane",
            b"SECRET-PAYLOAD", b"Photoshop")


def _with_segment(data: bytes, marker: int, payload: bytes) -> bytes:
    """`data` with one more APPn or COM segment after its first one."""
    first_end = 4 + int.from_bytes(data[4:6], "big")
    segment = bytes([0xFF, marker]) + (len(payload) + 2).to_bytes(2, "big") + payload
    return data[:first_end] + segment + data[first_end:]


def _laden() -> dict[str, bytes]:
    """Upright baseline RGB JPEGs of 64 x 64 carrying metadata or bytes after their end."""
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    second = cases.jpeg(Image.new("RGB", (64, 64), "red"))
    return {
        "EXIF with GPS and serial": cases.jpeg(_photo(64, 64, 10), quality=90, exif=_exif_with_gps_and_serial()),
        "ICC and comment": cases.jpeg(_photo(64, 64, 11), quality=90, icc_profile=icc,
                                      comment=b"internal note: patient John Doe"),
        "XMP and Photoshop": _with_segment(_with_segment(cases.jpeg(_photo(64, 64, 12), quality=90), 0xE1,
                                                         b"http://ns.adobe.com/xap/1.0/\x00" + _XMP),
                                           0xED, b"Photoshop 3.0\x00" + b"8BIM" * 20),
        "payload after the end": cases.jpeg(_photo(64, 64, 13), quality=90) + b"PK\x03\x04SECRET-PAYLOAD" * 100,
        "a second JPEG appended": cases.jpeg(_photo(64, 64, 14), quality=90) + second,
        "thumbnail in APP0 (JFXX)": _with_segment(cases.jpeg(_photo(64, 64, 15), quality=90), 0xE0,
                                                  b"JFXX\x00\x13" + bytes(3 * 4 + 2)),
    }


def _segments(data: bytes) -> list[int]:
    """The markers of `data`'s segments up to its first scan."""
    markers, pos = [], 2
    while data[pos + 1] != 0xDA:
        markers.append(data[pos + 1])
        pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
    return markers


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(_laden()))
def test_a_jpeg_stored_as_it_is_keeps_only_its_image_data(name, backend):
    data = _laden()[name]
    for settings in (ImageSettings(width=64, height=64, image_backend=backend),
                     ImageSettings(resize_mode="none", image_backend=backend)):
        encoded = convert_image(data, settings)
        assert encoded.kept and encoded.format == "jpeg" and (encoded.width, encoded.height) == (64, 64)
        stored = encoded.data
        assert [secret for secret in _SECRETS if secret in stored] == []
        assert stored.count(b"\xff\xd8") == 1 and stored.endswith(b"\xff\xd9")  # one JPEG, nothing after it
        # JFIF's APP0 (no thumbnail) is the one segment of its kind left: no other APPn, no comment.
        assert [m for m in _segments(stored) if 0xE0 <= m <= 0xEF or m == 0xFE] == [0xE0]
        assert stored[6:11] == b"JFIF\x00" and int.from_bytes(stored[4:6], "big") == 16
        # The image data is the source's own (no second JPEG generation): the same pixels, bit for bit.
        source_pixels = simplejpeg.decode_jpeg(data, fastdct=False, fastupsample=False)
        assert np.array_equal(simplejpeg.decode_jpeg(stored, fastdct=False, fastupsample=False), source_pixels)
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(stored))),
                              np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
        assert Image.open(io.BytesIO(stored)).getexif() == {}
        assert "icc_profile" not in Image.open(io.BytesIO(stored)).info


def test_a_plain_jpeg_is_stored_byte_for_byte():
    data = cases.jpeg(_photo(64, 64, 16), quality=90)  # Pillow's JPEG: JFIF, tables, frame, scan
    assert convert_image(data, ImageSettings(width=64, height=64)).data == data


def test_the_adobe_marker_that_says_how_colours_are_coded_is_kept():
    # An Adobe APP14 with transform 1 (YCbCr) tells every decoder the colour coding; without JFIF or it, libjpeg
    # guesses from the components' ids. It is kept (its 12 bytes: no other data is in it); JFIF's APP0 too.
    plain = cases.jpeg(_photo(64, 64, 17), quality=90)
    adobe = _with_segment(plain, 0xEE, b"Adobe\x00\x64\x00\x00\x00\x00\x01")
    stored = convert_image(adobe, ImageSettings(width=64, height=64)).data
    assert _segments(stored)[:2] == [0xE0, 0xEE]
    assert b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x01" in stored
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(stored))), np.asarray(Image.open(io.BytesIO(adobe))))


def test_image_data_only_keeps_every_scan_and_restart_marker():
    # A baseline JPEG with restart intervals (RSTn markers inside the scan) and its tables between segments:
    # the scan is copied to its end-of-image marker whatever 0xFF bytes it holds.
    data = cases.jpeg(_photo(96, 80, 18), quality=95, restart_marker_blocks=1)
    assert b"\xff\xdd" in data and b"\xff\xd0" in data
    laden = _with_segment(data, 0xFE, b"comment") + b"trailing"
    assert encode.image_data_only(laden) == data
    assert encode.image_data_only(b"\xff\xd8\xff\xe0\x00") is None  # no end of image to be found: not kept
