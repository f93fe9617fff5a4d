"""--task=detection on Cloud Storage and Dataflow, against the suite's stand-ins (the GCS emulator, the Dataflow REST
stand-in): each export format read from gs:// and written to gs:// gives the very bytes of a local run; a COCO file
is streamed on the workers, never downloaded by the launcher; an annotation file Cloud Storage refuses is a line of
errors.jsonl, a transient error a read again; a detection job submitted to Dataflow (python -m pipeline.main,
run_dataflow.sh, the Flex Template) stages what its workers need and writes a dataset that verifies and reads back."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from PIL import Image

from tests.conftest import FAST, REPO, main_in_process, run_tool
from tests.dataflow_dry_run import (
    BOUNDED_SIDE_INPUTS,
    JOB_ENV,
    SCRIPT,
    assert_single_element_stages_are_bounded,
    pipeline_proto,
    run_script,
)
from tests.dataflow_jobs import IMAGE, PROJECT, REGION, job_id_of, launch, run_template_job
from tests.detection_datasets import write
from tests.detection_runs import CLASSES, boxes_csv, coco_export, voc_export, yolo_export
from tests.detection_runs import IMAGES as PLAIN_IMAGES
from tests.gcs_fixtures import NO_AUTH

BUCKET = "detection-cloud"
KINDS = ("coco", "voc", "yolo", "boxes")
ARGS = ("--task=detection", "--image_size=32x24", "--quiet", NO_AUTH)
# What differs between two runs of one export: the run's id and time, and where its input was.
RUN_KEYS = ("run_id", "created", "elapsed_seconds", "images_per_second", "sources")
INPUT_OPTIONS = ("input_dir", "manifest")
# tests/detection_runs.py's images, under names that Cloud Storage's URLs and Beam's globs treat specially: a
# fragment, a query, a percent sign, glob characters, a non-ASCII letter (no space: VOC's ImageSets split on them).
NAMES = {"a": "p#q", "b": "x[1]", "c": "50%20off", "d": "v?w", "v": "ü", "w": "a*b"}
IMAGES = tuple((split, NAMES[stem], objects) for split, stem, objects in PLAIN_IMAGES)
# What a detection job reads on one worker besides the folder job's bounded side inputs.
DETECTION_BOUNDED_SIDE_INPUTS = {
    **BOUNDED_SIDE_INPUTS,
    "ReadAnnotations/UsedClasses": "the distinct class names of the objects as one list: one per class",
    "ReadAnnotations/CountFound": "one count: the images and rejected entries the parser found",
    "ReadAnnotations/ReadCOCO/Tally/SumCounts": "one tally dict of the parser's annotations",
    "ReadAnnotations/ReadBoxes/Tally/SumCounts": "one tally dict of the parser's annotations",
    "SumAnnotations": "one tally dict: the annotations found, written and rejected per reason",
    "ReadAnnotations/ReadCOCO/CategoryList": "the COCO files' categories as one list: one per category and file",
    "ReadAnnotations/ReadCOCO/Categories": "the same as one dict of names",
    "ReadAnnotations/ReadCOCO/BadFileList": "the COCO files that do not parse: one per annotation file at most",
    "ReadAnnotations/ReadCOCO/BadFiles": "the same as one dict",
    "ReadAnnotations/ClassNames": "the class names: one per class",
    "ReadAnnotations/ReadBoxes/Read/AllCounts": "the row counts of the box file's ranges: one per 64 MiB",
    "ReadAnnotations/ReadBoxes/Read/RangeStarts": "one (rows before, CSV state, lines before) per 64 MiB range",
}
# The steps that handle every image or annotation: never in a stage that starts from one element.
DETECTION_PER_IMAGE_STEPS = (
    "ReadAnnotations/ReadCOCO/ListImages/ListFolder", "ReadAnnotations/ReadCOCO/ListImages/ListParts",
    "ReadAnnotations/ReadCOCO/StreamCoco", "ReadAnnotations/ReadCOCO/ImageObjects",
    "ReadAnnotations/ReadCOCO/ImagesOnDisk", "ReadAnnotations/ReadCOCO/JoinFiles", "ReadAnnotations/ReadCOCO/Settle",
    "ReadAnnotations/ReadBoxes/Read/ReadRows", "ReadAnnotations/ReadBoxes/ParseBoxes",
    "ReadAnnotations/ReadBoxes/ImageBoxes", "ReadAnnotations/ToImageRefs", "ReadAnnotations/DistinctClasses",
    "AssignShards/PlaceImages", "AssignShards/RankStraddlers", "WriteShards/ConvertChunks",
    "WriteShards/AssembleShards")


def _export(kind: str, root) -> None:
    """A generated export of `kind` (tests/detection_runs.py, its images named by NAMES) with one image its
    annotations name and the folder lacks (missing_image), found on Cloud Storage by an existence check, a listing
    or a join; VOC's also has a class mask (SegmentationClass/), read by the conversion."""
    if kind == "coco":
        gone = {"id": 90, "image_id": 77, "category_id": 1, "bbox": [1, 2, 3, 4]}
        train = coco_export(root, IMAGES, extra={"train": [gone]})["train"]
        train["images"].append({"id": 77, "file_name": "gone.jpg", "width": 64, "height": 48})
        write(f"{root}/train/_annotations.coco.json", json.dumps(train))
    elif kind == "voc":
        voc_export(root, IMAGES)
        write(f"{root}/Annotations/gone.xml", (root / "Annotations" / "x[1].xml").read_text().replace("x[1].jpg",
                                                                                                  "gone.jpg"))
        mask = np.zeros((48, 64), np.uint8)
        mask[6:40, 4:30] = 8  # VOC's cat
        picture = Image.fromarray(mask, "P")
        picture.putpalette([0, 0, 0, 128, 0, 0] * 128)
        (root / "SegmentationClass").mkdir()
        picture.save(root / "SegmentationClass" / "p#q.png")
    elif kind == "yolo":
        yolo_export(root, IMAGES)
        write(f"{root}/train/labels/gone.txt", "0 0.5 0.5 0.2 0.2\n")
    else:
        with open(boxes_csv(root, IMAGES), "a") as f:
            f.write("images/gone.jpg,cat,1,1,5,5,train\n")


