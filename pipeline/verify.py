"""Check a converted dataset end to end: checksums, Examples, labels, images, counts, duplicates, accounting.

    python -m pipeline.verify tfrecords/                  # exit 0: all good, 1: problems listed, 2: not a dataset
    python -m pipeline.verify gs://bucket/tfrecords/ --no_decode

Every shard is read back record by record (TFRecord CRCs; ArrayRecord shards
through ArrayRecord's reader), every Example is parsed with the reader
helper's feature spec and, unless --no_decode, every image is decoded as a
training job would decode it. Counts are compared with image_tfrecords.json per
shard, per split and per class, and the files section must satisfy
found = written + rejected + skipped, with one errors.jsonl line per rejected
or skipped file. Every file in the folder that a shard glob
(`<split>-*.tfrecord*`, Kaggle's `<split>*.tfrec`, `<split>*.array_record`)
matches but image_tfrecords.json does not list is a problem: a reader that globs
would read it. A dataset of 0 records is a problem too. A record that is not an
Example is named and reading goes on. A Kaggle name (--shard_names=kaggle) must
give its shard's true record count.
Index files (--index_files) must match their shards line for line: a missing,
wrong or stale index is a problem, and so is an index named like one of this
tool's whose shard is not in the dataset. TFDS's files (dataset_info.json,
features.json, label.labels.txt) must say what image_tfrecords.json says.

A detection dataset ("task": "detection") has every object of every record checked too: its box in [0, 1] with
xmin < xmax and ymin < ymax, its class id one of the dataset's (from its first_id) and its class text that class's
name, its mask (with instance masks) a 0/1 PNG of the stored size, a semantic mask a PNG of class ids or 255; the
objects per class and split against image_tfrecords.json's class_counts, and its "detection" section: annotations
found = written + rejected (errors.jsonl's 'annotation' lines, per reason), the objects written, the images without
objects and the most objects of an image as the records hold them; TFDS's keys of each record (objects/bbox,
objects/label, ...) must hold the same objects as the OD API's (objects/label = image/object/class/label - first_id).

Duplicates are counted as the conversion counts them: groups of records whose source files have
the same SHA-256 (stored in every record), within a split, across splits (leakage) or under
different labels (a conflict), in the conversion's words, and checked against image_tfrecords.json's
"duplicates"; they fail verify only with --fail_on_duplicates. A dataset written before records
carried the hash is grouped by a 64-bit fingerprint of each image's decoded pixels (with
--no_decode, of its encoded bytes). Stored images equal pixel for pixel from different source
files are one more warning. Neither finds near-duplicates (a re-saved JPEG, a crop, a resize).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import struct
import sys
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pipeline import reader
from pipeline.cli import import_tensorflow, main_of, program_name
from pipeline.errors import DatasetError
from pipeline.readers import detection
from transforms.base import bounded
from transforms.base import duplicate_kinds as duplicates
from transforms.base.dataset_format import (
    CHANGED_SINCE_DATASET,
    DETECTION,
    ERRORS_FILE,
    INDEX_NAME,
    INFO_FILE,
    KAGGLE_NAME,
    LABEL_MAP_FILE,
    LABELS_FILE,
    SHARD_NAME,
    SOURCES_NAME,
    SPLITS,
    TFDS_INFO_FILE,
    TFDS_LABELS_SUFFIX,
    index_name,
    join,
    parse_source_line,
    shard_globs,
)
from transforms.base.examples import Example, record_id
from transforms.base.paths import list_files
from transforms.base.tfrecord import CorruptRecord, record_offsets, scan_shard
from transforms.output import tfds_metadata

# Problems kept per shard; a systematically broken shard would otherwise list every record.
_PROBLEMS_PER_SHARD = 50
_CHUNK = 256  # records per tf.data pass
_UNIT = "\x1f"  # between the class names of a --multi_label record, as verify joins them
_MAGIC = {"jpeg": (b"\xff\xd8\xff",), "png": (b"\x89PNG\r\n\x1a\n",)}


@dataclass
class _ShardResult:
    """What one shard holds, as read back."""

    split: str
    name: str
    records: int = 0
    unread: int = 0  # records whose class is unknown: bad checksum or not an Example
    readable: bool = True
    class_counts: Counter = field(default_factory=Counter)
    without_labels: int = 0  # --multi_label: records of no class
    problems: list[str] = field(default_factory=list)
    omitted: int = 0
    # (record index, source path, content key or None when the image cannot be read, class name or, with
    # --multi_label, the list of them, the source file's SHA-256 or '' in a dataset written before records
    # carried it)
    entries: list[tuple[int, str, bytes | None, str | list[str], str]] = field(default_factory=list)
    _numbered: list[tuple[int, str]] = field(default_factory=list)
    damaged: dict[int, str] = field(default_factory=dict)  # record index -> why its JPEG data is damaged
    # a detection dataset's: objects read, records without objects, the most objects of one record
    objects: int = 0
    without_objects: int = 0
    most_objects: int = 0
    class_images: Counter = field(default_factory=Counter)  # records holding an object of the class

    def problem(self, index: int | None, text: str) -> None:
        if index is None or len(self._numbered) < _PROBLEMS_PER_SHARD:
            where = self.name if index is None else f"{self.name} record {index}"
            self._numbered.append((-1 if index is None else index, f"{where}: {text}"))
        else:
            self.omitted += 1

    def finish(self) -> None:
        """Put the problems and entries in record order (records checked one by one come last)."""
        self.problems = [text for _, text in sorted(self._numbered, key=lambda item: item[0])]
        self.entries.sort(key=lambda entry: entry[0])


class _RecordChecker:
    """Parses and decodes records with the reader helper (TensorFlow), many at a time in tf.data.

    A chunk of records goes through one parallel tf.data map that keeps only
    small facts per record (label, names, sizes, a fingerprint of the pixels);
    records the map cannot parse or decode are then checked one by one, for
    the decoder's own message.
    """

    def __init__(self, info: dict, labels: list[str], decode: bool):
        import tensorflow as tf

        self._tf = tf
        self._labels = labels
        self._decode = decode
        self._budget = reader.decode_budget(info)  # an image is measured from its header before it is decoded
        self._image_key = reader.image_label_keys(info["schema"])[0]
        image = info["image"]
        self._format = image.get("format")
        self._fixed = (image["height"], image["width"]) if image.get("fixed_size") else None
        schema = info["schema"]
        extras = reader.extra_features(info)  # --features: each record must parse with its recorded types
        self._multi = multi = bool(info.get("multi_label"))
        self._unlabeled = unlabeled = bool(info.get("unlabeled"))  # an id per record instead of a label
        # a detection record's classes are its objects', checked from its Example (`_check_objects`)
        self._detection = info.get("task") == DETECTION
        self._first_id, self._instance_masks, self._semantic_masks = detection.detection_settings(info)
        self._most_objects = (info.get("detection") or {}).get("objects_per_image_max")
        self._tfds_objects = self._detection and detection.has_tfds_objects(info)
        told_by = ("id",) if unlabeled else () if self._detection else ("label", "class_name")

        def summarise(index, serialized, decode):
            fields = reader.parse_example(serialized, schema, decode=False, multi_label=multi, extras=extras,
                                          unlabeled=unlabeled)
            facts = {key: fields[key] for key in (*told_by, "source_path", "height", "width", "sha256")}
            if multi:  # lists of any length, as one string each so that a chunk batches
                facts["label"] = tf.strings.reduce_join(tf.strings.as_string(fields["label"]), separator=",")
                facts["class_name"] = tf.strings.reduce_join(fields["class_name"], separator=_UNIT)
            facts["index"] = index
            facts["head"] = tf.strings.substr(fields["image"], 0, 8)
            facts["format"] = fields["format"] if "format" in fields else tf.constant(self._format or "")
            if decode:
                pixels = reader.parse_example(serialized, schema, decode=True, multi_label=multi,
                                              unlabeled=unlabeled)["image"]
                facts["shape"] = tf.shape(pixels, out_type=tf.int64)
                facts["fingerprint"] = tf.fingerprint(tf.reshape(pixels, [1, -1]))[0]
            else:
                facts["shape"] = tf.constant([-1, -1, -1], tf.int64)
                facts["fingerprint"] = tf.fingerprint(tf.reshape(fields["image"], [1]))[0]
            return facts

        signature = [tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.string)]
        # Traced once, not once per chunk's tf.data map.
        self._summarise = tf.function(lambda i, s: summarise(i, s, decode), input_signature=signature)
        self._one_parsed = tf.function(lambda i, s: summarise(i, s, False), input_signature=signature)
        self._one_decoded = tf.function(lambda i, s: summarise(i, s, True), input_signature=signature)

    def check_shard(self, split: str, path: str) -> _ShardResult:
        result = _ShardResult(split, path.rsplit("/", 1)[-1])
        chunk = []
        try:
            for index, data in scan_shard(path):
                result.records += 1
                if data is None:
                    result.unread += 1
                    result.problem(index, "data checksum mismatch (the record's bytes are corrupt)")
                    continue
                if self._detection:
                    self._check_objects(result, index, data)
                image = reader.record_image(data, self._image_key) if self._decode else None
                too_large = image is not None and reader.image_too_large(image, self._budget)
                if too_large:  # checked without decoding, as --no_decode checks every record
                    self._check_one(result, index, data, too_large)
                    continue
                damage = image is not None and reader.jpeg_damage(image)
                if damage:  # a problem once TensorFlow's decoder takes it (with a warning); else its error is
                    result.damaged[index] = damage
                chunk.append((index, data))
                if len(chunk) == _CHUNK:
                    self._check_chunk(result, chunk)
                    chunk = []
        except CorruptRecord as e:
            result.readable = False
            result.problem(None, str(e))
        except Exception as e:  # the file vanished or cannot be opened
            result.readable = False
            result.problem(None, f"cannot be read ({type(e).__name__}: {e})")
        if chunk:  # also the records before a break in the file
            self._check_chunk(result, chunk)
        result.finish()
        return result

    def _check_chunk(self, result: _ShardResult, chunk: list[tuple[int, bytes]]) -> None:
        tf = self._tf
        indices = tf.constant([index for index, _ in chunk], tf.int64)
        records = tf.constant([data for _, data in chunk], tf.string)
        facts = (
            tf.data.Dataset.from_tensor_slices((indices, records))
            .map(self._summarise, num_parallel_calls=tf.data.AUTOTUNE)
            .ignore_errors()  # such records are checked one by one below
            .batch(len(chunk))
        )
        checked = set()
        for batch in facts.as_numpy_iterator():
            for j in range(len(batch["index"])):
                row = {key: values[j] for key, values in batch.items()}
                checked.add(int(row["index"]))
                self._check_facts(result, row, decoded=self._decode)
        for index, data in chunk:
            if index not in checked:
                self._check_one(result, index, data)

    def _check_one(self, result: _ShardResult, index: int, data: bytes, too_large: str | None = None) -> None:
        """One record, parsed and (unless --no_decode or `too_large`, why its image must not be decoded) decoded."""
        tf = self._tf
        args = (tf.constant(index, tf.int64), tf.constant(data))
        decode_error = None
        errors = (tf.errors.OpError, UnicodeDecodeError)  # see reader.error_text
        if self._decode and not too_large:
            try:
                row = {k: v.numpy() for k, v in self._one_decoded(*args).items()}
                self._check_facts(result, row, decoded=True)
                return
            except errors as e:
                decode_error = reader.error_text(e)
        try:
            row = {k: v.numpy() for k, v in self._one_parsed(*args).items()}
        except errors as e:
            result.unread += 1
            result.problem(index, f"not a valid Example: {reader.error_text(e)}")
            return
        if decode_error:
            result.problem(index, f"the image cannot be decoded: {decode_error}")
        if too_large:
            result.problem(index, too_large)
        self._check_facts(result, row, decoded=False, content=not (decode_error or too_large))

    def _check_objects(self, result: _ShardResult, index: int, data: bytes) -> None:
        """A detection record's objects (`detection.object_problems`), counted per class; a record that is no
        Example is left to the parse, which names it."""
        try:
            feature = Example.FromString(data).features.feature
        except Exception:  # noqa: BLE001 - not an Example: the parse names it
            return
        size = [feature[key].int64_list.value for key in ("image/height", "image/width")]
        height, width = (values[0] if len(values) == 1 else 0 for values in size)
        problems, names = detection.object_problems(feature, height, width, self._labels, self._first_id,
                                                    self._instance_masks, self._semantic_masks, self._tfds_objects)
        for problem in problems:
            result.problem(index, problem)
        if isinstance(self._most_objects, int) and len(names) > self._most_objects:
            result.problem(index, f"{len(names)} objects, more than the {self._most_objects} of "
                                  f"detection.objects_per_image_max in {INFO_FILE} (a reader pads to that many)")
        result.class_counts.update(names)
        result.class_images.update(set(names))
        result.objects += len(names)
        result.without_objects += not names
        result.most_objects = max(result.most_objects, len(names))

    def _check_label(self, result: _ShardResult, index: int, row: dict) -> str:
        """The record's class id (in range) and name; its class name."""
        label = int(row["label"])
        class_name = row["class_name"].decode("utf-8", "replace")
        if 0 <= label < len(self._labels):
            if class_name != self._labels[label]:
                result.problem(index, f"class_name {class_name!r} does not match label {label}, which is "
                                      f"{self._labels[label]!r} in {LABELS_FILE}")
            result.class_counts[self._labels[label]] += 1
        else:
            result.problem(index, f"label {label} is out of range: {LABELS_FILE} has {len(self._labels)} classes "
                                  f"(ids 0..{len(self._labels) - 1})")
            result.class_counts[f"<label {label}>"] += 1
        return class_name

    def _check_labels(self, result: _ShardResult, index: int, row: dict) -> list[str]:
        """--multi_label: the record's class ids (sorted, no repeats, in range) and names; returns its class names."""
        text = row["label"].decode("ascii")
        ids = [int(i) for i in text.split(",")] if text else []
        names = row["class_name"].decode("utf-8", "replace").split(_UNIT) if ids or row["class_name"] else []
        if ids != sorted(set(ids)):
            result.problem(index, f"labels [{text}] are not sorted class ids without repeats")
        bad = [i for i in ids if not 0 <= i < len(self._labels)]
        if bad:
            result.problem(index, f"label {bad[0]} is out of range: {LABELS_FILE} has {len(self._labels)} classes "
                                  f"(ids 0..{len(self._labels) - 1})")
        expected = [self._labels[i] if 0 <= i < len(self._labels) else f"<label {i}>" for i in ids]
        if names != expected:
            result.problem(index, f"class_name {names!r} does not match labels [{text}], which are {expected!r} "
                                  f"in {LABELS_FILE}")
        for name in expected:
            result.class_counts[name] += 1
        if not ids:
            result.without_labels += 1
        return expected  # a list, not the names joined: ['a;b'] and ['a', 'b'] are two label sets

    @staticmethod
    def _check_id(result: _ShardResult, index: int, row: dict, source_path: str) -> str:
        """An unlabeled set's record: its id is its file's name without the extension; returns '' (no class)."""
        stored, expected = row["id"].decode("utf-8", "replace"), record_id(source_path)
        if stored != expected:
            result.problem(index, f"id {stored!r} is not the file name of source_path {source_path!r} without its "
                                  f"extension ({expected!r})")
        return ""

    def _check_facts(self, result: _ShardResult, row: dict, decoded: bool, content: bool = True) -> None:
        index = int(row["index"])
        if decoded and index in result.damaged:  # TensorFlow decoded it: its damage is the problem
            result.problem(index, result.damaged[index])
        source_path = row["source_path"].decode("utf-8", "replace")
        if self._unlabeled:
            class_name = self._check_id(result, index, row, source_path)
        elif self._detection:  # no class of the image's own: its objects' were checked from the Example
            class_name = ""
        elif self._multi:
            class_name = self._check_labels(result, index, row)  # the list of names
        else:
            class_name = self._check_label(result, index, row)
        stored_format = row["format"].decode("utf-8", "replace")
        if self._format in _MAGIC and (stored_format != self._format or not row["head"].startswith(
                _MAGIC[self._format])):
            result.problem(index, f"the image is not {self._format.upper()} as {INFO_FILE} says")
        height, width = int(row["height"]), int(row["width"])
        if self._fixed and (height, width) != self._fixed:
            result.problem(index, f"height x width {height}x{width} is not the dataset's fixed size "
                                  f"{self._fixed[0]}x{self._fixed[1]}")
        shape = tuple(int(n) for n in row["shape"])
        if decoded and shape[:2] != (height, width):
            result.problem(index, f"the decoded image is {shape[0]}x{shape[1]} but the record says {height}x{width}")
        # The same key for the same content: the decoded pixels' shape and fingerprint, or the bytes'.
        key = struct.pack("<3q", *shape) + row["fingerprint"].tobytes() if content else None
        result.entries.append((index, source_path, key, class_name, row["sha256"].decode("ascii", "replace")))


