"""AssignShards and WriteShards: exact balance, the same shards on every run, each shard written once."""

from __future__ import annotations

import gzip
import random
import re
import struct

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from tests import image_cases as cases
from tests.pipelines import TestPipeline
from transforms.base.examples import Example
from transforms.base.records import ImageRef
from transforms.base.tfrecord import frame_record, iter_records, masked_crc, record_offsets
from transforms.images.settings import ImageSettings
from transforms.labels.sharding import BUCKETS, AssignShards, ShardKey, ShardSizing, bucket_of, lay_out, rank_order
from transforms.output.write import ShardInfo, WriteShards, index_name, index_text


def frame(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc(header)) + data + struct.pack("<I", masked_crc(data))


def write_piece(path, records: list[bytes]) -> str:
    path.write_bytes(b"".join(frame(r) for r in records))
    return str(path)


def test_frame_record_is_tfrecord_framing_that_reads_back(tmp_path):
    records = [b"", b"a", bytes(range(256)) * 40]
    assert all(frame_record(r) == frame(r) for r in records)
    path = tmp_path / "r.tfrecord"
    path.write_bytes(b"".join(frame_record(r) for r in records))
    assert list(iter_records(str(path))) == records
    assert record_offsets(str(path)) == [0, 16, 33, 33 + 16 + 10240]


def test_index_text_is_offset_and_length_per_record():
    assert index_text([16, 17, 100]) == "0 16\n16 17\n33 100\n"
    assert index_text([]) == ""


def refs_with_keys(keys, split="train") -> list[ImageRef]:
    return [ImageRef(f"/in/c/{i}.jpg", f"c/{i}.jpg", 100 + i, split, "c", 0, key) for i, key in enumerate(keys)]


def sizing(**explicit) -> ShardSizing:
    return ShardSizing(explicit, shard_size_mb=1, bytes_per_image=1000.0)


