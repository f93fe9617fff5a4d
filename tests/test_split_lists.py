"""--split_lists (issue 48): a dataset's own split lists (Food-101's meta/train.txt and meta/test.txt) give each
class-folder image its split, joined with the listing in the job; every line and every image is accounted for."""

from __future__ import annotations

import json
import random

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from PIL import Image

from pipeline.errors import UserError
from pipeline.options import parse_split_lists, validate
from tests import hostile_files
from tests.conftest import cli, convert, main_in_process, run_tool
from tests.dataflow_dry_run import (
    BOUNDED_SIDE_INPUTS,
    JOB_ENV,
    SCRIPT,
    assert_single_element_stages_are_bounded,
    pipeline_proto,
    run_script,
)
from tests.datasets import error_rows, read_records
from transforms.inputs import split_lists as sl

CLASSES = ("apple_pie", "bibimbap", "churros")


def food101(root, per_class: int = 8, seed: int = 101) -> dict[str, list[str]]:
    """A small copy of Food-101's layout: images/<class>/<id>.jpg and meta/train.txt, meta/test.txt whose lines are
    <class>/<id> (no extension), about three quarters of each class in train. Returns {split: [class/id.jpg]}."""
    rng = random.Random(seed)
    listed = {"train": [], "test": []}
    for c, name in enumerate(CLASSES):
        (root / "images" / name).mkdir(parents=True)
        ids = rng.sample(range(100_000, 4_000_000), per_class)
        for i, image_id in enumerate(ids):
            Image.new("RGB", (20, 16), (70 * c, 25 * i % 256, image_id % 256)).save(
                root / "images" / name / f"{image_id}.jpg", quality=90)
            listed["train" if i < per_class * 3 // 4 else "test"].append(f"{name}/{image_id}")
    (root / "meta").mkdir()
    for split, lines in listed.items():
        (root / "meta" / f"{split}.txt").write_text("".join(f"{line}\n" for line in lines))
    return {split: sorted(f"{line}.jpg" for line in lines) for split, lines in listed.items()}


def lists_flag(root, **names) -> str:
    return "--split_lists=" + ",".join(f"{split}={root / 'meta' / f'{name}.txt'}" for split, name in names.items())


def splits_of(out) -> dict[str, list[str]]:
    """Each split's records by source path, read back from the shards."""
    return {split: sorted(r["source_path"] for r in rows) for split, rows in read_records(out).items()}


def reasons(out) -> dict[str, tuple[str, str, str]]:
    return {row["relpath"]: (row["stage"], row["reason"], row["detail"]) for row in error_rows(out)}


# --- The plain functions ---------------------------------------------------------------------------------------


def test_the_rule_comes_from_the_lines():
    assert sl.rule_of(["apple_pie/1005649", "churros/1"]) == sl.MatchRule(by_name=False, with_extensions=False)
    assert sl.rule_of(["1005649.jpg", "2.PNG"]) == sl.MatchRule(by_name=True, with_extensions=True)
    assert sl.rule_of(["a/1.jpg", "a/2"]) == sl.MatchRule(by_name=False, with_extensions=False)  # mixed: dropped
    assert sl.rule_of(["1"]).describe() == "bare file names without extensions"


def test_lines_and_files_meet_on_one_key():
    paths, names = sl.MatchRule(False, False), sl.MatchRule(True, True)
    assert sl.name_key(sl.line_name("  ./apple_pie/1005649\r", "/in"), paths) == sl.file_key("apple_pie/1005649.jpg",
                                                                                               paths)
    assert sl.name_key(sl.line_name("/in/apple_pie/1.JPG", "/in"), paths) == b"apple_pie/1"  # prefix, extension
    assert sl.name_key("x.tar", paths) == b"x.tar"  # not an image extension: kept
    assert sl.file_key("apple_pie/7.jpg", names) == b"7.jpg"
    assert sl.name_key(sl.line_name("caf\udcc3.jpg", ""), names) == b"caf\xc3.jpg"  # not UTF-8: its bytes
    assert sl.line_name(" \t", "/in") == ""


def test_the_option_names_splits_as_split_folders_do():
    assert parse_split_lists("train=a.txt, val = b.txt,test=gs://b/c.txt") == (
        ("train", "a.txt"), ("validation", "b.txt"), ("test", "gs://b/c.txt"))
    assert parse_split_lists(None) == () and parse_split_lists("") == ()
    for text, says in [("train=a,test", "'test' is not split=PATH"), ("train=a,holdout=b", "names the split 'holdout'"),
                       ("train=a,training=b", "gives a train list twice"), ("test=a", "has no train list"),
                       ("train=a,test=a", "gives a for two splits")]:
        with pytest.raises(UserError, match=says):
            parse_split_lists(text)


def test_the_lists_are_recorded_with_the_options_only_when_given():
    def settings(*args):
        return validate(PipelineOptions(["--input_dir=/in", "--output_dir=/out", *args]))

    assert "split_lists" not in settings().as_dict()  # a resume or --if_exists=skip of an older dataset: the same
    assert settings("--split_lists=test=/m/test.txt,train=/m/train.txt").as_dict()["split_lists"] == (
        "train=/m/train.txt,test=/m/test.txt")


# --- The join, in a pipeline -------------------------------------------------------------------------------------


def test_the_join_reads_the_lists_in_ranges_and_accounts_for_every_line_and_file(tmp_path):
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from tests.pipelines import TestPipeline
    from transforms.base.records import FileRef, ListedFile

    train, test = tmp_path / "train.txt", tmp_path / "test.txt"
    train.write_bytes(b"\xef\xbb\xbfa/1\r\n\r\na/2\na/9\nb/1\nb/1\n")
    test.write_bytes(b"a/3\nb/1\nb/2")  # no line end at the end
    refs = {n: FileRef(f"/in/{n}.jpg", f"{n}.jpg", 10) for n in ("a/1", "a/2", "a/3", "a/4", "b/1", "b/2")}
    lists = (("train", str(train)), ("test", str(test)))
    with TestPipeline() as p:
        out = (p | beam.Create(list(refs.values()))
               | sl.JoinSplitLists(lists, sl.MatchRule(False, False), "/in", range_bytes=3))
        assert_that(out["files"], equal_to([ListedFile(refs["a/1"], "train"), ListedFile(refs["a/2"], "train"),
                                            ListedFile(refs["a/3"], "test"), ListedFile(refs["b/2"], "test")]),
                    label="files")
        assert_that(out[sl.REJECTED] | beam.Map(lambda r: (r.relpath, r.stage, r.reason,
                                                           r.detail.split(" names")[0])),
                    equal_to([("a/9", "rejected", sl.LISTED_IMAGE_MISSING, f"line 4 of the train list {train}"),
                              ("a/4.jpg", "skipped", sl.NOT_IN_SPLIT_LISTS,
                               f"no line of --split_lists ({train}, {test})"),
                              ("b/1.jpg", "rejected", sl.LISTED_IN_TWO_SPLITS,
                               f"listed in train and test (line 5 of the train list {train}, line 6 of the train "
                               f"list {train}, line 2 of the test list {test}), so it is written in neither (an "
                               "image in two splits leaks between them): keep it in one list")]), label="rejected")
        assert_that(out[sl.FOUND] | "Sum" >> beam.CombineGlobally(sum), equal_to([1]), label="found")
        assert_that(out[sl.STATS] | beam.Map(lambda s: (s["lines"], s["blank_lines"], s[sl.REPEATED_LINES])),
                    equal_to([({"train": 5, "test": 3}, 1, 0)]), label="stats")


# --- Whole runs ----------------------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_food101_lists_give_every_record_its_official_split(tmp_path):
    expected = food101(tmp_path / "food-101")
    out = tmp_path / "out"
    result = run_tool("pipeline.main", f"--input_dir={tmp_path / 'food-101' / 'images'}", f"--output_dir={out}",
                      lists_flag(tmp_path / "food-101", train="train", test="test"), "--image_size=16", "--quiet",
                      "--direct_running_mode=in_memory", "--direct_num_workers=1")
    assert result.returncode == 0, result.stderr
    assert splits_of(out) == expected  # record by record: no image in another split, none invented
    records = read_records(out)
    assert all(r["class_name"] == r["source_path"].split("/")[0] for rows in records.values() for r in rows)
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["split_by"] == "split_lists"
    assert info["files"] == {"found": 24, "written": 24, "rejected": 0, "skipped": 0, "upscaled": 0}
    assert info["split_lists"]["lines"] == {"train": 18, "test": 6}
    assert info["split_lists"]["match"] == "paths relative to --input_dir without extensions"
    assert error_rows(out) == []
    assert ("Splits from --split_lists: train 18, test 6 images written; lines listed: train 18, test 6 (read as "
            "paths relative to --input_dir without extensions).") in result.stdout
    assert "asked" not in result.stdout  # no share of a hash split is claimed


@pytest.mark.timeout(300)
def test_bare_names_with_extensions_and_untidy_lines(tmp_path):
    expected = food101(tmp_path / "food", per_class=4)
    meta = tmp_path / "food" / "meta"
    names = {split: [path.split("/")[1] for path in paths] for split, paths in expected.items()}
    val, train = names["train"][:2], names["train"][2:]
    # a BOM, Windows line ends, blank lines and spaces: all ignored
    meta.joinpath("train.txt").write_bytes(b"\xef\xbb\xbf" + b"".join(f"  {n} \r\n\r\n".encode() for n in train))
    meta.joinpath("val.txt").write_text("".join(f"{n}\n" for n in val))
    meta.joinpath("test.txt").write_text("".join(f"{n}\n" for n in names["test"]))
    out = tmp_path / "out"
    assert convert(tmp_path / "food" / "images", out, lists_flag(tmp_path / "food", train="train", val="val",
                                                                 test="test"), "--image_size=16",
                   "--group_by=^([^/]+)/") == 0
    by_name = {path.split("/")[1]: path for paths in expected.values() for path in paths}
    assert splits_of(out) == {"train": sorted(by_name[n] for n in train),
                              "validation": sorted(by_name[n] for n in val), "test": expected["test"]}
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["split_lists"]["match"] == "bare file names with extensions"
    assert info["split_lists"]["blank_lines"] == len(train)
    assert info["groups"]["groups_in_several_splits"] == 3  # --group_by reports the classes that span the lists


def test_a_resume_takes_no_chunk_of_a_run_with_other_lists(tmp_path):
    """The lists (their paths, their rule, their sizes) are in the plan's fingerprint: an interrupted run's chunks
    are taken only by a run of the same lists."""
    from pipeline.plan import plan_dataset, plan_record

    food101(tmp_path / "food", per_class=2)
    meta = tmp_path / "food" / "meta"

    def record(*args):
        argv = [f"--input_dir={tmp_path / 'food' / 'images'}", f"--output_dir={tmp_path / 'out'}", "--quiet",
                "--image_size=16", *args]
        settings = validate(PipelineOptions(argv))
        return plan_record(settings, plan_dataset(settings))

    lists = lists_flag(tmp_path / "food", train="train", test="test")
    first = record(lists)
    assert record(lists) == first
    assert first["plan"]["split_lists"] == [[False, False], {"train": meta.joinpath("train.txt").stat().st_size,
                                                             "test": meta.joinpath("test.txt").stat().st_size}]
    meta.joinpath("train.txt").write_text(meta.joinpath("train.txt").read_text() + "bibimbap/1\n")
    assert record(lists) != first  # the same paths, other lines
    assert "split_lists" not in record()["plan"] and record() != first


@pytest.mark.timeout(300)
def test_every_line_and_every_image_is_counted_with_its_reason(tmp_path):
    expected = food101(tmp_path / "food")
    meta = tmp_path / "food" / "meta"
    train = [p.removesuffix(".jpg") for p in expected["train"]]
    test = [p.removesuffix(".jpg") for p in expected["test"]]
    unlisted, both, repeated = train[0], train[1], train[2]
    lines = train[1:5] + ["apple_pie/999", repeated] + train[5:]  # a missing image, a repeat; train[0] unlisted
    meta.joinpath("train.txt").write_text("\n".join(lines) + "\n")
    meta.joinpath("test.txt").write_text("\n".join(test + [both]) + "\n")
    out = tmp_path / "out"
    result = run_tool("pipeline.main", f"--input_dir={tmp_path / 'food' / 'images'}", f"--output_dir={out}",
                      lists_flag(tmp_path / "food", train="train", test="test"), "--image_size=16", "--quiet",
                      "--direct_running_mode=in_memory", "--direct_num_workers=1")
    assert result.returncode == 0, result.stderr  # rejections are reported, as any rejected image is
    written = splits_of(out)
    assert written == {"train": sorted(f"{p}.jpg" for p in train[2:]), "test": expected["test"]}  # once each
    found = reasons(out)
    assert found[f"{unlisted}.jpg"][:2] == ("skipped", "not_in_split_lists")
    stage, reason, detail = found[f"{both}.jpg"]
    assert (stage, reason) == ("rejected", "listed_in_two_splits")
    assert f"line 1 of the train list {meta / 'train.txt'}" in detail and "line 7 of the test list" in detail
    stage, reason, detail = found["apple_pie/999"]
    assert (stage, reason) == ("rejected", "listed_image_missing")
    assert detail.startswith(f"line 5 of the train list {meta / 'train.txt'} names 'apple_pie/999'")
    assert len(error_rows(out)) == 3
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["files"] == {"found": 25, "written": 22, "rejected": 2, "skipped": 1, "upscaled": 0}
    assert info["rejected_by_reason"] == {"listed_image_missing": 1, "listed_in_two_splits": 1}
    assert info["skipped_by_reason"] == {"not_in_split_lists": 1}
    assert info["split_lists"]["repeated_lines"] == 1
    assert info["split_lists"]["examples"]["repeated_lines"][0]["row"] == 6
    assert "Rejected: listed_image_missing 1, listed_in_two_splits 1" in result.stdout
    assert "Skipped: not_in_split_lists 1" in result.stdout
    assert "1 line repeats an image of its list (written once)" in result.stdout
    assert run_tool("pipeline.verify", str(out)).returncode == 0  # found = written + rejected + skipped, line by line


@pytest.mark.timeout(300)
def test_a_bare_name_two_images_have_is_written_in_no_split(tmp_path):
    root = tmp_path / "in"
    for c, name in enumerate(("cats", "dogs")):
        (root / name).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), (90 * c, 40 * i, 0)).save(root / name / f"{c * 3 + i if i else 0}.png")
    (tmp_path / "train.txt").write_text("0.png\n1.png\n4.png\n")
    (tmp_path / "test.txt").write_text("2.png\n5.png\n")
    out = tmp_path / "out"
    assert convert(root, out, f"--split_lists=train={tmp_path / 'train.txt'},test={tmp_path / 'test.txt'}",
                   "--image_size=8") == 0
    assert splits_of(out) == {"train": ["cats/1.png", "dogs/4.png"], "test": ["cats/2.png", "dogs/5.png"]}
    found = reasons(out)
    assert {path: found[path][1] for path in found} == {"cats/0.png": "listed_name_ambiguous",
                                                        "dogs/0.png": "listed_name_ambiguous"}
    assert "'cats/0.png', 'dogs/0.png'" in found["cats/0.png"][2]