@dataclass
class Report:
    """The outcome of one verification: problems fail it, warnings do not."""

    dataset_dir: str
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    split_records: dict[str, int] = field(default_factory=dict)
    split_shards: dict[str, int] = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    error_lines: int = 0
    decoded: bool = True
    index_files: int = 0  # index files checked against their shards
    annotations: dict = field(default_factory=dict)  # a detection dataset's: found, written, rejected

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self, max_lines: int = 100) -> str:
        lines = []
        for kind, items in (("warning", self.warnings), ("problem", self.problems)):
            lines.extend(f"{kind}: {text}" for text in items[:max_lines])
            if len(items) > max_lines:
                lines.append(f"{kind}: ... and {len(items) - max_lines} more")
        total = sum(self.split_records.values())
        shards = sum(self.split_shards.values())
        lines.append(f"Read {total} records from {self.dataset_dir} ({shards} shard{'' if shards == 1 else 's'} "
                     f"listed{'' if self.decoded else '; images not decoded: --no_decode'}):")
        for split, records in self.split_records.items():
            lines.append(f"  {split:<10} {records:>8} records in {self.split_shards[split]} shard(s)")
        if self.index_files:
            lines.append(f"Index files: {self.index_files} checked against their shards.")
        if self.files:
            f = self.files
            lines.append(f"Files: {f.get('found')} found = {f.get('written')} written + {f.get('rejected')} rejected"
                         f" + {f.get('skipped')} skipped; {ERRORS_FILE} has {self.error_lines} line(s).")
        if self.annotations:
            a = self.annotations
            lines.append(f"Annotations: {a['found']} found = {a['written']} written + {a['rejected']} rejected; "
                         "every object's box, class and mask checked.")
        if self.ok:
            lines.append("OK: checksums, Examples, labels, images, counts and accounting match "
                         f"{INFO_FILE}; no record is written twice.")
        else:
            lines.append(f"FAILED: {len(self.problems)} problem(s) in {self.dataset_dir}.")
        return "\n".join(lines)


