"""Shards converted in chunks on any worker and assembled from their pieces (transforms/output/write.py, concat.py).

A shard made of many chunks must be the same bytes as the same shard written
in one piece (and as the records framed one after another, which is what a
shard written in one place holds); gzip shards of several members and index
files must read back; a chunk converted twice must leave one correct shard;
on GCS the pieces are composed server-side, in a tree past 32.
"""

from __future__ import annotations

import fnmatch

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from tests import image_cases as cases
from tests.chunk_helpers import outcomes_of
from tests.pipelines import TestPipeline
from transforms.base.examples import Example
from transforms.base.records import ImageRef
from transforms.base.tfrecord import frame_record, iter_records, record_offsets
from transforms.images.settings import ImageSettings
from transforms.labels.sharding import rank_order
from transforms.output.concat import MAX_COMPOSE, concatenate
from transforms.output.write import (
    ChunkKey,
    WriteShards,
    assemble,
    attempt_name,
    chosen_pieces,
    cut_chunks,
    index_name,
    index_text,
    write_piece,
)

SETTINGS = ImageSettings(width=8, height=8)
_RESULTS: dict = {}


def _collect(element, key):
    _RESULTS.setdefault(key, []).append(element)


def refs_in(folder, count: int, bad: tuple = ()) -> list[ImageRef]:
    """`count` small PNGs (the indexes in `bad` are not images), with shuffle keys out of path order."""
    folder.mkdir(parents=True, exist_ok=True)
    image = cases.encode(cases.quadrants(40, 30), "PNG")
    refs = []
    for i in range(count):
        path = folder / f"{i:03d}.png"
        path.write_bytes(image if i not in bad else b"not an image")
        refs.append(ImageRef(str(path), f"c/{i:03d}.png", 10, "train", "c", i % 3, ((i * 7919) % count) << 40))
    return refs


def write_shards(refs, output, chunk_images, shards=1, compression="none", index_files=False, run="run1"):
    """WriteShards on TestPipeline; returns (ShardInfos, rejected relpaths, written tallies, hashes)."""
    _RESULTS.clear()
    placed = [((ref.split, i % shards, shards), ref) for i, ref in enumerate(refs)]
    with TestPipeline() as p:
        out = p | beam.Create(placed) | WriteShards(str(output), run, SETTINGS, "default", 2, compression,
                                                     index_files, chunk_images=chunk_images)
        _ = out.shards | "Shards" >> beam.Map(_collect, "shards")
        _ = out["rejected"] | "Rejected" >> beam.Map(lambda r: _collect(r.relpath, "rejected"))
        _ = out["written"] | "Written" >> beam.CombinePerKey(sum) | beam.Map(_collect, "written")
        _ = out["hashes"] | "Hashes" >> beam.Map(_collect, "hashes")
        assert_that(out["stats"] | beam.Map(lambda kv: (kv[0], kv[1].images)), equal_to(_expected_stats(refs, shards)),
                    label="stats")
    # Each shard's file has its attempt's name (`shard_path`): the ShardInfos compared without it.
    return (sorted(info._replace(temp="") for info in _RESULTS.get("shards", [])), sorted(_RESULTS.get("rejected", [])),
            sorted(_RESULTS.get("written", [])), sorted(_RESULTS.get("hashes", [])))


def shard_path(output, info, run="run1"):
    """The file of shard `info` in the run's shards folder: its one attempt's (train-00000-of-00001-<id>.tfrecord)."""
    (path,) = shards_folder(output, run).glob(attempt_name(info.file, "*"))
    return path


def _expected_stats(refs, shards):
    """One STATS element per shard holding an image (the images that are real PNGs)."""
    counts = {}
    for i, ref in enumerate(refs):
        if open(ref.path, "rb").read(4) == b"\x89PNG":
            counts[i % shards] = counts.get(i % shards, 0) + 1
    return [("train", n) for _, n in sorted(counts.items())]


def shards_folder(output, run="run1"):
    return output / ".image-tfrecords-tmp" / run / "shards"


def paths_of(records) -> list[str]:
    return [Example.FromString(r).features.feature["source_path"].bytes_list.value[0].decode() for r in records]


# -- cutting a shard into chunks -------------------------------------------------------------------------------------