@pytest.mark.timeout(600)
def test_four_workers_write_what_one_does(tmp_path):
    """Nothing depends on one worker: the lists read in ranges and the join on 4 worker processes."""
    expected = food101(tmp_path / "food", per_class=12)
    meta = tmp_path / "food" / "meta"
    train = [p.removesuffix(".jpg") for p in expected["train"]]
    meta.joinpath("train.txt").write_text("\n".join(train[1:] + ["churros/1", train[3]]) + "\n")
    args = [f"--input_dir={tmp_path / 'food' / 'images'}", lists_flag(tmp_path / "food", train="train", test="test"),
            "--image_size=16", "--quiet"]
    one, four = tmp_path / "one", tmp_path / "four"
    assert convert(tmp_path / "food" / "images", one, *args[1:]) == 0
    result = cli("pipeline.main", *args, f"--output_dir={four}", "--direct_num_workers=4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert splits_of(four) == splits_of(one) == {"train": sorted(f"{p}.jpg" for p in train[1:]),
                                                 "test": expected["test"]}
    assert sorted(error_rows(four), key=str) == sorted(error_rows(one), key=str)
    info = json.loads((four / "image_tfrecords.json").read_text())
    assert info["files"] == {"found": 37, "written": 35, "rejected": 1, "skipped": 1, "upscaled": 0}
    assert info["split_lists"]["repeated_lines"] == 1


