"""A detection record on the read side: its feature spec, its parse in TensorFlow ops (boxes, classes, masks), the
training form the reader gives it (ragged, or padded to a fixed number of boxes), and verify's checks of its objects.

Boxes come out as [ymin, xmin, ymax, xmax], normalised to the stored image ("rel_yxyx" in KerasCV's and KerasHub's
words): the order of the TF Object Detection API, TF Model Garden and TensorFlow's own box ops
(tf.image.draw_bounding_boxes, crop_and_resize, non_max_suppression), so that they take them as they are. Classes
are 0-based ids into class_names (labels.txt's line numbers, as the classification reader's `label`) whatever the
record's first id (`first_id`, 1 for the OD API): padding is -1, which no class is.

TensorFlow is imported where it is used (no Beam anywhere); `object_problems` is plain Python (verify's).
"""

from __future__ import annotations

import io
import math

from transforms.base.dataset_format import (
    DETECTION,
    DETECTION_INSTANCE_MASK,
    DETECTION_SEMANTIC_MASK,
    DETECTION_TFDS_OBJECTS,
    SCHEMAS,
)

BOX_FIELDS = ("ymin", "xmin", "ymax", "xmax")  # the order of the reader's boxes
OBJECT_LISTS = ("label", "class_name", "area", "is_crowd", "difficult")  # one value per object, besides the box
PAD_CLASS = -1  # the class of a padded box (KerasCV's and KerasHub's), never a class id
SEMANTIC_IGNORE = 255  # a semantic mask's "ignore" value (pad's bars, VOC's boundaries)
_TYPES = {"int64": "int64", "float": "float32", "string": "string", "bytes": "string"}


def detection_settings(info: dict) -> tuple[int, bool, bool]:
    """(first_id, instance_masks, semantic_masks) of a detection dataset's description."""
    section = info.get("detection") or {}
    return section.get("first_id", 1), bool(section.get("instance_masks")), bool(section.get("semantic_masks"))


def has_tfds_objects(info: dict) -> bool:
    """Whether a detection dataset's records hold TFDS's keys (objects/bbox, ...) beside the OD API's: those of
    every dataset its description lists them for (datasets written before they were added have none)."""
    return DETECTION_TFDS_OBJECTS["tfds_bbox"][0] in (info.get("features") or {})


def feature_spec(instance_masks: bool = False, semantic_masks: bool = False) -> dict:
    """The `tf.io.parse_single_example` spec of a detection record, keyed by stored key: one value per image key,
    a 1-D tensor per object key (RaggedFeature, of any length, 0 too)."""
    import tensorflow as tf

    dtypes = {"int64": tf.int64, "float": tf.float32, "string": tf.string, "bytes": tf.string}
    lists = {*BOX_FIELDS, *OBJECT_LISTS}
    spec = {}
    for field, (key, dtype) in SCHEMAS[DETECTION].items():
        if field in lists:
            spec[key] = tf.io.RaggedFeature(dtypes[dtype], row_splits_dtype=tf.int64)
        else:  # sha256 and source_id: '' rather than a failed parse when a reader's own records lack them
            default = "" if field in ("sha256", "source_id") else None
            spec[key] = tf.io.FixedLenFeature([], dtypes[dtype], default_value=default)
    if instance_masks:
        spec[DETECTION_INSTANCE_MASK["mask"][0]] = tf.io.RaggedFeature(tf.string, row_splits_dtype=tf.int64)
    if semantic_masks:  # an image without a semantic mask has none: '' (`semantic_mask` gives all-ignore then)
        for key, _ in DETECTION_SEMANTIC_MASK.values():
            spec[key] = tf.io.FixedLenFeature([], tf.string, default_value="")
    return spec


def _decode_masks(pngs, height, width):
    """Single-channel PNGs -> uint8 [N, height, width]; [0, height, width] for none (map_fn cannot stack zero
    elements of an unknown shape)."""
    import tensorflow as tf

    def decode():
        return tf.map_fn(lambda png: tf.io.decode_png(png, channels=1)[:, :, 0], pngs,
                         fn_output_signature=tf.TensorSpec([None, None], tf.uint8))

    masks = tf.cond(tf.size(pngs) > 0, decode, lambda: tf.zeros([0, height, width], tf.uint8))
    return tf.ensure_shape(masks, [None, None, None])


