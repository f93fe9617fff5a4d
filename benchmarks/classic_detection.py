"""A one-process COCO -> TFRecord converter of the classic kind, the detection benchmark's peer (issue 49).

    python -m benchmarks.classic_detection --input_dir=coco_export --output_dir=/tmp/classic
    python -m benchmarks.classic_detection --input_dir=coco_export --output_dir=/tmp/classic --instance_masks

Written the way the TF Object Detection API's `create_coco_tf_record.py` and the tutorials' `generate_tfrecord.py`
do it, plainly and without shortcuts that would change the work: for every `annotations/instances_<split>.json`
of a classic COCO export, the JSON is loaded whole with `json.load` and its annotations grouped by image id; then,
one image after the other in one process, the file is read, opened with Pillow, resized to `--image_size`
(stretched, bilinear) and encoded again as JPEG at `--jpeg_quality` (4:2:0), the converter's defaults, so the work
compared is the same; each `tf.train.Example` gets the Object Detection API's keys (boxes normalised, which a
stretch leaves as they are; class ids from 1 in the order of the category ids; with `--instance_masks`, each
object's polygons scaled to the output size, filled by pycocotools and stored as a 0/1 PNG), and is written to
`--num_shards` TFRecord files per split, round-robin, with `tf.io.TFRecordWriter`, as the API's
`open_sharded_output_tfrecords` does. Like those scripts it ignores EXIF orientation and has no dead-letter output:
an image that does not open stops the run.

It prints one JSON line: the images and objects written, the shards, and its seconds after its imports.
This file is a benchmark's peer, not part of the converter: nothing in pipeline/ or transforms/ imports it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import hashlib
import io
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf
from PIL import Image
from pycocotools import mask as mask_utils


def _bytes(values):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))


def _floats(values):
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def _ints(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def instance_mask(segmentation: list, width: int, height: int, scale_x: float, scale_y: float) -> bytes:
    """A COCO polygon list, scaled to the output size and filled there, as a single-channel 0/1 PNG."""
    polygons = [[value * (scale_x if i % 2 == 0 else scale_y) for i, value in enumerate(polygon)]
                for polygon in segmentation]
    binary = mask_utils.decode(mask_utils.frPyObjects(polygons, height, width))
    out = io.BytesIO()
    Image.fromarray(np.amax(binary, axis=2)).save(out, format="PNG")
    return out.getvalue()


def create_tf_example(image: dict, annotations: list, image_dir: str, class_ids: dict, class_names: dict,
                      size: tuple[int, int], quality: int, instance_masks: bool) -> tf.train.Example:
    """One image's record: its pixels resized and encoded again, its boxes, classes and (optionally) masks."""
    path = os.path.join(image_dir, image["file_name"])
    with open(path, "rb") as f:
        data = f.read()
    key = hashlib.sha256(data).hexdigest()
    with Image.open(io.BytesIO(data)) as source:
        picture = source.convert("RGB")
    width, height = picture.size
    resized = picture.resize(size, Image.Resampling.BILINEAR)
    encoded = io.BytesIO()
    resized.save(encoded, format="JPEG", quality=quality)
    out_width, out_height = size
    scale_x, scale_y = out_width / width, out_height / height
    xmin, ymin, xmax, ymax, labels, texts, crowd, areas, masks = [], [], [], [], [], [], [], [], []
    for annotation in annotations:
        x, y, w, h = annotation["bbox"]
        if w <= 0 or h <= 0 or x + w > width or y + h > height:
            continue
        xmin.append(x / width)
        ymin.append(y / height)
        xmax.append((x + w) / width)
        ymax.append((y + h) / height)
        labels.append(class_ids[annotation["category_id"]])
        texts.append(class_names[annotation["category_id"]].encode("utf8"))
        crowd.append(annotation.get("iscrowd", 0))
        areas.append(annotation["area"] * scale_x * scale_y)
        if instance_masks:
            masks.append(instance_mask(annotation["segmentation"], out_width, out_height, scale_x, scale_y))
    feature = {
        "image/height": _ints([out_height]),
        "image/width": _ints([out_width]),
        "image/filename": _bytes([image["file_name"].encode("utf8")]),
        "image/source_id": _bytes([str(image["id"]).encode("utf8")]),
        "image/key/sha256": _bytes([key.encode("utf8")]),
        "image/encoded": _bytes([encoded.getvalue()]),
        "image/format": _bytes([b"jpeg"]),
        "image/object/bbox/xmin": _floats(xmin),
        "image/object/bbox/xmax": _floats(xmax),
        "image/object/bbox/ymin": _floats(ymin),
        "image/object/bbox/ymax": _floats(ymax),
        "image/object/class/text": _bytes(texts),
        "image/object/class/label": _ints(labels),
        "image/object/is_crowd": _ints(crowd),
        "image/object/area": _floats(areas),
    }
    if instance_masks:
        feature["image/object/mask"] = _bytes(masks)
    return tf.train.Example(features=tf.train.Features(feature=feature))


def convert_split(annotations_file: str, image_dir: str, output_prefix: str, num_shards: int,
                  size: tuple[int, int], quality: int, instance_masks: bool) -> tuple[int, int]:
    """One instances JSON to `num_shards` TFRecord files; (images, objects) written."""
    with open(annotations_file) as f:
        groundtruth = json.load(f)
    categories = sorted(groundtruth["categories"], key=lambda category: category["id"])
    class_ids = {category["id"]: number for number, category in enumerate(categories, start=1)}
    class_names = {category["id"]: category["name"] for category in categories}
    by_image = collections.defaultdict(list)
    for annotation in groundtruth["annotations"]:
        by_image[annotation["image_id"]].append(annotation)
    images = objects = 0
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(tf.io.TFRecordWriter(f"{output_prefix}-{shard:05d}-of-{num_shards:05d}"))
                   for shard in range(num_shards)]
        for index, image in enumerate(groundtruth["images"]):
            example = create_tf_example(image, by_image[image["id"]], image_dir, class_ids, class_names, size,
                                        quality, instance_masks)
            writers[index % num_shards].write(example.SerializeToString())
            images += 1
            objects += len(example.features.feature["image/object/class/label"].int64_list.value)
    return images, objects


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.classic_detection", description=__doc__.splitlines()[0])
    parser.add_argument("--input_dir", required=True,
                        help="A classic COCO export: annotations/instances_<split>.json, the images in <split>/.")
    parser.add_argument("--output_dir", required=True, help="Where <split>.record-NNNNN-of-NNNNN files go.")
    parser.add_argument("--num_shards", type=int, default=4, help="TFRecord files per split. Default: 4.")
    parser.add_argument("--image_size", type=int, default=512, help="Output side, stretched. Default: 512.")
    parser.add_argument("--jpeg_quality", type=int, default=95, help="Default: 95.")
    parser.add_argument("--instance_masks", action="store_true", help="A PNG mask per object from its polygons.")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    os.makedirs(args.output_dir, exist_ok=True)
    images = objects = shards = 0
    for annotations_file in sorted(glob.glob(os.path.join(args.input_dir, "annotations", "instances_*.json"))):
        split = os.path.basename(annotations_file)[len("instances_"):-len(".json")]
        written = convert_split(annotations_file, os.path.join(args.input_dir, split),
                                os.path.join(args.output_dir, f"{split}.record"), args.num_shards,
                                (args.image_size, args.image_size), args.jpeg_quality, args.instance_masks)
        images, objects, shards = images + written[0], objects + written[1], shards + args.num_shards
    print(json.dumps({"images": images, "objects": objects, "shards": shards,
                      "seconds_after_imports": time.perf_counter() - start}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