def test_a_shard_is_cut_into_even_chunks_in_rank_order():
    refs = [ImageRef(f"/x/{i}", f"c/{i}", 10, "train", "c", 0, (i * 37) % 150 << 30) for i in range(150)]
    chunks = list(cut_chunks((("train", 2, 5), refs), max_images=64))
    assert [key for key, _ in chunks] == [("train", 2, 5, i, 3) for i in range(3)]
    assert [len(part) for _, part in chunks] == [50, 50, 50]
    assert [ref for _, part in chunks for ref in part] == sorted(refs, key=rank_order)
    # in any input order the same chunks
    assert list(cut_chunks((("train", 2, 5), refs[::-1]), max_images=64)) == chunks


def test_large_source_files_make_more_chunks_and_array_record_shards_stay_whole():
    refs = [ImageRef(f"/x/{i}", f"c/{i}", 30_000_000, "train", "c", 0, i) for i in range(10)]
    assert [len(part) for _, part in cut_chunks((("train", 0, 1), refs), max_images=64)] == [2] * 5  # 64 MB each
    assert [len(part) for _, part in cut_chunks((("train", 0, 1), refs), "array_record", max_images=2)] == [10]


# -- the composite: several chunks give the bytes of one piece ------------------------------------------------------


@pytest.mark.timeout(300)
def test_a_shard_of_many_chunks_is_byte_identical_to_the_shard_written_in_one_piece(tmp_path):
    refs = refs_in(tmp_path / "in", 23, bad=(4, 17))
    many = write_shards(refs, tmp_path / "many", chunk_images=3, shards=2, index_files=True)
    one = write_shards(refs, tmp_path / "one", chunk_images=64, shards=2, index_files=True)
    assert many == one  # the same ShardInfos, rejections, tallies and hashes
    infos, rejected, written, hashes = many
    assert rejected == ["c/004.png", "c/017.png"]
    assert sum(n for _, n in written) == 21 == sum(info.records for info in infos) == len(hashes)
    for info in infos:
        data = shard_path(tmp_path / "many", info).read_bytes()
        assert data == shard_path(tmp_path / "one", info).read_bytes(), info.file
        # what a shard written in one place holds: its records in rank order, framed one after another
        shard = int(info.file[6:11])
        mine = sorted((r for i, r in enumerate(refs) if i % 2 == shard and i not in (4, 17)), key=rank_order)
        records = list(iter_records(str(shard_path(tmp_path / "many", info))))
        assert paths_of(records) == [r.relpath for r in mine]
        assert data == b"".join(frame_record(r) for r in records) and info.bytes == len(data)
        offsets = record_offsets(str(shard_path(tmp_path / "many", info)))
        index = (shards_folder(tmp_path / "many") / index_name(shard_path(tmp_path / "many", info).name)).read_text()
        assert index == index_text([b - a for a, b in zip(offsets, offsets[1:], strict=False)])
    assert not list((shards_folder(tmp_path / "many") / "pieces").iterdir())


@pytest.mark.timeout(300)
def test_a_gzip_shard_of_several_members_reads_back_with_tf_data_and_beam(tmp_path):
    tf = pytest.importorskip("tensorflow")
    refs = refs_in(tmp_path / "in", 10)
    infos, _, _, _ = write_shards(refs, tmp_path / "out", chunk_images=3, compression="gzip")
    (info,) = infos
    path = shard_path(tmp_path / "out", info)
    assert path.read_bytes().count(b"\x1f\x8b\x08") >= 4  # one gzip member per chunk: 4 chunks
    read = [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression_type="GZIP")]
    assert paths_of(read) == [r.relpath for r in sorted(refs, key=rank_order)]
    assert list(iter_records(str(path))) == read  # Beam's reader (the verify tool's) reads every member too
    assert info.records == 10 and info.bytes == path.stat().st_size


# -- a chunk converted twice ------------------------------------------------------------------------------------------


