"""ReadManifest: the images and labels of a CSV or JSON Lines manifest, read inside the job.

A manifest lists one image per row: `path` (relative to the manifest's folder or --input_dir, absolute, or
gs://), `label` (a class name) and, optionally, `split` (train, validation or val, test); with
--multi_label a `labels` column (several class names) instead of `label`; optionally `group` (the images of
one group share a split). Its other columns are typed extra features (transforms.features), written into
each Example. The file is read as a stream by one worker (so every row keeps its row number for
errors.jsonl; memory stays bounded whatever its length), then the rows are spread over the workers. A row
that cannot be used becomes a Rejection with its row number; a path listed twice keeps its first row.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
import re
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transforms import counters
from transforms.features import BAD_VALUE, RESERVED_COLUMNS, BadValue, row_extras
from transforms.layout import SPLIT_FOLDER_NAMES, UNKNOWN_CLASS, display_path, group_of, hash_split, shuffle_key
from transforms.records import ImageRef, Rejection

SKIPPED = "skipped"
FOUND = "found"

BAD_ROW = "manifest_bad_row"
MISSING_PATH = "manifest_missing_path"
MISSING_LABEL = "manifest_missing_label"
UNKNOWN_SPLIT = "manifest_unknown_split"
DUPLICATE_PATH = "manifest_duplicate_path"

GROUPS = "groups"  # with a group column or --group_by: (group or '', split, relpath) of every labelled image

KNOWN_COLUMNS = ("path", "label", "split", "labels", "group")
LABELS_SEPARATOR = ";"  # between the class names of a CSV `labels` cell
SPLIT_NAMES = {"train": "train", "validation": "validation", "val": "validation", "test": "test"}
assert set(SPLIT_NAMES.values()) <= set(SPLIT_FOLDER_NAMES.values())


class ManifestRow(NamedTuple):
    """A usable manifest row: where its file is, its class name and its split ('' for the hash split)."""

    row: int  # 1 = the first row after a CSV's header, or the first line of a JSON Lines file
    path: str  # full path or URL
    relpath: str  # the path as the manifest gives it (names the image in errors.jsonl and the shuffle order)
    class_name: str  # '' when the row has only a `labels` field
    split: str
    labels: tuple[str, ...] | None = None  # the `labels` field's class names as written; None without one
    group: str = ""  # the `group` field ('' without one)
    columns: tuple = ()  # (column, value as the file gives it) of its other columns, typed by _Label


class RowProblem(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def manifest_format(path: str, first_line: str) -> str:
    """'csv' or 'jsonl': by the extension (.csv, .jsonl, .json), else by the first line ('{' means JSON)."""
    ext = posixpath.splitext(path.lower().removesuffix(".gz"))[1]
    if ext == ".csv":
        return "csv"
    if ext in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    return "jsonl" if first_line.lstrip("\ufeff \t").startswith("{") else "csv"


def csv_header(first_line: str) -> list[str]:
    """The column names of a CSV header line (stripped, lower case)."""
    return [name.strip().lower() for name in next(csv.reader([first_line.lstrip("\ufeff")]), [])]


def resolve(path: str, base: str) -> str:
    """A manifest path as a full path or URL: gs:// and absolute paths as given, others below `base`."""
    if "://" in path or path.startswith("/"):
        return path
    while path.startswith("./"):
        path = path[2:]
    return base.rstrip("/") + "/" + path


def row_values(fields: dict, row: int, base: str) -> ManifestRow:
    """A ManifestRow from a row's {column: value}; raises RowProblem for a row that cannot be used."""
    def text(name):
        value = fields.get(name)
        return "" if value is None else str(value).strip()

    path, label, split = text("path"), text("label"), text("split").lower()
    labels = label_list(fields.get("labels"), row)
    if not path:
        raise RowProblem(MISSING_PATH, f"row {row}: no path")
    if not label and labels is None:
        raise RowProblem(MISSING_LABEL, f"row {row}: no label for {path!r}")
    if split and split not in SPLIT_NAMES:
        raise RowProblem(UNKNOWN_SPLIT, f"row {row}: split {split!r} is not train, validation (or val) or test")
    columns = tuple((name, value) for name, value in fields.items() if name not in RESERVED_COLUMNS)
    return ManifestRow(row, resolve(path, base), path, label, SPLIT_NAMES.get(split, ""), labels, text("group"),
                       columns=columns)


