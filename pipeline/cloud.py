"""Google Cloud specifics of the launcher: gs:// checks, Dataflow prerequisites, dry runs and job links.

    python -m pipeline.main --runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp \
        --input_dir=gs://B/photos --output_dir=gs://B/tfrecords [--no_wait] [--dry_run=True]

Everything else (listing, reading, writing) goes through Beam's FileSystems,
so local folders and gs:// share one code path; this module only adds what a
cloud run needs on top: checks with one-line messages, the package for the
workers, and what to print about the submitted job.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import logging
import os
import re
import socket
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    TestOptions,
    WorkerOptions,
)

from pipeline.errors import Terminated, UserError
from pipeline.workers import FLEX_TEMPLATE_ENV, is_dataflow
from transforms.base import gcs
from transforms.base.paths import is_gcs

_LOG = logging.getLogger("pipeline")

# Where the package's own setup.py sits in a source checkout (and in the template image).
SETUP_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup.py")
# What a dry run writes next to pipeline.pb: the job request that would have been sent.
DRY_RUN_JOB_FILE = "dataflow_job.json"

_options: PipelineOptions | None = None


def is_dry_run(options: PipelineOptions) -> bool:
    return is_dataflow(options) and bool(options.view_as(TestOptions).dry_run)


def _as_bool(value) -> bool:
    return str(value).strip().lower() not in ("", "0", "false", "no", "none")


def configure(options: PipelineOptions, input_dir: str, output_dir: str) -> None:
    """Prepare file access and, for Dataflow, check and complete the options. Call before any gs:// access.

    Raises:
        UserError: for a Dataflow run without a project, region or gs:// temp_location, or with local folders.
    """
    global _options
    _options = options
    # Launcher-side listing and output checks use the same options (project, impersonation) as the job.
    FileSystems.set_options(options)
    if options.view_as(GoogleCloudOptions).no_auth:
        skip_credential_lookup()
    standard = options.view_as(StandardOptions)
    if os.environ.get(FLEX_TEMPLATE_ENV) and standard.runner is None:
        standard.runner = "DataflowRunner"  # a Flex Template launch always means a Dataflow job
    test = options.view_as(TestOptions)
    # Beam's --dry_run takes any string, and "False" would count as true.
    test.dry_run = _as_bool(test.dry_run) if test.dry_run is not None else False
    if test.dry_run and not is_dataflow(options):
        raise UserError("--dry_run only applies with --runner=DataflowRunner, where it builds and stages the job "
                        "without submitting it; leave it out for a local run")
    if is_dataflow(options):
        check_dataflow_options(options, input_dir, output_dir)


NETWORK_TIMEOUT_S = 5.0  # to connect to Cloud Storage or Dataflow: a reachable endpoint answers in well under 1 s
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def _endpoint(url: str, default_port: int) -> tuple[str, int]:
    """(host, port) of an endpoint URL or host[:port]."""
    parsed = urllib.parse.urlsplit(url if "://" in url else f"//{url}")
    port = parsed.port or (80 if parsed.scheme == "http" else default_port)
    return parsed.hostname or "", port


def check_network(options: PipelineOptions, paths: list[str | None]) -> None:
    """Before the first call to Cloud Storage or Dataflow, see within seconds that each can be reached, so that a
    machine without network gets one line instead of the client libraries' two minutes of retries.

    A proxy (HTTPS_PROXY, ALL_PROXY) is what gets reached then; STORAGE_EMULATOR_HOST replaces Cloud Storage.

    Raises:
        UserError: naming what could not be reached, why, and what to check.
    """
    reach = []
    temp = options.view_as(GoogleCloudOptions).temp_location
    if any(is_gcs(path) for path in [*paths, temp]):
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        reach.append(("Cloud Storage", *_endpoint(emulator or "https://storage.googleapis.com", 443)))
    if is_dataflow(options) and not is_dry_run(options):
        endpoint = options.view_as(GoogleCloudOptions).dataflow_endpoint or "https://dataflow.googleapis.com"
        reach.append(("the Dataflow service", *_endpoint(endpoint, 443)))
    proxy = next((os.environ[name] for name in PROXY_VARIABLES if os.environ.get(name)), None)
    for what, host, port in reach:
        local = host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")
        via = "" if proxy is None or local else f" through the proxy {proxy}"
        target = (host, port) if not via else _endpoint(proxy, 8080)
        try:
            socket.create_connection(target, timeout=NETWORK_TIMEOUT_S).close()
        except OSError as e:
            if isinstance(e, TimeoutError):
                reason = f"no answer in {NETWORK_TIMEOUT_S:g} s"
            else:
                reason = e.strerror or type(e).__name__
            raise UserError(
                f"{what} cannot be reached at {host}:{port}{via} ({reason}): check this machine's network "
                "connection, DNS and firewall (and HTTPS_PROXY if you need a proxy); a dry run reaches Cloud "
                "Storage too, to check the folders"
            ) from None


def skip_credential_lookup() -> None:
    """Make --no_auth apply to Beam's GCS file system too.

    Beam 2.77 honours --no_auth for the Dataflow API client but not for
    FileSystems: every process first calls google.auth.default() and, without
    credentials, retries it with backoff for about 20 s before connecting
    anonymously. Recording "no credentials" up front gives the anonymous
    client (which STORAGE_EMULATOR_HOST points at an emulator) at once.
    """
    from apache_beam.internal.gcp import auth

    credentials = getattr(auth, "_Credentials", None)
    if credentials is not None and hasattr(credentials, "_credentials_init"):
        with credentials._credentials_lock:
            credentials._credentials = None
            credentials._credentials_init = True


def check_dataflow_options(options: PipelineOptions, input_dir: str, output_dir: str) -> None:
    """The options a Dataflow job cannot run without, checked before anything is listed or built."""
    cloud = options.view_as(GoogleCloudOptions)
    for flag, path in (("--input_dir", input_dir), ("--output_dir", output_dir)):
        if not is_gcs(path):
            raise UserError(
                f"{flag} {path} is not a gs:// path, and Dataflow workers cannot read this machine's files: "
                f"copy the folder to a bucket (gcloud storage cp -r) and give its gs:// path"
            )
    if not cloud.project:
        raise UserError("--project is required with --runner=DataflowRunner: give the Google Cloud project id")
    if not cloud.region:
        raise UserError("--region is required with --runner=DataflowRunner: give a Dataflow region such as "
                        "--region=us-central1")
    if not is_gcs(cloud.temp_location):
        given = f"--temp_location={cloud.temp_location} is not a gs:// folder" if cloud.temp_location else (
            "--temp_location is required with --runner=DataflowRunner")
        raise UserError(f"{given}: give a folder in a bucket the job can write, e.g. --temp_location=gs://BUCKET/tmp")
    if cloud.staging_location and not is_gcs(cloud.staging_location):
        raise UserError(f"--staging_location={cloud.staging_location} must be a gs:// folder: "
                        "give one in a bucket, or leave it out to use --temp_location")
    _check_with_beams_validator(options)
    template = cloud.template_location
    if template and not is_gcs(template) and not os.path.isdir(os.path.dirname(os.path.abspath(template))):
        raise UserError(f"--template_location {template}: the folder {os.path.dirname(os.path.abspath(template))} "
                        "does not exist: create it, or give a gs:// path")
    setup = options.view_as(SetupOptions)
    if not setup.setup_file and not options.view_as(WorkerOptions).sdk_container_image:
        # Without this the workers would lack the pipeline and transforms packages (ModuleNotFoundError).
        if not os.path.isfile(SETUP_FILE):
            raise UserError(
                "Dataflow workers need this package: pass --setup_file=path/to/setup.py of image-tfrecords, "
                "or --sdk_container_image with the package installed"
            )
        setup.setup_file = SETUP_FILE
    elif setup.setup_file and not os.path.isfile(setup.setup_file):
        raise UserError(f"--setup_file {setup.setup_file} does not exist: give the path of this project's setup.py")
    if options.view_as(WorkerOptions).sdk_container_image:
        check_worker_image(options.view_as(WorkerOptions).sdk_container_image)


def check_worker_image(image: str) -> None:
    """Stop before anything is submitted when the workers' image declares other code than the launcher's.

    An image built by dataflow/build_template.sh declares its code in its tag (`pipeline.code_version`); an
    image of another tag cannot be checked without pulling it, and the job's first step checks its workers
    instead (`check_worker_code`).

    Raises:
        UserError: the tag names another version or code hash than this launcher's.
    """
    from pipeline.code_version import code_identity, image_identity

    declared, here = image_identity(image), code_identity()
    if declared is not None and declared != here:
        raise UserError(f"--sdk_container_image {image} holds other code ({declared}) than this launcher ({here}): "
                        "its workers would convert with other rules; rebuild the image from this code "
                        "(dataflow/build_template.sh image), or launch from the code it was built from")


class WorkerCodeMismatch(RuntimeError):
    """The workers run other code than the launcher that planned the job."""


def check_worker_code(launcher: str) -> None:
    """The job's first step, on a worker: fail the job when the workers' code is not the launcher's.

    Raises:
        WorkerCodeMismatch: with one line naming both codes and what to do.
    """
    from pipeline.code_version import code_identity

    here = code_identity()
    if here != launcher:
        raise WorkerCodeMismatch(
            f"the Dataflow workers run other code ({here}) than the launcher that planned this job ({launcher}): "
            "give --sdk_container_image an image built from the launcher's code (dataflow/build_template.sh image "
            "tags it with that code), or launch from the code of the image")


def _check_with_beams_validator(options: PipelineOptions) -> None:
    """Beam's own checks of the Dataflow options (project id, job name, ...), as one line instead of a traceback."""
    from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

    # Only the checks of names: Beam's whole validate() would create a default staging bucket (a network call).
    # As Beam does, not against a local stand-in of the service (--dataflow_endpoint=http://localhost:PORT).
    validator = PipelineOptionsValidator(options, DataflowRunner())
    if not validator.is_service_runner():
        return
    errors = [" ".join(e.split()) for e in validator.validate_cloud_options(options.view_as(GoogleCloudOptions))]
    if errors:
        raise UserError(f"{errors[0].rstrip('.')}: correct that Dataflow option and run again")