# --- One line at the start -------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_list_that_cannot_be_read_is_one_line(tmp_path, capsys, fifos):
    food101(tmp_path / "food", per_class=2)
    meta = tmp_path / "food" / "meta"
    (meta / "empty.txt").write_text("\n \n")
    (meta / "binary.txt").write_bytes(b"\n" + b"\x00" * (1 << 21))  # not a list: never held
    fifos.append(hostile_files.fifo(meta / "pipe.txt"))
    base = [f"--input_dir={tmp_path / 'food' / 'images'}", f"--output_dir={tmp_path / 'out'}"]
    for name, says in [("nope", f"--split_lists test list {meta / 'nope.txt'} does not exist: give the list"),
                       ("pipe", f"--split_lists test list {meta / 'pipe.txt'} is a FIFO (named pipe), not a regular "
                                "file, and is not read"),
                       ("empty", "the list is empty: write one image a line"),
                       ("binary", f"its line 2 is over 1 MiB ({1 << 21} bytes): a line names one image")]:
        code, stderr = main_in_process(capsys, *base, lists_flag(tmp_path / "food", train="train", test=name))
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and says in lines[0], (name, stderr)
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(120)
def test_what_contradicts_the_lists_is_refused(tmp_path):
    food101(tmp_path / "food", per_class=2)
    images, meta = tmp_path / "food" / "images", tmp_path / "food" / "meta"
    lists = lists_flag(tmp_path / "food", train="train", test="test")
    (tmp_path / "split" / "train" / "a").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "split" / "train" / "a" / "1.png")
    (tmp_path / "m.csv").write_text("path,label\na/1.png,a\n")
    (meta / "names.txt").write_text("1.jpg\n")
    (meta / "prefixed.txt").write_text("images/apple_pie/1\nimages/churros/2\n")
    cases = [
        ([f"--manifest={tmp_path / 'm.csv'}", lists], "a --manifest has its own split column"),
        ([f"--input_dir={tmp_path / 'split'}", lists], "has split folders (train), which give every image's split"),
        ([f"--input_dir={images}", lists, "--validation_split=0.1"], "--validation_split and --split_lists"),
        ([f"--input_dir={images}", lists, "--test_split", "0.1"], "--test_split and --split_lists"),
        ([f"--input_dir={images}", lists, "--unlabeled"], "--unlabeled writes one split"),
        ([f"--input_dir={images}", lists_flag(tmp_path / "food", train="train", test="names")],
         "the train list names images by path"),
        ([f"--input_dir={images}", lists_flag(tmp_path / "food", train="prefixed", test="test")],
         "none of the first 2 names of the train list is an image below --input_dir"),
    ]
    for args, says in cases:
        with pytest.raises(UserError) as e:
            _run(tmp_path / "out", *args)
        assert says in str(e.value) and "\n" not in str(e.value), (args, str(e.value))
    assert not (tmp_path / "out").exists()


