"""Unlabeled sets (issue 30): a flat folder of images to predict converts with --unlabeled, one `id` per record
and no label, into one split (test), and reads back with the reader, verify, preview, TFDS and Kaggle's notebooks."""

from __future__ import annotations

import io
import json
import os
import shutil

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from PIL import Image

from pipeline.errors import UserError
from tests.conftest import convert, doc_example, run_tool
from tests.datasets import count_data_items, write_tiny_tree
from tests.pipelines import TestPipeline
from transforms.base.dataset_format import SCHEMAS, record_fields
from transforms.base.examples import Example, build_example
from transforms.base.records import FileRef
from transforms.base.tfrecord import frame_record, iter_records
from transforms.labels.assign import DUPLICATE_ID, REJECTED, UNLABELED, AssignLabels, UniqueIds
from transforms.labels.layout import IN_A_SUBFOLDER, Placement, place

SIZE = 16
IDS = [f"img_{i:02d}" for i in range(7)]
FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def test_record_fields_of_an_unlabeled_set_have_an_id_and_no_label():
    assert list(record_fields("default", unlabeled=True)) == ["image", "height", "width", "source_path", "sha256",
                                                              "id"]
    assert record_fields("kaggle", unlabeled=True)["id"] == ("id", "string")
    assert "label" not in record_fields("tf_slim", unlabeled=True)
    assert record_fields("tf_slim", unlabeled=True)["id"] == ("id", "string")
    assert record_fields("default") is SCHEMAS["default"]


def test_place_puts_an_unlabeled_image_in_the_one_split_and_skips_one_in_a_folder():
    placement = dict(split_folders=False, seed=1, validation_split=0.5, test_split=0.0, unlabeled=True)
    assert place("0042.jpg", **placement) == Placement("test", "")
    assert place("more/0043.jpg", **placement)[0] == IN_A_SUBFOLDER


def test_unique_ids_of_an_append_keep_an_id_for_the_datasets_record():
    """`taken`: (id, relpath) of the dataset's records; a new file of such an id is rejected, whichever name sorts
    first, and the record's own file goes on (SkipPresent judges it)."""
    refs = [FileRef(f"/in/{name}", name, 3) for name in ("a.bmp", "a.jpg", "a.png", "b.jpg", "c.png", "c.jpg")]
    with TestPipeline() as p:
        labeled = p | beam.Create(refs) | AssignLabels([], split_folders=False, seed=1, validation_split=0.0,
                                                       test_split=0.0, unlabeled=True)
        taken = p | "Taken" >> beam.Create([("a", "a.jpg"), ("b", "b.jpg")])
        unique = labeled.images | UniqueIds(taken)
        assert_that(unique.images | beam.Map(lambda r: r.relpath), equal_to(["a.jpg", "b.jpg", "c.jpg"]),
                    label="Images")
        assert_that(unique[REJECTED] | beam.Map(lambda r: (r.relpath, r.reason, "a record of the dataset" in r.detail)),
                    equal_to([("a.bmp", DUPLICATE_ID, True), ("a.png", DUPLICATE_ID, True),
                              ("c.png", DUPLICATE_ID, False)]), label="DuplicateIds")


def test_assign_labels_and_unique_ids_in_a_pipeline():
    refs = [FileRef(f"/in/{name}", name, 3) for name in ("a.png", "a.jpg", "b.jpg", "sub/c.jpg")]
    with TestPipeline() as p:
        labeled = p | beam.Create(refs) | AssignLabels([], split_folders=False, seed=1, validation_split=0.3,
                                                       test_split=0.0, unlabeled=True)
        unique = labeled.images | UniqueIds()
        assert_that(unique.images | beam.Map(lambda r: (r.relpath, r.split, r.class_name, r.label)),
                    equal_to([("a.jpg", "test", "", None), ("b.jpg", "test", "", None)]), label="Images")
        assert_that(unique[REJECTED] | beam.Map(lambda r: (r.relpath, r.stage, r.reason)),
                    equal_to([("a.png", "rejected", DUPLICATE_ID)]), label="DuplicateIds")
        assert_that(labeled[UNLABELED] | beam.Map(lambda r: (r.relpath, r.reason)),
                    equal_to([("sub/c.jpg", IN_A_SUBFOLDER)]), label="InASubfolder")


