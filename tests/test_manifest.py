"""--manifest: a CSV or JSON Lines list of path,label[,split] instead of class folders, read inside the job."""

from __future__ import annotations

import csv
import json

import pytest
import tensorflow as tf
from PIL import Image

from pipeline.errors import UserError
from tests.conftest import run_tool
from tests.datasets import convert_manifest as _run
from tests.datasets import error_rows as _errors


def _images(folder, n, colour=(200, 30, 30)):
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(n):
        Image.new("RGB", (16 + i % 5, 16), colour).save(folder / f"img{i:04d}.png")
        names.append(f"img{i:04d}.png")
    return names


def _records(out):
    got = []
    for shard in sorted(out.glob("*-of-*")):
        for raw in tf.data.TFRecordDataset(str(shard)):
            ex = tf.train.Example.FromString(raw.numpy())
            f = ex.features.feature
            source = f["image/source_path"] if "image/source_path" in f else f.get("source_path")
            got.append((shard.name.split("-")[0], f["label"].int64_list.value[0] if "label" in f
                        else f["image/class/label"].int64_list.value[0], source))
    return got


@pytest.mark.timeout(300)
def test_csv_manifest_with_splits_relative_and_absolute_paths(tmp_path, capsys):
    data = tmp_path / "data"
    cats = _images(data / "a", 6)
    dogs = _images(data / "b", 6, (30, 30, 200))
    rows = [("path", "label", "split", "photographer")]
    rows += [(f"a/{n}", "cat", "train" if i < 4 else "validation", "x") for i, n in enumerate(cats)]
    rows += [(str(data / "b" / n), "dog", "test" if i < 2 else "val", "y") for i, n in enumerate(dogs)]
    with open(data / "list.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    out = tmp_path / "out"
    assert _run(data / "list.csv", out) == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == ["cat", "dog"]
    files = info["files"]
    assert files["found"] == 12 and files["written"] == 12
    assert {s: info["splits"][s]["records"] for s in info["splits"]} == {"train": 4, "validation": 6, "test": 2}
    assert info["splits"]["test"]["class_counts"] == {"dog": 2}
    assert info["splits"]["train"]["class_counts"] == {"cat": 4}
    assert (out / "labels.txt").read_text() == "cat\ndog\n"
    assert capsys.readouterr().err.count(
        "1 extra column(s) without a --features type, stored as string: photographer") == 1


@pytest.mark.timeout(300)
def test_jsonl_manifest_hash_split_and_input_dir_base(tmp_path):
    data = tmp_path / "photos"
    names = _images(data, 20)
    manifest = tmp_path / "lists" / "m.jsonl"
    manifest.parent.mkdir()
    manifest.write_text("".join(json.dumps({"path": n, "label": "ab"[i % 2], "score": i}) + "\n"
                                for i, n in enumerate(names)))
    out = tmp_path / "out"
    assert _run(manifest, out, f"--input_dir={data}", "--validation_split=0.5") == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == ["a", "b"]
    counts = {s: info["splits"][s]["records"] for s in info["splits"]}
    assert sum(counts.values()) == 20 and counts.get("train") and counts.get("validation")
    assert not _errors(out)


@pytest.mark.timeout(300)
def test_bad_rows_are_each_reported_with_their_row_number_and_counted(tmp_path):
    data = tmp_path / "data"
    names = _images(data, 4)
    text = ("path,label,split\n"
            f"{names[0]},cat,train\n"          # row 1: fine
            f"{names[1]},,train\n"             # row 2: no label
            f"{names[2]},cat,holdout\n"        # row 3: unknown split
            f"{names[3]},cat\n"                # row 4: wrong field count
            f"{names[0]},cat,train\n"          # row 5: duplicate of row 1
            ",cat,train\n"                     # row 6: no path
            "missing.png,cat,train\n")         # row 7: file missing: read_error at conversion
    (data / "m.csv").write_text(text)
    out = tmp_path / "out"
    assert _run(data / "m.csv", out) == 0
    errors = {e["reason"]: e for e in _errors(out)}
    assert errors["manifest_missing_label"]["detail"].startswith("row 2:")
    assert errors["manifest_unknown_split"]["detail"].startswith("row 3:")
    assert errors["manifest_bad_row"]["detail"].startswith("row 4:")
    assert errors["manifest_duplicate_path"]["detail"].startswith("row 5:")
    assert errors["manifest_missing_path"]["detail"].startswith("row 6:")
    assert errors["read_error"]["relpath"] == "missing.png"
    info = json.loads((out / "image_tfrecords.json").read_text())
    files = info["files"]
    assert files["found"] == 7
    assert files["written"] == 1
    assert files["written"] + files["rejected"] + files["skipped"] == 7


@pytest.mark.timeout(300)
def test_labels_file_fixes_ids_and_skips_unknown_labels(tmp_path):
    data = tmp_path / "data"
    names = _images(data, 3)
    (data / "m.csv").write_text("path,label\n" + "".join(f"{n},{lab}\n" for n, lab in zip(names, "xyz", strict=True)))
    (tmp_path / "labels.txt").write_text("z\ny\n")
    out = tmp_path / "out"
    assert _run(data / "m.csv", out, f"--labels_file={tmp_path / 'labels.txt'}") == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == ["z", "y"]
    assert [e["reason"] for e in _errors(out)] == ["unknown_class"]
    files = info["files"]
    assert (files["found"], files["written"], files["skipped"]) == (3, 2, 1)


@pytest.mark.timeout(600)
def test_two_thousand_rows_are_read_in_the_job(tmp_path):
    data = tmp_path / "data"
    names = _images(data, 2000)
    with open(data / "m.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label"])
        w.writerows((n, f"c{i % 7}") for i, n in enumerate(names))
    out = tmp_path / "out"
    assert _run(data / "m.csv", out, "--image_size=8") == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    files = info["files"]
    assert files["found"] == files["written"] == 2000
    assert len(info["class_names"]) == 7


