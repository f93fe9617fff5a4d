"""ReadRows: a CSV (with a header) or JSON Lines file read in parallel, every row with the number a sequential
read gives it.

The file is cut into byte ranges (RANGE_BYTES). A range holds the records whose first line starts in it, the
split-at-newline rule of Beam's text source; a CSV record may span lines inside a quoted field, which
`csv_line_state` follows as Python's csv reader does. Every range but the last is counted first, in
parallel: its physical lines, and what it adds to the row numbers after it, for a range that starts at a
record and for one that starts inside a quoted field (`count_records`); the counts, one per range, are summed
into each range's first row number, CSV state and line number (`range_starts`), and every range is then
parsed where it lands. A compressed file cannot be cut: it is one range, read as a stream by one worker.

Every row is counted, none vanishes: lines are read through a bounded reader (`file_lines`: a line over
MAX_LINE_BYTES is read through, not held, and is one rejected row), bytes that are not UTF-8 make their row
a rejection (never a U+FFFD inside a label), a compressed file that ends early is an error (TruncatedFile),
and a CSV quoted field that takes lines which read as rows of their own (a stray quote) is one rejected row
that names its lines (`record_fields`).

Used by --manifest (transforms.inputs.manifest) and --metadata (transforms.inputs.metadata); each turns the
RowFields into its own rows. --split_lists (transforms.inputs.split_lists) reads its lists as LINES: one record a
physical line, no header, its text as it is (bytes that are not UTF-8 kept: they may name a file).
"""

from __future__ import annotations

import bz2
import contextlib
import csv
import io
import itertools
import lzma
import re
import zlib
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.base import bounded
from transforms.base.paths import IMAGE_EXTENSIONS

# The file is cut into ranges of this many bytes, each parsed by any worker. A range holds the rows
# (records) whose first line starts in it, the standard split-at-newline rule of Beam's text source.
RANGE_BYTES = 64 * 1024 * 1024
# A CSV record longer than this (a quote that is never closed swallows the lines after it) is rejected; its
# text is not held.
MAX_RECORD_CHARS = 1 << 20
# A physical line longer than this is read through without being held: one rejected row.
MAX_LINE_BYTES = 1 << 20
_BLOCK = 1 << 16
LINES = "lines"  # a format of plain text lines: every physical line is a row, {"line": its text without its end}

START, QUOTED = 0, 1  # a physical line starts a CSV record, or continues a quoted field of the record before
_START_FIELD, _IN_FIELD, _IN_QUOTED, _QUOTE_IN_QUOTED = range(4)


class TruncatedFile(Exception):
    """A compressed manifest or metadata file that ends before its compressed stream does, or is damaged: read
    as complete, it would lose its last rows (or cut one into a new class); also a dataset's damaged sources file
    (`transforms.inputs.append`), which would let an append write an image twice."""


class UnclosedQuote(TruncatedFile):
    """A CSV file that ends inside a quoted field: the quote opened in `line` takes every line after it as one
    value. pandas and Python's csv module in strict mode refuse such a file; read on, it would lose every row
    after the quote. `of(path)` names the file."""

    def __init__(self, line: int, lines: int, path: str = ""):
        self.line, self.lines, self.path = line, lines, path
        where = f"the CSV file {path}" if path else "the CSV file"
        super().__init__(f"{where} ends before the quoted field opened in line {line} is closed: a stray \" takes the "
                         f"{lines - 1} line(s) after it, to the end of the file, as one value; close the quote, or "
                         "double it (\"\")")

    def of(self, path: str) -> UnclosedQuote:
        return UnclosedQuote(self.line, self.lines, path)

    def __reduce__(self):
        return UnclosedQuote, (self.line, self.lines, self.path)


# --- Compressed files, read with their end checked ------------------------------------------------------


