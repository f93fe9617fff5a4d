"""Resume of a detection run: an interrupted --task=detection run, run again with the same command, takes the chunks
it converted (their annotation tallies with them) and converts only the rest; the dataset is byte for byte the one
an uninterrupted run makes, and the description's "detection" section is exact. A change of what decides the
records (--first_class_id, --images_without_objects, --instance_masks, the annotations) converts everything again.
"""

from __future__ import annotations

import json
import os

import pytest

from pipeline import verify
from pipeline.cli import main_of
from tests.conftest import FAST
from tests.crash_helpers import dataset_files, done_records, stop_after_chunks
from tests.detection_runs import IMAGES, coco_export, read_detection_records
from transforms.base.dataset_format import TEMP_DIR
from transforms.output import resume

SHARDS = "--num_shards=train=3,validation=2"  # 5 chunks: one per shard
ARGS = ("--task=detection", "--image_size=32x24", SHARDS)
# Each image gets a box under a pixel once halved (box_too_small, set aside by the writer, so in the done records);
# image 4 (d.jpg) is no JPEG: its 3 objects and its small box are image_rejected.
SMALL = {"train": [{"id": 100 + i, "image_id": i, "category_id": 1, "bbox": [5, 5, 1, 1], "iscrowd": 0}
                   for i in (1, 2, 3, 4)],
         "validation": [{"id": 100 + i, "image_id": i, "category_id": 2, "bbox": [5, 5, 1, 1], "iscrowd": 0}
                        for i in (5, 6)]}
FOUND = sum(len(objects) for _, _, objects in IMAGES) + 6  # 8 objects and 6 small boxes


def _run(root, out, *args) -> int:
    from pipeline.launcher import run

    return run([f"--input_dir={root}", f"--output_dir={out}", "--quiet", *ARGS, *args, *FAST])


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("det-resume") / "coco"
    coco_export(root, extra=SMALL)
    (root / "train" / "d.jpg").write_bytes(b"\xff\xd8 not a JPEG")
    return root


@pytest.fixture(scope="module")
def fresh(export, tmp_path_factory):
    out = tmp_path_factory.mktemp("det-resume-fresh") / "out"
    assert _run(export, out) == 0
    return out


def _interrupt(monkeypatch, export, out, after: int = 2) -> list[dict]:
    stop_after_chunks(monkeypatch, after)
    with pytest.raises(Exception, match="stopped after"):
        _run(export, out)
    monkeypatch.undo()
    done = list(done_records(out).values())
    assert len(done) == after
    return done


def test_a_rerun_takes_the_chunks_with_their_annotation_tallies_and_converts_the_rest(monkeypatch, export, fresh,
                                                                                      tmp_path):
    out = tmp_path / "out"
    done = _interrupt(monkeypatch, export, out)
    (interrupted,) = os.listdir(out / TEMP_DIR)
    # every done record holds its chunk's annotations set aside (each image has a box too small) and objects tally
    assert all(record["annotations"] and len(record["objects"]) == 3 for record in done)
    assert all(line[1:3] in (["annotation", "box_too_small"], ["annotation", "image_rejected"])
               for record in done for line in record["annotations"])
    kept = sum(len(record["sizes"]) for record in done)

    assert _run(export, out) == 0

    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["resumed"] == {"images": kept, "from_runs": [interrupted], "converted": 5 - kept}
    # shards, errors.jsonl, labels.txt, label_map.pbtxt, TFDS's files, the description
    assert dataset_files(out) == dataset_files(fresh)
    assert read_detection_records(out) == read_detection_records(fresh)
    section = info["detection"]
    assert section["annotations"] == {"found": FOUND, "written": 5, "rejected": {"box_too_small": 5,
                                                                                  "image_rejected": 4}}
    assert section["images_without_objects"] == {"kept": 1, "dropped": 0} and section["objects_per_image_max"] == 2
    assert not (out / TEMP_DIR).exists()
    assert main_of(verify.run, [str(out)]) == 0


@pytest.mark.parametrize("change, words", [
    ("--first_class_id=0", "first_class_id: 1 -> 0"),
    ("--images_without_objects=drop", "images_without_objects: 'keep' -> 'drop'"),
    ("--instance_masks", "instance_masks: False -> True"),
])
def test_another_detection_option_converts_everything_again(monkeypatch, capsys, export, tmp_path, change, words):
    out = tmp_path / "out"
    _interrupt(monkeypatch, export, out)
    (interrupted,) = os.listdir(out / TEMP_DIR)
    capsys.readouterr()
    assert _run(export, out, change) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "resuming" in line.lower()]
    assert len(lines) == 1 and interrupted in lines[0] and words in lines[0], lines
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert "resumed" not in info
    assert main_of(verify.run, [str(out)]) == 0


def test_changed_annotations_are_not_taken_from_the_interrupted_run(monkeypatch, export, tmp_path):
    """The annotation file rewritten between the runs (a box moved, a class renamed): nothing of the old run is
    taken, and the records hold the new annotations."""
    root = tmp_path / "coco"
    coco_export(root, extra=SMALL)
    out = tmp_path / "out"
    _interrupt(monkeypatch, root, out)
    coco = root / "train" / "_annotations.coco.json"
    data = json.loads(coco.read_text())
    data["categories"][2]["name"] = "wolf"  # dog -> wolf: the ids are the same, the names are not
    coco.write_text(json.dumps(data))
    assert _run(root, out) == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert "resumed" not in info
    texts = {t for rows in read_detection_records(out).values() for r in rows
             for t in r.get("image/object/class/text", [])}
    assert "wolf" in texts
    assert main_of(verify.run, [str(out)]) == 0


def test_the_digest_of_a_chunk_holds_its_annotations_and_the_class_names():
    """A chunk's done record is named after its images' annotations as parsed and the class names the job found:
    another box or another class list is another chunk."""
    from transforms.base.records import ImageRef
    from transforms.detection.objects import Annotation, Box, ImageAnnotations

    def ref(box):
        annotations = ImageAnnotations("a.jpg", "/in/a.jpg", "1", objects=(Annotation("cat", Box(*box)),))
        return ImageRef("/in/a.jpg", "a.jpg", 10, "train", "", None, 7, annotations=annotations)

    key = ("train", 0, 1, 0, 1)
    one = resume.chunk_digest("plan", key, [ref((1, 2, 3, 4))], ["cat", "dog"])
    assert one == resume.chunk_digest("plan", key, [ref((1, 2, 3, 4))], ["cat", "dog"])
    assert one != resume.chunk_digest("plan", key, [ref((1, 2, 3, 5))], ["cat", "dog"])
    assert one != resume.chunk_digest("plan", key, [ref((1, 2, 3, 4))], ["dog", "cat"])
    assert one != resume.chunk_digest("plan", key, [ref((1, 2, 3, 4))])
