"""Jobs submitted to the Dataflow stand-in (tests/dataflow_service.py): their flags, launch, job id and dataset."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.conftest import REPO
from tests.gcs_fixtures import NO_AUTH

BUCKET = "dataflow-jobs"
PROJECT, REGION = "test-project", "europe-west4"
IMAGE = "europe-docker.pkg.dev/test-project/r/image-tfrecords:1"  # workers' image: no package to build
CREATED = re.compile(r"^Created job with id: \[(?P<id>[^\]]+)\]$", re.MULTILINE)  # what Airflow's hook parses


def dataflow_args(dataflow_api, photos, output_dir, *extra):
    """The flags of a DataflowRunner job on the stand-in, from `photos` to `output_dir`, then `extra`."""
    return [f"--input_dir={photos}", f"--output_dir={output_dir}", "--runner=DataflowRunner", f"--project={PROJECT}",
            f"--region={REGION}", f"--temp_location=gs://{BUCKET}/tmp", f"--dataflow_endpoint={dataflow_api.endpoint}",
            f"--sdk_container_image={IMAGE}", NO_AUTH, "--image_size=32", *extra]


def launch(gcs_emulator, *args, env=None, timeout=600, fresh=False):
    """`python -m pipeline.main ARGS`: called in this process (`run_tool`: 2-3 s of CPU less a launch, Beam and the
    Dataflow client imported once), or as a user runs it, in a fresh interpreter, with `fresh` or `env` given. The
    tests of a submission's whole console and of the "one line" contract launch fresh; so do run_dataflow.sh's."""
    if not fresh and env is None:
        from tests.conftest import run_tool

        return run_tool("pipeline.main", *args)
    return subprocess.run([sys.executable, "-m", "pipeline.main", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **gcs_emulator.env, **(env or {})))


def run_template_job(dataflow_api, template) -> str:
    """Submit the job a Flex Template launch wrote (`template`, its JSON file) to the Dataflow stand-in with the real
    client, as the Flex Template service does, and wait for it: its final state."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import dataflow_v1beta3

    client = dataflow_v1beta3.JobsV1Beta3Client(credentials=AnonymousCredentials(), transport="rest",
                                                client_options={"api_endpoint": dataflow_api.endpoint})
    created = client.create_job(request=dataflow_v1beta3.CreateJobRequest(
        project_id=PROJECT, location=REGION, job=dataflow_v1beta3.Job.from_json(template.read_text(),
                                                                                ignore_unknown_fields=True)))
    return dataflow_api.wait(created.id).state


def job_id_of(result) -> str:
    """The job id in a launch's "Created job with id: [...]" line (the one Airflow's hook parses)."""
    match = CREATED.search(result.stdout)
    assert match, result.stdout + result.stderr
    return match["id"]


def assert_complete_dataset(gcs_emulator, output_dir: str, images: int = 12) -> dict:
    """image_tfrecords.json, every shard it lists and nothing of a run left over: no lock, no temporary object."""
    names = gcs_emulator.list_names(output_dir)
    info = json.loads(gcs_emulator.read(f"{output_dir}/image_tfrecords.json"))
    assert info["files"]["written"] == images
    shards = {s["file"] for split in info["splits"].values() for s in split["shards"]}
    assert set(names) == shards | {"image_tfrecords.json", "labels.txt", "features.json", "errors.jsonl",
                                   "dataset_info.json", "label.labels.txt", *info["sources"]["files"]}, names
    assert info["sources"]["files"]  # every run lists its records, so that the dataset can grow
    return info