def _decompressor(kind: str):
    if kind == CompressionTypes.GZIP:
        return zlib.decompressobj(zlib.MAX_WBITS | 16)
    if kind == CompressionTypes.DEFLATE:
        return zlib.decompressobj()
    if kind == CompressionTypes.BZIP2:
        return bz2.BZ2Decompressor()
    return lzma.LZMADecompressor()


CHECKED_COMPRESSION = (CompressionTypes.GZIP, CompressionTypes.DEFLATE, CompressionTypes.BZIP2,
                       CompressionTypes.LZMA)


class _Decompressed(io.RawIOBase):
    """The bytes of a compressed file, a bounded piece at a time (a small file that inflates to gigabytes is
    never inflated whole), and an end that is checked: a stream that stops before its end marker (an
    interrupted copy) or holds damaged data raises TruncatedFile. Concatenated members are read in turn.
    (Beam's CompressedFile inflates 16 MiB of input at once and takes a cut stream as complete.)"""

    def __init__(self, raw, kind: str, path: str):
        super().__init__()
        self._raw, self._kind, self._path = raw, kind, path
        self._zlib = kind in (CompressionTypes.GZIP, CompressionTypes.DEFLATE)
        self._d = _decompressor(kind)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def _fail(self, what: str):
        raise TruncatedFile(f"the compressed file {self._path} {what}: an interrupted copy? Copy it again, or "
                            "give the file uncompressed") from None

    def _input(self) -> bytes:
        data, self._pending = self._pending, b""
        return data or self._raw.read(_BLOCK)

    def readinto(self, buffer) -> int:
        want = len(buffer)
        if not want:  # read(0) asks for nothing (ijson probes a stream with it): zlib would take 0 as "all"
            return 0
        while True:
            d = self._d
            try:
                if d.eof:
                    rest = d.unused_data or self._input()
                    if not rest:
                        return 0
                    self._d, self._pending = _decompressor(self._kind), rest  # the next member
                    continue
                if self._zlib:
                    data = self._input()
                    out = d.decompress(data, want)
                    self._pending = d.unconsumed_tail
                else:
                    data = self._input() if d.needs_input else b""
                    out = d.decompress(data, want)
            except (zlib.error, OSError, EOFError, lzma.LZMAError) as e:
                self._fail(f"is damaged ({e})")
            if out:
                buffer[:len(out)] = out
                return len(out)
            if not data and not d.eof:
                self._fail("ends before its compressed stream does (it is cut short)")


@contextlib.contextmanager
def open_file(path: str):
    """The binary file at `path`: a compressed one (.gz, .bz2, .xz, .lzma, .deflate) as its checked, bounded
    inflated bytes (other compressions through Beam)."""
    kind = CompressionTypes.detect_compression_type(path)
    if kind == CompressionTypes.UNCOMPRESSED or kind not in CHECKED_COMPRESSION:
        with FileSystems.open(path, compression_type="auto") as raw:
            yield raw
        return
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
        yield _Decompressed(raw, kind, path)


# --- Physical lines, bounded ----------------------------------------------------------------------------


def _scan(text, s: int) -> int:
    """The internal CSV state after `text` (str or bytes) read from internal state `s`."""
    quote, comma = ('"', ",") if isinstance(text, str) else (b'"', b",")
    i, n = 0, len(text)
    while i < n:
        if s == _IN_QUOTED:
            i = text.find(quote, i) + 1
            if not i:
                return _IN_QUOTED
            s = _QUOTE_IN_QUOTED
        elif s == _IN_FIELD:
            i = text.find(comma, i) + 1
            if not i:
                return _IN_FIELD
            s = _START_FIELD
        else:  # at a field's start, or just after a quote inside a quoted field
            c = text[i:i + 1]
            i += 1
            s = _IN_QUOTED if c == quote else _START_FIELD if c == comma else _IN_FIELD
    return s


