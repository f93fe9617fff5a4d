"""--index_files: each shard's `offset length` index for DALI and the tfrecord package, made while writing."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
import types

import pytest
from apache_beam.io.filesystems import FileSystems

from pipeline import verify
from pipeline.cli import main_of
from pipeline.errors import UserError
from pipeline.sample_data import generate_dataset
from tests.conftest import convert, doc_example, run_tool
from transforms.base.dataset_format import TEMP_DIR, index_name
from transforms.output.write import index_text

# The `tfrecord` package (a dev extra) registers its own copy of TensorFlow's Example protos, so it cannot share a
# process with TensorFlow: it runs in a process of its own, as in a PyTorch training job.
HAS_TFRECORD = importlib.util.find_spec("tfrecord") is not None
NO_TFRECORD = "the tfrecord package (pip install tfrecord) is not installed: its own indexer and indexed reader " \
              "are not run; the index is checked against the framing parsed here"
_TFRECORD_READ = """
import json, sys
from tfrecord.reader import tfrecord_loader
from tfrecord.tools.tfrecord2idx import create_index
shard, index, theirs, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
create_index(shard, theirs)
description = {"label": "int", "source_path": "byte"}
row = lambda r: [int(r["label"][0]), bytes(r["source_path"]).decode("utf-8", "replace")]
whole = [row(r) for r in tfrecord_loader(shard, None, description)]
parts = {n: [row(r) for k in range(n) for r in tfrecord_loader(shard, index, description, shard=(k, n))]
         for n in range(1, workers + 1)}