def _inputs(kind: str, base: str) -> list[str]:
    return [f"--manifest={base}/boxes.csv"] if kind == "boxes" else [f"--input_dir={base}"]


@pytest.fixture(scope="module")
def exports(gcs_emulator, tmp_path_factory):
    """(local folder, gs:// folder): each format's export below both, as <folder>/<kind>."""
    bucket = gcs_emulator.create_bucket(BUCKET)
    local = tmp_path_factory.mktemp("detection-exports")
    for kind in KINDS:
        _export(kind, local / kind)
        gcs_emulator.upload_tree(local / kind, f"{bucket}/exports/{kind}")
    return local, f"{bucket}/exports"


def _convert(inputs: list[str], output: str, *args) -> int:
    from pipeline.launcher import run

    return run([*inputs, f"--output_dir={output}", *ARGS, *args, *FAST])


def _comparable(info: dict) -> dict:
    """image_tfrecords.json without what differs from run to run and the input's place."""
    options = {k: v for k, v in info["options"].items() if k not in INPUT_OPTIONS}
    return {**{k: v for k, v in info.items() if k not in RUN_KEYS}, "options": options}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", KINDS)
def test_an_export_on_gcs_converts_to_gcs_as_a_local_one(gcs_emulator, exports, tmp_path, kind):
    """The same shards byte for byte, labels.txt, label_map.pbtxt, errors.jsonl and description as a local run of
    the same export; the image the annotations name and Cloud Storage lacks is in errors.jsonl, as locally."""
    local, remote = exports
    output = f"gs://{BUCKET}/out/{kind}"
    assert _convert(_inputs(kind, f"{remote}/{kind}"), output) == 0
    assert _convert(_inputs(kind, str(local / kind)), str(tmp_path / "out")) == 0

    info = json.loads(gcs_emulator.read(f"{output}/image_tfrecords.json"))
    local_info = json.loads((tmp_path / "out" / "image_tfrecords.json").read_text())
    assert _comparable(info) == _comparable(local_info)
    assert info["options"]["manifest" if kind == "boxes" else "input_dir"].startswith(f"{remote}/{kind}")
    found = sum(len(objects) for _, _, objects in IMAGES) + 1
    assert info["detection"]["annotations"] == {"found": found, "written": found - 1,
                                                "rejected": {"missing_image": 1}}
    assert info["detection"]["input_format"] == kind and info["class_names"] == list(CLASSES)
    assert info["detection"]["semantic_masks"] is (kind == "voc")

    # The same files as the local run's (but for each run's sources list, named after its run id): no lock, no
    # temporary object left; each the same bytes but for the description, whose lines come in any order.
    names = set(gcs_emulator.list_names(output)) - set(info["sources"]["files"])
    assert len(info["sources"]["files"]) == 1
    assert names == {p.name for p in (tmp_path / "out").iterdir()} - set(local_info["sources"]["files"])
    shards = {s["file"] for split in info["splits"].values() for s in split["shards"]}
    assert {"labels.txt", "label_map.pbtxt", "errors.jsonl"} | shards <= names
    for name in sorted(names - {"image_tfrecords.json", "errors.jsonl", "dataset_info.json"}):
        assert gcs_emulator.read(f"{output}/{name}") == (tmp_path / "out" / name).read_bytes(), name
    # TFDS's dataset_info.json: the same but for its description, which names its run's id
    tfds_info, local_tfds_info = (json.loads(data) for data in (
        gcs_emulator.read(f"{output}/dataset_info.json"), (tmp_path / "out" / "dataset_info.json").read_bytes()))
    assert tfds_info.pop("description").endswith(f"(run {info['run_id']}).")
    assert {**tfds_info, "description": ""} == {**local_tfds_info, "description": ""}
    # errors.jsonl's lines come in the order the job's bundles give them, on any runner: the same lines.
    assert sorted(gcs_emulator.read(f"{output}/errors.jsonl").splitlines()) == sorted(
        (tmp_path / "out" / "errors.jsonl").read_bytes().splitlines())
    errors = [json.loads(line) for line in gcs_emulator.read(f"{output}/errors.jsonl").decode().splitlines()]
    # the image's line, and its annotation's (a YOLO label file's lines name their file)
    assert sorted((e["stage"], e["reason"], e["relpath"].rsplit("/", 1)[-1].split(".")[0]) for e in errors) == [
        ("annotation", "missing_image", "gone"), ("rejected", "missing_image", "gone")]