def check_gcs_folder(flag: str, path: str) -> None:
    """The bucket of a gs:// path exists and its objects can be listed: one line about what to do when not.

    The probe is one object listing of the path's prefix (at most one name): `storage.objects.list`, which
    roles/storage.objectViewer and objectAdmin grant, never the bucket's metadata (`storage.buckets.get`).

    Raises:
        UserError: naming the flag, the bucket and what to do.
    """
    from google.api_core import exceptions

    bucket, _, prefix = path[len("gs://"):].partition("/")
    if not bucket:
        raise UserError(f"{flag} {path} has no bucket name: write gs://BUCKET/folder")
    try:
        next(iter(gcs.client().list_blobs(bucket, prefix=prefix, max_results=1)), None)
    except exceptions.NotFound:
        raise UserError(
            f"{flag} {path}: the bucket gs://{bucket} does not exist: check the name, or create it with "
            f"gcloud storage buckets create gs://{bucket}"
        ) from None
    except Exception as e:
        raise UserError(
            f"{flag} {path}: the objects of gs://{bucket} cannot be listed ({type(e).__name__}): check the name and "
            "that your credentials may list and read them (roles/storage.objectViewer, or objectAdmin for an "
            "output; gcloud auth application-default login)"
        ) from None


def job_links(options: PipelineOptions, job_id: str) -> list[str]:
    """Where to follow a submitted job: the console page and the gcloud commands."""
    cloud = options.view_as(GoogleCloudOptions)
    return [
        f"  console: https://console.cloud.google.com/dataflow/jobs/{cloud.region}/{job_id}?project={cloud.project}",
        f"  status:  gcloud dataflow jobs show {job_id} --region={cloud.region} --project={cloud.project}",
        f"  logs:    gcloud logging read 'resource.type=\"dataflow_step\" AND resource.labels.job_id=\"{job_id}\"' "
        f"--project={cloud.project}",
        f"  cancel:  gcloud dataflow jobs cancel {job_id} --region={cloud.region} --project={cloud.project}",
    ]