class LongLine(str):
    """A physical line over MAX_LINE_BYTES, read through and not held: its text is ''. `size`: its bytes;
    `ends`: the CSV state after it, read in START and in QUOTED."""

    size: int
    ends: tuple

    def __new__(cls, size: int, ends: tuple):
        line = super().__new__(cls, "")
        line.size, line.ends = size, ends
        return line


class _LongScan:
    """A line being read through: its size, and the CSV state after it for both entry states."""

    def __init__(self):
        self.size, self.states = 0, [_START_FIELD, _IN_QUOTED]

    def add(self, data: bytes):
        self.size += len(data)
        self.states = [_scan(data, s) for s in self.states]

    def line(self) -> LongLine:
        return LongLine(self.size, tuple(QUOTED if s == _IN_QUOTED else START for s in self.states))


_LINE_END = re.compile(rb"\r\n|\r|\n")


def raw_lines(raw, limit: int | None = None):
    """(line bytes or LongLine, its size in bytes) of every physical line of the binary stream `raw` from where
    it is: line ends kept (\\n, \\r\\n, or a lone \\r); a line over `limit` bytes (MAX_LINE_BYTES) is read
    through a block at a time, never held."""
    limit = MAX_LINE_BYTES if limit is None else limit
    buf, pos, eof, long = b"", 0, False, None
    while True:
        match = _LINE_END.search(buf, pos)
        # a \r that ends what was read may have its \n in the next block
        if match is not None and not (match.group() == b"\r" and match.end() == len(buf) and not eof):
            if long is not None:
                long.add(buf[pos:match.end()])
                yield long.line(), long.size
                long = None
            elif match.end() - pos > limit:
                scan = _LongScan()
                scan.add(buf[pos:match.end()])
                yield scan.line(), scan.size
            else:
                yield buf[pos:match.end()], match.end() - pos
            pos = match.end()
            continue
        if eof:
            if long is not None:
                long.add(buf[pos:])
                yield long.line(), long.size
            elif pos < len(buf):
                yield buf[pos:], len(buf) - pos
            return
        keep = buf[pos:]
        if long is None and len(keep) > limit:
            long = _LongScan()
        if long is not None:  # hold only a \r that may be half of a \r\n
            cut = len(keep) - (1 if keep.endswith(b"\r") else 0)
            long.add(keep[:cut])
            keep = keep[cut:]
        block = raw.read(_BLOCK)
        eof = not block
        buf, pos = keep + block, 0


_BOM = b"\xef\xbb\xbf"


def decoded(items, bom: bool = True):
    """The lines of raw_lines as text, UTF-8: bytes that are not UTF-8 kept as lone surrogates (surrogateescape,
    found by `not_utf8`, never a U+FFFD); a BOM at the start dropped when `bom`."""
    for line, _ in items:
        if not isinstance(line, LongLine):
            if bom:
                line = line.removeprefix(_BOM)
            line = line.decode("utf-8", "surrogateescape")
        bom = False
        yield line


def file_lines(raw):
    """The text lines of a manifest opened with open_file (compressed or not), from its start: see decoded."""
    return decoded(raw_lines(raw))


_NOT_UTF8 = re.compile("[\udc80-\udcff]")
_LINE_BREAK = re.compile("\r\n|\r|\n")


def not_utf8(text: str, line: int) -> str | None:
    """Why `text` (a record from physical line `line`) cannot be read, if it holds bytes that are not UTF-8."""
    bad = _NOT_UTF8.search(text)
    if bad is None:
        return None
    before = text[:bad.start()]
    breaks = list(_LINE_BREAK.finditer(before))
    column = bad.start() - (breaks[-1].end() if breaks else 0) + 1
    return (f"the byte 0x{ord(bad.group()) - 0xdc00:02x} in line {line + len(breaks)}, character {column}, is not "
            "UTF-8 (the file was saved in another encoding, such as Latin-1 or Windows-1252): save it as UTF-8")