class _Recorder:
    """What a stream gives its reader: the size of each read."""

    def __init__(self, raw, reads: list):
        self._raw, self._reads = raw, reads

    def read(self, size=-1):
        data = self._raw.read(size)
        if size:  # read(0): ijson's look at the stream's type
            self._reads.append((size, len(data)))
        return data

    def readinto(self, buffer):
        got = self._raw.readinto(buffer)
        self._reads.append((len(buffer), got))
        return got

    def __getattr__(self, name):
        return getattr(self._raw, name)


@pytest.mark.timeout(300)
def test_a_coco_file_on_gcs_is_streamed_a_buffer_at_a_time(gcs_emulator, exports, tmp_path, monkeypatch):
    """The annotation file is read from its gs:// stream in reads of ijson's buffer, never whole (here a 4 KiB
    buffer and a file of about 100 KiB: a 1 GB file takes a buffer of memory, not a gigabyte)."""
    import contextlib

    from transforms.detection import coco

    local, _ = exports
    root = tmp_path / "coco"
    shutil.copytree(local / "coco", root)
    data = json.loads((root / "train" / "_annotations.coco.json").read_text())
    data["licenses"] = [{"id": i, "name": f"license {i}", "url": "https://example.com/" + "x" * 40}
                        for i in range(1200)]  # streamed through and passed over
    (root / "train" / "_annotations.coco.json").write_text(json.dumps(data))
    size = (root / "train" / "_annotations.coco.json").stat().st_size
    assert size > 90_000
    folder = f"gs://{BUCKET}/streamed"
    gcs_emulator.upload_tree(root, folder)

    reads: dict[str, list] = {}
    opened = coco.open_file

    @contextlib.contextmanager
    def recording(path):
        with opened(path) as raw:
            yield _Recorder(raw, reads.setdefault(path, []))

    monkeypatch.setattr(coco, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(coco, "open_file", recording)
    labels = gcs_emulator.write(f"gs://{BUCKET}/labels.txt", "dog\ncat\n")
    assert _convert([f"--input_dir={folder}"], f"gs://{BUCKET}/out/streamed", f"--labels_file={labels}") == 0

    train = reads[f"{folder}/train/_annotations.coco.json"]
    assert {wanted for wanted, _ in train} == {4096}  # never read() of the whole file
    assert sum(got for _, got in train) == 3 * size  # one pass per list: categories, images, annotations
    assert set(reads) == {f"{folder}/train/_annotations.coco.json", f"{folder}/valid/_annotations.coco.json"}
    info = json.loads(gcs_emulator.read(f"gs://{BUCKET}/out/streamed/image_tfrecords.json"))
    assert info["files"]["written"] == 6
    assert info["class_names"] == ["dog", "cat"]  # --labels_file's order, read from Cloud Storage


def test_an_empty_or_missing_gcs_folder_is_named_as_such(gcs_emulator, exports, capsys):
    code, err = main_in_process(capsys, f"--input_dir=gs://{BUCKET}/no-such-export", f"--output_dir=gs://{BUCKET}/x",
                                *ARGS)
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        f"error: --input_dir gs://{BUCKET}/no-such-export is empty or does not exist: give the folder of the "
        "detection export (YOLO's data.yaml, COCO's JSON files or Pascal VOC's Annotations/ in it)")
    assert gcs_emulator.list_names(f"gs://{BUCKET}/x") == []