def stage_dry_run(job, options: PipelineOptions) -> tuple[str, list[str]]:
    """Stage a dry-run job like a real submission, without calling the Dataflow API.

    Beam's --dry_run stops after translating the graph. Here the package built
    from --setup_file, the other dependencies and pipeline.pb are uploaded to
    the staging location as for a real job, and the job request that would
    have been sent is written next to them as dataflow_job.json.
    Returns the staging folder and the staged file names.
    """
    from apache_beam.runners.dataflow.internal import apiclient

    client = apiclient.DataflowApplicationClient(options, job.root_staging_location)
    client.create_job_description(job)  # stages the dependencies and pipeline.pb
    staging = job.google_cloud_options.staging_location
    client.stage_file_with_retry(staging, DRY_RUN_JOB_FILE, io.BytesIO(job.json().encode("utf-8")))
    matched = FileSystems.match([FileSystems.join(staging, "*")])[0].metadata_list
    return staging, sorted(m.path.rsplit("/", 1)[-1] for m in matched)


def _submission_errors() -> tuple[type[BaseException], ...]:
    """What a failed upload or job creation raises: the service said no, or could not be reached."""
    import requests
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError

    return GoogleAPIError, GoogleAuthError, requests.exceptions.RequestException, OSError


RUN_LABEL = "image-tfrecords-run"  # the Dataflow job label that carries the run id (see the output lock)