print(json.dumps({"whole": whole, "parts": parts}))
"""


def framing_index(path) -> list[tuple[int, int]]:
    """(offset, length) of every record of an uncompressed TFRecord file, parsed here from its framing:
    an 8-byte little-endian data length and a 4-byte CRC, the data, a 4-byte CRC."""
    data = open(path, "rb").read()
    rows, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset:offset + 8])
        size = 8 + 4 + length + 4
        rows.append((offset, size))
        offset += size
    assert offset == len(data), f"{path} ends inside a record"
    return rows


def read_index(path) -> list[tuple[int, int]]:
    text = open(path).read()
    assert text.endswith("\n") and re.fullmatch(r"(\d+ \d+\n)*", text), text[:200]
    return [tuple(int(n) for n in line.split()) for line in text.splitlines()]


# --- the plain functions ------------------------------------------------------------------------------------


def test_index_name_is_not_matched_by_the_shard_glob():
    import fnmatch

    assert index_name("train-00000-of-00004.tfrecord") == "train-00000-of-00004.idx"
    assert not fnmatch.fnmatchcase(index_name("train-00000-of-00004.tfrecord"), "train-*.tfrecord*")


# --- a converted dataset ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("index_tree")
    generate_dataset(str(root), images_per_class=9, seed=7, min_side=24, max_side=64)
    return root


def listed_shards(out) -> list[dict]:
    info = json.loads((out / "image_tfrecords.json").read_text())
    return [shard for split in info["splits"].values() for shard in split["shards"]]


def test_convert_writes_each_shards_index_beside_it_without_reading_the_shard_again(tree, tmp_path, monkeypatch):
    out = tmp_path / "out"
    opened = []
    real_open = FileSystems.open

    def open_(path, *args, **kwargs):
        opened.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(FileSystems, "open", open_)
    assert convert(tree, out, "--image_size=16", "--num_shards=train=3,validation=3", "--index_files") == 0
    monkeypatch.undo()
    shards = listed_shards(out)
    assert len(shards) == 6
    # Built while writing: no shard, in the run's folder or the output folder, was ever opened for reading.
    assert [p for p in opened if ".tfrecord" in p] == []
    assert len([p for p in opened if str(tree) in p]) >= 36  # the hook saw the images read: it watched the job
    for shard in shards:
        assert shard["index"] == index_name(shard["file"])
        rows = read_index(out / shard["index"])
        assert rows == framing_index(out / shard["file"])
        assert len(rows) == shard["records"] and sum(size for _, size in rows) == shard["bytes"]
    # Published with the shards: nothing left in the run's temporary folder, no other index.
    assert not (out / TEMP_DIR).exists()
    assert sorted(n for n in os.listdir(out) if n.endswith(".idx")) == sorted(s["index"] for s in shards)
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["options"]["index_files"] is True
    report = verify.verify_dataset(str(out), decode=False)
    assert report.problems == [] and report.index_files == 6


def test_without_the_option_no_index_is_written(tree, tmp_path):
    out = tmp_path / "out"
    assert convert(tree, out, "--image_size=16", "--num_shards=train=2,validation=2") == 0
    assert [n for n in os.listdir(out) if n.endswith(".idx")] == []
    assert all("index" not in shard for shard in listed_shards(out))
    assert json.loads((out / "image_tfrecords.json").read_text())["options"]["index_files"] is False


@pytest.mark.skipif(not HAS_TFRECORD, reason=NO_TFRECORD)
def test_the_tfrecord_package_reads_the_shards_with_their_index(tree, tmp_path):
    out = tmp_path / "out"
    # 2 shards per split: the tfrecord package cannot load the index of a one-record shard (vahidk/tfrecord#9).
    assert convert(tree, out, "--image_size=16", "--num_shards=train=2,validation=2", "--index_files") == 0
    for shard in listed_shards(out):
        theirs = tmp_path / f"theirs-{shard['index']}"
        read = subprocess.run([sys.executable, "-c", _TFRECORD_READ, str(out / shard["file"]),
                               str(out / shard["index"]), str(theirs), "3"],
                              capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=""))
        assert read.returncode == 0, read.stderr
        assert (out / shard["index"]).read_text() == theirs.read_text()  # the package's own indexer agrees
        result = json.loads(read.stdout)
        assert len(result["whole"]) == shard["records"]
        # Each worker of n reads its own part, found through the index; together they are the shard, in order.
        for n in ("1", "2", "3"):
            assert result["parts"][n] == result["whole"]


def test_index_files_refuse_gzip_in_one_line(tree, tmp_path):
    result = run_tool("pipeline.main", f"--input_dir={tree}", f"--output_dir={tmp_path / 'out'}",
                      "--compression=gzip", "--index_files")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "error: --index_files needs uncompressed shards, but --compression=gzip: an index holds byte offsets into "
        "the uncompressed file; drop one of the two options"]
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_reruns_replace_stale_indexes_and_keep_a_users_files(tree, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    # An index of no dataset (no image_tfrecords.json: another tool's, or an older version's), and the user's own
    # files. The first is never deleted: it stops the run until it is moved away.
    (out / "train-00007-of-00009.idx").write_text("0 10\n")
    user = {"train-notes.idx": "mine", "my-train-00000-of-00001.idx": "another tool's", "train.idx": "mine too"}
    for name, text in user.items():
        (out / name).write_text(text)
    with pytest.raises(UserError, match=r"but 1 file\(s\) named as this run names its own \(train-00007-of-00009"):
        convert(tree, out, "--image_size=16", "--num_shards=train=3,validation=3", "--index_files")
    assert (out / "train-00007-of-00009.idx").read_text() == "0 10\n"
    (out / "train-00007-of-00009.idx").unlink()
    assert convert(tree, out, "--image_size=16", "--num_shards=train=3,validation=3", "--index_files") == 0
    indexes = lambda: sorted(n for n in os.listdir(out) if re.fullmatch(r"\w+-\d{5}-of-\d{5}\.idx", n))  # noqa: E731
    assert indexes() == sorted(s["index"] for s in listed_shards(out))

    assert convert(tree, out, "--image_size=16", "--num_shards=train=2,validation=2", "--index_files",
                   "--overwrite") == 0
    assert indexes() == sorted(s["index"] for s in listed_shards(out))
    assert all(n.endswith("-of-00002.idx") for n in indexes())
    assert verify.verify_dataset(str(out), decode=False).problems == []

    assert convert(tree, out, "--image_size=16", "--num_shards=train=2,validation=2", "--overwrite") == 0
    assert indexes() == []  # the new dataset has none: the old ones would be stale
    assert {name: (out / name).read_text() for name in user} == user


def test_index_files_on_gcs(gcs_emulator, tree, tmp_path):
    """gs:// output: the indexes go through the run's temporary folder and are published beside the shards."""
    from tests.gcs_fixtures import NO_AUTH

    bucket = gcs_emulator.create_bucket("index-files")
    out = f"{bucket}/tfrecords"
    assert convert(tree, out, NO_AUTH, "--image_size=16", "--num_shards=train=2,validation=2", "--index_files") == 0
    info = json.loads(gcs_emulator.read(f"{out}/image_tfrecords.json"))
    shards = [shard for split in info["splits"].values() for shard in split["shards"]]
    names = gcs_emulator.list_names(out)
    assert sorted(n for n in names if n.endswith(".idx")) == sorted(s["index"] for s in shards)
    assert not any(n.startswith(TEMP_DIR) for n in names)
    for shard in shards:
        (tmp_path / "shard").write_bytes(gcs_emulator.read(f"{out}/{shard['file']}"))
        (tmp_path / "index").write_bytes(gcs_emulator.read(f"{out}/{shard['index']}"))
        assert read_index(tmp_path / "index") == framing_index(tmp_path / "shard")
    assert verify.verify_dataset(out, decode=False).problems == []


