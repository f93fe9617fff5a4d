"""Composite transforms, each in a TestPipeline with its outputs checked by assert_that: ListImages, AssignLabels,
ReadRows, ReadManifest, DropDuplicates, FindDuplicates, SummariseGroups, ConvertChunks, AssembleShards, WriteSources,
ReadSources, SkipPresent and RecordJobId. A transform with an input PCollection gets it from beam.Create; a root
transform (ListImages, ReadRows, ReadManifest, ReadSources, RecordJobId: PBegin in) reads small temporary files.
(AssignShards and WriteShards: tests/test_write.py; UniqueIds: tests/test_unlabeled.py; JoinMetadata:
tests/test_features.py; PublishDataset: tests/test_describe.py.)"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

from tests.pipelines import TestPipeline
from transforms.base.records import FileRef
from transforms.inputs.listing import FOUND, SKIPPED, ListImages
from transforms.labels.assign import UNLABELED, AssignLabels
from transforms.labels.layout import HIDDEN, NOT_AN_IMAGE_EXTENSION, UNKNOWN_CLASS


def test_list_images_gives_each_candidate_image_skips_the_rest_with_a_reason_and_counts_every_entry(tmp_path):
    """A root transform (PBegin -> FileRef): a TestPipeline over a small temporary folder, every output asserted."""
    files = {"cat/a.jpg": b"a" * 3, "cat/b.PNG": b"b" * 5, "dog/c.jpeg": b"c" * 7, "dog/.d.jpg": b"d",
             "dog/notes.txt": b"e"}
    for relpath, data in files.items():
        (tmp_path / relpath).parent.mkdir(exist_ok=True)
        (tmp_path / relpath).write_bytes(data)
    with TestPipeline() as p:
        listed = p | ListImages(str(tmp_path))
        assert_that(listed["images"], equal_to([FileRef(str(tmp_path / r), r, len(files[r]))
                                             for r in ("cat/a.jpg", "cat/b.PNG", "dog/c.jpeg")]), label="Images")
        assert_that(listed[SKIPPED] | beam.Map(lambda r: (r.relpath, r.stage, r.reason)),
                    equal_to([("dog/.d.jpg", "skipped", HIDDEN), ("dog/notes.txt", "skipped", NOT_AN_IMAGE_EXTENSION)]),
                    label="Skipped")
        # every file listed: the three images and the two skipped (found = written + rejected + skipped)
        assert_that(listed[FOUND] | beam.CombineGlobally(sum), equal_to([5]), label="Found")


def test_assign_labels_numbers_classes_in_the_given_order_and_sets_unknown_classes_aside():
    refs = [FileRef("/in/cat/a.jpg", "cat/a.jpg", 3), FileRef("/in/dog/b.jpg", "dog/b.jpg", 4),
            FileRef("/in/bird/c.jpg", "bird/c.jpg", 5)]
    with TestPipeline() as p:
        labeled = p | beam.Create(refs) | AssignLabels(["dog", "cat"], split_folders=False, seed=1,
                                                       validation_split=0.0, test_split=0.0)
        assert_that(labeled.images | beam.Map(lambda r: (r.relpath, r.size, r.split, r.class_name, r.label)),
                    equal_to([("cat/a.jpg", 3, "train", "cat", 1), ("dog/b.jpg", 4, "train", "dog", 0)]),
                    label="Images")
        assert_that(labeled[UNLABELED] | beam.Map(lambda r: (r.relpath, r.stage, r.reason)),
                    equal_to([("bird/c.jpg", "skipped", UNKNOWN_CLASS)]), label="Unlabeled")


# --- The manifest's reading and the reports' combines ---------------------------------------------------------


def test_read_rows_numbers_every_row_as_a_sequential_read_would_across_byte_ranges(tmp_path):
    """A root transform (PBegin -> RowFields): a TestPipeline over a small temporary file, every output asserted."""
    from transforms.inputs.rows import ROWS, SPANNING, ReadRows

    manifest = tmp_path / "list.csv"
    manifest.write_text('path,label\na.jpg,cat\n"b\nc.jpg",dog\nd.jpg,cat\ne.jpg,dog\n')
    with TestPipeline() as p:
        read = p | ReadRows(str(manifest), "csv", range_bytes=12)  # several ranges, one row cut by a range's end
        assert_that(read.fields | beam.Map(lambda r: (r.row, r.fields, r.line, r.lines)),
                    equal_to([(1, {"path": "a.jpg", "label": "cat"}, 2, 1),
                              (2, {"path": "b\nc.jpg", "label": "dog"}, 3, 2),
                              (3, {"path": "d.jpg", "label": "cat"}, 5, 1),
                              (4, {"path": "e.jpg", "label": "dog"}, 6, 1)]), label="Fields")
        assert_that(read[ROWS] | beam.CombineGlobally(sum), equal_to([4]), label="Rows")
        assert_that(read[SPANNING], equal_to([(2, 3, 2)]), label="Spanning")


def test_read_manifest_labels_usable_rows_finds_the_class_names_and_sets_bad_rows_aside(tmp_path):
    """A root transform (PBegin -> ImageRef): a TestPipeline over a small temporary manifest, its outputs
    asserted."""
    from transforms.inputs.manifest import (
        CLASS_NAMES,
        DUPLICATE_PATH,
        FOUND,
        MISSING_LABEL,
        SKIPPED,
        STATS,
        ReadManifest,
    )

    manifest = tmp_path / "list.csv"
    manifest.write_text("path,label,split\nb.jpg,dog,\na.jpg,cat,test\nc.jpg,,\na.jpg,dog,\n")
    with TestPipeline() as p:
        read = p | ReadManifest(str(manifest), "csv", str(tmp_path), None, seed=1, validation_split=0.0,
                                test_split=0.0, size=10)
        assert_that(read["images"] | beam.Map(lambda r: (r.path, r.relpath, r.size, r.split, r.class_name, r.label)),
                    equal_to([(str(tmp_path / "a.jpg"), "a.jpg", 10, "test", "cat", 0),
                              (str(tmp_path / "b.jpg"), "b.jpg", 10, "train", "dog", 1)]), label="Images")
        assert_that(read[SKIPPED] | beam.Map(lambda r: (r.relpath, r.stage, r.reason)),
                    equal_to([("c.jpg", "rejected", MISSING_LABEL), ("a.jpg", "rejected", DUPLICATE_PATH)]),
                    label="Skipped")
        assert_that(read[FOUND] | beam.CombineGlobally(sum), equal_to([4]), label="Found")
        assert_that(read[CLASS_NAMES], equal_to([["cat", "dog"]]), label="ClassNames")
        assert_that(read[STATS] | beam.Map(lambda s: s["spanning_rows"]), equal_to([0]), label="Stats")


def _image_ref(tmp_path, relpath: str, data: bytes, class_name: str, label: int, split: str = "train"):
    from transforms.base.records import ImageRef

    (tmp_path / relpath).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / relpath).write_bytes(data)
    return ImageRef(str(tmp_path / relpath), relpath, len(data), split, class_name, label, shuffle_key=0)


def test_drop_duplicates_keeps_the_first_path_of_each_copy_and_drops_the_rest_or_all_when_labels_conflict(tmp_path):
    import hashlib

    from transforms.inputs.duplicates import DROPPED, DUPLICATE, DUPLICATE_CONFLICT, HASHES, DropDuplicates

    refs = [_image_ref(tmp_path, "cat/a.jpg", b"same", "cat", 0), _image_ref(tmp_path, "cat/b.jpg", b"same", "cat", 0),
            _image_ref(tmp_path, "cat/c.jpg", b"both", "cat", 0), _image_ref(tmp_path, "dog/d.jpg", b"both", "dog", 1),
            _image_ref(tmp_path, "dog/e.jpg", b"alone", "dog", 1),
            _image_ref(tmp_path, "dog/big.jpg", b"x" * 20, "dog", 1)]  # larger than the bound: not hashed, kept
    digest = {data: hashlib.sha256(data).hexdigest() for data in (b"same", b"both", b"alone")}
    with TestPipeline() as p:
        result = p | beam.Create(refs) | DropDuplicates(max_file_bytes=10)
        assert_that(result["kept"] | beam.Map(lambda r: r.relpath), equal_to(["cat/a.jpg", "dog/e.jpg", "dog/big.jpg"]),
                    label="Kept")
        assert_that(result[DROPPED] | beam.Map(lambda r: (r.relpath, r.stage, r.reason)),
                    equal_to([("cat/b.jpg", "rejected", DUPLICATE), ("cat/c.jpg", "rejected", DUPLICATE_CONFLICT),
                              ("dog/d.jpg", "rejected", DUPLICATE_CONFLICT)]), label="Dropped")
        assert_that(result[HASHES], equal_to([
            (digest[b"same"], ("train", 0, "cat/a.jpg")), (digest[b"same"], ("train", 0, "cat/b.jpg")),
            (digest[b"both"], ("train", 0, "cat/c.jpg")), (digest[b"both"], ("train", 1, "dog/d.jpg")),
            (digest[b"alone"], ("train", 1, "dog/e.jpg"))]), label="Hashes")


def test_find_duplicates_counts_each_kind_of_group_and_lists_the_largest_groups_first_then_by_first_path():
    from transforms.base.duplicate_kinds import ACROSS_SPLITS, CONFLICTING_LABELS, WITHIN_SPLIT
    from transforms.inputs.duplicates import FindDuplicates

    hashes = [("h1", ("train", 0, "cat/b.jpg")), ("h1", ("train", 0, "cat/a.jpg")),
              ("h2", ("train", 0, "cat/c.jpg")), ("h2", ("validation", 0, "cat/d.jpg")),
              ("h3", ("train", 0, "cat/e.jpg")), ("h3", ("train", 1, "dog/f.jpg")), ("h3", ("test", 1, "dog/g.jpg")),
              ("h4", ("train", 1, "dog/alone.jpg"))]  # one copy: not a duplicate
    with TestPipeline() as p:
        found = p | beam.Create(hashes) | FindDuplicates()
        assert_that(found | beam.Map(lambda s: ({k: v for k, v in s.items() if k != "examples"},
                                                [(rank, group.sha256) for rank, group in s["examples"]])),
                    equal_to([({"groups": 3, "copies": 7, WITHIN_SPLIT: 1, ACROSS_SPLITS: 1, CONFLICTING_LABELS: 1},
                               [((-3, "cat/e.jpg"), "h3"), ((-2, "cat/a.jpg"), "h1"), ((-2, "cat/c.jpg"), "h2")])]))


def test_summarise_groups_counts_groups_ungrouped_images_and_the_groups_found_in_several_splits():
    from transforms.labels.groups import SummariseGroups

    placed = [("p1", "train", "a/1.jpg"), ("p1", "train", "a/2.jpg"), ("p2", "train", "b/1.jpg"),
              ("p2", "validation", "b/2.jpg"), ("", "test", "c/z.jpg"), ("", "train", "c/y.jpg")]
    with TestPipeline() as p:
        summary = p | beam.Create(placed) | SummariseGroups()
        assert_that(summary, equal_to([{
            "groups": 2, "grouped_images": 4, "ungrouped_images": 2, "ungrouped_examples": ["c/y.jpg", "c/z.jpg"],
            "groups_in_several_splits": 1,
            "several_splits_examples": [{"group": "p2", "images": {"train": 1, "validation": 1}}]}]))


# --- Writing the shards: ConvertChunks and AssembleShards on their own -------------------------------------------


def _records_of(path: str) -> list[tuple[str, int]]:
    """(source_path, label) of each record of the TFRecord file at `path`, in order."""
    from transforms.base.examples import Example
    from transforms.base.tfrecord import iter_records

    features = [Example.FromString(raw).features.feature for raw in iter_records(path)]
    return [(f["source_path"].bytes_list.value[0].decode(), f["label"].int64_list.value[0]) for f in features]


def test_convert_chunks_cuts_each_shard_into_chunks_in_rank_order_and_writes_each_chunk_to_its_own_piece(tmp_path):
    import hashlib
    import os

    from tests import image_cases as cases
    from transforms.base.records import ImageRef
    from transforms.images.settings import ImageSettings
    from transforms.output.write import ConvertChunks, _ConvertChunk

    sources = {}
    refs = []
    # train: 4 images (c/2.png not an image), ranked c/3, c/2, c/1, c/0 by their keys; validation: one image
    for i, (relpath, split, label, key) in enumerate([("c/0.png", "train", 0, 3), ("c/1.png", "train", 1, 2),
                                                      ("c/2.png", "train", 0, 1), ("c/3.png", "train", 1, 0),
                                                      ("d/4.png", "validation", 1, 0)]):
        data = cases.encode(cases.quadrants(40 + i, 30), "PNG") if relpath != "c/2.png" else b"not an image"
        path = tmp_path / "in" / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        sources[relpath] = data
        refs.append(ImageRef(str(path), relpath, len(data), split, relpath[0], label, key))
    placed = [((ref.split, 0, 1), ref) for ref in refs]
    folder = str(tmp_path / "shards")
    sha = {relpath: hashlib.sha256(data).hexdigest() for relpath, data in sources.items()}

    def seen(piece):  # what the piece says, and what its file holds
        path = os.path.join(folder, piece.file)
        return (piece.shard, piece.chunk, piece.chunks, _records_of(path), piece.bytes == os.path.getsize(path),
                len(piece.sizes), sorted(piece.written), [(r.relpath, r.stage, r.reason) for r in piece.rejections],
                list(piece.hashes))

    with TestPipeline() as p:
        pieces = p | beam.Create(placed) | ConvertChunks(
            _ConvertChunk(folder, ImageSettings(width=8, height=8), "default", 1, "none"), "tfrecord", chunk_images=2)
        assert_that(pieces | beam.Map(seen), equal_to([
            (("train", 0, 1), 0, 2, [("c/3.png", 1)], True, 1, [(("train", 1, False), 1)],
             [("c/2.png", "rejected", "not_an_image")], [(sha["c/3.png"], ("train", 1, "c/3.png"))]),
            (("train", 0, 1), 1, 2, [("c/1.png", 1), ("c/0.png", 0)], True, 2,
             [(("train", 0, False), 1), (("train", 1, False), 1)], [],
             [(sha["c/1.png"], ("train", 1, "c/1.png")), (sha["c/0.png"], ("train", 0, "c/0.png"))]),
            (("validation", 0, 1), 0, 1, [("d/4.png", 1)], True, 1, [(("validation", 1, False), 1)], [],
             [(sha["d/4.png"], ("validation", 1, "d/4.png"))])]))


def test_assemble_shards_concatenates_each_shards_pieces_in_chunk_order_and_sends_their_accounting_aside(tmp_path):
    import os

    from transforms.base.records import ImageRef, Rejection
    from transforms.base.tfrecord import iter_records
    from transforms.images.convert import Converted
    from transforms.images.stats import SplitStats
    from transforms.output.write import (
        HASHES,
        REJECTED,
        RESUMED,
        STATS,
        WRITTEN,
        AssembleShards,
        ChunkKey,
        _AssembleShard,
        index_name,
        index_text,
        write_piece,
    )

    folder = str(tmp_path / "shards")
    refs = {name: ImageRef(f"/in/{name}", name, 10, split, name[0], label, 0)
            for name, split, label in [("c/a", "train", 0), ("c/b", "train", 1), ("c/c", "train", 0),
                                       ("c/d", "train", 1), ("v/e", "validation", 0)]}

    def outcome(name):
        if name == "c/c":  # given up, as a timeout is
            return Converted(refs[name], None, False, Rejection(name, "rejected", "timeout", "over 1 s"), "")
        return Converted(refs[name], f"record of {name}".encode() * 3, False, None, name[-1] * 64)

    train = SplitStats(images=1, pixels=64, sums=(1, 2, 3), squares=(1, 4, 9))
    pieces = [
        # the train shard's chunk 1 before its chunk 0: the shard is still made in chunk order
        write_piece(folder, ChunkKey("train", 0, 1, 1, 2), [outcome("c/c"), outcome("c/d")], "none")._replace(
            stats=train),
        write_piece(folder, ChunkKey("train", 0, 1, 0, 2), [outcome("c/a"), outcome("c/b")], "none")._replace(
            stats=train._replace(images=2, pixels=128)),
        # a piece taken from an interrupted run
        write_piece(folder, ChunkKey("validation", 0, 1, 0, 1), [outcome("v/e")], "none")._replace(
            resumed_from="run0"),
    ]

    def seen(shard):  # what the ShardInfo says, and what its file and index hold
        path = os.path.join(folder, shard.temp)
        records = list(iter_records(path))
        index = open(os.path.join(folder, index_name(shard.temp))).read()
        sizes = [16 + len(record) for record in records]
        return (shard.split, shard.file, shard.index, shard.records, shard.bytes == os.path.getsize(path), records,
                index == index_text(sizes))

    with TestPipeline() as p:
        out = p | beam.Create(pieces) | AssembleShards(_AssembleShard(folder, "none", index_files=True))
        assert_that(out.shards | beam.Map(seen), equal_to([
            ("train", "train-00000-of-00001.tfrecord", "train-00000-of-00001.idx", 3, True,
             [b"record of c/a" * 3, b"record of c/b" * 3, b"record of c/d" * 3], True),
            ("validation", "validation-00000-of-00001.tfrecord", "validation-00000-of-00001.idx", 1, True,
             [b"record of v/e" * 3], True)]), label="Shards")
        assert_that(out[REJECTED] | beam.Map(lambda r: (r.relpath, r.reason)), equal_to([("c/c", "timeout")]),
                    label="Rejected")
        assert_that(out[WRITTEN], equal_to([(("train", 0, False), 1), (("train", 1, False), 2),
                                            (("validation", 0, False), 1)]), label="Written")
        assert_that(out[HASHES], equal_to([("a" * 64, ("train", 0, "c/a")), ("b" * 64, ("train", 1, "c/b")),
                                           ("d" * 64, ("train", 1, "c/d")), ("e" * 64, ("validation", 0, "v/e"))]),
                    label="Hashes")
        # the shard's pieces' stats added up; the validation piece had none
        assert_that(out[STATS], equal_to([("train", SplitStats(images=3, pixels=192, sums=(2, 4, 6),
                                                              squares=(2, 8, 18)))]), label="Stats")
        assert_that(out[RESUMED], equal_to([("run0", 1)]), label="Resumed")
    assert os.listdir(os.path.join(folder, "pieces")) == []  # each piece went into its shard


# --- --if_exists=append: the sources files, written and read, and the join that skips what a dataset holds ------


def test_write_sources_writes_one_json_list_a_line_per_written_image_into_the_runs_sources_files(tmp_path):
    import json
    import os
    import re

    from transforms.inputs.append import WriteSources, parse_source_line

    hashes = [("a" * 64, ("train", 0, "cat/a.jpg")), ("b" * 64, ("validation", 1, "dog/b.jpg")),
              ("c" * 64, ("train", (0, 2), "x/c.jpg"))]  # --multi_label: a tuple of class ids
    folder = str(tmp_path / "shards")

    def lines(path):
        with open(path) as f:
            return f.read().splitlines()

    with TestPipeline() as p:
        paths = p | beam.Create(hashes) | WriteSources(folder, "run1")
        assert_that(paths | beam.Map(lambda path: (os.path.dirname(path), bool(re.fullmatch(
                        r"sources-run1-\d{5}-of-\d{5}\.jsonl", os.path.basename(path))))) | beam.Distinct(),
                    equal_to([(folder, True)]), label="Paths")
        written = paths | beam.FlatMap(lines)
        assert_that(written | beam.Map(json.loads), equal_to([
            ["cat/a.jpg", "a" * 64, "train", 0], ["dog/b.jpg", "b" * 64, "validation", 1],
            ["x/c.jpg", "c" * 64, "train", [0, 2]]]), label="Lines")
        # each line reads back as what an append's ReadSources gives
        assert_that(written | beam.Map(parse_source_line), equal_to([
            ("cat/a.jpg", ("a" * 64, "train", 0)), ("dog/b.jpg", ("b" * 64, "validation", 1)),
            ("x/c.jpg", ("c" * 64, "train", (0, 2)))]), label="ReadBack")


def test_read_sources_gives_every_record_of_the_sources_files_and_fails_the_run_on_a_damaged_line(tmp_path):
    """A root transform (PBegin -> records): a TestPipeline over small sources files, its output asserted."""
    import pytest

    from transforms.inputs.append import ReadSources

    first, second = tmp_path / "sources-run1-00000-of-00002.jsonl", tmp_path / "sources-run1-00001-of-00002.jsonl"
    first.write_text(f'["cat/a.jpg", "{"a" * 64}", "train", 0]\n["dog/b.jpg", "{"b" * 64}", "test", 1]\n')
    second.write_text(f'["x/c.jpg", "{"c" * 64}", "validation", [0, 2]]\n')
    with TestPipeline() as p:
        assert_that(p | ReadSources([str(first), str(second)]), equal_to([
            ("cat/a.jpg", ("a" * 64, "train", 0)), ("dog/b.jpg", ("b" * 64, "test", 1)),
            ("x/c.jpg", ("c" * 64, "validation", (0, 2)))]))

    damaged = tmp_path / "sources-run0-00000-of-00001.jsonl"
    damaged.write_text(f'["cat/a.jpg", "{"a" * 64}", "train", 0]\n["dog/b.jpg", "cut he\n')
    with pytest.raises(Exception, match="the dataset's sources file .* is damaged"):
        with TestPipeline() as p:
            _ = p | ReadSources([str(damaged)])


def test_skip_present_passes_new_images_counts_those_already_in_the_dataset_and_rejects_changed_ones(tmp_path):
    import hashlib

    from transforms.inputs.append import CHANGED, PRESENT, REJECTED, SkipPresent

    refs = [_image_ref(tmp_path, "cat/same.jpg", b"same bytes", "cat", 0),
            _image_ref(tmp_path, "cat/changed.jpg", b"new bytes", "cat", 0),
            _image_ref(tmp_path, "dog/new.jpg", b"a new image", "dog", 1),
            _image_ref(tmp_path, "dog/large.jpg", b"x" * 40, "dog", 1)]  # over the bound: not hashed, converted
    sha = lambda data: hashlib.sha256(data).hexdigest()  # noqa: E731
    sources = [("cat/same.jpg", (sha(b"same bytes"), "train", 0)), ("cat/changed.jpg", (sha(b"old bytes"), "train", 0)),
               ("dog/large.jpg", (sha(b"y" * 40), "train", 1)),
               ("dog/gone.jpg", (sha(b"gone"), "train", 1))]  # in the dataset, no longer in the folder: kept there
    with TestPipeline() as p:
        judged = p | "Images" >> beam.Create(refs) | SkipPresent(p | "Sources" >> beam.Create(sources),
                                                                 max_file_bytes=20)
        assert_that(judged.images | beam.Map(lambda r: r.relpath), equal_to(["dog/new.jpg", "dog/large.jpg"]),
                    label="Images")
        assert_that(judged[PRESENT] | beam.CombineGlobally(sum), equal_to([1]), label="Present")
        # its detail names the recorded and the new SHA-256
        old, new = sha(b"old bytes"), sha(b"new bytes")
        assert_that(judged[REJECTED] | beam.Map(lambda r: (r.relpath, r.stage, r.reason, old in r.detail,
                                                            new in r.detail)),
                    equal_to([("cat/changed.jpg", "rejected", CHANGED, True, True)]), label="Rejected")


# --- Flex Template launches: the job records its own id --------------------------------------------------------


def test_record_job_id_writes_the_jobs_id_into_its_runs_lock_and_never_into_another_runs(tmp_path, monkeypatch):
    """A root transform (PBegin -> one None): a TestPipeline, with a stand-in of the worker VM's metadata server,
    and the locks it writes read in the step after it."""
    from tests.dataflow_service import metadata_server
    from transforms.output.lock import (
        METADATA_HOST_ENV,
        RecordJobId,
        acquire_lock,
        holder_record,
        read_lock,
        release_lock,
    )

    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    acquire_lock(ours, holder_record("run-1", "DataflowRunner"), lambda _: None)
    acquire_lock(theirs, holder_record("run-2", "DataflowRunner"), lambda _: None)
    job = "2026-12-04_01_02_03-1234567890"
    try:
        with metadata_server(job) as host:
            monkeypatch.setenv(METADATA_HOST_ENV, host)
            with TestPipeline() as p:
                recorded = p | "Ours" >> RecordJobId(ours, "run-1")
                refused = p | "Theirs" >> RecordJobId(theirs, "run-1")  # that folder's lock is run-2's
                assert_that(recorded, equal_to([None]), label="Recorded")
                assert_that(recorded | "ReadOurs" >> beam.Map(lambda _: (read_lock(ours)["run_id"],
                                                                          read_lock(ours).get("job_id"))),
                            equal_to([("run-1", job)]), label="OurLock")
                assert_that(refused | "ReadTheirs" >> beam.Map(lambda _: (read_lock(theirs)["run_id"],
                                                                           read_lock(theirs).get("job_id"))),
                            equal_to([("run-2", None)]), label="TheirLock")
    finally:
        release_lock(ours, "run-1")
        release_lock(theirs, "run-2")