def label_job(options: PipelineOptions, run_id: str) -> None:
    """Label the Dataflow job with the run id, so that the output folder's lock can be matched to it.

    A job without --job_name is named after the run (image-tfrecords-20240131-030000-1a2b3c4d), so that
    its name, the lock and the run's temporary folder tell the same story.
    """
    cloud = options.view_as(GoogleCloudOptions)
    cloud.labels = [*(cloud.labels or []), f"{RUN_LABEL}={run_id}"]
    if not cloud.job_name:
        cloud.job_name = f"image-tfrecords-{run_id}"


def _jobs_client(options: PipelineOptions):
    """A client of the Dataflow jobs API with the run's endpoint and credentials, as Beam's own apiclient makes it."""

    from google.api_core import client_options as client_options_lib
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import dataflow_v1beta3

    cloud = options.view_as(GoogleCloudOptions)
    credentials = AnonymousCredentials() if cloud.no_auth else None
    endpoint = (cloud.dataflow_endpoint or "").strip()
    transport, client_options = None, None
    if endpoint:
        if "localhost" in endpoint or "sandbox" in endpoint:
            transport = "rest"
        else:
            endpoint = re.sub("^https?://", "", endpoint)
        client_options = client_options_lib.ClientOptions(api_endpoint=endpoint.rstrip("/"))
    return dataflow_v1beta3.JobsV1Beta3Client(credentials=credentials, client_options=client_options,
                                              transport=transport)


_TERMINAL = {"JOB_STATE_DONE", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_UPDATED",
             "JOB_STATE_DRAINED", "JOB_STATE_STOPPED"}


# How many ended jobs' summaries a lock's judge looks through for the job of a run that recorded no job id, and
# how many jobs it reads the labels of (one GetJob each).
ENDED_JOBS_LOOKED_AT, JOBS_DESCRIBED = 2000, 100


