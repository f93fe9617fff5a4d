"""A --manifest read by byte ranges, step by step as the job does, and read whole, for the manifest tests."""

from __future__ import annotations

import random

from transforms.inputs import manifest as m
from transforms.inputs import rows as reading


def sequential(path, fmt):
    """The manifest's rows as one reader reads the whole file (transforms.inputs.manifest.read_rows)."""
    with open(path, "rb") as raw:
        return list(m.read_rows(reading.file_lines(raw), fmt, "/base"))


def ranged(path, fmt, range_bytes):
    """What the job does, step by step: ranges, counts of every range but the last, starts, parse each range."""
    ranges = reading.manifest_ranges(str(path), range_bytes)
    counts = []
    for item in ranges:
        if not item.last:
            with open(path, "rb") as raw:
                lines, _ = reading.range_lines(raw, item)
                counts.append((item.index, reading.count_records(lines, fmt)))
    starts = reading.range_starts(reversed(counts))  # in any order
    with open(path, "rb") as raw:  # the CSV header's names, or a JSON Lines file's first keys
        first = next(reading.group_records(reading.file_lines(raw), fmt), None)
    header = reading.header_of(first) if fmt == "csv" else reading.jsonl_header(first)
    rows = []
    for item in random.Random(len(ranges)).sample(ranges, len(ranges)):  # in any order
        rows += m.parse_range(str(path), item, fmt, "/base", starts[item.index], header)
    return sorted(rows, key=lambda r: r[0]), len(ranges)


def assert_every_cut_reads_the_same(path, fmt):
    """Cut in ranges of every size from 1 byte to past its end, the manifest gives its sequential rows, in the
    expected number of ranges; returns those rows."""
    expected = sequential(path, fmt)
    size = path.stat().st_size
    for range_bytes in range(1, size + 2):
        got, count = ranged(path, fmt, range_bytes)
        assert got == expected, (range_bytes, got, expected)
        assert count == max(1, -(-size // range_bytes))
    return expected
