"""--duplicates=drop with --task=detection: of byte-identical images the first path is written with its own
annotations; every other copy is an errors.jsonl line (duplicate) and each of its annotations one more (stage
annotation, duplicate_image), so that annotations found = written + rejected still holds."""

from __future__ import annotations

import json

from pipeline import verify
from pipeline.cli import main_of
from tests.conftest import FAST
from tests.datasets import error_rows
from tests.detection_runs import coco_export, read_detection_records, record_boxes

ARGS = ("--task=detection", "--image_size=64x48")


def _run(root, out, *args) -> int:
    from pipeline.launcher import run

    return run([f"--input_dir={root}", f"--output_dir={out}", "--quiet", *ARGS, *args, *FAST])


def test_a_dropped_copys_annotations_are_each_rejected_as_duplicate_image(tmp_path):
    root, out = tmp_path / "coco", tmp_path / "out"
    coco_export(root)
    # b.jpg (one dog) and valid/w.jpg (one dog) become copies of a.jpg (a cat and a dog): other annotations
    (root / "train" / "b.jpg").write_bytes((root / "train" / "a.jpg").read_bytes())
    (root / "valid" / "w.jpg").write_bytes((root / "train" / "a.jpg").read_bytes())
    assert _run(root, out, "--duplicates=drop") == 0

    info = json.loads((out / "image_tfrecords.json").read_text())
    records = {r["image/filename"][0]: r for rows in read_detection_records(out).values() for r in rows}
    assert sorted(records) == ["train/a.jpg", "train/c.jpg", "train/d.jpg", "valid/v.jpg"]
    # the copy written keeps its own annotations (the first path's), never a dropped copy's
    assert [name for name, _ in record_boxes(records["train/a.jpg"])] == ["cat", "dog"]
    assert info["rejected_by_reason"] == {"duplicate": 2}
    assert info["detection"]["annotations"] == {"found": 8, "written": 6, "rejected": {"duplicate_image": 2}}
    rows = error_rows(out)
    assert sorted((r["relpath"], r["stage"], r["reason"]) for r in rows) == [
        ("train/b.jpg", "annotation", "duplicate_image"), ("train/b.jpg", "rejected", "duplicate"),
        ("valid/w.jpg", "annotation", "duplicate_image"), ("valid/w.jpg", "rejected", "duplicate")]
    line = next(r for r in rows if r["reason"] == "duplicate_image" and r["relpath"] == "train/b.jpg")
    assert "is a copy that is not written" in line["detail"] and "train/a.jpg" in line["detail"]
    assert main_of(verify.run, [str(out)]) == 0


def test_without_drop_the_copies_are_written_with_their_own_annotations(tmp_path):
    root, out = tmp_path / "coco", tmp_path / "out"
    coco_export(root)
    (root / "train" / "b.jpg").write_bytes((root / "train" / "a.jpg").read_bytes())
    assert _run(root, out) == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    records = {r["image/filename"][0]: r for rows in read_detection_records(out).values() for r in rows}
    assert [name for name, _ in record_boxes(records["train/b.jpg"])] == ["dog"]
    assert info["detection"]["annotations"] == {"found": 8, "written": 8, "rejected": {}}
    assert info["duplicates"]["groups"] == 1


def test_an_appended_copy_of_a_record_is_dropped_with_its_annotations(tmp_path):
    """--duplicates=drop on an append: a new image with the bytes of a record the dataset holds is not written, and
    each of its annotations is a duplicate_image line; the dataset's records and counts stay."""
    from tests.detection_runs import voc_export

    coco, voc, out = tmp_path / "coco", tmp_path / "voc", tmp_path / "out"
    coco_export(coco)
    assert _run(coco, out, "--duplicates=drop") == 0
    before = read_detection_records(out)
    # voc_export draws the same pictures as coco_export, in order: e.jpg has a.jpg's bytes
    voc_export(voc, (("train", "e", [("cat", (4.0, 4.0, 40.0, 40.0)), ("dog", (1.0, 1.0, 9.0, 9.0))]),))
    assert (voc / "JPEGImages" / "e.jpg").read_bytes() == (coco / "train" / "a.jpg").read_bytes()
    assert _run(voc, out, "--duplicates=drop", "--if_exists=append") == 0

    info = json.loads((out / "image_tfrecords.json").read_text())
    assert read_detection_records(out) == before
    assert info["rejected_by_reason"] == {"duplicate": 1}
    assert info["detection"]["annotations"] == {"found": 8 + 2, "written": 8, "rejected": {"duplicate_image": 2}}
    lines = sorted((r["relpath"], r["stage"], r["reason"]) for r in error_rows(out))
    assert lines == [("JPEGImages/e.jpg", "annotation", "duplicate_image")] * 2 + [
        ("JPEGImages/e.jpg", "rejected", "duplicate")]
    assert main_of(verify.run, [str(out)]) == 0
