"""Hostile manifests: every row is counted (found = written + rejected + skipped), none vanishes.

A stray quote, a cut-short .gz, the same file spelled three ways, Latin-1 bytes, a column twice, labels that
are not text, a line of hundreds of megabytes, a gzip bomb, FIFOs and devices as the manifest, the labels
file or @schema.json, and terminal escapes in a header. Every case runs under a time limit, and the ones
that could take memory in a subprocess watched by tests.hostile_files.run_bounded.
"""

from __future__ import annotations

import gzip
import json
import os

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from PIL import Image

from pipeline.errors import UserError
from pipeline.launcher import run
from tests import hostile_files as hostile
from tests.conftest import FAST
from tests.pipelines import TestPipeline as BeamTestPipeline
from transforms.inputs import manifest as m
from transforms.inputs import rows as reading

RUN_MB = 1300  # one local conversion with its worker processes (tests/test_hostile.py)


def _images(folder, names):
    for i, name in enumerate(names):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (12, 12), (i * 20 % 256, 40, 90)).save(folder / name)


def _run(manifest, out, *args):
    return run([f"--manifest={manifest}", f"--output_dir={out}", *args, *FAST])


def _errors(out):
    path = out / "errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _info(out):
    return json.loads((out / "image_tfrecords.json").read_text())


def _counted(info):
    files = info["files"]
    assert files["found"] == files["written"] + files["rejected"] + files["skipped"]
    return files["found"], files["written"], files["rejected"], files["skipped"]


def _error_of(*argv) -> str:
    with pytest.raises(UserError) as caught:
        run([*argv, *FAST])
    message = str(caught.value)
    assert "\n" not in message
    return message


def _rows(path, fmt="csv"):
    with open(path, "rb") as raw:
        return dict(m.read_rows(reading.file_lines(raw), fmt, "/base"))


# --- 2: a quoted field that spans lines is counted and reported ------------------------------------------


STRAY = ("path,label,note\n"
         "a.png,cat,short\n"
         "b.png,dog,\"6' tall\n"  # the stray quote: the field takes the lines after it
         "c.png,cat,x\nd.png,dog,y\ne.png,cat,z\nf.png,dog,w\ng.png,cat,v\nh.png,dog,u\n")


@pytest.mark.timeout(300)
def test_a_quote_never_closed_is_one_error_line_naming_the_file_and_line(tmp_path, monkeypatch):
    """A stray quote that no later quote closes takes every line after it into one field (Python's csv reads
    it so; pandas and csv in strict mode refuse the file). It is one `error:` line naming the file and the
    quote's line, and nothing is written: before, 1 of 7 rows was written, exit 0."""
    data = tmp_path / "data"
    _images(data, [f"{c}.png" for c in "abcdefgh"])
    (data / "m.csv").write_text(STRAY)
    out = tmp_path / "out"
    said = (f"the CSV file {data / 'm.csv'} ends before the quoted field opened in line 3 is closed: a stray \" "
            "takes the 6 line(s) after it, to the end of the file, as one value; close the quote, or double it "
            "(\"\")")
    # in the rows the launcher reads first: at launch (exit 2)
    message = _error_of(f"--manifest={data / 'm.csv'}", f"--output_dir={out}")
    assert message == f"--manifest: {said}; nothing was written"
    assert not out.exists()
    # further down, found by the job: exit 1, no dataset
    from pipeline import plan

    monkeypatch.setattr(plan, "MANIFEST_SAMPLE_ROWS", 1)
    with pytest.raises(UserError) as caught:
        _run(data / "m.csv", out)
    assert caught.value.exit_code == 1 and str(caught.value) == f"{said}; no dataset was written"
    assert not (out / "image_tfrecords.json").exists()


