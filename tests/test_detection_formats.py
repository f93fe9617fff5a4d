"""The four detection input formats -> ImageAnnotations, with exact accounting: COCO (Roboflow's export and the
classic layout, streamed), Pascal VOC (ImageSets, masks, hostile XML), YOLO (data.yaml, polygons) and CSV/JSONL
boxes. Each parser's PTransform runs on the in-process runner over a generated copy of the real layout, with
broken annotations; every box is checked against what was written, every problem by its reason, and the tally
by `annotations found = kept + rejected`."""

from __future__ import annotations

import gzip
import json
import os
import tracemalloc

import pytest

from tests.detection_datasets import (
    BILLION_LAUGHS,
    IMAGE,
    external_entity,
    roboflow_coco,
    run_parser,
    voc_xml,
    write,
)
from transforms.detection.boxes import ReadBoxes, box_row
from transforms.detection.coco import CocoError, ReadCoco, find_coco, stream_coco
from transforms.detection.objects import Box, Segmentation
from transforms.detection.parsing import (
    COUNTS,
    FOUND,
    IMAGES,
    PROBLEMS,
    REJECTED,
    LayoutError,
    folder_split,
    source_id_of,
    tally_problem,
)
from transforms.detection.voc import ReadVoc, VocError, find_voc, parse_xml
from transforms.detection.yolo import ReadYolo, label_relpath, parse_label_line, read_data_yaml


def _by_relpath(images):
    return {image.relpath: image for image in images}


def _reasons(items) -> list[tuple[str, str]]:
    return sorted((item.reason, getattr(item, "relpath", getattr(item, "image", ""))) for item in items)


def _assert_adds_up(tally: dict, found: int) -> None:
    assert tally[FOUND] == found
    assert tally_problem(tally) is None, tally_problem(tally)


# -- COCO ------------------------------------------------------------------------------------------------------------


def test_coco_roboflow_export_every_annotation_kept_or_rejected_with_its_reason(tmp_path):
    roboflow_coco(tmp_path)
    sources = find_coco(str(tmp_path))
    assert [(s.images_rel, s.split) for s in sources] == [("test", "test"), ("train", "train"),
                                                         ("valid", "validation")]
    out = run_parser(ReadCoco(str(tmp_path), sources))
    images = _by_relpath(out[IMAGES])
    assert sorted(images) == ["train/a.jpg", "train/b.jpg", "train/extra.jpg", "valid/v.jpg", "valid/v2.jpg"]
    a = images["train/a.jpg"]
    assert (a.source_id, a.split, a.frame_size, a.path) == ("0", "train", (100, 50), str(tmp_path / "train/a.jpg"))
    cat, dog = sorted(a.objects, key=lambda o: o.class_name)
    # COCO's [x, y, w, h] -> (xmin, ymin, xmax, ymax), exactly
    assert (cat.class_name, cat.box, cat.area, cat.is_crowd) == ("cat", Box(10, 5, 30.5, 15), 205.0, False)
    assert cat.segmentation == Segmentation(polygons=((10, 5, 30.5, 5, 30.5, 15),))
    assert (dog.class_name, dog.box, dog.is_crowd) == ("dog", Box(0, 0, 4, 4), True)
    assert dog.segmentation.rle == {"size": [50, 100], "counts": "abc123"}
    assert "annotation id 11" in dog.where
    b = images["train/b.jpg"]
    assert b.objects == () and sorted(p.reason for p in b.problems) == ["box_outside_image", "unknown_class"]
    assert all(p.image == "train/b.jpg" for p in b.problems)
    # on disk without an entry: kept without objects; an entry without annotations: the same
    assert images["train/extra.jpg"].objects == () and images["train/extra.jpg"].split == "train"
    assert images["train/extra.jpg"].source_id == source_id_of("train/extra.jpg")
    assert (images["valid/v2.jpg"].source_id, images["valid/v2.jpg"].objects) == ("6", ())
    (v,) = images["valid/v.jpg"].objects
    assert (v.class_name, v.box, v.segmentation) == ("dog", Box(1, 2, 4, 6), None)
    assert images["valid/v.jpg"].split == "validation"
    # the truncated test file rejects its image; the listed but absent image is missing
    assert _reasons(out[REJECTED]) == [("bad_annotation_file", "test/t.jpg"), ("missing_image", "train/gone.jpg")]
    assert "test/_annotations.coco.json does not parse" in next(r.detail for r in out[REJECTED]
                                                                if r.relpath == "test/t.jpg")
    assert _reasons(out[PROBLEMS]) == [("bad_annotation_file", "test/t.jpg"), ("missing_image", "train/gone.jpg"),
                                       ("unknown_image", "")]
    tally = out[COUNTS]
    _assert_adds_up(tally, 6 + 1 + 1)  # train's 6, valid's 1, the 1 read from the cut test file
    assert tally["annotations_kept"] == 3
    assert tally["annotations_rejected"] == {"box_outside_image": 1, "unknown_class": 1, "missing_image": 1,
                                             "unknown_image": 1, "bad_annotation_file": 1}
    assert (tally["images"], tally["images_without_objects"]) == (5, 3)
    assert tally["images_rejected"] == {"missing_image": 1, "bad_annotation_file": 1}
    assert tally["annotation_files"] == 3


