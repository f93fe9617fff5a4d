"""Read a converted dataset in tf.data without retyping keys.

    from pipeline import reader
    ds = reader.make_dataset("tfrecords/", "train", batch_size=128)   # {'image': uint8[B,H,W,3], 'label': ...}

`dataset_info.json` names the shards, the keys and the image size, so the
reader never guesses. Files are read in parallel with no fixed order
(`num_parallel_reads=AUTOTUNE`, `deterministic=False`) and batches have a
static shape (`drop_remainder=True`), as a TPU needs.
"""

from __future__ import annotations

import json

import tensorflow as tf

from pipeline.errors import DatasetError
from transforms.describe import FORMAT_VERSION, INFO_FILE
from transforms.examples import SCHEMAS

_DTYPES = {"int64": tf.int64, "string": tf.string}


def _join(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name


def load_info(dataset_dir: str) -> dict:
    """The parsed dataset_info.json of `dataset_dir` (local or gs://).

    Raises:
        DatasetError: when there is no complete dataset there.
    """
    path = _join(dataset_dir, INFO_FILE)
    if not tf.io.gfile.exists(path):
        raise DatasetError(
            f"{dataset_dir} has no {INFO_FILE}: it is not a complete dataset (an interrupted conversion leaves "
            "none); convert again with python -m pipeline.main"
        )
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            info = json.load(f)
    except (ValueError, tf.errors.OpError) as e:
        raise DatasetError(f"{path} is not readable JSON ({e}); convert again") from None
    if info.get("format_version") != FORMAT_VERSION:
        raise DatasetError(
            f"{path} has format version {info.get('format_version')!r}; this reader reads version {FORMAT_VERSION}"
        )
    return info


def shard_paths(dataset_dir: str, split: str, info: dict | None = None) -> list[str]:
    """Full paths of a split's shards, in order."""
    info = info or load_info(dataset_dir)
    if split not in info["splits"]:
        raise DatasetError(
            f"{dataset_dir} has no {split!r} split; it has: {', '.join(info['splits']) or 'none'}"
        )
    return [_join(dataset_dir, shard["file"]) for shard in info["splits"][split]["shards"]]


def feature_spec(schema: str = "default") -> dict[str, tf.io.FixedLenFeature]:
    """The `tf.io.parse_single_example` spec of a schema ('default' or 'tf_slim'), keyed by stored key."""
    return {key: tf.io.FixedLenFeature([], _DTYPES["int64" if dtype == "int64" else "string"])
            for key, dtype in SCHEMAS[schema].values()}


def parse_example(serialized, schema: str = "default", decode: bool = True, image_size=None) -> dict:
    """Parse one serialized Example into canonical names: image, label, class_name, height, width, source_path.

    With `decode`, `image` is a uint8 [H, W, 3] tensor (JPEG or PNG); `image_size`
    (height, width) sets its static shape, as a TPU needs.
    """
    parsed = tf.io.parse_single_example(serialized, feature_spec(schema))
    out = {field: parsed[key] for field, (key, _) in SCHEMAS[schema].items()}
    if decode:
        image = tf.io.decode_image(out["image"], channels=3, expand_animations=False)
        if image_size is not None:
            image = tf.ensure_shape(image, [image_size[0], image_size[1], 3])
        out["image"] = image
    return out


def image_label_keys(schema: str = "default") -> tuple[str, str]:
    """The stored keys of the image bytes and the label id under `schema`."""
    return SCHEMAS[schema]["image"][0], SCHEMAS[schema]["label"][0]


def parse_image_label(serialized, image_key: str = "image", label_key: str | None = "label") -> dict:
    """Parse only what a training step reads: {'image': encoded bytes, 'label': int64}.

    Other keys may be absent, so this also reads TFRecords written by other
    tools. With `label_key` None the result has no 'label'.
    """
    spec = {image_key: tf.io.FixedLenFeature([], tf.string)}
    if label_key:
        spec[label_key] = tf.io.FixedLenFeature([], tf.int64)
    parsed = tf.io.parse_single_example(serialized, spec)
    out = {"image": parsed[image_key]}
    if label_key:
        out["label"] = parsed[label_key]
    return out


def make_dataset(
    dataset_dir: str,
    split: str = "train",
    batch_size: int | None = None,
    decode: bool = True,
    shuffle_buffer: int = 0,
    repeat: bool = False,
    drop_remainder: bool = True,
) -> tf.data.Dataset:
    """A tf.data pipeline over one split: parallel reads, parse, decode, batch, prefetch."""
    info = load_info(dataset_dir)
    files = shard_paths(dataset_dir, split, info)
    compression = "GZIP" if info["compression"] == "gzip" else ""
    image = info["image"]
    image_size = (image["height"], image["width"]) if image.get("fixed_size") else None
    ds = tf.data.TFRecordDataset(files, compression_type=compression, num_parallel_reads=tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.deterministic = False
    ds = ds.with_options(options)
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer)
    if repeat:
        ds = ds.repeat()
    ds = ds.map(lambda s: parse_example(s, info["schema"], decode, image_size),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    if batch_size:
        ds = ds.batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=tf.data.AUTOTUNE,
                      deterministic=False)
    return ds.prefetch(tf.data.AUTOTUNE)