load_info = reader.load_info  # the one loader of the description (image_tfrecords.json)


_read_text = reader.read_file_text


def _check_labels(dataset_dir: str, info: dict, report: Report) -> list[str]:
    """labels.txt's lines, which must be image_tfrecords.json's class names; falls back to those names."""
    class_names = list(info.get("class_names", []))
    text = _read_text(join(dataset_dir, LABELS_FILE))
    if text is None:
        report.problems.append(f"{LABELS_FILE}: missing; the label ids cannot be checked against it")
        return class_names
    labels = text.splitlines()
    if labels != class_names:
        pairs = zip(labels, class_names, strict=False)
        differ = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(labels), len(class_names)))
        report.problems.append(
            f"{LABELS_FILE}: {len(labels)} classes, but {INFO_FILE} lists {len(class_names)}; they differ first "
            f"at id {differ}")
    if info.get("num_classes") != len(labels):
        report.problems.append(f"{INFO_FILE}: num_classes is {info.get('num_classes')} but {LABELS_FILE} has "
                               f"{len(labels)} lines")
    return labels


def _number(digits: str) -> int | None:
    """The number a shard name's digits give, or None for more digits than any count (int() refuses 4,300)."""
    return int(digits) if len(digits) <= bounded.MAX_INT_DIGITS else None


