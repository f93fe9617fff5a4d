"""TensorFlow Datasets: `tfds.builder_from_directory(output_dir)` loads what the converter wrote, as it is.

Each test converts a small folder and opens it with the real tensorflow-datasets: splits, shard lengths,
typed features, records, labels and pixels are checked against what was written.
"""

from __future__ import annotations

import io
import json
import os
import shutil

import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.sample_data import generate_dataset
from tests.conftest import convert, doc_example
from tests.datasets import write_tiny_tree
from transforms.output import tfds_metadata

SIZE = 16
CONVERTED_WITH = (f"--image_size={SIZE}", "--validation_split=0.25", "--num_shards=2")
pytestmark = pytest.mark.timeout(300)


def _info(out) -> dict:
    return json.loads((out / "image_tfrecords.json").read_text())


def _by_source(out, split: str) -> dict[str, tuple[int, np.ndarray]]:
    """{source_path: (label, decoded image)} of a split, as this project's reader gives them."""
    from pipeline import reader

    return {e["source_path"].decode(): (int(e["label"]), e["image"])
            for e in reader.make_dataset(str(out), split).as_numpy_iterator()}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """4 classes of 8 images at 16x16, 2 train shards and a validation split: (source folder, output folder)."""
    root = tmp_path_factory.mktemp("tfds")
    generate_dataset(str(root / "in"), images_per_class=8, seed=3, min_side=24, max_side=48)
    out = root / "tfrecords"
    assert convert(root / "in", out, *CONVERTED_WITH) == 0
    return root / "in", out


def test_builder_from_directory_gives_the_splits_and_shard_lengths_written(converted):
    import tensorflow_datasets as tfds

    _, out = converted
    info = _info(out)
    builder = tfds.builder_from_directory(str(out))
    assert set(builder.info.splits) == set(info["splits"]) == {"train", "validation"}
    for name, split in info["splits"].items():
        loaded = builder.info.splits[name]
        assert loaded.num_examples == split["records"]
        assert loaded.shard_lengths == [shard["records"] for shard in split["shards"]]
        assert loaded.num_bytes == split["bytes"]
        # TFDS finds exactly the shards this tool wrote, by its file name template.
        assert [os.path.basename(p) for p in loaded.filepaths] == [shard["file"] for shard in split["shards"]]
    assert info["tfds"] == {"files": ["label.labels.txt", "features.json", "dataset_info.json"], "note": None}


def test_the_features_are_typed_an_image_of_the_stored_size_and_a_class_label(converted):
    import tensorflow as tf
    import tensorflow_datasets as tfds

    _, out = converted
    info = _info(out)
    features = tfds.builder_from_directory(str(out)).info.features
    assert isinstance(features["image"], tfds.features.Image)
    assert features["image"].shape == (SIZE, SIZE, 3)
    assert features["image"].encoding_format == "jpeg"
    assert isinstance(features["label"], tfds.features.ClassLabel)
    assert features["label"].names == info["class_names"] == (out / "labels.txt").read_text().splitlines()
    assert features["label"].num_classes == 4
    # The extra keys, typed as written.
    assert isinstance(features["class_name"], tfds.features.Text)
    assert isinstance(features["source_path"], tfds.features.Text)
    assert features["height"].dtype == features["width"].dtype == tf.int64


def test_as_dataset_yields_the_records_written_with_their_labels_and_pixels(converted):
    import tensorflow_datasets as tfds

    source, out = converted
    info = _info(out)
    names = info["class_names"]
    builder = tfds.builder_from_directory(str(out))
    for split in ("train", "validation"):
        written = _by_source(out, split)
        loaded = list(tfds.as_numpy(builder.as_dataset(split=split)))
        assert len(loaded) == info["splits"][split]["records"] == len(written)
        seen = set()
        for example in loaded:
            path = example["source_path"].decode()
            seen.add(path)
            # The label is the source image's class folder, by its id in labels.txt.
            assert example["label"] == names.index(path.split("/")[0]) == written[path][0]
            assert example["class_name"].decode() == path.split("/")[0]
            assert os.path.isfile(source / path)
            # Decoded by TFDS to the stored size, pixel for pixel what the record holds.
            assert example["image"].shape == (SIZE, SIZE, 3) and example["image"].dtype == np.uint8
            np.testing.assert_array_equal(example["image"], written[path][1])
        assert seen == set(written)


