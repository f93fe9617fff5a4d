"""A stand-in of Dataflow's Flex Template launcher, for tests: it launches a template as the real one does.

The real launcher (the `python_template_launcher` binary of the template image) runs the container's
program, `FLEX_TEMPLATE_PYTHON_PY_FILE`, with the template's parameters as `--name=value` flags and the
launch request's Dataflow options, among them `--template_location`, the job file it then reads. The
program must write the job description there (Beam's DataflowRunner does, instead of submitting); the
launcher then submits that job. A program that fails, or exits 0 without writing the job file, is a failed
launch ("Failed to read the job file : ... Unable to open template file"): the scheduler sees an error.

Here the job file is an object in the GCS emulator, as on Dataflow (`.../template_launches/<id>/job_object`),
and the job is submitted to the Dataflow REST stand-in (tests/dataflow_service.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from unittest import mock

from tests.dataflow_service import REPO
from tests.gcs_fixtures import NO_AUTH

LAUNCH_PY = os.path.join(REPO, "dataflow", "launch.py")


@dataclass
class Launch:
    ok: bool  # what the launcher reports: the job was submitted
    error: str | None  # its error when not
    job_id: str | None
    program: subprocess.CompletedProcess  # the program's own run: exit code, stdout, stderr


def _in_process(args: list[str], env: dict) -> subprocess.CompletedProcess:
    """dataflow/launch.py's `main_of(run)` called here, from / and with `env` set, as `run_tool` calls a tool."""
    from tests.conftest import run_tool

    with mock.patch.dict(os.environ, env), contextlib.chdir("/"):
        done = run_tool("pipeline.main", *args)
    done.args = [sys.executable, LAUNCH_PY, *args]
    return done


def flex_launch(gcs_emulator, dataflow_api, parameters: dict, *, project: str, region: str, bucket: str,
                job_name: str, image: str, drop_labels: bool = False) -> Launch:
    """Launch the template with `parameters` as the Flex launcher does; returns what it reports.

    The program, dataflow/launch.py (`main_of(run)`, as `python -m pipeline.main`), runs in this process from
    the container's working folder with the launcher's environment (2-3 s of CPU less a launch);
    tests/test_dataflow_submit.py runs it as the launcher does, `python launch.py ARGS` in a fresh interpreter.

    `drop_labels`: the submitted job carries none of the labels the program set (a launch whose labels were
    replaced, such as by the request's own additionalUserLabels), so that only the lock can tell its run.
    """
    launch_id = uuid.uuid4().hex[:12]
    job_file = f"gs://{bucket}/staging/template_launches/{launch_id}/job_object"
    args = [f"--{name}={value}" for name, value in parameters.items()]
    args += [f"--project={project}", f"--region={region}", f"--temp_location=gs://{bucket}/tmp",
             f"--staging_location=gs://{bucket}/staging", f"--sdk_container_image={image}",
             f"--dataflow_endpoint={dataflow_api.endpoint}", NO_AUTH, f"--template_location={job_file}",
             f"--job_name={job_name}"]
    program = _in_process(args, dict(gcs_emulator.env, FLEX_TEMPLATE_PYTHON_PY_FILE=LAUNCH_PY))
    if program.returncode != 0:
        return Launch(False, f"Template launch failed: the program exited {program.returncode}", None, program)
    try:
        job = json.loads(gcs_emulator.read(job_file))
    except Exception as e:  # noqa: BLE001  (what the launcher reports of any missing or unreadable job file)
        return Launch(False, f"Failed to read the job file : {job_file} with error message: Unable to open "
                             f"template file ({type(e).__name__})", None, program)
    if drop_labels:
        job.pop("labels", None)
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import dataflow_v1beta3

    client = dataflow_v1beta3.JobsV1Beta3Client(credentials=AnonymousCredentials(), transport="rest",
                                                client_options={"api_endpoint": dataflow_api.endpoint})
    created = client.create_job(request=dataflow_v1beta3.CreateJobRequest(
        project_id=project, location=region,
        job=dataflow_v1beta3.Job.from_json(json.dumps(job), ignore_unknown_fields=True)))
    return Launch(True, None, created.id, program)
