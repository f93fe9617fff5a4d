"""--shard_names=kaggle (record counts in the names) and --file_format=array_record (Grain's random access).

Each test opens what the converter wrote with the reader its users have
(Kaggle's count_data_items, tf.data, Grain's ArrayRecordDataSource) and checks
records, labels and counts against what was written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter

import numpy as np
import pytest

from pipeline.errors import UserError
from pipeline.sample_data import generate_dataset
from tests.conftest import convert, doc_example, main_in_process
from tests.datasets import count_data_items
from transforms.base.examples import Example
from transforms.base.tfrecord import iter_records
from transforms.output.ownership import own_outputs

SIZE = 16
BROKEN = 3  # images that are rejected, so that the shards' counts are not the balanced ones


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """4 classes of 8 images plus BROKEN broken ones."""
    root = tmp_path_factory.mktemp("formats") / "in"
    generate_dataset(str(root), images_per_class=8, seed=7, min_side=24, max_side=64)
    for i, name in enumerate(sorted(p.name for p in root.iterdir())[:BROKEN]):
        (root / name / f"broken{i}.jpg").write_bytes(b"\xff\xd8\xff not really a JPEG")
    return root


def _convert(tree, out, *args):
    assert convert(tree, out, f"--image_size={SIZE}", "--validation_split=0.25", "--num_shards=train=3", *args) == 0
    return json.loads((out / "image_tfrecords.json").read_text())


@pytest.fixture(scope="module")
def standard(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("standard") / "tfrecords"
    return out, _convert(tree, out)


@pytest.fixture(scope="module")
def kaggle(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("kaggle") / "tfrecords"
    return out, _convert(tree, out, "--shard_names=kaggle", "--index_files")


@pytest.fixture(scope="module")
def arrays(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("arrays") / "arrayrecords"
    return out, _convert(tree, out, "--file_format=array_record")


def _records(out, info) -> dict[str, list[bytes]]:
    """Every TFRecord record of each split, shard after shard."""
    return {split: [r for s in split_info["shards"] for r in iter_records(str(out / s["file"]))]
            for split, split_info in info["splits"].items()}


def _array_records(out, info) -> dict[str, list[bytes]]:
    from array_record.python.array_record_module import ArrayRecordReader

    found = {}
    for split, split_info in info["splits"].items():
        found[split] = []
        for shard in split_info["shards"]:
            reader = ArrayRecordReader(str(out / shard["file"]))
            found[split].extend(reader.read_all())
            reader.close()
    return found


# --- Kaggle names ---------------------------------------------------------------------------------------------


def test_kaggle_names_carry_each_shards_true_record_count(kaggle, standard):
    out, info = kaggle
    assert info["files"]["rejected"] == BROKEN
    names = sorted(p.name for p in out.iterdir())
    shards = [s for split in info["splits"].values() for s in split["shards"]]
    assert [s["file"] for s in info["splits"]["train"]["shards"]] == [
        f"train{i:02d}-{s['records']}.tfrec" for i, s in enumerate(info["splits"]["train"]["shards"])]
    # TFDS cannot find Kaggle names by its file name template: no TFDS files (image_tfrecords.json says why).
    descriptions = ["errors.jsonl", "image_tfrecords.json", "labels.txt", *info["sources"]["files"]]
    assert names == sorted([s["file"] for s in shards] + [s["index"] for s in shards] + descriptions)
    assert all(re.fullmatch(r"(train|validation)\d\d-\d+\.(tfrec|idx)", n) for n in names if n not in descriptions)
    # The counts in the names are those of the files, read back record by record.
    records = _records(out, info)
    for shard in shards:
        assert len(list(iter_records(str(out / shard["file"])))) == shard["records"] == int(
            re.search(r"-(\d+)\.", shard["file"])[1])
    for split, split_info in info["splits"].items():
        files = [str(p) for p in sorted(out.glob(f"{split}*.tfrec"))]
        assert count_data_items(files) == len(records[split]) == split_info["records"] > 0
    # The rejections leave unequal shards: a name cannot be right by being the balanced count.
    assert len({s["records"] for s in info["splits"]["train"]["shards"]}) > 1 or BROKEN % 3 == 0
    # The same records, in the same shards, as with standard names; only the names differ.
    standard_out, standard_info = standard
    assert records == _records(standard_out, standard_info)
    assert [s["records"] for s in shards] == [s["records"] for split in standard_info["splits"].values()
                                              for s in split["shards"]]
    assert not (out / ".image-tfrecords-tmp").exists()


def test_kaggle_index_files_match_their_shards(kaggle):
    """Each index, named like its shard, holds its shard's `offset length` lines (tests/test_index_files.py reads
    such indexes with the tfrecord package)."""
    from transforms.base.tfrecord import record_offsets

    out, info = kaggle
    for shard in info["splits"]["train"]["shards"]:
        assert shard["index"] == shard["file"][:-len(".tfrec")] + ".idx"
        offsets = record_offsets(str(out / shard["file"]))
        expected = [f"{a} {b - a}" for a, b in zip(offsets, offsets[1:], strict=False)]
        assert (out / shard["index"]).read_text().splitlines() == expected
        assert len(expected) == shard["records"]


def test_kaggle_dataset_reads_with_the_reader_helper_and_verifies(kaggle):
    from pipeline import reader
    from pipeline.verify import verify_dataset

    out, info = kaggle
    labels = [int(e["label"]) for e in reader.make_dataset(str(out), "train").as_numpy_iterator()]
    assert Counter(info["class_names"][label] for label in labels) == Counter(info["splits"]["train"]["class_counts"])
    report = verify_dataset(str(out))
    assert report.ok, report.format()
    assert report.index_files == sum(len(s["shards"]) for s in info["splits"].values())


def test_verify_catches_a_kaggle_name_with_the_wrong_count(kaggle, tmp_path):
    from pipeline.verify import verify_dataset

    source, _ = kaggle
    out = tmp_path / "tfrecords"
    shutil.copytree(source, out)
    info = json.loads((out / "image_tfrecords.json").read_text())
    shard = info["splits"]["train"]["shards"][1]
    wrong = f"train01-{shard['records'] + 1}.tfrec"
    (out / shard["file"]).rename(out / wrong)
    (out / shard["index"]).rename(out / wrong.replace(".tfrec", ".idx"))
    shard.update(file=wrong, index=wrong.replace(".tfrec", ".idx"))
    (out / "image_tfrecords.json").write_text(json.dumps(info))
    report = verify_dataset(str(out), decode=False)
    assert report.problems == [
        f"{wrong}: holds {shard['records']} records, but its name says {shard['records'] + 1}, and Kaggle's "
        "notebooks count the records from the names: convert again"]


def test_verify_catches_a_stray_kaggle_named_shard(kaggle, tmp_path):
    from pipeline.verify import verify_dataset

    source, info = kaggle
    out = tmp_path / "tfrecords"
    shutil.copytree(source, out)
    first = info["splits"]["train"]["shards"][0]["file"]
    shutil.copy(out / first, out / "train07-5.tfrec")
    report = verify_dataset(str(out), decode=False)
    assert len(report.problems) == 1
    assert report.problems[0].startswith("train07-5.tfrec: not listed in image_tfrecords.json, but the shard glob "
                                         "train*.tfrec matches it")
    assert "(a stale shard from another run?)" in report.problems[0]


def test_overwrite_replaces_kaggle_named_shards_and_their_indexes(tree, tmp_path):
    out = tmp_path / "tfrecords"
    kaggle_info = _convert(tree, out, "--shard_names=kaggle", "--index_files")
    kaggle_files = {s[key] for split in kaggle_info["splits"].values() for s in split["shards"]
                    for key in ("file", "index")}
    assert kaggle_files <= {p.name for p in out.iterdir()}
    # the shards, indexes, description files (errors.jsonl, image_tfrecords.json, labels.txt: no TFDS files) and
    # the run's sources list
    assert len(own_outputs(str(out))) == len(kaggle_files) + 3 + len(kaggle_info["sources"]["files"])
    (out / "train-notes.tfrec.txt").write_text("mine")  # looks alike, is not this tool's
    info = _convert(tree, out, "--overwrite")
    names = {p.name for p in out.iterdir()}
    assert not kaggle_files & names
    assert names == {s["file"] for split in info["splits"].values() for s in split["shards"]} | {
        "image_tfrecords.json", "dataset_info.json", "features.json", "label.labels.txt", "labels.txt",
        "errors.jsonl", "train-notes.tfrec.txt", *info["sources"]["files"]}
    # And back: the standard shards give way to Kaggle's.
    info = _convert(tree, out, "--overwrite", "--shard_names=kaggle")
    assert {p.name for p in out.iterdir()} == {s["file"] for split in info["splits"].values()
                                                for s in split["shards"]} | {
        "image_tfrecords.json", "labels.txt", "errors.jsonl", "train-notes.tfrec.txt", *info["sources"]["files"]}


# --- ArrayRecord ----------------------------------------------------------------------------------------------


def test_array_record_shards_hold_the_same_records_as_tfrecord_shards(arrays, standard):
    out, info = arrays
    standard_out, standard_info = standard
    assert info["options"]["file_format"] == "array_record"
    assert [s["file"] for s in info["splits"]["train"]["shards"]] == [
        f"train-{i:05d}-of-00003.array_record" for i in range(3)]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [s["file"] for split in info["splits"].values() for s in split["shards"]]
        + ["dataset_info.json", "errors.jsonl", "features.json", "image_tfrecords.json", "label.labels.txt",
           "labels.txt", *info["sources"]["files"]])
    # Byte for byte the serialized Examples of the TFRecord run, in the same shards, in the same order.
    assert _array_records(out, info) == _records(standard_out, standard_info)
    for split, split_info in info["splits"].items():
        assert split_info["records"] == standard_info["splits"][split]["records"]
        assert split_info["class_counts"] == standard_info["splits"][split]["class_counts"]
        for shard in split_info["shards"]:
            assert shard["bytes"] == (out / shard["file"]).stat().st_size
    assert info["files"] == {**standard_info["files"], "upscaled": info["files"]["upscaled"]}
    assert info["files"]["rejected"] == BROKEN
    assert (out / "errors.jsonl").read_text() == (standard_out / "errors.jsonl").read_text()


def test_grain_reads_array_record_shards_with_random_access(arrays):
    import grain
    import tensorflow as tf

    out, info = arrays
    labels = (out / "labels.txt").read_text().splitlines()
    for split_info in info["splits"].values():
        source = grain.sources.ArrayRecordDataSource([str(out / s["file"]) for s in split_info["shards"]])
        assert len(source) == split_info["records"] > 0
        counts = Counter()
        paths = set()
        for i in reversed(range(len(source))):  # any order: random access
            feature = tf.train.Example.FromString(source[i]).features.feature
            label = feature["label"].int64_list.value[0]
            assert feature["class_name"].bytes_list.value[0].decode() == labels[label]
            image = tf.io.decode_jpeg(feature["image"].bytes_list.value[0]).numpy()
            assert image.shape == (SIZE, SIZE, 3)
            counts[labels[label]] += 1
            paths.add(feature["source_path"].bytes_list.value[0])
        assert counts == Counter(split_info["class_counts"])
        assert len(paths) == len(source)
        batches = grain.MapDataset.source(source).shuffle(seed=0).map(len).batch(2)
        assert len(batches) == -(-len(source) // 2)


def test_verify_reads_array_record_shards_and_catches_a_damaged_one(arrays, tmp_path):
    from pipeline.verify import verify_dataset

    source, info = arrays
    report = verify_dataset(str(source))
    assert report.ok, report.format()
    assert report.split_records == {split: s["records"] for split, s in info["splits"].items()}

    out = tmp_path / "arrayrecords"
    shutil.copytree(source, out)
    shard = out / info["splits"]["train"]["shards"][0]["file"]
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2])
    report = verify_dataset(str(out), decode=False)
    assert not report.ok
    assert any(p.startswith(f"{shard.name}: {len(data) // 2} bytes, but image_tfrecords.json says {len(data)}")
               for p in report.problems), report.problems
    assert any(p.startswith(f"{shard.name}: cannot be read") for p in report.problems), report.problems


def test_reader_helper_says_to_use_grain_for_array_record(arrays):
    from pipeline import reader

    out, _ = arrays
    with pytest.raises(reader.DatasetError, match="array_record shards, which tf.data does not read: open them "
                                                   "with Grain"):
        reader.make_dataset(str(out), "train")


@pytest.mark.parametrize("extra, message", [
    ("--compression=gzip", "--file_format=array_record takes no --compression=gzip"),
    ("--index_files", "--index_files is for TFRecord shards"),
])
def test_array_record_refuses_gzip_and_index_files(tree, tmp_path, extra, message):
    with pytest.raises(UserError, match=re.escape(message)):
        convert(tree, tmp_path / "out", "--file_format=array_record", extra)
    assert not (tmp_path / "out").exists()


def test_array_record_with_gzip_is_a_one_line_error_on_the_command_line(tree, tmp_path, capsys):
    code, stderr = main_in_process(capsys, f"--input_dir={tree}", f"--output_dir={tmp_path / 'out'}",
                                   "--file_format=array_record", "--compression=gzip")
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("error: --file_format=array_record takes no --compression"), \
        stderr


@pytest.mark.timeout(300)
def test_array_record_shards_on_gcs(gcs_emulator, tree, arrays):
    """ArrayRecord writes local files only: a gs:// shard is written locally and uploaded whole."""
    from apache_beam.io.filesystems import FileSystems

    from pipeline.verify import verify_dataset
    from tests.gcs_fixtures import NO_AUTH
    from transforms.base.tfrecord import scan_array_records

    bucket = gcs_emulator.create_bucket("formats-arrays")
    output = f"{bucket}/arrayrecords"
    assert convert(tree, output, NO_AUTH, f"--image_size={SIZE}", "--validation_split=0.25",
                   "--num_shards=train=3", "--file_format=array_record") == 0
    local_out, local_info = arrays
    remote_info = json.loads(gcs_emulator.read(f"{output}/image_tfrecords.json"))
    assert remote_info["splits"] == local_info["splits"]
    remote = {split: [r for s in split_info["shards"]
                      for _, r in scan_array_records(FileSystems.join(output, s["file"]))]
              for split, split_info in remote_info["splits"].items()}
    assert remote == _array_records(local_out, local_info)
    report = verify_dataset(output, decode=False)
    assert report.ok, report.format()


