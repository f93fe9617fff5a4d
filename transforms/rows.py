"""ReadRows: a CSV (with a header) or JSON Lines file read in parallel, every row with the number a sequential
read gives it.

The file is cut into byte ranges (RANGE_BYTES). A range holds the records whose first line starts in it, the
split-at-newline rule of Beam's text source; a CSV record may span lines inside a quoted field, which
`csv_line_state` follows as Python's csv reader does. Every range but the last is counted first, in
parallel: what it adds to the row numbers after it, for a range that starts at a record and for one that
starts inside a quoted field (`count_records`); the counts, one pair per range, are summed into each range's
first row number and CSV state (`range_starts`), and every range is then parsed where it lands. A compressed
file cannot be cut: it is one range, read as a stream by one worker.

Used by --manifest (transforms.manifest) and --metadata (transforms.metadata); each turns the RowFields into
its own rows.
"""

from __future__ import annotations

import codecs
import csv
import io
import itertools
import re
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms import bounded


class _RawReader(io.RawIOBase):
    """A file of Beam's FileSystems as a raw stream: its CompressedFile (.gz) lacks what io.TextIOWrapper asks."""

    def __init__(self, raw):
        super().__init__()
        self._raw = raw

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._raw.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def text_stream(raw) -> io.TextIOWrapper:
    """The lines of a manifest opened with FileSystems.open (compressed or not) as text: UTF-8 (a BOM dropped,
    bad bytes replaced), line ends kept."""
    return io.TextIOWrapper(io.BufferedReader(_RawReader(raw), 1 << 16), encoding="utf-8-sig", errors="replace",
                            newline="")



# The file is cut into ranges of this many bytes, each parsed by any worker. A range holds the rows
# (records) whose first line starts in it, the standard split-at-newline rule of Beam's text source.
RANGE_BYTES = 64 * 1024 * 1024
# A CSV record longer than this (a quote that is never closed swallows the lines after it) is rejected; its
# text is not held.
MAX_RECORD_CHARS = 1 << 20

START, QUOTED = 0, 1  # a physical line starts a CSV record, or continues a quoted field of the record before
_START_FIELD, _IN_FIELD, _IN_QUOTED, _QUOTE_IN_QUOTED = range(4)


def csv_line_state(line: str, state: int) -> int:
    """START or QUOTED at the line after `line`, for `line` read in `state`.

    Python's csv reader (the excel dialect: ',' delimiter, '"' quotes, doubled quotes, not strict) ends a
    record at the end of a line unless the line ends inside a quoted field; a quote inside an unquoted field
    is a plain character. This is its state machine, reduced to what decides where records end.
    """
    if '"' not in line:
        return state
    s, i, n = (_IN_QUOTED if state == QUOTED else _START_FIELD), 0, len(line)
    while i < n:
        if s == _IN_QUOTED:
            i = line.find('"', i) + 1
            if not i:
                return QUOTED
            s = _QUOTE_IN_QUOTED
        elif s == _IN_FIELD:
            i = line.find(",", i) + 1
            if not i:
                return START
            s = _START_FIELD
        else:  # at a field's start, or just after a quote inside a quoted field
            c = line[i]
            i += 1
            s = _IN_QUOTED if c == '"' else _START_FIELD if c == "," else _IN_FIELD
    return QUOTED if s == _IN_QUOTED else START


class Record(NamedTuple):
    text: str  # the record's lines ('' if too long)
    lines: int
    too_long: bool = False


def group_records(lines, fmt: str, state: int = START, more=()):
    """Record for every record that starts in `lines` (an iterator of lines with their line ends).

    JSON Lines: one record a line. CSV: a line read in state QUOTED continues a record that started before
    `lines` and is skipped; a record whose quoted field is still open at the end of `lines` takes the lines
    it needs from `more`.
    """
    if fmt != "csv":
        for line in lines:
            yield Record(line, 1)
        return
    lines = iter(lines)
    for line in lines:
        if state == QUOTED:
            state = csv_line_state(line, QUOTED)
            continue
        parts, size, count = [line], len(line), 1
        state = csv_line_state(line, START)
        if state == QUOTED:
            rest = itertools.chain(lines, more)
            for line in rest:  # noqa: B020 - the record's continuation lines are taken from the same iterator
                count += 1
                size += len(line)
                if size <= MAX_RECORD_CHARS:
                    parts.append(line)
                state = csv_line_state(line, QUOTED)
                if state == START:
                    break
        yield Record("".join(parts), count) if size <= MAX_RECORD_CHARS else Record("", count, True)
        state = START


