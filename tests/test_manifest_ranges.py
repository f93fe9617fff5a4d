"""--manifest read in parallel: byte ranges, each parsed by any worker, give the rows and row numbers of a
sequential read (transforms.inputs.manifest.read_rows), whatever the cut."""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import random

import pytest
from PIL import Image

from tests.error_lines import nothing_converted_line, unpublished
from tests.manifest_helpers import assert_every_cut_reads_the_same, ranged, sequential
from transforms.inputs import manifest as m
from transforms.inputs import rows as reading

CSV_CASES = {
    "lf": b"path,label\na.png,x\nb.png,y\n\nc.png,z,extra\nd.png,w\n",
    "crlf": b"path,label\r\na.png,x\r\nb.png,y\r\n\r\nc.png\r\nd.png,w\r\n",
    "bare_cr": b"path,label\ra.png,x\rb.png,y\r",
    "no_trailing_newline": b"path,label\na.png,x\nb.png,y",
    "header_only": b"path,label\n",
    "header_only_no_newline": b"path,label",
    "empty": b"",
    "bom": codecs.BOM_UTF8 + b"path,label\nab.png,x\n",
    "long_line": b"path,label\n" + b"a" * 50 + b".png,x\nb.png,y\n",  # ranges with no line start in them
    "quoted_newlines": b'path,label,note\n"a, b.png",x,"two\nlines"\nc.png,,\n"d.png",y,"3\r\nli\rnes"\ne.png,y,\n',
    "quotes_inside_fields": b'path,label\na"b.png,"x\ny"\n"c""d.png",z\ne.png,w\n',
    "utf8_and_invalid": "path,label\nñandú.png,ave\n".encode() + b"bad\xff\xfe.png,x\n" + "ü.png,é\n".encode(),
    "nul": b"path,label\na\x00.png,x\nb.png,y\n",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(CSV_CASES))
def test_csv_cut_anywhere_gives_the_sequential_rows(tmp_path, name):
    path = tmp_path / "m.csv"
    path.write_bytes(CSV_CASES[name])
    rows = assert_every_cut_reads_the_same(path, "csv")
    # and the sequential reader itself reads what Python's csv module reads
    text = CSV_CASES[name].decode("utf-8-sig", "replace")
    records = list(csv.reader(io.StringIO(text, newline="")))[1:]
    assert [r for r, _ in rows] == list(range(1, len(records) + 1))


def test_the_cases_mean_what_they_say(tmp_path):
    path = tmp_path / "m.csv"
    path.write_bytes(CSV_CASES["quoted_newlines"])
    rows = dict(sequential(path, "csv"))
    assert rows[1].relpath == "a, b.png" and rows[3].relpath == "d.png" and rows[4].relpath == "e.png"
    assert rows[2].reason == m.MISSING_LABEL and rows[2].detail.startswith("row 2:")
    path.write_bytes(CSV_CASES["nul"])
    rows = dict(sequential(path, "csv"))
    assert rows[1].relpath == "a\x00.png" and rows[2].relpath == "b.png"  # the file's read_error, later
    path.write_bytes(CSV_CASES["bom"])
    assert sequential(path, "csv")[0][1].relpath == "ab.png"


JSONL_CASES = {
    "lf": b'{"path": "a.png", "label": "x"}\n[1]\n\n{"path": "b.png"\n{"path": "c.png", "label": "y"}\n',
    "crlf_no_trailing": b'{"path": "a.png", "label": "x"}\r\n{"path": "b.png", "label": "y"}',
    "bom": codecs.BOM_UTF8 + b'{"path": "a.png", "label": "x"}\n',
    "long_line": b'{"path": "' + b"a" * 60 + b'.png", "label": "x"}\n{"path": "b.png", "label": "y"}\n',
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(JSONL_CASES))
def test_jsonl_cut_anywhere_gives_the_sequential_rows(tmp_path, name):
    path = tmp_path / "m.jsonl"
    path.write_bytes(JSONL_CASES[name])
    assert_every_cut_reads_the_same(path, "jsonl")