@pytest.mark.timeout(300)
def test_kaggle_names_on_gcs(gcs_emulator, tree, kaggle):
    """On gs:// too, each shard and its index are published under their Kaggle names, once, from the run's folder."""
    from pipeline.verify import verify_dataset
    from tests.gcs_fixtures import NO_AUTH

    bucket = gcs_emulator.create_bucket("formats-kaggle")
    output = f"{bucket}/tfrecords"
    assert convert(tree, output, NO_AUTH, f"--image_size={SIZE}", "--validation_split=0.25", "--num_shards=train=3",
                   "--shard_names=kaggle", "--index_files") == 0
    local_out, local_info = kaggle
    remote_info = json.loads(gcs_emulator.read(f"{output}/image_tfrecords.json"))
    # the same files, but for each run's own sources list (named after its run id)
    assert gcs_emulator.list_names(output) == sorted(
        [*(p.name for p in local_out.iterdir() if p.name not in local_info["sources"]["files"]),
         *remote_info["sources"]["files"]])
    assert remote_info["splits"] == local_info["splits"]
    for shard in remote_info["splits"]["train"]["shards"]:
        assert gcs_emulator.read(f"{output}/{shard['file']}") == (local_out / shard["file"]).read_bytes()
        assert gcs_emulator.read(f"{output}/{shard['index']}") == (local_out / shard["index"]).read_bytes()
    report = verify_dataset(output, decode=False)
    assert report.ok, report.format()