def _downloaded_by_the_launcher(monkeypatch) -> list[str]:
    """The gs:// objects this process downloads (any part of) from now on, through Beam's file systems or the GCS
    client alike (in a Dataflow launch, the job runs in the stand-in's own processes)."""
    from google.cloud.storage import Blob

    downloaded: list[str] = []
    download = Blob._prep_and_do_download

    def recording(blob, *args, **kwargs):
        downloaded.append(f"gs://{blob.bucket.name}/{blob.name}")
        return download(blob, *args, **kwargs)

    monkeypatch.setattr(Blob, "_prep_and_do_download", recording)
    return downloaded


@pytest.mark.timeout(600)
def test_a_detection_job_submitted_to_dataflow_writes_a_dataset_that_verifies(gcs_emulator, dataflow_api, exports,
                                                                              monkeypatch, tmp_path):
    """`python -m pipeline.main --task=detection --runner=DataflowRunner`: the launcher looks at a few names and
    image headers (never the COCO files), the stand-in runs the staged job, and the dataset verifies and reads
    back with its boxes."""
    _, remote = exports
    output = f"gs://{BUCKET}/dataflow/coco"
    downloaded = _downloaded_by_the_launcher(monkeypatch)
    result = launch(gcs_emulator, f"--input_dir={remote}/coco", f"--output_dir={output}", "--runner=DataflowRunner",
                    f"--project={PROJECT}", f"--region={REGION}", f"--temp_location=gs://{BUCKET}/tmp",
                    f"--dataflow_endpoint={dataflow_api.endpoint}", f"--sdk_container_image={IMAGE}", NO_AUTH,
                    "--task=detection", "--image_size=32x24")
    assert result.returncode == 0, result.stderr
    job = dataflow_api.jobs[job_id_of(result)]
    assert job.state == "JOB_STATE_DONE"
    assert job.options["task"] == "detection" and job.options["input_dir"] == f"{remote}/coco"
    found = sum(len(objects) for _, _, objects in IMAGES) + 1
    assert (f"Annotations: {found} found: {found - 1} written, 1 rejected (missing_image 1; see errors.jsonl)"
            in result.stdout)
    assert "Found 7 files: 6 written, 1 rejected, 0 skipped." in result.stdout
    read = [path for path in downloaded if path.startswith(f"{remote}/coco/")]
    assert not [path for path in read if path.endswith(".json")], read  # the COCO files are the job's to read
    assert any(path.endswith(".jpg") for path in read)  # the sample of image headers, for the shards' sizes

    # The staged graph: the COCO files streamed on any worker, no per-image work in a stage of one element.
    proto = pipeline_proto(gcs_emulator, job.options["staging_location"])
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert {"ReadAnnotations/ReadCOCO/SpreadFiles", "ReadAnnotations/ReadCOCO/StreamCoco",
            "ReadAnnotations/ReadCOCO/ListImages/ListParts", "ReadAnnotations/ClassNames"} <= names
    assert_single_element_stages_are_bounded(proto, DETECTION_PER_IMAGE_STEPS, DETECTION_BOUNDED_SIDE_INPUTS)

    info = json.loads(gcs_emulator.read(f"{output}/image_tfrecords.json"))
    assert info["task"] == "detection" and info["detection"]["annotations"]["written"] == found - 1
    assert gcs_emulator.read(f"{output}/label_map.pbtxt").decode().count("item {") == len(CLASSES)
    verified = run_tool("pipeline.verify", output)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"Read 6 records from {output}" in verified.stdout

    # tf.data reads gs:// through TensorFlow's own GCS client, which knows no emulator: the reader reads a copy.
    from pipeline import reader

    copy = tmp_path / "copy"
    for name in gcs_emulator.list_names(output):
        write(str(copy / name), gcs_emulator.read(f"{output}/{name}"))
    boxes = {}
    for split in info["splits"]:
        for element in reader.make_dataset(str(copy), split, batch_size=None):
            name = element["source_path"].numpy().decode().rsplit("/", 1)[-1].rsplit(".", 1)[0]
            boxes[name] = element["boxes"].numpy()
    expected = {stem: objects for _, stem, objects in IMAGES}
    assert set(boxes) == set(expected)
    for stem, objects in expected.items():  # [ymin, xmin, ymax, xmax] of the 64 x 48 image
        want = np.array([[y0 / 48, x0 / 64, y1 / 48, x1 / 64] for _, (x0, y0, x1, y1) in objects]).reshape(-1, 4)
        np.testing.assert_allclose(np.sort(boxes[stem], axis=0), np.sort(want, axis=0), atol=0.02)