def _run(out, *args):
    from pipeline.launcher import run
    from tests.conftest import FAST

    return run([f"--output_dir={out}", "--quiet", *args, *FAST])


# --- Cloud Storage and Dataflow --------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_gcs_lists_and_images(gcs_emulator, tmp_path):
    from tests.gcs_fixtures import NO_AUTH

    expected = food101(tmp_path / "food", per_class=4)
    bucket = gcs_emulator.create_bucket("split-lists")
    assert gcs_emulator.upload_tree(tmp_path / "food", f"{bucket}/food-101") == 14
    out = tmp_path / "out"
    assert _run(out, f"--input_dir={bucket}/food-101/images", "--image_size=16", NO_AUTH,
                f"--split_lists=train={bucket}/food-101/meta/train.txt,test={bucket}/food-101/meta/test.txt") == 0
    assert splits_of(out) == expected
    with pytest.raises(UserError, match=f"give --input_dir={bucket}/food-101/images, the folder the --split_lists "):
        _run(out, f"--input_dir={bucket}/food-101", "--image_size=16", NO_AUTH, "--overwrite",
             f"--split_lists=train={bucket}/food-101/meta/train.txt,test={bucket}/food-101/meta/test.txt")


SPLIT_LIST_BOUNDED_SIDE_INPUTS = {
    **BOUNDED_SIDE_INPUTS,
    **{f"JoinSplitLists/Read{split}List/{step}": "the line counts of a list's ranges: one per 64 MiB"
       for split in ("Train", "Test") for step in ("AllCounts", "RangeStarts")},
    "JoinSplitLists/SummariseSplitLists": "one dict: the lists' line counts and the first 10 repeated lines",
}
SPLIT_LIST_PER_LINE_STEPS = ("ListImages/ListFolders", "ListImages/ListParts", "ListImages/ListTopParts",
                             "ListImages/FilterByName",
                             "JoinSplitLists/ReadTrainList/ReadRows", "JoinSplitLists/ReadTestList/ReadRows",
                             "JoinSplitLists/ReadTrainList/CountRows", "JoinSplitLists/ReadTestList/CountRows",
                             "JoinSplitLists/KeyTrainLines", "JoinSplitLists/KeyTestLines", "JoinSplitLists/KeyFiles",
                             "JoinSplitLists/Match", "AssignLabels/", "AssignShards/PlaceImages",
                             "WriteShards/ConvertChunks", "WriteShards/AssembleShards")


