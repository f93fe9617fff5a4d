"""Annotations carried through the conversion (transforms.detection.geometry): every box lands on its rectangle in
the converted pixels, for each resize mode, EXIF orientation, decoder path and annotation frame; masks keep their
values; what cannot be kept is rejected with its reason."""

from __future__ import annotations

import io
import itertools
import math

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as coco_mask

from tests.detection_images import RECTANGLES, UPRIGHT_SIZE, extent, measured_box, oriented_file
from transforms.detection import geometry
from transforms.detection.geometry import place_annotations
from transforms.detection.objects import Annotation, Box, ImageAnnotations, Segmentation
from transforms.images import pixels
from transforms.images.imaging import convert_image
from transforms.images.settings import ImageSettings

MODES = ("stretch", "crop", "pad")
ORIENTATIONS = range(1, 9)
# 4:3 crops the 5:3 source's sides, 3:1 its top and bottom (at a fractional offset).
SIZES = ((64, 48), (96, 32))


def settings(mode: str, size=(64, 48), backend: str = "auto") -> ImageSettings:
    # PNG out: no codec loss on the measured edges; black bars: pad's background measures as nothing.
    return ImageSettings(width=size[0], height=size[1], resize_mode=mode, image_format="png", background=(0, 0, 0),
                         image_backend=backend)


def annotations(boxes: dict, frame: str = "", frame_size=None, normalised: bool = False, **kwargs):
    objects = tuple(Annotation(str(channel), Box(*box), where=f"object {channel}") for channel, box in boxes.items())
    return ImageAnnotations("photo.jpg", "/data/photo.jpg", "7", frame_size=frame_size, objects=objects,
                            normalised=normalised, frame=frame, **kwargs)


def decoded(encoded) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(encoded.data)).convert("RGB"))


def output_px(placed_object, size) -> tuple[float, float, float, float]:
    w, h = size
    b = placed_object.box
    return b.xmin * w, b.ymin * h, b.xmax * w, b.ymax * h


def worst_miss(encoded, placed) -> float:
    """The largest distance, in output pixels, between a placed box's side and its rectangle's in the pixels."""
    image = decoded(encoded)
    size = (encoded.width, encoded.height)
    return max(max(abs(a - b) for a, b in zip(output_px(o, size), measured_box(image, int(o.class_name),
                                                                              output_px(o, size)), strict=True))
               for o in placed.objects)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_each_box_lands_on_its_rectangle_in_the_converted_pixels(mode, orientation):
    for image_format, backend, size in itertools.product(("JPEG", "PNG"), ("auto", "pillow"), SIZES):
        file = oriented_file(orientation, image_format)
        encoded = convert_image(file.data, settings(mode, size, backend))
        assert encoded.placement.output_size == (encoded.width, encoded.height)
        upright = file.stored_size[::-1] if pixels.transposes(orientation) else file.stored_size
        assert upright == UPRIGHT_SIZE
        cases = [  # the frame named by the format, and decided from the annotation file's image size
            annotations(file.stored_boxes, frame="stored"),
            annotations(file.upright_boxes, frame="upright"),
            annotations(file.stored_boxes, frame_size=file.stored_size),
        ]
        if pixels.transposes(orientation):  # only then does the upright size tell the upright frame
            cases.append(annotations(file.upright_boxes, frame_size=upright))
        for case in cases:
            placed = place_annotations(case, encoded.placement)
            label = f"{image_format} {backend} {size} frame={case.frame or case.frame_size}"
            assert not placed.problems, label
            assert len(placed.objects) == len(RECTANGLES), label
            assert worst_miss(encoded, placed) <= 0.5, label
            for o in placed.objects:
                assert 0.0 <= o.box.xmin < o.box.xmax <= 1.0 and 0.0 <= o.box.ymin < o.box.ymax <= 1.0