@pytest.mark.timeout(120)
def test_random_csv_texts_cut_anywhere_match_pythons_csv_reader(tmp_path):
    """Quotes anywhere, line ends of every kind: the record boundaries are the csv module's."""
    rng = random.Random(7)
    pieces = ["a", "b", ",", '"', "\n", "\r\n", "\r", "x,y", '"q"', '""', "a,b,c\n", '"p,\nq",r,s\n']
    path = tmp_path / "m.csv"
    checked = unclosed = 0
    for _ in range(300):
        text = "path,label,x\n" + "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        path.write_bytes(text.encode())
        # a file that ends inside a quoted field (the csv module takes a line after it into that field) is refused
        # whole, however it is cut: its last record would swallow the rows after the stray quote
        if list(csv.reader(io.StringIO(text + "\nSENTINEL\n", newline="")))[-1] != ["SENTINEL"]:
            with pytest.raises(reading.UnclosedQuote):
                sequential(path, "csv")
            for range_bytes in (1, 5, 13):
                with pytest.raises(reading.UnclosedQuote, match=f"the CSV file {path} ends before"):
                    ranged(path, "csv", range_bytes)
            unclosed += 1
            continue
        expected = sequential(path, "csv")
        records = list(csv.reader(io.StringIO(text, newline="")))
        assert len(expected) == len(records) - 1, text
        for row, result in expected:  # and the fields are the csv module's
            if isinstance(result, m.ManifestRow):
                # a label as written (never stripped: one with spaces is then a manifest_bad_label row)
                assert (result.relpath, result.class_name) == (records[row][0].strip(), records[row][1])
                checked += 1
            elif result.reason == m.BAD_ROW and "fields" in result.detail:
                assert result.detail == f"row {row}: {len(records[row])} fields, the header has 3"
        for range_bytes in (1, 2, 3, 5, 8, 13):
            assert ranged(path, "csv", range_bytes)[0] == expected, (text, range_bytes)
    assert checked > 100 and unclosed > 10  # usable rows among them, not only rejections, and unclosed quotes


@pytest.mark.timeout(60)
def test_a_quote_never_closed_refuses_the_file_not_a_crash(tmp_path, monkeypatch):
    """A stray quote at a field's start makes the rest of the file one quoted field (as Python's csv reads it,
    and pandas or csv in strict mode refuse): the file is refused with its name and the quote's line, however it
    is cut, never read as 2 rows of 52, a crash or a field held whole in memory."""
    monkeypatch.setattr(reading, "MAX_RECORD_CHARS", 200)
    path = tmp_path / "m.csv"
    path.write_bytes(b'path,label\na.png,x\n"b.png,y\n' + b"".join(b"c%d.png,z\n" % i for i in range(50)))
    with pytest.raises(reading.UnclosedQuote, match="ends before the quoted field opened in line 3 is closed"):
        sequential(path, "csv")
    for range_bytes in (1, 2, 7, 64, 200, 10_000):
        with pytest.raises(reading.UnclosedQuote) as caught:
            ranged(path, "csv", range_bytes)
        assert str(caught.value).startswith(f"the CSV file {path} ends before the quoted field opened in line 3 is "
                                            "closed: a stray \" takes the 50 line(s) after it, to the end of the file")
    # under the limit, a field larger than the csv module's own limit is a rejected row too
    monkeypatch.setattr(reading, "MAX_RECORD_CHARS", 1 << 20)
    csv.field_size_limit()
    path.write_bytes(b'path,label\n"' + b"b" * 140_000 + b'",y\nc.png,z\n')
    rows = sequential(path, "csv")
    assert rows[0][1].reason == m.BAD_ROW and "field larger than field limit" in rows[0][1].detail
    assert rows[1][1].relpath == "c.png"
    assert ranged(path, "csv", 4096)[0] == rows


def test_ranges_of_a_file(tmp_path):
    path = tmp_path / "m.csv"
    path.write_bytes(b"x" * 10)
    assert reading.manifest_ranges(str(path), 4) == [reading.Range(0, 0, 4, False), reading.Range(1, 4, 8, False),
                                                 reading.Range(2, 8, 10, True)]
    assert reading.manifest_ranges(str(path), 64) == [reading.Range(0, 0, 10, True)]
    path.write_bytes(b"")
    assert reading.manifest_ranges(str(path), 64) == [reading.Range(0, 0, 0, True)]
    gz = tmp_path / "m.csv.gz"
    gz.write_bytes(gzip.compress(b"path,label\na.png,x\n" * 100))
    assert reading.manifest_ranges(str(gz), 4) == [reading.Range(0, 0, -1, True)]  # cannot be cut: one stream


def _images(folder, names):
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        Image.new("RGB", (12, 12), (i * 7 % 256, 20, 30)).save(folder / name)


