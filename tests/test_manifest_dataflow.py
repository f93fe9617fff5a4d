"""--manifest on GCS: ranged reads of a gs:// manifest, and a real submission of a --manifest job to the Dataflow
stand-in (tests/dataflow_service.py), whose staged graph keeps the rule of no single-element stage doing
per-image work."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from tests.dataflow_dry_run import BOUNDED_SIDE_INPUTS, assert_single_element_stages_are_bounded, pipeline_proto
from tests.dataflow_jobs import PROJECT, REGION, assert_complete_dataset, job_id_of, launch
from tests.gcs_fixtures import NO_AUTH

BUCKET = "dataflow-manifest"
IMAGE = "europe-docker.pkg.dev/test-project/r/image-tfrecords:1"

# What a --manifest job reads on one worker besides the folder job's bounded side inputs.
MANIFEST_BOUNDED_SIDE_INPUTS = {
    **BOUNDED_SIDE_INPUTS,
    "ReadManifest/Read/AllCounts": "the row counts of the manifest's ranges as one list: one per 64 MiB",
    "ReadManifest/Read/RangeStarts": "one (rows before, CSV state, lines before) per 64 MiB range of the manifest",
    "ReadManifest/SummariseRows": "one small dict: the count of rows that span lines, and the first ten",
    "ReadManifest/ClassList": "the distinct labels and their counts as one list: one per class",
    "ReadManifest/ClassNames": "the class names: one per class",
}
MANIFEST_PER_IMAGE_STEPS = ("ReadManifest/Read/ReadRows", "ReadManifest/Read/CountRows", "ReadManifest/ParseRows",
                            "ReadManifest/ByPath",
                            "ReadManifest/FirstOfPath", "ReadManifest/Label", "ReadManifest/RowLabels",
                            "ReadManifest/CountLabels", "ReadManifest/SettleGroups",
                            "AssignShards/PlaceImages", "AssignShards/RankStraddlers", "WriteShards/ConvertChunks",
                            "WriteShards/AssembleShards")


@pytest.fixture(scope="module")
def manifest(gcs_emulator, tmp_path_factory):
    """gs://dataflow-manifest/list.csv: 12 images below photos/ (relative paths), a quoted field with line
    breaks, a row without a label (row 5) and a path listed twice (row 13)."""
    bucket = gcs_emulator.create_bucket(BUCKET)
    local = tmp_path_factory.mktemp("manifest-photos")
    names = [f"p{i:02d}.png" for i in range(12)]
    for i, name in enumerate(names):
        Image.new("RGB", (24 + i, 20), (20 * i, 90, 200 - 10 * i)).save(local / name)
    assert gcs_emulator.upload_tree(local, f"{bucket}/photos") == 12
    rows = ["path,label,note"]
    for i, name in enumerate(names):
        label = "" if i == 4 else ("cat", "dog", "owl")[i % 3]
        note = '"two\nlines"' if i == 2 else f"n{i}"
        rows.append(f"photos/{name},{label},{note}")
    rows.append(f"photos/{names[0]},cat,again")
    return gcs_emulator.write(f"{bucket}/list.csv", "\n".join(rows) + "\n")


def _errors_of(gcs_emulator, output):
    return sorted((e["reason"], e["detail"]) for e in map(json.loads, gcs_emulator.read(
        f"{output}/errors.jsonl").decode().splitlines()))


EXPECTED_ERRORS = [
    ("manifest_duplicate_path", "row 13: the path is listed again, first in row 1; the first row is kept"),
    ("manifest_missing_label", "row 5: no label for 'photos/p04.png'"),
]


@pytest.mark.timeout(300)
def test_a_gs_manifest_cut_into_many_ranges_reads_every_row_once(gcs_emulator, manifest, tmp_path, monkeypatch):
    """Ranged reads through FileSystems (open + seek) on GCS: 40-byte ranges, the sequential row numbers."""
    from tests.datasets import convert_manifest as _run
    from tests.datasets import error_rows as _errors
    from transforms.inputs import rows

    monkeypatch.setattr(rows, "RANGE_BYTES", 40)
    out = tmp_path / "out"
    assert _run(manifest, out, NO_AUTH) == 0
    assert sorted((e["reason"], e["detail"]) for e in _errors(out)) == EXPECTED_ERRORS
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == ["cat", "dog", "owl"]
    assert (info["files"]["found"], info["files"]["written"]) == (13, 11)


@pytest.mark.timeout(600)
def test_a_manifest_job_submitted_to_dataflow_writes_the_dataset(gcs_emulator, dataflow_api, manifest):
    """`python -m pipeline.main --manifest=gs://... --runner=DataflowRunner`: the job is submitted, the stand-in
    runs its staged graph, the dataset is complete, with the class names found in the job."""
    output = f"gs://{BUCKET}/out"
    result = launch(gcs_emulator, f"--manifest={manifest}", f"--output_dir={output}", "--runner=DataflowRunner",
                    f"--project={PROJECT}", f"--region={REGION}", f"--temp_location=gs://{BUCKET}/tmp",
                    f"--dataflow_endpoint={dataflow_api.endpoint}", f"--sdk_container_image={IMAGE}", NO_AUTH,
                    "--image_size=32")
    assert result.returncode == 0, result.stderr
    job = dataflow_api.jobs[job_id_of(result)]
    assert job.state == "JOB_STATE_DONE"
    assert job.options["manifest"] == manifest
    assert "Found 13 files: 11 written, 2 rejected, 0 skipped." in result.stdout
    info = assert_complete_dataset(gcs_emulator, output, images=11)
    assert info["class_names"] == ["cat", "dog", "owl"]
    assert gcs_emulator.read(f"{output}/labels.txt") == b"cat\ndog\nowl\n"
    assert _errors_of(gcs_emulator, output) == EXPECTED_ERRORS

    # The staged graph: no stage that starts from one element reads the manifest's rows or a per-row side input.
    proto = pipeline_proto(gcs_emulator, job.options["staging_location"])
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert {"ReadManifest/Read/Ranges", "ReadManifest/Read/CountRows", "ReadManifest/Read/ReadRows",
            "ReadManifest/ParseRows", "ReadManifest/ClassNames",
            "PublishDataset"} <= names
    assert not {n for n in names if n.startswith(("ListImages", "AssignLabels"))}
    single = assert_single_element_stages_are_bounded(proto, MANIFEST_PER_IMAGE_STEPS, MANIFEST_BOUNDED_SIDE_INPUTS)
    assert any("ReadManifest/Read/Ranges" in x.unique_name for s in single for x in s.transforms)