def csv_line_state(line: str, state: int) -> int:
    """START or QUOTED at the line after `line`, for `line` read in `state`.

    Python's csv reader (the excel dialect: ',' delimiter, '"' quotes, doubled quotes, not strict) ends a
    record at the end of a line unless the line ends inside a quoted field; a quote inside an unquoted field
    is a plain character. This is its state machine, reduced to what decides where records end (`_scan`).
    """
    if isinstance(line, LongLine):
        return line.ends[state]
    if '"' not in line:
        return state
    return QUOTED if _scan(line, _IN_QUOTED if state == QUOTED else _START_FIELD) == _IN_QUOTED else START


class Record(NamedTuple):
    text: str  # the record's lines ('' if too long)
    lines: int
    too_long: bool = False
    first: int = 0  # the index of its first line among the lines read (0: the first)
    closed: bool = True  # False: a quoted field still open at the end of the file
    size: int = 0  # its characters (a line over MAX_LINE_BYTES counts its bytes)


def group_records(lines, fmt: str, state: int = START, more=()):
    """Record for every record that starts in `lines` (an iterator of lines with their line ends).

    JSON Lines: one record a line. CSV: a line read in state QUOTED continues a record that started before
    `lines` and is skipped; a record whose quoted field is still open at the end of `lines` takes the lines
    it needs from `more`.
    """
    if fmt != "csv":
        for index, line in enumerate(lines):
            too_long = isinstance(line, LongLine)
            yield Record(line, 1, too_long, index, size=line.size if too_long else len(line))
        return
    lines = iter(lines)
    index = -1
    for line in lines:
        index += 1
        if state == QUOTED:
            state = csv_line_state(line, QUOTED)
            continue
        first = index
        parts, size, count, long = [line], _size(line), 1, isinstance(line, LongLine)
        state = csv_line_state(line, START)
        if state == QUOTED:
            rest = itertools.chain(lines, more)
            for line in rest:  # noqa: B020 - the record's continuation lines are taken from the same iterator
                index += 1
                count += 1
                size += _size(line)
                long = long or isinstance(line, LongLine)
                if size <= MAX_RECORD_CHARS:
                    parts.append(line)
                state = csv_line_state(line, QUOTED)
                if state == START:
                    break
        too_long = size > MAX_RECORD_CHARS or long
        yield Record("" if too_long else "".join(parts), count, too_long, first, state == START, size)
        state = START


def _size(line: str) -> int:
    return line.size if isinstance(line, LongLine) else len(line)


def _looks_like_rows(text: str, header: list[str]) -> list[int]:
    """The indexes (1 = the record's second line) of the lines after a multi-line record's first that, read on
    their own, are rows: as many fields as the header, and a path that looks like one (a '/' or an image
    extension). These are the rows a stray quote took. The last line is left out when the field that spans
    lines is the record's first (it then ends with the record's other fields)."""
    lines = _LINE_BREAK.split(text.rstrip("\r\n"))
    try:
        values = next(csv.reader((text,)), [])
    except csv.Error:
        values = []
    spanning = next((k for k, v in enumerate(values) if "\n" in v or "\r" in v), -1)
    path = header.index("path") if "path" in header else 0
    found = []
    for k, line in enumerate(lines[1:-1] if spanning == 0 else lines[1:], start=1):
        try:
            fields = next(csv.reader((line,)), [])
        except csv.Error:
            continue
        value = fields[path].strip().lower() if len(fields) == len(header) else ""
        if "/" in value or value.endswith(_IMAGE_ENDINGS):
            found.append(k)
    return found


class Problem(str):
    """Why a row cannot be read, of a `kind` that has a reason of its own: OPEN_QUOTE, NOT_UTF8 or LONG_LINE."""

    kind: str

    def __new__(cls, kind: str, text: str):
        problem = super().__new__(cls, text)
        problem.kind = kind
        return problem

    def __reduce__(self):
        return Problem, (self.kind, str(self))


