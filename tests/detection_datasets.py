"""Small copies of the detection datasets' real layouts (Roboflow's COCO export, Pascal VOC, a YOLOv8 export, a CSV
of boxes), written into a temporary folder, and a runner that collects a parser's four outputs."""

from __future__ import annotations

import json
import os

import apache_beam as beam

from tests.pipelines import TestPipeline
from transforms.detection.parsing import COUNTS, IMAGES, PROBLEMS, REJECTED

_COLLECTED: dict[str, list] = {}  # filled by the pipeline's steps, which run in this process (the FnApiRunner)


def _collect(element, into: str):
    _COLLECTED.setdefault(into, []).append(element)


def run_parser(transform) -> dict[str, list]:
    """{IMAGES, REJECTED, PROBLEMS: their elements; COUNTS: the one tally dict} of a parser's PTransform."""
    with TestPipeline() as p:
        outputs = p | transform
        for tag in (IMAGES, REJECTED, PROBLEMS, COUNTS):
            _ = outputs[tag] | f"Collect[{tag}]" >> beam.Map(_collect, tag)
    result = {tag: _COLLECTED.pop(tag, []) for tag in (IMAGES, REJECTED, PROBLEMS, COUNTS)}
    (result[COUNTS],) = result[COUNTS]
    return result


def write(path, data) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(data, bytes) else "w", encoding=None if isinstance(data, bytes) else "utf-8") \
            as f:
        f.write(data)


IMAGE = b"\xff\xd8 not decoded by the parsers \xff\xd9"


def roboflow_coco(root) -> dict:
    """A Roboflow COCO export: train/, valid/, test/, each with _annotations.coco.json beside its images.
    Categories: Roboflow's supercategory 0 ('animals', no annotations), 1 cat, 2 dog.
    train: a.jpg (two boxes, one a polygon, one an RLE crowd), b.jpg (one box outside its 100 x 50 frame, one of
    an unknown category 9), gone.jpg (listed, not on disk: 1 annotation), extra.jpg (on disk, no entry), and an
    annotation of image id 99 (no such image). valid: v.jpg (one box), v2.jpg (an entry without annotations).
    test: the JSON cut short in its second annotation (truncated), t.jpg on disk."""
    categories = [{"id": 0, "name": "animals", "supercategory": "none"},
                  {"id": 1, "name": "cat", "supercategory": "animals"},
                  {"id": 2, "name": "dog", "supercategory": "animals"}]
    train = {
        "info": {"year": "2026"}, "licenses": [], "categories": categories,
        "images": [{"id": 0, "file_name": "a.jpg", "width": 100, "height": 50},
                   {"id": 1, "file_name": "b.jpg", "width": 100, "height": 50},
                   {"id": 2, "file_name": "gone.jpg", "width": 100, "height": 50}],
        "annotations": [
            {"id": 10, "image_id": 0, "category_id": 1, "bbox": [10, 5, 20.5, 10], "area": 205.0, "iscrowd": 0,
             "segmentation": [[10, 5, 30.5, 5, 30.5, 15]]},
            {"id": 11, "image_id": 0, "category_id": 2, "bbox": [0, 0, 4, 4], "area": 16, "iscrowd": 1,
             "segmentation": {"size": [50, 100], "counts": "abc123"}},
            {"id": 12, "image_id": 1, "category_id": 1, "bbox": [150, 5, 10, 10], "area": 100, "iscrowd": 0},
            {"id": 13, "image_id": 1, "category_id": 9, "bbox": [1, 1, 2, 2], "area": 4, "iscrowd": 0},
            {"id": 14, "image_id": 2, "category_id": 2, "bbox": [1, 1, 2, 2], "area": 4, "iscrowd": 0},
            {"id": 15, "image_id": 99, "category_id": 2, "bbox": [1, 1, 2, 2], "area": 4, "iscrowd": 0},
        ]}
    valid = {"categories": categories,
             "images": [{"id": 5, "file_name": "v.jpg", "width": 64, "height": 64},
                        {"id": 6, "file_name": "v2.jpg", "width": 64, "height": 64}],
             "annotations": [{"id": 1, "image_id": 5, "category_id": 2, "bbox": [1, 2, 3, 4], "area": 12,
                              "iscrowd": 0, "segmentation": []}]}
    test = {"categories": categories, "images": [{"id": 0, "file_name": "t.jpg", "width": 8, "height": 8}],
            "annotations": [{"id": 1, "image_id": 0, "category_id": 1, "bbox": [1, 1, 2, 2]},
                            {"id": 2, "image_id": 0, "category_id": 1, "bbox": [3, 3, 2, 2]}]}
    write(f"{root}/train/_annotations.coco.json", json.dumps(train))
    write(f"{root}/valid/_annotations.coco.json", json.dumps(valid))
    text = json.dumps(test)
    cut = text.index('{"id": 2, "image_id"') + 12  # inside its second annotation
    write(f"{root}/test/_annotations.coco.json", text[:cut])
    for name in ("train/a.jpg", "train/b.jpg", "train/extra.jpg", "valid/v.jpg", "valid/v2.jpg", "test/t.jpg"):
        write(f"{root}/{name}", IMAGE)
    return {"train": train, "valid": valid}


def voc_xml(filename: str, objects, size=(100, 50)) -> str:
    """A VOC annotation: objects as (name, (xmin, ymin, xmax, ymax) 1-based inclusive, difficult, truncated)."""
    parts = [f"<annotation><folder>VOC2012</folder><filename>{filename}</filename>"
             f"<size><width>{size[0]}</width><height>{size[1]}</height><depth>3</depth></size>"]
    for name, (xmin, ymin, xmax, ymax), difficult, truncated in objects:
        parts.append(f"<object><name>{name}</name><pose>Left</pose><truncated>{truncated}</truncated>"
                     f"<difficult>{difficult}</difficult><bndbox><xmin>{xmin}</xmin><ymin>{ymin}</ymin>"
                     f"<xmax>{xmax}</xmax><ymax>{ymax}</ymax></bndbox></object>")
    return "".join(parts) + "</annotation>"


BILLION_LAUGHS = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
                  + "".join(f'<!ENTITY lol{i} "{("&lol" + str(i - 1) + ";") * 10 if i > 1 else "&lol;" * 10}">'
                            for i in range(1, 10))
                  + "]><annotation><filename>&lol9;</filename></annotation>")


def external_entity(target: str) -> str:
    return (f'<?xml version="1.0"?><!DOCTYPE a [<!ENTITY xxe SYSTEM "file://{target}">]>'
            "<annotation><filename>&xxe;</filename></annotation>")