def _check_shard_files(dataset_dir: str, info: dict, report: Report) -> list[tuple[str, str, dict]]:
    """The listed shards that exist, as (split, path, listed entry); missing, misnamed and stale ones are problems."""
    present = {}  # every file directly in the folder
    for path, size in list_files(dataset_dir):
        name = path[len(dataset_dir.rstrip("/")) + 1:]
        if "/" not in name:
            present[name] = size
    listed, to_read = set(), []
    for split, split_info in info["splits"].items():
        shards = split_info.get("shards", [])
        for number, shard in enumerate(shards):
            name = shard["file"]
            listed.add(name)
            match = SHARD_NAME.fullmatch(name)
            kaggle = KAGGLE_NAME.fullmatch(name)  # --shard_names=kaggle: no shard count, but the record count
            if match:
                says_so = match["split"] == split and _number(match["index"]) == number \
                    and _number(match["count"]) == len(shards)
            else:
                says_so = bool(kaggle) and kaggle["split"] == split and _number(kaggle["index"]) == number
            if not says_so:
                report.problems.append(f"{name}: listed as shard {number} of {len(shards)} of split {split!r} in "
                                       f"{INFO_FILE}, but its name does not say so")
            if name not in present:
                report.problems.append(f"{name}: listed in {INFO_FILE} but missing")
                continue
            if present[name] != shard.get("bytes"):
                report.problems.append(f"{name}: {present[name]} bytes, but {INFO_FILE} says {shard.get('bytes')}")
            to_read.append((split, join(dataset_dir, name), shard))
    # A reader that globs the shards (README: glob("train-*.tfrecord")) reads every match, listed or not.
    # Kaggle's notebooks glob train*.tfrec; Grain's users *.array_record.
    globs = [glob for split in sorted(set(SPLITS) | set(info["splits"]))
             for glob in shard_globs(split)]
    for name in sorted(set(present) - listed):
        pattern = next((glob for glob in globs if fnmatch.fnmatchcase(name, glob)), None)
        if pattern:
            own = SHARD_NAME.fullmatch(name) or KAGGLE_NAME.fullmatch(name)
            stale = " (a stale shard from another run?)" if own else ""
            report.problems.append(
                f"{name}: not listed in {INFO_FILE}, but the shard glob {pattern} matches it, so readers that glob "
                f"read it as part of the dataset{stale}: remove it or move it out of this folder")
    return to_read


def _index_problem(index_path: str, shard_path: str) -> str | None:
    """What is wrong with an index file (`offset length` per record) for its shard, or None when it matches."""
    name, shard = index_path.rsplit("/", 1)[-1], shard_path.rsplit("/", 1)[-1]
    redo = "convert again with --index_files (or rebuild it with tfrecord2idx)"
    text = _read_text(index_path)
    if text is None:
        return f"{name}: listed in {INFO_FILE} as the index of {shard} but missing; {redo}"
    try:
        offsets = record_offsets(shard_path)
    except Exception as e:  # noqa: BLE001 - the shard's own check names what is wrong with it
        return f"{name}: cannot be checked, its shard {shard} is unreadable ({e})"
    expected = [(a, b - a) for a, b in zip(offsets, offsets[1:], strict=False)]
    lines = text.splitlines()
    for number, (line, (offset, length)) in enumerate(zip(lines, expected, strict=False)):
        if line.split() != [str(offset), str(length)]:
            return (f"{name} line {number + 1}: {line.strip()[:60]!r}, but record {number} of {shard} is at byte "
                    f"{offset} and {length} bytes long: a wrong or stale index; {redo}")
    if len(lines) != len(expected):
        return (f"{name}: {len(lines)} lines, but {shard} holds {len(expected)} records: a wrong or stale index; "
                f"{redo}")
    return None


def _check_index_files(dataset_dir: str, info: dict, report: Report) -> None:
    """Every listed index matches its shard; an unlisted index named like this tool's must match a listed shard."""
    shards = {shard["file"]: shard for split in info["splits"].values() for shard in split.get("shards", [])}
    listed = {}
    for name, shard in shards.items():
        index = shard.get("index")
        if index is None:
            continue
        if index != index_name(name):
            report.problems.append(f"{name}: its index is listed as {index!r} in {INFO_FILE}, but the index of this "
                                   f"shard is named {index_name(name)}: convert again")
        listed[index] = name
    by_stem = {index_name(name): name for name in shards}
    for path, _ in list_files(dataset_dir, "*.idx"):
        name = path[len(dataset_dir.rstrip("/")) + 1:]
        if "/" in name or name in listed or not INDEX_NAME.fullmatch(name):
            continue
        if name in by_stem:
            listed[name] = by_stem[name]  # a user's own tfrecord2idx output: it must be right too
        else:
            report.problems.append(f"{name}: an index file, but its shard is not in {INFO_FILE} (a stale index from "
                                   "another run?): remove it")
    for index, shard in sorted(listed.items()):
        problem = _index_problem(join(dataset_dir, index), join(dataset_dir, shard))
        if problem:
            report.problems.append(problem)
    report.index_files = len(listed)


