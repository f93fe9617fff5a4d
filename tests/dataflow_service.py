"""A stand-in of the Dataflow REST API (v1b3) on loopback, for Beam's own Dataflow client.

Beam's DataflowRunner talks REST to `--dataflow_endpoint=http://localhost:PORT`.
This server answers the calls a submission and a wait make: create a job, get
it, list its messages, list jobs, and update its state (cancel). A job does what
the test says (`outcome`):

* "run" (the default): the service *runs the staged job*: it reads the
  pipeline.pb that the launcher uploaded to the staging folder (on the GCS
  emulator) and executes it on Beam's local FnApiRunner, in a process of its
  own, as Dataflow's workers would (forked from tests/job_host.py, which has
  Beam imported already). The job ends DONE when that succeeds and FAILED, with
  the error as a job message, when it does not.
* "fail": the job ends FAILED with an error message, without running.
* "cancel": the job ends CANCELLED.
* "hold": the job stays RUNNING until the test calls `finish(job_id)` or `cancel`.

With `worker_env={"KILL_AFTER_PIECES": "N"}` a running job's workers exit once N chunks are converted
(tests/killed_after_pieces_main.py): the job ends FAILED midway, as when its workers are lost.

Its workers see a metadata server that gives the job's id (as a Dataflow worker VM's does), and run this
checkout's code, or the code in `worker_code` (a worker image built from other code).

Nothing here reaches the internet: the executor is given the test's GCS emulator.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ACTIVE = ("JOB_STATE_RUNNING", "JOB_STATE_QUEUED", "JOB_STATE_PENDING")
_JOB_PATH = re.compile(r"^/v1b3/projects/(?P<project>[^/]+)/locations/(?P<region>[^/]+)/jobs"
                       r"(?:/(?P<job>[^/:?]+))?(?P<rest>/messages|/metrics)?$")


@dataclass
class StandInJob:
    id: str
    project: str
    region: str
    request: dict  # the Job the client sent
    state: str = "JOB_STATE_QUEUED"
    messages: list[dict] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def name(self) -> str:
        return self.request.get("name", "")

    @property
    def options(self) -> dict:
        return self.request["environment"]["sdkPipelineOptions"]["options"]

    def as_json(self, labels: bool = True) -> dict:
        """The Job resource; without its labels in a summary (every ListJobs answer, GetJob's default view)."""
        return {
            "id": self.id,
            "projectId": self.project,
            "location": self.region,
            "name": self.name,
            "type": self.request.get("type", "JOB_TYPE_BATCH"),
            "currentState": self.state,
            "currentStateTime": _now(),
            "createTime": _now(),
            "clientRequestId": self.request.get("clientRequestId", ""),
            **({"labels": self.request.get("labels", {})} if labels else {}),
        }


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


class DataflowStandIn:
    """The server; `endpoint` is what --dataflow_endpoint takes."""

    def __init__(self, executor_env: dict):
        self.jobs: dict[str, StandInJob] = {}
        self.outcome = "run"
        self.worker_code: str | None = None  # a folder of other pipeline/ and transforms/ for the workers to run
        self.worker_env: dict = {}  # more environment for the workers (KILL_AFTER_PIECES: a job that dies midway)
        self.requests: list[tuple[str, str]] = []  # (method, path) of every call
        self._executor_env = executor_env
        self._lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint = f"http://localhost:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # --- what a test does ---------------------------------------------------------------------------------

    def only_job(self) -> StandInJob:
        assert len(self.jobs) == 1, list(self.jobs)
        return next(iter(self.jobs.values()))

    def wait(self, job_id: str, timeout: float = 300) -> StandInJob:
        job = self.jobs[job_id]
        assert job.done.wait(timeout), f"job {job_id} did not end within {timeout} s (state {job.state})"
        return job

    def finish(self, job_id: str) -> None:
        """Run a held job now (in this thread), as the service would once it got to it."""
        self._execute(self.jobs[job_id])

    # --- the service ----------------------------------------------------------------------------------------

    def _create(self, project: str, region: str, body: dict) -> StandInJob:
        job_id = time.strftime("%Y-%m-%d_%H_%M_%S", time.gmtime()) + "-" + uuid.uuid4().hex[:12]
        job = StandInJob(job_id, project, region, body)
        with self._lock:
            self.jobs[job_id] = job
        outcome = self.outcome
        if outcome == "run":
            job.state = "JOB_STATE_RUNNING"
            threading.Thread(target=self._execute, args=(job,), daemon=True).start()
        elif outcome == "fail":
            self._end(job, "JOB_STATE_FAILED", "Traceback (most recent call last):\n  ...\n"
                      "RuntimeError: the workers could not start (stand-in failure)")
        elif outcome == "cancel":
            self._end(job, "JOB_STATE_CANCELLED")
        else:  # hold
            job.state = "JOB_STATE_RUNNING"
        return job

    def _end(self, job: StandInJob, state: str, error: str | None = None) -> None:
        if error:
            job.messages.append({"id": str(len(job.messages)), "time": _now(), "messageText": error,
                                 "messageImportance": "JOB_MESSAGE_ERROR"})
        job.state = state
        job.done.set()

    def _execute(self, job: StandInJob) -> None:
        """Run the staged graph on Beam's local runner in a process of its own."""
        staging = job.options["staging_location"]
        env = {**os.environ, **self._executor_env, **self.worker_env}
        if self.worker_code:  # the workers' image holds other code: its pipeline/ and transforms/ come first
            env["PYTHONPATH"] = os.pathsep.join([self.worker_code, REPO])
        with metadata_server(job.id) as metadata_host:  # what a worker VM's metadata server says of its job
            env["GCE_METADATA_HOST"] = metadata_host
            if self.worker_code or "KILL_AFTER_PIECES" in env:  # other code, or hooks: an interpreter of its own
                result = subprocess.run([sys.executable, "-m", "tests.dataflow_service", staging],
                                        cwd=self.worker_code or REPO, capture_output=True, text=True, timeout=600,
                                        env=env)
                returncode, stderr = result.returncode, result.stderr
            else:  # this checkout's code: a worker forked from a process with Beam imported (tests/job_host.py)
                from tests.job_host import JobHost

                with tempfile.TemporaryDirectory() as folder:
                    returncode, stderr = JobHost.get().run(staging, env, REPO, os.path.join(folder, "stderr"))
        if returncode == 0:
            self._end(job, "JOB_STATE_DONE")
        else:
            self._end(job, "JOB_STATE_FAILED", stderr[-3000:] or "the stand-in worker failed")

    def _handler(self):
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _not_found(self):
                self._send(404, {"error": {"code": 404, "status": "NOT_FOUND", "message": f"{self.path} not found"}})

            def _route(self, method: str):
                path = self.path.split("?", 1)[0]
                service.requests.append((method, path))
                match = _JOB_PATH.match(path)
                if not match:
                    return self._not_found()
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                job = service.jobs.get(match["job"]) if match["job"] else None
                if match["job"] and job is None:
                    return self._not_found()
                if method == "POST" and not match["job"]:
                    return self._send(200, service._create(match["project"], match["region"], body).as_json())
                if method == "GET" and not match["job"]:
                    # Enums come by name or, from Google's REST clients, by number (enum-encoding=int).
                    query = urllib.parse.parse_qs(self.path.partition("?")[2])
                    wanted = {"ACTIVE": True, "3": True, "TERMINATED": False, "2": False}.get(
                        (query.get("filter") or [""])[0])
                    jobs = [j.as_json(labels=False) for j in service.jobs.values()  # summaries, whatever the view
                            if wanted is None or (j.state in _ACTIVE) == wanted]
                    return self._send(200, {"jobs": jobs})
                if method == "GET" and match["rest"] == "/messages":
                    return self._send(200, {"jobMessages": job.messages})
                if method == "GET" and match["rest"] == "/metrics":
                    return self._send(200, {"metrics": []})
                if method == "GET":  # the labels come with the description (or whole) view only
                    view = (urllib.parse.parse_qs(self.path.partition("?")[2]).get("view") or [""])[0]
                    return self._send(200, job.as_json(labels=view in ("JOB_VIEW_DESCRIPTION", "3", "JOB_VIEW_ALL",
                                                                       "2")))
                if method == "PUT":  # update_job: cancel
                    if body.get("requestedState") == "JOB_STATE_CANCELLED":
                        service._end(job, "JOB_STATE_CANCELLED")
                    return self._send(200, job.as_json())
                return self._not_found()

            def do_GET(self):
                self._route("GET")

            def do_POST(self):
                self._route("POST")

            def do_PUT(self):
                self._route("PUT")

            def log_message(self, *args):
                pass

        return Handler


def upload_photos(gcs_emulator, tree, gs_dir: str) -> str:
    """12 small images in four class folders at `gs_dir` (its bucket made if missing), for jobs to convert."""
    from google.api_core import exceptions

    from pipeline.sample_data import generate_dataset

    try:
        gcs_emulator.create_bucket(gs_dir[len("gs://"):].split("/", 1)[0])
    except exceptions.Conflict:
        pass
    generate_dataset(str(tree), images_per_class=3, seed=5, min_side=32, max_side=64)
    assert gcs_emulator.upload_tree(tree, gs_dir) == 12
    return gs_dir


@contextlib.contextmanager
def metadata_server(job_id: str):
    """A stand-in of a Dataflow worker VM's metadata server: `instance/attributes/job_id` is the job's id.

    Yields its host:port, for GCE_METADATA_HOST (the variable Google's libraries read for that server).
    """
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            found = (self.path == "/computeMetadata/v1/instance/attributes/job_id"
                     and self.headers.get("Metadata-Flavor") == "Google")
            data = job_id.encode() if found else b"not found"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/text")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def dataflow_api(gcs_emulator):
    """A Dataflow stand-in whose jobs run on this machine against the test's GCS emulator."""
    service = DataflowStandIn(gcs_emulator.env)
    try:
        yield service
    finally:
        service.close()


def run_staged_job(staging: str) -> None:
    """What the stand-in's workers do: run the staged pipeline.pb of a job on Beam's local runner."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.portability import python_urns
    from apache_beam.portability.api import beam_runner_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    from pipeline.cloud import skip_credential_lookup

    skip_credential_lookup()  # the emulator needs none
    options = PipelineOptions(["--no_auth"])
    FileSystems.set_options(options)
    with FileSystems.open(FileSystems.join(staging, "pipeline.pb"), compression_type="uncompressed") as f:
        proto = beam_runner_api_pb2.Pipeline.FromString(f.read())
    # The job's environment is Dataflow's worker container; here the workers are this process.
    for environment in proto.components.environments.values():
        environment.urn = python_urns.EMBEDDED_PYTHON
        environment.payload = b""
    result = fn_runner.FnApiRunner().run_via_runner_api(proto, options)
    state = result.wait_until_finish()
    if str(state).rsplit(".", 1)[-1] != "DONE":
        raise RuntimeError(f"the job ended in state {state}")


if __name__ == "__main__":
    if os.environ.get("KILL_AFTER_PIECES"):  # the workers die after converting that many chunks: the job FAILS
        from tests.killed_after_pieces_main import install

        install(lambda: os._exit(3))
    try:  # Beam without the integrations no job uses, as the launcher imports it (worker code may lack it)
        from pipeline import lean_beam
    except ImportError:
        pass
    else:
        lean_beam.import_beam()
    run_staged_job(sys.argv[1])
