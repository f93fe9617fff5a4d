"""--task=detection end to end: each input format (COCO, Pascal VOC, YOLO, a CSV of boxes) converts with one command
into detection records whose boxes, classes, splits and ids are read back; every annotation is written or in
errors.jsonl; a COCO ground truth read back evaluates to AP 1.0 against itself (pycocotools); 4 workers write the
same bytes as 1."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from tests.conftest import FAST, cli, convert, main_in_process, run_tool
from tests.datasets import error_rows
from tests.detection_runs import (
    CLASSES,
    IMAGES,
    SIZE,
    boxes_of,
    coco_export,
    export_of,
    read_detection_records,
    record_boxes,
    voc_export,
    yolo_export,
)

OUTPUT = (32, 24)  # --image_size: half the source's width and height, stretched
ARGS = ("--task=detection", f"--image_size={OUTPUT[0]}x{OUTPUT[1]}")


_export = export_of


def _run(inputs: list[str], out, *args) -> int:
    from pipeline.launcher import run

    return run([*inputs, f"--output_dir={out}", "--quiet", *ARGS, *args, *FAST])


def _stem(record: dict) -> str:
    return record["image/filename"][0].rsplit("/", 1)[-1].rsplit(".", 1)[0]


def _close(got: list, expected: list, tolerance: float = 0.5) -> bool:
    """Two lists of (class, box) alike, in any order, each coordinate within `tolerance` pixels."""
    got, expected = sorted(got), sorted(expected)
    return len(got) == len(expected) and all(
        a[0] == b[0] and np.allclose(a[1], b[1], atol=tolerance) for a, b in zip(got, expected, strict=True))


@pytest.mark.parametrize("kind", ["coco", "voc", "yolo", "boxes"])
def test_each_format_converts_with_one_command(tmp_path, kind):
    inputs, _ = _export(kind, tmp_path / kind)
    out = tmp_path / "out"
    assert _run(inputs, out) == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["task"] == "detection" and info["schema"] == "detection"
    assert info["class_names"] == list(CLASSES)
    assert (out / "labels.txt").read_text() == "cat\ndog\n"
    assert "id: 1\n  name: 'cat'" in (out / "label_map.pbtxt").read_text()
    found = sum(len(objects) for _, _, objects in IMAGES)
    assert info["detection"]["annotations"] == {"found": found, "written": found, "rejected": {}}
    assert info["detection"]["images_without_objects"] == {"kept": 1, "dropped": 0}
    assert info["detection"]["objects_per_image_max"] == 3
    assert info["detection"]["input_format"] == kind and info["detection"]["first_id"] == 1
    assert info["files"] == {"found": 6, "written": 6, "rejected": 0, "skipped": 0, "upscaled": 0}
    assert "image/object/bbox/xmin" in info["features"] and "image/object/mask" not in info["features"]
    expected = boxes_of()
    records = read_detection_records(out)
    splits = {_stem(record): split for split, rows in records.items() for record in rows}
    assert splits == {stem: split for split, stem, _ in IMAGES}  # the dataset's own splits (the CSV's column)
    for record in (r for rows in records.values() for r in rows):
        stem = _stem(record)
        assert (record["image/width"], record["image/height"]) == ([OUTPUT[0]], [OUTPUT[1]])
        half = [(name, tuple(v * OUTPUT[0] / SIZE[0] for v in box)) for name, box in expected[stem]]
        assert _close(record_boxes(record), half), (stem, record_boxes(record), half)
        labels = record.get("image/object/class/label", [])
        assert labels == [CLASSES.index(name) + 1 for name in record.get("image/object/class/text", [])]
        assert record["image/source_id"][0].isdigit()
        assert record["image/format"] == ["jpeg"] and len(record["image/key/sha256"][0]) == 64
        if kind == "coco":  # COCO's own image id
            assert record["image/source_id"][0] == str([s for _, s, _ in IMAGES].index(stem) + 1)


@pytest.mark.parametrize("mode, size, scale, offset", [
    ("pad", (32, 32), 0.5, (0, 4)),  # 32 x 24 of content, centred: bars of 4 above and below
    ("crop", (24, 24), 0.5, (-4, 0)),  # scaled to 32 x 24, its centre 24 x 24 kept: 4 cut on each side
])
def test_boxes_follow_pad_and_crop(tmp_path, mode, size, scale, offset):
    voc_export(tmp_path / "voc")
    out = tmp_path / "out"
    assert _run([f"--input_dir={tmp_path / 'voc'}"], out, f"--resize_mode={mode}", f"--image_size={size[0]}x{size[1]}"
                ) == 0
    expected = boxes_of()
    for record in (r for rows in read_detection_records(out).values() for r in rows):
        assert (record["image/width"], record["image/height"]) == ([size[0]], [size[1]])
        placed = [(name, (min(max(x0 * scale + offset[0], 0), size[0]), min(max(y0 * scale + offset[1], 0), size[1]),
                          min(max(x1 * scale + offset[0], 0), size[0]), min(max(y1 * scale + offset[1], 0), size[1])))
                  for name, (x0, y0, x1, y1) in expected[_stem(record)]]
        assert _close(record_boxes(record), placed), (_stem(record), record_boxes(record), placed)


def test_class_ids_from_zero_and_images_without_objects_dropped(tmp_path):
    yolo_export(tmp_path / "yolo")
    out = tmp_path / "out"
    assert _run([f"--input_dir={tmp_path / 'yolo'}"], out, "--first_class_id=0", "--images_without_objects=drop") == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["detection"]["first_id"] == 0
    assert info["detection"]["images_without_objects"] == {"kept": 0, "dropped": 1}
    assert info["files"] == {"found": 6, "written": 5, "rejected": 0, "skipped": 1, "upscaled": 0}
    assert info["skipped_by_reason"] == {"no_objects": 1}
    assert [(row["relpath"], row["stage"], row["reason"]) for row in error_rows(out)] == [
        ("train/images/c.jpg", "skipped", "no_objects")]
    records = [r for rows in read_detection_records(out).values() for r in rows]
    assert sorted(_stem(r) for r in records) == ["a", "b", "d", "v", "w"]
    for record in records:
        assert record["image/object/class/label"] == [CLASSES.index(n) for n in record["image/object/class/text"]]
    assert (out / "label_map.pbtxt").read_text().count("id: 0\n") == 1


def test_every_annotation_is_written_or_in_errors_jsonl(tmp_path):
    """Broken annotations of a COCO export, each with its reason; the images stay written. An image that cannot be
    decoded takes its annotations with it (image_rejected)."""
    broken = [
        {"id": 101, "image_id": 2, "category_id": 1, "bbox": [1, 2, 3], "iscrowd": 0},  # parser: bad_annotation
        {"id": 102, "image_id": 2, "category_id": 7, "bbox": [1, 2, 3, 4], "iscrowd": 0},  # parser: unknown_class
        {"id": 103, "image_id": 2, "category_id": 2, "bbox": [200, 5, 10, 10], "iscrowd": 0},  # box_outside_image
        {"id": 104, "image_id": 2, "category_id": 2, "bbox": [5, 5, 0, 10], "iscrowd": 0},  # geometry: bad_box
        {"id": 105, "image_id": 2, "category_id": 1, "bbox": [5, 5, 1, 1], "iscrowd": 0},  # box_too_small at 0.5x
    ]
    root = tmp_path / "coco"
    coco_export(root, extra={"train": broken})
    (root / "train" / "d.jpg").write_bytes(b"\xff\xd8 not a JPEG")  # its 3 annotations: image_rejected
    out = tmp_path / "out"
    assert _run([f"--input_dir={root}"], out) == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    annotations = info["detection"]["annotations"]
    assert annotations["rejected"] == {"bad_annotation": 1, "bad_box": 1, "box_outside_image": 1,
                                       "box_too_small": 1, "image_rejected": 3, "unknown_class": 1}
    assert annotations["found"] == 8 + 5 and annotations["written"] == 5
    assert info["files"]["written"] == 5 and info["rejected_by_reason"] == {"not_an_image": 1}
    rows = error_rows(out)
    lines = sorted((row["relpath"], row["stage"], row["reason"]) for row in rows)
    assert lines == sorted([("train/b.jpg", "annotation", reason) for reason in (
        "bad_annotation", "unknown_class", "box_outside_image", "bad_box", "box_too_small")]
        + [("train/d.jpg", "annotation", "image_rejected")] * 3 + [("train/d.jpg", "rejected", "not_an_image")])
    assert all(row["detail"] for row in rows)
    records = {_stem(r): r for rows in read_detection_records(out).values() for r in rows}
    assert sorted(records) == ["a", "b", "c", "v", "w"]  # b is written, with its one good box
    assert records["b"]["image/object/class/text"] == ["dog"]
    # verify's accounting: the annotation lines are not lost images (b.jpg is written and has 5 of them)
    from pipeline import verify

    report = verify.Report(str(out))
    written = {r["image/filename"][0] for rows in read_detection_records(out).values() for r in rows}
    verify._check_accounting(str(out), info, written, report)
    assert report.problems == []
    (out / "errors.jsonl").write_text("".join(line + "\n" for line in (out / "errors.jsonl").read_text().splitlines()
                                              if '"bad_box"' not in line))
    verify._check_accounting(str(out), info, written, report)
    assert len(report.problems) == 1 and "annotations set aside" in report.problems[0]
    summary = run_tool("pipeline.main", f"--input_dir={root}", f"--output_dir={tmp_path / 'again'}", *ARGS, *FAST)
    assert summary.returncode == 0, summary.stderr
    assert "Annotations: 13 found: 5 written, 8 rejected (bad_annotation 1, bad_box 1" in summary.stdout


def test_a_coco_ground_truth_read_back_scores_ap_one(tmp_path):
    """The issue's test: the records of a COCO export, made detections again (boxes back in source pixels, classes
    back to category ids), evaluated by pycocotools' COCOeval against the original ground truth: AP 1.0."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    written = coco_export(tmp_path / "coco")
    out = tmp_path / "out"
    assert _run([f"--input_dir={tmp_path / 'coco'}"], out) == 0
    records = read_detection_records(out)
    category = {c["name"]: c["id"] for c in written["train"]["categories"]}
    scale = SIZE[0] / OUTPUT[0]
    for split in ("train", "validation"):
        truth = {**written[split], "info": {}, "licenses": []}
        (tmp_path / f"{split}.json").write_text(json.dumps(truth))
        ground = COCO(str(tmp_path / f"{split}.json"))
        detections = [{"image_id": int(record["image/source_id"][0]), "category_id": category[name],
                       "bbox": [x0 * scale, y0 * scale, (x1 - x0) * scale, (y1 - y0) * scale], "score": 1.0}
                      for record in records[split] for name, (x0, y0, x1, y1) in record_boxes(record)]
        evaluation = COCOeval(ground, ground.loadRes(detections), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
        assert evaluation.stats[0] == pytest.approx(1.0), split  # AP at IoU .50:.95
        assert evaluation.stats[8] == pytest.approx(1.0), split  # AR, 100 detections


def test_instance_masks_one_png_per_object_at_the_stored_size(tmp_path):
    coco_export(tmp_path / "coco")
    out = tmp_path / "out"
    assert _run([f"--input_dir={tmp_path / 'coco'}"], out, "--instance_masks") == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["detection"]["instance_masks"] is True and "image/object/mask" in info["features"]
    for record in (r for rows in read_detection_records(out).values() for r in rows):
        masks = record.get("image/object/mask", [])
        assert len(masks) == len(record.get("image/object/class/label", []))
        for png, (_, (x0, y0, x1, y1)), area in zip(masks, record_boxes(record), record["image/object/area"],
                                                    strict=True):
            mask = np.asarray(Image.open(io.BytesIO(png)))
            assert mask.shape == (OUTPUT[1], OUTPUT[0]) and set(np.unique(mask)) <= {0, 1}
            assert mask.sum() == area and abs(mask.sum() - (x1 - x0) * (y1 - y0)) <= (x1 - x0) + (y1 - y0) + 1


def test_without_task_the_export_is_refused_in_one_line(tmp_path, capsys):
    yolo_export(tmp_path / "yolo")
    code, err = main_in_process(capsys, f"--input_dir={tmp_path / 'yolo'}", f"--output_dir={tmp_path / 'out'}",
                                *FAST)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "YOLO object-detection export" in err and "give --task=detection to convert it" in err


@pytest.mark.parametrize("option, words", [
    ("--multi_label", "--multi_label and --task=detection do not go together"),
    ("--schema=tf_slim", "--schema=tf_slim is for classification records"),
])
def test_options_that_make_no_sense_with_detection_are_refused_in_one_line(tmp_path, capsys, option, words):
    code, err = main_in_process(capsys, f"--input_dir={tmp_path}", f"--output_dir={tmp_path / 'out'}",
                                "--task=detection", option, *FAST)
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_a_folder_of_no_export_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "in" / "a.jpg")
    code, err = main_in_process(capsys, f"--input_dir={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}",
                                "--task=detection", *FAST)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "found no detection export" in err, err