def parse_detection(serialized, decode: bool = True, image_size=None, instance_masks: bool = False,
                    semantic_masks: bool = False) -> dict:
    """One serialized detection Example in canonical names, TensorFlow ops only:

    image (uint8 [H, W, 3] with `decode`, else the encoded bytes), format, height, width, source_path
    (image/filename), source_id, sha256; boxes float32 [N, 4] (ymin, xmin, ymax, xmax as stored); label int64 [N]
    (the stored ids, from first_id), class_name string [N], area float32 [N], is_crowd and difficult int64 [N];
    with `instance_masks`, masks uint8 [N, H, W] (0/1; with `decode`, else the PNGs); with `semantic_masks`,
    segmentation_mask uint8 [H, W, 1] (class ids, 255 where none is given; with `decode`, else the PNG).
    A record whose object lists differ in length fails (InvalidArgumentError in tf.stack): it is damaged.
    """
    import tensorflow as tf

    parsed = tf.io.parse_single_example(serialized, feature_spec(instance_masks, semantic_masks))
    keys = SCHEMAS[DETECTION]
    out = {field: parsed[keys[field][0]] for field in ("image", "format", "height", "width", "source_path",
                                                        "source_id", "sha256", *OBJECT_LISTS)}
    out["boxes"] = tf.stack([parsed[keys[field][0]] for field in BOX_FIELDS], axis=-1)
    tf.debugging.assert_equal(tf.shape(out["label"])[0], tf.shape(out["boxes"])[0],
                              message="the record's class ids and boxes differ in number")
    if decode:
        image = tf.io.decode_image(out["image"], channels=3, expand_animations=False)
        if image_size is not None:
            image = tf.ensure_shape(image, [image_size[0], image_size[1], 3])
        out["image"] = image
    height, width = tf.cast(out["height"], tf.int32), tf.cast(out["width"], tf.int32)
    if instance_masks:
        pngs = parsed[DETECTION_INSTANCE_MASK["mask"][0]]
        out["masks"] = _decode_masks(pngs, height, width) if decode else pngs
        if decode and image_size is not None:
            out["masks"] = tf.ensure_shape(out["masks"], [None, image_size[0], image_size[1]])
    if semantic_masks:
        png = parsed[DETECTION_SEMANTIC_MASK["segmentation"][0]]
        if decode:
            png = tf.cond(tf.strings.length(png) > 0, lambda: tf.io.decode_png(png, channels=1),
                          lambda: tf.fill([height, width, 1], tf.constant(SEMANTIC_IGNORE, tf.uint8)))
            png = tf.ensure_shape(png, [None, None, 1] if image_size is None else [*image_size, 1])
        out["segmentation_mask"] = png
    return out


def checked_classes(labels, first_id: int, num_classes: int):
    """The stored class ids as 0-based int32 ids into class_names, once every one is in
    first_id..first_id + num_classes - 1: one out of range stops the iteration with InvalidArgumentError
    ("indices[0] = 7 is not in [0, 3)", in the node class_id_out_of_range_of_the_classes_in_image_tfrecords_json);
    python -m pipeline.verify names the record. A gather through the ids, as the classification reader checks."""
    import tensorflow as tf

    return tf.gather(tf.range(num_classes, dtype=tf.int32), tf.cast(labels, tf.int32) - first_id,
                     name="class_id_out_of_range_of_the_classes_in_image_tfrecords_json")


def _pad(values, max_boxes: int, value):
    """`values` ([N, ...]) padded with `value` to [max_boxes, ...]; N > max_boxes fails the pad (negative)."""
    import tensorflow as tf

    count = tf.shape(values)[0]
    rank = len(values.shape)
    padded = tf.pad(values, [[0, max_boxes - count]] + [[0, 0]] * (rank - 1), constant_values=value)
    return tf.ensure_shape(padded, [max_boxes, *values.shape[1:]])