def label_list(value, row: int) -> tuple[str, ...] | None:
    """The class names of a `labels` field: a JSON list of names, or a text of names separated by ';'.

    Names are stripped and empty pieces dropped ('a;;b;' is a and b); an empty text or list is an image of no
    class, (); None when the row has no such field (a JSON row without the key, or a null).
    """
    if value is None:
        return None
    if isinstance(value, list):
        names = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, str | int):
                raise RowProblem(BAD_ROW, f"row {row}: labels holds {json.dumps(item)[:40]}, not a class name")
            names.append(str(item).strip())
    elif isinstance(value, str | int) and not isinstance(value, bool):
        names = str(value).split(LABELS_SEPARATOR)
    else:
        raise RowProblem(BAD_ROW, f"row {row}: labels is {json.dumps(value)[:40]}, not a list of class names")
    return tuple(name.strip() for name in names if name.strip())


def read_rows(stream: io.TextIOBase, fmt: str, base: str):
    """(row number, ManifestRow or Rejection) for every data row of a manifest, streamed."""
    if fmt == "csv":
        reader = csv.reader(stream)
        header = [name.strip().lower().lstrip("\ufeff") for name in next(reader, [])]
        for row, values in enumerate(reader, start=1):
            if not any(v.strip() for v in values):
                yield row, Rejection(f"row {row}", "rejected", BAD_ROW, f"row {row}: an empty row")
                continue
            if len(values) != len(header):
                yield row, Rejection(f"row {row}", "rejected", BAD_ROW,
                                     f"row {row}: {len(values)} fields, the header has {len(header)}")
                continue
            yield row, _row(dict(zip(header, values, strict=True)), row, base)
    else:
        for row, line in enumerate(stream, start=1):
            if not line.strip():
                yield row, Rejection(f"row {row}", "rejected", BAD_ROW, f"row {row}: an empty line")
                continue
            try:
                fields = json.loads(line)
            except ValueError as e:
                yield row, Rejection(f"row {row}", "rejected", BAD_ROW, f"row {row}: not JSON ({e})")
                continue
            if not isinstance(fields, dict):
                yield row, Rejection(f"row {row}", "rejected", BAD_ROW, f"row {row}: not a JSON object")
                continue
            yield row, _row({str(k).lower(): v for k, v in fields.items()}, row, base)


def _row(fields: dict, row: int, base: str):
    try:
        return row_values(fields, row, base)
    except RowProblem as p:
        return Rejection(str(fields.get("path") or f"row {row}"), "rejected", p.reason, p.detail)


class _ReadRows(beam.DoFn):
    def __init__(self, base: str, fmt: str):
        self._base, self._fmt = base, fmt

    def process(self, manifest: str):
        rows = 0
        with FileSystems.open(manifest, compression_type="auto") as raw:
            stream = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace", newline="")
            for number, result in read_rows(stream, self._fmt, self._base):
                rows = number
                if isinstance(result, Rejection):
                    counters.inc("manifest_rows_rejected")
                    yield beam.pvalue.TaggedOutput(SKIPPED, result)
                else:
                    yield result
        counters.inc("manifest_rows", rows)
        yield beam.pvalue.TaggedOutput(FOUND, rows)


def _first_of_path(item):
    """(path, rows) -> the first row; the others as duplicate Rejections."""
    _, rows = item
    rows = sorted(rows)
    yield rows[0]
    for extra in rows[1:]:
        yield beam.pvalue.TaggedOutput(SKIPPED, Rejection(
            extra.relpath, "rejected", DUPLICATE_PATH,
            f"row {extra.row}: the path is listed again, first in row {rows[0].row}; the first row is kept"))