def test_coco_image_id_given_twice_reads_the_first_file_and_rejects_the_other_once(tmp_path):
    """Two image entries of one id with different file names: the first by name is read with every annotation
    of the id; the other file is one duplicate_image rejection, never also kept as an image without objects.
    A file named by a second entry and by its own id is read for its own id."""
    data = {"categories": [{"id": 1, "name": "cat"}],
            "images": [{"id": 3, "file_name": "a.jpg", "width": 10, "height": 10},
                       {"id": 3, "file_name": "b.jpg", "width": 10, "height": 10},
                       {"id": 3, "file_name": "c.jpg", "width": 10, "height": 10},
                       {"id": 4, "file_name": "c.jpg", "width": 10, "height": 10},
                       {"id": 3, "file_name": "gone.jpg", "width": 10, "height": 10}],
            "annotations": [{"id": 1, "image_id": 3, "category_id": 1, "bbox": [1, 1, 2, 2]},
                            {"id": 2, "image_id": 4, "category_id": 1, "bbox": [2, 2, 3, 3]}]}
    write(f"{tmp_path}/_annotations.coco.json", json.dumps(data))
    for name in ("a.jpg", "b.jpg", "c.jpg"):
        write(f"{tmp_path}/{name}", IMAGE)
    out = run_parser(ReadCoco(str(tmp_path), find_coco(str(tmp_path))))
    images = _by_relpath(out[IMAGES])
    assert sorted(images) == ["a.jpg", "c.jpg"]
    assert [o.box for o in images["a.jpg"].objects] == [Box(1, 1, 3, 3)]
    assert [o.box for o in images["c.jpg"].objects] == [Box(2, 2, 5, 5)] and images["c.jpg"].source_id == "4"
    assert _reasons(out[REJECTED]) == [("duplicate_image", "b.jpg"), ("duplicate_image", "gone.jpg")]
    assert "a second image entry of id 3" in next(r.detail for r in out[REJECTED] if r.relpath == "b.jpg")
    _assert_adds_up(out[COUNTS], 2)


def test_coco_class_list_given_makes_other_categories_unknown(tmp_path):
    roboflow_coco(tmp_path)
    sources = [s for s in find_coco(str(tmp_path)) if s.images_rel == "valid"]
    out = run_parser(ReadCoco(str(tmp_path), sources, class_names=["cat"]))
    v = _by_relpath(out[IMAGES])["valid/v.jpg"]
    assert v.objects == () and [p.reason for p in v.problems] == ["unknown_class"]
    _assert_adds_up(out[COUNTS], 1)