def _check_counts(info: dict, results: list[tuple[dict, _ShardResult]], report: Report) -> None:
    by_split = defaultdict(list)
    for listed, result in results:
        by_split[result.split].append((listed, result))
        if result.readable and result.records != listed.get("records"):
            report.problems.append(f"{result.name}: holds {result.records} records, but {INFO_FILE} says "
                                   f"{listed.get('records')}")
        kaggle = KAGGLE_NAME.fullmatch(result.name)
        if kaggle and result.readable and _number(kaggle["records"]) != result.records:
            report.problems.append(f"{result.name}: holds {result.records} records, but its name says "
                                   f"{kaggle['records']}, and Kaggle's notebooks count the records from the "
                                   "names: convert again")
    for split, split_info in info["splits"].items():
        expected = split_info.get("records")
        listed_sum = sum(s.get("records", 0) for s in split_info.get("shards", []))
        if listed_sum != expected:
            report.problems.append(f"{INFO_FILE}: split {split!r} has {expected} records but its shards list "
                                   f"{listed_sum}")
        class_sum = sum(split_info.get("class_counts", {}).values())
        if info.get("multi_label"):  # an image counts once for each of its classes: no class counts more
            most = max(split_info.get("class_counts", {}).values(), default=0)
            if most > (expected or 0):
                report.problems.append(f"{INFO_FILE}: split {split!r} has {expected} records but a class counts "
                                       f"{most}")
        elif class_sum != expected and not info.get("unlabeled") and info.get("task") != DETECTION:
            # an unlabeled set has no classes to count; a detection dataset counts objects per class
            report.problems.append(f"{INFO_FILE}: split {split!r} has {expected} records but its class counts add "
                                   f"up to {class_sum}")
        shards = by_split.get(split, [])
        if len(shards) != len(split_info.get("shards", [])) or not all(r.readable for _, r in shards):
            continue  # a missing or unreadable shard is already a problem; its counts would only repeat it
        found = sum(r.records for _, r in shards)
        if found != expected:
            report.problems.append(f"split {split!r}: the shards hold {found} records, but {INFO_FILE} says "
                                   f"{expected}")
        if any(r.unread for _, r in shards):
            continue  # the class of an unreadable record is unknown; that record is already a problem
        counted = sum((r.class_counts for _, r in shards), Counter())
        listed_counts = split_info.get("class_counts", {})
        without = sum(r.without_labels for _, r in shards)
        if info.get("multi_label") and without != split_info.get("images_without_labels", 0):
            report.problems.append(f"split {split!r}: {without} records have no label, but {INFO_FILE} says "
                                   f"{split_info.get('images_without_labels', 0)}")
        counts_what = "objects" if info.get("task") == DETECTION else "records"  # a detection record has many
        if info.get("task") == DETECTION and not listed_counts:
            continue  # a description without objects per class has none to check (the objects' total is checked)
        for name in sorted(set(counted) | set(listed_counts)):
            if counted[name] != listed_counts.get(name, 0):
                report.problems.append(f"split {split!r} class {name!r}: {counted[name]} {counts_what}, but "
                                       f"{INFO_FILE} says {listed_counts.get(name, 0)}")


def _label_map_problem(dataset_dir: str, class_names: list[str], first_id: int) -> str | None:
    """What is wrong with a detection dataset's label_map.pbtxt: missing, or its items not the class names with ids
    from first_id, in order (the TF Object Detection API reads the ids from it)."""
    text = _read_text(join(dataset_dir, LABEL_MAP_FILE))
    if text is None:
        return f"{LABEL_MAP_FILE}: missing; the TF Object Detection API reads the class ids from it"
    items = [(int(number), re.sub(r"\\(.)", r"\1", name))
             for number, name in re.findall(r"id:\s*(\d+)\s*name:\s*'((?:[^'\\]|\\.)*)'", text)]
    expected = list(enumerate(class_names, first_id))
    if items != expected:
        differ = next((i for i, (a, b) in enumerate(zip(items, expected, strict=False)) if a != b),
                      min(len(items), len(expected)))
        return (f"{LABEL_MAP_FILE}: {len(items)} items, but {LABELS_FILE} has {len(class_names)} classes with ids "
                f"from {first_id}; they differ first at item {differ}")
    return None


def _check_detection(dataset_dir: str, info: dict, results: list[tuple[dict, _ShardResult]], report: Report) -> None:
    """A detection dataset's "detection" section: annotations found = written + rejected; once every record was
    read, the objects written, the images without objects and the most objects of one image as the records hold
    them."""
    section = info.get("detection") or {}
    problem = _label_map_problem(dataset_dir, info.get("class_names") or [], section.get("first_id", 1))
    if problem:
        report.problems.append(problem)
    annotations = section.get("annotations") or {}
    found, written = annotations.get("found"), annotations.get("written")
    rejected = sum((annotations.get("rejected") or {}).values())
    report.annotations = {"found": found, "written": written, "rejected": rejected}
    if found != written + rejected:
        report.problems.append(f"{INFO_FILE}: detection.annotations: {found} found but {written} written + "
                               f"{rejected} rejected = {written + rejected}; annotations are unaccounted for")
    listed = sum(len(split_info.get("shards", [])) for split_info in info["splits"].values())
    if len(results) != listed or not all(r.readable and not r.unread for _, r in results):
        return  # a missing or unreadable record is a problem already; the totals would only repeat it
    objects = sum(r.objects for _, r in results)
    if objects != written:
        report.problems.append(f"the records hold {objects} objects, but {INFO_FILE} says "
                               f"detection.annotations.written {written}")
    without = sum(r.without_objects for _, r in results)
    kept = (section.get("images_without_objects") or {}).get("kept")
    if without != kept:
        report.problems.append(f"{without} records have no object, but {INFO_FILE} says "
                               f"detection.images_without_objects.kept {kept}")
    most = max((r.most_objects for _, r in results), default=0)
    if most != section.get("objects_per_image_max"):
        report.problems.append(f"the most objects of one record is {most}, but {INFO_FILE} says "
                               f"detection.objects_per_image_max {section.get('objects_per_image_max')}")
    if "images_per_class" not in section:
        return  # a description written before the images per class were counted
    for split in sorted(set(info["splits"]) | set(section["images_per_class"])):
        counted = sum((r.class_images for _, r in results if r.split == split), Counter())
        listed = section["images_per_class"].get(split) or {}
        for name in sorted(set(counted) | set(listed)):
            if counted[name] != listed.get(name, 0):
                report.problems.append(f"split {split!r} class {name!r}: {counted[name]} records hold one, but "
                                       f"{INFO_FILE} says detection.images_per_class {listed.get(name, 0)}")


