"""Read-side tools on hostile datasets (tests/hostile_records.py): a problem line or an error line, no traceback.

verify lists a non-Example record, a corrupt record and every stray file a shard glob
would read as problems and goes on; preview skips bad records, says which, and draws
the rest; benchmark, which cannot time a broken dataset, stops with one `error:` line
naming the shard and the record. Malformed image_tfrecords.json gives every tool one
`error:` line. Most cases run the tools in-process (each subprocess imports TensorFlow);
one case per tool runs it as a user does, with `python -m`.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from PIL import Image

from pipeline.cli import main_of
from tests import hostile_records as hostile
from tests.conftest import cli, run_tool
from tests.error_lines import nothing_converted_line, unpublished
from transforms.base.dataset_format import TEMP_DIR

pytest.importorskip("tensorflow")

SHOW_BAD = "check the dataset with python -m pipeline.verify"


def _verify(capsys, *argv) -> tuple[int, list[str], str]:
    from pipeline import verify

    code = main_of(verify.run, [str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, [line for line in out.splitlines() if line.startswith("problem: ")], err


def _preview(capsys, directory, tmp_path, *argv) -> tuple[int, str, str]:
    from pipeline import preview

    code = main_of(preview.run, [str(directory), f"--contact_sheet={tmp_path / 'sheet.png'}", "--per_class=8",
                                 "--tile_size=32", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _benchmark(capsys, directory, *argv) -> tuple[int, str, str]:
    from pipeline import benchmark

    code = main_of(benchmark.run, [f"--dataset_dir={directory}", "--batch_size=2", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _error_line(err: str) -> str:
    """The one `error:` line, last on stderr (after benchmark's progress lines), with no traceback."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), err
    assert not any(line.startswith("error: ") for line in lines[:-1]), err
    return lines[-1]


# ---- a record that is not an Example, a record with a flipped byte ------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("no_decode", [False, True])
def test_verify_names_a_record_that_is_not_an_example_and_goes_on(tmp_path, capsys, no_decode):
    root, shard, index = hostile.non_example(tmp_path / "ds")
    code, problems, err = _verify(capsys, root, *(["--no_decode"] if no_decode else []))
    assert "Traceback" not in err
    assert code == 1
    assert problems == [f"problem: {shard} record {index}: not a valid Example: it does not parse as a "
                        "tf.train.Example protocol buffer"]


@pytest.mark.timeout(120)
def test_verify_names_a_flipped_byte(tmp_path, capsys):
    root, shard, index = hostile.flipped_byte(tmp_path / "ds")
    code, problems, err = _verify(capsys, root, "--no_decode")
    assert "Traceback" not in err and code == 1
    assert problems == [f"problem: {shard} record {index}: data checksum mismatch (the record's bytes are corrupt)"]


@pytest.mark.timeout(120)
def test_the_verify_command_on_a_non_example_record(tmp_path):
    root, shard, index = hostile.non_example(tmp_path / "ds")
    proc = run_tool("pipeline.verify", str(root))
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert (f"problem: {shard} record {index}: not a valid Example: it does not parse as a tf.train.Example "
            "protocol buffer") in proc.stdout.splitlines()
    assert proc.stdout.splitlines()[-1] == f"FAILED: 1 problem(s) in {root}."


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["non_example", "flipped_byte"])
def test_preview_skips_a_bad_record_names_it_and_shows_the_rest(tmp_path, capsys, case):
    root, shard, index = getattr(hostile, case)(tmp_path / "ds")
    code, out, err = _preview(capsys, root, tmp_path)
    assert "Traceback" not in err
    problems = [line for line in err.splitlines() if line.startswith("problem: ")]
    what = ("not a tf.train.Example (it does not parse)" if case == "non_example"
            else "data checksum mismatch (the record's bytes are corrupt)")
    assert problems == [f"problem: {shard} record {index}: {what}; skipped"]
    assert code == 1
    assert out.splitlines()[0].startswith(f"Wrote {tmp_path / 'sheet.png'}: 5 images of 2 classes")
    assert f"1 record could not be shown (listed above); {SHOW_BAD}" in out
    with Image.open(tmp_path / "sheet.png") as sheet:
        assert sheet.format == "PNG"