def write_flat(folder, names=IDS, ext=".jpg"):
    """Small solid-colour JPEGs directly in `folder`, one per name: `name` + `ext`."""
    os.makedirs(folder, exist_ok=True)
    for i, name in enumerate(names):
        Image.new("RGB", (20 + i, 24), (30 * i % 256, 90, 200)).save(folder / f"{name}{ext}", quality=85)


def _info(out) -> dict:
    return json.loads((out / "image_tfrecords.json").read_text())


def _features(out) -> list[dict]:
    info = _info(out)
    return [Example.FromString(raw).features.feature for split in info["splits"].values()
            for shard in split["shards"] for raw in iter_records(str(out / shard["file"]))]


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    root = tmp_path_factory.mktemp("unlabeled") / "test"
    write_flat(root)
    (root / "notes.txt").write_text("not an image")  # skipped by name, as in any folder
    return root


@pytest.fixture(scope="module")
def unlabeled(flat, tmp_path_factory):
    """The flat folder converted with --unlabeled, as a user runs it; (result, output folder)."""
    out = tmp_path_factory.mktemp("unlabeled_out") / "tfrecords"
    result = run_tool("pipeline.main", f"--input_dir={flat}", f"--output_dir={out}", "--unlabeled",
                      f"--image_size={SIZE}", "--validation_split=0.3", *FAST)
    assert result.returncode == 0, result.stderr
    return result, out


def test_a_flat_folder_without_unlabeled_is_one_error_naming_the_option(flat, tmp_path):
    with pytest.raises(UserError) as e:
        convert(flat, tmp_path / "out")
    message = str(e.value)
    assert "\n" not in message
    assert f"found 7 images directly in {flat} but no class folders" in message
    assert "--unlabeled" in message
    assert not (tmp_path / "out" / "image_tfrecords.json").exists()


def test_an_unlabeled_folder_converts_into_one_test_split_with_an_id_per_record(unlabeled):
    result, out = unlabeled
    printed = result.stdout + result.stderr
    assert "unlabeled set: the images directly in" in printed and "one split, test" in printed
    assert "--validation_split has no effect: --unlabeled writes every image into one split (test)" in printed
    info = _info(out)
    assert info["unlabeled"] is True and info["options"]["unlabeled"] is True
    assert info["class_names"] == [] and info["num_classes"] == 0
    assert info["split_by"] == "unlabeled"
    assert list(info["splits"]) == ["test"]
    assert info["splits"]["test"]["records"] == 7 and info["splits"]["test"]["class_counts"] == {}
    assert info["files"] == {"found": 8, "written": 7, "rejected": 0, "skipped": 1, "upscaled": 0}
    assert "label" not in info["features"] and "class_name" not in info["features"]
    assert info["features"]["id"] == {"dtype": "string", "shape": [], "field": "id"}
    features = _features(out)
    assert sorted(f["id"].bytes_list.value[0].decode() for f in features) == IDS
    for f in features:
        assert "label" not in f and "class_name" not in f
        assert f["source_path"].bytes_list.value[0].decode() == f["id"].bytes_list.value[0].decode() + ".jpg"
    assert (out / "labels.txt").read_text() == ""


def test_the_reader_gives_dicts_with_the_id_and_supervised_image_id_pairs(unlabeled):
    from pipeline import reader

    _, out = unlabeled
    rows = list(reader.make_dataset(str(out), "test", batch_size=None).as_numpy_iterator())
    assert sorted(r["id"].decode() for r in rows) == IDS
    assert all("label" not in r and "class_name" not in r for r in rows)
    assert all(r["image"].shape == (SIZE, SIZE, 3) for r in rows)
    images, ids = next(iter(reader.make_dataset(str(out), "test", batch_size=7, supervised=True)))
    assert images.shape == (7, SIZE, SIZE, 3) and sorted(i.decode() for i in ids.numpy()) == IDS
    with pytest.raises(ValueError, match="one_hot needs labels, and .* is an unlabeled set"):
        reader.make_dataset(str(out), "test", one_hot=True)


def test_verify_passes_an_unlabeled_set(unlabeled):
    _, out = unlabeled
    result = run_tool("pipeline.verify", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].startswith("OK: ")


