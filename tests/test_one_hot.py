"""--manifest with one-hot (or multi-hot) class columns and several files: Roboflow's classification export
(train/, valid/, test/, each with a `_classes.csv` of `filename, <class>, ...` and 0/1 cells) in one command."""

from __future__ import annotations

import json

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from PIL import Image

from pipeline.errors import UserError
from tests.conftest import convert, run_tool
from tests.datasets import convert_manifest, error_rows, read_records
from tests.pipelines import TestPipeline
from transforms.base.examples import Example
from transforms.base.tfrecord import iter_records
from transforms.inputs import manifest as m
from transforms.inputs.rows import SPANNING, ReadRows

CLASSES = ["Hardhat", "no-hardhat", "person"]  # as the header writes them (a capital letter kept)
SPLIT_OF = {"train": "train", "valid": "validation", "test": "test"}


def _roboflow(root, rows_by_split: dict[str, list[tuple[str, str]]], header=("filename", *CLASSES)):
    """A Roboflow export: <root>/<split>/ of images and a _classes.csv written as Roboflow writes it, ', ' between
    cells (the header's names and the cells start with a space). `rows_by_split`: split -> [(file name, cells)]
    with cells such as '0, 1, 0'; a file name starting with 'missing' gets no image."""
    for split, rows in rows_by_split.items():
        folder = root / split
        folder.mkdir(parents=True)
        for k, (name, _) in enumerate(rows):
            if not name.startswith("missing"):
                Image.new("RGB", (12 + k % 3, 12), (20 * k % 256, 90, 200)).save(folder / name)
        text = ", ".join(header) + "\n" + "".join(f"{name}, {cells}\n" for name, cells in rows)
        (folder / "_classes.csv").write_text(text)
    return root


def _one_hot(k: int, classes=CLASSES) -> str:
    return ", ".join("1" if i == k % len(classes) else "0" for i in range(len(classes)))


def _labels(out) -> dict[str, tuple[str, list[int], list[str]]]:
    """source_path -> (split, label ids, class names) of every record, read back without TensorFlow."""
    info = json.loads((out / "image_tfrecords.json").read_text())
    got = {}
    for split, split_info in info["splits"].items():
        for shard in split_info["shards"]:
            for raw in iter_records(str(out / shard["file"])):
                f = Example.FromString(raw).features.feature
                got[f["source_path"].bytes_list.value[0].decode()] = (
                    split, list(f["label"].int64_list.value), [n.decode() for n in f["class_name"].bytes_list.value])
    return got


@pytest.mark.timeout(300)
def test_a_roboflow_single_label_export_converts_with_one_command(tmp_path):
    rows = {split: [(f"{split}_{k:02d}_jpg.rf.{k}a.jpg", _one_hot(k + len(split))) for k in range(n)]
            for split, n in (("train", 9), ("valid", 4), ("test", 3))}
    rows["valid"] += [("two_jpg.rf.x.jpg", "1, 0, 1"),  # valid row 5: two classes set
                      ("two_value.jpg", "0, 2, 0"),  # row 6: a value that is not 0 or 1
                      ("missing_jpg.rf.y.jpg", "0, 0, 1")]  # row 7: its file is missing (read_error at conversion)
    Image.new("RGB", (12, 12)).save(_roboflow(tmp_path / "rf", rows) / "valid" / "two_jpg.rf.x.jpg")
    Image.new("RGB", (12, 12)).save(tmp_path / "rf" / "valid" / "two_value.jpg")
    out = tmp_path / "out"
    result = run_tool("pipeline.main", f"--manifest={tmp_path / 'rf'}/*/_classes.csv", f"--output_dir={out}",
                      "--image_size=8", "--direct_running_mode=in_memory", "--direct_num_workers=1")
    assert result.returncode == 0, result.stderr
    assert ("--manifest: 3 class columns (ids in sorted order), one-hot: a row's class is its one column holding 1: "
            "Hardhat, no-hardhat, person") in result.stderr
    assert ("--manifest: 3 files, read together: test/_classes.csv (test), train/_classes.csv (train), "
            "valid/_classes.csv (validation)") in result.stderr
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == CLASSES and (out / "labels.txt").read_text() == "Hardhat\nno-hardhat\nperson\n"
    assert info["split_by"] == "split_folders"
    # every record against its CSV row: its split from its file's folder, its class from the column holding 1
    expected = {f"{split}/{name}": (SPLIT_OF[split], [int(cells.split(", ").index("1"))])
                for split, split_rows in rows.items() for name, cells in split_rows[:16]
                if cells.count("1") == 1 and "2" not in cells and not name.startswith("missing")}
    records = read_records(out)
    got = {r["source_path"]: (split, [r["label"]]) for split, split_records in records.items() for r in split_records}
    assert got == expected
    assert all(r["class_name"] == CLASSES[r["label"]] for rs in records.values() for r in rs)
    errors = {e["reason"]: e for e in error_rows(out)}
    assert set(errors) == {"manifest_not_one_hot", "manifest_bad_class_value", "read_error"}
    assert errors["manifest_not_one_hot"]["relpath"] == "valid/two_jpg.rf.x.jpg"
    assert errors["manifest_not_one_hot"]["detail"] == (
        "valid/_classes.csv row 5: 2 classes set (Hardhat, person); one-hot rows need exactly one 1, or give "
        "--multi_label")
    assert errors["manifest_bad_class_value"]["detail"] == (
        "valid/_classes.csv row 6: the class column 'no-hardhat' holds '2', not 0 or 1: a CSV without a label "
        "column has one 0/1 column per class")
    assert errors["read_error"]["relpath"] == "valid/missing_jpg.rf.y.jpg"
    files = info["files"]
    assert (files["found"], files["written"], files["rejected"], files["skipped"]) == (19, 16, 3, 0)


