"""Real Dataflow submissions, offline: Beam's own Dataflow client against a stand-in of the Dataflow API.

The stand-in (tests/dataflow_service.py) runs each submitted job's staged graph
on Beam's local runner against the GCS emulator, so a job that ends DONE has
really written the dataset. Every command here runs as a user or a scheduler
runs it: `python -m pipeline.main`, `run_dataflow.sh`, the Flex Template entry
point.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.dataflow_jobs import (
    BUCKET,
    IMAGE,
    PROJECT,
    REGION,
    assert_complete_dataset,
    dataflow_args,
    job_id_of,
    launch,
    run_template_job,
)
from tests.dataflow_service import upload_photos
from tests.gcs_fixtures import NO_AUTH


@pytest.fixture(scope="module")
def photos(gcs_emulator, tmp_path_factory):
    """12 small images in four class folders at gs://dataflow-jobs/photos."""
    return upload_photos(gcs_emulator, tmp_path_factory.mktemp("submit-photos"), f"gs://{BUCKET}/photos")


@pytest.mark.timeout(300)
def test_submission_waits_for_the_job_and_prints_the_summary(gcs_emulator, dataflow_api, photos):
    output = f"gs://{BUCKET}/waited"
    result = launch(gcs_emulator, *dataflow_args(dataflow_api, photos, output), fresh=True)

    assert result.returncode == 0, result.stderr
    job_id = job_id_of(result)
    job = dataflow_api.jobs[job_id]
    assert job.state == "JOB_STATE_DONE"
    assert "Found 12 files: 12 written, 0 rejected, 0 skipped." in result.stdout
    assert "Traceback" not in result.stderr
    info = assert_complete_dataset(gcs_emulator, output)
    assert sum(s["records"] for s in info["splits"].values()) == 12
    # The job carries the run id as a label; the run's temporary folder was under it, and is gone.
    run_id = job.request["labels"]["image-tfrecords-run"]
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{8}", run_id)
    assert job.name == f"image-tfrecords-{run_id}"  # no --job_name: named after the run
    assert f"Submitted Dataflow job image-tfrecords-{run_id} ({job_id}) for run {run_id}." in result.stdout


@pytest.mark.timeout(300)
def test_no_wait_returns_at_once_and_a_retry_never_touches_the_running_job(gcs_emulator, dataflow_api, photos):
    """A scheduler's retry of a launch while the first job still runs stops with a clear error and deletes nothing."""
    output = f"gs://{BUCKET}/scheduled"
    dataflow_api.outcome = "hold"  # the job runs until the test lets it finish
    first = launch(gcs_emulator, *dataflow_args(dataflow_api, photos, output, "--no_wait"))
    assert first.returncode == 0, first.stderr
    job_id = job_id_of(first)
    assert "Not waiting for the job" in first.stdout
    assert dataflow_api.jobs[job_id].state == "JOB_STATE_RUNNING"
    lock = json.loads(gcs_emulator.read(f"{output}/.image-tfrecords.lock"))
    assert lock["job_id"] == job_id and lock["runner"] == "dataflow"
    before = gcs_emulator.list_names(output)

    retry = launch(gcs_emulator, *dataflow_args(dataflow_api, photos, output, "--no_wait", "--overwrite"))
    assert retry.returncode == 2
    assert retry.stderr.strip().splitlines()[-1].startswith(
        f"error: --output_dir {output} is being written by Dataflow job {job_id} in project {PROJECT}, region "
        f"{REGION}")
    assert "wait for that job to finish" in retry.stderr
    assert gcs_emulator.list_names(output) == before  # nothing of the running job's was touched
    assert len(dataflow_api.jobs) == 1  # and no second job was created

    dataflow_api.finish(job_id)  # the first job runs now, and completes
    assert dataflow_api.jobs[job_id].state == "JOB_STATE_DONE"
    assert_complete_dataset(gcs_emulator, output)

    # A late retry of the same launch: the dataset is there, made with the same options.
    skipped = launch(gcs_emulator, *dataflow_args(dataflow_api, photos, output, "--no_wait", "--if_exists=skip"))
    assert skipped.returncode == 0, skipped.stderr
    assert "already holds a complete dataset made with the same options (12 images" in skipped.stdout
    assert len(dataflow_api.jobs) == 1
    # The default still refuses, and --if_exists=skip refuses a dataset of other options.
    refused = launch(gcs_emulator, *dataflow_args(dataflow_api, photos, output, "--no_wait"))
    assert refused.returncode == 2 and "already holds a dataset (image_tfrecords.json)" in refused.stderr
    other = launch(gcs_emulator, *dataflow_args(dataflow_api, photos, output, "--if_exists=skip", "--seed=7"))
    assert other.returncode == 2
    assert "made with other options (seed: 42 -> 7)" in other.stderr
    assert len(dataflow_api.jobs) == 1