def test_verify_fails_on_a_damaged_unlabeled_shard(unlabeled, tmp_path):
    _, source = unlabeled
    out = tmp_path / "copy"
    shutil.copytree(source, out)
    shard = out / _info(out)["splits"]["test"]["shards"][0]["file"]
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0x10
    shard.write_bytes(bytes(blob))
    result = run_tool("pipeline.verify", str(out))
    assert result.returncode == 1
    assert "checksum mismatch" in result.stdout + result.stderr


def test_verify_catches_an_id_that_is_not_its_files_name(tmp_path):
    """A record whose id and source_path disagree (damage a checksum cannot see: a rewritten record)."""
    from pipeline.verify import _RecordChecker

    info = {"schema": "default", "unlabeled": True, "image": {"format": "jpeg"}, "class_names": []}
    checker = _RecordChecker(info, [], decode=False)
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, "JPEG")
    good = build_example(image=buffer.getvalue(), image_format="jpeg", label=None, class_name="", height=4,
                         width=4, source_path="a.jpg")
    bad = Example.FromString(good)
    bad.features.feature["id"].bytes_list.value[0] = b"b"
    path = tmp_path / "test-00000-of-00001.tfrecord"
    path.write_bytes(frame_record(good) + frame_record(bad.SerializeToString(deterministic=True)))
    result = checker.check_shard("test", str(path))
    assert result.problems == [f"{path.name} record 1: id 'b' is not the file name of source_path 'a.jpg' "
                               "without its extension ('a')"]


def test_preview_shows_ids_instead_of_labels(unlabeled, tmp_path):
    from pipeline.preview import make_contact_sheet

    _, out = unlabeled
    sheet, tiles = make_contact_sheet(str(out), per_class=4, tile_size=32)
    assert [t.class_name for t in tiles] == [t.source_path.rsplit(".", 1)[0] for t in tiles]
    assert len(tiles) == 4 and all(t.label == -1 for t in tiles)
    result = run_tool("pipeline.preview", str(out), f"--contact_sheet={tmp_path / 'sheet.png'}", "--per_class=3")
    assert result.returncode == 0, result.stderr
    assert "3 images of an unlabeled set" in result.stdout
    chart = run_tool("pipeline.preview", str(out), f"--class_chart={tmp_path / 'chart.png'}")
    assert chart.returncode == 2 and chart.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "--class_chart" in chart.stderr and "unlabeled" in chart.stderr


def test_tfds_loads_an_unlabeled_set_with_its_ids(unlabeled):
    import tensorflow_datasets as tfds

    _, out = unlabeled
    assert _info(out)["tfds"]["files"] == ["features.json", "dataset_info.json"]
    builder = tfds.builder_from_directory(str(out))
    assert "label" not in builder.info.features and builder.info.supervised_keys is None
    examples = list(tfds.as_numpy(builder.as_dataset(split="test")))
    assert sorted(e["id"].decode() for e in examples) == IDS
    assert all(e["image"].shape == (SIZE, SIZE, 3) for e in examples)


def test_kaggle_notebooks_read_an_unlabeled_test_set_unchanged(flat, tmp_path, monkeypatch):
    """The notebooks' own test-set parse (read_unlabeled_tfrecord: `image` and `id`), from docs/other-readers.md."""
    out = tmp_path / "testset"
    assert convert(flat, out, "--unlabeled", "--schema=kaggle", "--shard_names=kaggle", f"--image_size={SIZE}") == 0
    features = _features(out)
    assert all({"image", "id"} <= set(f) and "class" not in f for f in features)
    block = doc_example("docs/other-readers.md", "read_unlabeled_tfrecord")
    assert 'tf.io.gfile.glob("testset/test*.tfrec")' in block
    block = block.replace("IMAGE_SIZE = [512, 512]", f"IMAGE_SIZE = [{SIZE}, {SIZE}]")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block, "docs/other-readers.md", "exec"), namespace)
    ids = [i.decode() for _, i in namespace["test"].as_numpy_iterator()]
    assert sorted(ids) == IDS and count_data_items(namespace["TEST_FILENAMES"]) == 7