def test_coco_classic_layout_and_gzip(tmp_path):
    data = {"images": [{"id": 7, "file_name": "x.jpg", "width": 10, "height": 10}],
            "annotations": [{"id": 1, "image_id": 7, "category_id": 18, "bbox": [1, 1, 2, 2]}],
            "categories": [{"id": 18, "name": "dog"}]}
    write(f"{tmp_path}/annotations/instances_val2017.json", json.dumps(data))
    write(f"{tmp_path}/val2017/x.jpg", IMAGE)
    (source,) = find_coco(str(tmp_path))
    assert (source.images_rel, source.split) == ("val2017", "validation")
    out = run_parser(ReadCoco(str(tmp_path), [source]))
    (image,) = out[IMAGES]
    assert (image.relpath, image.source_id, image.objects[0].class_name) == ("val2017/x.jpg", "7", "dog")
    with gzip.open(tmp_path / "c.json.gz", "wb") as f:
        f.write(json.dumps(data).encode())
    from transforms.inputs.rows import open_file
    with open_file(str(tmp_path / "c.json.gz")) as raw:
        assert [a["id"] for a in stream_coco(raw, "annotations.item")] == [1]


def test_coco_without_annotation_file_is_one_line_layout_error(tmp_path):
    with pytest.raises(LayoutError, match="no COCO annotation file"):
        find_coco(str(tmp_path))