OPEN_QUOTE, NOT_UTF8, LONG_LINE = "open_quote", "not_utf8", "long_line"


def _lines(first: int, count: int) -> str:
    return f"line {first}" if count == 1 else f"lines {first}-{first + count - 1}"


def record_fields(record: Record, fmt: str, header: list[str], line: int = 0) -> dict | str:
    """The {column: value} of a data row's record (columns lower case), or why it cannot be read. `line`: the
    record's first physical line (1 = the file's first).

    Raises:
        UnclosedQuote: a CSV record whose quoted field the file's end leaves open (the rows after it are lost).
    """
    if fmt == "csv" and not record.closed:
        raise UnclosedQuote(line, record.lines)
    if fmt == LINES and not record.too_long:
        return {"line": record.text.rstrip("\r\n")}
    if record.too_long:
        where = _lines(line, record.lines)
        if record.lines == 1:
            return Problem(LONG_LINE, f"{where} is over {MAX_LINE_BYTES // 1024} KiB ({record.size} bytes), read "
                           "through and not held: a row is a path, a label and a few values; check the file")
        return Problem(OPEN_QUOTE, f"{where}: over {MAX_RECORD_CHARS // 1024} KiB in {record.lines} lines: a quoted "
                       "field that is never closed (a stray \" ?) takes the lines after it; close the quote, or "
                       "double it (\"\")")
    bad = not_utf8(record.text, line)
    if bad:
        return Problem(NOT_UTF8, bad)
    if fmt != "csv":
        return _json_fields(record.text, header)
    where = _lines(line, record.lines) if record.lines > 1 else ""
    if record.lines > 1:
        rows = _looks_like_rows(record.text, header)
        if rows:
            return Problem(OPEN_QUOTE, f"{where}: a quoted field opened in line {line} takes the {record.lines - 1} "
                           f"line(s) after it, {len(rows)} of which read as rows of their own (the first: line "
                           f"{line + rows[0]}); a stray \" ? close the quote, or double it (\"\"); these "
                           f"{record.lines} lines are this one rejected row")
    try:
        values = next(csv.reader((record.text,)), [])  # one record: its line breaks are inside quotes
    except csv.Error as e:
        return f"not CSV ({e})"
    if not any(v.strip() for v in values):
        return "an empty row"
    if len(values) != len(header):
        return f"{len(values)} fields, the header has {len(header)}"
    return dict(zip(header, values, strict=True))


_IMAGE_ENDINGS = tuple(sorted(IMAGE_EXTENSIONS))


