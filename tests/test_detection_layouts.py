"""Object-detection exports (YOLO, Pascal VOC, COCO) are refused in one line, never converted into a class named
`images` (issue 48); a real class folder called `images` or `labels` still converts.

Each export is a small generated copy of the layout its tool writes: Roboflow's YOLOv8 export (data.yaml,
train/images/ + train/labels/), Ultralytics' (images/train/ + labels/train/), a VOC2012 folder, Roboflow's
COCO export (_annotations.coco.json in each split folder) and COCO's own (annotations/instances_*.json).
"""

from __future__ import annotations

import json

import pytest
from PIL import Image

from tests.conftest import convert, main_in_process
from tests.datasets import read_records, write_tiny_tree
from transforms.labels.detection import detection_export


def _image(path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (24, 24), (20, 120, 200)).save(path, quality=85)


def _text(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def yolov8_export(root, data_yaml: bool = True) -> None:
    """Roboflow's YOLOv8 export: <split>/images/*.jpg, <split>/labels/*.txt (one box a line), data.yaml."""
    for split in ("train", "valid", "test"):
        for i in range(3):
            _image(root / split / "images" / f"img{i}_jpg.rf.{i}.jpg")
            _text(root / split / "labels" / f"img{i}_jpg.rf.{i}.txt", "0 0.5 0.5 0.25 0.25\n1 0.2 0.3 0.1 0.1\n")
    if data_yaml:
        _text(root / "data.yaml", "train: ../train/images\nval: ../valid/images\nnc: 2\nnames: ['car', 'dog']\n")
        _text(root / "README.roboflow.txt", "exported from roboflow.com\n")


def ultralytics_export(root) -> None:
    """Ultralytics' own layout: images/<split>/ beside labels/<split>/, no data.yaml in the folder."""
    for split in ("train", "val"):
        for i in range(3):
            _image(root / "images" / split / f"{i:06d}.jpg")
            _text(root / "labels" / split / f"{i:06d}.txt", "3 0.5 0.5 0.4 0.4\n")


def voc_folder(root) -> None:
    """A VOC2012 folder: JPEGImages/, Annotations/*.xml, ImageSets/Main/*.txt, SegmentationClass/*.png."""
    for i in range(4):
        _image(root / "JPEGImages" / f"2007_00{i}.jpg")
        _text(root / "Annotations" / f"2007_00{i}.xml", f"<annotation><filename>2007_00{i}.jpg</filename>"
              "<object><name>dog</name><bndbox><xmin>1</xmin></bndbox></object></annotation>")
        _image(root / "SegmentationClass" / f"2007_00{i}.png")
    _text(root / "ImageSets" / "Main" / "train.txt", "2007_000\n2007_001\n")


def roboflow_coco_export(root) -> None:
    """Roboflow's COCO export: images directly in each split folder, with its _annotations.coco.json."""
    for split in ("train", "valid"):
        for i in range(3):
            _image(root / split / f"img{i}.jpg")
        _text(root / split / "_annotations.coco.json", json.dumps({"images": [], "annotations": [],
                                                                   "categories": []}))


def _refusal(tmp_path, capsys, src) -> str:
    out = tmp_path / "out"
    code, err = main_in_process(capsys, f"--input_dir={src}", f"--output_dir={out}")
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert not out.exists() or not any(out.iterdir())  # nothing written
    return lines[0]


def _says_what_to_do(line: str) -> None:
    assert "not class folders" in line
    assert "give --task=detection to convert it into detection records" in line
    assert "<class>/ folders" in line and "--manifest" in line


def test_a_yolov8_export_with_data_yaml_is_refused(tmp_path, capsys):
    src = tmp_path / "yolo"
    yolov8_export(src)
    line = _refusal(tmp_path, capsys, src)
    assert ("train/labels/ holds YOLO box files (.txt) beside train/images/ (and 2 more such folders), and "
            "data.yaml: this is a YOLO object-detection export") in line
    _says_what_to_do(line)


def test_a_yolo_export_without_data_yaml_is_refused_by_its_labels_folders(tmp_path, capsys):
    src = tmp_path / "yolo"
    yolov8_export(src, data_yaml=False)
    line = _refusal(tmp_path, capsys, src)
    assert "train/labels/ holds YOLO box files (.txt) beside train/images/ (and 2 more such folders): this is a " \
           "YOLO object-detection export" in line


def test_the_ultralytics_layout_is_refused(tmp_path, capsys):
    src = tmp_path / "coco8"
    ultralytics_export(src)
    line = _refusal(tmp_path, capsys, src)
    assert "labels/ holds YOLO box files (.txt) beside images/: this is a YOLO object-detection export" in line


@pytest.mark.parametrize("below", ["", "VOCdevkit/VOC2012"])
def test_a_pascal_voc_folder_is_refused(tmp_path, capsys, below):
    voc_folder(tmp_path / "in" / below)
    src = tmp_path / "in" / below.split("/")[0] if below else tmp_path / "in"
    line = _refusal(tmp_path, capsys, src)
    where = "VOC2012/" if below else ""
    assert (f"{where}Annotations/ holds Pascal VOC box files (.xml) beside {where}JPEGImages/: this is a Pascal "
            "VOC object-detection export") in line
    _says_what_to_do(line)


def test_a_roboflow_coco_export_is_refused(tmp_path, capsys):
    src = tmp_path / "coco"
    roboflow_coco_export(src)
    line = _refusal(tmp_path, capsys, src)
    assert ("train/_annotations.coco.json (and 1 more like it) is a COCO annotation file (boxes and masks): this is "
            "a COCO object-detection export") in line
    _says_what_to_do(line)


def test_cocos_own_layout_is_refused(tmp_path, capsys):
    src = tmp_path / "coco2017"
    for split in ("train2017", "val2017"):
        for i in range(2):
            _image(src / split / f"{i:012d}.jpg")
    _text(src / "annotations" / "instances_val2017.json", "{}")
    _text(src / "annotations" / "captions_val2017.json", "{}")
    line = _refusal(tmp_path, capsys, src)
    assert "annotations/instances_val2017.json is a COCO annotation file" in line


def test_class_folders_called_images_and_labels_still_convert(tmp_path):
    """One sign is not enough: classes `images` and `labels` (with images in it, and a .txt note beside them)."""
    src = tmp_path / "in"
    write_tiny_tree(src, {"images": 3, "labels": 2, "text": 2})
    _text(src / "labels" / "notes.txt", "pictures of labels\n")
    out = tmp_path / "out"
    assert convert(src, out, "--validation_split=0") == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == ["images", "labels", "text"]
    records = read_records(out)["train"]
    assert sorted((r["class_name"], r["label"]) for r in records) == [
        ("images", 0)] * 3 + [("labels", 1)] * 2 + [("text", 2)] * 2


def test_split_folders_with_a_class_called_images_still_convert(tmp_path):
    src = tmp_path / "in"
    for split in ("train", "val"):
        write_tiny_tree(src / split, {"images": 2, "charts": 2})
    out = tmp_path / "out"
    assert convert(src, out) == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == ["charts", "images"]
    assert {s: v["records"] for s, v in info["splits"].items()} == {"train": 4, "validation": 4}


@pytest.mark.parametrize("files, folders, kind", [
    (["train/images/a.jpg", "train/labels/a.txt"], [], "YOLO"),
    (["images/a.jpg", "labels/a.txt"], [], "YOLO"),
    (["data.yaml", "cats/a.jpg"], [], "YOLO"),  # the export's own file is enough
    (["Annotations/a.xml"], ["JPEGImages"], "Pascal VOC"),
    (["JPEGImages/a.jpg"], ["JPEGImages", "ImageSets"], "Pascal VOC"),
    (["valid/_annotations.coco.json", "valid/a.jpg"], [], "COCO"),
    (["annotations/instances_train2017.json"], ["train2017"], "COCO"),
    # one sign alone: a class folder that happens to have such a name
    (["images/a.jpg", "text/b.jpg"], [], None),
    (["images/a.jpg", "labels/b.jpg", "labels/readme.txt"], [], None),  # labels/ holds images: a class
    (["labels/a.txt", "cats/a.jpg"], [], None),  # no images/ beside it
    (["JPEGImages/a.jpg", "dogs/b.jpg"], [], None),
    (["Annotations/a.jpg"], ["JPEGImages"], None),  # no .xml in it
    (["train/cats/a.jpg", "train/dogs/b.jpg", "val/cats/c.jpg"], ["train", "val"], None),
    (["notes.json", "cats/a.jpg"], [], None),
])
def test_detection_export_needs_the_exports_own_file_or_two_signs(files, folders, kind):
    found = detection_export(files, folders)
    assert (found.kind if found else None) == kind
