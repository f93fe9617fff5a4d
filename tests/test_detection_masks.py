"""Pascal VOC's SegmentationObject instance masks with --instance_masks: each object's mask is its index's pixels,
sampled nearest-neighbour through the resize (exact pixels at the stored size for stretch, crop and pad), the void
border in none; each unusable mask file or empty index is a counted errors.jsonl line and its objects keep their
boxes as masks; without --instance_masks nothing changes. And VOC's SegmentationClass class ids, exact after the
resize."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from tests.conftest import FAST, run_tool
from tests.datasets import error_rows
from tests.detection_images import oriented_file
from tests.detection_runs import SIZE, boxes_of, index_png, instance_indices, read_detection_records, voc_export
from transforms.detection.geometry import VOID, place_annotations
from transforms.detection.objects import Annotation, Box, ImageAnnotations
from transforms.images.imaging import convert_image
from transforms.images.settings import ImageSettings

# --resize_mode -> (--image_size, the stored pixels' rows and columns of the 64 x 48 source, nearest-neighbour, and
# where they land in the stored image): every mode halves the source, crop keeps its middle 48 columns, pad adds
# 4 rows of bars above and below.
MODES = {
    "stretch": ((32, 24), (slice(1, 48, 2), slice(1, 64, 2)), (slice(0, 24), slice(0, 32))),
    "crop": ((24, 24), (slice(1, 48, 2), slice(9, 56, 2)), (slice(0, 24), slice(0, 24))),
    "pad": ((32, 32), (slice(1, 48, 2), slice(1, 64, 2)), (slice(4, 28), slice(0, 32))),
}


def _convert(root, out, *args) -> int:
    from pipeline.launcher import run

    return run([f"--input_dir={root}", f"--output_dir={out}", "--quiet", "--task=detection", *args, *FAST])


def _stem(record: dict) -> str:
    return record["image/filename"][0].rsplit("/", 1)[-1].rsplit(".", 1)[0]


def _records(out) -> dict[str, dict]:
    return {_stem(r): r for rows in read_detection_records(out).values() for r in rows}


def _expected_masks(objects, mode: str) -> list[np.ndarray]:
    """Each object's 0/1 mask at the stored size: its index's source pixels where the resize samples them."""
    (width, height), source, stored = MODES[mode]
    indices = instance_indices(objects)
    masks = []
    for k in range(1, len(objects) + 1):
        mask = np.zeros((height, width), np.uint8)
        mask[stored] = indices[source] == k
        masks.append(mask)
    return masks


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("voc")
    voc_export(root, instance_masks=True)
    return root


@pytest.mark.parametrize("mode", sorted(MODES))
def test_voc_instance_masks_read_back_as_drawn(export, tmp_path, mode):
    from pipeline import reader

    (width, height), _, _ = MODES[mode]
    out = tmp_path / "out"
    assert _convert(export, out, "--instance_masks", f"--image_size={width}x{height}", f"--resize_mode={mode}") == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["detection"]["instance_masks"] is True and "instance_masks_rejected" not in info["detection"]
    assert error_rows(out) == []
    objects = boxes_of()
    for split in ("train", "validation"):
        for element in reader.make_dataset(str(out), split).as_numpy_iterator():
            stem = element["source_path"].decode().rsplit("/", 1)[-1][:-4]
            expected = _expected_masks(objects[stem], mode)
            assert element["masks"].shape == (len(expected), height, width)
            for got, want in zip(element["masks"], expected, strict=True):
                np.testing.assert_array_equal(got, want)
                assert want.sum() > 0  # an ellipse, not a box: the mask is the drawn shape
            np.testing.assert_array_equal(element["area"], [m.sum() for m in expected])
    assert run_tool("pipeline.verify", str(out)).returncode == 0


def test_model_gardens_decoder_reads_the_voc_masks(export, tmp_path):
    from tests.model_garden import model_garden_decoder

    tf = pytest.importorskip("tensorflow")
    decoder_class = model_garden_decoder()
    if decoder_class is None:
        pytest.fail("tf-models-official is not installed where make venv puts it (make test does)")
    out = tmp_path / "out"
    assert _convert(export, out, "--instance_masks", "--image_size=32x24") == 0
    from transforms.base.tfrecord import iter_records

    info = json.loads((out / "image_tfrecords.json").read_text())
    decoded = {}
    for shard in info["splits"]["train"]["shards"]:
        for raw in iter_records(str(out / shard["file"])):
            item = decoder_class(include_mask=True).decode(tf.constant(raw))
            decoded[item["groundtruth_instance_masks"].shape[0]] = item["groundtruth_instance_masks"].numpy()
    expected = _expected_masks(boxes_of()["d"], "stretch")  # d: the one image of three objects
    np.testing.assert_array_equal(decoded[3], np.stack(expected).astype(np.float32))


def test_unusable_masks_are_counted_and_their_objects_keep_their_boxes(tmp_path):
    """a: good; b: not a PNG; d: its 2nd object's index has no pixel; v: another size; w: an index its XML has
    no object for. Every object is written (boxes as masks where its mask is not usable), each problem one line."""
    from pipeline import reader

    root = tmp_path / "voc"
    voc_export(root, instance_masks=True)
    masks = root / "SegmentationObject"
    (masks / "b.png").write_bytes(b"not a PNG")
    d = instance_indices(boxes_of()["d"]).copy()
    d[d == 2] = 0
    (masks / "d.png").write_bytes(index_png(d))
    (masks / "v.png").write_bytes(index_png(np.ones((24, 32), np.uint8)))
    w = instance_indices(boxes_of()["w"]).copy()
    w[0:3, 0:3] = 2
    (masks / "w.png").write_bytes(index_png(w))
    out = tmp_path / "out"
    assert _convert(root, out, "--instance_masks", "--image_size=32x24") == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    detection = info["detection"]
    assert detection["annotations"] == {"found": 8, "written": 8, "rejected": {}}
    assert detection["instance_masks_rejected"] == {"bad_instance_mask": 1, "empty_instance_mask": 1,
                                                    "instance_mask_extra_index": 1, "instance_mask_size_mismatch": 1}
    assert sorted((row["relpath"], row["stage"], row["reason"]) for row in error_rows(out)) == [
        ("JPEGImages/b.jpg", "annotation", "bad_instance_mask"),
        ("JPEGImages/d.jpg", "annotation", "empty_instance_mask"),
        ("JPEGImages/v.jpg", "annotation", "instance_mask_size_mismatch"),
        ("JPEGImages/w.jpg", "annotation", "instance_mask_extra_index")]
    empty = next(row for row in error_rows(out) if row["reason"] == "empty_instance_mask")
    assert empty["detail"].startswith("Annotations/d.xml: object 2: index 2 has no pixel in ")
    read = {e["source_path"].decode().rsplit("/", 1)[-1][:-4]: e
            for split in ("train", "validation") for e in reader.make_dataset(str(out), split).as_numpy_iterator()}
    drawn = _expected_masks(boxes_of()["a"], "stretch")
    for got, want in zip(read["a"]["masks"], drawn, strict=True):
        np.testing.assert_array_equal(got, want)
    for stem in ("b", "v", "w"):  # the whole file set aside: each object's box is its mask
        for got, (ymin, xmin, ymax, xmax) in zip(read[stem]["masks"], read[stem]["boxes"], strict=True):
            box = np.zeros((24, 32), np.uint8)
            box[round(ymin * 24):round(ymax * 24), round(xmin * 32):round(xmax * 32)] = 1
            np.testing.assert_array_equal(got, box)
    want = _expected_masks(boxes_of()["d"], "stretch")
    np.testing.assert_array_equal(read["d"]["masks"][0], want[0])
    np.testing.assert_array_equal(read["d"]["masks"][2], want[2])
    ymin, xmin, ymax, xmax = read["d"]["boxes"][1]
    assert read["d"]["masks"][1].sum() == round((ymax - ymin) * 24) * round((xmax - xmin) * 32)
    verified = run_tool("pipeline.verify", str(out))
    assert verified.returncode == 0, verified.stdout
    # a description that forgets an instance mask set aside is caught against errors.jsonl
    detection["instance_masks_rejected"]["empty_instance_mask"] = 0
    (out / "image_tfrecords.json").write_text(json.dumps(info))
    tampered = run_tool("pipeline.verify", str(out))
    assert tampered.returncode != 0 and "annotations set aside" in tampered.stdout


def test_without_instance_masks_the_object_masks_change_nothing(tmp_path):
    plain, masked = tmp_path / "plain", tmp_path / "masked"
    voc_export(plain)
    voc_export(masked, instance_masks=True)
    shards = {}
    for root in (plain, masked):
        out = tmp_path / f"out-{root.name}"
        assert _convert(root, out, "--image_size=32x24") == 0
        assert error_rows(out) == []
        shards[root.name] = {path.name: path.read_bytes() for path in sorted(out.glob("*.tfrecord"))}
        records = _records(out)
        assert not any("image/object/mask" in r for r in records.values())
    assert shards["plain"] == shards["masked"] and shards["plain"]


@pytest.mark.parametrize("mode", ["stretch", "pad"])
def test_voc_class_masks_keep_exact_class_ids_through_the_resize(tmp_path, mode):
    """SegmentationClass/: the stored mask is the source's class ids where the resize samples them (VOC's 255
    border kept), 255 on pad's bars."""
    root = tmp_path / "voc"
    voc_export(root)
    classes = np.zeros((SIZE[1], SIZE[0]), np.uint8)
    classes[6:40, 4:30], classes[2:22, 32:60] = 8, 12  # VOC's cat and dog
    classes[5, 4:30] = classes[40, 4:30] = VOID
    classes[::7, ::5] = 3  # a lattice that only nearest-neighbour keeps exactly
    (root / "SegmentationClass").mkdir()
    (root / "SegmentationClass" / "a.png").write_bytes(index_png(classes))
    (width, height), source, stored = MODES[mode]
    out = tmp_path / "out"
    assert _convert(root, out, f"--image_size={width}x{height}", f"--resize_mode={mode}") == 0
    record = _records(out)["a"]
    got = np.asarray(Image.open(io.BytesIO(record["image/segmentation/class/encoded"][0])))
    expected = np.full((height, width), VOID, np.uint8)
    expected[stored] = classes[source]
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("orientation", [1, 6, 3])
def test_an_instance_mask_follows_the_exif_orientation(orientation):
    """The PNG in the stored pixels' frame (as the boxes): each object's mask is its rectangle in the upright
    image, at the output size."""
    file = oriented_file(orientation, "PNG")
    indices = np.zeros(file.stored_size[::-1], np.uint8)
    objects = []
    for number, (channel, (x0, y0, x1, y1)) in enumerate(sorted(file.stored_boxes.items()), 1):
        indices[y0:y1, x0:x1] = number
        objects.append(Annotation(str(channel), Box(x0, y0, x1, y1), where=f"object {number}", instance=number))
    encoded = convert_image(file.data, ImageSettings(resize_mode="none", image_format="png"))
    ann = ImageAnnotations("p.png", "/p.png", "1", frame_size=file.stored_size, objects=tuple(objects),
                           instance_mask="/masks/p.png", instances=len(objects))
    placed = place_annotations(ann, encoded.placement, masks=True, instance_mask=index_png(indices))
    assert placed.problems == ()
    for obj, (channel, (x0, y0, x1, y1)) in zip(placed.objects, sorted(file.upright_boxes.items()), strict=True):
        expected = np.zeros((480, 800), np.uint8)
        expected[y0:y1, x0:x1] = 1
        assert obj.class_name == str(channel)
        np.testing.assert_array_equal(obj.mask, expected)
    without = place_annotations(ann, encoded.placement, masks=False, instance_mask=index_png(indices))
    assert all(obj.mask is None for obj in without.objects)