def test_two_files_with_one_id_keep_the_first_and_reject_the_other(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    write_flat(src, ["a", "b"])
    write_flat(src, ["a"], ext=".png")
    assert convert(src, out, "--unlabeled", f"--image_size={SIZE}") == 0
    info = _info(out)
    assert info["splits"]["test"]["records"] == 2
    assert info["rejected_by_reason"] == {"duplicate_id": 1}
    assert sorted(f["source_path"].bytes_list.value[0].decode() for f in _features(out)) == ["a.jpg", "b.jpg"]
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert errors == [{"relpath": "a.png", "stage": "rejected", "reason": "duplicate_id",
                       "detail": "its id 'a' (the file name without its extension) is also the id of 'a.jpg', "
                                 "which is written: rename one of them"}]


def test_copies_within_the_split_are_still_counted(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    write_flat(src, ["a", "b"])
    (src / "c.jpg").write_bytes((src / "a.jpg").read_bytes())
    assert convert(src, out, "--unlabeled", f"--image_size={SIZE}") == 0
    duplicates = _info(out)["duplicates"]
    assert duplicates["within_split"] == 1 and duplicates["across_splits"] == 0
    assert duplicates["conflicting_labels"] == 0
    assert run_tool("pipeline.verify", str(out)).returncode == 0


def test_kaggle_layout_train_class_folders_and_a_flat_test_folder(tmp_path):
    """train/{a,b}/ and a flat test/: the train split converts, and one line says how to convert test/."""
    src = tmp_path / "in"
    write_tiny_tree(src / "train", {"a": 3, "b": 3})
    write_flat(src / "test", ["t1", "t2"])
    result = run_tool("pipeline.main", f"--input_dir={src}", f"--output_dir={tmp_path / 'out'}", *FAST)
    assert result.returncode == 0, result.stderr
    line = (f"test/ holds 2 images and no class folders, an unlabeled set: they are skipped (no_class_folder); "
            f"convert them on their own with --input_dir={src / 'test'} --unlabeled")
    assert line in result.stdout + result.stderr
    info = _info(tmp_path / "out")
    assert list(info["splits"]) == ["train"] and info["skipped_by_reason"] == {"no_class_folder": 2}
    with pytest.raises(UserError) as e:
        convert(src, tmp_path / "out2", "--unlabeled")
    message = str(e.value)
    assert "\n" not in message and "--unlabeled converts the images directly in" in message
    assert "train/" in message and f"--input_dir={src / 'test'}" in message


@pytest.mark.parametrize("args, message", [
    (["--labels_file=labels.txt"], "--labels_file names the classes, and --unlabeled writes no labels"),
    (["--manifest=m.csv"], "--unlabeled converts a flat folder of images"),
])
def test_options_that_contradict_unlabeled_are_one_line_errors(flat, tmp_path, args, message):
    with pytest.raises(UserError, match=message):
        convert(flat, tmp_path / "out", "--unlabeled", *args)


def test_num_shards_sets_the_test_splits_shards(flat, tmp_path):
    out = tmp_path / "out"
    assert convert(flat, out, "--unlabeled", "--num_shards=3", f"--image_size={SIZE}") == 0
    assert len(_info(out)["splits"]["test"]["shards"]) == 3


def test_the_benchmark_reads_an_unlabeled_set(unlabeled, tmp_path):
    _, out = unlabeled
    result = run_tool("pipeline.benchmark", str(out), "--split=test", "--batch_size=2", f"--json={tmp_path / 'b.json'}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "b.json").read_text())


def test_tf_slim_unlabeled_set_verifies_and_loads_in_tfds(flat, tmp_path):
    """tf_slim's nested keys (image/encoded, ...) beside the top-level id."""
    import tensorflow_datasets as tfds

    out = tmp_path / "out"
    assert convert(flat, out, "--unlabeled", "--schema=tf_slim", f"--image_size={SIZE}") == 0
    assert all("id" in f and "image/class/label" not in f and "image/encoded" in f for f in _features(out))
    assert run_tool("pipeline.verify", str(out)).returncode == 0
    examples = list(tfds.as_numpy(tfds.builder_from_directory(str(out)).as_dataset(split="test")))
    assert sorted(e["id"].decode() for e in examples) == IDS
