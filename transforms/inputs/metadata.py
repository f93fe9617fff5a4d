"""JoinMetadata: typed extra features for class-folder images, from a CSV or JSON Lines file joined in the job.

`--metadata=FILE` has a `path` column (the image's path below --input_dir, as the listing names it: roses/1.jpg)
and extra columns, typed by --features. The file is read in parallel byte ranges, every row with its number
(as --manifest is: transforms.inputs.rows.ReadRows); its rows and the listed images are both keyed by that
relative path and joined with a CoGroupByKey: neither the launcher nor one worker ever holds the file, nor
the listing.

An image without a row is skipped as `metadata_missing`; one whose row has a value that is not of its type is
rejected as `metadata_bad_value`. A row whose image is not among the images to convert, a second row for the
same path, or a row that cannot be read (no path, a wrong number of fields, not JSON) is counted in STATS,
with the first few as examples: image_tfrecords.json's "metadata", and the summary.
"""

from __future__ import annotations

import posixpath
from typing import NamedTuple

import apache_beam as beam

from transforms.base import counters
from transforms.base.features import METADATA_BAD_VALUE, RESERVED_COLUMNS, BadValue, row_extras
from transforms.base.paths import is_local
from transforms.base.records import Rejection
from transforms.inputs.rows import (
    ROWS,
    SPANNING,
    SPANNING_ROWS,
    ReadRows,
    RowFields,
    SummariseRows,
    read_records,
    spanned,
)

SKIPPED = "skipped"
STATS = "stats"
METADATA_MISSING = "metadata_missing"


class MetadataRow(NamedTuple):
    row: int  # 1 = the first row after a CSV's header, or the first line of a JSON Lines file
    columns: tuple  # (column, value as the file gives it) of its columns other than path


def key_of(path: str, input_dir: str) -> str:
    """The relative path a metadata row names, as the listing's relpath: no './', no leading input_dir."""
    path = path.strip().replace("\\", "/") if is_local(path) else path.strip()
    base = input_dir.rstrip("/") + "/"
    if path.startswith(base):
        path = path[len(base):]
    # one spelling of the file, as the listing names it: a/./b.jpg, a//b.jpg and a/../a/b.jpg are a/b.jpg
    return posixpath.normpath(path) if is_local(path) and path else path


def metadata_row(row: int, fields: dict | str, input_dir: str):
    """(relpath, MetadataRow) of a data row's fields, or (None, (row, why)) for a row that cannot be used."""
    if isinstance(fields, str):
        return None, (row, fields)
    path = fields.get("path")
    path = "" if path is None else str(path)
    if not path.strip():
        return None, (row, "no path")
    columns = tuple((k, v) for k, v in fields.items() if k not in RESERVED_COLUMNS)
    return key_of(path, input_dir), MetadataRow(row, columns)


def read_metadata(lines, fmt: str, input_dir: str):
    """(relpath, MetadataRow) for every usable row, or (None, (row, why)) for one that cannot be read; streamed
    (the launcher's sample; the job reads the file in ranges, with the same parser: transforms.inputs.rows)."""
    _, rows = read_records(lines, fmt)
    for fields in rows:
        yield metadata_row(fields.row, fields.fields, input_dir)


def _keyed(item: RowFields, input_dir: str):
    """RowFields -> (relpath, MetadataRow), or STATS: ('bad_rows', row, why)."""
    row, fields = item.row, item.fields
    key, value = metadata_row(row, fields, input_dir)
    if key is None:
        yield beam.pvalue.TaggedOutput(STATS, ("bad_rows", value[0], value[1]))
    else:
        yield key, value


def _rows_read(rows: int):
    counters.inc("metadata_rows", rows)
    return "rows", rows, ""


class _Join(beam.DoFn):
    """(relpath, {'images': [ImageRef], 'rows': [MetadataRow]}) -> ImageRef with its extras; SKIPPED: Rejection
    of an image without a usable row; STATS: (kind, row, detail) of rows not joined."""

    def __init__(self, features: tuple):
        self._features = features

    def process(self, item):
        relpath, grouped = item
        images, rows = list(grouped["images"]), sorted(grouped["rows"])
        if not images:
            for row in rows:
                yield beam.pvalue.TaggedOutput(STATS, ("unmatched_rows", row.row, relpath))
            return
        for extra in rows[1:]:
            yield beam.pvalue.TaggedOutput(STATS, ("duplicate_rows", extra.row,
                                                   f"{relpath} (first in row {rows[0].row})"))
        joined = 0
        for ref in images:
            if not rows:
                counters.inc(counters.rejected(METADATA_MISSING))  # counted by AssignLabels as to convert: done here
                yield beam.pvalue.TaggedOutput(SKIPPED, Rejection(
                    ref.relpath, "skipped", METADATA_MISSING,
                    "no row of --metadata names this image: add a row with its path below --input_dir"))
                continue
            try:
                extras = row_extras(self._features, dict(rows[0].columns))
            except BadValue as e:
                counters.inc(counters.rejected(METADATA_BAD_VALUE))
                yield beam.pvalue.TaggedOutput(SKIPPED, Rejection(ref.relpath, "rejected", METADATA_BAD_VALUE,
                                                                  f"metadata row {rows[0].row}: {e}"))
                continue
            joined += 1
            yield ref._replace(extras=extras)
        if joined:
            yield beam.pvalue.TaggedOutput(STATS, ("joined", joined, ""))


class SummariseMetadata(SummariseRows):
    """(kind, row, detail) events -> {"rows", "joined", "bad_rows", "duplicate_rows", "unmatched_rows",
    "spanning_rows", "examples"}: counts, and the first EXAMPLES rows of each kind (by row number)."""

    def __init__(self):
        super().__init__(("bad_rows", "duplicate_rows", "unmatched_rows", SPANNING_ROWS), ("rows", "joined"))


class JoinMetadata(beam.PTransform):
    """ImageRef -> ImageRef with the extras of its --metadata row ('images'); SKIPPED: Rejection of each image
    without a usable row; STATS: one dict, what the join found (SummariseMetadata)."""

    def __init__(self, metadata: str, fmt: str, input_dir: str, features: tuple, range_bytes: int = 0):
        super().__init__()
        self._metadata, self._fmt, self._input_dir, self._features = metadata, fmt, input_dir, features
        self._range_bytes = range_bytes  # 0: transforms.inputs.rows.RANGE_BYTES (tests cut small files finely)

    def expand(self, images):
        # (relpath, MetadataRow): the file read in parallel byte ranges, every row with its number
        read = images.pipeline | "ReadMetadata" >> ReadRows(self._metadata, self._fmt, self._range_bytes)
        rows = read.fields | "KeyRows" >> beam.FlatMap(_keyed, self._input_dir).with_outputs(STATS, main="rows")
        counted = read[ROWS] | "CountRows" >> beam.Map(_rows_read)
        keyed = images | "ByRelpath" >> beam.Map(lambda ref: (ref.relpath, ref))
        joined = ({"images": keyed, "rows": rows.rows}
                  | "GroupByRelpath" >> beam.CoGroupByKey()
                  | "Join" >> beam.ParDo(_Join(self._features)).with_outputs(SKIPPED, STATS, main="images"))
        spanning = read[SPANNING] | "SpanningRows" >> beam.Map(spanned)
        stats = ((counted, rows[STATS], joined[STATS], spanning) | "MetadataEvents" >> beam.Flatten()
                 | "SummariseMetadata" >> beam.CombineGlobally(SummariseMetadata()))
        return {"images": joined.images, SKIPPED: joined[SKIPPED], STATS: stats}


