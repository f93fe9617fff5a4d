"""ReadManifest: the images and labels of a CSV or JSON Lines manifest, read inside the job.

A manifest lists one image per row: `path` (relative to the manifest's folder or --input_dir, absolute, or
gs://), `label` (a class name) and, optionally, `split` (train, validation, test, or a name a split folder may
have: val, valid, dev, ...); with
--multi_label a `labels` column (several class names) instead of `label`; optionally `group` (the images of
one group share a split). Its other columns are typed extra features (transforms.base.features), written into
each Example. The file is cut into byte ranges that any worker reads (a compressed one is read as one
stream); every row keeps its row number for errors.jsonl, as a sequential read gives it (the records of each
range are counted first). A row that cannot be used becomes a Rejection with its row number; a path listed
twice keeps its first row. Without --labels_file, the class names are the rows' distinct labels, found in
the job.
"""

from __future__ import annotations

import csv
import json
import posixpath
from typing import NamedTuple

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from transforms.base import counters
from transforms.base.dataset_format import split_of
from transforms.base.features import BAD_VALUE, RESERVED_COLUMNS, BadValue, row_extras
from transforms.base.paths import display_path, is_local, name_bytes, os_name, quoted_name
from transforms.base.records import ImageRef, Rejection
from transforms.inputs import rows as reading
from transforms.inputs.rows import (
    ROWS,
    SPANNING,
    Range,
    RangeStart,
    ReadRows,
    Record,
    RowFields,
    range_fields,
    read_records,
    record_fields,
)
from transforms.labels.layout import (
    GROUP_BY_TIMEOUT,
    UNKNOWN_CLASS,
    GroupByTimeout,
    class_name_problem,
    class_order,
    compile_group_by,
    group_of,
    hash_split,
    shuffle_key,
)

SKIPPED = "skipped"
FOUND = "found"
STATS = "stats"  # one dict: {"spanning_rows": n, "examples": ..., the split counts}, what the reading found
# In STATS: the labelled rows whose split the manifest gives, and those split by the hash (the summary says which)
GIVEN_SPLIT_ROWS = "rows_with_split"
HASHED_SPLIT_ROWS = "rows_split_by_hash"
SPLIT_COUNTS = "split_counts"  # _Label's (kind, rows, '') events for STATS, once per bundle

BAD_ROW = "manifest_bad_row"
OPEN_QUOTE = "manifest_open_quote"  # a CSV quoted field never closed, or taking lines that read as rows
NOT_UTF8 = "manifest_not_utf8"
LONG_LINE = "manifest_long_line"
_PROBLEMS = {reading.OPEN_QUOTE: OPEN_QUOTE, reading.NOT_UTF8: NOT_UTF8, reading.LONG_LINE: LONG_LINE}
MISSING_PATH = "manifest_missing_path"
MISSING_LABEL = "manifest_missing_label"
UNKNOWN_SPLIT = "manifest_unknown_split"
DUPLICATE_PATH = "manifest_duplicate_path"
BAD_LABEL = "manifest_bad_label"
BAD_PATH = "manifest_bad_path"  # a relative path that leads out of its base with '..', or names a folder
BAD_VALUE_REASONS = {"label": BAD_LABEL, "path": BAD_PATH}
CLASS_NAMES = "class_names"

GROUPS = "groups"  # with a group column or --group_by: (group or '', split, relpath) of every labelled image

LABELS_SEPARATOR = ";"  # between the class names of a CSV `labels` cell


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


def normal_path(path: str) -> str:
    """A manifest path as one spelling of its file: `a/./b.jpg`, `a//b.jpg` and `a/../a/b.jpg` are `a/b.jpg`
    (posixpath.normpath). A gs:// URL is kept as written: object names are not folders (`a//b` is an object of
    its own). Raises RowProblem for a relative path that leads out of its base with '..', or names no file."""
    if not is_local(path) or not (path.startswith(".") or "/." in path or "//" in path or path.endswith("/")):
        return path  # already one spelling (the common case: no '.', '..' or empty part)
    normal = posixpath.normpath(path)
    if normal.startswith("//"):  # normpath keeps a leading '//'
        normal = "/" + normal.lstrip("/")
    if normal == ".." or normal.startswith("../"):
        raise RowProblem(BAD_PATH, f"the path {path!r} leads out of the folder of relative paths (--input_dir, or "
                                   "the manifest's folder) with '..': give it below that folder, or as an absolute "
                                   "path")
    if normal in (".", "/"):
        raise RowProblem(BAD_PATH, f"the path {path!r} names a folder, not an image file")
    return normal


def resolve(path: str, base: str) -> str:
    """A manifest path (normal_path) as a full path or URL: gs:// and absolute paths as given, others below
    `base`. A local one is named as this process's file system calls take it (`os_name`): the manifest's
    UTF-8 `café/1.jpg` opens in the C locale too."""
    if not is_local(path):
        return path
    return os_name(path if path.startswith("/") else base.rstrip("/") + "/" + path)