def test_as_supervised_yields_image_label_pairs(converted):
    import tensorflow_datasets as tfds

    _, out = converted
    info = _info(out)
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.supervised_keys == ("image", "label")
    pairs = list(tfds.as_numpy(builder.as_dataset(split="train", as_supervised=True)))
    assert len(pairs) == info["splits"]["train"]["records"]
    assert all(image.shape == (SIZE, SIZE, 3) and image.dtype == np.uint8 for image, _ in pairs)
    counts = np.bincount([int(label) for _, label in pairs], minlength=len(info["class_names"]))
    assert {name: int(counts[i]) for i, name in enumerate(info["class_names"]) if counts[i]} == \
        info["splits"]["train"]["class_counts"]


def test_resize_mode_fit_gives_an_image_of_any_size(tmp_path):
    import tensorflow_datasets as tfds

    src, out = tmp_path / "in", tmp_path / "out"
    generate_dataset(str(src), images_per_class=3, seed=4, min_side=20, max_side=60)
    assert convert(src, out, "--image_size=24", "--resize_mode=fit", "--validation_split=0") == 0
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.features["image"].shape == (None, None, 3)
    examples = list(tfds.as_numpy(builder.as_dataset(split="train")))
    assert len(examples) == _info(out)["splits"]["train"]["records"] == 12
    for example in examples:
        assert example["image"].shape == (example["height"], example["width"], 3)
        assert max(example["image"].shape[:2]) == 24
    assert {e["image"].shape for e in examples} != {(24, 24, 3)}  # not all square: the sizes vary


def test_split_folders_load_as_their_splits(tmp_path):
    import tensorflow_datasets as tfds

    src, out = tmp_path / "in", tmp_path / "out"
    write_tiny_tree(src / "train", {"cat": 5, "dog": 4})
    write_tiny_tree(src / "val", {"cat": 2, "dog": 2})
    write_tiny_tree(src / "test", {"dog": 3})
    assert convert(src, out, "--image_size=8") == 0
    builder = tfds.builder_from_directory(str(out))
    assert {name: split.num_examples for name, split in builder.info.splits.items()} == \
        {"train": 9, "validation": 4, "test": 3}
    test = list(tfds.as_numpy(builder.as_dataset(split="test", as_supervised=True)))
    assert [int(label) for _, label in test] == [builder.info.features["label"].names.index("dog")] * 3


def test_tf_slim_schema_loads_as_nested_features(tmp_path):
    import tensorflow_datasets as tfds

    src, out = tmp_path / "in", tmp_path / "out"
    write_tiny_tree(src, {"a": 4, "b": 3})
    assert convert(src, out, "--schema=tf_slim", "--image_size=8x12") == 0
    info = _info(out)
    assert info["tfds"]["files"] == ["image-class-label.labels.txt", "features.json", "dataset_info.json"]
    builder = tfds.builder_from_directory(str(out))
    image = builder.info.features["image"]
    assert image["encoded"].shape == (12, 8, 3)  # --image_size is WIDTHxHEIGHT
    assert image["class"]["label"].names == ["a", "b"]
    assert builder.info.supervised_keys is None  # TFDS looks supervised keys up at the top level only
    examples = list(tfds.as_numpy(builder.as_dataset(split="train")))
    assert len(examples) == 7
    for e in examples:
        name = e["image"]["class"]["text"].decode()
        assert e["image"]["class"]["label"] == ["a", "b"].index(name)
        assert e["image"]["filename"].decode().startswith(name + "/")
        assert e["image"]["encoded"].shape == (e["image"]["height"], e["image"]["width"], 3) == (12, 8, 3)