class _Label(beam.DoFn):
    """ManifestRow -> ImageRef: class id(s) and split; SKIPPED for a row whose class is not known; with
    `groups`, (group or '', split, relpath) on GROUPS."""

    def __init__(self, class_ids: dict[str, int], seed: int, validation_split: float, test_split: float,
                 size: int, multi_label: bool = False, group_by: str | None = None, groups: bool = False,
                 features: tuple = ()):
        self._class_ids, self._seed, self._size = class_ids, seed, size
        self._splits = (validation_split, test_split)
        self._multi_label, self._group_by, self._groups = multi_label, group_by, groups or bool(group_by)
        self._group_re = None
        self._names = {i: name for name, i in class_ids.items()}
        self._features = features

    def setup(self):
        self._group_re = re.compile(self._group_by) if self._group_by else None

    def process(self, row: ManifestRow):
        ref = self._multi(row) if self._multi_label else self._single(row)
        if isinstance(ref, Rejection):
            counters.inc("files_unlabeled" if ref.stage == "skipped" else "manifest_rows_rejected")
            yield beam.pvalue.TaggedOutput(SKIPPED, ref)
            return
        try:
            extras = row_extras(self._features, dict(row.columns)) if self._features else ()
        except BadValue as e:
            counters.inc("manifest_rows_rejected")
            yield beam.pvalue.TaggedOutput(SKIPPED, Rejection(row.relpath, "rejected", BAD_VALUE,
                                                              f"row {row.row}: {e}"))
            return
        counters.inc("images_to_convert")
        # A group column, else --group_by's match in the path as written; a row without one is its own group.
        group = row.group or group_of(row.relpath, self._group_re)
        split = row.split or hash_split(group or row.relpath, self._seed, *self._splits)
        if self._groups:
            yield beam.pvalue.TaggedOutput(GROUPS, (display_path(group), split, display_path(row.relpath)))
        yield ref._replace(split=split, extras=extras)

    def _single(self, row: ManifestRow) -> ImageRef | Rejection:
        if not row.class_name:
            return Rejection(row.relpath, "rejected", MISSING_LABEL, f"row {row.row}: no label for {row.relpath!r}")
        label = self._class_ids.get(row.class_name)
        if label is None:
            detail = f"row {row.row}: label {row.class_name!r} is not in the labels file"
            return Rejection(row.relpath, "skipped", UNKNOWN_CLASS, detail)
        return ImageRef(row.path, row.relpath, self._size, "", row.class_name, label,
                        shuffle_key(row.relpath, self._seed))

    def _multi(self, row: ManifestRow) -> ImageRef | Rejection:
        if row.labels is None:
            return Rejection(row.relpath, "rejected", MISSING_LABEL,
                             f"row {row.row}: no labels field for {row.relpath!r}")
        unknown = sorted({name for name in row.labels if name not in self._class_ids})
        if unknown:
            shown = ", ".join(repr(name) for name in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
            return Rejection(row.relpath, "skipped", UNKNOWN_CLASS,
                             f"row {row.row}: label(s) {shown} not in the labels file")
        ids = tuple(sorted({self._class_ids[name] for name in row.labels}))
        if not ids:
            counters.inc("images_without_labels")
        names = tuple(self._names[i] for i in ids)
        return ImageRef(row.path, row.relpath, self._size, "", LABELS_SEPARATOR.join(names), -1,
                        shuffle_key(row.relpath, self._seed), ids, names)


class ReadManifest(beam.PTransform):
    """PBegin -> ImageRef for every usable manifest row, plus SKIPPED (Rejection) and FOUND (the row count).

    `size` stands in for each file's size (the launcher's sample mean): the file is read to its end (up to
    --max_file_mb) whatever it is, and shard sizing uses it as the source bytes.
    """

    def __init__(self, manifest: str, fmt: str, base: str, class_names: list[str], *, seed: int,
                 validation_split: float, test_split: float, size: int, multi_label: bool = False,
                 group_by: str | None = None, groups: bool = False, features: tuple = ()):
        super().__init__()
        self._manifest, self._fmt, self._base = manifest, fmt, base
        self._label = _Label({name: i for i, name in enumerate(class_names)}, seed, validation_split,
                             test_split, size, multi_label, group_by, groups, features=features)

    def expand(self, pbegin):
        read = (pbegin
                | "Manifest" >> beam.Create([self._manifest])
                | "ReadRows" >> beam.ParDo(_ReadRows(self._base, self._fmt)).with_outputs(SKIPPED, FOUND,
                                                                                          main="rows"))
        firsts = (read.rows
                  | "ByPath" >> beam.Map(lambda r: (r.path, r))
                  | "GroupByPath" >> beam.GroupByKey()
                  | "FirstOfPath" >> beam.FlatMap(_first_of_path).with_outputs(SKIPPED, main="rows"))
        labeled = firsts.rows | "Label" >> beam.ParDo(self._label).with_outputs(SKIPPED, GROUPS, main="images")
        skipped = ((read[SKIPPED], firsts[SKIPPED], labeled[SKIPPED]) | "ManifestRejections" >> beam.Flatten())
        return {"images": labeled.images, SKIPPED: skipped, FOUND: read[FOUND], GROUPS: labeled[GROUPS]}