def _nothing_written(info: dict) -> str:
    """Why a dataset holds no records, as image_tfrecords.json's files section tells it."""
    found = info.get("files", {}).get("found")
    why = (f"every one of the {found} files found was rejected or skipped (see {ERRORS_FILE} for each file's "
           "reason); fix the input" if found else "no image file was found in the input; check --input_dir")
    return f"{INFO_FILE}: the dataset holds no records: {why} and convert again"


def _label(class_name) -> str | tuple[str, ...]:
    """A record's label to compare copies by: its class name, or (--multi_label) its set of names."""
    return tuple(sorted(set(class_name))) if isinstance(class_name, list | tuple) else class_name


def _check_duplicates(info: dict, results: list[tuple[dict, _ShardResult]], report: Report,
                      fail_on_duplicates: bool = False) -> set[str]:
    """Report source paths written twice (damage), and identical source files as the converter does: groups by
    the SHA-256 each record stores (by the stored image's content in a dataset written before records carried
    it), of three kinds, in the converter's words, compared with image_tfrecords.json's "duplicates". They are
    warnings unless `fail_on_duplicates`, which fails on leakage and conflicts. Returns every source path read."""
    first_path: dict[str, str] = {}
    copies: dict[object, list[tuple[str, object, str]]] = defaultdict(list)
    sources_of_content: dict[bytes, set[str]] = defaultdict(set)
    unhashed = 0
    for _, result in results:
        for index, source_path, content, class_name, sha256 in result.entries:
            where = f"{result.name} record {index}"
            if source_path in first_path:
                report.problems.append(f"{where}: source path {source_path!r} is written twice (also in "
                                       f"{first_path[source_path]})")
                continue
            first_path[source_path] = where
            if not sha256:
                unhashed += 1
            key = sha256 or content
            if key is None:
                continue
            copies[key].append((result.split, _label(class_name), source_path))
            if sha256 and content is not None:
                sources_of_content[content].add(sha256)
    groups = [duplicates.DuplicateGroup(str(key), tuple(sorted(found, key=lambda c: (c[2], c))))
              for key, found in copies.items() if len(found) > 1]
    counts = duplicates.count_groups(groups)
    recorded = info.get("duplicates")
    if (isinstance(recorded, dict) and not unhashed and (info.get("options") or {}).get("duplicates", "keep") ==
            "keep" and any(recorded.get(k) != counts[k] for k in counts)):
        report.problems.append(
            f"{INFO_FILE}: its duplicates say {duplicates.summary_line(recorded)}; but the records hold "
            f"{duplicates.summary_line(counts)[len('Duplicates: '):]} (records were added, removed or changed)")
    if counts["groups"]:
        serious = counts[duplicates.ACROSS_SPLITS] + counts[duplicates.CONFLICTING_LABELS]
        where = report.problems if fail_on_duplicates and serious else report.warnings
        where.append(duplicates.summary_line(counts) + (
            "" if fail_on_duplicates else "; --fail_on_duplicates makes leakage and conflicts fail verify"))
        shown = sorted(groups, key=lambda g: (duplicates.KINDS.index(duplicates.kind(g)) * -1, g.copies[0][2]))
        for group in shown[:10]:
            names = ", ".join(f"{path!r} ({split}, {label if isinstance(label, str) else list(label)})"
                              for split, label, path in group.copies[:4])
            more = f" and {len(group.copies) - 4} more" if len(group.copies) > 4 else ""
            where.append(f"identical source files {duplicates.KIND_WORDS[duplicates.kind(group)]}: {names}{more}")
    same_pixels = sum(1 for sources in sources_of_content.values() if len(sources) > 1)
    if same_pixels:
        report.warnings.append(f"{same_pixels} stored images are equal pixel for pixel to another's from a "
                               "different source file (a picture saved twice, e.g. with other metadata); the "
                               "duplicates above count identical files only")
    return set(first_path)


def _check_accounting(dataset_dir: str, info: dict, written_paths: set[str], report: Report) -> None:
    """found = written + rejected + skipped, and errors.jsonl holds exactly the rejected and skipped files."""
    files = info.get("files", {})
    report.files = files
    found, written = files.get("found"), files.get("written")
    rejected, skipped = files.get("rejected"), files.get("skipped")
    if None in (found, written, rejected, skipped):
        report.problems.append(f"{INFO_FILE}: the files section lacks found/written/rejected/skipped")
        return
    if found != written + rejected + skipped:
        report.problems.append(f"{INFO_FILE}: {found} files found but {written} written + {rejected} rejected + "
                               f"{skipped} skipped = {written + rejected + skipped}; files are unaccounted for")
    split_total = sum(s.get("records", 0) for s in info["splits"].values())
    if written != split_total:
        report.problems.append(f"{INFO_FILE}: {written} files written but its splits hold {split_total} records")
    listed_reasons = {"rejected": Counter(info.get("rejected_by_reason", {})),
                      "skipped": Counter(info.get("skipped_by_reason", {}))}
    for stage, total in (("rejected", rejected), ("skipped", skipped)):
        if sum(listed_reasons[stage].values()) != total:
            report.problems.append(f"{INFO_FILE}: {total} files {stage} but {stage}_by_reason adds up to "
                                   f"{sum(listed_reasons[stage].values())}")
    text = _read_text(join(dataset_dir, ERRORS_FILE))
    if text is None:
        report.problems.append(f"{ERRORS_FILE}: missing; {rejected + skipped} rejected and skipped files are not "
                               "reported")
        return
    reasons = {"rejected": Counter(), "skipped": Counter(), ANNOTATION_STAGE: Counter()}
    reported = Counter()
    lines = [line for line in text.splitlines() if line.strip()]
    report.error_lines = len(lines)
    for number, line in enumerate(lines, 1):
        try:
            entry = bounded.loads(line)
            relpath, stage, reason = entry["relpath"], entry["stage"], entry["reason"]
        except (ValueError, KeyError, TypeError):
            report.problems.append(f"{ERRORS_FILE} line {number}: not a JSON object with relpath, stage and reason")
            continue
        if stage not in reasons:
            report.problems.append(f"{ERRORS_FILE} line {number}: unknown stage {stage!r}")
            continue
        reasons[stage][reason] += 1
        if stage == ANNOTATION_STAGE:  # a detection dataset's annotation set aside: its image may well be written
            continue
        reported[relpath] += 1
        if relpath in written_paths and reason != CHANGED_SINCE_DATASET:  # an append kept its earlier record
            report.problems.append(f"{ERRORS_FILE} line {number}: {relpath!r} is reported as {stage} but is also "
                                   "in the dataset")
    for relpath, count in sorted(reported.items()):
        if count > 1:
            report.problems.append(f"{ERRORS_FILE}: {relpath!r} is reported {count} times")
    annotation_lines = sum(reasons[ANNOTATION_STAGE].values())
    if len(lines) - annotation_lines != rejected + skipped:
        report.problems.append(f"{ERRORS_FILE}: {len(lines) - annotation_lines} lines"
                               + (" of files" if annotation_lines else "") + f", but {INFO_FILE} counts "
                               f"{rejected} rejected + {skipped} skipped = {rejected + skipped} files")
    detection = info.get("detection") or {}
    listed_annotations = Counter((detection.get("annotations") or {}).get("rejected") or {})
    if detection.get("semantic_masks_rejected"):
        listed_annotations["bad_semantic_mask"] = detection["semantic_masks_rejected"]
    listed_annotations.update(detection.get("instance_masks_rejected") or {})  # masks set aside, objects written
    if reasons[ANNOTATION_STAGE] != listed_annotations:
        report.problems.append(f"{ERRORS_FILE}: annotations set aside {dict(reasons[ANNOTATION_STAGE])}, but "
                               f"{INFO_FILE} says {dict(listed_annotations)}")
    for stage in ("rejected", "skipped"):
        for reason in sorted(set(reasons[stage]) | set(listed_reasons[stage])):
            if reasons[stage][reason] != listed_reasons[stage][reason]:
                report.problems.append(f"{ERRORS_FILE}: {reasons[stage][reason]} files {stage} as {reason!r}, but "
                                       f"{INFO_FILE} says {listed_reasons[stage][reason]}")