# --- the README's examples ------------------------------------------------------------------------------------


def _readme_block(marker: str) -> str:
    return doc_example("docs/other-readers.md", marker)  # the README links to it


def test_readme_kaggle_example_counts_the_records(kaggle, monkeypatch):
    out, info = kaggle
    block = _readme_block("count_data_items(")
    assert '"tfrecords/' in block
    monkeypatch.chdir(out.parent)
    namespace: dict = {}
    exec(compile(block, "docs/other-readers.md", "exec"), namespace)
    assert namespace["NUM_TRAINING_IMAGES"] == info["splits"]["train"]["records"] == len(
        _records(out, info)["train"])
    assert namespace["NUM_VALIDATION_IMAGES"] == info["splits"]["validation"]["records"]


def test_readme_grain_example_runs(arrays, monkeypatch):
    out, info = arrays
    block = _readme_block("ArrayRecordDataSource")
    assert '"arrayrecords/"' in block
    monkeypatch.chdir(out.parent)
    namespace: dict = {}
    exec(compile(block, "docs/other-readers.md", "exec"), namespace)
    assert len(namespace["source"]) == info["splits"]["train"]["records"]
    images, labels = namespace["batch"]
    assert images.shape == (8, SIZE, SIZE, 3) and images.dtype == np.uint8
    assert labels.shape == (8,) and set(labels.tolist()) <= set(range(info["num_classes"]))


