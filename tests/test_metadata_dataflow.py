"""--metadata on Dataflow: the graph that run_dataflow.sh stages for class folders joined to a gs:// metadata file
keeps the rule of no single-element stage doing per-image (or per-row) work."""

from __future__ import annotations

import os
import re

import pytest

from tests.test_dataflow import (
    BOUNDED_SIDE_INPUTS,
    JOB_ENV,
    SCRIPT,
    _pipeline_proto,
    assert_single_element_stages_are_bounded,
    run_script,
)

BUCKET = "dataflow-metadata"

METADATA_BOUNDED_SIDE_INPUTS = {
    **BOUNDED_SIDE_INPUTS,
    "JoinMetadata/ReadMetadata/AllCounts": "the row counts of the file's ranges as one list: one per 64 MiB",
    "JoinMetadata/ReadMetadata/RangeStarts": "one (rows before, CSV state) pair per 64 MiB range",
    "JoinMetadata/SummariseMetadata": "one dict: the join's counts and the first 10 rows of each kind",
}
METADATA_PER_IMAGE_STEPS = ("ListImages/ListFolders", "ListImages/ListParts", "ListImages/FilterByName",
                            "AssignLabels/",
                            "JoinMetadata/ReadMetadata/ReadRows", "JoinMetadata/ReadMetadata/CountRows",
                            "JoinMetadata/KeyRows", "JoinMetadata/ByRelpath", "JoinMetadata/Join",
                            "AssignShards/PlaceImages", "AssignShards/RankStraddlers", "WriteShards/ConvertAndWrite")


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
    proto = _pipeline_proto(gcs_emulator, staging)
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert {"JoinMetadata/ReadMetadata/Ranges", "JoinMetadata/ReadMetadata/ReadRows", "JoinMetadata/Join",
            "JoinMetadata/GroupByRelpath"} <= names
    single = assert_single_element_stages_are_bounded(proto, METADATA_PER_IMAGE_STEPS, METADATA_BOUNDED_SIDE_INPUTS)
    assert any("JoinMetadata/ReadMetadata/Ranges" in x.unique_name for s in single for x in s.transforms)