@pytest.mark.timeout(300)
def test_run_dataflow_sh_stages_a_box_file_job_with_what_detection_needs(gcs_emulator, exports):
    """run_dataflow.sh --manifest=gs://.../boxes.csv --task=detection --dry_run: no --input_dir needed; the package
    staged for the workers requires ijson, PyYAML and pycocotools; the graph reads the boxes in the job."""
    _, remote = exports
    env = dict(JOB_ENV, BUCKET=BUCKET)
    result = run_script(SCRIPT, f"--manifest={remote}/boxes/boxes.csv", f"--output_dir=gs://{BUCKET}/dry",
                        "--task=detection", "--dry_run", "--image_size=32",
                        env=dict(os.environ, **gcs_emulator.env, **env))
    assert result.returncode == 0, result.stderr
    assert f"{remote}/boxes/boxes.csv -> gs://{BUCKET}/dry" in result.stderr
    staging = re.search(r"staged to (gs://\S+): ", result.stdout).group(1)
    sdist = tarfile.open(fileobj=io.BytesIO(gcs_emulator.read(f"{staging}/workflow.tar.gz")))
    (requires,) = [name for name in sdist.getnames() if name.endswith(".egg-info/requires.txt")]
    runtime = sdist.extractfile(requires).read().decode().split("\n[", 1)[0]
    assert {"ijson", "pyyaml", "pycocotools"} <= {re.split(r"[<>=\[ ]", line)[0].lower()
                                                  for line in runtime.splitlines() if line}
    assert {"transforms/detection/coco.py", "transforms/detection/boxes.py", "transforms/detection/geometry.py"} <= {
        name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    proto = pipeline_proto(gcs_emulator, staging)
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert {"ReadAnnotations/ReadBoxes/Read/Ranges", "ReadAnnotations/ReadBoxes/Read/ReadRows",
            "ReadAnnotations/ReadBoxes/ParseBoxes", "ReadAnnotations/ClassNames"} <= names
    single = assert_single_element_stages_are_bounded(proto, DETECTION_PER_IMAGE_STEPS, DETECTION_BOUNDED_SIDE_INPUTS)
    assert any("ReadAnnotations/ReadBoxes/Read/Ranges" in x.unique_name for s in single for x in s.transforms)
    assert gcs_emulator.list_names(f"gs://{BUCKET}/dry") == []  # staged, not run


@pytest.fixture
def proxy(gcs_emulator, monkeypatch):
    """tests/fault_proxy.py in front of the emulator, with this process's GCS clients pointed at it."""
    from tests.fault_proxy import FaultProxy
    from transforms.base.transient import RETRY_BASE_ENV

    with FaultProxy(gcs_emulator.host) as running:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", running.url)
        monkeypatch.setenv(RETRY_BASE_ENV, "0.01")
        yield running


@pytest.mark.timeout(300)
def test_an_annotation_file_gcs_refuses_is_a_line_and_a_transient_error_is_read_again(gcs_emulator, exports, proxy):
    """Cloud Storage's 403 for a VOC XML (no OSError) rejects its image as bad_annotation_file, as an unreadable
    local file does, and the job goes on; a COCO file whose reads fail for a moment (503) is read again: nothing
    of it is rejected; a 403 for an image of a box file (its existence check) is the image's read_error."""
    _, remote = exports
    proxy.fail("exports/voc/Annotations/x[1].xml", 403, times=None)
    output = f"gs://{BUCKET}/out/refused"
    assert _convert([f"--input_dir={remote}/voc"], output) == 0
    errors = [json.loads(line) for line in gcs_emulator.read(f"{output}/errors.jsonl").decode().splitlines()]
    (refused,) = [e for e in errors if e["reason"] == "bad_annotation_file"]
    assert (refused["relpath"], refused["stage"]) == ("JPEGImages/x[1].jpg", "rejected")
    assert refused["detail"].startswith("Annotations/x[1].xml cannot be read: Forbidden: 403 GET "), refused
    info = json.loads(gcs_emulator.read(f"{output}/image_tfrecords.json"))
    assert info["files"] == {"found": 7, "written": 5, "rejected": 2, "skipped": 0, "upscaled": 0}
    assert info["rejected_by_reason"] == {"bad_annotation_file": 1, "missing_image": 1}
    assert proxy.injected[("exports/voc/Annotations/x[1].xml", 403)] >= 1

    proxy.fail("exports/coco/valid/_annotations.coco.json", 503, times=2)
    output = f"gs://{BUCKET}/out/retried"
    assert _convert([f"--input_dir={remote}/coco"], output) == 0
    assert proxy.injected[("exports/coco/valid/_annotations.coco.json", 503)] == 2
    info = json.loads(gcs_emulator.read(f"{output}/image_tfrecords.json"))
    found = sum(len(objects) for _, _, objects in IMAGES) + 1
    assert info["detection"]["annotations"] == {"found": found, "written": found - 1,
                                                "rejected": {"missing_image": 1}}
    assert info["files"] == {"found": 7, "written": 6, "rejected": 1, "skipped": 0, "upscaled": 0}

    proxy.fail("exports/boxes/images/x[1].jpg", 403, times=None)
    output = f"gs://{BUCKET}/out/refused-image"
    assert _convert([f"--manifest={remote}/boxes/boxes.csv"], output) == 0
    # an image the box file names and Cloud Storage will not describe: rejected by its read, as any image's
    errors = [json.loads(line) for line in gcs_emulator.read(f"{output}/errors.jsonl").decode().splitlines()]
    refused = sorted((e["stage"], e["reason"]) for e in errors if e["relpath"] == "images/x[1].jpg")
    assert refused == [("annotation", "image_rejected"), ("rejected", "read_error")]


def test_the_worker_images_import_line_loads_what_detection_needs():
    """dataflow/Dockerfile checks, as it builds the workers' image, that they import the converter and what
    --task=detection reads with: ijson's C backend (a 1 GB COCO file), PyYAML and pycocotools' C extension (imported
    only once a mask is drawn, so a broken wheel would otherwise fail the first job with masks)."""
    with open(os.path.join(REPO, "dataflow", "Dockerfile")) as f:
        (line,) = re.findall(r'python -c "(import [^"]+)"', f.read())
    probe = "import sys, transforms.detection.coco as coco; print(coco.IJSON.backend_name, 'yaml' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", f"{line}; {probe}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["yajl2_c", "True"]
    assert "pycocotools.mask" in line


def test_run_dataflow_sh_takes_a_manifest_on_gcs_in_place_of_input_dir():
    env = dict(os.environ, **JOB_ENV)
    local = run_script(SCRIPT, "--manifest=boxes.csv", "--output_dir=gs://b/out", "--task=detection", env=env)
    assert local.returncode == 2
    assert local.stderr.splitlines() == [
        "error: --manifest boxes.csv is not a gs:// path; Dataflow workers cannot read local files: copy it first "
        "with gcloud storage cp boxes.csv gs://$BUCKET/ (and its images)"]
    several = run_script(SCRIPT, "--manifest", "gs://b/a.csv,b.csv", "--output_dir=gs://b/out", env=env)
    assert several.returncode == 2 and "error: --manifest b.csv is not a gs:// path" in several.stderr
    neither = run_script(SCRIPT, "--output_dir=gs://b/out", "--task=detection", env=env)
    assert neither.returncode == 2
    assert neither.stderr.splitlines() == [
        "error: --input_dir is required: the gs:// folder of class folders (or of a detection export), or give "
        "--manifest=gs://BUCKET/list.csv"]


@pytest.mark.timeout(400)
def test_a_flex_template_launch_of_a_detection_job_completes(gcs_emulator, dataflow_api, exports, tmp_path):
    """The Flex Template's launcher (dataflow/launch.py) with the parameters a scheduler gives a detection job
    (task, first_class_id, images_without_objects): the job it writes runs in the stand-in to a complete dataset."""

    _, remote = exports
    output = f"gs://{BUCKET}/flex/yolo"
    template = tmp_path / "job.json"
    parameters = [f"--input_dir={remote}/yolo", f"--output_dir={output}", "--task=detection", "--first_class_id=0",
                  "--images_without_objects=drop", "--image_size=32"]
    launcher_args = [f"--project={PROJECT}", f"--region={REGION}", f"--temp_location=gs://{BUCKET}/tmp",
                     f"--staging_location=gs://{BUCKET}/staging", f"--sdk_container_image={IMAGE}",
                     f"--dataflow_endpoint={dataflow_api.endpoint}", NO_AUTH, f"--template_location={template}"]
    env = dict(os.environ, **gcs_emulator.env, FLEX_TEMPLATE_PYTHON_PY_FILE=os.path.join(REPO, "dataflow",
                                                                                          "launch.py"))
    result = subprocess.run([sys.executable, os.path.join(REPO, "dataflow", "launch.py"), *parameters,
                             *launcher_args], cwd="/", capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert run_template_job(dataflow_api, template) == "JOB_STATE_DONE"
    info = json.loads(gcs_emulator.read(f"{output}/image_tfrecords.json"))
    assert (info["task"], info["detection"]["first_id"], info["detection"]["input_format"]) == ("detection", 0, "yolo")
    assert info["detection"]["images_without_objects"] == {"kept": 0, "dropped": 1}
    assert gcs_emulator.read(f"{output}/label_map.pbtxt").decode().count("item {") == len(CLASSES)
    assert not [name for name in gcs_emulator.list_names(output) if name.startswith(".")]  # the lock is released