def test_kaggle_schema_loads_with_class_and_id(tmp_path):
    import tensorflow_datasets as tfds

    src, out = tmp_path / "in", tmp_path / "out"
    write_tiny_tree(src, {"a": 4, "b": 3})
    assert convert(src, out, "--schema=kaggle", "--image_size=8", "--validation_split=0") == 0
    assert _info(out)["tfds"]["files"] == ["class.labels.txt", "features.json", "dataset_info.json"]
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.features["class"].names == ["a", "b"]
    examples = list(tfds.as_numpy(builder.as_dataset(split="train")))
    assert len(examples) == 7
    for e in examples:
        assert e["class"] == ["a", "b"].index(e["class_name"].decode())
        assert e["id"].decode() == os.path.splitext(os.path.basename(e["source_path"].decode()))[0]
        assert e["image"].shape == (8, 8, 3)


def test_gzip_shards_get_no_tfds_files_and_say_why(tmp_path, capsys):
    """TFDS 4.9 reads TFRecord shards uncompressed only: no TFDS files, and image_tfrecords.json says why."""
    import tensorflow_datasets as tfds

    src, out = tmp_path / "in", tmp_path / "out"
    write_tiny_tree(src, {"a": 3, "b": 3})
    assert convert(src, out, "--compression=gzip", "--image_size=8") == 0
    info = _info(out)
    assert info["tfds"]["files"] == []
    note = ("TFDS reads uncompressed TFRecord shards only, and these are gzip-compressed: convert with "
            "--compression=none to load the folder with tfds.builder_from_directory")
    assert info["tfds"]["note"] == note
    assert capsys.readouterr().out.splitlines()[-1] == f"Note: no TFDS files written: {note}."
    assert not (out / "dataset_info.json").exists() and not (out / "features.json").exists()
    with pytest.raises(Exception, match="Could not read dataset info from .*dataset_info.json"):
        tfds.builder_from_directory(str(out))
    # With TFDS's files written anyway, TFDS could not read the shards: that is why there are none.
    splits = {name: {**split, "shards": [{**shard, "file": shard["file"].removesuffix(".gz")}
                                          for shard in split["shards"]]} for name, split in info["splits"].items()}
    files, why_not = tfds_metadata.tfds_files(splits, info["schema"], info["image"], info["class_names"], "none")
    assert why_not is None and files
    for name, text in files.items():
        (out / name).write_text(text.replace(".tfrecord", ".tfrecord.gz"))
    with pytest.raises(Exception, match="corrupted record|DataLoss"):
        list(tfds.builder_from_directory(str(out)).as_dataset(split="train"))


def test_shard_names_tfds_cannot_template_get_a_note():
    splits = {"train": {"shards": [{"file": "train00-2071.tfrec", "records": 2071, "bytes": 10}]}}
    note = tfds_metadata.unsupported(splits, "none")
    assert note.startswith("TFDS finds shards by the template {SPLIT}-{SHARD_X_OF_Y}.tfrecord "
                           "(e.g. train-00000-of-00001.tfrecord), and split 'train' has other names "
                           "(train00-2071.tfrec)")
    assert tfds_metadata.tfds_files(splits, "default", {}, ["a"], "none") == ({}, note)


def test_the_files_tfds_writes_itself_match_ours(converted, tmp_path):
    """TFDS's own classes write the same features.json and label names as tfds_metadata (no TensorFlow needed)."""
    import tensorflow_datasets as tfds

    _, out = converted
    info = _info(out)
    features = tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(SIZE, SIZE, 3), encoding_format="jpeg"),
        "label": tfds.features.ClassLabel(names=info["class_names"]),
        "class_name": tfds.features.Text(),
        "height": tfds.features.Scalar(dtype=np.int64),
        "width": tfds.features.Scalar(dtype=np.int64),
        "source_path": tfds.features.Text(),
        "sha256": tfds.features.Text(),
    })
    features.save_config(str(tmp_path))
    features.save_metadata(str(tmp_path))
    assert (tmp_path / "features.json").read_text() == (out / "features.json").read_text()
    assert (tmp_path / "label.labels.txt").read_text().split() == (out / "label.labels.txt").read_text().split()