# --- verify -------------------------------------------------------------------------------------------------


@pytest.fixture()
def indexed(tree, tmp_path):
    out = tmp_path / "out"
    assert convert(tree, out, "--image_size=16", "--num_shards=train=2,validation=2", "--index_files") == 0
    return out


def verify_lines(out, capsys) -> tuple[int, list[str]]:
    code = main_of(verify.run, [str(out), "--no_decode"])
    return code, [line for line in capsys.readouterr().out.splitlines() if line.startswith("problem: ")]


def test_verify_catches_a_wrong_index(indexed, capsys):
    index = indexed / "train-00000-of-00002.idx"
    rows = read_index(index)
    offset, size = rows[1]
    index.write_text(index_text([s for _, s in rows[:1]] + [size + 1] + [s for _, s in rows[2:]]))
    code, problems = verify_lines(indexed, capsys)
    assert code == 1
    assert problems == [
        f"problem: train-00000-of-00002.idx line 2: '{offset} {size + 1}', but record 1 of "
        f"train-00000-of-00002.tfrecord is at byte {offset} and {size} bytes long: a wrong or stale index; convert "
        "again with --index_files (or rebuild it with tfrecord2idx)"]


def test_verify_catches_a_stale_index_of_another_shard(indexed, capsys):
    # The index of the other train shard (another run's, say), under this shard's name.
    (indexed / "train-00000-of-00002.idx").write_text((indexed / "train-00001-of-00002.idx").read_text() + "0 1\n")
    code, problems = verify_lines(indexed, capsys)
    assert code == 1 and len(problems) == 1
    assert problems[0].startswith("problem: train-00000-of-00002.idx")
    assert "a wrong or stale index" in problems[0]


def test_verify_catches_a_short_or_missing_index(indexed, capsys):
    rows = read_index(indexed / "validation-00001-of-00002.idx")
    (indexed / "validation-00001-of-00002.idx").write_text(index_text([s for _, s in rows[:-1]]))
    os.remove(indexed / "train-00001-of-00002.idx")
    code, problems = verify_lines(indexed, capsys)
    assert code == 1
    records = len(rows)
    assert problems == [
        "problem: train-00001-of-00002.idx: listed in image_tfrecords.json as the index of "
        "train-00001-of-00002.tfrecord "
        "but missing; convert again with --index_files (or rebuild it with tfrecord2idx)",
        f"problem: validation-00001-of-00002.idx: {records - 1} lines, but validation-00001-of-00002.tfrecord holds "
        f"{records} records: a wrong or stale index; convert again with --index_files (or rebuild it with "
        "tfrecord2idx)"]


def test_verify_catches_an_index_whose_shard_is_not_in_the_dataset(indexed, capsys):
    (indexed / "train-00002-of-00003.idx").write_text("0 100\n")
    (indexed / "my-notes.idx").write_text("not this tool's name: not its business")
    code, problems = verify_lines(indexed, capsys)
    assert code == 1
    assert problems == ["problem: train-00002-of-00003.idx: an index file, but its shard is not in "
                        "image_tfrecords.json "
                        "(a stale index from another run?): remove it"]


