"""A detection export's image folders are listed by every worker, not by one: a long gs:// folder (COCO's train/,
VOC's JPEGImages/, YOLO's images/) is listed for its first pages where it is and in parts by any worker for the
rest (transforms/detection/parsing.py ListFolders), each image once; against tests/fake_gcs_listing.py, whose
small pages and offsets make the parts (the GCS emulator ignores offsets)."""

from __future__ import annotations

import json

import pytest

import tests.fake_gcs_listing as fake
from tests.fake_gcs_listing import BUCKET, serve, use_in_process
from transforms.inputs import folder_parts as fp
from transforms.inputs import listing

WIDTH, HEIGHT = 480, 360  # the fake's JPEG (make_jpeg's default)
CLASSES = ("class_0000", "class_0001", "class_0002")


def _small_pages(monkeypatch) -> None:
    """Pages of 100 names (the fake's and the planner's), parts of about 200 names, 2 pages listed where a
    folder is: a folder of 1,500 images is cut into several parts."""
    monkeypatch.setattr(fake, "MAX_RESULTS", 100)
    monkeypatch.setattr(fp, "PAGE", 100)
    monkeypatch.setattr(fp, "PART_NAMES", 200)
    monkeypatch.setattr(listing, "SMALL_FOLDER_PAGES", 2)


def _image_names(per_class: int) -> list[str]:
    """The fake's flat names below in/train/ (the relpaths in the export): class_0001_img_00000007.jpg, ..."""
    return [f"{name}_img_{i:08d}.jpg" for name in CLASSES for i in range(per_class)]


def _coco(names: list[str]) -> bytes:
    """Roboflow's _annotations.coco.json for `names`: one box each, of the class its name starts with, and an
    entry (with its one box) for gone.jpg, which the folder lacks."""
    categories = [{"id": i, "name": name, "supercategory": "none"} for i, name in enumerate(CLASSES, 1)]
    images = [{"id": i, "file_name": name, "width": WIDTH, "height": HEIGHT}
              for i, name in enumerate([*names, "gone.jpg"], 1)]
    annotations = [{"id": image["id"], "image_id": image["id"], "bbox": [40, 30, 200, 150], "area": 30000,
                    "iscrowd": 0, "category_id": CLASSES.index(image["file_name"][:10]) + 1 if image["id"] <= len(
                        names) else 1} for image in images]
    return json.dumps({"categories": categories, "images": images, "annotations": annotations}).encode()


@pytest.mark.timeout(600)
def test_a_long_coco_image_folder_on_gcs_is_listed_in_parts_and_each_image_converted_once(monkeypatch, tmp_path):
    """gs://b/in/train/ holds 1,500 images beside its _annotations.coco.json, on pages of 100 names: the folder is
    listed for its first 2 pages where it is and in parts for the rest, and every image is written once, with
    its box and the class its entry names; the entry of the missing image is the one rejection (found = written +
    rejected)."""
    from pipeline.reader import load_info
    from tests.conftest import convert

    _small_pages(monkeypatch)
    names = _image_names(500)
    out = tmp_path / "out"
    with serve(len(CLASSES), 500, splits=("train",), flat=True,
               extras={"in/train/_annotations.coco.json": _coco(names)}) as server:
        use_in_process(server, monkeypatch, str(tmp_path))
        code = convert(f"gs://{BUCKET}/in", out, "--task=detection", "--no_auth", "--image_size=16")
        stats = server.stats()
    assert code == 0
    assert stats["unknown"] == []
    # 1,301 names after the folder's first 2 pages, about 200 a part, each listed from its start
    starts = stats["part_range_starts"]
    assert len(starts) >= 3 and all(start.startswith("in/train/") for start in starts), starts
    info = load_info(str(out))
    assert info["detection"]["annotations"] == {"found": 1501, "written": 1500, "rejected": {"missing_image": 1}}
    assert info["splits"]["train"]["records"] == 1500 and set(info["splits"]) == {"train"}
    assert info["class_names"] == list(CLASSES)
    assert info["splits"]["train"]["class_counts"] == {name: 500 for name in CLASSES}
    # each sources line: [relpath, sha256, split, label]; every image once, and nothing else (not the JSON file)
    sources = [json.loads(line) for path in out.glob("sources-*.jsonl") for line in path.read_text().splitlines()]
    assert sorted(relpath for relpath, *_ in sources) == sorted(f"train/{name}" for name in names)
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert sorted((e["stage"], e["reason"], e["relpath"]) for e in errors) == [
        ("annotation", "missing_image", "train/gone.jpg"), ("rejected", "missing_image", "train/gone.jpg")]