def test_a_folder_of_format_version_1_is_read_verified_and_replaced(converted, tmp_path, capsys):
    """A folder converted before image_tfrecords.json existed: its description is dataset_info.json."""
    from pipeline import reader, verify

    _, out = converted
    old = tmp_path / "old"
    shutil.copytree(out, old)
    info = _info(old)
    for name in ["image_tfrecords.json", "dataset_info.json", "features.json", "label.labels.txt"]:
        (old / name).unlink()
    version_1 = {k: v for k, v in info.items() if k != "tfds"} | {"format_version": 1}
    (old / "dataset_info.json").write_text(json.dumps(version_1, indent=2))
    (old / "features.json").write_text(json.dumps(info["features"], indent=2))

    import tensorflow_datasets as tfds

    # TFDS cannot read it (docs/troubleshooting.md names this error): convert again.
    with pytest.raises(Exception, match='has no field named "format_version"'):
        tfds.builder_from_directory(str(old))
    assert reader.load_info(str(old))["format_version"] == 1
    assert len(list(reader.make_dataset(str(old), "train").as_numpy_iterator())) == info["splits"]["train"]["records"]
    assert verify.run([str(old)]) == 0
    assert "OK:" in capsys.readouterr().out
    # It is a complete dataset: a new run refuses to replace it, and never deletes it as an interrupted run's.
    source = tmp_path / "in"
    write_tiny_tree(source, {"a": 2, "b": 2})
    from pipeline.errors import UserError

    with pytest.raises(UserError, match=r"already holds a dataset \(dataset_info.json\): pass --if_exists=overwrite"):
        convert(source, old, "--image_size=8")
    assert json.loads((old / "dataset_info.json").read_text())["format_version"] == 1
    # --if_exists=skip accepts it when made with the same options, and says what it lacks.
    from pipeline.options import validate
    from pipeline.output_folder import existing_dataset

    settings = validate(PipelineOptions([f"--input_dir={info['options']['input_dir']}", f"--output_dir={old}",
                                         "--if_exists=skip", *CONVERTED_WITH]))
    assert existing_dataset(settings).endswith(
        "nothing to do (--if_exists=skip); it is of format version 1, without TensorFlow Datasets' files: "
        "--if_exists=overwrite converts it again so that tfds.builder_from_directory loads it")
    # --overwrite replaces it with a dataset of this version, which TFDS loads.
    assert convert(source, old, "--image_size=8", "--overwrite") == 0
    assert _info(old)["format_version"] == 2
    assert tfds.builder_from_directory(str(old)).info.splits["train"].num_examples == 4


@pytest.mark.parametrize("damage, problem", [
    (lambda d: (d / "label.labels.txt").unlink(),
     "label.labels.txt: missing, but image_tfrecords.json lists it among TFDS's files; tfds.builder_from_directory "
     "would not load the folder as it is; convert again"),
    (lambda d: (d / "dataset_info.json").write_text(
        (d / "dataset_info.json").read_text().replace('"shardLengths": [\n        "', '"shardLengths": [\n        "1')),
     "dataset_info.json: its splits differ from the splits and keys in image_tfrecords.json (TFDS reads its shard "
     "lengths from it); tfds.builder_from_directory would not load the folder as it is; convert again"),
    (lambda d: (d / "features.json").write_text((d / "features.json").read_text().replace('"16"', '"32"')),
     "features.json: TFDS's features differ from the keys and image size in image_tfrecords.json; "
     "tfds.builder_from_directory would not load the folder as it is; convert again"),
    (lambda d: (d / "label.labels.txt").write_text("a\nb\nc\nd\n"),
     "label.labels.txt: TFDS's class names differ from labels.txt; tfds.builder_from_directory would not load the "
     "folder as it is; convert again"),
])
def test_verify_checks_the_tfds_files(converted, tmp_path, damage, problem):
    from pipeline import verify

    _, out = converted
    assert verify.verify_dataset(str(out), decode=False).problems == []
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    damage(copy)
    assert verify.verify_dataset(str(copy), decode=False).problems == [problem]


