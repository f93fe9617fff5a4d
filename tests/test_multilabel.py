"""--multi_label (a manifest's labels column: several classes per image) and groups with --manifest
(a group column, or --group_by on the paths as written)."""

from __future__ import annotations

import csv
import json
import random
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from pipeline.launcher import run
from pipeline.report import format_summary
from tests.conftest import FAST, doc_example, run_tool
from transforms.labels.layout import hash_split

SIZE = 16
NAMES = ["bird", "cat", "dog"]


def _image(path: Path, colour) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (SIZE, SIZE), colour).save(path)


def _run(manifest, out, *args):
    return run([f"--manifest={manifest}", f"--output_dir={out}", "--quiet", f"--image_size={SIZE}", *args, *FAST])


def _csv(path: Path, rows) -> Path:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


def _parsed(out: Path) -> dict[str, tuple[str, list[int], list[str]]]:
    """source_path -> (split, label ids, class names), read with plain TensorFlow and a hand-typed spec."""
    spec = {"label": tf.io.VarLenFeature(tf.int64), "class_name": tf.io.VarLenFeature(tf.string),
            "source_path": tf.io.FixedLenFeature([], tf.string)}
    got = {}
    for shard in sorted(out.glob("*-of-*.tfrecord")):
        for raw in tf.data.TFRecordDataset(str(shard)):
            p = tf.io.parse_single_example(raw, spec)
            got[p["source_path"].numpy().decode()] = (
                shard.name.split("-")[0], tf.sparse.to_dense(p["label"]).numpy().tolist(),
                [n.decode() for n in tf.sparse.to_dense(p["class_name"]).numpy()])
    return got


def _errors(out: Path) -> dict[str, dict]:
    path = out / "errors.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return {e["relpath"]: e for e in map(json.loads, lines)}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A CSV multi-label manifest converted once: (folder, its rows' expected labels)."""
    root = tmp_path_factory.mktemp("multilabel")
    labels = ["cat;dog", "dog", "", "cat; cat ;bird", "bird;;", "dog;cat", "bird;cat;dog", "cat"]
    rows = [("path", "labels", "split")]
    for i in range(16):
        _image(root / "in" / f"{i:02d}.png", (i * 15, 100, 200 - i * 10))
        rows.append((f"{i:02d}.png", labels[i % 8], "train" if i < 12 else "validation"))
    _csv(root / "in" / "list.csv", rows)
    out = root / "out"
    assert _run(root / "in" / "list.csv", out, "--multi_label") == 0
    expected = {f"{i:02d}.png": sorted({NAMES.index(n.strip()) for n in labels[i % 8].split(";") if n.strip()})
                for i in range(16)}
    return out, expected


def test_labels_are_written_as_sorted_unique_class_id_lists_with_their_names(converted):
    out, expected = converted
    got = _parsed(out)
    assert {path: ids for path, (_, ids, _) in got.items()} == expected
    for _, ids, names in got.values():
        assert names == [NAMES[i] for i in ids]
    assert got["03.png"][1:] == ([0, 1], ["bird", "cat"])  # 'cat; cat ;bird': stripped, deduplicated, by id
    assert got["02.png"][1:] == ([], [])  # an empty cell: an image of no class, written
    assert got["00.png"][0] == "train" and got["12.png"][0] == "validation"


def test_image_tfrecords_json_records_multi_label_and_counts_an_image_once_per_class(converted):
    out, expected = converted
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["multi_label"] is True and info["options"]["multi_label"] is True
    assert info["class_names"] == NAMES and info["num_classes"] == 3
    assert info["features"]["label"] == {"dtype": "int64", "shape": [-1], "field": "label"}
    assert info["features"]["class_name"]["shape"] == [-1] and info["features"]["image"]["shape"] == []
    train = [ids for i, (path, ids) in enumerate(sorted(expected.items())) if i < 12]
    assert info["splits"]["train"]["records"] == 12
    assert info["splits"]["train"]["class_counts"] == {
        name: sum(k in ids for ids in train) for k, name in enumerate(NAMES)}
    assert info["splits"]["train"]["images_without_labels"] == 2  # rows 2 and 10
    assert "images_without_labels" not in info["splits"]["validation"]  # rows 12-15: all have a class
    assert info["files"] == {"found": 16, "written": 16, "rejected": 0, "skipped": 0, "upscaled": 0}
    text = format_summary(info)
    assert "Multi-label: an image counts once for each of its classes; images of no class: train 2, " \
           "validation 0." in text