@pytest.mark.timeout(300)
def test_list_folders_lists_a_long_gcs_folder_of_subfolders_in_parts_each_file_once(monkeypatch, tmp_path):
    """ListFolders goes down a folder's subfolders, as each format's parser expects (YOLO's images/<any>/,
    COCO's file names with folders): gs://b/in/train/ of 4 subfolders of 400 images, in parts listed whole
    (no delimiter), gives every file once; the folder beside it (in/validation/) is listed too, as a folder of
    its own."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from tests.pipelines import TestPipeline
    from transforms.detection.parsing import ListFolders

    _small_pages(monkeypatch)
    with serve(4, 400, splits=("train", "validation")) as server:
        use_in_process(server, monkeypatch, str(tmp_path))
        expected = [f"gs://{BUCKET}/in/{split}/class_{c:04d}/img_{i:08d}.jpg"
                    for split in ("train", "validation") for c in range(4) for i in range(400)]
        with TestPipeline(options=beam.options.pipeline_options.PipelineOptions(
                ["--direct_running_mode=in_memory", "--direct_num_workers=1"])) as p:
            entries = p | ListFolders([f"gs://{BUCKET}/in/train", f"gs://{BUCKET}/in/validation"],
                                      f"gs://{BUCKET}/in")
            assert_that(entries | beam.Map(lambda entry: (entry.path, entry.problem)),
                        equal_to([(path, None) for path in expected]))
        stats = server.stats()
    assert stats["unknown"] == []
    for split in ("train", "validation"):  # 1,400 names after each first 2 pages, about 200 a part
        assert len([start for start in stats["part_range_starts"] if start.startswith(f"in/{split}/")]) >= 3
    parts = p.result.metrics().query(beam.metrics.MetricsFilter().with_name("folder_parts"))["counters"]
    assert sum(c.committed for c in parts) >= 6


def test_list_folders_lists_no_file_in_a_stage_of_one_element():
    """On Dataflow, a stage that starts from one element runs on one worker: neither the folders' first pages
    (ListFolder) nor their parts (ListParts) may be fused into it; a local input has no parts step."""
    import apache_beam as beam

    from tests.dataflow_dry_run import assert_single_element_stages_are_bounded, optimized_stages
    from transforms.detection.parsing import ListFolders

    p = beam.Pipeline()
    _ = (p | "ListImages" >> ListFolders([f"gs://{BUCKET}/in/train", f"gs://{BUCKET}/in/valid"], f"gs://{BUCKET}/in")
         | "Paths" >> beam.Map(lambda entry: entry.path))
    proto = p.to_runner_api()
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert {"ListImages/ListFolder", "ListImages/SpreadParts", "ListImages/ListParts"} <= names
    single = assert_single_element_stages_are_bounded(proto, ("ListImages/ListFolder", "ListImages/ListParts",
                                                              "Paths"), {})
    assert single  # the folders' names, made in one place
    stages = optimized_stages(proto)

    def stages_of(step):
        return {i for i, stage in enumerate(stages) for x in stage.transforms
                if x.unique_name == step or x.unique_name.startswith(f"{step}/")}

    folder_stages, part_stages = stages_of("ListImages/ListFolder"), stages_of("ListImages/ListParts")
    assert folder_stages and part_stages and folder_stages.isdisjoint(part_stages)  # a shuffle between them

    local = beam.Pipeline()
    _ = local | "ListImages" >> ListFolders(["/data/in/train"], "/data/in")
    assert not {t.unique_name for t in local.to_runner_api().components.transforms.values()
                if "Parts" in t.unique_name}
