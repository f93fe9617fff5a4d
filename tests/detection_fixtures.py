"""Detection datasets for the read side's tests, written as the converter writes them (docs/detection.md, the
contract of image_tfrecords.json's "detection" section): real JPEGs (Pillow) of coloured rectangles whose boxes are
known, each record built by transforms.detection.records.build_detection_example, framed by
transforms.base.tfrecord.frame_record, the description made by transforms.output.describe (summarise, dataset_info)
with the detection keys added; labels.txt, label_map.pbtxt and TFDS's files beside the shards.

`export(root)` also writes the same images as a COCO export (train/, valid/ with _annotations.coco.json), so that
the tests switch to real conversions by changing `build` in one line:

    build = write_dataset         # now
    build = convert_dataset       # when the converter's --task=detection is merged
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from typing import NamedTuple

import numpy as np
from PIL import Image

from transforms.base.dataset_format import (
    DETECTION,
    ERRORS_FILE,
    INFO_FILE,
    LABEL_MAP_FILE,
    LABELS_FILE,
    TFDS_INFO_FILE,
    shard_name,
)
from transforms.base.examples import detection_feature_description
from transforms.base.tfrecord import frame_record
from transforms.detection.geometry import PlacedAnnotations, PlacedObject
from transforms.detection.objects import Box
from transforms.detection.records import build_detection_example, label_map_text
from transforms.images.imaging import EncodedImage

CLASSES = ("cat", "dog", "bird")
# each class's rectangle on grey: muted, unlike the saturated colours preview draws boxes in
COLOURS = {"cat": (170, 120, 90), "dog": (90, 150, 110), "bird": (100, 110, 160)}
WIDTH, HEIGHT = 96, 64


class Picture(NamedTuple):
    """One image of the test dataset: its split, file name and objects (class, (xmin, ymin, xmax, ymax) pixels)."""

    split: str
    name: str
    objects: tuple[tuple[str, tuple[int, int, int, int]], ...]
    crowd: tuple[int, ...] = ()  # indices of objects marked is_crowd


PICTURES = (
    Picture("train", "a.jpg", (("cat", (8, 4, 40, 30)), ("dog", (50, 20, 90, 60)))),
    Picture("train", "b.jpg", (("bird", (0, 0, 24, 16)),)),
    Picture("train", "c.jpg", (("dog", (10, 10, 30, 50)), ("dog", (40, 5, 70, 25)), ("cat", (72, 30, 96, 64))),
            crowd=(1,)),
    Picture("train", "d.jpg", ()),  # an image without objects, kept
    Picture("train", "e.jpg", (("cat", (30, 12, 66, 52)),)),
    Picture("validation", "v1.jpg", (("bird", (20, 20, 60, 44)),)),
    Picture("validation", "v2.jpg", (("cat", (4, 4, 28, 28)), ("bird", (60, 30, 92, 60)))),
)
# One annotation the "conversion" rejected (a box left of a.jpg), so that found = written + rejected is not trivial.
REJECTED = {"box_outside_image": 1}


def jpeg(picture: Picture) -> bytes:
    """The picture: grey, each object a rectangle of its class's colour (drawn in order, later ones on top)."""
    pixels = np.full((HEIGHT, WIDTH, 3), 128, np.uint8)
    for class_name, (x0, y0, x1, y1) in picture.objects:
        pixels[y0:y1, x0:x1] = COLOURS[class_name]
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=95)
    return out.getvalue()


def normalised(box: tuple[int, int, int, int]) -> Box:
    x0, y0, x1, y1 = box
    return Box(x0 / WIDTH, y0 / HEIGHT, x1 / WIDTH, y1 / HEIGHT)


def _mask(box: tuple[int, int, int, int]) -> np.ndarray:
    x0, y0, x1, y1 = box
    mask = np.zeros((HEIGHT, WIDTH), np.uint8)
    mask[y0:y1, x0:x1] = 1
    return mask


def _semantic(picture: Picture, first_id: int) -> np.ndarray:
    values = np.zeros((HEIGHT, WIDTH), np.uint8)
    for class_name, (x0, y0, x1, y1) in picture.objects:
        values[y0:y1, x0:x1] = CLASSES.index(class_name) + first_id
    return values


