"""Small detection datasets of real images in each input format (COCO as Roboflow exports it, Pascal VOC, YOLO, a
CSV of boxes), made from one list of images and boxes, and a detection dataset's records read back without
TensorFlow."""

from __future__ import annotations

import csv
import io
import json
import os

import numpy as np
from PIL import Image, ImageDraw

from tests.detection_datasets import voc_xml, write
from transforms.base.examples import Example
from transforms.base.tfrecord import iter_records

SIZE = (64, 48)  # every image's width and height
CLASSES = ("cat", "dog")
# (split, file stem, [(class, (xmin, ymin, xmax, ymax) in pixels)]): 0-based continuous corners
IMAGES = (
    ("train", "a", [("cat", (4.0, 6.0, 30.0, 40.0)), ("dog", (32.0, 2.0, 60.0, 22.0))]),
    ("train", "b", [("dog", (10.0, 10.0, 50.0, 46.0))]),
    ("train", "c", []),  # an image without objects
    ("train", "d", [("cat", (0.0, 0.0, 64.0, 48.0)), ("cat", (20.0, 20.0, 28.0, 30.0)),
                    ("dog", (40.0, 30.0, 62.0, 47.0))]),
    ("validation", "v", [("cat", (8.0, 8.0, 24.0, 40.0))]),
    ("validation", "w", [("dog", (2.0, 4.0, 62.0, 44.0))]),
)
FOLDERS = {"train": "train", "validation": "valid"}  # Roboflow's and YOLO's split folder names


def boxes_of(images=IMAGES) -> dict[str, list[tuple[str, tuple]]]:
    """{file stem: [(class, box)]} of every image."""
    return {stem: objects for _, stem, objects in images}


