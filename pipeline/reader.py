"""Read a converted dataset in tf.data without retyping keys.

    from pipeline import reader
    ds = reader.make_dataset("tfrecords/", "train", batch_size=128)   # {'image': uint8[B,H,W,3], 'label': ...}
    model.fit(reader.make_dataset("tfrecords/", "train", batch_size=128, supervised=True, one_hot=True, scale=True))
    ds = reader.make_dataset("detections/", "train", batch_size=8)    # {'image', 'boxes': ragged [B,None,4], ...}
    ds = reader.make_dataset("detections/", "train", batch_size=8, max_boxes=100)   # padded: static shapes

`image_tfrecords.json` names the shards, the keys and the image size, so the
reader never guesses. Files are read in parallel with no fixed order
(`num_parallel_reads=AUTOTUNE`, `deterministic=False`) and batches have a
static shape (`drop_remainder=True`), as a TPU needs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.errors import DatasetError
from pipeline.readers import detection
from transforms.base import paths
from transforms.base.dataset_format import (
    DEFAULT_MAX_IMAGE_MB,
    DEFAULT_MAX_PIXELS,
    DETECTION,
    ERRORS_FILE,
    MULTI_LABEL_FIELDS,
    OPTIONAL_FIELDS,
    SCHEMAS,
    SHARD_FORMATS,
    TFRECORD,
    DescriptionError,
    join,
    load_description,
    record_fields,
)
from transforms.base.features import from_description
from transforms.base.paths import bucket_problem, regular_file_problem

if TYPE_CHECKING:
    import tensorflow as tf

# TensorFlow is imported where it is used, so that load_info can refuse a folder before its slow import.


def read_file_text(path: str) -> str | None:
    """The text of the file at `path` (local, or gs:// through TensorFlow's file systems), or None if there is
    none; a local FIFO or device is refused before it is opened (`refuse_unless_regular`)."""
    if not paths.exists(path):
        return None
    refuse_unless_regular(path)
    return paths.read_text(path)


def refuse_unless_regular(path: str, action: str = "convert again") -> None:
    """Refuse a local `path` that is no regular file before anything opens it: a FIFO would block the read for
    ever, a device might never end.

    Raises:
        DatasetError: naming the file, what it is, and `action`.
    """
    problem = regular_file_problem(path)
    if problem:
        raise DatasetError(f"{path}: {problem}; {action}")


def decode_budget(info: dict) -> tuple[int, int]:
    """(pixels, bytes) an image of the dataset may take decoded: the --max_pixels and --max_image_mb of the
    conversion that wrote it, as image_tfrecords.json records them (the converter's defaults when it does not).
    No record the conversion wrote is larger, so a larger one is damage, or a decode bomb."""
    options = info.get("options") if isinstance(info.get("options"), dict) else {}

    def positive(name: str, default: int) -> int:
        value = options.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default

    return positive("max_pixels", DEFAULT_MAX_PIXELS), positive("max_image_mb", DEFAULT_MAX_IMAGE_MB) * 1_000_000


def image_too_large(image: bytes, budget: tuple[int, int]) -> str | None:
    """Why an encoded image must not be decoded: its header declares more pixels, or more bytes as the uint8 RGB
    tensor the reader decodes, than `budget` (`decode_budget`) allows. None when it fits, and when the header
    cannot be read (the decoder then says what is wrong with it). Reads the header only."""
    import io

    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None  # as the converter does: Pillow's own limit would hide the size; `budget` applies
    try:
        with Image.open(io.BytesIO(image)) as opened:
            width, height = opened.size
    except Exception:  # noqa: BLE001 - no header Pillow reads: TensorFlow's decoder names the damage
        return None
    max_pixels, max_bytes = budget
    pixels = width * height
    if pixels > max_pixels:
        return (f"the image is {width}x{height} = {pixels:,} pixels, over the --max_pixels={max_pixels:,} of the "
                "conversion: it is not decoded")
    if 3 * pixels > max_bytes:
        return (f"the image is {width}x{height} = {pixels:,} pixels, {3 * pixels / 1e6:,.1f} MB decoded, over the "
                f"--max_image_mb={max_bytes // 1_000_000} of the conversion: it is not decoded")
    return None


def record_image(serialized: bytes, image_key: str) -> bytes | None:
    """The encoded image of a serialized Example, None when it is not an Example of one image (the parse names it)."""
    from transforms.base.examples import Example

    try:
        feature = Example.FromString(serialized).features.feature
    except Exception:  # noqa: BLE001 - not an Example: the parse names it
        return None
    values = feature[image_key].bytes_list.value if image_key in feature else ()
    return values[0] if len(values) == 1 else None


def record_too_large(serialized: bytes, image_key: str, budget: tuple[int, int]) -> str | None:
    """`image_too_large` of the image in a serialized Example (None when there is no one image to measure)."""
    image = record_image(serialized, image_key)
    return None if image is None else image_too_large(image, budget)


def strict_jpeg_available() -> bool:
    """Whether `jpeg_damage` can check JPEG data: simplejpeg (libjpeg-turbo, the converter's) is installed; the
    reader-only install (README) does not have it."""
    import importlib.util

    return importlib.util.find_spec("simplejpeg") is not None


def jpeg_damage(image: bytes) -> str | None:
    """Why a JPEG's data is damaged, or None (also for an image that is not a JPEG, and without simplejpeg).

    TensorFlow's decoder decodes damaged entropy-coded data with a warning on stderr ("Corrupt JPEG data: 127
    extraneous bytes before marker 0xd9") into damaged pixels; libjpeg-turbo through simplejpeg in strict mode
    fails on the same warning. Decoded at 1/8 scale: every byte is entropy-decoded, a fraction of the pixels made.
    """
    if not image.startswith(b"\xff\xd8\xff"):
        return None
    try:
        import simplejpeg
    except ImportError:
        return None
    try:
        simplejpeg.decode_jpeg(image, min_factor=8, strict=True)
    except ValueError as e:
        return (f"the image's JPEG data is damaged (libjpeg: {str(e).strip()[:120]}): TensorFlow decodes it with "
                "a warning, into damaged pixels; convert again")
    return None


def load_info(dataset_dir: str, read_text: Callable[[str], str | None] | None = None) -> dict:
    """The parsed and checked image_tfrecords.json of `dataset_dir` (local or gs://).

    A folder written by format version 1 has its description in dataset_info.json
    instead (a name TFDS owns now): that one is read when there is no image_tfrecords.json.

    The read side's door to the one loader of the description (transforms.base.dataset_format.load_description), for
    every read-side tool and the converter's summary. `read_text(path)` returns a file's text, or None when it
    does not exist; by default plain files or TensorFlow's file systems read it (`read_file_text`); the
    converter's summary passes Beam's. Every field the read-side tools use is checked for its JSON type, so a
    damaged or foreign file is one clear error rather than a crash later.

    Raises:
        DatasetError: when there is no complete dataset there, naming what is wrong.
    """
    problem = bucket_problem(dataset_dir)
    if problem:
        raise DatasetError(f"{dataset_dir}: {problem}")
    try:
        return load_description(dataset_dir, lambda path: _read_info_text(path, read_text))
    except DescriptionError as e:
        raise DatasetError(str(e)) from None


def _read_info_text(path: str, read_text: Callable[[str], str | None] | None) -> str | None:
    try:
        return (read_text or read_file_text)(path)
    except DatasetError:  # a FIFO or a device in its place
        raise
    except ValueError as e:  # not UTF-8
        raise DatasetError(f"{path} is not readable JSON ({e}); convert again") from None
    except Exception as e:  # noqa: BLE001 - tf.errors.OpError, OSError: what the file system says
        raise DatasetError(f"{path} cannot be read ({type(e).__name__}: {e}); check the path and your "
                           "access to it") from None


def error_text(error: Exception) -> str:
    """A TensorFlow error reading a record as one short line: no node names, no op suffix, no quoted record.

    TensorFlow quotes a record that does not parse in its message, so one that is
    not UTF-8 surfaces as a UnicodeDecodeError instead of its InvalidArgumentError.
    """
    message = getattr(error, "message", None) or ""
    if isinstance(error, UnicodeDecodeError) or "Could not parse example input" in message:
        return "it does not parse as a tf.train.Example protocol buffer"
    text = re.sub(r"\{\{[^}]*\}\}", "", message)
    text = re.sub(r"\s*\[Op:[^\]]*\].*$", "", text.strip().splitlines()[0] if text.strip() else "")
    return re.sub(r"\s+", " ", text).strip().rstrip(".")[:300] or type(error).__name__


def shard_paths(dataset_dir: str, split: str, info: dict | None = None) -> list[str]:
    """Full paths of a split's shards, in order."""
    info = info or load_info(dataset_dir)
    if not info["splits"]:
        raise DatasetError(
            f"{dataset_dir} holds no records: every image was rejected or skipped (see its {ERRORS_FILE} for each "
            "file's reason); fix the input and convert again")
    if split not in info["splits"]:
        raise DatasetError(
            f"{dataset_dir} has no {split!r} split; it has: {', '.join(info['splits']) or 'none'}"
        )
    return [join(dataset_dir, shard["file"]) for shard in info["splits"][split]["shards"]]


def check_shards(dataset_dir: str, split: str, info: dict) -> list[tuple[str, int]]:
    """(path, records) of each shard of `split`, each checked against image_tfrecords.json before anything reads
    it: there, a regular file, of the size the description gives (one listing of the folder, no record read). A
    shard cut short, even between records, or with records added, removed or changed in size is refused here; the
    reader then counts each shard's records as it reads them (`make_dataset`).

    Raises:
        DatasetError: naming the first shard that is missing or of another size, and what to do.
    """
    shards = info["splits"][split]["shards"] if split in info["splits"] else []
    files = shard_paths(dataset_dir, split, info)
    sizes = {found.rsplit("/", 1)[-1]: size for found, size in paths.list_files(dataset_dir.rstrip("/"))}
    checked = []
    for path, shard in zip(files, shards, strict=True):
        name = path.rsplit("/", 1)[-1]
        found = sizes.get(name)
        if found is None:
            raise DatasetError(f"{name}: listed in image_tfrecords.json but missing from {dataset_dir}: the dataset "
                               "is incomplete; convert again")
        refuse_unless_regular(path)
        if isinstance(shard.get("bytes"), int) and found != shard["bytes"]:
            raise DatasetError(f"{name}: {found} bytes, but image_tfrecords.json says {shard['bytes']}: the shard was "
                               "changed or cut short since it was converted, so it does not hold the records the "
                               f"dataset describes; python -m pipeline.verify {dataset_dir} names what differs; "
                               "convert again")
        records = shard.get("records")
        if not isinstance(records, int) or isinstance(records, bool) or records < 0:
            raise DatasetError(f"{name}: image_tfrecords.json gives no record count for it ({records!r}): the "
                               "description is damaged; convert again")
        checked.append((path, records))
    return checked


def feature_spec(schema: str = "default", multi_label: bool = False, extras: tuple = (), unlabeled: bool = False
                 ) -> dict:
    """The `tf.io.parse_single_example` spec of a schema ('default' or 'tf_slim'), keyed by stored key.

    With `multi_label` (a dataset written with --multi_label) the label and class_name keys are VarLenFeatures.
    `extras`: the typed extra features (`extra_features(info)`): one value as FixedLenFeature([]), N values as
    FixedLenFeature([N]), a list of any length as RaggedFeature (a 1-D tensor per example).
    With `unlabeled` (an unlabeled set, "unlabeled": true in image_tfrecords.json): no label or class_name, an id.
    """
    import tensorflow as tf

    # A key that older datasets lack (sha256) reads as '' there instead of failing the parse.
    spec = {key: tf.io.VarLenFeature(tf.int64 if dtype == "int64" else tf.string)
            if multi_label and field in MULTI_LABEL_FIELDS else
            tf.io.FixedLenFeature([], tf.int64 if dtype == "int64" else tf.string,
                                  default_value="" if field in OPTIONAL_FIELDS else None)
            for field, (key, dtype) in record_fields(schema, unlabeled).items()}
    types = {"int64": tf.int64, "float": tf.float32, "string": tf.string}
    for feature in extras:
        dtype = types[feature.dtype]
        if feature.var_len:
            spec[feature.name] = tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64)
        else:
            spec[feature.name] = tf.io.FixedLenFeature([feature.length] if feature.length else [], dtype)
    return spec


def extra_features(info: dict) -> tuple:
    """The typed extra features (transforms.base.features.FeatureType) that image_tfrecords.json describes."""
    try:
        return from_description(info.get("features") or {})
    except (ValueError, KeyError, TypeError) as e:
        raise DatasetError(f"image_tfrecords.json describes an extra feature this reader cannot read ({e}): "
                           "convert again with this version") from None


def multi_hot(labels, num_classes: int):
    """A list of class ids (int64 [n]) as a float32 vector of `num_classes`: 1.0 at each id, 0.0 elsewhere."""
    import tensorflow as tf

    hot = tf.reduce_sum(tf.one_hot(labels, num_classes, dtype=tf.float32), axis=0)
    return tf.minimum(hot, 1.0)


def parse_example(serialized, schema: str = "default", decode: bool = True, image_size=None,
                  multi_label: bool = False, extras: tuple = (), unlabeled: bool = False) -> dict:
    """Parse one serialized Example into canonical names: image, label, class_name, height, width, source_path,
    sha256 ('' in datasets written before it was recorded); and each of `extras` (typed extra features) under its
    own name: a scalar, a [N] tensor, or a 1-D tensor of the example's own length for a list.

    With `decode`, `image` is a uint8 [H, W, 3] tensor (JPEG or PNG); `image_size`
    (height, width) sets its static shape, as a TPU needs. With `multi_label`, `label` is an int64 [n] tensor
    of class ids (n >= 0) and `class_name` a string [n] tensor of their names. With `unlabeled` (an unlabeled
    set) there is no label or class_name, and `id` is the record's id (its file name without the extension).
    A detection record (`schema` 'detection') gives `pipeline.readers.detection.parse_detection`'s fields: boxes,
    the stored class ids as `label`, class_name, area, is_crowd, difficult (one value per object), source_id.
    """
    import tensorflow as tf

    if schema == DETECTION:  # boxes and classes as lists, one value per object (pipeline/readers/detection.py)
        return detection.parse_detection(serialized, decode, image_size)
    parsed = tf.io.parse_single_example(serialized, feature_spec(schema, multi_label, extras, unlabeled))
    out = {field: tf.sparse.to_dense(parsed[key]) if isinstance(parsed[key], tf.sparse.SparseTensor) else parsed[key]
           for field, (key, _) in record_fields(schema, unlabeled).items()}
    out.update({feature.name: parsed[feature.name] for feature in extras})
    if decode:
        image = tf.io.decode_image(out["image"], channels=3, expand_animations=False)
        if image_size is not None:
            image = tf.ensure_shape(image, [image_size[0], image_size[1], 3])
        out["image"] = image
    return out


def image_label_keys(schema: str = "default") -> tuple[str, str]:
    """The stored keys of the image bytes and the label id under `schema`."""
    return SCHEMAS[schema]["image"][0], SCHEMAS[schema]["label"][0]


def parse_image_label(serialized, image_key: str = "image", label_key: str | None = "label",
                      multi_hot_classes: int = 0) -> dict:
    """Parse only what a training step reads: {'image': encoded bytes, 'label': int64}.

    Other keys may be absent, so this also reads TFRecords written by other
    tools. With `label_key` None the result has no 'label'. With `multi_hot_classes` (a --multi_label
    dataset's num_classes) the label is read as a list and given as a float32 multi-hot vector of that size.
    """
    import tensorflow as tf

    spec = {image_key: tf.io.FixedLenFeature([], tf.string)}
    if label_key:
        spec[label_key] = (tf.io.VarLenFeature(tf.int64) if multi_hot_classes
                           else tf.io.FixedLenFeature([], tf.int64))
    parsed = tf.io.parse_single_example(serialized, spec)
    out = {"image": parsed[image_key]}
    if label_key:
        out["label"] = (multi_hot(tf.sparse.to_dense(parsed[label_key]), multi_hot_classes) if multi_hot_classes
                        else parsed[label_key])
    return out


def checked_label(label, num_classes: int):
    """`label` (a class id, or with --multi_label a list of them), once every id is in 0..num_classes-1: an id out
    of range stops the iteration with InvalidArgumentError ("indices = 7 is not in [0, 2)", in the node
    `label_out_of_range_of_the_classes_in_image_tfrecords_json`); python -m pipeline.verify names the record.

    A gather through the ids themselves, measured at about 0.5 us a record, where tf.debugging.Assert costs 6-12.
    """
    import tensorflow as tf

    return tf.gather(tf.range(num_classes, dtype=tf.int64), label,
                     name="label_out_of_range_of_the_classes_in_image_tfrecords_json")


def make_dataset(
    dataset_dir: str,
    split: str = "train",
    batch_size: int | None = None,
    decode: bool = True,
    shuffle_buffer: int = 0,
    repeat: bool = False,
    drop_remainder: bool = True,
    supervised: bool = False,
    one_hot: bool = False,
    scale: bool = False,
    max_boxes: int | None = None,
    masks: bool = True,
) -> tf.data.Dataset:
    """A tf.data pipeline over one split: parallel reads, parse, decode, batch, prefetch.

    By default each element is a dict of every field (see `parse_example`), the typed extra features
    (--features) included under their own names: batched, a list of any length (int_list, ...) is a
    tf.RaggedTensor [batch, None], the others dense tensors.
    With `supervised`, it is an `(image, label)` tuple instead, which Keras'
    `model.fit` takes as (inputs, targets). `one_hot` makes the label a float32
    vector of `num_classes` (from image_tfrecords.json), for
    `categorical_crossentropy`; without it the label is the int64 class id, for
    `sparse_categorical_crossentropy`. `scale` makes the image float32 in
    [0, 1] (pixel / 255) instead of uint8 0-255.

    A dataset written with --multi_label ("multi_label": true in image_tfrecords.json) has a list of class ids
    per image: `one_hot` makes it a float32 multi-hot vector of `num_classes` (1.0 for each class of the
    image), for `binary_crossentropy`; without it the label is the int64 [n] list (and `class_name` the
    names), and a batch holds them as tf.RaggedTensor.

    An unlabeled set (--unlabeled, "unlabeled": true in image_tfrecords.json) has no label: each dict has `id`
    (the file name without its extension) instead of label and class_name, and `supervised` gives
    `(image, id)` pairs, to match predictions to their files.

    What it reads is checked against image_tfrecords.json: before anything is read, each shard of the split must be
    there with the size it gives (`check_shards`: a shard cut short, or with records added or removed, is a
    DatasetError naming it); as the records are read, each epoch, the split must hold as many as it gives
    (FailedPreconditionError "Input dataset was expected to contain N elements..."), and each label id must be one
    of its classes (InvalidArgumentError "indices = 7 is not in [0, 2)" in the node
    label_out_of_range_of_the_classes_in_image_tfrecords_json), never an all-zero one-hot vector. Each record's CRC
    is TFRecordDataset's own (DataLossError). Not checked here, per record (python -m pipeline.verify checks them):
    class_name against the label, height and width against the image, the JPEG data's integrity past what
    TensorFlow's decoder refuses, sha256 against the sources files.

    A detection dataset ("task": "detection" in image_tfrecords.json) gives per image `boxes` (float32 [N, 4],
    [ymin, xmin, ymax, xmax] normalised to the image: "rel_yxyx"), `classes` (int32 [N], 0-based ids into
    class_names, whatever first_id the records store; one out of range stops the iteration with
    InvalidArgumentError in the node class_id_out_of_range_of_the_classes_in_image_tfrecords_json), class_name,
    area, is_crowd, difficult (one value per object), source_id, and with `masks` the masks the dataset holds
    (`masks` uint8 [N, H, W] of 0/1, `segmentation_mask` uint8 [H, W, 1] of class ids): batched, the object fields
    are tf.RaggedTensor [batch, None, ...]. With `max_boxes`, every object field is padded to that many instead
    (boxes with zeros, classes with -1) and `num_boxes` counts the real ones: static shapes, as a TPU needs.
    `supervised` gives (image, {"boxes", "classes"}) pairs, the bounding-box dict of KerasCV and KerasHub.
    See docs/detection.md ("Reading").

    Raises:
        DatasetError: when `dataset_dir` holds no complete dataset or no such split, or a shard is missing or of
        another size than image_tfrecords.json gives.
        ValueError: for `scale` without `decode` (encoded bytes have no pixels to scale), `one_hot` on an
        unlabeled set or a detection dataset, `max_boxes` on a classification dataset or fewer than the objects
        an image of the dataset holds.
    """
    import tensorflow as tf

    if scale and not decode:
        raise ValueError("scale=True needs decode=True: only decoded pixels can be scaled to [0, 1]")
    info = load_info(dataset_dir)
    task = info.get("task", "classification")
    if task == DETECTION:
        _check_detection_arguments(dataset_dir, info, one_hot, max_boxes)
    elif max_boxes is not None:
        raise ValueError(f"max_boxes is for detection datasets, and {dataset_dir} is a {task} dataset: drop "
                         "max_boxes")
    shards = check_shards(dataset_dir, split, info)
    shard_format = SHARD_FORMATS.get((info.get("options") or {}).get("file_format", TFRECORD))
    if shard_format is None or not shard_format.tf_data:
        raise DatasetError(f"{dataset_dir} holds {info['options']['file_format']} shards, which tf.data does not "
                           "read: open them with Grain (README: Random access with Grain), or convert again "
                           "without --file_format")
    compression = "GZIP" if info["compression"] == "gzip" else ""
    image = info["image"]
    image_size = (image["height"], image["width"]) if image.get("fixed_size") else None
    num_classes = info.get("num_classes", len(info["class_names"]))
    extras = extra_features(info)
    multi_label = bool(info.get("multi_label"))
    unlabeled = bool(info.get("unlabeled"))
    if one_hot and unlabeled:
        raise ValueError(f"one_hot needs labels, and {dataset_dir} is an unlabeled set (--unlabeled): drop one_hot")
    # Each shard's size was checked against image_tfrecords.json (`check_shards`); the split's records are counted
    # as they are read, each epoch: more or fewer than it says stops the iteration (FailedPreconditionError "Input
    # dataset was expected to contain N elements but contained only M"). Counted per split, not per shard: one
    # counter (free), where a count per shard (an interleave of one dataset per shard) measured 3 us a record.
    ds = tf.data.TFRecordDataset([path for path, _ in shards], compression_type=compression,
                                 num_parallel_reads=tf.data.AUTOTUNE)
    ds = ds.apply(tf.data.experimental.assert_cardinality(sum(count for _, count in shards)))
    options = tf.data.Options()
    options.deterministic = False
    ds = ds.with_options(options)
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer)
    if repeat:
        ds = ds.repeat()

    def parse(serialized):
        fields = parse_example(serialized, info["schema"], decode, image_size, multi_label, extras=extras,
                               unlabeled=unlabeled)
        if not unlabeled:  # a label id out of range would be an all-zero one-hot vector, or another class
            fields["label"] = checked_label(fields["label"], num_classes)
        if scale:
            fields["image"] = tf.cast(fields["image"], tf.float32) / 255.0
        if one_hot and multi_label:
            fields["label"] = multi_hot(fields["label"], num_classes)
        elif one_hot:
            fields["label"] = tf.one_hot(fields["label"], num_classes, dtype=tf.float32)
        return (fields["image"], fields["id" if unlabeled else "label"]) if supervised else fields

    if task == DETECTION:
        return _batched_detection(ds, info, batch_size, decode, image_size, drop_remainder, supervised, scale,
                                  max_boxes, masks)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    # lists of any length per image: ragged (label and class_name with --multi_label, the image too without a
    # fixed size; var-len extra features)
    if batch_size and ((multi_label and not (one_hot and supervised))
                       or (not supervised and any(feature.var_len for feature in extras))):
        ds = ds.ragged_batch(batch_size, drop_remainder=drop_remainder)
    elif batch_size:
        ds = ds.batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=tf.data.AUTOTUNE,
                      deterministic=False)
    return ds.prefetch(tf.data.AUTOTUNE)


def _check_detection_arguments(dataset_dir: str, info: dict, one_hot: bool, max_boxes: int | None) -> None:
    """Refuse what a detection dataset cannot give: one_hot (an image has many classes), or a `max_boxes` below
    the most objects an image holds (objects_per_image_max): padding never drops a box."""
    if one_hot:
        raise ValueError(f"one_hot is for classification labels, and {dataset_dir} is a detection dataset (classes "
                         "per box): drop one_hot")
    if max_boxes is None:
        return
    most = (info.get("detection") or {}).get("objects_per_image_max")
    if isinstance(max_boxes, bool) or not isinstance(max_boxes, int) or max_boxes < 1:
        raise ValueError(f"max_boxes={max_boxes!r}: give a number of boxes (at least 1), or None for ragged boxes")
    if isinstance(most, int) and max_boxes < most:
        raise ValueError(f"max_boxes={max_boxes} is fewer than the {most} objects an image of {dataset_dir} holds "
                         "(detection.objects_per_image_max in image_tfrecords.json), and padding never drops a "
                         f"box: give max_boxes={most} or more")


def _batched_detection(ds, info: dict, batch_size: int | None, decode: bool, image_size, drop_remainder: bool,
                       supervised: bool, scale: bool, max_boxes: int | None, masks: bool):
    """The detection records of `ds` (serialized Examples) parsed, checked, padded with `max_boxes`, batched."""
    import tensorflow as tf

    first_id, instance_masks, semantic_masks = detection.detection_settings(info)
    num_classes = info.get("num_classes", len(info["class_names"]))

    def parse(serialized):
        fields = detection.parse_detection(serialized, decode, image_size, instance_masks and masks,
                                           semantic_masks and masks)
        fields = detection.training_fields(fields, first_id, num_classes, max_boxes)
        if scale:
            fields["image"] = tf.cast(fields["image"], tf.float32) / 255.0
        return (fields["image"], {"boxes": fields["boxes"], "classes": fields["classes"]}) if supervised else fields

    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    if batch_size and (max_boxes is None or image_size is None):  # lists of any length, or images of any size
        ds = ds.ragged_batch(batch_size, drop_remainder=drop_remainder)
    elif batch_size:
        ds = ds.batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=tf.data.AUTOTUNE,
                      deterministic=False)
    return ds.prefetch(tf.data.AUTOTUNE)
