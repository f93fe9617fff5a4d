"""ReadManifest: the images and labels of a CSV or JSON Lines manifest (or of several), read inside the job.

A manifest lists one image per row: `path` (or `filename`; relative to the manifest's folder or --input_dir,
absolute, or gs://), `label` (a class name) and, optionally, `split` (train, validation, test, or a name a split
folder may have: val, valid, dev, ...; without one, the split its file's folder names, as Roboflow's
train/_classes.csv); with --multi_label a `labels` column (several class names) instead of `label`; or, in a CSV
with neither, one 0/1 column per class (one-hot, Roboflow's `_classes.csv`; multi-hot with --multi_label);
optionally `group` (the images of one group share a split). Its other columns are typed extra features
(transforms.base.features), written into each Example. The file is cut into byte ranges that any worker reads
(a compressed one is read as one stream); every row keeps its row number for errors.jsonl, as a sequential read
gives it (the records of each range are counted first), and with several files its file's name. A row that
cannot be used becomes a Rejection with its row number; a path listed twice keeps its first row. Without
--labels_file, the class names are the rows' distinct labels, found in the job (a one-hot header's are known at
launch).
"""

from __future__ import annotations

import csv
import json
import posixpath
import unicodedata
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
    BAD_LABEL_IN_PATH,
    GROUP_BY_TIMEOUT,
    SAME_LABEL_OTHER_SPELLING,
    UNKNOWN_CLASS,
    GroupByTimeout,
    class_name_problem,
    compile_group_by,
    group_of,
    hash_split,
    kept_spellings,
    shuffle_key,
    spelling_key,
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
NOT_ONE_HOT = "manifest_not_one_hot"  # a one-hot row (class columns) without exactly one 1, and no --multi_label
BAD_CLASS_VALUE = "manifest_bad_class_value"  # a class column's cell that is neither 0 nor 1
BAD_VALUE_REASONS = {"label": BAD_LABEL, "path": BAD_PATH, "filename": BAD_PATH}
CLASS_NAMES = "class_names"

GROUPS = "groups"  # with a group column or --group_by: (group or '', split, relpath) of every labelled image

LABELS_SEPARATOR = ";"  # between the class names of a CSV `labels` cell
PATH_COLUMNS = ("path", "filename")  # the image's column: `path`, else `filename` (Roboflow's _classes.csv)
# A class column's cell (one-hot or multi-hot), stripped: 1 sets the class, 0 does not; anything else is a rejected
# row (manifest_bad_class_value), never guessed. "1.0" is what pandas writes for a float column of ones.
CLASS_CELLS = {"1": True, "0": False, "1.0": True, "0.0": False}


class RowReading(NamedTuple):
    """How the rows of one manifest file are read: the folder its relative paths are below, the split of a row
    without one (its folder's, '' for the hash split), its name in errors.jsonl ('' when the manifest is one file),
    its path column, with class columns ((column, class name), ...) the rows' classes are their 1s, and the
    prefix of a relative path as its record names it (the file's folder below the others': 'valid/', so that
    valid/_classes.csv's `a.jpg` is `valid/a.jpg`, as a folder listing names it)."""

    base: str
    split: str = ""
    shown: str = ""
    path_column: str = "path"
    class_columns: tuple = ()
    multi_label: bool = False
    prefix: str = ""


def _reading(base: str | RowReading) -> RowReading:
    return base if isinstance(base, RowReading) else RowReading(base)


def in_file(detail: str, shown: str) -> str:
    """A row's detail ('row 12: ...') naming its file too ('valid/_classes.csv row 12: ...'), when `shown`."""
    if not shown:
        return detail
    return f"{shown} {detail}" if detail.startswith("row ") else f"{shown}: {detail}"


class ManifestRow(NamedTuple):
    """A usable manifest row: where its file is, its class name and its split ('' for the hash split). An image
    that --label_from labels from its listed path is one too (row 0, its size known)."""

    row: int  # 1 = the first row after a CSV's header, or the first line of a JSON Lines file; 0: a listed file
    path: str  # full path or URL
    relpath: str  # the path as the manifest gives it (names the image in errors.jsonl and the shuffle order)
    class_name: str  # '' when the row has only a `labels` field
    split: str
    labels: tuple[str, ...] | None = None  # the `labels` field's class names as written; None without one
    group: str = ""  # the `group` field ('' without one)
    columns: tuple = ()  # (column, value as the file gives it) of its other columns, typed by LabelRow
    size: int | None = None  # bytes, when the listing gave them; None: the launcher's sample mean stands in
    source: str = ""  # its file's name in errors.jsonl ('' when the manifest is one file)
    file: int = 0  # its file's index among the manifest's files

    @property
    def where(self) -> str:
        """'row 12', or 'valid/_classes.csv row 12' when the manifest is several files."""
        return f"{self.source} row {self.row}" if self.source else f"row {self.row}"


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
    return [name.lower() for name in csv_names(first_line)]


