"""--if_exists=append of a detection export into a detection dataset: the dataset's classes keep their ids, new
classes take the next ones (labels.txt and label_map.pbtxt rewritten to match), the old records stay byte for byte,
images the dataset holds already are counted and not written again (their objects neither), and the "detection"
section adds up: found = written + rejected. A detection run never appends into a classification dataset, nor the
reverse."""

from __future__ import annotations

import json

from pipeline import verify
from pipeline.cli import main_of
from tests.conftest import FAST, convert, main_in_process
from tests.datasets import error_rows, write_tiny_tree
from tests.detection_runs import IMAGES, coco_export, read_detection_records, voc_export

ARGS = ("--task=detection", "--image_size=32x24")


def _run(inputs: list[str], out, *args) -> int:
    from pipeline.launcher import run

    return run([*inputs, f"--output_dir={out}", "--quiet", *ARGS, *args, *FAST])


def _info(out) -> dict:
    return json.loads((out / "image_tfrecords.json").read_text())


def _records(out) -> dict[str, dict]:
    return {r["image/filename"][0]: r for rows in read_detection_records(out).values() for r in rows}


def _objects(record: dict) -> list[tuple[int, str]]:
    return list(zip(record.get("image/object/class/label", []), record.get("image/object/class/text", []),
                    strict=True))


def test_another_format_with_a_new_class_appends_with_the_next_id(tmp_path):
    coco, voc, out = tmp_path / "coco", tmp_path / "voc", tmp_path / "out"
    coco_export(coco)
    assert _run([f"--input_dir={coco}"], out) == 0
    before = _records(out)
    assert _info(out)["class_names"] == ["cat", "dog"]

    more = (("train", "e", [("fox", (4.0, 4.0, 40.0, 40.0))]),
            ("train", "f", [("dog", (2.0, 2.0, 30.0, 30.0)), ("fox", (30.0, 10.0, 60.0, 40.0))]),
            ("validation", "g", [("ant", (10.0, 10.0, 20.0, 20.0))]))
    voc_export(voc, more)
    assert _run([f"--input_dir={voc}"], out, "--if_exists=append") == 0

    info, after = _info(out), _records(out)
    # the dataset's classes keep their ids (from 1); the new ones follow, sorted as VOC's names are
    assert info["class_names"] == ["cat", "dog", "ant", "fox"]
    assert (out / "labels.txt").read_text() == "cat\ndog\nant\nfox\n"
    label_map = (out / "label_map.pbtxt").read_text()
    assert [line.strip() for line in label_map.splitlines() if "id:" in line] == ["id: 1", "id: 2", "id: 3", "id: 4"]
    assert label_map.index("'ant'") < label_map.index("'fox'")
    assert all(after[name] == record for name, record in before.items())  # every old record as it was
    assert _objects(after["JPEGImages/e.jpg"]) == [(4, "fox")]
    assert _objects(after["JPEGImages/f.jpg"]) == [(2, "dog"), (4, "fox")]
    assert _objects(after["JPEGImages/g.jpg"]) == [(3, "ant")]
    section = info["detection"]
    assert section["annotations"] == {"found": 8 + 4, "written": 8 + 4, "rejected": {}}
    assert section["input_format"] == "coco+voc" and section["first_id"] == 1
    assert section["images_without_objects"] == {"kept": 1, "dropped": 0}
    assert info["appends"][-1]["annotations"] == {"found": 4, "written": 4, "rejected": 0, "already_in_dataset": 0}
    assert info["files"]["written"] == 6 + 3
    assert main_of(verify.run, [str(out)]) == 0


def test_the_same_export_grown_converts_only_its_new_images(tmp_path):
    """An image the dataset holds (same path, same bytes) is counted, not written again, and its objects are not
    counted twice; a new image's rejected annotation is in errors.jsonl and the section."""
    root, out = tmp_path / "coco", tmp_path / "out"
    coco_export(root)
    assert _run([f"--input_dir={root}"], out) == 0
    before = _records(out)
    grown = (*IMAGES, ("train", "e", [("dog", (4.0, 4.0, 40.0, 40.0))]))
    broken = {"train": [{"id": 99, "image_id": len(grown), "category_id": 1, "bbox": [5, 5, 0, 9], "iscrowd": 0}]}
    coco_export(root, grown, extra=broken)  # the same pictures (and ids) again, and e.jpg with a box and a bad one
    assert _run([f"--input_dir={root}"], out, "--if_exists=append") == 0

    info, after = _info(out), _records(out)
    assert sorted(set(after) - set(before)) == ["train/e.jpg"]
    assert all(after[name] == record for name, record in before.items())
    assert info["class_names"] == ["cat", "dog"]
    assert info["appends"][-1]["converted"] == 1 and info["appends"][-1]["already_in_dataset"] == 6
    assert info["appends"][-1]["annotations"] == {"found": 2, "written": 1, "rejected": 1, "already_in_dataset": 8}
    assert info["detection"]["annotations"] == {"found": 10, "written": 9, "rejected": {"bad_box": 1}}
    assert [(r["relpath"], r["stage"], r["reason"]) for r in error_rows(out)] == [("train/e.jpg", "annotation",
                                                                                  "bad_box")]
    assert main_of(verify.run, [str(out)]) == 0


def test_detection_and_classification_never_append_into_each_other(tmp_path, capsys):
    photos, coco = tmp_path / "photos", tmp_path / "coco"
    write_tiny_tree(photos, {"cat": 3, "dog": 3})
    coco_export(coco)
    classified, detected = tmp_path / "classified", tmp_path / "detected"
    assert convert(photos, classified, "--image_size=16") == 0
    assert _run([f"--input_dir={coco}"], detected) == 0
    kept = {path: (classified / path).read_bytes() for path in ("image_tfrecords.json", "labels.txt")}

    code, err = main_in_process(capsys, f"--input_dir={coco}", f"--output_dir={classified}", *ARGS,
                                "--if_exists=append", *FAST)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "holds classification records and this run writes detection records (--task=detection)" in err
    assert {path: (classified / path).read_bytes() for path in kept} == kept

    code, err = main_in_process(capsys, f"--input_dir={photos}", f"--output_dir={detected}", "--image_size=32x24",
                                "--if_exists=append", *FAST)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "holds detection records and this run writes classification records (--task=classification)" in err