def record_fields(record: Record, fmt: str, header: list[str]) -> dict | str:
    """The {column: value} of a data row's record (columns lower case), or why it cannot be read."""
    if fmt != "csv":
        line = record.text
        if not line.strip():
            return "an empty line"
        try:
            fields = bounded.loads(line)
        except ValueError as e:
            return f"not JSON ({e})"
        if not isinstance(fields, dict):
            return "not a JSON object"
        return {str(k).lower(): v for k, v in fields.items()}
    if record.too_long:
        return (f"over {MAX_RECORD_CHARS // 1024} KiB in {record.lines} lines: a quoted field that is never "
                "closed (a stray \" ?) takes the lines after it; quote the field, or double the quote")
    try:
        values = next(csv.reader((record.text,)), [])  # one record: its line breaks are inside quotes
    except csv.Error as e:
        return f"not CSV ({e})"
    if not any(v.strip() for v in values):
        return "an empty row"
    if len(values) != len(header):
        return f"{len(values)} fields, the header has {len(header)}"
    return dict(zip(header, values, strict=True))


def header_of(record: Record | None) -> list[str]:
    """A CSV header record's column names (stripped, lower case)."""
    if record is None or record.too_long:
        return []
    try:
        values = next(csv.reader(io.StringIO(record.text, newline="")), [])
    except csv.Error:
        return []
    return [name.strip().lower().lstrip("\ufeff") for name in values]


class Range(NamedTuple):
    """Bytes [start, end) of the manifest: the records whose first line starts in them. end < 0: the whole
    file, as a stream (a compressed manifest cannot be cut)."""

    index: int
    start: int
    end: int
    last: bool = True


def is_compressed(path: str) -> bool:
    return CompressionTypes.detect_compression_type(path) != CompressionTypes.UNCOMPRESSED