def test_a_chunk_converted_twice_leaves_one_correct_shard(tmp_path):
    refs = [ImageRef(f"/x/{i}", f"c/{i}", 10, "train", "c", 0, i) for i in range(6)]
    records = [f"record {i}".encode() * (i + 1) for i in range(6)]
    folder = str(tmp_path / "shards")
    keys = [ChunkKey("train", 0, 1, chunk, 3) for chunk in range(3)]
    pieces = [write_piece(folder, key, outcomes_of(refs[2 * c:2 * c + 2], records[2 * c:2 * c + 2]), "none")
              for c, key in enumerate(keys)]
    # chunk 1 again, as a retried or a second attempt would: another piece file, the same records
    again = write_piece(folder, keys[1], outcomes_of(refs[2:4], records[2:4]), "none")
    assert again.file != pieces[1].file and again.sizes == pieces[1].sizes
    chosen = chosen_pieces([pieces[2], again, pieces[0], pieces[1]])
    assert [p.chunk for p in chosen] == [0, 1, 2] and chosen == chosen_pieces([pieces[1], pieces[0], again,
                                                                               pieces[2]])
    name, size = assemble(folder, "train-00000-of-00001.tfrecord", chosen, attempt="a1")
    assert name == "train-00000-of-00001-a1.tfrecord"
    shard = tmp_path / "shards" / name
    assert list(iter_records(str(shard))) == records and size == shard.stat().st_size
    # the attempt not chosen stays in the pieces folder, removed with the run's temporary folder
    assert len(list((tmp_path / "shards" / "pieces").iterdir())) == 1
    # a retry of the assembly (another attempt) after its pieces went finds the earlier attempt's shard whole
    assert assemble(folder, "train-00000-of-00001.tfrecord", chosen, attempt="b2") == (name, size)
    assert not (tmp_path / "shards" / "train-00000-of-00001-b2.tfrecord").exists()
    with pytest.raises(RuntimeError, match=r"chunks \[1\] of 3 never arrived"):
        chosen_pieces([pieces[0], pieces[2]])


# -- GCS: composed server-side ---------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_pieces_on_gcs_are_composed_server_side_in_a_tree_past_32(gcs_emulator, monkeypatch):
    from tests.fault_proxy import COMPOSE, DOWNLOAD, FaultProxy

    bucket = gcs_emulator.create_bucket("compose-tree")
    count = MAX_COMPOSE * 2 + 3  # three composes of 32, 32 and 3, then one of the three
    parts = [f"piece {i:03d} ".encode() * (i + 1) for i in range(count)]
    sources = [gcs_emulator.write(f"{bucket}/run/pieces/p{i:03d}", data) for i, data in enumerate(parts)]
    with FaultProxy(gcs_emulator.host) as proxy, monkeypatch.context() as patched:
        patched.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        size = concatenate(sources, f"{bucket}/run/train-00000-of-00001.tfrecord", sum(map(len, parts)))
        traffic = proxy.reset_traffic()
    assert gcs_emulator.read(f"{bucket}/run/train-00000-of-00001.tfrecord") == b"".join(parts)
    assert size == sum(map(len, parts))
    assert sum(n for (kind, _), n in traffic.calls.items() if kind == COMPOSE) == 4
    assert not [name for (kind, name) in traffic.calls if kind == DOWNLOAD]  # nothing read back
    assert sum(traffic.uploaded.values()) == 0  # nor uploaded again
    # the intermediate objects are gone; the pieces stay for the caller to remove
    assert sorted(gcs_emulator.list_names(f"{bucket}/run")) == sorted(
        [f"pieces/p{i:03d}" for i in range(count)] + ["train-00000-of-00001.tfrecord"])


@pytest.mark.timeout(300)
def test_write_shards_on_gcs_gives_the_local_bytes(gcs_emulator, tmp_path):
    refs = refs_in(tmp_path / "in", 9, bad=(5,))
    local = write_shards(refs, tmp_path / "local", chunk_images=2)
    bucket = gcs_emulator.create_bucket("compose-shards")
    remote = write_shards(refs, f"{bucket}/out", chunk_images=2)
    assert remote == local
    (info,) = local[0]
    (name,) = gcs_emulator.list_names(f"{bucket}/out/.image-tfrecords-tmp/run1/shards")  # the pieces went
    assert fnmatch.fnmatch(name, attempt_name(info.file, "*"))
    assert gcs_emulator.read(f"{bucket}/out/.image-tfrecords-tmp/run1/shards/{name}") == (
        shard_path(tmp_path / "local", info).read_bytes())