def csv_names(first_line: str) -> list[str]:
    """The column names of a CSV header line as written, stripped (`filename, Hardhat` -> filename, Hardhat)."""
    return [name.strip() for name in next(csv.reader([first_line.lstrip("\ufeff")]), [])]


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


def row_values(fields: dict, row: int, base: str | RowReading) -> ManifestRow:
    """A ManifestRow from a row's {column: value}; raises RowProblem for a row that cannot be used. `base`: the
    folder of relative paths, or how the row's file is read (RowReading)."""
    how = _reading(base)
    # A label is kept as written: ' ant' is no class name (labels.txt cannot hold it, and a class folder ' ant' is
    # refused), so its row is rejected as manifest_bad_label, never merged into 'ant'.
    path, label = _text(fields, how.path_column, row), _text(fields, "label", row, numbers=True, strip=False)
    split, group = _text(fields, "split", row).lower(), _text(fields, "group", row, numbers=True)
    labels = label_list(fields.get("labels"), row)
    if how.class_columns:  # one-hot (or multi-hot) columns: the row's classes are its 1s
        names = hot_classes(fields, row, how.class_columns)
        if how.multi_label:
            label, labels = "", names
        elif len(names) == 1:
            label, labels = names[0], None
        else:
            raise RowProblem(NOT_ONE_HOT, not_one_hot(row, names))
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
    if how.class_columns or how.path_column != "path":
        known = {how.path_column, *RESERVED_COLUMNS, *(column for column, _ in how.class_columns)}
    else:
        known = RESERVED_COLUMNS
    columns = tuple((name, value) for name, value in fields.items() if name not in known)
    named = how.prefix + path if how.prefix and is_local(path) and not path.startswith("/") else path
    return ManifestRow(row, resolve(path, how.base), named, label, split_of(split) or how.split, labels, group,
                       columns=columns, source=how.shown)


def hot_classes(fields: dict, row: int, class_columns: tuple) -> tuple[str, ...]:
    """The class names whose column holds 1 in a row, in the columns' order; RowProblem for a cell that is
    neither 0 nor 1 (CLASS_CELLS, spaces around it aside: Roboflow writes `img.jpg, 0, 1`)."""
    names = []
    for column, name in class_columns:
        value = fields.get(column)
        hot = CLASS_CELLS.get(value.strip()) if isinstance(value, str) else None
        if hot is None:
            text = value.strip() if isinstance(value, str) else value
            shown = "is empty" if text is None or text == "" else f"holds {quoted_name(str(text))[:40]}"
            raise RowProblem(BAD_CLASS_VALUE, f"row {row}: the class column {quoted_name(name)} {shown}, not 0 or 1: "
                                              "a CSV without a label column has one 0/1 column per class")
        if hot:
            names.append(name)
    return tuple(names)


def not_one_hot(row: int, names: tuple[str, ...]) -> str:
    """Why a one-hot row without --multi_label is not used: no class, or several."""
    if not names:
        return (f"row {row}: no class set (every class column is 0); one-hot rows need exactly one 1, or give "
                "--multi_label (an image of no class)")
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return (f"row {row}: {len(names)} classes set ({shown}); one-hot rows need exactly one 1, or give "
            "--multi_label")


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


def _row(fields: dict, row: int, how: RowReading, file: int):
    try:
        return row_values(fields, row, how)._replace(file=file)
    except RowProblem as p:
        path = fields.get(how.path_column)
        path = path.strip() if isinstance(path, str) else path
        named = how.prefix + path if path and how.prefix and isinstance(path, str) and is_local(path) and not (
            path.startswith("/")) else path
        relpath = str(named) if named else in_file(f"row {row}", how.shown)
        return Rejection(relpath, "rejected", p.reason, in_file(p.detail, how.shown))


def parse_record(record: Record, row: int, fmt: str, header: list[str], base: str | RowReading):
    """A ManifestRow or Rejection for the record of data row `row`."""
    return manifest_row(row, record_fields(record, fmt, header), base)