def _json_fields(text: str, header: list[str]) -> dict | str:
    """A JSON Lines row's {key: value} (keys lower case), or why it cannot be read: not a JSON object, a key
    given twice (`"path"` twice, or `Label` and `label`: the last would win), or a key that the first line does
    not have (`header`: the first line's keys are the file's columns, as a CSV header's names are)."""
    if not text.strip():
        return "an empty line"
    repeated = []

    def pairs_hook(pairs):
        keys = [str(k).lower() for k, _ in pairs]
        repeated.extend(k for i, k in enumerate(keys) if k in keys[:i])
        return dict(pairs)

    try:
        fields = bounded.loads(text, object_pairs_hook=pairs_hook)
    except ValueError as e:
        return f"not JSON ({e})"
    if not isinstance(fields, dict):
        return "not a JSON object"
    if repeated:
        return (f"the key {_shown_key(repeated[0])} is given twice in the row (keys are not case-sensitive), and "
                "only one value can be read: give each key once")
    fields = {str(k).lower(): v for k, v in fields.items()}
    unknown = [k for k in fields if header and k not in header]
    if unknown:
        shown = ", ".join(_shown_key(k) for k in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        return (f"the key(s) {shown} are not in the first line, whose keys are the file's columns "
                f"({', '.join(_shown_key(k) for k in header[:10])}{' ...' if len(header) > 10 else ''}): give the "
                "first line every key (null where it has no value)")
    return fields


def _shown_key(key: str) -> str:
    return ascii(key[:40]) if not key.isprintable() else repr(key[:40])


def jsonl_header(record: Record | None) -> list[str]:
    """A JSON Lines file's columns: the keys of its first line (lower case), or [] when it is not a JSON object
    (the launcher refuses such a file)."""
    if record is None or record.too_long:
        return []
    try:
        first = bounded.loads(record.text)
    except ValueError:
        return []
    return [str(k).lower() for k in first] if isinstance(first, dict) else []


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
    file, as a stream (a compressed manifest cannot be cut). `file`: which of ReadRows' files (0: the first)."""

    index: int
    start: int
    end: int
    last: bool = True
    file: int = 0


def is_compressed(path: str) -> bool:
    return CompressionTypes.detect_compression_type(path) != CompressionTypes.UNCOMPRESSED


def manifest_ranges(path: str, range_bytes: int = RANGE_BYTES, file: int = 0) -> list[Range]:
    """The manifest's ranges: one per `range_bytes` (at least one); a compressed manifest is one stream. `file`:
    the file's index among ReadRows' files."""
    if is_compressed(path):
        return [Range(0, 0, -1, file=file)]
    size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
    count = max(1, -(-size // range_bytes))
    return [Range(i, i * range_bytes, min(size, (i + 1) * range_bytes), i == count - 1, file)
            for i in range(count)]


def range_lines(raw, item: Range):
    """(the text lines that start in the range, the lines after them to the end of the file): two iterators
    over one bounded read of the binary file `raw` (the second is for a record whose quoted field is still
    open at the range's end; read it after the first)."""
    if item.end < 0:
        return file_lines(raw), iter(())
    if item.start == 0:
        raw.seek(0)
        items, offset = raw_lines(raw), 0
    else:
        # from the byte before the range: the rest of the line that holds it ends where the range's first starts
        raw.seek(item.start - 1)
        items = raw_lines(raw)
        offset = item.start - 1 + next(items, (b"", 1))[1]
    pending = []

    def inside(offset=offset, end=item.end):
        for line, size in items:
            if offset >= end:
                pending.append((line, size))
                return
            offset += size
            yield line, size

    def after():
        yield from pending
        yield from items

    return decoded(inside(), bom=item.start == 0), decoded(after(), bom=False)


class RangeCount(NamedTuple):
    """What a range adds to the ranges after it: its physical lines, and {state at its first line: (records
    that start in it, state after it)} for START and QUOTED."""

    lines: int
    by_state: dict


def count_records(lines, fmt: str) -> RangeCount:
    """What a range contributes to the row (and line) numbers of the ranges after it, whatever came before."""
    counted = [0]

    def counting(lines):
        for line in lines:
            counted[0] += 1
            yield line

    by_state = _count_by_state(counting(lines), fmt)
    return RangeCount(counted[0], by_state)


def _count_by_state(lines, fmt: str) -> dict[int, tuple[int, int]]:
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


class RangeStart(NamedTuple):
    """Where a range starts: the records before it, the CSV state at its first line, the lines before it."""

    records: int
    state: int
    lines: int = 0


def range_starts(counts) -> dict[int, RangeStart]:
    """{range index: RangeStart} from (index, RangeCount) of every range but the last."""
    starts, records, state, lines = {0: RangeStart(0, START, 0)}, 0, START, 0
    for index, count in sorted(counts):
        n, state = count.by_state[state]
        records += n
        lines += count.lines
        starts[index + 1] = RangeStart(records, state, lines)
    return starts


class RowFields(NamedTuple):
    """A data row of a manifest or metadata file: its number, and its {column: value} or why it cannot be read;
    its first physical line and its number of lines; which of ReadRows' files holds it (0: the first). (A named
    tuple travels pickled: a JSON string may hold a lone surrogate, which Beam's str coder refuses.)"""

    row: int
    fields: dict | str
    line: int = 0
    lines: int = 1
    file: int = 0


def range_fields(path: str, item: Range, fmt: str, start: RangeStart, header: list[str]):
    """RowFields of every data record that starts in the range."""
    with open_file(path) if item.end < 0 else FileSystems.open(
            path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
        lines, more = range_lines(raw, item)
        records = group_records(lines, fmt, start.state, more=more)
        for k, record in enumerate(records):
            number = start.records + k  # the record's index in the file: the CSV header is 0
            row = number if fmt == "csv" else number + 1
            if row == 0:
                continue
            line = start.lines + record.first + 1
            try:
                fields = record_fields(record, fmt, header, line)
            except UnclosedQuote as e:
                raise e.of(path) from None
            yield RowFields(row, fields, line, record.lines, item.file)


def read_records(lines, fmt: str):
    """(header, RowFields of every data row) of a whole file's text lines, streamed (one reader: the
    launcher's sample)."""
    records = group_records(lines, fmt)
    if fmt == "csv":
        header = header_of(next(records, None))
    else:  # the first line is a row too: its keys are the columns
        first = next(records, None)
        header = jsonl_header(first)
        records = itertools.chain([first] if first is not None else [], records)

    def rows():
        for row, record in enumerate(records, start=1):
            line = record.first + 1
            yield RowFields(row, record_fields(record, fmt, header, line), line, record.lines)

    return header, rows()


class _CountRecords(beam.DoFn):
    """Range -> ((file, index), RangeCount): what the range adds to the row and line numbers after it in its file
    (every range but the last)."""

    def __init__(self, paths: tuple[str, ...], fmt: str):
        self._paths, self._fmt = paths, fmt

    def process(self, item: Range):
        if item.last:
            return
        with FileSystems.open(self._paths[item.file], compression_type=CompressionTypes.UNCOMPRESSED) as raw:
            lines, _ = range_lines(raw, item)
            yield (item.file, item.index), count_records(lines, self._fmt)


def file_starts(counts) -> dict[int, dict[int, RangeStart]]:
    """{file: {range index: RangeStart}} from ((file, index), RangeCount) of every range but each file's last."""
    by_file: dict[int, list] = {}
    for (file, index), count in counts:
        by_file.setdefault(file, []).append((index, count))
    return {file: range_starts(items) for file, items in by_file.items()}


_FIRST_RANGE = {0: RangeStart(0, START, 0)}  # the starts of a file of one range (none of its ranges is counted)


class _RangeRows(beam.DoFn):
    """Range -> RowFields for each data row that starts in it, plus ROWS: the number of its rows, and SPANNING:
    (row, first line, lines) of each usable CSV row whose quoted field spans lines (with several files, and its
    file's index)."""

    def __init__(self, paths: tuple[str, ...], fmt: str):
        self._paths, self._fmt = paths, fmt
        self._headers: dict[int, list[str]] = {}

    def header(self, file: int = 0) -> list[str]:
        if file not in self._headers and self._fmt == LINES:
            self._headers[file] = []  # plain lines: no header
        elif file not in self._headers:
            with open_file(self._paths[file]) as raw:
                first = next(group_records(file_lines(raw), self._fmt), None)
            self._headers[file] = header_of(first) if self._fmt == "csv" else jsonl_header(first)
        return self._headers[file]

    def process(self, item: Range, starts: dict):
        rows = 0
        start = starts.get(item.file, _FIRST_RANGE)[item.index]
        for result in range_fields(self._paths[item.file], item, self._fmt, start, self.header(item.file)):
            rows += 1
            if result.lines > 1 and not isinstance(result.fields, str):
                where = (result.row, result.line, result.lines)  # and with several files, which one
                yield beam.pvalue.TaggedOutput(SPANNING, (*where, result.file) if len(self._paths) > 1 else where)
            yield result
        yield beam.pvalue.TaggedOutput(ROWS, rows)


ROWS = "row_counts"
SPANNING = "spanning_rows"  # (row, first line, lines) of a usable row that spans lines (a quoted line break)
SPANNING_ROWS = "spanning_rows"  # its kind in a SummariseRows dict
EXAMPLES = 10


def spanned(item: tuple, names: tuple[str, ...] = ()) -> tuple:
    """SPANNING's (row, first line, lines[, file]) -> a SummariseRows event: (SPANNING_ROWS, row, 'lines a-b'); with
    `names` (the files' names, when there are several), 'name lines a-b'."""
    row, line, lines, *file = item
    where = _lines(line, lines)
    return SPANNING_ROWS, row, f"{names[file[0]]} {where}" if names and file else where


class SummariseRows(beam.CombineFn):
    """(kind, row, detail) events -> {total: sum, ..., kind: count, ..., "examples": {kind: [{"row", "detail"}]}}:
    for each of `totals` the sum of its events' numbers, for each of `kinds` its count and first EXAMPLES rows
    (by row number)."""

    def __init__(self, kinds: tuple, totals: tuple = ()):
        super().__init__()
        self._kinds, self._totals = tuple(kinds), tuple(totals)

    def create_accumulator(self):
        return {**{k: 0 for k in self._totals}, **{k: 0 for k in self._kinds}}, {k: [] for k in self._kinds}

    def add_input(self, acc, event):
        counts, examples = acc
        kind, number, detail = event
        if kind in self._totals:
            counts[kind] += number
        else:
            counts[kind] += 1
            examples[kind] = sorted([*examples[kind], (number, detail)])[:EXAMPLES]
        return acc

    def merge_accumulators(self, accumulators):
        counts, examples = self.create_accumulator()
        for c, e in accumulators:
            for k, v in c.items():
                counts[k] += v
            for k, v in e.items():
                examples[k] = sorted([*examples[k], *v])[:EXAMPLES]
        return counts, examples

    def extract_output(self, acc):
        counts, examples = acc
        return {**counts, "examples": {k: [{"row": row, "detail": detail} for row, detail in v]
                                       for k, v in examples.items() if v}}


class ReadRows(beam.PTransform):
    """PBegin -> RowFields of every data row of a CSV (with a header) or JSON Lines file, or of several files of one
    format, read in parallel: each cut into byte ranges, each range's records counted (so that every row gets the
    number a sequential read of its file gives it), then every range parsed where it lands. ROWS: the number of
    rows of each range; SPANNING: (row, first line, lines[, file]) of each usable row that spans lines. Used for
    --manifest and --metadata.
    """

    def __init__(self, path: str | tuple[str, ...] | list[str], fmt: str, range_bytes: int = 0):
        super().__init__()
        self._paths = (path,) if isinstance(path, str) else tuple(path)
        self._fmt, self._range_bytes = fmt, range_bytes or RANGE_BYTES

    def expand(self, pbegin):
        range_bytes = self._range_bytes
        ranges = (pbegin
                  | "File" >> beam.Create(list(enumerate(self._paths)))
                  # one Range per 64 MiB of each file: a few numbers per range
                  | "Ranges" >> beam.FlatMapTuple(lambda file, p: manifest_ranges(p, range_bytes, file))
                  | "SpreadRanges" >> beam.Reshuffle())
        counts = ranges | "CountRows" >> beam.ParDo(_CountRecords(self._paths, self._fmt))
        # {file: {range index: RangeStart}}: one per range
        starts = (counts
                  | "AllCounts" >> beam.combiners.ToList()
                  | "RangeStarts" >> beam.Map(file_starts))
        return ranges | "ReadRows" >> beam.ParDo(
            _RangeRows(self._paths, self._fmt), starts=beam.pvalue.AsSingleton(starts)).with_outputs(
                ROWS, SPANNING, main="fields")