def _text(fields: dict, name: str, row: int, numbers: bool = False, strip: bool = True) -> str:
    """A field as text, stripped unless `strip` is False ('' when missing, null or blank). A JSON value must be a
    string (or, with `numbers`, an integer: its digits); else RowProblem: `true` or `["x"]` is not a class name,
    and `1.0` would be a class apart from `1`."""
    value = fields.get(name)
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip() if strip or not value.strip() else value
    if numbers and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    shown = json.dumps(value, ensure_ascii=True)[:40]
    kind = "a number" if isinstance(value, int | float) and not isinstance(value, bool) else "not text"
    hint = f' (write "1.0" as a string; an integer {name} such as 1 is read as "1")' if numbers else ""
    raise RowProblem(BAD_VALUE_REASONS.get(name, BAD_ROW), f"row {row}: the {name} is {shown}, {kind}: a {name} "
                                                            f"is a JSON string{hint}")


def row_values(fields: dict, row: int, base: str) -> ManifestRow:
    """A ManifestRow from a row's {column: value}; raises RowProblem for a row that cannot be used."""
    # A label is kept as written: ' ant' is no class name (labels.txt cannot hold it, and a class folder ' ant' is
    # refused), so its row is rejected as manifest_bad_label, never merged into 'ant'.
    path, label = _text(fields, "path", row), _text(fields, "label", row, numbers=True, strip=False)
    split, group = _text(fields, "split", row).lower(), _text(fields, "group", row, numbers=True)
    labels = label_list(fields.get("labels"), row)
    if not path:
        raise RowProblem(MISSING_PATH, f"row {row}: no path")
    try:
        path = normal_path(path)
    except RowProblem as p:
        raise RowProblem(p.reason, f"row {row}: {p.detail}") from None
    if not label and labels is None:
        raise RowProblem(MISSING_LABEL, f"row {row}: no label for {path!r}")
    if split and split_of(split) is None:
        raise RowProblem(UNKNOWN_SPLIT, f"row {row}: split {split!r} is not train, validation or test (nor a "
                                        "name that stands for one, such as val, valid, dev or training)")
    columns = tuple((name, value) for name, value in fields.items() if name not in RESERVED_COLUMNS)
    return ManifestRow(row, resolve(path, base), path, label, split_of(split) or "", labels, group,
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


def _row(fields: dict, row: int, base: str):
    try:
        return row_values(fields, row, base)
    except RowProblem as p:
        return Rejection(str(fields.get("path") or f"row {row}"), "rejected", p.reason, p.detail)


def parse_record(record: Record, row: int, fmt: str, header: list[str], base: str):
    """A ManifestRow or Rejection for the record of data row `row`."""
    return manifest_row(row, record_fields(record, fmt, header), base)


def manifest_row(row: int, fields: dict | str, base: str):
    """A ManifestRow or Rejection from a data row's fields (or why they cannot be read)."""
    if isinstance(fields, str):
        reason = _PROBLEMS.get(getattr(fields, "kind", ""), BAD_ROW)
        return Rejection(f"row {row}", "rejected", reason, f"row {row}: {fields}")
    return _row(fields, row, base)


def read_rows(lines, fmt: str, base: str):
    """(row number, ManifestRow or Rejection) for every data row of a manifest, streamed (one reader): `lines`
    its text lines (file_lines)."""
    _, rows = read_records(lines, fmt)
    for fields in rows:
        yield fields.row, manifest_row(fields.row, fields.fields, base)


def parse_range(path: str, item: Range, fmt: str, base: str, start: RangeStart, header: list[str]):
    """(row number, ManifestRow or Rejection) of every record that starts in the range."""
    for fields in range_fields(path, item, fmt, start, header):
        yield fields.row, manifest_row(fields.row, fields.fields, base)


def _to_manifest_row(item: RowFields, base: str):
    """RowFields -> ManifestRow, or SKIPPED: its Rejection."""
    row, fields = item.row, item.fields
    result = manifest_row(row, fields, base)
    if isinstance(result, Rejection):
        counters.inc("manifest_rows_rejected")
        yield beam.pvalue.TaggedOutput(SKIPPED, result)
    else:
        yield result


def _count_rows(rows: int):
    counters.inc("manifest_rows", rows)
    return rows


def _first_of_path(item):
    """(path, rows) -> the first row; the others as duplicate Rejections."""
    _, rows = item
    rows = sorted(rows)
    yield rows[0]
    for extra in rows[1:]:
        yield beam.pvalue.TaggedOutput(SKIPPED, Rejection(
            extra.relpath, "rejected", DUPLICATE_PATH,
            f"row {extra.row}: the path is listed again, first in row {rows[0].row}; the first row is kept"))


def _row_labels(row: ManifestRow, multi_label: bool):
    """The class names a row gives (for the class names found in the job): its label, or with --multi_label
    the names of its `labels` field."""
    yield from ((row.labels or ()) if multi_label else (row.class_name,))


def class_names_of(labels) -> list[str]:
    """The class names of the distinct labels in id order (`class_order`: text order, or numeric when all are
    integers), without those that labels.txt cannot hold (their rows are rejected as manifest_bad_label)."""
    return class_order(name for name in labels if name and not class_name_problem(name))


class _Label(beam.DoFn):
    """ManifestRow -> ImageRef: class id(s) and split; SKIPPED for a row whose class is not known or cannot be
    written to labels.txt; with `groups`, (group or '', split, relpath) on GROUPS. `class_ids` None: they come
    as the side input `class_names` (found in the job)."""

    def __init__(self, class_ids: dict[str, int] | None, seed: int, validation_split: float, test_split: float,
                 size: int, multi_label: bool = False, group_by: str | None = None, groups: bool = False,
                 features: tuple = ()):
        self._class_ids, self._seed, self._size = class_ids, seed, size
        self._splits = (validation_split, test_split)
        self._multi_label, self._group_by, self._groups = multi_label, group_by, groups or bool(group_by)
        self._group_re = None
        self._names = {i: name for name, i in (class_ids or {}).items()}
        self._found_names = None
        self._features = features
        self._split_rows = {GIVEN_SPLIT_ROWS: 0, HASHED_SPLIT_ROWS: 0}

    def setup(self):
        self._group_re = compile_group_by(self._group_by) if self._group_by else None

    def start_bundle(self):
        self._split_rows = dict.fromkeys(self._split_rows, 0)

    def finish_bundle(self):
        for kind, rows in self._split_rows.items():
            if rows:
                yield beam.pvalue.TaggedOutput(SPLIT_COUNTS, GlobalWindows.windowed_value((kind, rows, "")))

    def process(self, row: ManifestRow, class_names=None):
        if class_names is not None and self._found_names is not class_names:  # found in the job: a side input
            self._found_names, self._class_ids = class_names, {name: i for i, name in enumerate(class_names)}
            self._names = dict(enumerate(class_names))
        ref = self._bad_label(row) or (self._multi(row) if self._multi_label else self._single(row))
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
        try:  # a group column, else --group_by's match in the path as written; a row without one is its own group
            group = row.group or group_of(row.relpath, self._group_re)
        except GroupByTimeout as e:
            counters.inc("manifest_rows_rejected")
            yield beam.pvalue.TaggedOutput(SKIPPED, Rejection(row.relpath, "rejected", GROUP_BY_TIMEOUT,
                                                              f"row {row.row}: {e}"))
            return
        counters.inc(counters.TO_CONVERT)
        self._split_rows[GIVEN_SPLIT_ROWS if row.split else HASHED_SPLIT_ROWS] += 1
        split = row.split or hash_split(group or row.relpath, self._seed, *self._splits)
        ref = ref._replace(split=split, extras=extras)
        if group:  # its split is settled with the rest of its group (SettleGroups)
            yield beam.pvalue.TaggedOutput(GROUPED, (group, GroupMember(ref, bool(row.split))))
            return
        if self._groups:
            yield beam.pvalue.TaggedOutput(GROUPS, ("", split, display_path(row.relpath)))
        yield ref

    def _bad_label(self, row: ManifestRow) -> Rejection | None:
        names = (row.labels or ()) if self._multi_label else (row.class_name,)
        for name in names:
            problem = name and class_name_problem(name)
            if problem:
                return Rejection(row.relpath, "rejected", BAD_LABEL,
                                 f"row {row.row}: the label {quoted_name(name)} has {problem}: rename it")
        return None

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


GROUPED = "grouped"  # (group, GroupMember) of every labelled row that has a group


class GroupMember(NamedTuple):
    """An image of a group, with the split it has so far, and whether the manifest gave that split."""

    ref: ImageRef
    explicit: bool


def settle_group(group: str, members) -> list[ImageRef]:
    """The images of one group, each in its final split: when the group's rows that give a split all give the
    same one, the rows without a split join it (a group never straddles a split because some of its rows were
    hashed); rows whose explicit splits differ keep them (leakage, reported by the groups summary)."""
    members = list(members)
    explicit = {m.ref.split for m in members if m.explicit}
    if len(explicit) == 1:
        (split,) = explicit
        moved = [m for m in members if not m.explicit and m.ref.split != split]
        if moved:
            counters.inc("group_rows_moved_to_explicit_split", len(moved))
        return [m.ref if m.explicit else m.ref._replace(split=split) for m in members]
    return [m.ref for m in members]


def _settle(item):
    """(group, [GroupMember]) -> ImageRef in its final split, and GROUPS: (group, split, relpath) of each."""
    group, members = item
    for ref in settle_group(group, members):
        yield beam.pvalue.TaggedOutput(GROUPS, (display_path(group), ref.split, display_path(ref.relpath)))
        yield ref


class ReadManifest(beam.PTransform):
    """PBegin -> ImageRef for every usable manifest row, plus SKIPPED (Rejection), FOUND (row counts), STATS
    (one dict: the rows that span lines, the rows that gave their split and those split by hash) and without given
    class names, CLASS_NAMES (one list: the class names found in the job, in id order).

    The manifest is cut into byte ranges (`range_bytes`, default transforms.inputs.rows.RANGE_BYTES), each read by any
    worker: the records of every range but the last are counted first, so that each range knows its first row
    number (transforms.inputs.rows.ReadRows).
    `class_names` None: they are the rows' distinct labels, found in the job. `size` stands in for each
    file's size (the launcher's sample mean): the file is read to its end (up to --max_file_mb) whatever it
    is, and shard sizing uses it as the source bytes.
    """

    def __init__(self, manifest: str, fmt: str, base: str, class_names: list[str] | None, *, seed: int,
                 validation_split: float, test_split: float, size: int, multi_label: bool = False,
                 group_by: str | None = None, groups: bool = False, features: tuple = (),
                 range_bytes: int | None = None):
        super().__init__()
        self._manifest, self._fmt, self._base, self._range_bytes = manifest, fmt, base, range_bytes
        self._class_names, self._multi_label = class_names, multi_label
        ids = None if class_names is None else {name: i for i, name in enumerate(class_names)}
        self._label = _Label(ids, seed, validation_split, test_split, size, multi_label, group_by, groups,
                             features=features)

    def expand(self, pbegin):
        read = pbegin | "Read" >> ReadRows(self._manifest, self._fmt, self._range_bytes)
        parsed = read.fields | "ParseRows" >> beam.FlatMap(_to_manifest_row, self._base).with_outputs(
            SKIPPED, main="rows")
        found = read[ROWS] | "CountManifestRows" >> beam.Map(_count_rows)
        firsts = (parsed.rows
                  # by the path's bytes: a local path may hold surrogates (os_name), which Beam's str coder refuses
                  | "ByPath" >> beam.Map(lambda r: (name_bytes(r.path), r))
                  | "GroupByPath" >> beam.GroupByKey()
                  | "FirstOfPath" >> beam.FlatMap(_first_of_path).with_outputs(SKIPPED, main="rows"))
        if self._class_names is None:
            # the distinct labels in id order: a combine per label, then one short list (the classes, not the rows)
            names = (firsts.rows
                     | "RowLabels" >> beam.FlatMap(_row_labels, self._multi_label)
                     | "DistinctLabels" >> beam.Distinct()
                     | "ClassList" >> beam.combiners.ToList()
                     | "ClassNames" >> beam.Map(class_names_of))
            labeled = firsts.rows | "Label" >> beam.ParDo(
                self._label, class_names=beam.pvalue.AsSingleton(names)).with_outputs(
                    SKIPPED, GROUPS, GROUPED, SPLIT_COUNTS, main="images")
        else:
            names = None
            labeled = firsts.rows | "Label" >> beam.ParDo(self._label).with_outputs(
                SKIPPED, GROUPS, GROUPED, SPLIT_COUNTS, main="images")
        # one small dict: the rows whose quoted field holds line breaks (legal CSV, read as one row each), and
        # how many rows gave their split
        spanning = read[SPANNING] | "SpanningRows" >> beam.Map(reading.spanned)
        stats = ((spanning, labeled[SPLIT_COUNTS])
                 | "RowEvents" >> beam.Flatten()
                 | "SummariseRows" >> beam.CombineGlobally(reading.SummariseRows(
                     (reading.SPANNING_ROWS,), (GIVEN_SPLIT_ROWS, HASHED_SPLIT_ROWS))))
        # The rows of each group together (spread over the workers by group): their splits settled as one
        settled = (labeled[GROUPED]
                   | "GroupByGroup" >> beam.GroupByKey()
                   | "SettleGroups" >> beam.FlatMap(_settle).with_outputs(GROUPS, main="images"))
        images = (labeled.images, settled.images) | "AllImages" >> beam.Flatten()
        groups = (labeled[GROUPS], settled[GROUPS]) | "AllGroups" >> beam.Flatten()
        skipped = ((parsed[SKIPPED], firsts[SKIPPED], labeled[SKIPPED]) | "ManifestRejections" >> beam.Flatten())
        out = {"images": images, SKIPPED: skipped, FOUND: found, GROUPS: groups, STATS: stats}
        return out if names is None else {**out, CLASS_NAMES: names}