def test_preview_samples_array_record_shards_like_tfrecord_ones(arrays, standard):
    from pipeline.preview import sample_records

    def sampled(out, info):
        problems = []
        chosen, read = sample_records(str(out), info, "train", per_class=2, max_records=1000, problems=problems)
        assert problems == []
        return read, {label: [(i, e["source_path"], e["image"].tobytes()) for i, e in rows]
                      for label, rows in chosen.items()}

    read, chosen = sampled(*arrays)
    assert (read, chosen) == sampled(*standard)
    assert sum(len(rows) for rows in chosen.values()) == 2 * len(chosen) > 0


def test_benchmark_says_it_reads_tfrecord_only(arrays):
    from pipeline.errors import DatasetError
    from pipeline.readers.bench_input import dataset_source

    out, _ = arrays
    with pytest.raises(DatasetError, match="holds array_record shards: the benchmark reads TFRecord shards"):
        dataset_source(str(out), "train")


def test_array_record_without_the_package_is_a_one_line_error(tree, tmp_path, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "array_record"
                        else find_spec(name, *a))
    with pytest.raises(UserError, match="--file_format=array_record needs the array-record package, which is not "
                                        "installed: pip install array-record"):
        convert(tree, tmp_path / "out", "--file_format=array_record")


def test_tfds_opens_the_array_record_output_as_a_random_access_data_source(arrays):
    """Issue 19: `tfds.data_source`-style access to the converter's own ArrayRecord folder, no extra step."""
    import tensorflow_datasets as tfds

    out, info = arrays
    builder = tfds.builder_from_directory(str(out))
    for split, split_info in info["splits"].items():
        source = builder.as_data_source(split=split)
        assert len(source) == split_info["records"]
        labels = sorted(int(source[i]["label"]) for i in range(len(source)))
        expected = sorted(info["class_names"].index(name) for name, n in split_info["class_counts"].items()
                          for _ in range(n))
        assert labels == expected
        last = source[len(source) - 1]  # random access to the last record
        assert last["image"].shape[-1] == 3