@pytest.mark.parametrize("orientation", (2, 5, 6, 7, 8))
def test_boxes_read_in_the_wrong_frame_miss_their_rectangles(orientation):
    # The measure can fail: the upright boxes taken as stored ones land elsewhere.
    file = oriented_file(orientation, "PNG")
    encoded = convert_image(file.data, settings("stretch"))
    swapped = {c: file.upright_boxes[c] for c in file.upright_boxes}
    placed = place_annotations(annotations(swapped, frame="stored"), encoded.placement)
    assert placed.problems or worst_miss(encoded, placed) > 3


def test_normalised_boxes_are_fractions_of_their_frame():
    file = oriented_file(6, "PNG")
    encoded = convert_image(file.data, settings("pad"))
    width, height = UPRIGHT_SIZE
    fractions = {c: (b[0] / width, b[1] / height, b[2] / width, b[3] / height) for c, b in file.upright_boxes.items()}
    placed = place_annotations(annotations(fractions, frame="upright", normalised=True), encoded.placement)
    in_pixels = place_annotations(annotations(file.upright_boxes, frame="upright"), encoded.placement)
    assert [v for o in placed.objects for v in o.box] == pytest.approx([v for o in in_pixels.objects for v in o.box])
    assert worst_miss(encoded, placed) <= 0.5
    # The same fractions of the stored frame (480 x 800) are other boxes.
    stored = place_annotations(annotations(fractions, frame="stored", normalised=True), encoded.placement)
    assert [v for o in stored.objects for v in o.box] != pytest.approx([v for o in in_pixels.objects for v in o.box])


def test_the_frame_is_decided_from_the_annotation_files_image_size():
    turned = pixels.placement((480, 800), 6, settings("stretch"))  # stored portrait, upright landscape
    flipped = pixels.placement((800, 480), 3, settings("stretch"))
    decide = geometry.decide_frame
    assert decide("", (480, 800), turned) == "stored"
    assert decide("", (800, 480), turned) == "upright"
    assert decide("", None, turned) == "stored"  # nothing to tell by: the OD API's and TF decoders' frame
    assert decide("", (800, 480), flipped) == "stored"  # both sizes the same: stored, as documented
    assert decide("", (640, 480), turned) == ""
    assert decide("upright", None, flipped) == "upright"
    assert decide("upright", (480, 800), turned) == ""  # the format's frame, but the stored size
    with pytest.raises(ValueError):
        decide("sideways", None, turned)


def test_a_size_that_is_neither_the_stored_nor_the_upright_one_rejects_every_box():
    file = oriented_file(6, "PNG")
    encoded = convert_image(file.data, settings("crop"))
    placed = place_annotations(annotations(file.stored_boxes, frame_size=(640, 480)), encoded.placement)
    assert placed.objects == ()
    assert [p.reason for p in placed.problems] == ["image_size_mismatch"] * 3
    assert "gives the image as 640x480, the file is 480x800 (800x480 upright)" in placed.problems[0].detail
    assert placed.problems[0].detail.startswith("object 0: ") and placed.problems[0].image == "photo.jpg"


def test_an_image_kept_as_it_is_has_the_identity_placement():
    image = Image.fromarray(np.zeros((48, 64, 3), np.uint8))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    encoded = convert_image(out.getvalue(), ImageSettings(width=64, height=48))
    assert encoded.kept
    assert encoded.placement == pixels.Placement((64, 48), 1, (0, 0, 64, 48), (0, 0, 64, 48), (64, 48))
    placed = place_annotations(annotations({0: (16, 12, 32, 36)}), encoded.placement)
    assert placed.objects[0].box == pytest.approx(Box(0.25, 0.25, 0.5, 0.75))
    assert placed.objects[0].area == pytest.approx(16 * 24)


# ---------------------------------------------------------------------------------------------------------------
# Masks.