def test_coco_streaming_holds_memory_bounded(tmp_path):
    # ~50 MB: 2,500 crowd annotations of 20 KB RLE strings. The parse holds a buffer and one item at a time.
    path = tmp_path / "big.json"
    with open(path, "w") as f:
        f.write('{"images": [{"id": 1, "file_name": "a.jpg"}], "annotations": [')
        for i in range(2500):
            counts = (f"{i:06d}" + "x" * 20_000)
            f.write(("," if i else "") + json.dumps({"id": i, "image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1],
                                                     "iscrowd": 1, "segmentation": {"size": [9, 9],
                                                                                    "counts": counts}}))
        f.write('], "categories": [{"id": 1, "name": "a"}]}')
    size = os.path.getsize(path)
    assert size > 50_000_000
    tracemalloc.start()
    try:
        with open(path, "rb") as raw:
            count = sum(1 for item in stream_coco(raw, "annotations.item") if item["segmentation"]["counts"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 2500
    assert peak < size / 10, f"peak {peak} bytes for a {size}-byte file"


def test_coco_is_streamed_by_ijsons_c_backend():
    from transforms.detection import coco
    assert coco.IJSON.backend == "yajl2_c"


def test_coco_truncated_and_broken_json_raise_coco_error(tmp_path):
    import io
    with pytest.raises(CocoError, match="premature EOF|incomplete"):
        list(stream_coco(io.BytesIO(b'{"images": [{"id": 1}'), "images.item"))
    with pytest.raises(CocoError):
        list(stream_coco(io.BytesIO(b'{"images": [{"id": 1},, ]}'), "images.item"))


def test_folder_split_names():
    assert [folder_split(n) for n in ("train", "valid", "test", "train2017", "val2017", "images", "")] == [
        "train", "validation", "test", "train", "validation", "", ""]


# -- Pascal VOC ------------------------------------------------------------------------------------------------------


def _voc(root):
    base = f"{root}/VOCdevkit/VOC2012"
    write(f"{base}/Annotations/0001.xml", voc_xml("0001.jpg", [("cat", (1, 1, 10, 20), 0, 1),
                                                               ("dog", (48, 30, 100, 50), 1, 0),
                                                               ("dog", (150, 1, 160, 20), 0, 0)]))
    write(f"{base}/Annotations/0002.xml", "<annotation><object><name>cat</name>")  # does not parse
    write(f"{base}/Annotations/0003.xml", voc_xml("0003.jpg", [("cat", (1, 1, 2, 2), 0, 0)]))  # no image
    write(f"{base}/Annotations/0005.xml", BILLION_LAUGHS)
    write(f"{base}/Annotations/0006.xml", external_entity(f"{root}/secret.txt"))
    write(f"{base}/Annotations/0007.xml", voc_xml("0007.jpg", [("cat", (5, 5, "x", 9), 0, 0)]))
    write(f"{base}/Annotations/0008.xml", voc_xml("0008.jpg", [("cat", (2, 2, 4, 4), 0, 0)]))
    write(f"{root}/secret.txt", "secret")
    os.symlink(f"{root}/nowhere.xml", f"{base}/Annotations/0009.xml")  # an entry the listing cannot use
    for name in ("0001", "0002", "0004", "0005", "0006", "0007", "0008"):
        write(f"{base}/JPEGImages/{name}.jpg", IMAGE)
    write(f"{base}/ImageSets/Main/train.txt", "0001\n0003\n0008\n")
    write(f"{base}/ImageSets/Main/val.txt", "0004\n0008\n")
    write(f"{base}/ImageSets/Main/trainval.txt", "0001\n0003\n0004\n0008\n")  # ignored: train and val are there
    write(f"{base}/ImageSets/Main/cat_train.txt", "0001  1\n")  # a per-class file: not a split file
    write(f"{base}/SegmentationClass/0001.png", IMAGE)
    write(f"{base}/SegmentationObject/0001.png", IMAGE)
    return base


def test_voc_folder_with_image_sets_masks_and_broken_xml(tmp_path):
    base = _voc(tmp_path)
    layout = find_voc(str(tmp_path))
    assert layout.root == "VOCdevkit/VOC2012"
    assert [s for s, _ in layout.split_files] == ["train", "validation"]
    out = run_parser(ReadVoc(str(tmp_path), layout))
    images = _by_relpath(out[IMAGES])
    prefix = "VOCdevkit/VOC2012/JPEGImages/"
    assert sorted(images) == [prefix + "0001.jpg", prefix + "0004.jpg", prefix + "0007.jpg"]
    one = images[prefix + "0001.jpg"]
    assert (one.split, one.frame_size) == ("train", (100, 50))
    assert one.semantic_mask == f"{base}/SegmentationClass/0001.png"
    assert one.instance_mask == f"{base}/SegmentationObject/0001.png"
    # 1-based inclusive corners -> 0-based continuous: (xmin - 1, ymin - 1, xmax, ymax)
    assert [(o.class_name, o.box, o.difficult, o.truncated) for o in one.objects] == [
        ("cat", Box(0, 0, 10, 20), False, True), ("dog", Box(47, 29, 100, 50), True, False)]
    assert [(p.reason, p.detail.split(":")[1].strip()) for p in one.problems] == [("box_outside_image", "object 3")]
    assert images[prefix + "0004.jpg"].split == "validation" and images[prefix + "0004.jpg"].objects == ()
    assert [p.reason for p in images[prefix + "0007.jpg"].problems] == ["bad_annotation"]
    assert _reasons(out[REJECTED]) == [
        ("bad_annotation_file", prefix + "0002.jpg"), ("bad_annotation_file", prefix + "0005.jpg"),
        ("bad_annotation_file", prefix + "0006.jpg"), ("conflicting_splits", prefix + "0008.jpg"),
        ("dangling_symlink", "VOCdevkit/VOC2012/Annotations/0009.xml"), ("missing_image", prefix + "0003.jpg")]
    assert "secret" not in json.dumps([r.detail for r in out[REJECTED]])
    assert _reasons(out[PROBLEMS]) == [("conflicting_splits", prefix + "0008.jpg"),
                                       ("missing_image", prefix + "0003.jpg")]
    tally = out[COUNTS]
    _assert_adds_up(tally, 3 + 1 + 1 + 1)  # 0001's 3, 0003's, 0007's, 0008's
    assert tally["annotation_files"] == 7


def test_voc_xml_parser_refuses_entities_and_bounds_size():
    with pytest.raises(VocError, match="DOCTYPE"):
        parse_xml(BILLION_LAUGHS.encode())
    with pytest.raises(VocError, match="DOCTYPE"):
        parse_xml(external_entity("/etc/passwd").encode())
    with pytest.raises(VocError, match="not XML"):
        parse_xml(b"<annotation>")
    with pytest.raises(VocError, match="MiB"):
        parse_xml(b"<annotation>" + b" " * (5 << 20) + b"</annotation>")
    assert parse_xml(voc_xml("a.jpg", []).encode()).tag == "annotation"


# -- YOLO ------------------------------------------------------------------------------------------------------------


def _yolo(root):
    write(f"{root}/data.yaml", "path: .\ntrain: ../train/images\nval: ../valid/images\nnc: 3\n"
                               "names: {0: cat, 1: dog, 2: bird}\n")
    for name in ("train/images/a.jpg", "train/images/b.jpg", "train/images/c.png", "valid/images/v.jpg"):
        write(f"{root}/{name}", IMAGE)
    write(f"{root}/train/labels/a.txt", "0 0.5 0.5 0.25 0.5\n"
                                        "2 0.1 0.1 0.4 0.1 0.4 0.3 0.1 0.3\n"
                                        "\n"
                                        "5 0.5 0.5 0.1 0.1\n"
                                        "1 nope 0.5 0.1 0.1\n"
                                        "1 1.5 1.5 0.1 0.1\n")
    write(f"{root}/train/labels/b.txt", "")  # an image without objects
    write(f"{root}/valid/labels/v.txt", "1 0.25 0.75 0.5 0.5\n")
    write(f"{root}/valid/labels/orphan.txt", "0 0.5 0.5 0.1 0.1\n1 0.5 0.5 0.1 0.1\n")


def test_yolo_export_boxes_polygons_and_problems(tmp_path):
    _yolo(tmp_path)
    layout = read_data_yaml(str(tmp_path))
    assert layout.names == {0: "cat", 1: "dog", 2: "bird"}
    assert layout.folders == (("train", "train/images"), ("validation", "valid/images"))
    out = run_parser(ReadYolo(str(tmp_path), layout))
    images = _by_relpath(out[IMAGES])
    assert sorted(images) == ["train/images/a.jpg", "train/images/b.jpg", "train/images/c.png", "valid/images/v.jpg"]
    a = images["train/images/a.jpg"]
    assert (a.normalised, a.frame, a.split, a.frame_size) == (True, "upright", "train", None)
    box, polygon = a.objects
    assert (box.class_name, box.box) == ("cat", Box(0.375, 0.25, 0.625, 0.75))
    assert (polygon.class_name, polygon.box) == ("bird", Box(0.1, 0.1, 0.4, 0.3))
    assert polygon.segmentation.polygons == ((0.1, 0.1, 0.4, 0.1, 0.4, 0.3, 0.1, 0.3),)
    assert [(p.reason, p.detail.split(":")[1].strip()) for p in a.problems] == [
        ("unknown_class", "line 4"), ("bad_annotation", "line 5"), ("box_outside_image", "line 6")]
    assert images["train/images/b.jpg"].objects == () and images["train/images/c.png"].objects == ()
    (v,) = images["valid/images/v.jpg"].objects
    assert (v.class_name, v.box, images["valid/images/v.jpg"].split) == ("dog", Box(0, 0.5, 0.5, 1.0), "validation")
    assert _reasons(out[REJECTED]) == [("missing_image", "valid/labels/orphan.txt")]
    assert _reasons(out[PROBLEMS]) == [("missing_image", "valid/labels/orphan.txt")] * 2
    tally = out[COUNTS]
    _assert_adds_up(tally, 5 + 1 + 2)
    assert (tally["images"], tally["images_without_objects"], tally["annotation_files"]) == (4, 2, 4)


def test_yolo_label_paths_and_lines():
    assert label_relpath("train/images/a.jpg") == "train/labels/a.txt"
    assert label_relpath("images/train/x.y.png") == "labels/train/x.y.txt"
    assert parse_label_line("1 0.5 0.5 0.2", {0: "a", 1: "b"}, "w").reason == "bad_annotation"
    assert parse_label_line("0 0.5 0.5 0.2 0.2 0.1 0.1", {0: "a"}, "w", keypoints=True).box == Box(0.4, 0.4,
                                                                                                     0.6, 0.6)


def test_yolo_data_yaml_problems_are_layout_errors(tmp_path):
    with pytest.raises(LayoutError, match="no data.yaml"):
        read_data_yaml(str(tmp_path))
    write(f"{tmp_path}/images/train/a.jpg", IMAGE)
    write(f"{tmp_path}/data.yaml", "train: images/train\nval: images/train\nnames: [a]\n")
    with pytest.raises(LayoutError, match="both train and val"):
        read_data_yaml(str(tmp_path))
    write(f"{tmp_path}/data.yaml", "train: images/train\nnames: {a: 1}\n")
    with pytest.raises(LayoutError, match="names"):
        read_data_yaml(str(tmp_path))
    write(f"{tmp_path}/data.yaml", "train: images/train\nval: elsewhere\nnames: [a]\n")
    with pytest.raises(LayoutError, match="'elsewhere' is not in"):
        read_data_yaml(str(tmp_path))


# -- CSV / JSONL boxes -----------------------------------------------------------------------------------------------


def test_boxes_csv_rows_grouped_per_image(tmp_path):
    for name in ("a.jpg", "b.jpg", "c.jpg", "n.jpg"):
        write(f"{tmp_path}/img/{name}", IMAGE)
    write(f"{tmp_path}/boxes.csv", "path,label,xmin,ymin,xmax,ymax,split,width,height,unit\n"
                                   "img/a.jpg,cat,1,2,30.5,40,train,100,50,\n"
                                   "img/a.jpg,dog,0,0,1,1,train,100,50,\n"
                                   "img/a.jpg,dog,0.1,0.2,0.5,0.6,train,100,50,\n"
                                   "img/b.jpg,,,,,,test,,,\n"
                                   "img/c.jpg,cat,300,2,330,40,,100,50,\n"
                                   "img/gone.jpg,cat,1,2,3,4,,,,\n"
                                   "img/c.jpg,cat,1,x,3,4,,,,\n"
                                   ",cat,1,2,3,4,,,,\n"
                                   "img/n.jpg,cat,0.1,0.2,0.5,0.6,,,,normalized\n"
                                   "img/a.jpg,bird,1,2,3,4,validation,100,50,\n")
    out = run_parser(ReadBoxes(str(tmp_path / "boxes.csv"), "csv", str(tmp_path)))
    images = _by_relpath(out[IMAGES])
    assert sorted(images) == ["img/b.jpg", "img/c.jpg", "img/n.jpg"]
    assert images["img/b.jpg"].objects == () and images["img/b.jpg"].split == "test"
    assert sorted(p.reason for p in images["img/c.jpg"].problems) == ["bad_annotation", "box_outside_image"]
    n = images["img/n.jpg"]
    assert (n.normalised, n.objects[0].box) == (True, Box(0.1, 0.2, 0.5, 0.6))
    # a.jpg's rows give two splits: the image and its 4 boxes are rejected
    assert _reasons(out[REJECTED]) == [("conflicting_rows", "img/a.jpg"), ("missing_image", "img/gone.jpg")]
    assert _reasons(out[PROBLEMS]) == [("ambiguous_box_unit", "img/a.jpg"), ("bad_annotation", ""),
                                       *[("conflicting_rows", "img/a.jpg")] * 3, ("missing_image", "img/gone.jpg")]
    _assert_adds_up(out[COUNTS], 9)  # every row but b.jpg's row without a box


def test_boxes_jsonl_exact_pixels(tmp_path):
    write(f"{tmp_path}/a.jpg", IMAGE)
    rows = [{"path": "a.jpg", "label": "cat", "xmin": 1.25, "ymin": 2, "xmax": 30, "ymax": 40.75},
            {"path": "a.jpg", "label": "dog", "xmin": 0, "ymin": 0, "xmax": 5, "ymax": 5}]
    write(f"{tmp_path}/boxes.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    out = run_parser(ReadBoxes(str(tmp_path / "boxes.jsonl"), "jsonl", str(tmp_path)))
    (image,) = out[IMAGES]
    assert [(o.class_name, o.box) for o in image.objects] == [("cat", Box(1.25, 2, 30, 40.75)),
                                                              ("dog", Box(0, 0, 5, 5))]
    assert (image.normalised, image.source_id) == (False, source_id_of("a.jpg"))
    _assert_adds_up(out[COUNTS], 2)


def test_box_row_unit_rule():
    def row(**cells):
        return box_row(1, {"path": "a.jpg", "label": "x", **cells}, "/in")[-1]
    assert row(xmin="0", ymin="0", xmax="1", ymax="1").box == Box(0, 0, 1, 1)  # whole numbers: one pixel
    assert row(xmin="0", ymin="0", xmax="0.5", ymax="1").reason == "ambiguous_box_unit"
    assert row(xmin="0", ymin="0", xmax="0.5", ymax="1", unit="normalized").box == Box(0, 0, 0.5, 1)
    assert row(xmin="0", ymin="0", xmax="0.5", ymax="1", unit="inches").reason == "bad_annotation"
    assert row(xmin="", ymin="", xmax="", ymax="") is None