def manifest_row(row: int, fields: dict | str, base: str | RowReading, file: int = 0):
    """A ManifestRow or Rejection from a data row's fields (or why they cannot be read); `file`: the index of its
    file among the manifest's."""
    how = _reading(base)
    if isinstance(fields, str):
        reason = _PROBLEMS.get(getattr(fields, "kind", ""), BAD_ROW)
        where = in_file(f"row {row}", how.shown)
        return Rejection(where, "rejected", reason, f"{where}: {fields}")
    return _row(fields, row, how, file)


def read_rows(lines, fmt: str, base: str | RowReading):
    """(row number, ManifestRow or Rejection) for every data row of a manifest, streamed (one reader): `lines`
    its text lines (file_lines)."""
    _, rows = read_records(lines, fmt)
    for fields in rows:
        yield fields.row, manifest_row(fields.row, fields.fields, base)


def parse_range(path: str, item: Range, fmt: str, base: str | RowReading, start: RangeStart, header: list[str]):
    """(row number, ManifestRow or Rejection) of every record that starts in the range."""
    for fields in range_fields(path, item, fmt, start, header):
        yield fields.row, manifest_row(fields.row, fields.fields, base)


def _to_manifest_row(item: RowFields, readings: tuple[RowReading, ...]):
    """RowFields -> ManifestRow, or SKIPPED: its Rejection (`readings`: how each file's rows are read)."""
    row, fields = item.row, item.fields
    result = manifest_row(row, fields, readings[item.file], item.file)
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
    rows = sorted(rows, key=lambda r: (r.file, r.row))
    yield rows[0]
    for extra in rows[1:]:
        yield beam.pvalue.TaggedOutput(SKIPPED, Rejection(
            extra.relpath, "rejected", DUPLICATE_PATH,
            f"{extra.where}: the path is listed again, first in {rows[0].where}; the first row is kept"))


def _row_labels(row: ManifestRow, multi_label: bool):
    """The class names a row gives (for the class names found in the job): its label, or with --multi_label
    the names of its `labels` field."""
    yield from ((row.labels or ()) if multi_label else (row.class_name,))


def class_names_of(counted) -> list[str]:
    """The class names, in id order (`class_order`), of the (label, number of rows) pairs, without those that
    labels.txt cannot hold (their rows are rejected as manifest_bad_label) and, of labels that differ only in letter
    case or Unicode normal form, all but the most frequent (`kept_spellings`: the others' rows are rejected)."""
    return kept_spellings((name, n) for name, n in counted if name and not class_name_problem(name))