def rle_of(plane: np.ndarray, compressed: bool) -> dict:
    """COCO's RLE of a 0/1 plane: compressed counts as a str (as in a JSON file), or the list of run lengths."""
    if compressed:
        rle = coco_mask.encode(np.asfortranarray(plane.astype(np.uint8)))
        return {"size": list(rle["size"]), "counts": rle["counts"].decode("ascii")}
    flat = plane.astype(np.uint8).ravel(order="F")
    edges = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], edges, [flat.size]])).tolist()
    return {"size": list(plane.shape), "counts": ([0] if flat[0] else []) + runs}


def mask_annotations(file, frame: str, kind: str) -> ImageAnnotations:
    boxes = file.stored_boxes if frame == "stored" else file.upright_boxes
    objects = []
    for channel, (x0, y0, x1, y1) in boxes.items():
        if kind == "polygon":
            segmentation = Segmentation(polygons=((x0, y0, x1, y0, x1, y1, x0, y1),))
        else:
            size = file.stored_size if frame == "stored" else UPRIGHT_SIZE
            plane = np.zeros((size[1], size[0]), np.uint8)
            plane[y0:y1, x0:x1] = 1
            segmentation = Segmentation(rle=rle_of(plane, compressed=kind == "rle"))
        objects.append(Annotation(str(channel), Box(x0, y0, x1, y1), segmentation=segmentation))
    return ImageAnnotations("photo.png", "/data/photo.png", "7", objects=tuple(objects), frame=frame)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_instance_masks_stay_zero_or_one_and_cover_their_rectangles(mode, orientation):
    file = oriented_file(orientation, "PNG")
    for size in SIZES:
        encoded = convert_image(file.data, settings(mode, size))
        image = decoded(encoded)
        content = np.zeros(image.shape[:2], bool)
        c0x, c0y, c1x, c1y = encoded.placement.content_box
        content[c0y:c1y, c0x:c1x] = True
        for frame, kind in itertools.product(("stored", "upright"), ("polygon", "rle", "rle_list")):
            placed = place_annotations(mask_annotations(file, frame, kind), encoded.placement)
            label = f"{size} {frame} {kind}"
            assert not placed.problems, label
            for o in placed.objects:
                assert o.mask.dtype == np.uint8 and o.mask.shape == image.shape[:2], label
                assert set(np.unique(o.mask)) <= {0, 1}, label
                assert not o.mask[~content].any(), label  # never in pad's bars
                assert o.area == o.mask.sum()
                # the mask's pixels are those whose centre lies in the box: within half a pixel of it
                expected = output_px(o, (encoded.width, encoded.height))
                got = extent(o.mask)
                slack = 0.5 if kind != "polygon" else 1.0  # pycocotools' polygon fill has its own rounding
                assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) <= slack + 1e-9, label
                # and they are the rectangle's pixels: bright where the mask is, dark well outside it
                channel = image[:, :, int(o.class_name)]
                inner = o.mask.astype(bool) & np.roll(o.mask, 1, 0).astype(bool) & np.roll(o.mask, -1, 0).astype(
                    bool) & np.roll(o.mask, 1, 1).astype(bool) & np.roll(o.mask, -1, 1).astype(bool)
                assert channel[inner].min() > 200, label