@pytest.mark.timeout(300)
@pytest.mark.parametrize("outcome, state", [("fail", "FAILED"), ("cancel", "CANCELLED")])
def test_a_job_that_fails_or_is_cancelled_exits_1_with_one_line(gcs_emulator, dataflow_api, photos, outcome, state):
    output = f"gs://{BUCKET}/{outcome}"
    gcs_emulator.write(f"{output}/notes.txt", b"the user's")
    dataflow_api.outcome = outcome
    result = launch(gcs_emulator, *dataflow_args(dataflow_api, photos, output), fresh=True)

    assert result.returncode == 1
    job_id = job_id_of(result)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: Dataflow job {job_id} ended in state {state}, not DONE: no dataset was written to {output} (an "
        f"earlier complete one there is untouched); see the job's errors with: gcloud dataflow jobs show {job_id} "
        f"--region={REGION} --project={PROJECT}, fix them and run the same command again"]
    assert "Traceback" not in result.stderr
    # The lock is given back: the same command can run again at once. The run's plan stays, so that the next
    # launch of the same options resumes what the job converted (tests/test_resume.py): nothing else is left.
    run_id = dataflow_api.jobs[job_id].request["labels"]["image-tfrecords-run"]
    assert gcs_emulator.list_names(output) == [f".image-tfrecords-tmp/{run_id}/plan.json", "notes.txt"]


@pytest.mark.timeout(300)
def test_a_lock_of_a_failed_job_is_taken_over(gcs_emulator, dataflow_api, photos):
    """A job that died leaves its lock behind; the next run asks the service, sees the job ended, and goes on."""
    output = f"gs://{BUCKET}/taken-over"
    dataflow_api.outcome = "hold"
    first = launch(gcs_emulator, *dataflow_args(dataflow_api, photos, output, "--no_wait"))
    job_id = job_id_of(first)
    dataflow_api._end(dataflow_api.jobs[job_id], "JOB_STATE_FAILED", "a worker ran out of memory")
    dead_run = json.loads(gcs_emulator.read(f"{output}/.image-tfrecords.lock"))["run_id"]
    gcs_emulator.write(f"{output}/.image-tfrecords-tmp/{dead_run}/pieces/x", b"x")

    dataflow_api.outcome = "run"
    second = launch(gcs_emulator, *dataflow_args(dataflow_api, photos, output))
    assert second.returncode == 0, second.stderr
    assert f"Took over the lock of {output}: its Dataflow job {job_id} ended (JOB_STATE_FAILED)" in second.stderr
    assert_complete_dataset(gcs_emulator, output)  # the dead job's leftovers are gone too