def test_a_stray_quote_closed_by_a_later_one_is_rejected_not_read_as_a_row(tmp_path):
    """The second stray quote closes the field: as Python's csv reads it, one row of 3 fields whose note holds
    the lines between, 4 rows of their own. It is rejected, with the lines it took."""
    path = tmp_path / "m.csv"
    path.write_text("path,label,note\na.png,cat,\"6' tall\nb.png,dog,x\nc/d.png,cat,y\ne.png,dog,\"5' short\n"
                    "f.png,cat,ok\n")
    rows = _rows(path)
    assert rows[1].reason == m.OPEN_QUOTE
    assert rows[1].detail == ("row 1: lines 2-5: a quoted field opened in line 2 takes the 3 line(s) after it, 3 of "
                              "which read as rows of their own (the first: line 3); a stray \" ? close the quote, "
                              "or double it (\"\"); these 4 lines are this one rejected row")
    assert rows[2].relpath == "f.png" and set(rows) == {1, 2}


def test_a_note_with_line_breaks_is_one_row(tmp_path):
    """Legal CSV: a quoted note over three lines (none a row of its own) is read as one row."""
    path = tmp_path / "m.csv"
    path.write_text('path,label,note\na.png,cat,"over\nthree lines, quoted\nhere"\nb.png,dog,x\n')
    rows = _rows(path)
    assert rows[1].relpath == "a.png" and dict(rows[1].columns)["note"] == "over\nthree lines, quoted\nhere"
    assert rows[2].relpath == "b.png"


@pytest.mark.timeout(300)
def test_rows_that_span_lines_are_in_the_summary_and_the_description(tmp_path, capsys):
    data = tmp_path / "data"
    _images(data, ["a.png", "b.png", "c.png"])
    (data / "m.csv").write_text('path,label,note\na.png,cat,"two\nlines"\nb.png,dog,x\nc.png,dog,"3\r\nli\rnes"\n')
    out = tmp_path / "out"
    assert _run(data / "m.csv", out) == 0
    info = _info(out)
    assert _counted(info) == (3, 3, 0, 0)
    assert info["manifest"] == {"spanning_rows": 2, "rows_with_split": 0, "rows_split_by_hash": 3,
                                "examples": {"spanning_rows": [
        {"row": 1, "detail": "lines 2-3"}, {"row": 3, "detail": "lines 5-7"}]}}
    assert ("Manifest: 2 rows hold line breaks inside a quoted field, read as one row each (legal CSV): row 1 "
            "(lines 2-3), row 3 (lines 5-7)") in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_read_rows_gives_line_numbers_and_the_rows_that_span_lines(tmp_path):
    """ReadRows on TestPipeline, cut into ranges of 16 bytes: every row with its first line and its number of
    lines; SPANNING names the usable rows that span lines, not the rejected one."""
    path = tmp_path / "m.csv"
    path.write_bytes(b'path,label,note\na.png,x,"n\no"\nb.png,y,\n"c.png,z\nd.png,w,\ne.png,v,"\n')
    with BeamTestPipeline() as p:
        read = p | reading.ReadRows(str(path), "csv", range_bytes=16)
        assert_that(read.fields | beam.Map(lambda r: (r.row, r.line, r.lines, getattr(r.fields, "kind", "ok"))),
                    equal_to([(1, 2, 2, "ok"), (2, 4, 1, "ok"), (3, 5, 3, reading.OPEN_QUOTE)]), label="Fields")
        assert_that(read[reading.SPANNING], equal_to([(1, 2, 2)]), label="Spanning")
        assert_that(read[reading.ROWS] | beam.CombineGlobally(sum), equal_to([3]), label="Rows")


# --- 3: a cut-short compressed manifest is an error -------------------------------------------------------


def _gz_manifest(data, rows=800):
    names = [f"i{i:03d}.png" for i in range(rows)]
    _images(data, names[:4])
    text = "path,label\n" + "".join(f"{n},{'xy'[i % 2]}\n" for i, n in enumerate(names))
    return gzip.compress(text.encode())


@pytest.mark.timeout(300)
def test_a_truncated_gz_manifest_is_one_error_line_and_no_dataset(tmp_path):
    data = tmp_path / "data"
    packed = _gz_manifest(data)
    (data / "m.csv.gz").write_bytes(packed[:int(len(packed) * 0.6)])  # an interrupted copy
    out = tmp_path / "out"
    with pytest.raises(UserError) as caught:
        _run(data / "m.csv.gz", out)
    message = str(caught.value)
    assert caught.value.exit_code == 1 and "\n" not in message
    assert message.startswith(f"the compressed file {data / 'm.csv.gz'} ends before its compressed stream does")
    assert not (out / "image_tfrecords.json").exists()
    (data / "m.csv.gz").write_bytes(packed[:40])  # cut inside the rows the launcher reads: its one line
    assert _error_of(f"--manifest={data / 'm.csv.gz'}", f"--output_dir={out}").startswith(
        f"--manifest: the compressed file {data / 'm.csv.gz'} ends before its compressed stream does (it is cut "
        "short): an interrupted copy? Copy it again, or give the file uncompressed")