def dataflow_lock_stale(holder: dict, options: PipelineOptions) -> str | None:
    """Why a lock held for a Dataflow job is stale (its job is known to have ended), or None while it may run.

    With the job id in the lock, the job's state decides. Without one (a Flex
    Template launch before its job's first step records the id, or a launcher
    stopped while it submitted), the lock is stale only when an ended job of
    the lock's job name carries the run's label (labels come only with
    GetJob's description view: ListJobs returns summaries) and no active job
    carries that label or name, or, for a launch that submits its own job (not a template's), when
    the launcher's process is seen to have ended (this host) and no job
    carries the label. Anything else keeps the lock, however old:
    the time since the launch proves nothing. An answer that cannot be had (no
    permission, no network) keeps the lock too.
    """
    from google.cloud import dataflow_v1beta3

    from transforms.output.lock import local_holder_alive

    project, region, run_id = holder.get("project"), holder.get("region"), holder.get("run_id")
    Filter = dataflow_v1beta3.ListJobsRequest.Filter  # noqa: N806
    try:
        client = _jobs_client(options)
        if holder.get("job_id"):
            job = client.get_job(request=dataflow_v1beta3.GetJobRequest(
                project_id=project, location=region, job_id=holder["job_id"]))
            state = dataflow_v1beta3.JobState(job.current_state).name
            return f"its Dataflow job {holder['job_id']} ended ({state})" if state in _TERMINAL else None

        def jobs(which):  # summaries: ListJobs returns no labels, whatever view is asked for
            return client.list_jobs(request=dataflow_v1beta3.ListJobsRequest(
                project_id=project, location=region, filter=which))

        def labelled(job) -> bool:  # the labels come with GetJob's description view only
            described = client.get_job(request=dataflow_v1beta3.GetJobRequest(
                project_id=project, location=region, job_id=job.id, view=dataflow_v1beta3.JobView.JOB_VIEW_DESCRIPTION))
            return described.labels.get(RUN_LABEL) == run_id

        for index, job in enumerate(jobs(Filter.ACTIVE)):
            if index >= JOBS_DESCRIBED or (holder.get("job_name") and job.name == holder["job_name"]) or labelled(job):
                return None  # its job, or one that may be (more active jobs than are looked at)
        described = 0
        for index, job in enumerate(jobs(Filter.TERMINATED)):
            if index >= ENDED_JOBS_LOOKED_AT or described >= JOBS_DESCRIBED:
                break
            if holder.get("job_name") and job.name == holder["job_name"]:  # a candidate: its label says
                described += 1
                if labelled(job):
                    return f"its Dataflow job {job.id} ended ({dataflow_v1beta3.JobState(job.current_state).name})"
    except Exception as e:  # cannot tell: keep the lock, and say why in the log
        _LOG.warning("Could not look up the Dataflow job of the lock on the output folder (%s: %s)",
                     type(e).__name__, (str(e).splitlines() or [""])[0][:200])
        return None
    # A launcher seen to have died on this machine before any job carried its run: it can submit none now. Not a
    # template launch's program: it exits before the template launcher submits the job file it wrote.
    if holder.get("template") is False and local_holder_alive(holder) is False:
        return (f"its launcher, process {holder.get('pid')} on {holder.get('host')}, has ended, and no Dataflow job "
                f"carries its run id {run_id}")
    return None


def is_template_launch(options: PipelineOptions) -> bool:
    """A run that writes its job description for a template launcher to submit (a Flex Template launch)."""
    return is_dataflow(options) and bool(options.view_as(GoogleCloudOptions).template_location)


def _nothing_to_do(message: str) -> None:
    _LOG.info("%s", message)