@pytest.mark.timeout(300)
def test_a_multi_label_export_gives_multi_hot_labels_and_images_of_no_class(tmp_path):
    cells = ["1, 1, 0", "0, 0, 1", "0, 0, 0", "1, 1, 1", " 1.0 , 0.0, 1"]
    rows = {"train": [(f"t{k}.jpg", cells[k % 5]) for k in range(10)], "valid": [(f"v{k}.jpg", cells[k]) for k in
                                                                                  range(5)]}
    _roboflow(tmp_path / "rf", rows)
    out = tmp_path / "out"
    assert convert_manifest(f"{tmp_path / 'rf'}/train/_classes.csv,{tmp_path / 'rf'}/valid/_classes.csv", out,
                            "--multi_label", "--image_size=8") == 0
    expected = {}
    for split, split_rows in rows.items():
        for name, row_cells in split_rows:
            ids = [i for i, v in enumerate(row_cells.split(",")) if v.strip() in ("1", "1.0")]
            expected[f"{split}/{name}"] = (SPLIT_OF[split], ids, [CLASSES[i] for i in ids])
    assert _labels(out) == expected
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["multi_label"] is True and info["class_names"] == CLASSES
    assert info["splits"]["train"]["images_without_labels"] == 2 and not error_rows(out)


def test_class_cells_are_0_or_1_and_a_one_hot_row_sets_exactly_one():
    how = m.RowReading("/data", "train", "", "filename", (("a", "A"), ("b", "b")))
    row = m.row_values({"filename": "x.jpg", "a": " 1.0", "b": "0 "}, 3, how)
    assert (row.class_name, row.split, row.path, row.relpath, row.columns) == ("A", "train", "/data/x.jpg", "x.jpg", ())
    for cells, reason, detail in [
        (("1", "1"), m.NOT_ONE_HOT, "row 3: 2 classes set (A, b); one-hot rows need exactly one 1, or give "
                                    "--multi_label"),
        (("0", "0"), m.NOT_ONE_HOT, "row 3: no class set (every class column is 0); one-hot rows need exactly one "
                                    "1, or give --multi_label (an image of no class)"),
        (("1", "yes"), m.BAD_CLASS_VALUE, "row 3: the class column 'b' holds 'yes', not 0 or 1: a CSV without a "
                                          "label column has one 0/1 column per class"),
        (("", "1"), m.BAD_CLASS_VALUE, "row 3: the class column 'A' is empty, not 0 or 1: a CSV without a label "
                                       "column has one 0/1 column per class"),
    ]:
        with pytest.raises(m.RowProblem) as problem:
            m.row_values({"filename": "x.jpg", "a": cells[0], "b": cells[1]}, 3, how)
        assert (problem.value.reason, problem.value.detail) == (reason, detail)
    multi = how._replace(multi_label=True, prefix="train/")
    row = m.row_values({"filename": "x.jpg", "a": "0", "b": "0", "split": "test"}, 4, multi)
    assert (row.labels, row.class_name, row.split, row.relpath) == ((), "", "test", "train/x.jpg")
    rejected = m.manifest_row(5, {"filename": "x.jpg", "a": "1", "b": "1"}, how._replace(shown="train/c.csv"))
    assert rejected.detail.startswith("train/c.csv row 5: 2 classes set")


