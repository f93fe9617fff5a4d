"""Flex Template launches as a scheduler makes them, through a stand-in of the Flex launcher (tests/flex_launcher.py).

The stand-in runs dataflow/launch.py as the template launcher does, reads the job file the program wrote
and submits it to the Dataflow REST stand-in, whose jobs run on Beam's local runner against the GCS
emulator. What is checked is what the scheduler sees (a launch that succeeded or failed) and what
happens to the output folder: a retry never deletes the files of a run whose job is not known to have ended.
"""

from __future__ import annotations

import json

import pytest

from tests.dataflow_jobs import IMAGE, PROJECT, REGION, assert_complete_dataset
from tests.dataflow_service import metadata_server, upload_photos
from tests.flex_launcher import flex_launch

BUCKET = "flex-launches"

LOCK = ".image-tfrecords.lock"


@pytest.fixture(scope="module")
def photos(gcs_emulator, tmp_path_factory):
    """12 small images in four class folders at gs://flex-launches/photos."""
    return upload_photos(gcs_emulator, tmp_path_factory.mktemp("flex-photos"), f"gs://{BUCKET}/photos")


def launch(gcs_emulator, dataflow_api, output_dir: str, job_name: str, **extra):
    drop_labels = extra.pop("drop_labels", False)
    parameters = {"input_dir": f"gs://{BUCKET}/photos", "output_dir": output_dir, "image_size": "32", **extra}
    return flex_launch(gcs_emulator, dataflow_api, parameters, project=PROJECT, region=REGION, bucket=BUCKET,
                       job_name=job_name, image=IMAGE, drop_labels=drop_labels)


def age_lock(gcs_emulator, output_dir: str, created: str = "2024-01-31T03:00:00Z") -> dict:
    """The lock as if its launch were long ago (a scheduler's retry hours later)."""
    lock = json.loads(gcs_emulator.read(f"{output_dir}/{LOCK}"))
    gcs_emulator.write(f"{output_dir}/{LOCK}", json.dumps({**lock, "created": created}))
    return lock