def test_make_dataset_gives_multi_hot_vectors_and_ragged_lists(converted):
    from pipeline import reader

    out, expected = converted
    hot = {}
    for image, label, path in (
            (e["image"], e["label"], e["source_path"].decode())
            for e in reader.make_dataset(str(out), "train", one_hot=True).as_numpy_iterator()):
        assert image.shape == (SIZE, SIZE, 3) and label.dtype == np.float32
        hot[path] = label.tolist()
    assert hot == {path: [float(k in ids) for k in range(3)] for path, ids in expected.items()
                   if path < "12.png"}
    batch = next(iter(reader.make_dataset(str(out), "train", batch_size=4)))
    assert isinstance(batch["label"], tf.RaggedTensor) and batch["label"].dtype == tf.int64
    assert batch["image"].shape == (4, SIZE, SIZE, 3)
    for ids, path in zip(batch["label"].to_list(), batch["source_path"].numpy(), strict=True):
        assert ids == expected[path.decode()]


@pytest.mark.timeout(300)
def test_keras_trains_on_multi_hot_targets_with_binary_crossentropy(converted):
    from pipeline import reader

    out, _ = converted
    train = reader.make_dataset(str(out), "train", batch_size=4, supervised=True, one_hot=True, scale=True,
                                repeat=True)
    image_spec, label_spec = train.element_spec
    assert image_spec == tf.TensorSpec([4, SIZE, SIZE, 3], tf.float32)
    assert label_spec == tf.TensorSpec([4, 3], tf.float32)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([
        tf.keras.Input((SIZE, SIZE, 3)),
        tf.keras.layers.Conv2D(4, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(3, activation="sigmoid"),
    ])
    model.compile(optimizer="adam", loss="binary_crossentropy")
    history = model.fit(train, steps_per_epoch=3, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert model.predict(next(iter(train))[0], verbose=0).shape == (4, 3)


def test_tfds_reads_the_label_as_a_sequence_of_class_labels(converted):
    tfds = pytest.importorskip("tensorflow_datasets")
    out, expected = converted
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.features["label"].feature.names == NAMES
    got = {e["source_path"].decode(): e["label"].tolist()
           for e in tfds.as_numpy(builder.as_dataset(split="validation"))}
    assert got == {path: ids for path, ids in expected.items() if path >= "12.png"}


def test_preview_puts_an_image_in_the_row_of_each_of_its_classes(converted):
    from pipeline.preview import make_contact_sheet

    out, expected = converted
    problems = []
    _, tiles = make_contact_sheet(str(out), "train", per_class=20, tile_size=32, problems=problems)
    assert problems == []
    train = {path: ids for path, ids in expected.items() if path < "12.png"}
    assert sorted((t.row, t.source_path) for t in tiles) == sorted(
        (k, path) for path, ids in train.items() for k in ids)
    for tile in tiles:
        assert tile.label == tile.row and tile.class_name == ";".join(NAMES[k] for k in train[tile.source_path])


@pytest.mark.timeout(300)
def test_benchmark_reads_the_lists_as_multi_hot(converted):
    from pipeline.readers import bench_input

    out, expected = converted
    source = bench_input.dataset_source(str(out), "train")
    assert source.multi_hot_classes == 3
    batches = list(bench_input.tfrecord_dataset(source, "parse", batch_size=12).as_numpy_iterator())
    assert len(batches) == 1 and batches[0]["label"].shape == (12, 3)
    assert sorted(map(tuple, batches[0]["label"].tolist())) == sorted(
        tuple(float(k in ids) for k in range(3)) for path, ids in expected.items() if path < "12.png")
    result = run_tool("pipeline.benchmark", str(out), "--batch_size=2", "--steps=2")
    assert result.returncode == 0, result.stderr[-500:]
    assert re.search(r"^parse\s+\d+", result.stdout, re.MULTILINE), result.stdout


def test_verify_accepts_the_dataset_and_finds_a_wrong_class_count(converted, tmp_path):
    import shutil

    from pipeline.verify import verify_dataset

    out, _ = converted
    report = verify_dataset(str(out))
    assert report.problems == [], report.problems
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    info = json.loads((copy / "image_tfrecords.json").read_text())
    info["splits"]["train"]["class_counts"]["cat"] += 1
    info["splits"]["train"]["images_without_labels"] = 0
    (copy / "image_tfrecords.json").write_text(json.dumps(info))
    problems = verify_dataset(str(copy)).problems
    assert any("class 'cat'" in p for p in problems), problems
    assert any("2 records have no label, but image_tfrecords.json says 0" in p for p in problems), problems


@pytest.mark.timeout(300)
def test_tf_slim_keys_hold_the_lists_and_every_reader_takes_them(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    from pipeline import reader
    from pipeline.verify import verify_dataset

    for i in range(4):
        _image(tmp_path / "in" / f"{i}.png", (i * 60, 0, 0))
    manifest = _csv(tmp_path / "in" / "list.csv", [("path", "labels"), ("0.png", "b;a"), ("1.png", "a"),
                                                   ("2.png", ""), ("3.png", "c;a;b")])
    out = tmp_path / "out"
    assert _run(manifest, out, "--multi_label", "--schema=tf_slim", "--validation_split=0") == 0
    spec = {"image/class/label": tf.io.VarLenFeature(tf.int64), "image/filename": tf.io.FixedLenFeature([], tf.string)}
    written = {}
    for raw in tf.data.TFRecordDataset([str(p) for p in out.glob("train-*")]):
        ex = tf.io.parse_single_example(raw, spec)
        written[ex["image/filename"].numpy().decode()] = tf.sparse.to_dense(ex["image/class/label"]).numpy().tolist()
    assert written == {"0.png": [0, 1], "1.png": [0], "2.png": [], "3.png": [0, 1, 2]}
    hot = {e["source_path"].decode(): e["label"].tolist()
           for e in reader.make_dataset(str(out), "train", one_hot=True).as_numpy_iterator()}
    assert hot == {path: [float(k in ids) for k in range(3)] for path, ids in written.items()}
    builder = tfds.builder_from_directory(str(out))
    got = {e["image"]["filename"].decode(): e["image"]["class"]["label"].tolist()
           for e in tfds.as_numpy(builder.as_dataset(split="train"))}
    assert got == written
    assert verify_dataset(str(out)).problems == []


@pytest.mark.timeout(300)
def test_jsonl_lists_labels_file_ids_and_bad_rows(tmp_path):
    src = tmp_path / "in"
    for i in range(7):
        _image(src / f"{i}.png", (i * 30, 0, 0))
    rows = [
        {"path": "0.png", "labels": ["dog", "cat"]},
        {"path": "1.png", "labels": "cat;bird"},  # a string: names separated by ';'
        {"path": "2.png", "labels": []},  # no class
        {"path": "3.png", "labels": ["cat", "horse"]},  # horse: not in the labels file
        {"path": "4.png", "labels": ["cat", {"x": 1}]},  # not a class name
        {"path": "5.png"},  # no labels field
        {"path": "6.png", "labels": ["bird", 7]},  # a number is a name
    ]
    (src / "list.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "labels.txt").write_text("dog\ncat\nbird\n7\n")
    out = tmp_path / "out"
    assert _run(src / "list.jsonl", out, "--multi_label", f"--labels_file={tmp_path / 'labels.txt'}",
                "--validation_split=0") == 0
    got = {path: (ids, names) for path, (_, ids, names) in _parsed(out).items()}
    assert got == {"0.png": ([0, 1], ["dog", "cat"]), "1.png": ([1, 2], ["cat", "bird"]), "2.png": ([], []),
                   "6.png": ([2, 3], ["bird", "7"])}
    errors = _errors(out)
    assert errors["3.png"]["stage"] == "skipped" and errors["3.png"]["reason"] == "unknown_class"
    assert "'horse' not in the labels file" in errors["3.png"]["detail"]
    assert errors["4.png"]["reason"] == "manifest_bad_row" and "row 5" in errors["4.png"]["detail"]
    assert errors["5.png"]["reason"] == "manifest_missing_label"
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["files"] == {"found": 7, "written": 4, "rejected": 2, "skipped": 1, "upscaled": 0}
    assert info["class_names"] == ["dog", "cat", "bird", "7"]


@pytest.mark.timeout(300)
def test_duplicates_compare_label_sets(tmp_path):
    src = tmp_path / "in"
    for name in ("a", "b", "c", "d"):
        _image(src / f"{name}.png", (10, 20, 30))  # the same bytes four times
    _image(src / "e.png", (200, 20, 30))
    _csv(src / "list.csv", [("path", "labels"), ("a.png", "cat;dog"), ("b.png", "dog;cat;dog"),
                            ("c.png", "cat"), ("d.png", "cat"), ("e.png", "cat")])
    out = tmp_path / "out"
    assert _run(src / "list.csv", out, "--multi_label", "--duplicates=drop", "--validation_split=0") == 0
    assert set(_parsed(out)) == {"e.png"}  # {cat, dog} and {cat}: a conflict, so no copy is written
    errors = _errors(out)
    assert {errors[f"{p}.png"]["reason"] for p in "abcd"} == {"duplicate_conflict"}
    assert "'cat', 'cat;dog'" in errors["a.png"]["detail"]
    _csv(src / "list.csv", [("path", "labels"), ("a.png", "cat;dog"), ("b.png", "dog;cat;dog"), ("e.png", "cat")])
    out2 = tmp_path / "out2"
    assert _run(src / "list.csv", out2, "--multi_label", "--duplicates=drop", "--validation_split=0") == 0
    assert {p: ids for p, (_, ids, _) in _parsed(out2).items()} == {"a.png": [0, 1], "e.png": [0]}
    assert _errors(out2)["b.png"]["reason"] == "duplicate"  # the same set in another order: a plain copy


def _cli_error(*args):
    result = run_tool("pipeline.main", *args, "--quiet")
    lines = result.stderr.strip().splitlines()
    return result.returncode, lines[-1] if lines else "", len(lines)


@pytest.mark.timeout(300)
def test_user_errors_are_one_line(tmp_path):
    _image(tmp_path / "in" / "cat" / "0.png", (0, 0, 0))
    with_labels = _csv(tmp_path / "in" / "labels.csv", [("path", "labels"), ("cat/0.png", "cat")])
    with_label = _csv(tmp_path / "in" / "label.csv", [("path", "label", "group"), ("cat/0.png", "cat", "g")])
    out = f"--output_dir={tmp_path / 'out'}"
    code, line, count = _cli_error(f"--manifest={with_labels}", out)
    assert code == 2 and count == 1, line
    assert re.fullmatch(r"error: --manifest \S+ has a 'labels' column: give --multi_label to read several classes "
                        r"per image from it, or name a one-class column label", line), line
    code, line, count = _cli_error(f"--manifest={with_label}", out, "--multi_label")
    assert code == 2 and count == 1 and "has no 'labels' column, which --multi_label reads" in line, line
    assert "or drop --multi_label" in line
    code, line, count = _cli_error(f"--input_dir={tmp_path / 'in'}", out, "--multi_label")
    assert code == 2 and count == 1 and line.startswith("error: --multi_label needs --manifest"), line
    code, line, count = _cli_error(f"--manifest={with_label}", out, "--group_by=(g)")
    assert code == 2 and count == 1 and "has a 'group' column and --group_by is given" in line, line
    assert not (tmp_path / "out").exists()


def test_an_all_empty_labels_column_ends_in_an_error_without_labels_file(tmp_path):
    """The class names are found in the job: none at all is a failed run (exit 1), one line saying why, and a
    failed run publishes nothing: the command with the labels filled in is not refused."""
    from tests.error_lines import unpublished

    _image(tmp_path / "0.png", (0, 0, 0))
    manifest = _csv(tmp_path / "list.csv", [("path", "labels"), ("0.png", "")])
    out = tmp_path / "out"
    command = ("pipeline.main", f"--manifest={manifest}", f"--output_dir={out}", "--multi_label", "--image_size=8",
               *FAST)
    result = run_tool(*command)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: no image has a class: every labels cell of the manifest is empty, so the dataset would have no class "
        "to learn, so nothing was published (a dataset already in --output_dir is unchanged); each file's reason is "
        f"in {unpublished(out) / 'errors.jsonl'}, which the next run into the folder removes: fill the labels column "
        "(class names separated by ';'), or give --labels_file, and run the command again")
    assert not (out / "image_tfrecords.json").exists()
    info = json.loads((unpublished(out) / "image_tfrecords.json").read_text())
    assert (info["num_classes"], info["files"]["written"]) == (0, 1)

    _csv(tmp_path / "list.csv", [("path", "labels"), ("0.png", "cat")])
    result = run_tool(*command)
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "image_tfrecords.json").read_text())["class_names"] == ["cat"]


def test_a_dataflow_run_whose_labels_cells_are_all_empty_exits_1_as_a_local_run_does(tmp_path, monkeypatch, capsys):
    """The summary and the exit code of a run are one function's, on the local runner and on Dataflow alike."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.runner import PipelineState

    from pipeline import cloud

    _image(tmp_path / "0.png", (0, 0, 0))
    manifest = _csv(tmp_path / "list.csv", [("path", "labels"), ("0.png", "")])
    out = tmp_path / "out"
    assert _run(manifest, out, "--multi_label") == 1  # the local run
    local = capsys.readouterr().err.strip().splitlines()[-1]
    assert local.startswith("error: no image has a class: every labels cell")

    class Finished:  # a Dataflow job that wrote that same folder and ended DONE
        has_job, state = True, PipelineState.DONE

        def job_id(self):
            return "2026-12-02_00_00_00-1"

        def wait_until_finish(self):
            return self.state

    class Submitted:
        def run(self):
            return Finished()

    monkeypatch.setattr("transforms.output.lock.update_lock", lambda *args, **kwargs: None)
    options = PipelineOptions(["--runner=DataflowRunner", "--project=p", "--region=europe-west4"])
    settings = type("Settings", (), {"output_dir": str(out)})()
    from tests.error_lines import unpublished

    run_id = unpublished(out).parent.name  # the job's last step left its report where the local run's did
    assert cloud.run_on_dataflow(Submitted(), options, settings, run_id, lambda: None) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == local


# Groups


def _group_manifest(src: Path, groups: int, seed: int = 3):
    """`groups` groups of 3 to 7 images (tiny PNGs): [(path, group)]."""
    rng = random.Random(seed)
    rows = []
    for g in range(groups):
        for i in range(rng.randint(3, 7)):
            path = f"p{g:03d}_{i}.png"
            Image.new("RGB", (8, 8), (g % 250, i * 30, 7)).save(src / path)
            rows.append((path, f"subject{g:03d}"))
    return rows


@pytest.mark.timeout(600)
def test_a_group_column_keeps_every_group_in_one_split_over_200_groups(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    rows = _group_manifest(src, 200)
    _csv(src / "list.csv", [("path", "label", "group")] + [(p, "cat" if i % 2 else "dog", g)
                                                          for i, (p, g) in enumerate(rows)])
    out = tmp_path / "out"
    assert _run(src / "list.csv", out, "--validation_split=0.3", "--test_split=0.1", "--image_size=8") == 0
    split_of = {path: split for path, (split, _, _) in _parsed_single(out).items()}
    assert len(split_of) == len(rows)
    by_group = defaultdict(set)
    for path, group in rows:
        by_group[group].add(split_of[path])
    assert all(len(splits) == 1 for splits in by_group.values())
    assert {next(iter(s)) for s in by_group.values()} == {"train", "validation", "test"}
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["split_by"] == "group_hash"
    assert info["groups"]["groups"] == 200 and info["groups"]["grouped_images"] == len(rows)
    assert info["groups"]["groups_in_several_splits"] == 0
    text = format_summary(info)
    assert "Groups (the manifest's group column): 200 groups of" in text
    assert "Split shares of the images written: train " in text


def _parsed_single(out: Path) -> dict[str, tuple[str, int, str]]:
    spec = {"label": tf.io.FixedLenFeature([], tf.int64), "source_path": tf.io.FixedLenFeature([], tf.string)}
    got = {}
    for shard in sorted(out.glob("*-of-*.tfrecord")):
        for raw in tf.data.TFRecordDataset(str(shard)):
            p = tf.io.parse_single_example(raw, spec)
            got[p["source_path"].numpy().decode()] = (shard.name.split("-")[0], int(p["label"]), "")
    return got


@pytest.mark.timeout(300)
def test_group_by_applies_to_the_manifest_paths_and_explicit_split_conflicts_are_leakage(tmp_path):
    """Rows without a split follow their group's one explicit split; explicit splits that differ are leakage."""
    src = tmp_path / "in"
    src.mkdir()
    rows = _group_manifest(src, 30, seed=5)
    manifest = [("path", "labels", "split")]
    for i, (path, _) in enumerate(rows):
        # group p000 has explicit splits that conflict; p001 one explicit split, not the one of its group's hash,
        # beside rows without one; the others have none
        split = ("train" if i == 0 else "test") if path.startswith("p000_") else ""
        if path == "p001_0.png":
            split = "validation" if hash_split("p001", 42, 0.4, 0.0) == "train" else "train"
        manifest.append((path, "cat;dog" if i % 3 else "dog", split))
    _csv(src / "list.csv", manifest)
    out = tmp_path / "out"
    assert _run(src / "list.csv", out, "--multi_label", r"--group_by=^(p\d+)_", "--validation_split=0.4",
                "--image_size=8") == 0
    split_of = {path: split for path, (split, _, _) in _parsed(out).items()}
    by_group = defaultdict(set)
    for path, _ in rows:
        by_group[path.split("_")[0]].add(split_of[path])
    assert by_group.pop("p000") == {"train", "test"}  # the rows' own splits are kept
    explicit = "validation" if hash_split("p001", 42, 0.4, 0.0) == "train" else "train"
    assert by_group.pop("p001") == {explicit}  # the rows without a split joined the group's explicit one
    assert all(len(s) == 1 for s in by_group.values()) and len(by_group) == 28
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["groups"]["groups"] == 30 and info["groups"]["groups_in_several_splits"] == 1
    assert [e["group"] for e in info["groups"]["several_splits_examples"]] == ["p000"]
    text = format_summary(info)
    assert "Groups (--group_by=^(p\\d+)_): 30 groups of" in text
    assert "Groups with images in more than one split (the manifest's split column) (leakage): 1, e.g. 'p000'" \
        in text


def test_docs_manifest_reader_example_runs(converted, monkeypatch):
    """docs/manifest.md's multi-label reader example, run as written in a folder holding its tfrecords/."""
    out, _ = converted
    blocks = [doc_example("docs/manifest.md", "binary_crossentropy")]
    work = out.parent / "docs_example"
    work.mkdir(exist_ok=True)
    if not (work / "tfrecords").exists():
        (work / "tfrecords").symlink_to(out)
    monkeypatch.chdir(work)
    namespace: dict = {}
    exec(compile(blocks[0], "docs/manifest.md", "exec"), namespace)  # noqa: S102 - the documented example
    assert namespace["model"].output_shape == (None, 3)


def test_label_list_reads_texts_and_json_lists_and_refuses_anything_else():
    from transforms.inputs.manifest import BAD_ROW, RowProblem, label_list

    assert label_list(" a ; ;b;a ", 1) == ("a", "b", "a")  # repeats are dropped later, by class id
    assert label_list("", 1) == () and label_list([], 1) == () and label_list(None, 1) is None
    assert label_list(["x", 3, " y "], 1) == ("x", "3", "y")
    for bad in ([True], [None], [["x"]], [{"x": 1}], {"x": 1}, 1.5, False):
        with pytest.raises(RowProblem) as caught:
            label_list(bad, 7)
        assert caught.value.reason == BAD_ROW and caught.value.detail.startswith("row 7: labels ")


def test_settle_group_moves_hashed_rows_to_the_one_explicit_split_only():
    from transforms.base.records import ImageRef
    from transforms.inputs.manifest import GroupMember, settle_group

    def member(name, split, explicit):
        return GroupMember(ImageRef(f"/in/{name}", name, 1, split, "cat", 0, 7), explicit)

    one = settle_group("g", [member("a", "test", True), member("b", "train", False), member("c", "test", False)])
    assert [(r.relpath, r.split) for r in one] == [("a", "test"), ("b", "test"), ("c", "test")]
    two = settle_group("g", [member("a", "test", True), member("b", "train", True), member("c", "validation", False)])
    assert [(r.relpath, r.split) for r in two] == [("a", "test"), ("b", "train"), ("c", "validation")]
    none = settle_group("g", [member("a", "train", False), member("b", "train", False)])
    assert [r.split for r in none] == ["train", "train"]