@pytest.mark.timeout(300)
def test_a_split_lists_job_stages_no_per_line_work_on_one_worker(gcs_emulator, tmp_path):
    import os
    import re

    food101(tmp_path / "food", per_class=2)
    bucket = gcs_emulator.create_bucket("dataflow-split-lists")
    gcs_emulator.upload_tree(tmp_path / "food", f"{bucket}/food-101")
    result = run_script(SCRIPT, f"--input_dir={bucket}/food-101/images", f"--output_dir={bucket}/out",
                        f"--split_lists=train={bucket}/food-101/meta/train.txt,test={bucket}/food-101/meta/test.txt",
                        "--dry_run", "--image_size=32",
                        env=dict(os.environ, **gcs_emulator.env, **{**JOB_ENV, "BUCKET": "dataflow-split-lists"}))
    assert result.returncode == 0, result.stderr
    proto = pipeline_proto(gcs_emulator, re.search(r"staged to (gs://\S+): ", result.stdout).group(1))
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert {"JoinSplitLists/ReadTrainList/ReadRows", "JoinSplitLists/GroupByListedName",
            "JoinSplitLists/Match"} <= names
    single = assert_single_element_stages_are_bounded(proto, SPLIT_LIST_PER_LINE_STEPS,
                                                      SPLIT_LIST_BOUNDED_SIDE_INPUTS)
    assert any("JoinSplitLists/ReadTrainList/Ranges" in x.unique_name for s in single for x in s.transforms)
