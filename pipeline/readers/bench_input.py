"""The read benchmark's TensorFlow side: what to read, the tf.data pipeline of each stage, the device step, timing.

Every stage is its own pass over the same files, built as a training input
pipeline is: files read in parallel in no fixed order, each record parsed
with the reader helper, the image decoded and cast, batched with
`drop_remainder=True` (static shapes, as a TPU compiles per shape) and
prefetched. Stages stop at a different point of that chain, so the cost of
each step shows as the drop from one row of the table to the next.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from pipeline import reader
from pipeline.errors import DatasetError, UserError
from pipeline.readers import detection
from pipeline.readers.bench_report import StageResult
from transforms.base.dataset_format import DETECTION, INFO_FILE, SHARD_FORMATS, TFRECORD
from transforms.base.paths import TF_IMAGE_EXTENSIONS

AUTOTUNE = tf.data.AUTOTUNE
DTYPES = {"float32": tf.float32, "bfloat16": tf.bfloat16, "uint8": tf.uint8}


@dataclass
class Source:
    """The TFRecord files to benchmark and how to read them."""

    name: str
    files: list[str]
    sizes: list[int]
    compression: str  # '' or 'GZIP', as TFRecordDataset takes it
    image_key: str
    label_key: str | None
    image_size: tuple[int, int]  # (height, width) of every batched image
    resize: bool  # resize to image_size; otherwise every image must already have it
    split: str | None = None
    records_per_epoch: int | None = None
    multi_hot_classes: int = 0  # a --multi_label dataset's num_classes: its labels are lists, fed as multi-hot
    # a detection dataset's (first_id, num_classes, max_boxes): its records' boxes and classes are parsed and padded
    # to max_boxes (objects_per_image_max, at least 1), as a TPU's input pipeline pads them; None for classification
    detection: tuple[int, int, int] | None = None


@dataclass
class ImageFiles:
    """Original image files for --compare_files, with a label from their folder."""

    root: str
    paths: list[str]
    labels: list[int]
    skipped: int  # files without an extension tf.io.decode_image reads


# ---- What to read ----------------------------------------------------------------------------

def _file_sizes(files: list[str], expected: dict[str, int] | None = None) -> list[int]:
    """Each file's size; refuses a missing or empty file, or one whose size differs from `expected`."""
    sizes = []
    for path in files:
        try:
            size = tf.io.gfile.stat(path).length
        except tf.errors.NotFoundError:
            raise DatasetError(f"{path} is listed in {INFO_FILE} but does not exist; copy or convert the "
                               "dataset again") from None
        except tf.errors.OpError as e:
            raise DatasetError(f"{path} cannot be read ({tf_message(e)})") from None
        if size == 0:
            raise DatasetError(f"{path} is empty (0 bytes): a shard from an interrupted copy or conversion; "
                               "copy or convert it again")
        if expected is not None and expected.get(path) not in (None, size):
            raise DatasetError(f"{path} is {size} bytes but {INFO_FILE} says {expected[path]}: the shard changed "
                               "after the conversion or was copied partly; copy or convert it again")
        sizes.append(size)
    return sizes