ANNOTATION_STAGE = "annotation"  # errors.jsonl's stage of a detection dataset's annotation set aside

_SOURCES_SHOWN = 10  # problem lines of the sources files per kind, then one line counting the rest


def _check_sources(dataset_dir: str, info: dict, results: list[tuple[dict, _ShardResult]], report: Report) -> None:
    """The sources files (what an append reads to know which images the dataset holds) against the records: one
    line per record, of its path, SHA-256, split and label, per split as many lines as records. A line lost, a
    path changed or a file missing would let the next --if_exists=append write an image a second time.

    A dataset written before sources files were has none to check."""
    sources = info.get("sources")
    if not isinstance(sources, dict):
        return
    redo = "an append would write images it holds a second time; convert again with --if_exists=overwrite"
    found: list[str] = []
    shown: Counter = Counter()

    def problem(kind: str, text: str) -> None:
        shown[kind] += 1
        if shown[kind] <= _SOURCES_SHOWN:
            found.append(text)

    lines: dict[str, tuple] = {}  # relpath -> (sha256, split, label)
    per_split: Counter = Counter()
    names = sources.get("files")
    for name in names if isinstance(names, list) else ():
        if not isinstance(name, str) or not SOURCES_NAME.fullmatch(name):
            problem("name", f"{INFO_FILE}: {name!r} is listed among the sources files but is no name of one")
            continue
        text = _read_text(join(dataset_dir, name))
        if text is None:
            problem("missing", f"{name}: missing, but {INFO_FILE} lists it among the sources files; {redo}")
            continue
        for number, line in enumerate(text.splitlines(), 1):
            parsed = parse_source_line(line)
            if parsed is None:
                problem("line", f"{name} line {number}: not a sources line [relpath, sha256, split, label]; {redo}")
                continue
            relpath, entry = parsed
            if relpath in lines:
                problem("twice", f"{name} line {number}: {relpath!r} is listed twice among the sources; {redo}")
                continue
            lines[relpath] = entry
            per_split[entry[1]] += 1
    for split, split_info in info["splits"].items():
        if per_split[split] != split_info.get("records"):
            problem("count", f"sources files: they list {per_split[split]} images of split {split!r}, but it holds "
                             f"{split_info.get('records')} records; {redo}")
    names_of = info.get("class_names") or []
    for _, result in results:
        for index, source_path, _, class_name, sha256 in result.entries:
            where = f"{result.name} record {index}"
            entry = lines.pop(source_path, None)
            if entry is None:
                problem("unlisted", f"{where}: source path {source_path!r} is in no sources file; {redo}")
                continue
            listed_sha, listed_split, label = entry
            if sha256 and listed_sha != sha256:
                problem("sha", f"{where}: the sources files give {source_path!r} SHA-256 {listed_sha}, the record "
                               f"{sha256}; {redo}")
            if listed_split != result.split:
                problem("split", f"{where}: the sources files put {source_path!r} in split {listed_split!r}, the "
                                 f"record is in {result.split!r}")
            if not _same_label(label, class_name, names_of):
                problem("label", f"{where}: the sources files give {source_path!r} label {label!r}, the record "
                                 f"{class_name!r}")
    listed_shards = sum(len(split_info.get("shards", [])) for split_info in info["splits"].values())
    if len(results) == listed_shards and all(r.readable and not r.unread for _, r in results):
        for relpath in sorted(lines):  # every record was read: a line left names none (else the damage is named)
            problem("unrecorded", f"sources files: {relpath!r} is listed, but no record has that source path; "
                                  f"{redo}")
    report.problems.extend(found)
    for kind, count in sorted(shown.items()):
        if count > _SOURCES_SHOWN:
            report.problems.append(f"sources files: ... and {count - _SOURCES_SHOWN} more problems of this kind "
                                   f"({kind})")


def _same_label(label, class_name, class_names: list) -> bool:
    """Whether a sources line's label (a class id, a tuple of them, or None) names a record's class (its name, or
    with --multi_label the list of names; '' in an unlabeled set)."""
    def name(i):
        return class_names[i] if isinstance(i, int) and 0 <= i < len(class_names) else f"<label {i}>"

    if label is None:
        return class_name == ""
    if isinstance(label, tuple):
        return isinstance(class_name, list) and sorted(map(name, label)) == sorted(class_name)
    return name(label) == class_name


