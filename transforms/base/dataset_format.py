"""What a dataset folder is, without Apache Beam or TensorFlow: its file names, the shard-name scheme, the shard
formats, the schemas' keys, the split names, and the one loader and checker of its description.

    image_tfrecords.json                      this tool's description, and the completion marker (written last)
    labels.txt, errors.jsonl                  the class names; every rejected or skipped file with its reason
                                              (and, of a detection dataset, every annotation set aside)
    label_map.pbtxt                           a detection dataset's label map (the TF Object Detection API's)
    dataset_info.json, features.json,         TensorFlow Datasets' files (transforms/output/tfds_metadata.py), so that
    <label key>.labels.txt                    tfds.builder_from_directory loads the folder
    <split>-00000-of-00004.tfrecord[.gz]      the shards under their standard names (.array_record for ArrayRecord)
    <split>00-2071.tfrec[.gz]                 or Kaggle's (--shard_names=kaggle): the index and the record count
    <shard name without .tfrecord>.idx        --index_files: each shard's index, beside it
    sources-<run id>-00000-of-00002.jsonl     every record's source path, SHA-256, split and label, one JSON
                                              list a line, per run that added records (--if_exists=append)
    .image-tfrecords.lock, .image-tfrecords-tmp/   the lock, the runs' temporary folders (transforms/output/)

The converter (transforms/, pipeline/), the Dataflow code and the read-side tools (pipeline/readers/) all take
these names from here; the read side needs nothing else of the converter's, so it runs where Beam is not
installed. `tests/test_architecture.py` checks that this module imports neither.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from transforms.base import bounded

# -- the files ------------------------------------------------------------------------------------------------------

INFO_FILE = "image_tfrecords.json"  # this tool's description of the dataset, the completion marker: written last
LABELS_FILE = "labels.txt"
ERRORS_FILE = "errors.jsonl"
TFDS_INFO_FILE = "dataset_info.json"  # TFDS's DatasetInfo
FEATURES_FILE = "features.json"  # TFDS's feature config
TFDS_LABELS_SUFFIX = ".labels.txt"  # TFDS's ClassLabel names: <label key>.labels.txt
LABEL_MAP_FILE = "label_map.pbtxt"  # a detection dataset's class ids, in the TF Object Detection API's text format
# Format version 1's description, under the name TFDS owns now: a folder holding one (with a format_version) is a
# complete dataset of that version.
LEGACY_INFO_FILE = "dataset_info.json"
# 2: the description moved from dataset_info.json to image_tfrecords.json; dataset_info.json and features.json are
# TFDS's now. Its fields are version 1's, plus "tfds".
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # the read-side tools read a version-1 folder's dataset_info.json as its description

# The converter's defaults of --max_pixels and --max_image_mb, which a reader applies to a description that does
# not record them (transforms.images.settings.ImageSettings takes its defaults from here).
DEFAULT_MAX_PIXELS = 178_956_970  # Pillow's own bomb limit: ~537 MB of RGB pixels
DEFAULT_MAX_IMAGE_MB = 512

# Everything temporary lives in this one folder, which this tool alone writes.
TEMP_DIR = ".image-tfrecords-tmp"
LOCK_FILE = ".image-tfrecords.lock"
# In a run's temporary folder: the descriptions, written before publishing, and the plan of the publishing.
PUBLISH_DIR = "publish"
PUBLISH_PLAN = "publishing.json"
# In the temporary folder of a run that converted no image: its errors.jsonl and image_tfrecords.json, never
# published (a failed run publishes nothing), for the launcher's summary and the user; the next run removes them.
UNPUBLISHED_DIR = "unpublished"

# -- the schemas: the keys of each record ----------------------------------------------------------------------------

# Each maps a logical field to (key, dtype) with dtype one of 'bytes', 'int64', 'string' (a UTF-8 bytes feature).
# `sha256` is the hex SHA-256 of the source file's bytes (as read, before decoding); datasets written before it was
# added lack the key (OPTIONAL_FIELDS).
SCHEMAS: dict[str, dict[str, tuple[str, str]]] = {
    # The seed cheat sheet's keys, plus what a user needs to trace a record back.
    "default": {
        "image": ("image", "bytes"),
        "label": ("label", "int64"),
        "class_name": ("class_name", "string"),
        "height": ("height", "int64"),
        "width": ("width", "int64"),
        "source_path": ("source_path", "string"),
        "sha256": ("sha256", "string"),
    },
    # The keys TensorFlow's reference image models (TF-Slim, the TPU ResNet) read.
    "tf_slim": {
        "image": ("image/encoded", "bytes"),
        "format": ("image/format", "string"),
        "label": ("image/class/label", "int64"),
        "class_name": ("image/class/text", "string"),
        "height": ("image/height", "int64"),
        "width": ("image/width", "int64"),
        "source_path": ("image/filename", "string"),
        "sha256": ("image/key/sha256", "string"),
    },
    # The keys Kaggle's TPU notebooks parse (Flower Classification with TPUs and its forks): `image`, `class`
    # and `id` (the file name without its extension), plus this tool's own keys for verify and the reader.
    "kaggle": {
        "image": ("image", "bytes"),
        "label": ("class", "int64"),
        "id": ("id", "string"),
        "class_name": ("class_name", "string"),
        "height": ("height", "int64"),
        "width": ("width", "int64"),
        "source_path": ("source_path", "string"),
        "sha256": ("sha256", "string"),
    },
}
# --task: what a record holds. A detection dataset's description says "task": "detection"; a classification one
# has no "task" key (read as CLASSIFICATION).
CLASSIFICATION, DETECTION = "classification", "detection"
TASKS = (CLASSIFICATION, DETECTION)
# The schema of detection records (--task=detection): the keys of the TF Object Detection API, TF Model Garden's
# TfExampleDecoder and TFDS (transforms/detection/records.py writes them). dtype 'float' is a float feature. The
# object fields are lists, one value per object (DETECTION_OBJECT_FIELDS); the mask fields are in the records of a
# dataset whose description says so ("detection": {"instance_masks": true} / {"semantic_masks": true}).
SCHEMAS[DETECTION] = {
    "image": ("image/encoded", "bytes"),
    "format": ("image/format", "string"),
    "height": ("image/height", "int64"),
    "width": ("image/width", "int64"),
    "source_path": ("image/filename", "string"),
    "source_id": ("image/source_id", "string"),
    "sha256": ("image/key/sha256", "string"),
    "xmin": ("image/object/bbox/xmin", "float"),
    "ymin": ("image/object/bbox/ymin", "float"),
    "xmax": ("image/object/bbox/xmax", "float"),
    "ymax": ("image/object/bbox/ymax", "float"),
    "label": ("image/object/class/label", "int64"),
    "class_name": ("image/object/class/text", "string"),
    "area": ("image/object/area", "float"),
    "is_crowd": ("image/object/is_crowd", "int64"),
    "difficult": ("image/object/difficult", "int64"),
}
DETECTION_OBJECT_FIELDS = ("xmin", "ymin", "xmax", "ymax", "label", "class_name", "area", "is_crowd", "difficult")
# With instance masks: one single-channel 0/1 PNG per object; with semantic masks: one PNG of class ids per image
# (and its format), in the records of the images that have one.
DETECTION_INSTANCE_MASK = {"mask": ("image/object/mask", "bytes")}
DETECTION_SEMANTIC_MASK = {"segmentation": ("image/segmentation/class/encoded", "bytes"),
                           "segmentation_format": ("image/segmentation/class/format", "string")}
# TFDS's view of the same objects, written beside the OD API's keys in every detection record: TFDS's own detection
# datasets (coco, voc) hold objects/bbox (a BBoxFeature: 4 floats per object, [ymin, xmin, ymax, xmax] normalised, under
# one key, which the OD API's four keys cannot be described as), objects/label (a ClassLabel: 0-based, labels.txt's
# line, whatever first_id is), objects/is_crowd (coco's) and objects/is_difficult (voc's), read as booleans.
# features.json describes them as `objects`, a Sequence (transforms/output/tfds_metadata.py).
DETECTION_TFDS_OBJECTS = {"tfds_bbox": ("objects/bbox", "float"), "tfds_label": ("objects/label", "int64"),
                          "tfds_is_crowd": ("objects/is_crowd", "int64"),
                          "tfds_is_difficult": ("objects/is_difficult", "int64")}
# The schemas --schema offers (a classification dataset's); --task=detection writes DETECTION's.
CLASSIFICATION_SCHEMAS = tuple(name for name in SCHEMAS if name != DETECTION)


def detection_fields(instance_masks: bool = False, semantic_masks: bool = False) -> dict[str, tuple[str, str]]:
    """The fields a detection record holds, {field: (key, dtype)}: DETECTION's, and the masks' when written."""
    return {**SCHEMAS[DETECTION], **DETECTION_TFDS_OBJECTS, **(DETECTION_INSTANCE_MASK if instance_masks else {}),
            **(DETECTION_SEMANTIC_MASK if semantic_masks else {})}


# Fields that older datasets lack: a reader gives them a default ('') instead of failing.
OPTIONAL_FIELDS = frozenset({"sha256"})
MULTI_LABEL_FIELDS = ("label", "class_name")  # lists of any length with --multi_label
LABEL_FIELDS = ("label", "class_name")  # what an unlabeled set's records (--unlabeled) do not have
ID_KEY = "id"  # the key of an unlabeled set's `id` under a schema that has none (every schema but kaggle)


def record_fields(schema: str = "default", unlabeled: bool = False) -> dict[str, tuple[str, str]]:
    """The fields a record holds under `schema`, {field: (key, dtype)}: SCHEMAS' own, or for an unlabeled set
    (--unlabeled) those without the label and class_name and with an `id` (key ID_KEY unless the schema has one).
    """
    fields = SCHEMAS[schema]
    if not unlabeled:
        return fields
    return {**{name: field for name, field in fields.items() if name not in LABEL_FIELDS},
            "id": fields.get("id", (ID_KEY, "string"))}


def tfds_labels_file(schema: str) -> str:
    """The file that holds TFDS's ClassLabel names, as TFDS finds it: the label key, '/' as '-' (a nested feature);
    a detection dataset's is objects/label's (objects-label.labels.txt)."""
    key = DETECTION_TFDS_OBJECTS["tfds_label"][0] if schema == DETECTION else SCHEMAS[schema]["label"][0]
    return key.replace("/", "-") + TFDS_LABELS_SUFFIX


TFDS_LABELS_FILES = tuple(sorted({tfds_labels_file(schema) for schema in SCHEMAS}))
# In the order they are published.
DESCRIPTION_FILES = (ERRORS_FILE, LABELS_FILE, LABEL_MAP_FILE, *TFDS_LABELS_FILES, FEATURES_FILE, TFDS_INFO_FILE,
                     INFO_FILE)

# -- the splits -----------------------------------------------------------------------------------------------------

SPLITS = ("train", "validation", "test")
# The names that stand for a split, in a split folder's name and in a manifest's split column alike: matched
# case-insensitively, with '-', '.' and ' ' read as '_' (Training_Set, test-set), as Kaggle and course datasets
# ship them.
SPLIT_NAMES = {
    **dict.fromkeys(("train", "training", "train_set", "training_set", "trainset", "trainingset", "train_data",
                     "training_data"), "train"),
    **dict.fromkeys(("validation", "valid", "val", "dev", "validation_set", "valid_set", "val_set", "dev_set",
                     "validation_data", "valid_data", "val_data"), "validation"),
    **dict.fromkeys(("test", "testing", "test_set", "testing_set", "testset", "test_data", "testing_data"), "test"),
}


def split_of(name: str) -> str | None:
    """The split a name stands for ('training_set' -> 'train', 'Valid' -> 'validation'), or None for another."""
    return SPLIT_NAMES.get(re.sub(r"[-. ]", "_", name.lower()))


# -- the shards: formats, names and their parsers -------------------------------------------------------------------

TFRECORD, ARRAY_RECORD = "tfrecord", "array_record"
STANDARD, KAGGLE = "standard", "kaggle"
SHARD_NAMES = (STANDARD, KAGGLE)
COMPRESSIONS = ("none", "gzip")


@dataclass(frozen=True)
class ShardFormat:
    """One shard file format: its suffixes (standard and Kaggle names, gzip or not), TFDS's name for it, and what
    it allows. Every "which format" question asks this record, not the format's name; the writers and readers
    themselves (TensorFlow's, array_record's) are chosen by name in transforms/output/shardfiles.py and
    transforms/base/tfrecord.py."""

    name: str
    suffix: str  # of a standard name
    kaggle_suffix: str
    gzip: bool  # whether --compression=gzip applies (it adds .gz)
    tfds_format: str  # TFDS's FileFormat name
    concatenates: bool  # files of it joined end to end are one file of it: a shard can be written in chunks
    tf_data: bool  # tf.data reads it (the reader's make_dataset, the benchmark)
    index_files: bool  # --index_files applies (byte offsets of the records, for uncompressed shards)
    package: str | None = None  # the module that writes and reads it, when not TensorFlow

    def suffix_for(self, compression: str, kaggle: bool = False) -> str:
        suffix = self.kaggle_suffix if kaggle else self.suffix
        return suffix + ".gz" if self.gzip and compression == "gzip" else suffix


SHARD_FORMATS = {
    TFRECORD: ShardFormat(TFRECORD, ".tfrecord", ".tfrec", gzip=True, tfds_format="tfrecord", concatenates=True,
                          tf_data=True, index_files=True),
    ARRAY_RECORD: ShardFormat(ARRAY_RECORD, ".array_record", ".array_record", gzip=False, tfds_format="array_record",
                              concatenates=False, tf_data=False, index_files=False, package="array_record"),
}
FILE_FORMATS = tuple(SHARD_FORMATS)


def shard_suffix(compression: str, file_format: str = TFRECORD) -> str:
    return SHARD_FORMATS[file_format].suffix_for(compression)


def shard_name(split: str, index: int, count: int, compression: str, file_format: str = TFRECORD) -> str:
    """The standard name of shard `index` of `count`: train-00000-of-00004.tfrecord."""
    return f"{split}-{index:05d}-of-{count:05d}{shard_suffix(compression, file_format)}"


def kaggle_name(split: str, index: int, count: int, records: int, compression: str,
                file_format: str = TFRECORD) -> str:
    """Kaggle's name of shard `index` of `count` holding `records` records: train00-2071.tfrec.

    Kaggle's TPU notebooks count a dataset's records from its file names (`count_data_items` parses `-(\\d+)\\.`).
    The index has at least two digits, and as many as the split's last index needs, so that the names sort in
    shard order.
    """
    width = max(2, len(str(count - 1)))
    return f"{split}{index:0{width}d}-{records}{SHARD_FORMATS[file_format].suffix_for(compression, kaggle=True)}"


def index_name(shard_file: str) -> str:
    """The index file of a shard: its name without .tfrecord (or .tfrec), plus .idx (train-00000-of-00004.idx).

    Not `<shard>.tfrecord.idx`: the shard glob `train-*.tfrecord*` would read it as a shard.
    """
    for suffix in (SHARD_FORMATS[TFRECORD].suffix, SHARD_FORMATS[TFRECORD].kaggle_suffix):
        if shard_file.endswith(suffix):
            return shard_file[:-len(suffix)] + ".idx"
    return shard_file + ".idx"


def _suffixes(kaggle: bool) -> str:
    """The suffixes of one kind of name, as a regular expression: (?:tfrecord(?:\\.gz)?|array_record)."""
    parts = [(f.kaggle_suffix if kaggle else f.suffix)[1:] + (r"(?:\.gz)?" if f.gzip else "")
             for f in SHARD_FORMATS.values()]
    return r"\.(?:" + "|".join(parts) + ")"


_SPLITS = "|".join(SPLITS)
SHARD_NAME = re.compile(r"(?P<split>" + _SPLITS + r")-(?P<index>\d{5,})-of-(?P<count>\d{5,})" + _suffixes(False))
KAGGLE_NAME = re.compile(r"(?P<split>" + _SPLITS + r")(?P<index>\d{2,})-(?P<records>\d+)" + _suffixes(True))
# --index_files: a shard's index for DALI and the tfrecord package, beside it (train-00000-of-00004.idx,
# train00-2071.idx).
INDEX_NAME = re.compile(r"(?:" + _SPLITS + r")(?:-\d{5,}-of-\d{5,}|\d{2,}-\d+)\.idx")


# Each run's list of the records it added: [relpath, sha256, split, label] per line (`--if_exists=append` reads
# them to tell which images a dataset already holds, without reading a shard). Not matched by any shard glob.
SOURCES_PREFIX = "sources-"
SOURCES_SUFFIX = ".jsonl"
SOURCES_NAME = re.compile(r"sources-[\w.-]+-\d{5}-of-\d{5}\.jsonl")


# The reason in errors.jsonl of a file whose path the dataset holds with other bytes: an append keeps the record.
CHANGED_SINCE_DATASET = "changed_since_dataset"


def parse_source_line(line: str):
    """A sources line -> (relpath, (sha256, split, label)); None for a line that is not one (never trusted)."""
    try:
        relpath, sha256, split, label = bounded.loads(line)
    except (ValueError, TypeError):
        return None
    if not (isinstance(relpath, str) and isinstance(sha256, str) and isinstance(split, str)):
        return None
    return relpath, (sha256, split, tuple(label) if isinstance(label, list) else label)


def sources_prefix(run_id: str) -> str:
    """The start of a run's sources files' names (Beam adds -00000-of-00002.jsonl)."""
    return f"{SOURCES_PREFIX}{run_id}"


def is_shard_name(name: str) -> bool:
    """Whether `name` is a shard's name as this tool names shards (standard or Kaggle's)."""
    return bool(SHARD_NAME.fullmatch(name) or KAGGLE_NAME.fullmatch(name))


def shard_globs(split: str) -> list[str]:
    """The globs that readers use to find a split's shards, which must match only the listed ones
    (`<split>-*.tfrecord*`, Kaggle's `<split>*.tfrec`, `<split>*.tfrec.gz`, `<split>*.array_record`)."""
    tfrecord, array_record = SHARD_FORMATS[TFRECORD], SHARD_FORMATS[ARRAY_RECORD]
    return [f"{split}-*{tfrecord.suffix}*", f"{split}*{tfrecord.kaggle_suffix}", f"{split}*{tfrecord.kaggle_suffix}.gz",
            f"{split}*{array_record.suffix}"]


def format_of_shard(name: str) -> str:
    """The shard format of a shard file, by its name (array_record for .array_record; else tfrecord)."""
    return ARRAY_RECORD if name.endswith(SHARD_FORMATS[ARRAY_RECORD].suffix) else TFRECORD


# TFDS's variables: {SPLIT} and {SHARD_X_OF_Y} (00000-of-00004), as this tool names its shards.
TFDS_SHARD_TEMPLATE = "{SPLIT}-{SHARD_X_OF_Y}.tfrecord"


def tfds_shard_template(extension: str = TFRECORD) -> str:
    return TFDS_SHARD_TEMPLATE.replace(".tfrecord", "." + extension)


# -- the description: the one loader and checker ---------------------------------------------------------------------


class DescriptionError(ValueError):
    """A folder's description is missing, unreadable or malformed: the message says which, and what to do."""


def find_description(folder: str, read_text: Callable[[str], str | None]) -> tuple[str, str] | None:
    """(path, text) of the description of the dataset in `folder`, None when there is no complete dataset there.

    image_tfrecords.json; or, for a dataset of format version 1, its dataset_info.json (this tool's format, with
    a format_version, not TFDS's). `read_text(path)` gives a file's text, None when it does not exist: Beam's file
    systems on the converter's side, plain files or tf.io.gfile on the read side.
    """
    path = join(folder, INFO_FILE)
    text = read_text(path)
    if text is not None:
        return path, text
    legacy = join(folder, LEGACY_INFO_FILE)
    text = read_text(legacy)
    return (legacy, text) if is_legacy_description(text) else None


def is_legacy_description(text: str | None) -> bool:
    """Whether `text` (a dataset_info.json's) is this tool's format-version-1 description, not TFDS's file."""
    info = None if text is None else parse_description(text, LEGACY_INFO_FILE, check=False, lenient=True)
    return isinstance(info, dict) and info.get("format_version") == 1


def parse_description(text: str, path: str = INFO_FILE, check: bool = True, lenient: bool = False):
    """The parsed description in `text` (read from `path`), checked (`check_description`) when `check`.

    `lenient`: None instead of a DescriptionError for text that is not JSON (what the converter's own bookkeeping
    wants: a damaged description is no dataset of this run's).
    """
    try:
        info = bounded.loads(text)
    except ValueError as e:
        if lenient:
            return None
        raise DescriptionError(f"{path} is not readable JSON ({e}); convert again") from None
    return check_description(info, path) if check else info


def load_description(folder: str, read_text: Callable[[str], str | None]) -> dict:
    """The parsed and checked description of `folder`'s dataset (`find_description`, `check_description`).

    Raises:
        DescriptionError: when there is no complete dataset there, or its description is unreadable or malformed.
    """
    found = find_description(folder, read_text)
    if found is None:
        raise DescriptionError(
            f"{folder} has no {INFO_FILE}: it is not a complete dataset (an interrupted conversion leaves "
            "none); convert again with python -m pipeline.main")
    return parse_description(found[1], found[0])


def join(directory: str, name: str) -> str:
    """`name` in the folder `directory` (local or gs://)."""
    return directory.rstrip("/") + "/" + name


_JSON_TYPES = ((type(None), "null"), (bool, "a boolean"), (int, "a number"), (float, "a number"),
               (str, "a string"), (list, "a list"), (dict, "an object"))
_KINDS = {
    "an object": lambda v: isinstance(v, dict),
    "a list": lambda v: isinstance(v, list),
    "a string": lambda v: isinstance(v, str),
    "a count": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "a size": lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
    "a boolean": lambda v: isinstance(v, bool),
    "0 or 1": lambda v: v in (0, 1) and not isinstance(v, bool),
}
_MISSING = object()


def _shown(value) -> str:
    """A JSON value as a message names it: a number by its value, anything else by its type."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value)
    return next(name for kind, name in _JSON_TYPES if isinstance(value, kind))


def check_description(info, path: str = INFO_FILE) -> dict:
    """`info` if it has every field the read-side tools use, each of its JSON type; else a DescriptionError
    naming it."""
    tail = "it was not written by this tool; convert again"
    if not isinstance(info, dict):
        raise DescriptionError(f"{path} is not a JSON object but {_shown(info)}: {tail}")
    if "format_version" in info and info["format_version"] not in READABLE_VERSIONS:
        raise DescriptionError(f"{path} has format version {info['format_version']!r}, but this reader reads "
                               f"versions {', '.join(map(str, READABLE_VERSIONS))}: convert again")
    required = ("format_version", "splits", "image", "schema", "class_names", "compression")
    missing = [key for key in required if key not in info]
    if missing:
        raise DescriptionError(f"{path} lacks {', '.join(missing)}: {tail}")

    def need(parent: dict, key, where: str, kind: str, default=_MISSING):
        """parent[key], which must be of `kind`; `default` when it is absent and may be."""
        value = parent.get(key, default) if isinstance(parent, dict) else parent[key]
        if value is _MISSING:
            raise DescriptionError(f"{path} lacks {where}: {tail}")
        if not _KINDS[kind](value):
            raise DescriptionError(f"{path} is malformed ({where} is {_shown(value)}, not {kind}): {tail}")
        return value

    def file_name(shard: dict, key: str, where: str) -> None:
        name = need(shard, key, where, "a string")
        if not name or "/" in name or name in (".", ".."):
            raise DescriptionError(f"{path} is malformed ({where} {name!r} is not a file name in the folder): {tail}")

    if need(info, "schema", "schema", "a string") not in SCHEMAS:
        raise DescriptionError(f"{path} is malformed (schema {info['schema']!r} is not one of "
                               f"{', '.join(SCHEMAS)}): {tail}")
    need(info, "compression", "compression", "a string")
    names = need(info, "class_names", "class_names", "a list")
    for i in range(len(names)):
        need(names, i, f"class_names[{i}]", "a string")
    image = need(info, "image", "image", "an object")
    if image.get("fixed_size"):
        for key in ("height", "width"):
            need(image, key, f"image.{key}", "a size")
    for key in ("rejected_by_reason", "skipped_by_reason"):
        for name in need(info, key, key, "an object", {}):
            need(info[key], name, f"{key}.{name}", "a count")
    files = need(info, "files", "files", "an object", {})
    for name in ("found", "written", "rejected", "skipped"):
        if files.get(name) is not None:  # verify reports a missing count as a problem of its own
            need(files, name, f"files.{name}", "a count")
    for split in need(info, "splits", "splits", "an object"):
        where = f"splits.{split}"
        split_info = need(info["splits"], split, where, "an object")
        need(split_info, "records", f"{where}.records", "a count")
        counts = need(split_info, "class_counts", f"{where}.class_counts", "an object", {})
        for name in counts:
            need(counts, name, f"{where}.class_counts.{name}", "a count")
        shards = need(split_info, "shards", f"{where}.shards", "a list")
        for number in range(len(shards)):
            shard = need(shards, number, f"{where}.shards[{number}]", "an object")
            file_name(shard, "file", f"{where}.shards[{number}].file")
            need(shard, "records", f"{where}.shards[{number}].records", "a count")
            need(shard, "bytes", f"{where}.shards[{number}].bytes", "a count")
            if "index" in shard:
                file_name(shard, "index", f"{where}.shards[{number}].index")
    task = info.get("task", CLASSIFICATION)
    if task not in TASKS:
        raise DescriptionError(f"{path} is malformed (task {task!r} is not one of {', '.join(TASKS)}): {tail}")
    if task == DETECTION:
        _check_detection(info, need)
    return info


def _check_detection(info: dict, need) -> None:
    """The "detection" section of a detection dataset's description (see docs/detection.md)."""
    detection = need(info, "detection", "detection", "an object")
    need(detection, "first_id", "detection.first_id", "0 or 1")
    for key in ("instance_masks", "semantic_masks"):
        need(detection, key, f"detection.{key}", "a boolean")
    need(detection, "input_format", "detection.input_format", "a string")
    need(detection, "objects_per_image_max", "detection.objects_per_image_max", "a count")
    annotations = need(detection, "annotations", "detection.annotations", "an object")
    for key in ("found", "written"):
        need(annotations, key, f"detection.annotations.{key}", "a count")
    rejected = need(annotations, "rejected", "detection.annotations.rejected", "an object")
    for reason in rejected:
        need(rejected, reason, f"detection.annotations.rejected.{reason}", "a count")
    images = need(detection, "images_without_objects", "detection.images_without_objects", "an object")
    for key in ("kept", "dropped"):
        need(images, key, f"detection.images_without_objects.{key}", "a count")
