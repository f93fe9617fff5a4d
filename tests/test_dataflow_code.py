"""The launcher and the Dataflow workers run the same code (issue 29: a worker image built from other code).

An image that dataflow/build_template.sh tags declares its code in the tag: the launcher compares it before
it submits anything. Any other image is checked by the job's first step on the workers, which fails the
job with one line.
"""

from __future__ import annotations

import os
import shutil

import pytest

from pipeline.code_version import code_hash, code_identity, image_identity
from tests.conftest import REPO
from tests.dataflow_jobs import BUCKET, dataflow_args, job_id_of, launch
from tests.dataflow_service import upload_photos

REGISTRY = "europe-docker.pkg.dev/test-project/r/image-tfrecords"


@pytest.fixture(scope="module")
def photos(gcs_emulator, tmp_path_factory):
    """12 small images at gs://dataflow-jobs/code-photos (the bucket test_dataflow_submit's jobs use)."""
    return upload_photos(gcs_emulator, tmp_path_factory.mktemp("code-photos"), f"gs://{BUCKET}/code-photos")


def test_the_code_identity_follows_every_python_file_of_the_packages(tmp_path):
    for package in ("pipeline", "transforms"):
        shutil.copytree(os.path.join(REPO, package), tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    assert code_identity(str(tmp_path)) == code_identity()
    (tmp_path / "pipeline" / "__pycache__").mkdir(exist_ok=True)
    (tmp_path / "pipeline" / "__pycache__" / "x.py").write_text("ignored")
    (tmp_path / "transforms" / "notes.txt").write_text("not code")
    assert code_hash(str(tmp_path)) == code_hash()
    with open(tmp_path / "transforms" / "write.py", "a") as f:
        f.write("\n# changed\n")
    assert code_hash(str(tmp_path)) != code_hash()
    version = code_identity().rsplit("-", 1)[0]
    assert version == __import__("pipeline").__version__


@pytest.mark.parametrize("image, declared", [
    (f"{REGISTRY}:0.1.0-0123456789ab", "0.1.0-0123456789ab"),
    (f"{REGISTRY}:1", None),
    (f"{REGISTRY}:latest", None),
    (f"{REGISTRY}@sha256:{'a' * 64}", None),
    ("localhost:5000/image-tfrecords", None),  # a registry port is no tag
    ("localhost:5000/image-tfrecords:2.0.0rc1-abcdefabcdef", "2.0.0rc1-abcdefabcdef"),
])
def test_an_image_declares_its_code_in_the_tag_build_template_sh_gives_it(image, declared):
    assert image_identity(image) == declared


def test_build_template_sh_tags_the_image_with_the_code_identity():
    from tests.dataflow_dry_run import BUILD_SCRIPT, run_script

    env = {name: value for name, value in os.environ.items() if name != "TAG"}
    result = run_script(BUILD_SCRIPT, "--dry_run", env=dict(env, PROJECT="p", REGION="us-central1", BUCKET="b"),
                        timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"image: us-central1-docker.pkg.dev/p/image-tfrecords/image-tfrecords:{code_identity()}\n" in result.stdout


@pytest.mark.timeout(300)
def test_an_image_tagged_with_other_code_stops_the_launch_before_anything_is_submitted(gcs_emulator, dataflow_api,
                                                                                       photos):
    output = f"gs://{BUCKET}/code-check/out"
    other = f"{REGISTRY}:0.0.9-0123456789ab"
    args = [a for a in dataflow_args(dataflow_api, photos, output)
            if not a.startswith("--sdk_container_image")]
    result = launch(gcs_emulator, *args, f"--sdk_container_image={other}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: --sdk_container_image {other} holds other code (0.0.9-0123456789ab) than this launcher "
        f"({code_identity()}): its workers would convert with other rules; rebuild the image from this code "
        "(dataflow/build_template.sh image), or launch from the code it was built from"]
    assert dataflow_api.jobs == {} and dataflow_api.requests == []  # nothing was submitted
    assert gcs_emulator.list_names(output) == []  # nor locked

    same = launch(gcs_emulator, *args, f"--sdk_container_image={REGISTRY}:{code_identity()}", "--dry_run=True")
    assert same.returncode == 0, same.stderr
    assert "Dry run: job" in same.stdout


@pytest.mark.timeout(400)
def test_workers_that_run_other_code_fail_the_job_with_one_line(gcs_emulator, dataflow_api, photos, tmp_path):
    """An image of another tag, built from other code: the job's first step on a worker finds it and fails the job."""
    workers = tmp_path / "worker-image"
    for package in ("pipeline", "transforms"):
        shutil.copytree(os.path.join(REPO, package), workers / package, ignore=shutil.ignore_patterns("__pycache__"))
    with open(workers / "transforms" / "images" / "imaging.py", "a") as f:
        f.write("\n# built from another commit\n")
    dataflow_api.worker_code = str(workers)
    output = f"gs://{BUCKET}/other-code"
    # --verbose: the launcher waits with Beam's own wait, which logs the job's messages as they come.
    result = launch(gcs_emulator, *dataflow_args(dataflow_api, photos, output, "--verbose"))  # the image's tag: "1"

    assert result.returncode == 1
    assert "WorkerCodeMismatch: the Dataflow workers run other code" in result.stderr  # the job's message, logged
    job = dataflow_api.jobs[job_id_of(result)]
    assert job.state == "JOB_STATE_FAILED"
    worker_lines = [line for message in job.messages for line in message["messageText"].splitlines()
                    if "WorkerCodeMismatch" in line]
    assert worker_lines, job.messages
    assert (f"WorkerCodeMismatch: the Dataflow workers run other code ({code_identity(str(workers))}) than the "
            f"launcher that planned this job ({code_identity()}): give --sdk_container_image an image built from "
            "the launcher's code") in worker_lines[-1]
    assert "image_tfrecords.json" not in gcs_emulator.list_names(output)