def launch_nothing(options: PipelineOptions, message: str) -> int:
    """For a template launch with nothing to do (--if_exists=skip): write the job file of a job that does nothing.

    A Flex Template launcher expects the program to write the job file at --template_location and then
    submits it; a program that exits without one is a failed launch. So the launch still writes a job:
    one step that logs `message`, on one worker, without the output folder's lock or any of its files.
    Returns the exit code.
    """
    import apache_beam as beam

    worker = options.view_as(WorkerOptions)
    worker.num_workers, worker.max_num_workers = 1, 1
    cloud = options.view_as(GoogleCloudOptions)
    pipeline = beam.Pipeline(options=options)
    _ = pipeline | "NothingToDo" >> beam.Create([message]) | "Say" >> beam.Map(_nothing_to_do)
    try:
        with package_build_lock(options.view_as(SetupOptions).setup_file):
            pipeline.run()
    except _submission_errors() as e:
        first_line = (str(e).strip().splitlines() or [""])[0][:300]
        raise UserError(f"the Dataflow job description could not be written to {cloud.template_location} "
                        f"({type(e).__name__}: {first_line}): check that your credentials may write there") from None
    print(f"Wrote the Dataflow job description of a job that does nothing (job {cloud.job_name}) to "
          f"{cloud.template_location}, so that the template launch succeeds; it ends at once.")
    return 0


# How often a waiting launch asks Dataflow for its job's state: soon after the submission, then less often as the
# job runs (a tenth of the time waited so far), never less often than every POLL_MAX_S.
POLL_FIRST_S = 0.5
POLL_MAX_S = 10.0