def training_fields(fields: dict, first_id: int, num_classes: int, max_boxes: int | None = None) -> dict:
    """`parse_detection`'s fields as the reader gives them: `classes` (0-based int32, checked) instead of the
    stored `label`; with `max_boxes`, every object field padded to that many (boxes with zeros, classes with -1,
    class_name with '', masks with zeros) and `num_boxes` (int32) the count of real ones."""
    import tensorflow as tf

    out = dict(fields)
    out["classes"] = checked_classes(out.pop("label"), first_id, num_classes)
    if max_boxes is None:
        return out
    out["num_boxes"] = tf.shape(out["boxes"])[0]
    pads = {"boxes": 0.0, "classes": PAD_CLASS, "class_name": "", "area": 0.0, "is_crowd": 0, "difficult": 0}
    if "masks" in out:  # decoded, or the PNGs without decode
        pads["masks"] = 0 if out["masks"].dtype == tf.uint8 else ""
    for field, value in pads.items():
        out[field] = _pad(out[field], max_boxes, tf.constant(value, out[field].dtype))
    return out


# -- verify's checks of one record's objects (plain Python: the protobuf and Pillow) ---------------------------------


def object_problems(feature, height: int, width: int, class_names: list[str], first_id: int,
                    instance_masks: bool, semantic_masks: bool, tfds_objects: bool = False
                    ) -> tuple[list[str], list[str]]:
    """What is wrong with the objects of one record (its Example's `feature` map), one line each, and the class
    names of its objects (by their ids, '<id 7>' for one out of range) for the counts.

    Checks: every object list as long as the boxes; each box finite, in [0, 1], xmin < xmax and ymin < ymax; each
    class id in first_id..first_id + len(class_names) - 1 and its text the class name of that id; with instance
    masks one PNG per object, single-channel, of the record's height x width, of 0 and 1 only; a semantic mask a PNG
    of that size holding class ids (0 .. first_id + len(class_names) - 1) or 255 only; with `tfds_objects`, TFDS's
    keys the same objects as the OD API's (`_tfds_problems`).
    """
    keys = SCHEMAS[DETECTION]

    def values(field: str) -> list:
        key = keys[field][0]
        if key not in feature:
            return []
        kind = feature[key].WhichOneof("kind")
        return list(getattr(feature[key], kind).value) if kind else []

    problems: list[str] = []
    boxes = {field: values(field) for field in BOX_FIELDS}
    count = len(boxes["ymin"])
    lists = {**boxes, **{field: values(field) for field in OBJECT_LISTS}}
    uneven = {field: len(found) for field, found in lists.items() if len(found) != count}
    if uneven:
        shown = ", ".join(f"{keys[field][0]} {n}" for field, n in uneven.items())
        problems.append(f"its object lists differ in length: {count} boxes, but {shown}")
    names: list[str] = []
    last = first_id + len(class_names) - 1
    for i in range(count):
        ymin, xmin, ymax, xmax = (boxes[field][i] if i < len(boxes[field]) else math.nan for field in BOX_FIELDS)
        shown = f"[ymin {ymin:.6g}, xmin {xmin:.6g}, ymax {ymax:.6g}, xmax {xmax:.6g}]"
        corners = (ymin, xmin, ymax, xmax)
        if not all(math.isfinite(v) for v in corners):
            problems.append(f"object {i}: box {shown} has a coordinate that is not a finite number")
        elif not all(0.0 <= v <= 1.0 for v in corners):
            problems.append(f"object {i}: box {shown} is outside [0, 1] (boxes are normalised to the image)")
        elif not (xmin < xmax and ymin < ymax):
            problems.append(f"object {i}: box {shown} is empty or inverted (xmin < xmax and ymin < ymax fail)")
        if i >= len(lists["label"]):
            continue
        label = lists["label"][i]
        text = lists["class_name"][i].decode("utf-8", "replace") if i < len(lists["class_name"]) else None
        if first_id <= label <= last:
            name = class_names[label - first_id]
            if text is not None and text != name:
                problems.append(f"object {i}: class text {text!r} does not match class id {label}, which is "
                                f"{name!r} in labels.txt")
        else:
            name = f"<id {label}>"
            problems.append(f"object {i}: class id {label} is out of range: the dataset's {len(class_names)} "
                            f"classes have ids {first_id}..{last}")
        names.append(name)
    if tfds_objects:
        problems += _tfds_problems(feature, lists, first_id)
    if instance_masks:
        mask_key = DETECTION_INSTANCE_MASK["mask"][0]
        pngs = list(feature[mask_key].bytes_list.value) if mask_key in feature else []
        if len(pngs) != count:
            problems.append(f"{len(pngs)} instance masks for {count} objects: every object needs one")
        for i, png in enumerate(pngs):
            problem = _mask_problem(png, height, width, {0, 1}, "0 and 1")
            if problem:
                problems.append(f"object {i}: its mask {problem}")
    if semantic_masks:
        key = DETECTION_SEMANTIC_MASK["segmentation"][0]
        found = feature[key].bytes_list.value if key in feature else []
        if found:
            allowed = set(range(first_id + len(class_names))) | {SEMANTIC_IGNORE}
            problem = _mask_problem(found[0], height, width, allowed, f"class ids 0..{last} and {SEMANTIC_IGNORE}")
            if problem:
                problems.append(f"its semantic mask {problem}")
    return problems, names