def test_the_description_step_needs_no_tensorflow():
    """Dataflow workers have neither TensorFlow nor TFDS: writing TFDS's files imports neither."""
    import subprocess
    import sys

    code = ("import sys, transforms.output.describe, transforms.output.tfds_metadata, transforms.output.publishing; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorflow_datasets')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_readme_tfds_example_runs(converted, monkeypatch, capsys):
    """The README's TFDS example, run as written in a folder holding its tfrecords/ dataset."""


    _, out = converted
    blocks = [doc_example("docs/other-readers.md", "builder_from_directory")]  # the README links to it
    monkeypatch.chdir(out.parent)
    capsys.readouterr()
    exec(compile(blocks[0], "docs/other-readers.md", "exec"), {})
    info = _info(out)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"{info['splits']['train']['records']} {info['class_names']}"
    shape, name = printed[1].split(") ")
    assert shape == f"({SIZE}, {SIZE}, 3" and name in info["class_names"]


def test_array_record_shards_get_tfds_s_array_record_format():
    """--file_format=array_record's shards (train-00000-of-00002.array_record): TFDS's file format and template."""
    splits = {"train": {"shards": [{"file": f"train-0000{i}-of-00002.array_record", "records": 3, "bytes": 100}
                                   for i in range(2)]}}
    assert tfds_metadata.unsupported(splits, "none") is None
    info = tfds_metadata.dataset_info_json(splits, "default")
    assert info["fileFormat"] == "array_record"
    assert info["splits"] == [{"name": "train", "shardLengths": ["3", "3"], "numBytes": "200",
                               "filepathTemplate": "{SPLIT}-{SHARD_X_OF_Y}.array_record"}]


def test_array_record_shards_load_as_a_tfds_data_source(converted, tmp_path):
    """The same records in ArrayRecord shards (as --file_format=array_record names them) with our metadata:
    TFDS opens them as a random-access data source (as_dataset is TFRecord-only in TFDS 4.9)."""
    pytest.importorskip("array_record")
    import tensorflow_datasets as tfds
    from array_record.python.array_record_module import ArrayRecordWriter
    from PIL import Image as PILImage

    from transforms.base.examples import Example
    from transforms.base.tfrecord import iter_records

    _, out = converted
    info = _info(out)
    splits, records = {}, []
    for split, split_info in info["splits"].items():
        shards = []
        for shard in split_info["shards"]:
            name = shard["file"].replace(".tfrecord", ".array_record")
            writer = ArrayRecordWriter(str(tmp_path / name), "group_size:1")
            rows = list(iter_records(str(out / shard["file"])))
            for row in rows:
                writer.write(row)
            writer.close()
            records += rows if split == "train" else []
            shards.append({"file": name, "records": len(rows), "bytes": (tmp_path / name).stat().st_size})
        splits[split] = {"shards": shards}
    files, why_not = tfds_metadata.tfds_files(splits, info["schema"], info["image"], info["class_names"], "none")
    assert why_not is None
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    builder = tfds.builder_from_directory(str(tmp_path))
    source = builder.as_data_source(split="train")
    assert len(source) == info["splits"]["train"]["records"] == len(records)
    # {source_path: (label, JPEG bytes)} of what was written. TFDS's data source decodes with PIL (TensorFlow's
    # decoder rounds JPEG's colour conversion differently), so the pixels are compared with PIL's decode.
    written = {}
    for raw in records:
        feature = Example.FromString(raw).features.feature
        written[feature["source_path"].bytes_list.value[0].decode()] = (
            feature["label"].int64_list.value[0], feature["image"].bytes_list.value[0])
    for i in (0, len(source) - 1, len(source) // 2):  # random access
        example = source[i]
        label, encoded = written[example["source_path"].decode()]
        assert example["label"] == label
        np.testing.assert_array_equal(example["image"], np.asarray(PILImage.open(io.BytesIO(encoded)).convert("RGB")))