def wait_for_job(result, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> str:
    """Wait for a submitted Dataflow job to end; its final PipelineState.

    Each check is one GetJob call (`result.state`). Beam's `wait_until_finish` checks every 5 s in a thread that
    the caller checks on every 5 s, so it returns 5-10 s after the job ended; this one returns within a tenth of
    the job's run time (at most POLL_MAX_S). Ctrl-C and SIGTERM end the wait, not the job, as with Beam's.
    """
    from apache_beam.runners.runner import PipelineState

    start = clock()
    while True:
        state = result.state
        if PipelineState.is_terminal(state):
            return state
        sleep(min(POLL_MAX_S, max(POLL_FIRST_S, (clock() - start) / 10)))


def package_lock_path(setup_file: str) -> str:
    """The lock file of the builds in setup_file's folder (`package_build_lock`)."""
    key = hashlib.sha256(os.path.dirname(os.path.abspath(setup_file)).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"image-tfrecords-sdist-{key}.lock")


@contextlib.contextmanager
def package_build_lock(setup_file: str | None) -> Iterator[None]:
    """One build of setup_file's source distribution at a time, across processes.

    Beam builds the package for --setup_file in setup.py's folder (`setup.py sdist` makes its release tree and
    egg-info there), so two launches from one checkout at once (a train and a validation job, say) would build
    into each other's tree, and one would stage a broken package or fail with a missing file. The lock is a
    file in the temporary folder named by the setup.py, held while the job is staged (not while it runs).
    """
    if not setup_file:
        yield
        return
    folder = os.path.dirname(os.path.abspath(setup_file))
    # Read-only: a lock file another user made (0644) still locks.
    lock = os.open(package_lock_path(setup_file), os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _LOG.info("waiting for another launch from %s to build its package", folder)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)  # and with it the lock


def add_job_checks(pipeline, options: PipelineOptions, settings, run_id: str) -> None:
    """The steps only a Dataflow job has, beside the graph: the workers check their code against the launcher's,
    and a template launch's job records its own id in the output folder's lock (which has none yet)."""
    import apache_beam as beam

    from pipeline.code_version import code_identity
    from transforms.output.lock import RecordJobId

    if is_template_launch(options) and not is_dry_run(options):
        _ = pipeline | "RecordJobId" >> RecordJobId(settings.output_dir, run_id)
    _ = (pipeline | "CheckWorkerCode/Launcher" >> beam.Create([code_identity()])
         | "CheckWorkerCode/Compare" >> beam.Map(check_worker_code))


def run_on_dataflow(pipeline, options: PipelineOptions, settings, run_id: str,
                    give_back_lock: Callable[[], None]) -> int:
    """Submit the built pipeline; wait for it and print the summary unless told not to.

    The output folder's lock is this run's when called. The job releases it
    when it finishes; here it is released, by calling `give_back_lock`, when
    nothing was submitted or the job failed while we waited.
    Returns the exit code: 0 when submitted (no wait), written as a template,
    or done with records; 1 when the job failed or was cancelled.
    """
    from apache_beam.runners.runner import PipelineState

    from pipeline.options import ConvertOptions
    from pipeline.report import summarise_run
    from transforms.output.lock import update_lock
    from transforms.output.publishing import remove_run_dir

    cloud = options.view_as(GoogleCloudOptions)

    def nothing_ran() -> None:
        """The job was never created: this run's folder (its plan.json, see transforms/output/resume.py) goes,
        and the lock."""
        with contextlib.suppress(Exception):  # never hide the submission's own error behind this
            remove_run_dir(settings.output_dir, run_id)
        give_back_lock()

    try:
        with package_build_lock(options.view_as(SetupOptions).setup_file):
            result = pipeline.run()
    except _submission_errors() as e:
        nothing_ran()
        first_line = (str(e).strip().splitlines() or [""])[0][:300]
        raise UserError(
            f"the Dataflow job could not be staged or submitted ({type(e).__name__}: {first_line}): check "
            f"--project={cloud.project} and --region={cloud.region}, that the Dataflow API is enabled, and that "
            "your credentials may write to the bucket and create jobs (gcloud auth application-default login)"
        ) from None
    except BaseException:
        give_back_lock()
        raise
    if is_dry_run(options):
        staging, staged = stage_dry_run(result.job, options)
        print(f"Dry run: job {result.job.proto.name} was built and staged, not submitted.")
        print(f"  staged to {staging}: {', '.join(staged)}")
        return 0
    if not getattr(result, "has_job", False):
        # --template_location (a Flex Template launch passes it): the job description was written, and the
        # template launcher submits it. The job releases the lock when it finishes.
        where = cloud.template_location or "the template location"
        print(f"Wrote the Dataflow job description (job {cloud.job_name}, run {run_id}) to {where}; the template "
              "launcher submits it.")
        return 0
    job_id = result.job_id()
    update_lock(settings.output_dir, run_id, gcs.client() if is_gcs(settings.output_dir) else None, job_id=job_id)
    # Beam's own line, which Airflow's Dataflow hook and scripts look for (Beam logs it only with --verbose).
    print(f"Created job with id: [{job_id}]", flush=True)
    print(f"Submitted Dataflow job {cloud.job_name} ({job_id}) for run {run_id}.")
    print("\n".join(job_links(options, job_id)), flush=True)
    if options.view_as(ConvertOptions).no_wait or os.environ.get(FLEX_TEMPLATE_ENV):
        print(f"Not waiting for the job; image_tfrecords.json appears in {settings.output_dir} when it succeeds.")
        return 0
    print("Waiting for the job to finish (Ctrl-C stops waiting, not the job; --no_wait skips this).", flush=True)
    try:
        if settings.verbose:  # Beam's own wait logs the job's messages as they come, which --verbose shows
            result.wait_until_finish()
            state = result.state
        else:
            state = wait_for_job(result)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the job, which holds the lock, goes on
        print(f"Stopped waiting; the job goes on. Cancel it with: gcloud dataflow jobs cancel {job_id} "
              f"--region={cloud.region}", file=sys.stderr)
        return e.exit_code if isinstance(e, Terminated) else 130
    except Exception:  # DataflowRuntimeException: the job failed or was cancelled
        state = getattr(result, "state", None)
    if state != PipelineState.DONE:
        give_back_lock()
        print(f"error: Dataflow job {job_id} ended in state {str(state).rsplit('.', 1)[-1]}, not DONE: no dataset "
              f"was written to {settings.output_dir} (an earlier complete one there is untouched); see the job's "
              f"errors with: gcloud dataflow jobs show {job_id} --region={cloud.region} --project={cloud.project}, "
              "fix them and run the same command again", file=sys.stderr)
        return 1
    return summarise_run(settings.output_dir, run_id)