def _tfds_problems(feature, lists: dict, first_id: int) -> list[str]:
    """Where TFDS's keys of a record say other than the OD API's, one line per key: objects/bbox must hold each
    box's [ymin, xmin, ymax, xmax] (the same float32 numbers), objects/label each class id - first_id,
    objects/is_crowd and objects/is_difficult image/object/is_crowd and image/object/difficult."""
    keys = SCHEMAS[DETECTION]
    expected = {
        "tfds_bbox": [v for box in zip(*(lists[field] for field in BOX_FIELDS), strict=False) for v in box],
        "tfds_label": [label - first_id for label in lists["label"]],
        "tfds_is_crowd": lists["is_crowd"], "tfds_is_difficult": lists["difficult"],
    }
    told_by = {"tfds_bbox": "the boxes of image/object/bbox/*", "tfds_label": f"{keys['label'][0]} - {first_id}",
               "tfds_is_crowd": keys["is_crowd"][0], "tfds_is_difficult": keys["difficult"][0]}
    problems = []
    for field, (key, _) in DETECTION_TFDS_OBJECTS.items():
        if key not in feature:
            problems.append(f"it lacks TFDS's {key}, which image_tfrecords.json lists: tfds.builder_from_directory "
                            "reads no objects from it; convert again")
            continue
        kind = feature[key].WhichOneof("kind")
        found = list(getattr(feature[key], kind).value) if kind else []
        if found != expected[field]:
            at = next((i for i, (a, b) in enumerate(zip(found, expected[field], strict=False)) if a != b),
                      min(len(found), len(expected[field])))
            problems.append(f"TFDS's {key} differs from {told_by[field]} ({len(found)} values for "
                            f"{len(expected[field])}, first difference at value {at}): TFDS and the OD API would "
                            "read different objects; convert again")
    return problems


def _mask_problem(png: bytes, height: int, width: int, allowed: set[int], allowed_text: str) -> str | None:
    """What is wrong with a mask PNG: not a single-channel 8-bit PNG, not height x width, values not `allowed`."""
    import numpy as np
    from PIL import Image

    try:
        with Image.open(io.BytesIO(png)) as image:
            if image.format != "PNG" or image.mode not in ("L", "P"):
                return f"is not a single-channel 8-bit PNG ({image.format} {image.mode})"
            if image.size != (width, height):
                return f"is {image.size[0]}x{image.size[1]}, not the stored image's {width}x{height}"
            pixels = np.asarray(image)
    except Exception as e:  # noqa: BLE001 - whatever Pillow says of bytes that are no PNG
        return f"does not decode as a PNG ({type(e).__name__}: {str(e)[:80]})"
    bad = sorted(set(np.unique(pixels).tolist()) - allowed)
    return f"holds values {bad[:5]} (only {allowed_text} are allowed)" if bad else None