def test_verify_checks_a_users_own_index_of_a_shard(tree, tmp_path, capsys):
    """A dataset converted without --index_files, indexed afterwards by hand: right passes, wrong is a problem."""
    out = tmp_path / "out"
    assert convert(tree, out, "--image_size=16", "--num_shards=train=2,validation=2") == 0
    rows = framing_index(out / "train-00000-of-00002.tfrecord")
    (out / "train-00000-of-00002.idx").write_text(index_text([s for _, s in rows]))
    assert verify_lines(out, capsys) == (0, [])
    (out / "train-00000-of-00002.idx").write_text(index_text([s for _, s in rows][::-1]))
    code, problems = verify_lines(out, capsys)
    assert code == 1 and len(problems) == 1 and "a wrong or stale index" in problems[0]


def test_a_malformed_index_entry_in_dataset_info_is_a_dataset_error(indexed):
    from transforms.base.dataset_format import DescriptionError, check_description

    info = json.loads((indexed / "image_tfrecords.json").read_text())
    info["splits"]["train"]["shards"][0]["index"] = "../elsewhere.idx"
    with pytest.raises(DescriptionError, match=r"splits.train.shards\[0\].index '../elsewhere.idx' is not a file "):
        check_description(info)
    info["splits"]["train"]["shards"][0]["index"] = 3
    with pytest.raises(DescriptionError, match=r"splits.train.shards\[0\].index is 3, not a string"):
        check_description(info)


# --- the README's examples ----------------------------------------------------------------------------------


def readme_block(marker: str) -> str:
    return doc_example("docs/dali-pytorch.md", marker)


def test_readme_dali_example_names_every_shard_with_its_index(indexed, monkeypatch):
    """DALI needs a GPU build: a stand-in of `nvidia.dali` records what the README's pipeline asks its reader for."""
    calls = []
    dali = types.ModuleType("nvidia.dali")
    dali.fn = types.SimpleNamespace(
        readers=types.SimpleNamespace(tfrecord=lambda **kwargs: calls.append(kwargs) or {"image": 0, "label": 0}),
        decoders=types.SimpleNamespace(image=lambda data, **kwargs: data))
    dali.types = types.SimpleNamespace(RGB="RGB")
    dali.pipeline_def = lambda **kwargs: (lambda f: f)
    tfrec = types.ModuleType("nvidia.dali.tfrecord")
    tfrec.FixedLenFeature = lambda shape, dtype, default: (tuple(shape), dtype, default)
    tfrec.string, tfrec.int64 = "string", "int64"
    monkeypatch.setitem(__import__("sys").modules, "nvidia", types.ModuleType("nvidia"))
    monkeypatch.setitem(__import__("sys").modules, "nvidia.dali", dali)
    monkeypatch.setitem(__import__("sys").modules, "nvidia.dali.tfrecord", tfrec)
    dali.tfrecord = tfrec
    monkeypatch.chdir(indexed.parent)
    os.rename(indexed, indexed.parent / "tfrecords")
    namespace: dict = {}
    exec(compile(readme_block("fn.readers.tfrecord"), "README.md", "exec"), namespace)
    namespace["train_pipeline"]()
    (call,) = calls
    shards = [s for s in json.loads(open("tfrecords/image_tfrecords.json").read())["splits"]["train"]["shards"]]
    assert call["path"] == [f"tfrecords/{s['file']}" for s in shards]
    assert call["index_path"] == [f"tfrecords/{s['index']}" for s in shards]
    for path, index in zip(call["path"], call["index_path"], strict=True):
        assert read_index(index) == framing_index(path)
    assert set(call["features"]) == {"image", "label"}


@pytest.mark.skipif(not HAS_TFRECORD, reason=NO_TFRECORD)
def test_readme_tfrecord_package_example_reads_every_record(indexed, monkeypatch):
    monkeypatch.chdir(indexed.parent)
    os.rename(indexed, indexed.parent / "tfrecords")
    # In a process of its own, as a PyTorch job runs it (see HAS_TFRECORD).
    code = readme_block("tfrecord_loader") + "\nimport json\nprint(json.dumps([int(r['label'][0]) for r in records]))\n"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=""))
    assert run.returncode == 0, run.stderr
    info = json.loads(open("tfrecords/image_tfrecords.json").read())
    labels = sorted(json.loads(run.stdout.strip().splitlines()[-1]))
    assert len(labels) == info["splits"]["train"]["records"]
    counts = {name: labels.count(i) for i, name in enumerate(info["class_names"]) if labels.count(i)}
    assert counts == info["splits"]["train"]["class_counts"]