@pytest.mark.parametrize("text, message", [
    ("", "is empty"),
    ("file,label\na.png,cat\n", "has no 'path' column"),
])
def test_empty_manifest_or_no_path_column_is_a_one_line_error(tmp_path, text, message):
    (tmp_path / "m.csv").write_text(text)
    with pytest.raises(UserError, match=message):
        _run(tmp_path / "m.csv", tmp_path / "out")
    proc = run_tool("pipeline.main", f"--manifest={tmp_path / 'm.csv'}", f"--output_dir={tmp_path / 'out'}")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("error:") and message in proc.stderr


@pytest.mark.timeout(300)
def test_gcs_manifest_with_relative_and_gs_paths(gcs_emulator, tmp_path):
    from tests.gcs_fixtures import NO_AUTH

    local = tmp_path / "src"
    names = _images(local, 6)
    bucket = gcs_emulator.create_bucket("manifest-e2e")
    assert gcs_emulator.upload_tree(local, f"{bucket}/photos") == 6
    rows = [f"photos/{n},{'ab'[i % 2]},train" for i, n in enumerate(names[:4])]  # relative to the manifest
    rows += [f"{bucket}/photos/{n},b,test" for n in names[4:]]  # absolute gs://
    manifest = gcs_emulator.write(f"{bucket}/m.csv",
                                  "path,label,split\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    assert _run(manifest, out, NO_AUTH) == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == ["a", "b"]
    assert info["files"]["written"] == 6 and info["files"]["found"] == 6
    assert info["splits"]["train"]["class_counts"] == {"a": 2, "b": 2}
    assert info["splits"]["test"]["class_counts"] == {"b": 2}


@pytest.mark.timeout(300)
def test_jsonl_lines_that_are_not_objects_and_quoted_csv_fields(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    Image.new("RGB", (12, 12), (1, 2, 3)).save(data / "a, b.png")
    Image.new("RGB", (12, 12), (9, 2, 3)).save(data / "c.png")
    (data / "m.jsonl").write_text('{"path": "a, b.png", "label": "x"}\n[1, 2]\n{"path": "c.png", "label": "y"\n'
                                  '{"path": null, "label": "y"}\n')
    out = tmp_path / "out"
    assert _run(data / "m.jsonl", out) == 0
    errors = sorted((e["reason"], e["detail"][:6]) for e in _errors(out))
    assert errors == [("manifest_bad_row", "row 2:"), ("manifest_bad_row", "row 3:"),
                      ("manifest_missing_path", "row 4:")]
    # a CSV field with a comma and a line break, quoted: one row, the rows after it keep their numbers
    (data / "m.csv").write_text('path,label,note\n"a, b.png",x,"two\nlines"\nc.png,,\n')
    out2 = tmp_path / "out2"
    assert _run(data / "m.csv", out2) == 0
    assert [(e["reason"], e["detail"][:6]) for e in _errors(out2)] == [("manifest_missing_label", "row 2:")]
    info = json.loads((out2 / "image_tfrecords.json").read_text())
    assert (info["files"]["found"], info["files"]["written"]) == (2, 1)


@pytest.mark.timeout(300)
def test_the_launcher_reads_only_a_sample_and_the_job_finds_the_class_names(tmp_path, monkeypatch):
    """With or without --labels_file, the launcher reads the header and a dozen rows, whatever the manifest's
    size; without it, the class names are found in the job (before, the launcher read every label)."""
    from pipeline import plan

    data = tmp_path / "data"
    names = _images(data, 30)
    lines = [f"{n},{'pq'[i % 2]}" for i, n in enumerate(names)]
    # past the launcher's dozen rows, a label that only a full read finds
    (data / "m.csv").write_text("path,label\n" + "\n".join(lines) + "\n" + f"{names[0]}-x,zzz\n")
    (tmp_path / "labels.txt").write_text("p\nq\n")
    read = []
    real_read_rows = plan.manifest.read_rows

    def counting_read_rows(*args):
        for item in real_read_rows(*args):
            read.append(item[0])
            yield item

    monkeypatch.setattr(plan.manifest, "read_rows", counting_read_rows)
    labelled = plan.plan_manifest(_settings(data / "m.csv", tmp_path / "out", f"--labels_file={tmp_path}/labels.txt"))
    assert labelled.class_names == ["p", "q"]
    assert read == list(range(1, plan.MANIFEST_SAMPLE_ROWS + 1))  # the launcher's sample, not the 31 rows
    read.clear()
    assert plan.plan_manifest(_settings(data / "m.csv", tmp_path / "out")).class_names == []  # the job's to find
    assert read == list(range(1, plan.MANIFEST_SAMPLE_ROWS + 1))
    out = tmp_path / "out"
    assert _run(data / "m.csv", out) == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == ["p", "q", "zzz"]
    assert [(e["reason"], e["relpath"]) for e in _errors(out)] == [("read_error", f"{names[0]}-x")]


def _settings(manifest, out, *args):
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.options import validate

    return validate(PipelineOptions([f"--manifest={manifest}", f"--output_dir={out}", *args]))


def test_a_manifest_without_a_label_column_or_with_a_non_json_first_line(tmp_path):
    (tmp_path / "m.csv").write_text("path,class\na.png,cat\n")
    with pytest.raises(UserError, match="has no 'label' column"):
        _run(tmp_path / "m.csv", tmp_path / "out")
    (tmp_path / "m.jsonl").write_text("path,label\n")
    with pytest.raises(UserError, match="is not a JSON object"):
        _run(tmp_path / "m.jsonl", tmp_path / "out")


def test_a_local_manifest_on_dataflow_is_a_one_line_error(tmp_path):
    (tmp_path / "m.csv").write_text("path,label\na.png,cat\n")
    proc = run_tool("pipeline.main", f"--manifest={tmp_path / 'm.csv'}", "--output_dir=gs://b/out",
                    "--runner=DataflowRunner")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: --manifest ") and "is not a gs:// path" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0


@pytest.mark.parametrize("name, split", [("valid", "validation"), ("Val", "validation"), ("dev", "validation"),
                                         ("Validation", "validation"), ("training", "train"), ("test_set", "test"),
                                         ("train", "train")])
def test_a_manifest_split_takes_every_name_a_split_folder_takes(name, split):
    # One table of split names (transforms.base.dataset_format.SPLIT_NAMES): a folder valid/ was accepted, a manifest
    # split 'valid' refused.
    from transforms.inputs.manifest import row_values

    assert row_values({"path": "a/x.jpg", "label": "cat", "split": name}, 1, "/data").split == split


def test_a_manifest_split_that_names_no_split_is_refused_with_the_names_it_takes():
    from transforms.inputs.manifest import UNKNOWN_SPLIT, RowProblem, row_values

    with pytest.raises(RowProblem) as raised:
        row_values({"path": "a/x.jpg", "label": "cat", "split": "holdout"}, 3, "/data")
    assert raised.value.reason == UNKNOWN_SPLIT
    assert raised.value.detail == ("row 3: split 'holdout' is not train, validation or test (nor a name that stands "
                                   "for one, such as val, valid, dev or training)")