def record(picture: Picture, number: int, first_id: int = 1, instance_masks: bool = False,
           semantic_masks: bool = False) -> bytes:
    """The serialized detection Example of `picture` (stored as it is: no resize)."""
    data = jpeg(picture)
    encoded = EncodedImage(data, WIDTH, HEIGHT, "jpeg", False, sha256=hashlib.sha256(data).hexdigest())
    objects = tuple(
        PlacedObject(class_name, normalised(box), float((box[2] - box[0]) * (box[3] - box[1])),
                     is_crowd=i in picture.crowd, mask=_mask(box) if instance_masks else None)
        for i, (class_name, box) in enumerate(picture.objects))
    placed = PlacedAnnotations(objects, (), "stored", _semantic(picture, first_id) if semantic_masks else None)
    return build_detection_example(encoded, placed, {name: i for i, name in enumerate(CLASSES)},
                                   source_id=str(number), filename=f"{picture.split}/{picture.name}",
                                   first_id=first_id, with_masks=instance_masks)


def export(root) -> str:
    """The pictures as a COCO export (train/ and valid/, each with _annotations.coco.json): the input a real
    conversion of the same dataset reads."""
    categories = [{"id": i + 1, "name": name} for i, name in enumerate(CLASSES)]
    for split, folder in (("train", "train"), ("validation", "valid")):
        images, annotations = [], []
        for number, picture in enumerate(PICTURES):
            if picture.split != split:
                continue
            os.makedirs(f"{root}/{folder}", exist_ok=True)
            with open(f"{root}/{folder}/{picture.name}", "wb") as f:
                f.write(jpeg(picture))
            images.append({"id": number, "file_name": picture.name, "width": WIDTH, "height": HEIGHT})
            for i, (class_name, (x0, y0, x1, y1)) in enumerate(picture.objects):
                annotations.append({"id": len(annotations) + 1, "image_id": number,
                                    "category_id": CLASSES.index(class_name) + 1, "bbox": [x0, y0, x1 - x0, y1 - y0],
                                    "area": (x1 - x0) * (y1 - y0), "iscrowd": int(i in picture.crowd),
                                    "segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]]})
        with open(f"{root}/{folder}/_annotations.coco.json", "w") as f:
            json.dump({"images": images, "annotations": annotations, "categories": categories}, f)
    return str(root)


def write_dataset(export_dir, out, *, first_id: int = 1, train_shards: int = 2, instance_masks: bool = False,
                  semantic_masks: bool = False) -> str:
    """The dataset folder a conversion of `export_dir` (see `export`) writes, without resizing: shards, labels.txt,
    label_map.pbtxt, errors.jsonl and image_tfrecords.json (with the "detection" section). Returns `out`."""
    from transforms.output import describe, tfds_metadata

    del export_dir  # the pictures are known here; a real conversion reads them from the export
    os.makedirs(out, exist_ok=True)
    shards = {"train": train_shards, "validation": 1}
    contents: dict[tuple[str, int], list[bytes]] = {}
    per_split: dict[str, int] = {}
    for number, picture in enumerate(PICTURES):
        index = per_split.get(picture.split, 0)
        per_split[picture.split] = index + 1
        contents.setdefault((picture.split, index % shards[picture.split]), []).append(
            record(picture, number, first_id, instance_masks, semantic_masks))
    shard_stats = []
    for split, count in shards.items():
        for index in range(count):
            name = shard_name(split, index, count, "none")
            data = b"".join(frame_record(r) for r in contents.get((split, index), []))
            with open(os.path.join(out, name), "wb") as f:
                f.write(data)
            shard_stats.append((split, name, len(contents.get((split, index), [])), len(data), "", ""))
    tallies = [(("found",), len(PICTURES))] + [(("written", p.split, None, False), 1) for p in PICTURES]
    counts = describe.summarise(tallies, shard_stats, list(CLASSES))
    for split, split_info in counts.splits.items():  # objects per class: a detection record has many classes
        objects = [c for p in PICTURES if p.split == split for c, _ in p.objects]
        split_info["class_counts"] = {name: objects.count(name) for name in CLASSES if name in objects}
    options = {"compression": "none", "file_format": "tfrecord", "task": DETECTION, "first_class_id": first_id}
    image_info = {"height": HEIGHT, "width": WIDTH, "fixed_size": True, "format": "jpeg"}
    tfds_files, tfds_note = tfds_metadata.tfds_files(counts.splits, DETECTION, image_info, list(CLASSES), "none")
    info = describe.dataset_info(counts, "test-run", list(CLASSES), DETECTION, options, image_info, 0.0, "test",
                                 tfds={"files": list(tfds_files), "note": tfds_note})
    written = sum(len(p.objects) for p in PICTURES)
    info.update({
        "task": DETECTION,
        "features": detection_feature_description(instance_masks, semantic_masks),
        "detection": {
            "first_id": first_id, "instance_masks": instance_masks, "semantic_masks": semantic_masks,
            "input_format": "coco",
            "annotations": {"found": written + sum(REJECTED.values()), "written": written, "rejected": REJECTED},
            "images_without_objects": {"kept": sum(not p.objects for p in PICTURES), "dropped": 0},
            "objects_per_image_max": max(len(p.objects) for p in PICTURES),
        },
    })
    errors = [{"relpath": "train/a.jpg", "stage": "annotation", "reason": reason,
               "detail": "train/_annotations.coco.json: annotation id 99: the box is left of the image"}
              for reason, n in REJECTED.items() for _ in range(n)]
    files = {ERRORS_FILE: "".join(json.dumps(e) + "\n" for e in errors),
             LABELS_FILE: "".join(f"{name}\n" for name in CLASSES),
             LABEL_MAP_FILE: label_map_text(CLASSES, first_id),
             **tfds_files,  # TFDS's: objects-label.labels.txt, features.json, dataset_info.json
             INFO_FILE: json.dumps(info, indent=2)}
    for name, text in files.items():  # the description last, as the converter publishes it
        with open(os.path.join(out, name), "w") as f:
            f.write(text)
    return str(out)


def convert_dataset(export_dir, out, *, first_id: int = 1, train_shards: int = 2, instance_masks: bool = False,
                    semantic_masks: bool = False) -> str:
    """`export_dir` converted by the tool itself (--task=detection, at the pictures' own size), for `build`."""
    from tests.conftest import convert

    del train_shards  # the converter sizes the shards itself
    if semantic_masks:
        import pytest

        pytest.skip("a COCO export has no semantic masks")
    args = ["--task=detection", f"--image_size={WIDTH}x{HEIGHT}", f"--first_class_id={first_id}"]
    assert convert(export_dir, out, *args, *(["--instance_masks"] if instance_masks else [])) == 0
    return str(out)


def objects_of(split: str) -> list[tuple[str, list[tuple[float, float, float, float]], list[int]]]:
    """(filename, boxes [ymin, xmin, ymax, xmax] as float32 of the normalised pixels, 0-based classes) of each
    picture of `split`, in the order written."""
    out = []
    for picture in PICTURES:
        if picture.split == split:
            boxes = [tuple(np.float32(v) for v in (b.ymin, b.xmin, b.ymax, b.xmax))
                     for b in (normalised(box) for _, box in picture.objects)]
            out.append((f"{split}/{picture.name}", boxes, [CLASSES.index(c) for c, _ in picture.objects]))
    return out


def rewrite_info(out, change) -> None:
    """Apply `change(info)` to the dataset's image_tfrecords.json (a test's damage)."""
    path = os.path.join(out, INFO_FILE)
    with open(path) as f:
        info = json.load(f)
    change(info)
    with open(path, "w") as f:
        json.dump(info, f, indent=2)


def rewrite_record(out, shard: str, index: int, change) -> None:
    """Replace record `index` of `shard` by `change(example)` (a tf.train.Example message, changed in place), with
    valid framing, and update the shard's bytes in image_tfrecords.json (and TFDS's dataset_info.json, when the
    folder has one): only the record's content is damaged."""
    from transforms.base.examples import Example
    from transforms.base.tfrecord import iter_records

    path = os.path.join(out, shard)
    records = list(iter_records(path))
    example = Example.FromString(records[index])
    change(example)
    records[index] = example.SerializeToString(deterministic=True)
    data = b"".join(frame_record(r) for r in records)
    with open(path, "wb") as f:
        f.write(data)

    def sizes(info):
        for split_info in info["splits"].values():
            for entry in split_info["shards"]:
                if entry["file"] == shard:
                    split_info["bytes"] += len(data) - entry["bytes"]
                    entry["bytes"] = len(data)

    rewrite_info(out, sizes)
    tfds_info = os.path.join(out, TFDS_INFO_FILE)
    if os.path.exists(tfds_info):  # TFDS's copy of the split sizes
        with open(os.path.join(out, INFO_FILE)) as f:
            split_bytes = {name: split_info["bytes"] for name, split_info in json.load(f)["splits"].items()}
        with open(tfds_info) as f:
            described = json.load(f)
        for entry in described["splits"]:
            entry["numBytes"] = str(split_bytes[entry["name"]])
        with open(tfds_info, "w") as f:
            json.dump(described, f, indent=2)
