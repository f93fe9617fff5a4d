"""The detection record of one image: a tf.train.Example with the keys the TF Object Detection API, TF Model Garden's
TfExampleDecoder and TFDS read; and the OD API's label map (label_map.pbtxt).

No Beam and no TensorFlow here (the Example message is transforms.base.examples'): `build_detection_example` takes the
converted image (transforms.images.imaging.EncodedImage) and its annotations placed in the output frame
(transforms.detection.geometry.place_annotations). Every box is normalised to the stored (output) image; class ids
count from 1 by default (the OD API keeps 0 for the background), from 0 with `first_id=0`.

    image/encoded, image/format ('jpeg' or 'png'), image/height, image/width          bytes, bytes, int64, int64
    image/filename, image/source_id (a number as text), image/key/sha256              bytes
    image/object/bbox/xmin, ymin, xmax, ymax (in [0, 1]), image/object/area           float lists
    image/object/class/label, image/object/is_crowd, image/object/difficult           int64 lists
    image/object/class/text                                                          bytes list (UTF-8)
    objects/bbox (4 per object: ymin, xmin, ymax, xmax, the same numbers), objects/label (0-based),
    objects/is_crowd, objects/is_difficult: TFDS's keys for the same objects (tfds_metadata's features.json)
    image/object/mask (with instance masks): one PNG per object, single channel 0/1, at the stored size
    image/segmentation/class/encoded, image/segmentation/class/format (a semantic mask): a PNG of class ids
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import numpy as np
from google.protobuf import text_encoding
from PIL import Image

from transforms.base.examples import Example
from transforms.detection.geometry import PlacedAnnotations
from transforms.images.imaging import EncodedImage

FIRST_IDS = (0, 1)

# The keys, with their tf.train.Feature kinds ('bytes', 'float', 'int64'): a list for every object key.
IMAGE_KEYS = {
    "image/encoded": "bytes", "image/format": "bytes", "image/height": "int64", "image/width": "int64",
    "image/filename": "bytes", "image/source_id": "bytes", "image/key/sha256": "bytes",
}
OBJECT_KEYS = {
    "image/object/bbox/xmin": "float", "image/object/bbox/ymin": "float", "image/object/bbox/xmax": "float",
    "image/object/bbox/ymax": "float", "image/object/class/label": "int64", "image/object/class/text": "bytes",
    "image/object/area": "float", "image/object/is_crowd": "int64", "image/object/difficult": "int64",
}
# TFDS's (dataset_format.DETECTION_TFDS_OBJECTS): the boxes again as one list, labels from 0, the flags again.
TFDS_OBJECT_KEYS = {"objects/bbox": "float", "objects/label": "int64", "objects/is_crowd": "int64",
                    "objects/is_difficult": "int64"}
MASK_KEY = "image/object/mask"
SEMANTIC_KEY, SEMANTIC_FORMAT_KEY = "image/segmentation/class/encoded", "image/segmentation/class/format"


def png_bytes(values: np.ndarray) -> bytes:
    """A single-channel 8-bit PNG of `values` (a 0/1 mask, or class ids): the values themselves, no palette."""
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(values, dtype=np.uint8), "L").save(out, "PNG")
    return out.getvalue()


def class_ids(names: Sequence[str], class_index: Mapping[str, int], first_id: int = 1) -> list[int]:
    """The record's ids of these class names: their 0-based place in the label map plus `first_id` (0 or 1).

    Raises:
        ValueError: a `first_id` other than 0 or 1, or a name the label map does not hold (the parsers reject
            unknown classes before: this is a bug).
    """
    if first_id not in FIRST_IDS:
        raise ValueError(f"first_id {first_id}: expected 0 or 1")
    missing = sorted({name for name in names if name not in class_index})
    if missing:
        raise ValueError(f"classes not in the label map: {missing}")
    return [class_index[name] + first_id for name in names]


def build_detection_example(encoded: EncodedImage, placed: PlacedAnnotations, class_index: Mapping[str, int], *,
                            source_id: str, filename: str, first_id: int = 1, with_masks: bool = False) -> bytes:
    """The serialized detection Example of one converted image (the keys: the module's docstring).

    `class_index`: each class name's 0-based place in the label map; `source_id`: a number as text, stable across
    runs (COCO's image id); `filename`: the image's path relative to --input_dir; `image/key/sha256` is the source
    file's SHA-256 (`encoded.sha256`). `image/object/mask` is written when the objects have masks (one per object,
    transforms.detection.geometry), or always (empty for an image without objects) with `with_masks`.

    Raises:
        ValueError: a source_id that is not a number, an encoded image without its sha256, an unknown class, or
            masks that do not match the image's size (all bugs of the caller).
    """
    if not source_id.isdigit():
        raise ValueError(f"source_id {source_id!r}: expected a number as text")
    if not encoded.sha256:
        raise ValueError("the encoded image has no sha256 (transforms.images.convert.read_and_convert sets it)")
    objects = placed.objects
    labels = class_ids([o.class_name for o in objects], class_index, first_id)
    example = Example()
    features = example.features.feature
    for key, value in (("image/encoded", encoded.data), ("image/format", encoded.format.encode()),
                       ("image/filename", filename.encode("utf-8")), ("image/source_id", source_id.encode()),
                       ("image/key/sha256", encoded.sha256.encode())):
        features[key].bytes_list.value.append(value)
    features["image/height"].int64_list.value.append(encoded.height)
    features["image/width"].int64_list.value.append(encoded.width)
    for key, values in (("image/object/bbox/xmin", [o.box.xmin for o in objects]),
                        ("image/object/bbox/ymin", [o.box.ymin for o in objects]),
                        ("image/object/bbox/xmax", [o.box.xmax for o in objects]),
                        ("image/object/bbox/ymax", [o.box.ymax for o in objects]),
                        ("image/object/area", [o.area for o in objects])):
        features[key].float_list.value.extend(values)
    is_crowd, difficult = [int(o.is_crowd) for o in objects], [int(o.difficult) for o in objects]
    for key, values in (("image/object/class/label", labels), ("image/object/is_crowd", is_crowd),
                        ("image/object/difficult", difficult)):
        features[key].int64_list.value.extend(values)
    features["image/object/class/text"].bytes_list.value.extend(o.class_name.encode("utf-8") for o in objects)
    # TFDS's keys: the same boxes as one list of 4 per object (its BBoxFeature), the classes from 0 (its ClassLabel)
    features["objects/bbox"].float_list.value.extend(
        value for o in objects for value in (o.box.ymin, o.box.xmin, o.box.ymax, o.box.xmax))
    for key, values in (("objects/label", [label - first_id for label in labels]), ("objects/is_crowd", is_crowd),
                        ("objects/is_difficult", difficult)):
        features[key].int64_list.value.extend(values)
    masks = [o.mask for o in objects if o.mask is not None]
    if masks or with_masks:
        if len(masks) != len(objects):
            raise ValueError(f"{len(masks)} masks for {len(objects)} objects: every object needs one")
        size = (encoded.height, encoded.width)
        if any(m.shape != size for m in masks):
            raise ValueError(f"a mask is not of the image's size {size}")
        features[MASK_KEY].bytes_list.value.extend(png_bytes(m) for m in masks)
    if placed.semantic_mask is not None:
        if placed.semantic_mask.shape != (encoded.height, encoded.width):
            raise ValueError("the semantic mask is not of the image's size")
        features[SEMANTIC_KEY].bytes_list.value.append(png_bytes(placed.semantic_mask))
        features[SEMANTIC_FORMAT_KEY].bytes_list.value.append(b"png")
    # Map entries in key order: the same image gives the same bytes in any process.
    return example.SerializeToString(deterministic=True)


def label_map_text(class_names: Sequence[str], first_id: int = 1) -> str:
    """label_map.pbtxt in the OD API's text format, one `item { id: 1 name: 'cat' }` per class, in label map
    order from `first_id`. The OD API's label_map_util refuses id 0 for any class but 'background': with
    `first_id=0` the file is for other readers (and says so in a comment).

    Raises:
        ValueError: a `first_id` other than 0 or 1.
    """
    if first_id not in FIRST_IDS:
        raise ValueError(f"first_id {first_id}: expected 0 or 1")
    lines = ["# Class ids from 0: the TF Object Detection API keeps id 0 for the background and refuses this file."
             ] if first_id == 0 else []
    for number, name in enumerate(class_names, first_id):
        lines += ["item {", f"  id: {number}", f"  name: '{text_encoding.CEscape(name, as_utf8=True)}'", "}"]
    return "\n".join(lines) + "\n"