@pytest.mark.timeout(120)
def test_the_preview_command_on_a_flipped_byte(tmp_path):
    root, shard, index = hostile.flipped_byte(tmp_path / "ds")
    # A fresh interpreter: the "one line" contract of preview's stderr, TensorFlow's start-up included.
    proc = cli("pipeline.preview", str(root), f"--contact_sheet={tmp_path / 'sheet.png'}",
               f"--class_chart={tmp_path / 'chart.png'}", timeout=110)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [
        f"problem: {shard} record {index}: data checksum mismatch (the record's bytes are corrupt); skipped"]
    assert (tmp_path / "sheet.png").exists() and (tmp_path / "chart.png").exists()


@pytest.mark.timeout(120)
def test_preview_says_so_when_no_record_can_be_shown(tmp_path, capsys):
    root = hostile.write_dataset(tmp_path / "ds", {"train": [[hostile.NOT_AN_EXAMPLE, hostile.NOT_AN_EXAMPLE]]})
    code, out, err = _preview(capsys, root, tmp_path)
    shard = "train-00000-of-00001.tfrecord"
    assert [line for line in err.splitlines() if line.startswith("problem: ")] == [
        f"problem: {shard} record {i}: not a tf.train.Example (it does not parse); skipped" for i in (0, 1)]
    assert _error_line(err) == (f"error: no image of split 'train' of {root} could be shown: 2 records were "
                                f"skipped (listed above); {SHOW_BAD}")
    assert code == 2 and out == "" and not (tmp_path / "sheet.png").exists()


@pytest.mark.timeout(120)
def test_benchmark_stops_at_a_record_that_is_not_an_example_naming_it(tmp_path, capsys):
    root, shard, index = hostile.non_example(tmp_path / "ds")
    code, out, err = _benchmark(capsys, root, "--stages=parse")
    assert code == 2 and out == ""
    assert _error_line(err) == (f"error: {root}/{shard} record {index} is not a tf.train.Example (it does not "
                                f"parse): the file was damaged after the conversion; {SHOW_BAD}, then copy or "
                                "convert it again")


@pytest.mark.timeout(120)
def test_benchmark_by_pattern_names_a_first_record_that_is_not_an_example(tmp_path, capsys):
    root = hostile.write_dataset(tmp_path / "ds", {"train": [[hostile.NOT_AN_EXAMPLE, hostile.example(0)]]})
    from pipeline import benchmark

    pattern = f"{root}/train-*.tfrecord"
    code = main_of(benchmark.run, [f"--file_pattern={pattern}", "--batch_size=2"])
    assert code == 2
    assert _error_line(capsys.readouterr().err) == (
        f"error: {root}/train-00000-of-00001.tfrecord record 0 is not a tf.train.Example (it does not parse): "
        f"--file_pattern {pattern} matches a file that is not a TFRecord of Examples; narrow the pattern")


@pytest.mark.timeout(120)
def test_benchmark_stops_at_a_flipped_byte_naming_it(tmp_path, capsys):
    root, shard, index = hostile.flipped_byte(tmp_path / "ds")
    code, _, err = _benchmark(capsys, root, "--stages=read")
    assert code == 2
    assert _error_line(err) == (f"error: {root}/{shard} is corrupt (record {index}: data checksum mismatch); copy "
                                "or convert it again")


# ---- files a shard glob reads but image_tfrecords.json does not list ------------------------------------------------

@pytest.mark.timeout(120)
def test_verify_flags_every_file_the_shard_glob_reads_but_the_metadata_does_not_list(tmp_path, capsys):
    root, extra = hostile.extra_files(tmp_path / "ds")
    code, problems, err = _verify(capsys, root, "--no_decode")
    assert "Traceback" not in err and code == 1
    globs = {name: name.split("-")[0] + "-*.tfrecord*" for name in extra}
    assert problems == [
        f"problem: {name}: not listed in image_tfrecords.json, but the shard glob {globs[name]} matches it, so "
        "readers that glob read it as part of the dataset: remove it or move it out of this folder"
        for name in sorted(extra)]