def dataset_source(dataset_dir: str, split: str, image_size: tuple[int, int] | None = None) -> Source:
    """The shards of one split of a converted dataset, described by its image_tfrecords.json.

    `image_size` (height, width) resizes the images; by default they keep the
    dataset's fixed size, and a dataset of varying sizes needs one.
    """
    info = reader.load_info(dataset_dir)
    files = reader.shard_paths(dataset_dir, split, info)
    for path in files:
        reader.refuse_unless_regular(path)
    file_format = (info.get("options") or {}).get("file_format", TFRECORD)
    if file_format not in SHARD_FORMATS or not SHARD_FORMATS[file_format].tf_data:
        raise DatasetError(f"{dataset_dir} holds {file_format} shards: the benchmark reads TFRecord shards with "
                           "tf.data; convert the folder again without --file_format to benchmark it")
    if not files:
        raise DatasetError(f"the {split!r} split of {dataset_dir} has no records (every image was rejected); "
                           "pick another --split")
    expected = dict(zip(files, (shard["bytes"] for shard in info["splits"][split]["shards"]), strict=True))
    sizes = _file_sizes(files, expected)
    image = info["image"]
    stored = (image["height"], image["width"]) if image.get("fixed_size") else None
    if image_size is None and stored is None:
        options = info.get("options") if isinstance(info.get("options"), dict) else {}
        raise UserError(f"the images of {dataset_dir} vary in size (--resize_mode={options.get('resize_mode')}); "
                        "pass --image_size=N or WxH to resize them to one size for batching")
    image_key, label_key = reader.image_label_keys(info["schema"])
    if info.get("unlabeled"):  # an unlabeled set's records have no label key: the images alone are read
        label_key = None
    objects = None
    if info.get("task") == DETECTION:  # boxes and classes per object, padded
        first_id = detection.detection_settings(info)[0]
        most = (info.get("detection") or {}).get("objects_per_image_max") or 1
        objects = (first_id, len(info["class_names"]), most)
    return Source(
        name=dataset_dir, files=files, sizes=sizes, compression="GZIP" if info["compression"] == "gzip" else "",
        image_key=image_key, label_key=label_key, image_size=image_size or stored,
        resize=image_size is not None and image_size != stored, split=split,
        records_per_epoch=info["splits"][split]["records"],
        multi_hot_classes=len(info["class_names"]) if info.get("multi_label") else 0, detection=objects,
    )


def pattern_source(pattern: str, image_key: str, label_key: str | None,
                   image_size: tuple[int, int] | None = None) -> Source:
    """Any TFRecord files matching a glob; files ending in .gz are read as GZIP.

    Without `image_size`, every image must have the size of the first record's.
    """
    try:
        matches = sorted(tf.io.gfile.glob(pattern))
    except tf.errors.OpError as e:
        raise DatasetError(f"cannot list --file_pattern {pattern} ({tf_message(e)})") from None
    files = [path for path in matches if not tf.io.gfile.isdir(path)]
    for path in files:
        reader.refuse_unless_regular(path, "give a --file_pattern that matches TFRecord files only")
    if not files:
        raise DatasetError(f"no files match --file_pattern {pattern}; check the path, and quote the pattern so "
                           "that the shell does not expand it")
    sizes = _file_sizes(files)
    gzip = [path.endswith(".gz") for path in files]
    if any(gzip) and not all(gzip):
        raise UserError(f"--file_pattern {pattern} matches both .gz and other files; match one kind only")
    source = Source(name=pattern, files=files, sizes=sizes, compression="GZIP" if all(gzip) else "",
                    image_key=image_key, label_key=label_key, image_size=image_size or (0, 0),
                    resize=image_size is not None)
    if image_size is None:
        source.image_size = first_image_size(source)
    return source


def first_image_size(source: Source) -> tuple[int, int]:
    """(height, width) of the first record's image; checks its keys and decoding, naming the file."""
    for path in source.files:
        try:
            for record in tf.data.TFRecordDataset(path, compression_type=source.compression).take(1):
                parsed = reader.parse_image_label(record, source.image_key, source.label_key)
                image = tf.io.decode_image(parsed["image"], channels=3, expand_animations=False)
                return int(image.shape[0]), int(image.shape[1])
        except (tf.errors.OpError, UnicodeDecodeError) as e:
            raise explain_error(e, source, [path]) from None
    raise DatasetError(f"the files matching {source.name} hold no records")


def image_files(root: str) -> ImageFiles:
    """Every image below `root` (local or gs://), labelled by its folder, for --compare_files."""
    if not tf.io.gfile.isdir(root):
        raise UserError(f"--compare_files {root} is not a folder; give the folder of class folders that was "
                        "converted")
    found, skipped = [], 0
    for folder, _, names in tf.io.gfile.walk(root):
        for name in names:
            if name.lower().endswith(TF_IMAGE_EXTENSIONS):
                found.append(folder.rstrip("/") + "/" + name)
            else:
                skipped += 1
    if not found:
        raise UserError(f"--compare_files {root} holds no {'/'.join(TF_IMAGE_EXTENSIONS)} files")
    found.sort()
    classes = sorted({path.rsplit("/", 2)[-2] for path in found})
    ids = {name: i for i, name in enumerate(classes)}
    return ImageFiles(root, found, [ids[path.rsplit("/", 2)[-2]] for path in found], skipped)