class LabelRow(beam.DoFn):
    """ManifestRow -> ImageRef: class id(s) and split; SKIPPED for a row whose class is not known or cannot be
    written to labels.txt; with `groups`, (group or '', split, relpath) on GROUPS. `class_ids` None: they come
    as the side input `class_names` (found in the job), and a label that differs from one of them only in letter
    case or Unicode normal form is rejected (SAME_LABEL_OTHER_SPELLING). `from_paths`: the rows are listed files
    labelled by --label_from (their reasons and details say so, not a row number)."""

    def __init__(self, class_ids: dict[str, int] | None, seed: int, validation_split: float, test_split: float,
                 size: int, multi_label: bool = False, group_by: str | None = None, groups: bool = False,
                 features: tuple = (), from_paths: bool = False):
        self._class_ids, self._seed, self._size = class_ids, seed, size
        self._splits = (validation_split, test_split)
        self._multi_label, self._group_by, self._groups = multi_label, group_by, groups or bool(group_by)
        self._group_re = None
        self._names = {i: name for name, i in (class_ids or {}).items()}
        self._found_names = None
        self._spellings: dict[str, str] = {}  # spelling_key -> the class name, for class names found in the job
        self._features = features
        self._from_paths = from_paths
        self._rejected = "files_rejected_by_label" if from_paths else "manifest_rows_rejected"
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
            self._spellings = {spelling_key(name): name for name in class_names}
        ref = self._bad_label(row) or (self._multi(row) if self._multi_label else self._single(row))
        if isinstance(ref, Rejection):
            counters.inc("files_unlabeled" if ref.stage == "skipped" else self._rejected)
            yield beam.pvalue.TaggedOutput(SKIPPED, ref)
            return
        try:
            extras = row_extras(self._features, dict(row.columns)) if self._features else ()
        except BadValue as e:
            counters.inc(self._rejected)
            yield beam.pvalue.TaggedOutput(SKIPPED, Rejection(row.relpath, "rejected", BAD_VALUE,
                                                              f"{row.where}: {e}"))
            return
        try:  # a group column, else --group_by's match in the path as written; a row without one is its own group
            group = row.group or group_of(row.relpath, self._group_re)
        except GroupByTimeout as e:
            counters.inc(self._rejected)
            yield beam.pvalue.TaggedOutput(SKIPPED, Rejection(row.relpath, "rejected", GROUP_BY_TIMEOUT,
                                                              f"{_where(row)}{e}"))
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
                if self._from_paths:
                    return Rejection(row.relpath, "rejected", BAD_LABEL_IN_PATH,
                                     f"the label {quoted_name(name)} that --label_from finds in the path has "
                                     f"{problem}: rename the file")
                return Rejection(row.relpath, "rejected", BAD_LABEL,
                                 f"{row.where}: the label {quoted_name(name)} has {problem}: rename it")
        return None

    def _other_spelling(self, row: ManifestRow, name: str) -> Rejection | None:
        """A label found in the job that is a class's name in another letter case or Unicode normal form."""
        kept = self._spellings.get(spelling_key(name))
        if kept is None:
            return None
        fix = "rename the files" if self._from_paths else "correct the label"
        form = unicodedata.normalize("NFC", name) == unicodedata.normalize("NFC", kept)
        show = ascii if form else quoted_name  # two normal forms print the same: shown escaped (e\u0301)
        how = "their Unicode normal form (composed, or with combining marks)" if form else "letter case"
        return Rejection(row.relpath, "rejected", SAME_LABEL_OTHER_SPELLING,
                         f"{_where(row)}the label {show(name)} and the class {show(kept)} differ only in {how}, and "
                         f"a class has one name, the spelling of most of its images: {fix}, or give --labels_file "
                         "to choose the classes")

    def _single(self, row: ManifestRow) -> ImageRef | Rejection:
        if not row.class_name:
            return Rejection(row.relpath, "rejected", MISSING_LABEL, f"{row.where}: no label for {row.relpath!r}")
        label = self._class_ids.get(row.class_name)
        if label is None:
            other = self._other_spelling(row, row.class_name)
            if other is not None:
                return other
            detail = f"{_where(row)}label {row.class_name!r} is not in the labels file"
            return Rejection(row.relpath, "skipped", UNKNOWN_CLASS, detail)
        size = self._size if row.size is None else row.size
        return ImageRef(row.path, row.relpath, size, "", row.class_name, label, shuffle_key(row.relpath, self._seed))

    def _multi(self, row: ManifestRow) -> ImageRef | Rejection:
        if row.labels is None:
            return Rejection(row.relpath, "rejected", MISSING_LABEL,
                             f"{row.where}: no labels field for {row.relpath!r}")
        unknown = sorted({name for name in row.labels if name not in self._class_ids})
        other = next(filter(None, (self._other_spelling(row, name) for name in unknown)), None)
        if other is not None:
            return other
        if unknown:
            shown = ", ".join(repr(name) for name in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
            return Rejection(row.relpath, "skipped", UNKNOWN_CLASS,
                             f"{row.where}: label(s) {shown} not in the labels file")
        ids = tuple(sorted({self._class_ids[name] for name in row.labels}))
        if not ids:
            counters.inc("images_without_labels")
        names = tuple(self._names[i] for i in ids)
        return ImageRef(row.path, row.relpath, self._size, "", LABELS_SEPARATOR.join(names), -1,
                        shuffle_key(row.relpath, self._seed), ids, names)


def _where(row: ManifestRow) -> str:
    """The start of a detail: the manifest row's number, or the flag that labelled a listed file."""
    return f"{row.where}: " if row.row else "--label_from: "


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
    number (transforms.inputs.rows.ReadRows). `manifest` may be several files of the format `fmt` (one CSV per
    split folder), all read at once; `base` is then how each one's rows are read (a RowReading per file).
    `class_names` None: they are the rows' distinct labels, found in the job. `size` stands in for each
    file's size (the launcher's sample mean): the file is read to its end (up to --max_file_mb) whatever it
    is, and shard sizing uses it as the source bytes.
    """

    def __init__(self, manifest: str | tuple[str, ...], fmt: str, base: str | tuple[RowReading, ...],
                 class_names: list[str] | None, *, seed: int, validation_split: float, test_split: float, size: int,
                 multi_label: bool = False, group_by: str | None = None, groups: bool = False,
                 features: tuple = (), range_bytes: int | None = None):
        super().__init__()
        self._manifest = (manifest,) if isinstance(manifest, str) else tuple(manifest)
        self._readings = (_reading(base),) if isinstance(base, str) else tuple(base)
        assert len(self._readings) == len(self._manifest), "one RowReading per manifest file"
        self._fmt, self._range_bytes = fmt, range_bytes
        self._class_names, self._multi_label = class_names, multi_label
        ids = None if class_names is None else {name: i for i, name in enumerate(class_names)}
        self._label = LabelRow(ids, seed, validation_split, test_split, size, multi_label, group_by, groups,
                             features=features)

    def expand(self, pbegin):
        read = pbegin | "Read" >> ReadRows(self._manifest, self._fmt, self._range_bytes)
        parsed = read.fields | "ParseRows" >> beam.FlatMap(_to_manifest_row, self._readings).with_outputs(
            SKIPPED, main="rows")
        found = read[ROWS] | "CountManifestRows" >> beam.Map(_count_rows)
        firsts = (parsed.rows
                  # by the path's bytes: a local path may hold surrogates (os_name), which Beam's str coder refuses
                  | "ByPath" >> beam.Map(lambda r: (name_bytes(r.path), r))
                  | "GroupByPath" >> beam.GroupByKey()
                  | "FirstOfPath" >> beam.FlatMap(_first_of_path).with_outputs(SKIPPED, main="rows"))
        labeled = label_rows(firsts.rows, self._label, self._class_names is None, self._multi_label)
        # one small dict: the rows whose quoted field holds line breaks (legal CSV, read as one row each), and
        # how many rows gave their split
        spanning = read[SPANNING] | "SpanningRows" >> beam.Map(reading.spanned,
                                                               tuple(r.shown for r in self._readings if r.shown))
        stats = ((spanning, labeled[SPLIT_COUNTS])
                 | "RowEvents" >> beam.Flatten()
                 | "SummariseRows" >> beam.CombineGlobally(reading.SummariseRows(
                     (reading.SPANNING_ROWS,), (GIVEN_SPLIT_ROWS, HASHED_SPLIT_ROWS))))
        skipped = ((parsed[SKIPPED], firsts[SKIPPED], labeled[SKIPPED]) | "ManifestRejections" >> beam.Flatten())
        return {**labeled, SKIPPED: skipped, FOUND: found, STATS: stats}


def label_rows(rows, label: LabelRow, find_names: bool, multi_label: bool = False) -> dict:
    """ManifestRow -> {"images": ImageRef, SKIPPED: Rejection, GROUPS: (group or '', split, relpath)} and, with
    `find_names`, CLASS_NAMES: one sorted list, the class names found in the job. Steps applied in the caller's
    composite (ReadManifest's rows, or the files --label_from labels: transforms.inputs.path_labels)."""
    names = None
    if find_names:
        # the sorted distinct labels: a combine per label, then one short list (the classes, not the rows)
        names = (rows
                 | "RowLabels" >> beam.FlatMap(_row_labels, multi_label)
                 | "CountLabels" >> beam.combiners.Count.PerElement()
                 | "ClassList" >> beam.combiners.ToList()
                 | "ClassNames" >> beam.Map(class_names_of))
        labeled = rows | "Label" >> beam.ParDo(label, class_names=beam.pvalue.AsSingleton(names)).with_outputs(
            SKIPPED, GROUPS, GROUPED, SPLIT_COUNTS, main="images")
    else:
        labeled = rows | "Label" >> beam.ParDo(label).with_outputs(SKIPPED, GROUPS, GROUPED, SPLIT_COUNTS,
                                                                    main="images")
    # The rows of each group together (spread over the workers by group): their splits settled as one
    settled = (labeled[GROUPED]
               | "GroupByGroup" >> beam.GroupByKey()
               | "SettleGroups" >> beam.FlatMap(_settle).with_outputs(GROUPS, main="images"))
    images = (labeled.images, settled.images) | "AllImages" >> beam.Flatten()
    groups = (labeled[GROUPS], settled[GROUPS]) | "AllGroups" >> beam.Flatten()
    # SPLIT_COUNTS: (kind, rows, '') of the rows that gave their split and of those hashed, once per bundle
    out = {"images": images, SKIPPED: labeled[SKIPPED], GROUPS: groups, SPLIT_COUNTS: labeled[SPLIT_COUNTS]}
    return out if names is None else {**out, CLASS_NAMES: names}