# ---- malformed image_tfrecords.json ------------------------------------------------------------------------------

MALFORMED = {case: (change, fragment) for case, change, fragment in hostile.MALFORMED_INFO}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(MALFORMED))
@pytest.mark.parametrize("tool", ["verify", "preview", "benchmark"])
def test_malformed_dataset_info_is_one_error_line(tmp_path, capsys, case, tool):
    change, fragment = MALFORMED[case]
    root = hostile.malformed_info(tmp_path / "ds", change)
    if tool == "verify":
        code, _, err = _verify(capsys, root)
    elif tool == "preview":
        code, _, err = _preview(capsys, root, tmp_path, f"--class_chart={tmp_path / 'chart.png'}")
    else:
        code, _, err = _benchmark(capsys, root)
    line = _error_line(err)
    assert code == 2
    assert line.startswith(f"error: {root}/image_tfrecords.json ") and fragment in line, line
    assert line.endswith("convert again"), line
    assert not (tmp_path / "sheet.png").exists() and not (tmp_path / "chart.png").exists()


@pytest.mark.timeout(120)
def test_the_benchmark_command_on_a_dataset_info_that_is_a_list(tmp_path):
    root = hostile.malformed_info(tmp_path / "ds", lambda info: [])
    proc = run_tool("pipeline.benchmark", f"--dataset_dir={root}")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"error: {root}/image_tfrecords.json is not a JSON object but a list: it was not written by this tool; "
        "convert again"]


@pytest.mark.timeout(120)
def test_the_metadata_checks_name_the_field_and_its_type(tmp_path):
    from pipeline import reader
    from pipeline.errors import DatasetError

    root = hostile.malformed_info(tmp_path / "ds", MALFORMED["shards_null"][0])
    with pytest.raises(DatasetError) as raised:
        reader.load_info(str(root))
    assert str(raised.value) == (f"{root}/image_tfrecords.json is malformed (splits.train.shards is null, not a list): "
                                 "it was not written by this tool; convert again")
    root = hostile.malformed_info(tmp_path / "ds2", MALFORMED["splits_missing"][0])
    with pytest.raises(DatasetError, match=re.escape("image_tfrecords.json lacks splits: it was not written")):
        reader.load_info(str(root))


@pytest.mark.timeout(120)
def test_a_sound_corpus_dataset_is_sound(tmp_path):
    """The corpus's base dataset passes verify, so each case's problems are its damage alone."""
    from pipeline import verify

    report = verify.verify_dataset(str(hostile.sound(tmp_path / "ds")))
    assert report.problems == [] and report.split_records == {"train": 6, "validation": 2}