def test_the_flat_split_folder_error_names_the_label_files_and_the_command(tmp_path):
    root = _roboflow(tmp_path / "rf", {split: [(f"{split}{k}.jpg", _one_hot(k)) for k in range(2)]
                                       for split in ("train", "valid", "test")})
    with pytest.raises(UserError) as error:
        convert(root, tmp_path / "out")
    assert str(error.value) == (
        "found 6 images directly in its split folders but no class folders: expected <input_dir>/<class>/<image> (or "
        "<input_dir>/<split>/<class>/<image>), one folder per class; test/_classes.csv, train/_classes.csv, "
        f"valid/_classes.csv look like label files: give --manifest='{root}/*/_classes.csv'")
    flat = tmp_path / "flat"
    flat.mkdir()
    Image.new("RGB", (8, 8)).save(flat / "a.jpg")
    (flat / "labels.csv").write_text("filename,cat\na.jpg,1\n")
    (flat / "README.roboflow.txt").write_text("exported from roboflow")  # not named beside a CSV
    with pytest.raises(UserError) as error:
        convert(flat, tmp_path / "out")
    assert str(error.value) == (
        f"found 1 images directly in {flat} but no class folders: expected <input_dir>/<class>/<image> (or "
        "<input_dir>/<split>/<class>/<image>), one folder per class; labels.csv looks like a label file: give "
        f"--manifest={flat}/labels.csv; to convert them without labels (a test set to predict), give --unlabeled")


def _error(*args) -> str:
    result = run_tool("pipeline.main", *args, "--quiet")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    return lines[0]


def test_with_multi_label_the_hints_name_a_labels_column(tmp_path):
    out = f"--output_dir={tmp_path / 'out'}"
    (tmp_path / "no_path.csv").write_text("file,labels\na.png,cat\n")
    assert _error(f"--manifest={tmp_path / 'no_path.csv'}", out, "--multi_label") == (
        f"error: --manifest {tmp_path / 'no_path.csv'} has no 'path' column (columns: file, labels): name the image "
        "column path and the class column labels (class names separated by ';')")
    (tmp_path / "m.jsonl").write_text('{"path": "a.png", "label": "cat"}\n')
    line = _error(f"--manifest={tmp_path / 'm.jsonl'}", out, "--multi_label")
    assert "has no 'labels' column, which --multi_label reads" in line and "label column" not in line
    (tmp_path / "empty.csv").write_text("")
    assert "write a header line (path,labels[,split])" in _error(f"--manifest={tmp_path / 'empty.csv'}", out,
                                                                 "--multi_label")
    (tmp_path / "scores.csv").write_text("path,score\na.png,0.37\n")
    assert _error(f"--manifest={tmp_path / 'scores.csv'}", out, "--multi_label") == (
        f"error: --manifest {tmp_path / 'scores.csv'} has no 'labels' column, so its other columns are read as one "
        "0/1 column per class (one-hot), and the column 'score' holds '0.37' in row 1, not 0 or 1: name the image "
        "column path and the class column labels (class names separated by ';'), or keep one 0/1 column per class "
        "and no other")