def _check_tfds_files(dataset_dir: str, info: dict, report: Report) -> None:
    """TFDS's files (dataset_info.json, features.json, <label>.labels.txt) must say what image_tfrecords.json says.

    A folder of format version 1 has none; a folder whose shards TFDS cannot read has none either.
    """
    if "tfds" not in info or (info.get("task") == DETECTION and not detection.has_tfds_objects(info)):
        return  # format version 1; or detection records written before they held TFDS's keys, without its files
    try:
        expected, _ = tfds_metadata.tfds_files(info["splits"], info["schema"], info["image"], info["class_names"],
                                               info["compression"], multi_label=bool(info.get("multi_label")),
                                               features=reader.extra_features(info),
                                               unlabeled=bool(info.get("unlabeled")))
    except (KeyError, TypeError, ValueError, DatasetError):
        return  # a malformed splits section: _check_shard_files and _check_counts name it
    redo = "tfds.builder_from_directory would not load the folder as it is; convert again"
    for name, text in expected.items():
        found = _read_text(join(dataset_dir, name))
        if found is None:
            report.problems.append(f"{name}: missing, but {INFO_FILE} lists it among TFDS's files; {redo}")
            continue
        if name == TFDS_INFO_FILE:
            found_info = _parsed(found)
            want = bounded.loads(text)
            differ = ([key for key in want if key != "description" and found_info.get(key) != want[key]]
                      if isinstance(found_info, dict) else ["the whole file"])
            if differ:
                report.problems.append(f"{name}: its {', '.join(differ)} differ from the splits and keys in "
                                       f"{INFO_FILE} (TFDS reads its shard lengths from it); {redo}")
        elif name.endswith(TFDS_LABELS_SUFFIX):
            if found.splitlines() != text.splitlines():
                report.problems.append(f"{name}: TFDS's class names differ from {LABELS_FILE}; {redo}")
        elif _parsed(found) != bounded.loads(text):  # TFDS reads it as JSON: its layout and line ends are free
            report.problems.append(f"{name}: TFDS's features differ from the keys and image size in {INFO_FILE}; "
                                   f"{redo}")


def _parsed(text: str):
    """A JSON file's value, or None when it is no (bounded) JSON."""
    try:
        return bounded.loads(text)
    except ValueError:
        return None


def verify_dataset(dataset_dir: str, decode: bool = True, workers: int | None = None,
                   fail_on_duplicates: bool = False) -> Report:
    """Read a whole dataset back and compare it with its image_tfrecords.json.

    Raises:
        DatasetError: when `dataset_dir` holds no image_tfrecords.json (not a complete dataset).
    """
    info = load_info(dataset_dir)
    report = Report(dataset_dir, decoded=decode)
    labels = _check_labels(dataset_dir, info, report)
    to_read = _check_shard_files(dataset_dir, info, report)
    _check_index_files(dataset_dir, info, report)
    _check_tfds_files(dataset_dir, info, report)
    checker = _RecordChecker(info, labels, decode)
    # A few shards at a time: tf.data already decodes each chunk on every core; more threads would only
    # overlap reading (GCS latency) and hold more chunks in memory.
    with ThreadPoolExecutor(max_workers=workers or min(4, os.cpu_count() or 1)) as pool:
        shard_results = list(pool.map(lambda item: checker.check_shard(item[0], item[1]), to_read))
    results = [(listed, result) for (_, _, listed), result in zip(to_read, shard_results, strict=True)]
    for _, result in results:
        report.problems.extend(result.problems)
        if result.omitted:
            report.problems.append(f"{result.name}: ... and {result.omitted} more problems in this shard")
    for split, split_info in info["splits"].items():
        report.split_records[split] = sum(r.records for _, r in results if r.split == split)
        report.split_shards[split] = len(split_info.get("shards", []))
    _check_counts(info, results, report)
    if info.get("task") == DETECTION:
        _check_detection(dataset_dir, info, results, report)
    if not any(split_info["records"] for split_info in info["splits"].values()):
        report.problems.insert(0, _nothing_written(info))
    written_paths = _check_duplicates(info, results, report, fail_on_duplicates)
    _check_sources(dataset_dir, info, results, report)
    _check_accounting(dataset_dir, info, written_paths, report)
    if decode and not reader.strict_jpeg_available() and info.get("image", {}).get("format") == "jpeg":
        report.warnings.append("JPEG data was decoded by TensorFlow only, which takes damaged data with a warning: "
                               "install simplejpeg (pip install 'simplejpeg>=1.9,<1.10') for verify to check it")
    return report


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=program_name("python -m pipeline.verify"),
        description="Check a converted dataset against its image_tfrecords.json. Exit code 0: everything matches; "
                    "1: problems (listed one per line); 2: not a complete dataset.")
    parser.add_argument("dataset_dir", help="the dataset folder (--output_dir of the conversion), local or gs://")
    parser.add_argument("--no_decode", action="store_true",
                        help="Skip decoding the images, most of the time; checksums, Examples, labels, counts, "
                             "duplicates (by encoded bytes) and accounting are still checked. Default: off.")
    parser.add_argument("--max_problems", type=int, default=100,
                        help="Print at most this many problem lines, and as many warnings. Default: 100.")
    parser.add_argument("--fail_on_duplicates", action="store_true",
                        help="Fail (exit code 1) when identical source files are in two splits (leakage) or under "
                             "different labels (conflict); otherwise they are reported as the conversion reported "
                             "them, as warnings. Default: off.")
    args = parser.parse_args(argv)
    load_info(args.dataset_dir)  # refuse a folder that is no dataset before TensorFlow's slow import
    import_tensorflow()  # quietly: TensorFlow's native start-up messages are not problems
    report = verify_dataset(args.dataset_dir, decode=not args.no_decode, fail_on_duplicates=args.fail_on_duplicates)
    print(report.format(args.max_problems))
    return 0 if report.ok else 1


# What Ctrl-C or SIGTERM leaves (pipeline.cli.main_of's last line).
STOPPED = "verify stopped before it checked the whole dataset, which it never changes: run the same command again"


def main(argv: list[str] | None = None) -> int:
    """The command line's entry point: `run`, with one error line for a bad input or an interruption."""
    return main_of(run, argv, stopped=STOPPED)


if __name__ == "__main__":
    sys.exit(main())
