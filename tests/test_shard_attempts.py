"""Attempt-unique shard files: two attempts at one shard write two files, the committed one is published, and a
shard whose file does not hold the bytes its ShardInfo reports stops the publishing before anything changes."""

from __future__ import annotations

import json
import os

import apache_beam as beam
import pytest

from tests.chunk_helpers import outcomes_of
from tests.pipelines import TestPipeline
from transforms.base.dataset_format import INFO_FILE
from transforms.base.records import ImageRef, Rejection
from transforms.base.tfrecord import iter_records
from transforms.images.convert import Converted
from transforms.output.describe import PublishDataset
from transforms.output.ownership import shards_dir
from transforms.output.publishing import ShardSizeMismatch, publish_dataset
from transforms.output.write import REJECTED, WRITTEN, ChunkKey, ShardInfo, _AssembleShard, write_piece

RUN = "run1"
KEY = ChunkKey("train", 0, 1, 0, 1)
REFS = [ImageRef(f"/x/{i}", f"c/{i}", 10, "train", "c", 0, i) for i in range(3)]
RECORDS = [f"record {i}".encode() * (i + 1) for i in range(3)]


def attempt(folder: str, reject_last: bool) -> dict:
    """One attempt at converting and assembling the shard: its ShardInfo, tallies and rejections."""
    outcomes = outcomes_of(REFS, RECORDS)
    if reject_last:  # as an attempt that gave an image up on --image_timeout_s would
        rejection = Rejection("c/2", "rejected", "timeout", "reading or decoding took over 1 s")
        outcomes[-1] = Converted(REFS[-1], None, False, rejection, outcomes[-1].sha256)
    piece = write_piece(folder, KEY, outcomes, "none")
    out = {"shards": [], WRITTEN: [], REJECTED: []}
    for element in _AssembleShard(folder, "none", False).process(((KEY.split, KEY.index, KEY.count), [piece])):
        if isinstance(element, beam.pvalue.TaggedOutput):
            out.setdefault(element.tag, []).append(element.value)
        else:
            out["shards"].append(element)
    return out


def describe(output_dir: str, committed: dict, shard: ShardInfo) -> None:
    with TestPipeline() as p:
        _ = {
            "written": p | "Written" >> beam.Create(committed[WRITTEN]),
            "rejections": p | "Rejections" >> beam.Create(committed[REJECTED]),
            "shards": p | "Shards" >> beam.Create([shard]),
            "found": p | "Found" >> beam.Create([len(REFS)]),
        } | PublishDataset(output_dir, RUN, ["c"], "default", {"compression": "none"}, {"fixed_size": False},
                            0.0, "0.1.0")


def test_two_attempts_write_two_files_and_the_committed_ones_is_published(tmp_path):
    folder = shards_dir(str(tmp_path), RUN)
    stale, committed = attempt(folder, reject_last=False), attempt(folder, reject_last=True)
    [stale_shard], [shard] = stale["shards"], committed["shards"]
    assert stale_shard.temp != shard.temp and stale_shard.file == shard.file == "train-00000-of-00001.tfrecord"
    assert (stale_shard.records, shard.records) == (3, 2)
    stale_bytes = (tmp_path / ".image-tfrecords-tmp" / RUN / "shards" / stale_shard.temp).read_bytes()
    assert len(stale_bytes) == stale_shard.bytes != shard.bytes  # both files are there, each with its own bytes

    describe(str(tmp_path), committed, shard)
    published = str(tmp_path / shard.file)
    assert list(iter_records(published)) == RECORDS[:2] and os.path.getsize(published) == shard.bytes
    info = json.loads((tmp_path / INFO_FILE).read_text())
    assert info["splits"]["train"]["shards"] == [{"file": shard.file, "records": 2, "bytes": shard.bytes}]
    assert info["files"] == {"found": 3, "written": 2, "rejected": 1, "skipped": 0, "upscaled": 0}


def test_a_shard_file_of_another_size_than_its_shard_info_publishes_nothing(tmp_path):
    folder = shards_dir(str(tmp_path), RUN)
    committed = attempt(folder, reject_last=True)
    [shard] = committed["shards"]
    (tmp_path / "notes.txt").write_text("the user's")
    with pytest.raises(Exception, match=rf"the shard file {shard.temp} in .* holds {shard.bytes} bytes, but its "
                                        rf"writer reported {shard.bytes + 1} bytes: nothing was published"):
        describe(str(tmp_path), committed, shard._replace(bytes=shard.bytes + 1))
    assert sorted(os.listdir(tmp_path)) == [".image-tfrecords-tmp", "notes.txt"]  # no shard, no description

    # The check itself: one clear error naming the first file, and how many more.
    with pytest.raises(ShardSizeMismatch, match=r"the shard file gone.tfrecord in .* is missing, but its writer "
                                                r"reported 5 bytes \(and 1 more shards differ\)"):
        publish_dataset(str(tmp_path), RUN, [shard.temp], {INFO_FILE: ["{}"]},
                        sizes={"gone.tfrecord": 5, shard.temp: 1})
    assert not (tmp_path / INFO_FILE).exists()


@pytest.mark.timeout(300)
def test_a_run_whose_shard_writer_misreports_a_size_stops_with_one_line_and_keeps_the_old_dataset(tmp_path,
                                                                                                  monkeypatch):
    from pipeline import verify
    from pipeline.errors import UserError
    from pipeline.launcher import run
    from pipeline.sample_data import generate_dataset
    from tests.conftest import FAST, convert
    from transforms.output import write

    generate_dataset(str(tmp_path / "in"), images_per_class=4, seed=3, min_side=32, max_side=48)
    out = tmp_path / "out"
    assert convert(tmp_path / "in", out, "--image_size=16", "--num_shards=2") == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    real = write.assemble

    def misreported(*args, **kwargs):  # a writer whose reported size is off by one byte
        name, size = real(*args, **kwargs)
        return name, size + 1

    monkeypatch.setattr(write, "assemble", misreported)
    with pytest.raises(UserError) as caught:
        run([f"--input_dir={tmp_path / 'in'}", f"--output_dir={out}", "--quiet", "--image_size=24",
             "--num_shards=2", "--overwrite", *FAST])
    message = str(caught.value)
    assert "\n" not in message and message.startswith("the shard file train-0000")
    assert "but its writer reported" in message and "nothing was published" in message
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # the old dataset, whole
    assert verify.verify_dataset(str(out), decode=True).problems == []
