"""ListImages and AssignLabels, each as a composite transform in a TestPipeline (AssignShards and WriteShards:
tests/test_write.py; DescribeDataset: tests/test_describe.py)."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from transforms.labels import UNLABELED, AssignLabels
from transforms.layout import HIDDEN, NOT_AN_IMAGE_EXTENSION, UNKNOWN_CLASS
from transforms.listing import FOUND, SKIPPED, ListImages
from transforms.records import FileRef


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