@pytest.mark.timeout(900)
def test_four_workers_write_the_same_bytes_as_one(tmp_path):
    coco_export(tmp_path / "coco")
    shards = {}
    for workers in (1, 4):
        out = tmp_path / f"out{workers}"
        result = cli("pipeline.main", f"--input_dir={tmp_path / 'coco'}", f"--output_dir={out}", *ARGS, "--quiet",
                     "--instance_masks", f"--direct_num_workers={workers}")
        assert result.returncode == 0, result.stderr[-3000:]
        shards[workers] = {path.name: path.read_bytes() for path in sorted(out.glob("*.tfrecord"))}
        assert json.loads((out / "image_tfrecords.json").read_text())["detection"]["annotations"]["written"] == 8
    assert shards[1] == shards[4] and len(shards[1]) == 2


def test_a_convert_of_the_detection_export_goes_through_convert(tmp_path):
    """The conftest helper, as other tests call it: exit 0, and the description validates."""
    from transforms.base.dataset_format import check_description

    voc_export(tmp_path / "voc")
    assert convert(tmp_path / "voc", tmp_path / "out", *ARGS) == 0
    info = check_description(json.loads((tmp_path / "out" / "image_tfrecords.json").read_text()))
    assert info["detection"]["annotations"]["written"] == 8


