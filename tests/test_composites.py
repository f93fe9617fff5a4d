"""ListImages, AssignLabels, ReadRows, ReadManifest, DropDuplicates, FindDuplicates and SummariseGroups, each as a
composite transform in a TestPipeline (AssignShards and WriteShards: tests/test_write.py; PublishDataset:
tests/test_describe.py)."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from transforms.base.records import FileRef
from transforms.inputs.listing import FOUND, SKIPPED, ListImages
from transforms.labels.assign import UNLABELED, AssignLabels
from transforms.labels.layout import HIDDEN, NOT_AN_IMAGE_EXTENSION, UNKNOWN_CLASS


def test_list_images_gives_each_candidate_image_skips_the_rest_with_a_reason_and_counts_every_entry(tmp_path):
    files = {"cat/a.jpg": b"a" * 3, "cat/b.PNG": b"b" * 5, "dog/c.jpeg": b"c" * 7, "dog/.d.jpg": b"d",
             "dog/notes.txt": b"e"}
    for relpath, data in files.items():
        (tmp_path / relpath).parent.mkdir(exist_ok=True)
        (tmp_path / relpath).write_bytes(data)
    with TestPipeline() as p:
        listed = p | ListImages(str(tmp_path))
        assert_that(listed.images, equal_to([FileRef(str(tmp_path / r), r, len(files[r]))
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