@pytest.mark.timeout(300)
def test_flex_template_launch_writes_the_job_and_the_launched_job_completes(gcs_emulator, dataflow_api, photos,
                                                                            tmp_path):
    """The Flex Template launcher runs dataflow/launch.py with the parameters and --template_location."""
    output = f"gs://{BUCKET}/flex/{{date}}"
    template = tmp_path / "template-launcher" / "job.json"
    template.parent.mkdir()
    parameters = [f"--input_dir={photos}", f"--output_dir={output}", "--image_size=32", "--run_date=2024-01-31"]
    # What the launcher adds: the Dataflow options of the launch request, and where to write the job.
    launcher_args = [f"--project={PROJECT}", f"--region={REGION}", f"--temp_location=gs://{BUCKET}/tmp",
                     f"--staging_location=gs://{BUCKET}/staging", f"--sdk_container_image={IMAGE}",
                     f"--dataflow_endpoint={dataflow_api.endpoint}", NO_AUTH, f"--template_location={template}",
                     "--job_name=image-tfrecords-scheduled"]
    env = dict(os.environ, **gcs_emulator.env, FLEX_TEMPLATE_PYTHON_PY_FILE=os.path.join(REPO, "dataflow",
                                                                                          "launch.py"))
    result = subprocess.run([sys.executable, os.path.join(REPO, "dataflow", "launch.py"), *parameters,
                             *launcher_args], cwd="/", capture_output=True, text=True, timeout=300, env=env)

    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "Wrote the Dataflow job description (job image-tfrecords-scheduled, run " in result.stdout
    assert f"to {template}; the template launcher submits it." in result.stdout
    assert dataflow_api.jobs == {}  # the launcher submits it, not the program
    job_request = json.loads(template.read_text())
    assert job_request["name"] == "image-tfrecords-scheduled"
    assert job_request["environment"]["sdkPipelineOptions"]["options"]["output_dir"] == output
    dated = f"gs://{BUCKET}/flex/2024-01-31"  # --run_date filled {date}
    assert json.loads(gcs_emulator.read(f"{dated}/.image-tfrecords.lock"))["runner"] == "dataflow"

    # A retry of the launch while the job is being launched stops: the lock is held (no job id yet).
    retry = subprocess.run([sys.executable, os.path.join(REPO, "dataflow", "launch.py"), *parameters,
                            *launcher_args], cwd="/", capture_output=True, text=True, timeout=300, env=env)
    assert retry.returncode == 2
    assert "is being written by a Dataflow launch (job name image-tfrecords-scheduled)" in retry.stderr

    # The template launcher submits the job description; the service runs it.
    assert run_template_job(dataflow_api, template) == "JOB_STATE_DONE"
    assert_complete_dataset(gcs_emulator, dated)  # and the job released the lock


@pytest.mark.timeout(400)
def test_run_dataflow_sh_submits_and_waits(gcs_emulator, dataflow_api, photos):
    output = f"gs://{BUCKET}/scripted"
    env = dict(os.environ, **gcs_emulator.env, PROJECT=PROJECT, REGION=REGION, BUCKET=BUCKET,
               PYTHON=sys.executable)
    result = subprocess.run(["bash", os.path.join(REPO, "run_dataflow.sh"), f"--input_dir={photos}",
                             f"--output_dir={output}", "--image_size=32", f"--sdk_container_image={IMAGE}",
                             f"--dataflow_endpoint={dataflow_api.endpoint}"],
                            cwd=REPO, capture_output=True, text=True, timeout=400, env=env)
    assert result.returncode == 0, result.stderr
    job_id = job_id_of(result)
    job = dataflow_api.jobs[job_id]
    assert job.state == "JOB_STATE_DONE"
    assert re.fullmatch(r"image-tfrecords-\d{8}-\d{6}-[0-9a-f]{4}", job.name)  # the script's job name
    assert job.options["temp_location"].startswith(f"gs://{BUCKET}/dataflow/temp")
    assert "Found 12 files: 12 written" in result.stdout
    assert_complete_dataset(gcs_emulator, output)