# ---- Input pipelines -------------------------------------------------------------------------

def pipeline_files(files: list, context: tf.distribute.InputContext | None) -> tuple[list, bool]:
    """This input pipeline's share of the files, and whether it must shard records instead.

    Each pipeline (one per TPU host) reads its own subset of the files; with
    fewer files than pipelines each reads all and keeps every n-th record.
    """
    if context is None or context.num_input_pipelines == 1:
        return list(files), False
    if len(files) >= context.num_input_pipelines:
        return list(files[context.input_pipeline_id::context.num_input_pipelines]), False
    return list(files), True


def _unordered() -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = False
    return options


def _decode(encoded, image_size: tuple[int, int], resize: bool, dtype: tf.DType):
    """Encoded image bytes -> [height, width, 3] of `dtype`, with a static shape."""
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    if resize:
        image = tf.image.resize(image, image_size)  # float32
        image = tf.saturate_cast(tf.round(image), tf.uint8) if dtype == tf.uint8 else image
    else:
        image = tf.ensure_shape(image, [image_size[0], image_size[1], 3])
    return tf.cast(image, dtype)


def tfrecord_dataset(source: Source, stage: str, batch_size: int, dtype: str = "float32", epochs: int = 1,
                     context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
    """The pipeline of a TFRecord stage ('read', 'parse', 'decode' or 'device').

    Elements are dicts of batches: 'record_bytes' always (the size of each
    record); 'image' and 'label' from 'parse' on ('image' is decoded and cast
    from 'decode' on). `batch_size` is this pipeline's batch: per replica when
    `context` is given.
    """
    files, shard_records = pipeline_files(source.files, context)
    records = tf.data.TFRecordDataset(files, compression_type=source.compression, num_parallel_reads=AUTOTUNE)
    records = records.with_options(_unordered())
    if shard_records:
        records = records.shard(context.num_input_pipelines, context.input_pipeline_id)
    if epochs > 1:
        records = records.repeat(epochs)  # before batching: the run drops one partial batch, not one per epoch
    if stage == "read":
        batches = records.batch(batch_size, drop_remainder=True)
        return batches.map(lambda batch: {"record_bytes": tf.strings.length(batch)}).prefetch(AUTOTUNE)

    decode = stage in ("decode", "device")
    image_type = DTYPES[dtype]

    def parse(record):
        example = parse_record(record, source)
        if decode:
            example["image"] = _decode(example["image"], source.image_size, source.resize, image_type)
        if "label" in example and not source.multi_hot_classes:
            example["label"] = tf.cast(example["label"], tf.int32)  # TPUs prefer 32-bit integers
        example["record_bytes"] = tf.strings.length(record)
        return example

    examples = records.map(parse, num_parallel_calls=AUTOTUNE, deterministic=False)
    batches = examples.batch(batch_size, drop_remainder=True, num_parallel_calls=AUTOTUNE, deterministic=False)
    return batches.prefetch(AUTOTUNE)


def parse_record(record, source: Source) -> dict:
    """What a training step reads of a record: {'image': encoded bytes, 'label'}; of a detection record {'image',
    'boxes': float32 [max_boxes, 4], 'classes': int32 [max_boxes]} (pipeline/readers/detection.py), padded."""
    if source.detection is None:
        return reader.parse_image_label(record, source.image_key, source.label_key, source.multi_hot_classes)
    first_id, num_classes, max_boxes = source.detection
    fields = detection.training_fields(detection.parse_detection(record, decode=False), first_id, num_classes,
                                       max_boxes)
    return {"image": fields["image"], "boxes": fields["boxes"], "classes": fields["classes"]}


def files_dataset(files: ImageFiles, image_size: tuple[int, int], batch_size: int, dtype: str = "float32",
                  epochs: int = 1, context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
    """The same decode pipeline over the original image files: read each file, decode, resize, cast, batch.

    Files that cannot be decoded are skipped (the stage's record count shows it).
    """
    paths, shard_files = pipeline_files(files.paths, context)
    labels, _ = pipeline_files(files.labels, context)
    elements = tf.data.Dataset.from_tensor_slices({"path": paths, "label": labels})
    if shard_files:
        elements = elements.shard(context.num_input_pipelines, context.input_pipeline_id)
    if epochs > 1:
        elements = elements.repeat(epochs)
    image_type = DTYPES[dtype]

    def load(element):
        data = tf.io.read_file(element["path"])
        return {"image": _decode(data, image_size, True, image_type),
                "label": tf.cast(element["label"], tf.int32),
                "record_bytes": tf.strings.length(data)}

    images = elements.with_options(_unordered()).map(load, num_parallel_calls=AUTOTUNE, deterministic=False)
    images = images.ignore_errors()
    batches = images.batch(batch_size, drop_remainder=True, num_parallel_calls=AUTOTUNE, deterministic=False)
    return batches.prefetch(AUTOTUNE)


# ---- The device step and the timing loop ----------------------------------------------------------

def device_batches(strategy: tf.distribute.Strategy, dataset_fn: Callable) -> Iterable:
    """Run a step on the device(s) for each batch; yields (records, record bytes) the devices received.

    `dataset_fn(input_context)` builds each input pipeline (one per host) with
    the per-replica batch; `distribute_datasets_from_function` hands each
    replica its own batches.
    """
    distributed = strategy.distribute_datasets_from_function(dataset_fn)

    @tf.function
    def step(batch):
        def replica_step(batch):
            # Every pixel and label the device received goes into the result, so nothing is skipped.
            checksum = tf.reduce_mean(tf.cast(batch["image"], tf.float32))
            for key in ("label", "boxes", "classes"):  # a detection batch has boxes and classes instead of labels
                if key in batch:
                    checksum += tf.cast(tf.reduce_sum(batch[key]), tf.float32)
            return tf.shape(batch["image"])[0], tf.reduce_sum(batch["record_bytes"]), checksum

        records, stored_bytes, checksum = strategy.run(replica_step, args=(batch,))
        return records, stored_bytes, strategy.reduce(tf.distribute.ReduceOp.SUM, checksum, axis=None)

    for batch in distributed:
        records, stored_bytes, checksum = step(batch)
        checksum.numpy()  # wait for the step to finish on the device
        yield (sum(int(v) for v in strategy.experimental_local_results(records)),
               sum(int(v) for v in strategy.experimental_local_results(stored_bytes)))


def host_batches(make_dataset: Callable[[], tf.data.Dataset]) -> Iterable:
    """Yield (records, record bytes) of each batch a host pipeline delivers; built on the first pull."""
    for batch in make_dataset():
        record_bytes = batch["record_bytes"].numpy()
        yield int(record_bytes.shape[0]), int(np.sum(record_bytes, dtype=np.int64))


def time_stage(stage: str, batches: Iterable, max_batches: int = 0) -> StageResult:
    """Pull batches until the end (or `max_batches`) and time each; the first is warm-up."""
    result = StageResult(stage)
    start = time.perf_counter()
    previous = start
    for records, stored_bytes in batches:
        now = time.perf_counter()
        if result.batches == 0:
            result.time_to_first_batch_s = now - start
            result.first_batch_records, result.first_batch_bytes = records, stored_bytes
        else:
            result.batch_intervals_s.append(now - previous)
        previous = now
        result.records += records
        result.bytes += stored_bytes
        result.batches += 1
        if max_batches and result.batches >= max_batches:
            break
    return result


# ---- Errors ------------------------------------------------------------------------------------

def tf_message(error: tf.errors.OpError) -> str:
    """TensorFlow's message without its node names and context: one line."""
    text = re.sub(r"\{\{[^}]*\}\}", "", getattr(error, "message", None) or str(error))
    text = re.sub(r"^.*Iterator::[\w:]+: ", "", text.strip().splitlines()[0] if text.strip() else "")
    return text.strip().rstrip(".")


def find_corrupt_record(files: list[str]) -> tuple[str, str] | None:
    """The first (file, problem) whose TFRecord framing or checksums are broken, checked without TensorFlow."""
    from transforms.base.tfrecord import CorruptRecord, iter_records

    for path in files:
        try:
            for _ in iter_records(path):
                pass
        except CorruptRecord as e:
            return path, str(e)
    return None


def find_failing_record(files: list[str], compression: str, check: Callable) -> tuple[str, int] | None:
    """The first (file, record index) on which `check(record)` (TensorFlow ops) fails, or None."""
    for path in files:
        records = tf.data.TFRecordDataset(path, compression_type=compression).enumerate()
        checked = records.map(lambda i, record: (i, check(record))).ignore_errors()
        expected = 0
        for index, _ in checked.batch(1024).as_numpy_iterator():
            for i in index.tolist():
                if i != expected:
                    return path, expected
                expected += 1
        total = sum(1 for _ in tf.data.TFRecordDataset(path, compression_type=compression))
        if total != expected:
            return path, expected
    return None


def find_unparseable_record(files: list[str], compression: str) -> tuple[str, int] | None:
    """The first (file, record index) that does not parse as a tf.train.Example, or None."""
    spec = {"": tf.io.FixedLenFeature([], tf.string, default_value="")}  # parses the record, needs no key
    return find_failing_record(files, compression, lambda record: tf.io.parse_single_example(record, spec)[""])


def _not_examples(error: Exception) -> bool:
    """Whether a read failed on a record that is no Example: TensorFlow quotes such a record in its message, so
    one that is not UTF-8 surfaces as a UnicodeDecodeError instead of its InvalidArgumentError."""
    return isinstance(error, UnicodeDecodeError) or "Could not parse example input" in getattr(error, "message", "")


def explain_error(error: Exception, source: Source | None, files: list[str]) -> UserError:
    """A one-line user error for a failure while reading `files` (an OpError or a UnicodeDecodeError), naming
    the file, and the record where it can."""
    if _not_examples(error):
        found = find_unparseable_record(files, source.compression if source else "")
        where = f"{found[0]} record {found[1]}" if found else (files[0] if len(files) == 1 else "a file")
        if source is not None and source.split is None:
            return DatasetError(f"{where} is not a tf.train.Example (it does not parse): --file_pattern {source.name} "
                                "matches a file that is not a TFRecord of Examples; narrow the pattern")
        return DatasetError(f"{where} is not a tf.train.Example (it does not parse): the file was damaged after "
                            "the conversion; check the dataset with python -m pipeline.verify, then copy or convert "
                            "it again")
    message = tf_message(error)
    where = files[0] if len(files) == 1 else (source.name if source else "the input")
    if isinstance(error, tf.errors.DataLossError):
        path, problem = find_corrupt_record(files) or (where, message)
        return DatasetError(f"{path} is corrupt ({problem}); copy or convert it again")
    missing = re.search(r"Feature: (\S+) \(data type: (\w+)\) is required but could not be found", message)
    if missing:
        return DatasetError(
            f"the records in {where} have no {missing.group(2)} feature {missing.group(1)!r}; name their keys with "
            "--schema=default|tf_slim, or --image_key and --label_key (--label_key= for none)")
    if "is not compatible with expected shape" in message and source is not None:
        height, width = source.image_size
        return DatasetError(f"the images in {where} differ in size (expected {width}x{height}: {message}); pass "
                            "--image_size=N or WxH to resize them")
    if isinstance(error, tf.errors.InvalidArgumentError) and source is not None:
        # Name the record: the first one that does not parse with the source's keys, or whose image does not decode.
        def check(record):
            example = parse_record(record, source)
            return tf.shape(tf.io.decode_image(example["image"], channels=3, expand_animations=False))

        found = find_failing_record(files, source.compression, check)
        where = f"{found[0]} record {found[1]}" if found else where
    if isinstance(error, tf.errors.InvalidArgumentError) and re.search(r"image|JPEG|PNG|decode", message, re.I):
        return DatasetError(f"an image in {where} cannot be decoded ({message}); check --image_key, or verify "
                            "the dataset with python -m pipeline.verify")
    return DatasetError(f"reading {where} failed: {message}")