def test_compressed_reads_check_the_end_and_read_every_member(tmp_path):
    whole = b"path,label\n" + b"a.png,x\n" * 1000
    packed = gzip.compress(whole)
    path = tmp_path / "m.csv.gz"
    for cut in (len(packed) - 1, len(packed) - 8, len(packed) // 2, 12):
        path.write_bytes(packed[:cut])
        with pytest.raises(reading.TruncatedFile), reading.open_file(str(path)) as raw:
            list(reading.file_lines(raw))
    path.write_bytes(packed[:20] + b"\x00" * 40 + packed[60:])  # damaged inside
    with pytest.raises(reading.TruncatedFile), reading.open_file(str(path)) as raw:
        list(reading.file_lines(raw))
    path.write_bytes(packed + gzip.compress(b"b.png,y\n"))  # two members, as `cat a.gz b.gz` makes
    with reading.open_file(str(path)) as raw:
        assert "".join(reading.file_lines(raw)) == (whole + b"b.png,y\n").decode()


# --- 8: one file is one record ------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_one_file_spelled_several_ways_is_one_record(tmp_path):
    data = tmp_path / "data"
    _images(data, ["a/b.png", "c.png"])
    (data / "m.csv").write_text("path,label\na/./b.png,x\na//b.png,x\na/../a/b.png,y\n./a/b.png,x\nc.png,y\n"
                                "../data/c.png,y\n")
    out = tmp_path / "out"
    assert _run(data / "m.csv", out) == 0
    errors = sorted((e["reason"], e["detail"]) for e in _errors(out))
    assert errors == [
        ("manifest_bad_path", "row 6: the path '../data/c.png' leads out of the folder of relative paths "
                              "(--input_dir, or the manifest's folder) with '..': give it below that folder, or as an "
                              "absolute path"),
        ("manifest_duplicate_path", "row 2: the path is listed again, first in row 1; the first row is kept"),
        ("manifest_duplicate_path", "row 3: the path is listed again, first in row 1; the first row is kept"),
        ("manifest_duplicate_path", "row 4: the path is listed again, first in row 1; the first row is kept"),
    ]
    assert _counted(_info(out)) == (6, 2, 4, 0)


# --- 9: bytes that are not UTF-8 never make a class ------------------------------------------------------


@pytest.mark.timeout(300)
def test_latin1_labels_are_rejected_rows_not_one_merged_class(tmp_path):
    data = tmp_path / "data"
    _images(data, ["a.png", "b.png", "c.png"])
    (data / "m.csv").write_bytes("path,label\na.png,café\nb.png,cafè\nc.png,tea\n".encode("latin-1"))
    out = tmp_path / "out"
    assert _run(data / "m.csv", out) == 0
    assert _info(out)["class_names"] == ["tea"]
    errors = {e["detail"][:6]: (e["reason"], e["detail"]) for e in _errors(out)}
    assert errors["row 1:"] == ("manifest_not_utf8", "row 1: the byte 0xe9 in line 2, character 10, is not UTF-8 "
                                "(the file was saved in another encoding, such as Latin-1 or Windows-1252): save "
                                "it as UTF-8")
    assert errors["row 2:"][0] == "manifest_not_utf8"
    assert _counted(_info(out)) == (3, 1, 2, 0)


def test_a_header_that_is_not_utf8_is_one_error_line(tmp_path):
    path = tmp_path / "m.csv"
    path.write_bytes("path,label,n\xf6te\na.png,x,1\n".encode("latin-1"))
    message = _error_of(f"--manifest={path}", f"--output_dir={tmp_path / 'out'}")
    assert message == (f"--manifest {path}: the byte 0xf6 in line 1, character 13, is not UTF-8 (the file was saved "
                       "in another encoding, such as Latin-1 or Windows-1252): save it as UTF-8")


# --- 10: a column twice, labels that are not text -----------------------------------------------------


@pytest.mark.parametrize("header, twice", [("path,label,label", "label"), ("path,Label,label", "label"),
                                           ("path,path,label", "path")])
def test_a_column_twice_is_one_error_line(tmp_path, header, twice):
    path = tmp_path / "m.csv"
    path.write_text(f"{header}\na.png,x,y\n")
    message = _error_of(f"--manifest={path}", f"--output_dir={tmp_path / 'out'}")
    assert message.startswith(f"--manifest {path} has the column '{twice}' more than once (columns: ")
    path = tmp_path / "m.jsonl"
    path.write_text('{"path": "a.png", "label": "x", "LABEL": "y"}\n')
    assert "has the column 'label' more than once" in _error_of(f"--manifest={path}",
                                                                f"--output_dir={tmp_path / 'out'}")


@pytest.mark.timeout(300)
def test_json_labels_are_text_or_integers(tmp_path):
    data = tmp_path / "data"
    _images(data, [f"{i}.png" for i in range(6)])
    rows = [{"path": "0.png", "label": True}, {"path": "1.png", "label": ["x"]}, {"path": "2.png", "label": 1.0},
            {"path": "3.png", "label": 1}, {"path": "4.png", "label": "1"}, {"path": 5, "label": "1"}]
    (data / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert _run(data / "m.jsonl", out) == 0
    info = _info(out)
    assert info["class_names"] == ["1"] and _counted(info) == (6, 2, 4, 0)
    errors = sorted((e["reason"], e["detail"]) for e in _errors(out))
    hint = ' (write "1.0" as a string; an integer label such as 1 is read as "1")'
    assert errors == [
        ("manifest_bad_label", f"row 1: the label is true, not text: a label is a JSON string{hint}"),
        ("manifest_bad_label", f'row 2: the label is ["x"], not text: a label is a JSON string{hint}'),
        ("manifest_bad_label", f"row 3: the label is 1.0, a number: a label is a JSON string{hint}"),
        ("manifest_bad_path", "row 6: the path is 5, a number: a path is a JSON string"),
    ]


@pytest.mark.timeout(300)
def test_jsonl_keys_the_first_line_lacks_or_a_key_twice_reject_the_row(tmp_path):
    """A JSON Lines file's columns are its first line's keys (as a CSV's are its header's): a later row with a
    key the first lacks is rejected with the key named, never written without it; a key given twice in a row
    (also `Label` and `label`) rejects the row, where the last value would have won."""
    data = tmp_path / "data"
    _images(data, [f"{i}.png" for i in range(6)])
    rows = ['{"path": "0.png", "label": "ant", "score": 0.1}',
            '{"path": "1.png", "label": "ant", "score": 0.5, "note": "blurry"}',
            '{"path": "2.png", "label": "ant", "score": 0.9}',
            '{"path": "3.png", "label": "ant", "path": "4.png"}',
            '{"path": "4.png", "label": "ant", "Label": "bee"}',
            '{"path": "5.png", "label": "ant", "score": 0.2}']
    (data / "m.jsonl").write_text("".join(r + "\n" for r in rows))
    out = tmp_path / "out"
    assert _run(data / "m.jsonl", out, "--validation_split=0", "--features=score:float") == 0
    info = _info(out)
    assert _counted(info) == (6, 3, 3, 0)
    errors = sorted((e["reason"], e["detail"]) for e in _errors(out))
    assert errors == [
        ("manifest_bad_row", "row 2: the key(s) 'note' are not in the first line, whose keys are the file's "
                             "columns ('path', 'label', 'score'): give the first line every key (null where it has "
                             "no value)"),
        ("manifest_bad_row", "row 4: the key 'path' is given twice in the row (keys are not case-sensitive), and "
                             "only one value can be read: give each key once"),
        ("manifest_bad_row", "row 5: the key 'label' is given twice in the row (keys are not case-sensitive), and "
                             "only one value can be read: give each key once"),
    ]
    from tests.datasets import read_records

    written = {r["source_path"]: r for r in read_records(out)["train"]}
    assert sorted(written) == ["0.png", "2.png", "5.png"]  # row 4's second path, 4.png, is not written either
    from tests.manifest_helpers import assert_every_cut_reads_the_same

    assert_every_cut_reads_the_same(data / "m.jsonl", "jsonl")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name, text", [("m.csv", 'path,label\n0.png,ant\n1.png, ant\n2.png,"ant "\n3.png,\tant\n'),
                                        ("m.jsonl", '{"path": "0.png", "label": "ant"}\n'
                                                    '{"path": "1.png", "label": " ant"}\n'
                                                    '{"path": "2.png", "label": "ant "}\n'
                                                    '{"path": "3.png", "label": "\\tant"}\n')])