def expected_shards(refs: list[ImageRef], count: int) -> dict:
    """The reference answer: sort the whole split, cut rank k*T/N."""
    ordered = sorted(refs, key=rank_order)
    return {ref.relpath: rank * count // len(ordered) for rank, ref in enumerate(ordered)}


_COLLECTED: dict[str, list] = {}  # filled by the pipeline's steps, which run in this process (the DirectRunner)


def _collect(element, into: str):
    _COLLECTED.setdefault(into, []).append(element)


def collected(into: str) -> list:
    return _COLLECTED.pop(into, [])


def assert_assigned(refs, assign_sizing, expected: dict[str, tuple]) -> None:
    """AssignShards of `refs` in a TestPipeline gives each image once, in the shard `expected` names for its
    relpath: (split, index, count)."""
    with TestPipeline() as p:
        placed = p | beam.Create(refs) | AssignShards(assign_sizing)
        assert_that(placed | beam.MapTuple(lambda key, ref: (ref.relpath, tuple(key))),
                    equal_to(list(expected.items())))


def clustered_keys(count: int, buckets: int, seed: int) -> list[int]:
    """Keys crowded into a few buckets, so that buckets straddle shard boundaries and need exact ranks."""
    rng = random.Random(seed)
    chosen = rng.sample(range(BUCKETS), buckets)
    return [(rng.choice(chosen) << 48) | rng.getrandbits(48) for _ in range(count)]


@pytest.mark.parametrize("count, shards, keys", [
    (1000, 7, "uniform"), (1000, 7, "clustered"), (5, 5, "uniform"), (13, 4, "clustered"), (300, 1, "uniform"),
    (64, 64, "clustered"),
])
def test_assign_shards_balances_to_one_image_and_matches_a_full_sort(count, shards, keys):
    rng = random.Random(count * shards)
    key_list = [rng.getrandbits(64) for _ in range(count)] if keys == "uniform" else clustered_keys(count, 3, count)
    key_list[1] = key_list[0]  # a tie in the key is broken by the path
    refs = refs_with_keys(key_list)
    expected = expected_shards(refs, shards)
    sizes = [sum(1 for shard in expected.values() if shard == k) for k in range(shards)]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1  # the reference answer is balanced to one image
    assert_assigned(refs, sizing(train=shards),
                    {relpath: ("train", shard, shards) for relpath, shard in expected.items()})


def test_assign_shards_sizes_each_split_on_its_own_total_and_never_makes_more_shards_than_images():
    refs = refs_with_keys([random.Random(1).getrandbits(64) for _ in range(40)], "train")
    refs += refs_with_keys([random.Random(2).getrandbits(64) for _ in range(3)], "validation")
    refs = [r._replace(relpath=f"{r.split}/{r.relpath}") for r in refs]
    # train: 40 images of 0.1 MB at 1 MB a shard -> 4 shards; validation: 8 asked, 3 images -> 3 shards
    expected = {}
    for split, count in (("train", 4), ("validation", 3)):
        in_split = [r for r in refs if r.split == split]
        expected.update({relpath: (split, shard, count) for relpath, shard in expected_shards(in_split, count).items()})
    assert_assigned(refs, ShardSizing({"validation": 8}, shard_size_mb=1, bytes_per_image=0.1e6), expected)


def test_the_train_split_gets_at_least_8_shards_of_10_mb_for_parallel_reads():
    sizing = ShardSizing({}, shard_size_mb=150, bytes_per_image=1e6)  # 1 MB a record
    assert sizing.shard_count("train", 100, 0) == 8  # 100 MB: 8 shards of 12.5 MB, not 1 of 100 MB
    assert sizing.shard_count("train", 35, 0) == 3  # 35 MB: as many 10 MB shards as fit
    assert sizing.shard_count("train", 9, 0) == 1
    assert sizing.shard_count("train", 3000, 0) == 20  # 3 GB: sized by --shard_size_mb alone
    assert sizing.shard_count("validation", 100, 0) == 1  # evaluation reads are not the bottleneck
    assert ShardSizing({"train": 2}, 150, 1e6).shard_count("train", 100, 0) == 2  # --num_shards decides


def test_lay_out_sizes_shards_from_the_source_bytes_when_the_output_follows_them():
    counts = [(("train", 5), (10, 50_000_000)), (("train", 9), (10, 50_000_000))]
    layout = lay_out(counts, ShardSizing({}, shard_size_mb=10, bytes_per_image=1.0, bytes_per_source_byte=0.5))
    assert layout["train"].images == 20 and layout["train"].shards == 5  # 100 MB of files -> 50 MB of records
    assert layout["train"].starts[5] == 0 and layout["train"].starts[6] == 10 and layout["train"].starts[-1] == 20


def test_lay_out_of_every_bucket_of_two_splits():
    """At scale every bucket has a count (a large dataset's layout is one step on one worker, made in C)."""
    counts = [((split, bucket), (1 + bucket % 3, 10)) for split in ("train", "validation") for bucket in range(BUCKETS)]
    layout = lay_out(counts, ShardSizing({"train": 7, "validation": 2}, 150, 1e6))
    expected = [0]
    for bucket in range(BUCKETS):
        expected.append(expected[-1] + 1 + bucket % 3)
    for split, shards in (("train", 7), ("validation", 2)):
        assert list(layout[split].starts) == expected
        assert layout[split].images == expected[-1] and layout[split].shards == shards


def test_the_same_images_in_any_order_give_the_same_shards():
    refs = refs_with_keys(clustered_keys(500, 4, 7))
    expected = {relpath: ("train", shard, 6) for relpath, shard in expected_shards(refs, 6).items()}
    shuffled = list(refs)
    random.Random(3).shuffle(shuffled)
    for order in (refs, shuffled):  # both give the reference answer
        assert_assigned(order, sizing(train=6), expected)


def test_bucket_of_is_the_top_bits_of_the_key():
    assert bucket_of(0) == 0 and bucket_of(2**64 - 1) == BUCKETS - 1 and bucket_of(1 << 48) == 1


def parse(serialized: bytes) -> tuple[str, int]:
    feature = Example.FromString(serialized).features.feature
    return feature["source_path"].bytes_list.value[0].decode(), feature["label"].int64_list.value[0]


@pytest.mark.parametrize("compression, index_files", [("none", True), ("gzip", False)])
def test_write_shards_converts_each_shard_in_rank_order_into_one_file(tmp_path, compression, index_files):
    image = cases.encode(cases.quadrants(40, 30), "PNG")
    refs = []
    for i in range(9):
        path = tmp_path / "in" / f"{i}.png"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(image if i != 4 else b"not an image")
        refs.append(ImageRef(str(path), f"c/{i}.png", 10, "train", "c", i % 3, (9 - i) << 50))
    shard_of = {ref.relpath: (0 if i < 5 else 1) for i, ref in enumerate(refs)}
    placed = [(tuple(ShardKey("train", shard_of[ref.relpath], 2)), ref) for ref in refs]
    output = tmp_path / "out"
    with TestPipeline() as p:
        out = p | beam.Create(placed) | WriteShards(str(output), "run1", ImageSettings(width=8, height=8),
                                                     "default", 2, compression, index_files)
        assert_that(out["rejected"] | beam.Map(lambda r: (r.relpath, r.reason)),
                    equal_to([("c/4.png", "not_an_image")]), label="rejected")
        assert_that(out["written"] | beam.CombinePerKey(sum),
                    equal_to([(("train", 0, False), 3), (("train", 1, False), 2), (("train", 2, False), 3)]),
                    label="written")
        _ = out.shards | beam.Map(_collect, "shards")
    infos = collected("shards")
    folder = output / ".image-tfrecords-tmp" / "run1" / "shards"
    suffix = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    assert sorted(i.file for i in infos) == [f"train-0000{k}-of-00002{suffix}" for k in (0, 1)]
    for info in infos:
        assert isinstance(info, ShardInfo)
        # its attempt's own file in the run's folder (train-00000-of-00002-<attempt>.tfrecord), published as info.file
        stem, _, suffix = info.file.partition(".")
        assert re.fullmatch(rf"{stem}-[0-9a-f]{{16}}\.{re.escape(suffix)}", info.temp)
        path = folder / info.temp
        records = [parse(r) for r in iter_records(str(path))]
        mine = sorted((r for r in refs if shard_of[r.relpath] == int(info.file[6:11]) and r.relpath != "c/4.png"),
                      key=rank_order)
        assert records == [(r.relpath, r.label) for r in mine]  # in rank order: the largest path first here
        assert info.records == len(mine) and info.bytes == path.stat().st_size
        if compression == "gzip":
            gzip.decompress(path.read_bytes())  # a valid gzip stream
        if index_files:
            offsets = record_offsets(str(path))
            sizes = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
            assert (folder / index_name(info.temp)).read_text() == index_text(sizes)
        else:
            assert info.index == ""
    assert sorted(p.name for p in folder.iterdir()) == sorted([i.temp for i in infos] + [
        index_name(i.temp) for i in infos if i.index] + ["pieces"])
    assert not list((folder / "pieces").iterdir())  # each piece went into its shard


def test_two_runs_give_the_same_shards_byte_for_byte_and_balanced_within_one_image(tmp_path):
    """Once in one process, once on two worker processes (other bundles): the same records in the same shards."""
    from pipeline.sample_data import generate_dataset
    from tests.conftest import cli, convert

    src = tmp_path / "in"
    generate_dataset(str(src), images_per_class=30, seed=5, min_side=20, max_side=40)
    args = ("--image_size=16", "--num_shards=train=7,validation=3", "--validation_split=0.25")
    assert convert(src, tmp_path / "a", *args) == 0
    run = cli("pipeline.main", f"--input_dir={src}", f"--output_dir={tmp_path / 'b'}", "--quiet", *args,
              "--direct_num_workers=2")
    assert run.returncode == 0, run.stderr
    shards = sorted(p.name for p in (tmp_path / "a").glob("*.tfrecord"))
    assert len(shards) == 10 and shards == sorted(p.name for p in (tmp_path / "b").glob("*.tfrecord"))
    for name in shards:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    import json

    info = json.loads((tmp_path / "a" / "image_tfrecords.json").read_text())
    for split in ("train", "validation"):
        counts = [s["records"] for s in info["splits"][split]["shards"]]
        assert max(counts) - min(counts) <= 1, (split, counts)