def manifest_ranges(path: str, range_bytes: int = RANGE_BYTES) -> list[Range]:
    """The manifest's ranges: one per `range_bytes` (at least one); a compressed manifest is one stream."""
    if is_compressed(path):
        return [Range(0, 0, -1)]
    size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
    count = max(1, -(-size // range_bytes))
    return [Range(i, i * range_bytes, min(size, (i + 1) * range_bytes), i == count - 1) for i in range(count)]


_LINE_ENDS = re.compile(rb"\r\n|\r|\n")
_BLOCK = 1 << 16


def _first_line_start(data: bytes) -> int | None:
    """The offset in `data` (the bytes from the one before the range to its end) of the first line that starts
    in the range, or None. A line starts after \n, after \r\n, and after a \r that no \n follows."""
    if data[:1] == b"\n" or (data[:1] == b"\r" and data[1:2] != b"\n"):
        return 1 if len(data) > 1 else None
    match = _LINE_ENDS.search(data, 1)
    # a line end that ends the range (a \r there may have its \n after it): the next line is the next range's
    return match.end() if match is not None and match.end() < len(data) else None


def _finish_line(raw, data: bytes, end: int) -> bytes:
    """The bytes after `end` that complete the last line of `data` (its line end included)."""
    if not data or data.endswith(b"\n"):
        return b""
    raw.seek(end)
    if data.endswith(b"\r"):
        return b"\n" if raw.read(1) == b"\n" else b""
    tail = []
    while True:
        block = raw.read(_BLOCK)
        if not block:
            return b"".join(tail)
        match = _LINE_ENDS.search(block)
        if match is None:
            tail.append(block)
        elif match.group() == b"\r" and match.end() == len(block):
            return b"".join(tail) + block + (b"\n" if raw.read(1) == b"\n" else b"")
        else:
            return b"".join(tail) + block[:match.end()]


_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


def _text_lines(data: bytes, offset: int, tail: bytes, bom: bool):
    """The lines of data[offset:] + tail, decoded one by one (they end at ASCII bytes, so each decodes as the
    whole would): the range's bytes are held once, not copied."""
    end = len(data)
    for match in _LINE.finditer(data, offset):
        line = match.group()
        if tail and match.end() == end:
            line += tail
        if bom:
            bom = False
            line = line.removeprefix(codecs.BOM_UTF8)
        yield line.decode("utf-8", "replace")


def range_lines(raw, item: Range):
    """(the lines that start in the range, where the byte after them is): read from the binary file `raw`."""
    if item.end < 0:
        return text_stream(raw), None
    if item.start == 0:
        raw.seek(0)
        data = raw.read(item.end)
        offset = 0
    else:
        raw.seek(item.start - 1)
        data = raw.read(item.end - item.start + 1)
        offset = _first_line_start(data)
        if offset is None:
            return iter(()), None
    tail = _finish_line(raw, data, item.end)
    # the first line of the file: its BOM goes, as utf-8-sig reads it (the whole line is there, tail included)
    return _text_lines(data, offset, tail, item.start == 0), item.end + len(tail)


def lines_from(path: str, offset: int):
    """The lines of the manifest from byte `offset` (a line start) on, opened only when asked for."""
    if offset is None:
        return
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
        raw.seek(offset)
        yield from io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")


def count_records(lines, fmt: str) -> dict[int, tuple[int, int]]:
    """{state at the range's first line: (records that start in the range, state after it)}, for START and
    QUOTED: what a range contributes to the row numbers of the ranges after it, whatever came before."""
    if fmt != "csv":
        n = sum(1 for _ in lines)
        return {START: (n, START), QUOTED: (n, START)}
    states, counts = [START, QUOTED], [0, 0]
    lines = iter(lines)
    for line in lines:
        for k in (0, 1):
            if states[k] == START:
                counts[k] += 1
            states[k] = csv_line_state(line, states[k])
        if states[0] == states[1]:  # the same from here on: follow one
            rest = 0
            state = states[0]
            for line in lines:  # noqa: B020
                if state == START:
                    rest += 1
                state = csv_line_state(line, state)
            return {START: (counts[0] + rest, state), QUOTED: (counts[1] + rest, state)}
    return {START: (counts[0], states[0]), QUOTED: (counts[1], states[1])}


def range_starts(counts) -> dict[int, tuple[int, int]]:
    """{range index: (records before it, state at its first line)} from (index, count_records) of every range
    but the last."""
    starts, records, state = {0: (0, START)}, 0, START
    for index, by_state in sorted(counts):
        n, state = by_state[state]
        records += n
        starts[index + 1] = (records, state)
    return starts


class RowFields(NamedTuple):
    """A data row of a manifest or metadata file: its number, and its {column: value} or why it cannot be read.
    (A named tuple travels pickled: a JSON string may hold a lone surrogate, which Beam's str coder refuses.)"""

    row: int
    fields: dict | str


def range_fields(path: str, item: Range, fmt: str, before: int, state: int, header: list[str]):
    """RowFields of every data record that starts in the range."""
    with FileSystems.open(path, compression_type="auto" if item.end < 0 else CompressionTypes.UNCOMPRESSED) as raw:
        lines, after = range_lines(raw, item)
        records = group_records(lines, fmt, state, more=lines_from(path, after))
        for k, record in enumerate(records):
            number = before + k  # the record's index in the file: the CSV header is 0
            row = number if fmt == "csv" else number + 1
            if row == 0:
                continue
            yield RowFields(row, record_fields(record, fmt, header))


class _CountRecords(beam.DoFn):
    """Range -> (index, count_records): what the range adds to the row numbers after it (every range but the
    last)."""

    def __init__(self, manifest: str, fmt: str):
        self._manifest, self._fmt = manifest, fmt

    def process(self, item: Range):
        if item.last:
            return
        with FileSystems.open(self._manifest, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
            lines, _ = range_lines(raw, item)
            yield item.index, count_records(lines, self._fmt)


class _RangeRows(beam.DoFn):
    """Range -> (row number, {column: value} or why it cannot be read) for each data row that starts in it,
    plus ROWS: the number of its rows."""

    def __init__(self, path: str, fmt: str):
        self._path, self._fmt = path, fmt
        self._header = None

    def header(self) -> list[str]:
        if self._header is None:
            self._header = []
            if self._fmt == "csv":
                with FileSystems.open(self._path, compression_type="auto") as raw:
                    stream = text_stream(raw)
                    self._header = header_of(next(group_records(stream, "csv"), None))
        return self._header

    def process(self, item: Range, starts: dict):
        before, state = starts[item.index]
        rows = 0
        for result in range_fields(self._path, item, self._fmt, before, state, self.header()):
            rows += 1
            yield result
        yield beam.pvalue.TaggedOutput(ROWS, rows)


ROWS = "row_counts"


class ReadRows(beam.PTransform):
    """PBegin -> (row number, {column: value} or why the row cannot be read) of every data row of a CSV (with a
    header) or JSON Lines file, read in parallel: cut into byte ranges, each range's records counted (so that
    every row gets the number a sequential read gives it), then every range parsed where it lands. ROWS: the
    number of rows of each range. Used for --manifest and --metadata.
    """

    def __init__(self, path: str, fmt: str, range_bytes: int = 0):
        super().__init__()
        self._path, self._fmt, self._range_bytes = path, fmt, range_bytes or RANGE_BYTES

    def expand(self, pbegin):
        path, range_bytes = self._path, self._range_bytes
        ranges = (pbegin
                  | "File" >> beam.Create([path])
                  # one Range per 64 MiB: a few numbers per range
                  | "Ranges" >> beam.FlatMap(lambda p: manifest_ranges(p, range_bytes))
                  | "SpreadRanges" >> beam.Reshuffle())
        counts = ranges | "CountRows" >> beam.ParDo(_CountRecords(path, self._fmt))
        # {range index: (records before it, CSV state at its first line)}: one pair per range
        starts = (counts
                  | "AllCounts" >> beam.combiners.ToList()
                  | "RangeStarts" >> beam.Map(range_starts))
        return ranges | "ReadRows" >> beam.ParDo(
            _RangeRows(path, self._fmt), starts=beam.pvalue.AsSingleton(starts)).with_outputs(ROWS, main="fields")