def semantic_png(file, frame: str, palette: bool) -> bytes:
    """A class-id mask of the rectangles (ids 3, 7, 9 on 0) in `frame`: a palette PNG whose colours are not the
    ids, or a grey one."""
    ids = {0: 3, 1: 7, 2: 9}
    boxes = file.stored_boxes if frame == "stored" else file.upright_boxes
    size = file.stored_size if frame == "stored" else UPRIGHT_SIZE
    values = np.zeros((size[1], size[0]), np.uint8)
    for channel, (x0, y0, x1, y1) in boxes.items():
        values[y0:y1, x0:x1] = ids[channel]
    image = Image.fromarray(values, "L")
    if palette:
        image = Image.fromarray(values, "P")
        image.putpalette([v for i in range(256) for v in ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)])
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_a_semantic_mask_keeps_exact_class_ids_and_lands_on_its_rectangles(mode, orientation):
    file = oriented_file(orientation, "PNG")
    encoded = convert_image(file.data, settings(mode))
    boxes = place_annotations(annotations(file.upright_boxes, frame="upright"), encoded.placement).objects
    c0x, c0y, c1x, c1y = encoded.placement.content_box
    for frame, palette in itertools.product(("stored", "upright"), (True, False)):
        ann = ImageAnnotations("photo.png", "/data/photo.png", "7", semantic_mask="/data/photo_mask.png")
        if not pixels.transposes(orientation):  # the same size both ways: the frame as a format would name it
            ann = ann._replace(frame=frame)
        placed = place_annotations(ann, encoded.placement, semantic_png(file, frame, palette))
        label = f"{frame} palette={palette}"
        assert not placed.problems, label
        mask = placed.semantic_mask
        assert mask.shape == (encoded.height, encoded.width)
        assert set(np.unique(mask[c0y:c1y, c0x:c1x])) <= {0, 3, 7, 9}, label
        outside = np.ones(mask.shape, bool)
        outside[c0y:c1y, c0x:c1x] = False
        assert (mask[outside] == geometry.SEMANTIC_PAD).all(), label  # pad's bars: 'ignore'
        for o, class_id in zip(boxes, (3, 7, 9), strict=True):
            got = extent(mask == class_id)
            expected = output_px(o, (encoded.width, encoded.height))
            assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) <= 0.5 + 1e-9, label


def test_objects_without_a_segmentation_get_their_box_as_mask_when_others_have_one():
    placement = pixels.placement((100, 50), 1, ImageSettings(width=100, height=50, resize_mode="stretch"))
    objects = (Annotation("a", Box(10, 10, 30, 20), segmentation=Segmentation(polygons=((10, 10, 30, 10, 30, 20),))),
               Annotation("b", Box(50, 20, 70, 40)))
    placed = place_annotations(ImageAnnotations("x.png", "/x.png", "1", objects=objects), placement)
    assert extent(placed.objects[1].mask) == (50, 20, 70, 40)
    assert placed.objects[1].area == 400
    assert placed.objects[0].area == placed.objects[0].mask.sum() < 200  # a triangle: about half its box
    alone = place_annotations(ImageAnnotations("x.png", "/x.png", "1", objects=objects[1:]), placement)
    assert alone.objects[0].mask is None and alone.objects[0].area == 400


# ---------------------------------------------------------------------------------------------------------------
# Rejections.


def test_each_annotation_that_cannot_be_kept_is_rejected_with_its_reason():
    # 800 x 480 to 64 x 48 by crop: the upright source's x 80-720 is kept, at 0.1 output pixels per source pixel.
    placement = pixels.placement((800, 480), 1, settings("crop"))
    cases = {
        "kept": (Box(100, 100, 300, 200), None, None),
        "cut by the crop": (Box(40, 100, 300, 200), None, None),
        "outside the crop": (Box(10, 100, 70, 200), "box_outside_image", "lies outside the crop"),
        "outside the image": (Box(-50, -40, -10, -5), "box_outside_image", "lies outside the image (800x480"),
        "sub-pixel": (Box(300, 300, 305, 380), "box_too_small", "is 0.5x8 pixels once resized to 64x48"),
        "reversed": (Box(300, 100, 200, 200), "bad_box", "is not a box"),
        "empty": (Box(300, 100, 300, 200), "bad_box", "is not a box"),
        "nan": (Box(math.nan, 100, 300, 200), "bad_box", "is not a box"),
        "infinite": (Box(100, 100, math.inf, 200), "bad_box", "is not a box"),
    }
    objects = tuple(Annotation("cat", box, where=f"ann {name}") for name, (box, _, _) in cases.items())
    placed = place_annotations(ImageAnnotations("a.jpg", "/a.jpg", "1", objects=objects), placement)
    assert [o.where for o in placed.objects] == ["ann kept", "ann cut by the crop"]
    assert placed.objects[1].box.xmin == 0.0 and placed.objects[1].truncated
    assert not placed.objects[0].truncated
    got = {p.detail.split(":")[0]: p for p in placed.problems}
    assert len(placed.objects) + len(placed.problems) == len(cases)  # every annotation: placed or rejected
    for name, (_, reason, words) in cases.items():
        if reason:
            problem = got[f"ann {name}"]
            assert problem.reason == reason and words in problem.detail and problem.image == "a.jpg", problem


