"""--metadata on Dataflow: the graph that run_dataflow.sh stages for class folders joined to a gs:// metadata file
keeps the rule of no single-element stage doing per-image (or per-row) work."""

from __future__ import annotations

import os
import re

import pytest

from tests.dataflow_dry_run import (
    BOUNDED_SIDE_INPUTS,
    JOB_ENV,
    SCRIPT,
    assert_single_element_stages_are_bounded,
    pipeline_proto,
    run_script,
)

BUCKET = "dataflow-metadata"

METADATA_BOUNDED_SIDE_INPUTS = {
    **BOUNDED_SIDE_INPUTS,
    "JoinMetadata/ReadMetadata/AllCounts": "the row counts of the file's ranges as one list: one per 64 MiB",
    "JoinMetadata/ReadMetadata/RangeStarts": "one (rows before, CSV state) pair per 64 MiB range",
    "JoinMetadata/SummariseMetadata": "one dict: the join's counts and the first 10 rows of each kind",
}
METADATA_PER_IMAGE_STEPS = ("ListImages/ListFolders", "ListImages/ListParts", "ListImages/ListTopParts",
                            "ListImages/FilterByName",
                            "AssignLabels/",
                            "JoinMetadata/ReadMetadata/ReadRows", "JoinMetadata/ReadMetadata/CountRows",
                            "JoinMetadata/KeyRows", "JoinMetadata/ByRelpath", "JoinMetadata/Join",
                            "AssignShards/PlaceImages", "AssignShards/RankStraddlers", "WriteShards/ConvertChunks",
                            "WriteShards/AssembleShards")


@pytest.mark.timeout(300)
def test_a_metadata_job_stages_no_per_row_work_on_one_worker(gcs_emulator, tmp_path):
    from pipeline.sample_data import generate_dataset

    bucket = gcs_emulator.create_bucket(BUCKET)
    tree = tmp_path / "photos"
    generate_dataset(str(tree), images_per_class=2, seed=3, min_side=32, max_side=48)
    gcs_emulator.upload_tree(tree, f"{bucket}/photos")
    rows = ["path,score"] + [f"{p.relative_to(tree).as_posix()},0.5" for p in sorted(tree.rglob("*.*"))]
    metadata = gcs_emulator.write(f"{bucket}/meta.csv", "\n".join(rows) + "\n")
    result = run_script(SCRIPT, f"--input_dir={bucket}/photos", f"--output_dir={bucket}/out",
                        f"--metadata={metadata}", "--features=score:float", "--dry_run", "--image_size=32",
                        env=dict(os.environ, **gcs_emulator.env, **{**JOB_ENV, "BUCKET": BUCKET}))
    assert result.returncode == 0, result.stderr
    staging = re.search(r"staged to (gs://\S+): ", result.stdout).group(1)
    proto = pipeline_proto(gcs_emulator, staging)
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert {"JoinMetadata/ReadMetadata/Ranges", "JoinMetadata/ReadMetadata/ReadRows", "JoinMetadata/Join",
            "JoinMetadata/GroupByRelpath"} <= names
    single = assert_single_element_stages_are_bounded(proto, METADATA_PER_IMAGE_STEPS, METADATA_BOUNDED_SIDE_INPUTS)
    assert any("JoinMetadata/ReadMetadata/Ranges" in x.unique_name for s in single for x in s.transforms)


@pytest.mark.timeout(600)
def test_a_metadata_job_submitted_to_dataflow_writes_the_features(gcs_emulator, dataflow_api, tmp_path):
    """`python -m pipeline.main --metadata=gs://... --runner=DataflowRunner`: the job is submitted, the stand-in
    runs its staged graph, and every record holds its row's typed feature; the image without a row is reported."""
    import json

    from PIL import Image

    from tests.dataflow_jobs import PROJECT, REGION, assert_complete_dataset, job_id_of, launch
    from tests.gcs_fixtures import NO_AUTH
    from transforms.base.examples import Example
    from transforms.base.tfrecord import iter_records

    bucket = gcs_emulator.create_bucket(f"{BUCKET}-job")
    tree = tmp_path / "photos"
    for c, cls in enumerate(("cat", "dog")):
        (tree / cls).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (24, 20), (80 * c, 40 * i, 90)).save(tree / cls / f"{i}.png")
    gcs_emulator.upload_tree(tree, f"{bucket}/photos")
    rows = ["path,score"] + [f"{cls}/{i}.png,{c}.{i}" for c, cls in enumerate(("cat", "dog")) for i in range(3)
                             if (cls, i) != ("dog", 2)]
    metadata = gcs_emulator.write(f"{bucket}/meta.csv", "\n".join(rows) + "\n")
    output = f"{bucket}/out"
    result = launch(gcs_emulator, f"--input_dir={bucket}/photos", f"--output_dir={output}",
                    f"--metadata={metadata}", "--features=score:float", "--validation_split=0",
                    "--runner=DataflowRunner", f"--project={PROJECT}", f"--region={REGION}",
                    f"--temp_location={bucket}/tmp", f"--dataflow_endpoint={dataflow_api.endpoint}",
                    "--sdk_container_image=europe-docker.pkg.dev/test-project/r/image-tfrecords:1", NO_AUTH,
                    "--image_size=16")
    assert result.returncode == 0, result.stderr
    job = dataflow_api.jobs[job_id_of(result)]
    assert job.state == "JOB_STATE_DONE" and job.options["metadata"] == metadata
    assert "Found 6 files: 5 written, 0 rejected, 1 skipped." in result.stdout
    info = assert_complete_dataset(gcs_emulator, output, images=5)
    errors = [json.loads(line) for line in gcs_emulator.read(f"{output}/errors.jsonl").decode().splitlines()]
    assert [(e["relpath"], e["reason"]) for e in errors] == [("dog/2.png", "metadata_missing")]
    scores = {}
    for shard in info["splits"]["train"]["shards"]:
        local = tmp_path / shard["file"]
        local.write_bytes(gcs_emulator.read(f"{output}/{shard['file']}"))
        for raw in iter_records(str(local)):
            feature = Example.FromString(raw).features.feature
            scores[feature["source_path"].bytes_list.value[0].decode()] = round(feature["score"].float_list.value[0], 3)
    assert scores == {"cat/0.png": 0.0, "cat/1.png": 0.1, "cat/2.png": 0.2, "dog/0.png": 1.0, "dog/1.png": 1.1}