def test_a_label_with_leading_or_trailing_whitespace_is_rejected_not_merged(tmp_path, name, text):
    """As a class folder ' ant' is refused, a manifest label ' ant' is a manifest_bad_label row: never stripped
    into the class 'ant', which it may or may not have meant."""
    data = tmp_path / "data"
    _images(data, [f"{i}.png" for i in range(4)])
    (data / name).write_text(text)
    out = tmp_path / "out"
    assert _run(data / name, out, "--validation_split=0") == 0
    info = _info(out)
    assert info["class_names"] == ["ant"] and _counted(info) == (4, 1, 3, 0)
    errors = sorted((e["relpath"], e["reason"], e["detail"]) for e in _errors(out))
    assert [e[:2] for e in errors] == [("1.png", "manifest_bad_label"), ("2.png", "manifest_bad_label"),
                                       ("3.png", "manifest_bad_label")]
    assert errors[0][2] == ("row 2: the label ' ant' has leading or trailing whitespace in its name, which "
                            "--labels_file would strip: rename it")


# --- 11: line length is bounded ------------------------------------------------------------------------


def test_lines_over_the_bound_are_read_through_not_held(tmp_path, monkeypatch):
    """A line over MAX_LINE_BYTES is one rejected row (its quote state followed all the same), whatever the
    cut; the rows after it keep their numbers."""
    monkeypatch.setattr(reading, "MAX_LINE_BYTES", 100)
    path = tmp_path / "m.csv"
    path.write_bytes(b"path,label\na.png,x\n" + b"b" * 300 + b'.png,"y\n' + b"z\"\nc.png,w\n")
    rows = _rows(path)
    assert rows[2].reason == m.OPEN_QUOTE and rows[2].detail.startswith("row 2: lines 3-4: over")
    assert rows[1].relpath == "a.png" and rows[3].relpath == "c.png"
    path.write_bytes(b"path,label\na.png,x\n" + b"b" * 300 + b".png,y\nc.png,w\n")
    rows = _rows(path)
    assert rows[2].reason == m.LONG_LINE
    assert rows[2].detail.startswith("row 2: line 3 is over 0 KiB (307 bytes), read through and not held")
    from tests.manifest_helpers import assert_every_cut_reads_the_same

    assert_every_cut_reads_the_same(path, "csv")
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"path": "a.png", "label": "x"}\n{"path": "' + b"b" * 300 + b'"}\n{"path": "c.png"}\r\n')
    assert assert_every_cut_reads_the_same(path, "jsonl")[1][1].reason == m.LONG_LINE