@pytest.mark.timeout(300)
def test_no_wait_through_run_dataflow_sh_prints_the_job_id_for_schedulers(gcs_emulator, dataflow_api, photos):
    """Airflow's Dataflow hook finds the job from Beam's 'Created job with id: [ID]' line."""
    output = f"gs://{BUCKET}/airflow"
    dataflow_api.outcome = "hold"
    env = dict(os.environ, **gcs_emulator.env, PROJECT=PROJECT, REGION=REGION, BUCKET=BUCKET,
               PYTHON=sys.executable)
    result = subprocess.run(["bash", os.path.join(REPO, "run_dataflow.sh"), f"--input_dir={photos}",
                             f"--output_dir={output}", f"--sdk_container_image={IMAGE}", "--no_wait",
                             f"--dataflow_endpoint={dataflow_api.endpoint}"],
                            cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert list(dataflow_api.jobs) == [job_id_of(result)]
    assert dataflow_api.only_job().state == "JOB_STATE_RUNNING"


@pytest.mark.timeout(600)
def test_an_append_through_dataflow_converts_only_the_new_images(gcs_emulator, dataflow_api, photos, tmp_path):
    """--if_exists=append on gs://, through the Dataflow stand-in: 8 images, then 4 more; the second job converts
    4, the old shards keep their records under the new total in their names, nothing else is left."""
    from tests.datasets import write_tiny_tree
    from transforms.base.examples import Example
    from transforms.base.tfrecord import iter_records

    write_tiny_tree(tmp_path / "first", {"cat": 4, "dog": 4})
    write_tiny_tree(tmp_path / "more", {"cat": 2, "dog": 2}, start=4)
    photos, output = photos.rsplit("/", 1)[0] + "/grow-photos", photos.rsplit("/", 1)[0] + "/grown"
    assert gcs_emulator.upload_tree(tmp_path / "first", photos) == 8
    args = dataflow_args(dataflow_api, photos, output, "--num_shards=train=2,validation=1")
    first = launch(gcs_emulator, *args)
    assert first.returncode == 0, first.stderr
    before = assert_complete_dataset(gcs_emulator, output, images=8)
    old_bytes = {s["file"]: gcs_emulator.read(f"{output}/{s['file']}") for split in before["splits"].values()
                 for s in split["shards"]}
    assert gcs_emulator.upload_tree(tmp_path / "more", photos) == 4
    grown = launch(gcs_emulator, *args, "--if_exists=append")
    assert grown.returncode == 0, grown.stderr
    info = assert_complete_dataset(gcs_emulator, output, images=12)
    assert info["appends"][-1]["converted"] == 4 and info["appends"][-1]["already_in_dataset"] == 8
    paths = []
    for split, split_info in info["splits"].items():
        shards = split_info["shards"]
        old = before["splits"].get(split, {}).get("shards", [])
        assert [s["file"] for s in shards] == [f"{split}-{i:05d}-of-{len(shards):05d}.tfrecord"
                                               for i in range(len(shards))]
        for old_shard, shard in zip(old, shards, strict=False):  # the old shards, renamed, byte for byte
            assert gcs_emulator.read(f"{output}/{shard['file']}") == old_bytes[old_shard["file"]]
        for shard in shards:
            local = tmp_path / shard["file"]
            local.write_bytes(gcs_emulator.read(f"{output}/{shard['file']}"))
            paths += [Example.FromString(raw).features.feature["source_path"].bytes_list.value[0].decode()
                      for raw in iter_records(str(local))]
    assert sorted(paths) == sorted(f"{c}/img_{i:05d}.jpg" for c in ("cat", "dog") for i in range(6))


@pytest.mark.timeout(300)
def test_a_dataflow_launch_imports_nothing_of_the_local_machinery(gcs_emulator, dataflow_api, photos):
    """pipeline.local (the worker pool, the progress files, the one-line failures of local runs) and the hook that
    memoizes DoFn signatures belong to local runs: a submission loads none of them."""
    output = f"gs://{BUCKET}/no-local"
    code = ("import sys\n"
            "from pipeline.main import main\n"
            "code = main(sys.argv[1:])\n"
            "from apache_beam.transforms import core\n"
            "print('LOCAL', sorted(m for m in sys.modules if m.startswith('pipeline.local')),\n"
            "      getattr(core.get_function_arguments, 'memoized', False), file=sys.stderr)\n"
            "sys.exit(code)\n")
    result = subprocess.run([sys.executable, "-c", code, *dataflow_args(dataflow_api, photos, output, "--no_wait")],
                            cwd=REPO, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, **gcs_emulator.env))
    assert result.returncode == 0, result.stderr[-3000:]
    job_id_of(result)
    assert result.stderr.splitlines()[-1] == "LOCAL [] False"