# ---- a run in which every image was rejected ---------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_verify_fails_a_dataset_of_zero_records_and_says_why(tmp_path, capsys):
    root = hostile.nothing_written(tmp_path / "ds")
    code, problems, err = _verify(capsys, root)
    assert "Traceback" not in err and code == 1
    assert problems == ["problem: image_tfrecords.json: the dataset holds no records: every one of the 2 files found "
                        "was rejected or skipped (see errors.jsonl for each file's reason); fix the input and "
                        "convert again"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tool", ["preview", "benchmark"])
def test_preview_and_benchmark_refuse_a_dataset_of_zero_records(tmp_path, capsys, tool):
    root = hostile.nothing_written(tmp_path / "ds")
    code, _, err = _preview(capsys, root, tmp_path) if tool == "preview" else _benchmark(capsys, root)
    assert code == 2
    assert _error_line(err) == (f"error: {root} holds no records: every image was rejected or skipped (see its "
                                "errors.jsonl for each file's reason); fix the input and convert again")


@pytest.mark.timeout(120)
def test_a_conversion_that_rejects_every_image_publishes_nothing_and_the_corrected_command_converts(tmp_path):
    """A run in which every image was rejected failed: exit 1, one error line, nothing published (before, it
    published a dataset of no records, and the corrected command was refused: "already holds a dataset")."""
    for name in ("cat", "dog"):
        (tmp_path / "in" / name).mkdir(parents=True)
        (tmp_path / "in" / name / "broken.jpg").write_bytes(b"\xff\xd8\xff not really a JPEG")
    out = tmp_path / "out"
    proc = cli("pipeline.main", f"--input_dir={tmp_path / 'in'}", f"--output_dir={out}", "--direct_num_workers=1",
               "--quiet", timeout=110)
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [nothing_converted_line(out, 2, "truncated 2")]
    assert sorted(os.listdir(out)) == [TEMP_DIR]  # no image_tfrecords.json, no errors.jsonl: nothing published
    errors = [json.loads(line) for line in (unpublished(out) / "errors.jsonl").read_text().splitlines()]
    assert sorted((e["relpath"], e["reason"]) for e in errors) == [("cat/broken.jpg", "truncated"),
                                                                    ("dog/broken.jpg", "truncated")]
    from pipeline import verify
    from pipeline.errors import DatasetError

    with pytest.raises(DatasetError, match="image_tfrecords.json"):  # not a dataset: the read side refuses it
        verify.verify_dataset(str(out))

    # The input fixed, the same command converts: no "already holds a dataset", and the report is gone.
    for name in ("cat", "dog"):
        Image.new("RGB", (12, 12), (200, 10, 10)).save(tmp_path / "in" / name / "broken.jpg")
    proc = cli("pipeline.main", f"--input_dir={tmp_path / 'in'}", f"--output_dir={out}", "--direct_num_workers=1",
               "--quiet", timeout=110)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "image_tfrecords.json").read_text())["files"]["written"] == 2
    assert not (out / TEMP_DIR).exists()


# ---- Examples that parse as protocol buffers but not as this dataset's records ------------------------------------

BAD_EXAMPLES = {
    "undecodable_image": dict(
        verify="the image cannot be decoded: jpeg::Uncompress failed. Invalid JPEG data or crop window",
        preview="cannot be shown (jpeg::Uncompress failed. Invalid JPEG data or crop window); skipped",
        benchmark="error: an image in {shard} cannot be decoded (jpeg::Uncompress failed. Invalid JPEG data or crop "
                  "window); check --image_key, or verify the dataset with python -m pipeline.verify"),
    "wrong_label_type": dict(
        verify="not a valid Example: Key: label. Data types don't match. Data type: string but expected type: int64",
        preview="has no int64 feature 'label'; skipped",
        benchmark="error: reading {shard} failed: Key: label.  Data types don't match. Data type: string but "
                  "expected type: int64"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(BAD_EXAMPLES))
@pytest.mark.parametrize("tool", ["verify", "preview", "benchmark"])
def test_a_bad_example_is_named_by_shard_and_record(tmp_path, capsys, case, tool):
    root, shard, index = getattr(hostile, case)(tmp_path / "ds")
    expected = BAD_EXAMPLES[case][tool]
    if tool == "verify":
        code, problems, err = _verify(capsys, root)
        assert problems == [f"problem: {shard} record {index}: {expected}"]
    elif tool == "preview":
        code, out, err = _preview(capsys, root, tmp_path)
        assert [line for line in err.splitlines() if line.startswith("problem: ")] == [
            f"problem: {shard} record {index}: {expected}"]
        assert out.startswith(f"Wrote {tmp_path / 'sheet.png'}: 5 images of 2 classes")
    else:
        code, _, err = _benchmark(capsys, root)
        assert _error_line(err) == expected.format(shard=f"{root}/{shard} record {index}")
    assert "Traceback" not in err
    assert code == (2 if tool == "benchmark" else 1)  # benchmark stops: it cannot time a broken dataset