def test_launch_refuses_mismatched_class_columns_multi_hot_rows_and_a_glob_matching_nothing(tmp_path):
    root = _roboflow(tmp_path / "rf", {"train": [("a.jpg", "1, 0, 0"), ("b.jpg", "0, 1, 0")],
                                       "valid": [("c.jpg", "1, 0")]})
    (root / "valid" / "_classes.csv").write_text("filename, Hardhat, person\nc.jpg, 1, 0\n")
    out = f"--output_dir={tmp_path / 'out'}"
    line = _error(f"--manifest={root}/*/_classes.csv", out)
    assert line == (f"error: --manifest: {root}/valid/_classes.csv and {root}/train/_classes.csv have different class "
                    "columns (it lacks no-hardhat): give every file the same columns, in any order (a column of 0s "
                    "for a class without images)")
    (root / "valid" / "_classes.csv").write_text("filename, Hardhat, no-hardhat, person\n" +
                                                 "c.jpg, 1, 1, 0\n" * 3 + "d.jpg, 0, 0, 1\n")
    assert _error(f"--manifest={root}/valid/_classes.csv", out) == (
        f"error: --manifest {root}/valid/_classes.csv: 3 of its first 4 rows set several class columns to 1 "
        "(multi-hot), and without --multi_label each row needs exactly one: give --multi_label")
    assert _error(f"--manifest={root}/*/none.csv", out) == (
        f"error: --manifest {root}/*/none.csv matches no file: check the pattern (quote it in the shell, "
        f"--manifest='{root}/*/none.csv', so that the shell does not expand it)")
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(300)
def test_a_gcs_glob_reads_each_split_folders_file(gcs_emulator, tmp_path, monkeypatch):
    """The glob's folders are listed a level at a time: Cloud Storage's own match of `export/*/_classes.csv`
    would list every object below export/, each image included."""
    from pipeline import plan
    from tests.gcs_fixtures import NO_AUTH

    matched = []
    real_match = plan.FileSystems.match
    monkeypatch.setattr(plan.FileSystems, "match", lambda patterns, *a: matched.extend(patterns) or real_match(
        patterns, *a))

    rows = {split: [(f"{split}{k}.jpg", _one_hot(k)) for k in range(n)] for split, n in (("train", 4), ("valid", 2))}
    local = _roboflow(tmp_path / "rf", rows)
    bucket = gcs_emulator.create_bucket("one-hot-glob")
    assert gcs_emulator.upload_tree(local, f"{bucket}/export") == 8
    gcs_emulator.write(f"{bucket}/export/README.roboflow.txt", "not a manifest")
    out = tmp_path / "out"
    assert convert_manifest(f"{bucket}/export/*/_classes.csv", out, NO_AUTH, "--image_size=8") == 0
    got = {path: (split, ids) for path, (split, ids, _) in _labels(out).items()}
    assert got == {f"{split}/{name}": (SPLIT_OF[split], [cells.split(", ").index("1")])
                   for split, split_rows in rows.items() for name, cells in split_rows}
    assert not [p for p in matched if p.startswith(bucket) and "*" in p]  # the two files were asked for by name


def test_the_label_files_hint_gives_the_manifest_that_reads_them():
    from pipeline.plan import label_files_hint

    assert label_files_hint("/d", []) == ""
    assert label_files_hint("/d/", ["train/a.csv", "valid/b.csv"]) == (
        "; train/a.csv, valid/b.csv look like label files: give --manifest=/d/train/a.csv,/d/valid/b.csv")
    assert label_files_hint("/d", ["train/_classes.csv", "README.txt", "valid/_classes.csv"]) == (
        "; train/_classes.csv, valid/_classes.csv look like label files: give --manifest='/d/*/_classes.csv'")
    assert label_files_hint("/d", ["annotations.json"]) == (
        "; annotations.json may hold the labels: a manifest is a CSV or JSON Lines file with a path column and a "
        "label column, or one 0/1 column per class (docs/manifest.md), given as --manifest")


def test_read_rows_over_several_files_numbers_each_files_rows_and_says_which_file(tmp_path):
    """ReadRows (PBegin -> RowFields) over two files of different column orders, cut into ranges: each row numbered
    as a sequential read of its own file numbers it, with its file's index; a quoted line break keeps its file."""
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    first.write_text("filename, x, y\na.jpg, 1, 0\nb.jpg, 0, 1\nc.jpg, 1, 0\n")
    second.write_text('y,filename,x\n0,"d\ne.jpg",1\n1,f.jpg,0\n')
    with TestPipeline() as p:
        read = p | ReadRows([str(first), str(second)], "csv", range_bytes=9)
        assert_that(read.fields | beam.Map(lambda r: (r.file, r.row, r.fields["filename"], r.fields["y"].strip())),
                    equal_to([(0, 1, "a.jpg", "0"), (0, 2, "b.jpg", "1"), (0, 3, "c.jpg", "0"),
                              (1, 1, "d\ne.jpg", "0"), (1, 2, "f.jpg", "1")]), label="Fields")
        assert_that(read[SPANNING], equal_to([(1, 2, 2, 1)]), label="Spanning")