def test_voc_class_masks_are_written_as_their_indices(tmp_path):
    """A VOC export with SegmentationClass/: the records of the images that have a mask carry it, resized
    nearest-neighbour (indices kept: 0, the class, 255); a mask that is not a PNG is rejected on its own."""
    root = tmp_path / "voc"
    voc_export(root)
    mask = np.zeros((SIZE[1], SIZE[0]), np.uint8)
    mask[6:40, 4:30], mask[0:2, :] = 8, 255  # VOC's cat is 8; 255 its boundary
    picture = Image.fromarray(mask, "P")
    picture.putpalette([0, 0, 0, 128, 0, 0] * 128)
    (root / "SegmentationClass").mkdir()
    picture.save(root / "SegmentationClass" / "a.png")
    (root / "SegmentationClass" / "b.png").write_bytes(b"not a PNG")
    out = tmp_path / "out"
    assert _run([f"--input_dir={root}"], out) == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["detection"]["semantic_masks"] is True
    assert info["detection"]["semantic_masks_rejected"] == 1 and info["detection"]["annotations"]["rejected"] == {}
    records = {_stem(r): r for rows in read_detection_records(out).values() for r in rows}
    stored = np.asarray(Image.open(io.BytesIO(records["a"]["image/segmentation/class/encoded"][0])))
    assert stored.shape == (OUTPUT[1], OUTPUT[0]) and set(np.unique(stored)) == {0, 8, 255}
    assert (stored == 8).sum() == pytest.approx(26 * 34 / 4, abs=20)
    assert "image/segmentation/class/encoded" not in records["b"] and "image/segmentation/class/encoded" not in \
        records["c"]
    assert [(row["relpath"], row["stage"], row["reason"]) for row in error_rows(out)] == [
        ("JPEGImages/b.jpg", "annotation", "bad_semantic_mask")]


def test_an_export_of_no_object_publishes_nothing_and_says_why(tmp_path):
    root = tmp_path / "voc"
    voc_export(root, [(split, stem, []) for split, stem, _ in IMAGES])
    result = run_tool("pipeline.main", f"--input_dir={root}", f"--output_dir={tmp_path / 'out'}", *ARGS, "--quiet",
                      *FAST)
    assert result.returncode == 1
    assert "error: no object has a class: the annotations hold no object that was kept" in result.stderr
    assert not (tmp_path / "out" / "image_tfrecords.json").exists()