def test_a_segmentation_that_cannot_be_rasterised_rejects_its_object():
    placement = pixels.placement((100, 80), 1, ImageSettings(width=50, height=40))
    box = Box(10, 10, 40, 40)
    bad = {
        "odd": Segmentation(polygons=((10, 10, 40, 10, 40),)),
        "two points": Segmentation(polygons=((10, 10, 40, 40),)),
        "nan": Segmentation(polygons=((10, 10, 40, 10, math.nan, 40),)),
        "rle size": Segmentation(rle={"size": [100, 80], "counts": [0, 8000]}),
        "rle counts": Segmentation(rle={"size": [80, 100], "counts": [5, 10]}),
        "rle garbage": Segmentation(rle={"size": [80, 100], "counts": "\x00\x01"}),
        "rle no size": Segmentation(rle={"counts": "abc"}),
    }
    objects = tuple(Annotation("cat", box, segmentation=s, where=name) for name, s in bad.items())
    placed = place_annotations(ImageAnnotations("a.png", "/a.png", "1", objects=objects), placement)
    assert placed.objects == ()
    assert [(p.reason, p.detail.split(":")[0]) for p in placed.problems] == [
        ("bad_segmentation", name) for name in bad]
    assert "RLE size 80x100 is not the image's 100x80" in placed.problems[3].detail


def test_a_semantic_mask_that_is_not_class_ids_is_rejected():
    placement = pixels.placement((60, 40), 1, ImageSettings(width=30, height=20))
    ann = ImageAnnotations("a.png", "/a.png", "1", semantic_mask="/masks/a.png")

    def png(image):
        out = io.BytesIO()
        image.save(out, "PNG")
        return out.getvalue()

    cases = {
        "a RGB PNG: its colours are not class ids": png(Image.new("RGB", (60, 40))),
        "its size 50x40 is neither the image's 60x40": png(Image.new("L", (50, 40))),
        "class ids 0-300": png(Image.fromarray(np.array([[0, 300]] * 40, np.uint16).repeat(30, 1), "I;16")),
        "not a readable PNG": b"GIF89a...",
    }
    for words, data in cases.items():
        placed = place_annotations(ann, placement, data)
        assert placed.semantic_mask is None
        (problem,) = placed.problems
        assert problem.reason == "bad_semantic_mask" and problem.detail.startswith("/masks/a.png: ")
        assert words in problem.detail, problem.detail
    fine = place_annotations(ann, placement, png(Image.fromarray(np.full((40, 60), 4, np.uint16), "I;16")))
    assert not fine.problems and set(np.unique(fine.semantic_mask)) == {4}


def test_the_area_follows_the_resize():
    placement = pixels.placement((200, 100), 1, ImageSettings(width=100, height=100, resize_mode="stretch"))
    objects = (Annotation("a", Box(0, 0, 50, 50), area=1000.0), Annotation("b", Box(0, 0, 50, 50)))
    placed = place_annotations(ImageAnnotations("a.png", "/a.png", "1", objects=objects), placement)
    assert placed.objects[0].area == pytest.approx(1000 * 0.5 * 1.0)  # COCO's area, in output pixels
    assert placed.objects[1].area == pytest.approx(25 * 50)  # the box's