@pytest.mark.timeout(300)
def test_a_manifest_cut_into_many_ranges_in_the_job(tmp_path, monkeypatch):
    """End to end, with ranges of 64 bytes: every row once, the bad rows with their sequential row numbers, a
    quoted field with line breaks across range ends, the class names found in the job."""
    from tests.datasets import convert_manifest as _run
    from tests.datasets import error_rows as _errors

    data = tmp_path / "data"
    names = [f"img{i:03d}.png" for i in range(60)]
    _images(data, names)
    lines = ["path,label,note"]
    for i, name in enumerate(names):
        label = "abc"[i % 3]
        if i == 10:
            lines.append(f'{name},{label},"a note\nover\nthree lines, quoted"')
        elif i == 20:
            lines.append(f"{name},,")  # no label: row 21
        elif i == 30:
            lines.append(f"{name},{label}")  # two fields: row 31
        else:
            lines.append(f"{name},{label},n{i}")
    lines.append(f"{names[5]},a,again")  # row 61: a duplicate of row 6
    lines.append("bad\tlabel.png,x\ty,")  # row 62: a label labels.txt cannot hold
    (data / "m.csv").write_text("\r\n".join(lines) + "\r\n")
    monkeypatch.setattr(reading, "RANGE_BYTES", 64)
    out = tmp_path / "out"
    assert _run(data / "m.csv", out) == 0
    errors = {e["reason"]: e["detail"] for e in _errors(out)}
    assert errors == {
        "manifest_missing_label": "row 21: no label for 'img020.png'",
        "manifest_bad_row": "row 31: 2 fields, the header has 3",
        "manifest_duplicate_path": "row 61: the path is listed again, first in row 6; the first row is kept",
        "manifest_bad_label": "row 62: the label 'x\\ty' has a control character in its name, which labels.txt "
                              "cannot hold exactly: rename it",
    }
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == ["a", "b", "c"]
    assert (out / "labels.txt").read_text() == "a\nb\nc\n"
    files = info["files"]
    assert (files["found"], files["written"], files["rejected"], files["skipped"]) == (62, 58, 4, 0)
    counts = {}
    for split in info["splits"].values():
        for name, n in split["class_counts"].items():
            counts[name] = counts.get(name, 0) + n
    assert counts == {"a": 19, "b": 20, "c": 19}


def test_a_compressed_manifest_is_one_stream_with_the_same_rows(tmp_path):
    plain, packed = tmp_path / "m.csv", tmp_path / "m.csv.gz"
    plain.write_bytes(CSV_CASES["quoted_newlines"] + b"f.png,q,\n")
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    [whole] = reading.manifest_ranges(str(packed), 8)
    header = ["path", "label", "note"]
    rows = list(m.parse_range(str(packed), whole, "csv", "/base", reading.RangeStart(0, reading.START), header))
    assert rows == sequential(plain, "csv")


@pytest.mark.timeout(300)
def test_a_gz_manifest_end_to_end(tmp_path):
    """A .gz manifest: the launcher reads its header and sample, the job reads it as one stream."""
    from tests.datasets import convert_manifest as _run
    from tests.datasets import error_rows as _errors

    data = tmp_path / "data"
    names = [f"g{i}.png" for i in range(5)]
    _images(data, names)
    text = "path,label,note\n" + "".join(f'{n},{"xy"[i % 2]},"a\nb"\n' for i, n in enumerate(names)) + "g0.png,x,\n"
    (data / "m.csv.gz").write_bytes(gzip.compress(text.encode()))
    out = tmp_path / "out"
    assert _run(data / "m.csv.gz", out) == 0
    assert [(e["reason"], e["detail"][:6]) for e in _errors(out)] == [("manifest_duplicate_path", "row 6:")]
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == ["x", "y"] and (info["files"]["found"], info["files"]["written"]) == (6, 5)


@pytest.mark.timeout(300)
def test_a_manifest_without_a_usable_row_converts_nothing_and_says_why(tmp_path, capsys):
    """Before, the launcher refused it (it read every label); now the job finds no class: exit 1, nothing published,
    each row's reason in the run's unpublished errors.jsonl."""
    from tests.datasets import convert_manifest as _run
    from tests.datasets import error_rows as _errors

    data = tmp_path / "data"
    _images(data, ["a.png", "b.png"])
    (data / "m.csv").write_text("path,label\na.png,\nb.png,bad\\label\n")
    out = tmp_path / "out"
    assert _run(data / "m.csv", out) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == nothing_converted_line(
        out, 2, "manifest_bad_label 1, manifest_missing_label 1")
    assert not (out / "image_tfrecords.json").exists()  # a failed run publishes nothing
    assert sorted(e["reason"] for e in _errors(unpublished(out))) == ["manifest_bad_label", "manifest_missing_label"]
    info = json.loads((unpublished(out) / "image_tfrecords.json").read_text())
    assert info["class_names"] == [] and (info["files"]["found"], info["files"]["rejected"]) == (2, 2)