@pytest.mark.timeout(400)
def test_a_retry_never_takes_over_a_lock_whose_job_is_not_known_to_have_ended(gcs_emulator, dataflow_api, photos,
                                                                               monkeypatch):
    """The job lost its run label and records no job id yet; hours later a retry is refused and deletes nothing."""
    output = f"gs://{BUCKET}/flex-held"
    dataflow_api.outcome = "hold"  # queued: no worker has run a step of it yet
    first = launch(gcs_emulator, dataflow_api, output, "image-tfrecords-nightly", drop_labels=True)
    assert first.ok, first.program.stderr
    lock = age_lock(gcs_emulator, output)
    assert lock.get("job_id") is None and lock["job_name"] == "image-tfrecords-nightly"
    gcs_emulator.write(f"{output}/.image-tfrecords-tmp/{lock['run_id']}/pieces/p-0", b"the running job's")
    before = gcs_emulator.list_names(output)

    retry = launch(gcs_emulator, dataflow_api, output, "image-tfrecords-nightly-retry", overwrite="true")
    assert not retry.ok and retry.program.returncode == 2
    errors = [line for line in retry.program.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, retry.program.stderr
    assert errors[0].startswith(f"error: --output_dir {output} is being written by a Dataflow launch (job name "
                                "image-tfrecords-nightly)")
    assert "no job id" in errors[0] and f"delete {output}/{LOCK}" in errors[0]
    assert "Traceback" not in retry.program.stderr
    assert gcs_emulator.list_names(output) == before  # the running job's files are all there
    assert list(dataflow_api.jobs) == [first.job_id]

    # Once a worker runs the job's first step, the lock holds its id (here the step runs in this process).
    from transforms.output.lock import record_job_id

    with metadata_server(first.job_id) as host:
        monkeypatch.setenv("GCE_METADATA_HOST", host)
        record_job_id(None, output, lock["run_id"])
    assert json.loads(gcs_emulator.read(f"{output}/{LOCK}"))["job_id"] == first.job_id
    while_running = launch(gcs_emulator, dataflow_api, output, "image-tfrecords-nightly-retry")
    assert not while_running.ok
    assert f"is being written by Dataflow job {first.job_id} in project {PROJECT}" in while_running.program.stderr
    assert gcs_emulator.list_names(output) == before

    # The job fails: its end is known, and the next retry takes over and makes the dataset.
    dataflow_api._end(dataflow_api.jobs[first.job_id], "JOB_STATE_FAILED", "a worker ran out of memory")
    dataflow_api.outcome = "run"
    after = launch(gcs_emulator, dataflow_api, output, "image-tfrecords-nightly-retry")
    assert after.ok, after.program.stderr
    assert f"its Dataflow job {first.job_id} ended (JOB_STATE_FAILED)" in after.program.stderr
    assert dataflow_api.wait(after.job_id).state == "JOB_STATE_DONE"
    assert_complete_dataset(gcs_emulator, output)  # the dead job's leftovers went, the lock was released


@pytest.mark.timeout(400)
def test_a_lock_whose_labelled_job_failed_before_it_started_is_taken_over(gcs_emulator, dataflow_api, photos):
    """A job that failed before any worker ran (no job id recorded) is found by its run label among ended jobs."""
    output = f"gs://{BUCKET}/flex-failed"
    dataflow_api.outcome = "fail"
    first = launch(gcs_emulator, dataflow_api, output, "image-tfrecords-first")
    assert first.ok, first.program.stderr
    assert dataflow_api.jobs[first.job_id].state == "JOB_STATE_FAILED"
    dataflow_api.outcome = "run"
    retry = launch(gcs_emulator, dataflow_api, output, "image-tfrecords-retry")
    assert retry.ok, retry.program.stderr
    assert f"its Dataflow job {first.job_id} ended (JOB_STATE_FAILED)" in retry.program.stderr
    assert dataflow_api.wait(retry.job_id).state == "JOB_STATE_DONE"
    info = assert_complete_dataset(gcs_emulator, output)
    assert info["files"]["written"] == 12


@pytest.mark.timeout(400)
def test_a_flex_launch_with_if_exists_skip_is_a_successful_launch_of_a_job_that_does_nothing(
        gcs_emulator, dataflow_api, photos):
    output = f"gs://{BUCKET}/flex-skip"
    first = launch(gcs_emulator, dataflow_api, output, "image-tfrecords-made", if_exists="skip")
    assert first.ok, first.program.stderr
    assert dataflow_api.wait(first.job_id).state == "JOB_STATE_DONE"
    assert_complete_dataset(gcs_emulator, output)
    before = {name: gcs_emulator.read(f"{output}/{name}") for name in gcs_emulator.list_names(output)}

    again = launch(gcs_emulator, dataflow_api, output, "image-tfrecords-again", if_exists="skip")
    assert again.ok, again.error  # the launcher found a job file and submitted it
    assert again.program.returncode == 0
    assert "already holds a complete dataset made with the same options (12 images" in again.program.stdout
    assert "a job that does nothing" in again.program.stdout
    job = dataflow_api.wait(again.job_id)
    assert job.state == "JOB_STATE_DONE"
    assert job.options.get("num_workers") == 1 and job.options.get("max_num_workers") == 1
    after = {name: gcs_emulator.read(f"{output}/{name}") for name in gcs_emulator.list_names(output)}
    assert after == before  # nothing written, nothing locked

    # Other options are still refused: a failed launch, with one line.
    other = launch(gcs_emulator, dataflow_api, output, "image-tfrecords-other", if_exists="skip", seed="7")
    assert not other.ok and other.program.returncode == 2
    assert "made with other options (seed: 42 -> 7)" in other.program.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("template, stale", [(False, True), (True, False), (None, False)])
def test_a_dead_launcher_proves_its_lock_stale_only_when_it_submits_its_own_job(dataflow_api, template, stale):
    """A launcher process seen dead on this host, no job with its run label: stale only for a direct submission.

    A template launch's program exits before the template launcher submits its job file, and a lock of an
    earlier version does not say which it was: neither is taken over for a dead process.
    """
    import subprocess
    import sys

    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.cloud import dataflow_lock_stale
    from transforms.output.lock import holder_record

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder = {**holder_record("20240131-030000-0123abcd", "dataflow", project=PROJECT, region=REGION,
                              job_name="image-tfrecords-x", job_id=None),
              "pid": int(ended.stdout), "pid_started": None}
    if template is not None:
        holder["template"] = template
    options = PipelineOptions([f"--dataflow_endpoint={dataflow_api.endpoint}", "--no_auth"])
    reason = dataflow_lock_stale(holder, options)
    if stale:
        assert reason == (f"its launcher, process {holder['pid']} on {holder['host']}, has ended, and no Dataflow "
                          "job carries its run id 20240131-030000-0123abcd")
    else:
        assert reason is None