@pytest.fixture(scope="module")
def kaggle_keys(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("kaggle_keys") / "tfrecords"
    return out, _convert(tree, out, "--schema=kaggle", "--shard_names=kaggle")


def test_kaggle_schema_is_read_by_the_notebooks_parsing_code_unchanged(kaggle_keys, monkeypatch):
    import tensorflow as tf

    out, info = kaggle_keys
    assert info["schema"] == "kaggle"
    stored = {}
    for raw in _records(out, info)["train"]:
        feature = Example.FromString(raw).features.feature
        assert {"image", "class", "id"} <= set(feature) and "label" not in feature
        relpath = feature["source_path"].bytes_list.value[0].decode()
        record_id = feature["id"].bytes_list.value[0].decode()
        assert record_id == os.path.splitext(os.path.basename(relpath))[0]
        assert info["class_names"][feature["class"].int64_list.value[0]] == relpath.split("/")[0]
        stored[record_id] = feature["class"].int64_list.value[0]
    block = _readme_block("read_labeled_tfrecord")
    assert "IMAGE_SIZE = [512, 512]" in block and '"tfrecords/train*.tfrec"' in block
    block = block.replace("IMAGE_SIZE = [512, 512]", f"IMAGE_SIZE = [{SIZE}, {SIZE}]")  # the notebook's setting
    monkeypatch.chdir(out.parent)
    namespace: dict = {}
    exec(compile(block, "docs/other-readers.md", "exec"), namespace)
    images, labels = next(iter(namespace["train"]))
    assert images.shape == (16, SIZE, SIZE, 3) and images.dtype == tf.float32
    assert set(labels.numpy().tolist()) <= set(range(info["num_classes"]))
    by_id = {record_id.decode(): image for image, record_id in namespace["ids"].as_numpy_iterator()}
    assert set(by_id) == set(stored)  # every record, each id once
    assert all(0.0 <= image.min() and image.max() <= 1.0 for image in by_id.values())


def test_kaggle_schema_reads_back_with_the_reader_and_verify(kaggle_keys):
    from pipeline import reader
    from pipeline.verify import verify_dataset

    out, info = kaggle_keys
    report = verify_dataset(str(out))
    assert report.ok, report.format()
    images, labels = next(iter(reader.make_dataset(str(out), "train", batch_size=4, supervised=True)))
    assert images.shape[1:] == (SIZE, SIZE, 3) and labels.shape == (4,)