def _picture(path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, (SIZE[1], SIZE[0], 3), dtype=np.uint8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(pixels).save(path, quality=90)


def coco_export(root, images=IMAGES, extra: dict | None = None) -> dict:
    """Roboflow's COCO layout: <split folder>/_annotations.coco.json beside its images; categories 0 (Roboflow's
    supercategory, no annotations), 1 cat, 2 dog. `extra`: {split: [annotation dicts]} added to a split's file
    (broken ones). Returns {split: the JSON written}."""
    categories = [{"id": 0, "name": "animals", "supercategory": "none"},
                  *({"id": i, "name": name, "supercategory": "animals"} for i, name in enumerate(CLASSES, 1))]
    written, number = {}, 0
    for split, folder in FOLDERS.items():
        data = {"categories": categories, "images": [], "annotations": []}
        for image_id, (image_split, stem, objects) in enumerate(images, 1):
            if image_split != split:
                continue
            _picture(f"{root}/{folder}/{stem}.jpg", image_id)
            data["images"].append({"id": image_id, "file_name": f"{stem}.jpg", "width": SIZE[0], "height": SIZE[1]})
            for name, (x0, y0, x1, y1) in objects:
                number += 1
                data["annotations"].append({"id": number, "image_id": image_id, "category_id": CLASSES.index(name) + 1,
                                            "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0),
                                            "iscrowd": 0, "segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]]})
        data["annotations"] += (extra or {}).get(split, [])
        write(f"{root}/{folder}/_annotations.coco.json", json.dumps(data))
        written[split] = data
    return written


def instance_indices(objects) -> np.ndarray:
    """VOC's SegmentationObject pixels of an image's objects: index k (from 1) an ellipse in the k-th object's box
    with VOC's void border (255) around it, later objects over earlier ones; 0 the background."""
    picture = Image.new("L", SIZE, 0)
    draw = ImageDraw.Draw(picture)
    for index, (_, (x0, y0, x1, y1)) in enumerate(objects, 1):
        draw.ellipse((x0, y0, x1 - 1, y1 - 1), fill=index, outline=255)
    return np.asarray(picture)


def index_png(indices: np.ndarray) -> bytes:
    """A palette PNG of `indices`, coloured as VOC's are (so that its colours are not its indices)."""
    picture = Image.fromarray(indices, "P")
    picture.putpalette([channel for k in range(256) for channel in ((k * 53) % 256, (k * 101) % 256, 128)])
    out = io.BytesIO()
    picture.save(out, "PNG")
    return out.getvalue()


def voc_export(root, images=IMAGES, instance_masks: bool = False) -> None:
    """Pascal VOC: Annotations/<stem>.xml (1-based inclusive corners), JPEGImages/<stem>.jpg, ImageSets/Main's
    train.txt and val.txt; with `instance_masks`, SegmentationObject/<stem>.png (`instance_indices`) of each image
    with objects."""
    lists = {"train": [], "validation": []}
    for number, (split, stem, objects) in enumerate(images, 1):
        _picture(f"{root}/JPEGImages/{stem}.jpg", number)
        corners = [(name, (int(x0) + 1, int(y0) + 1, int(x1), int(y1)), 0, 0) for name, (x0, y0, x1, y1) in objects]
        write(f"{root}/Annotations/{stem}.xml", voc_xml(f"{stem}.jpg", corners, SIZE))
        if instance_masks and objects:
            write(f"{root}/SegmentationObject/{stem}.png", index_png(instance_indices(objects)))
        lists[split].append(stem)
    write(f"{root}/ImageSets/Main/train.txt", "".join(f"{stem}\n" for stem in lists["train"]))
    write(f"{root}/ImageSets/Main/val.txt", "".join(f"{stem}\n" for stem in lists["validation"]))


def yolo_export(root, images=IMAGES) -> None:
    """A YOLOv8 export: data.yaml, <split>/images/<stem>.jpg and <split>/labels/<stem>.txt (normalised centres)."""
    write(f"{root}/data.yaml", "train: train/images\nval: valid/images\n"
                               f"nc: {len(CLASSES)}\nnames: {list(CLASSES)}\n")
    width, height = SIZE
    for number, (split, stem, objects) in enumerate(images, 1):
        folder = FOLDERS[split]
        _picture(f"{root}/{folder}/images/{stem}.jpg", number)
        lines = [f"{CLASSES.index(name)} {(x0 + x1) / 2 / width:.6f} {(y0 + y1) / 2 / height:.6f} "
                 f"{(x1 - x0) / width:.6f} {(y1 - y0) / height:.6f}\n" for name, (x0, y0, x1, y1) in objects]
        if lines:  # an image without objects has no label file, as YOLO's tools leave it
            write(f"{root}/{folder}/labels/{stem}.txt", "".join(lines))


def boxes_csv(root, images=IMAGES) -> str:
    """A CSV of boxes, one row per box (an image without objects: one row without coordinates); returns its path."""
    rows = []
    for number, (split, stem, objects) in enumerate(images, 1):
        _picture(f"{root}/images/{stem}.jpg", number)
        for name, (x0, y0, x1, y1) in objects or [("", ("", "", "", ""))]:
            rows.append({"path": f"images/{stem}.jpg", "label": name, "xmin": x0, "ymin": y0, "xmax": x1, "ymax": y1,
                         "split": split})
    path = f"{root}/boxes.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["path", "label", "xmin", "ymin", "xmax", "ymax", "split"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def export_of(kind: str, root) -> tuple[list[str], str]:
    """(the command's input options, its input folder) of a generated export of `kind`: coco, voc, yolo or boxes."""
    if kind == "coco":
        coco_export(root)
    elif kind == "voc":
        voc_export(root)
    elif kind == "yolo":
        yolo_export(root)
    else:
        return [f"--manifest={boxes_csv(root)}"], str(root)
    return [f"--input_dir={root}"], str(root)


def _values(feature, key: str, kind: str) -> list:
    if key not in feature:
        return []
    values = list(getattr(feature[key], f"{kind}_list").value)
    return [v.decode("utf-8") for v in values] if kind == "bytes" and key != "image/encoded" and \
        not key.endswith("mask") and not key.endswith("class/encoded") else values


def read_detection_records(dataset_dir) -> dict[str, list[dict]]:
    """Every record of every split: its keys' values ({key: [values]}), parsed without TensorFlow."""
    info = json.loads((dataset_dir / "image_tfrecords.json").read_text())
    out = {}
    for split, split_info in info["splits"].items():
        rows = []
        for shard in split_info["shards"]:
            for raw in iter_records(str(dataset_dir / shard["file"])):
                feature = Example.FromString(raw).features.feature
                kinds = {key: feature[key].WhichOneof("kind") for key in feature}
                rows.append({key: _values(feature, key, kind.split("_")[0]) for key, kind in kinds.items() if kind})
        out[split] = rows
    return out


def record_boxes(record: dict) -> list[tuple[str, tuple]]:
    """A record's (class text, (xmin, ymin, xmax, ymax) in pixels of the stored image), in its order."""
    width, height = record["image/width"][0], record["image/height"][0]
    return [(name, (x0 * width, y0 * height, x1 * width, y1 * height)) for name, x0, y0, x1, y1 in zip(
        record.get("image/object/class/text", []), record.get("image/object/bbox/xmin", []),
        record.get("image/object/bbox/ymin", []), record.get("image/object/bbox/xmax", []),
        record.get("image/object/bbox/ymax", []), strict=True)]