@pytest.mark.timeout(600)
def test_a_jsonl_line_of_200_mb_is_one_rejected_row_within_memory(tmp_path):
    data = tmp_path / "data"
    _images(data, ["a.png", "c.png"])
    with open(data / "m.jsonl", "wb") as f:
        f.write(b'{"path": "a.png", "label": "x"}\n{"path": "b.png", "label": "')
        block = b"y" * (1 << 20)
        for _ in range(200):
            f.write(block)
        f.write(b'"}\n{"path": "c.png", "label": "x"}\n')
    out = tmp_path / "out"
    done = hostile.run_bounded([f"--manifest={data / 'm.jsonl'}", f"--output_dir={out}", *FAST], RUN_MB)
    assert not done.killed, f"{done.killed} (peak {done.peak_rss_mb:.0f} MB)"
    assert done.returncode == 0, done.stderr
    [error] = _errors(out)
    assert error["reason"] == "manifest_long_line" and error["detail"].startswith("row 2: line 2 is over 1024 KiB")
    assert _counted(_info(out)) == (3, 2, 1, 0)


@pytest.mark.timeout(300)
def test_a_gzip_bomb_manifest_is_one_true_error_line_within_memory(tmp_path):
    """1.2 MB of .csv.gz that inflate to 1.2 GB of one line (over the 900 MB the launcher may use): it holds 1 MiB
    of it, reads the rest through to count it, and says so."""
    path = tmp_path / "m.csv.gz"
    path.write_bytes(hostile.deflated([(b"a" * (1 << 20), 1200)], container="gzip"))
    assert os.path.getsize(path) < 2_000_000
    done = hostile.run_bounded([f"--manifest={path}", f"--output_dir={tmp_path / 'out'}"], 900)
    assert not done.killed, f"{done.killed} (peak {done.peak_rss_mb:.0f} MB)"
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: --manifest {path}: its first line is over 1 MiB (1258291200 bytes, read "
                                   "without being held): a header line is a few column names; is it the CSV or "
                                   "JSON Lines file that lists the images?")


# --- 21: files by type, header bytes never echoed raw ---------------------------------------------------



@pytest.mark.timeout(120)
def test_fifos_and_devices_are_refused_by_type(tmp_path, fifos):
    data = tmp_path / "data"
    _images(data, ["cat/a.png"])
    manifest = data / "m.csv"
    manifest.write_text("path,label\ncat/a.png,x\n")
    out = f"--output_dir={tmp_path / 'out'}"
    fifos.append(hostile.fifo(tmp_path / "pipe.csv"))
    assert _error_of(f"--manifest={fifos[0]}", out) == (
        f"--manifest {fifos[0]} is a FIFO (named pipe), not a regular file, and is not read: give the CSV or JSON "
        "Lines file that lists the images")
    assert _error_of("--manifest=/dev/zero", out).startswith("--manifest /dev/zero is a character device, not a "
                                                             "regular file, and is not read")
    link = hostile.dev_zero_link(tmp_path / "zero.csv")
    assert "is a character device" in _error_of(f"--manifest={link}", out)
    assert _error_of(f"--manifest={manifest}", out, f"--labels_file={fifos[0]}") == (
        f"--labels_file {fifos[0]} is a FIFO (named pipe), not a regular file, and is not read: give the labels "
        "file, one class name a line")
    assert "is a character device" in _error_of(f"--manifest={manifest}", out, "--labels_file=/dev/zero")
    assert _error_of(f"--manifest={manifest}", out, f"--features=@{fifos[0]}").startswith(
        f"--features file {fifos[0]} is a FIFO (named pipe), not a regular file, and is not read")
    assert "is a character device" in _error_of(f"--manifest={manifest}", out, "--features=@/dev/zero")
    assert "is a folder" in _error_of(f"--manifest={data}", out)
    metadata = f"--metadata={fifos[0]}"
    assert "--metadata" in _error_of(f"--input_dir={tmp_path / 'data'}", out, metadata)


def test_a_labels_file_or_schema_over_its_bound_is_refused(tmp_path, monkeypatch):
    from pipeline import plan

    monkeypatch.setattr(plan, "LABELS_FILE_BYTES", 1000)
    labels = tmp_path / "labels.txt"
    labels.write_text("x\n" * 600)
    with pytest.raises(UserError, match=r"--labels_file .* is over 0 MiB, more than a labels file"):
        plan.read_labels_file(str(labels))


def test_header_bytes_are_never_echoed_raw(tmp_path):
    path = tmp_path / "m.csv"
    path.write_bytes(b"\x1b[2J\x1b]0;owned\x07name,label\na.png,x\n")
    message = _error_of(f"--manifest={path}", f"--output_dir={tmp_path / 'out'}")
    assert "\x1b" not in message and "\x07" not in message
    assert message == (f"--manifest {path} has no 'path' column (columns: '\\x1b[2j\\x1b]0;owned\\x07name', "
                       "label): name the image column path and the class column label")
