"""run(argv): validate options, plan, build the graph, run it and print the summary.

    python -m pipeline.main --input_dir=photos/ --output_dir=tfrecords/
"""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions, PipelineOptions, StandardOptions

from pipeline import cloud
from pipeline.errors import OutOfSpace, TransientReadFailed, WorkerDied
from pipeline.graph import build_pipeline
from pipeline.options import Settings, check_flags, help_text, validate
from pipeline.output import existing_dataset, give_back_lock, prepare_output, take_lock
from pipeline.plan import Plan, plan_dataset
from pipeline.progress import REQUEST_SECONDS, show_progress
from pipeline.quiet import held_beam_logs, quiet_workers
from pipeline.report import format_summary, read_info
from pipeline.warm_workers import WarmWorkerPool
from transforms.outputs import holder_record, new_run_id
from transforms.transient import TransientReadError

__all__ = ["format_summary", "read_info", "run"]

_LOG = logging.getLogger("pipeline")
LOCAL_RUNNER_NAMES = (None, "DirectRunner", "SwitchingDirectRunner", "FnApiRunner")


def _flag_given(argv: list[str], name: str) -> bool:
    return any(a == name or a.startswith(name + "=") for a in argv)


def is_local_run(options: PipelineOptions) -> bool:
    return options.view_as(StandardOptions).runner in LOCAL_RUNNER_NAMES


def start_workers(options: PipelineOptions, argv: list[str], settings: Settings) -> WarmWorkerPool | None:
    """For a local run with worker processes (the default), start them now; None for other runs.

    They import Beam while the launcher plans the run and builds the graph
    (see `pipeline.warm_workers`).
    """
    if not is_local_run(options) or cloud.is_dataflow(options):
        return None
    direct = options.view_as(DirectOptions)
    if _flag_given(argv, "--direct_running_mode") and direct.direct_running_mode != "multi_processing":
        return None
    count = direct.direct_num_workers if _flag_given(argv, "--direct_num_workers") else 0
    return WarmWorkerPool(count or os.cpu_count() or 1, quiet=not settings.verbose)


def make_runner(options: PipelineOptions, argv: list[str], workers: WarmWorkerPool | None = None):
    """The runner for these options; local runs use Beam's FnApiRunner on every core.

    Beam's DirectRunner first tries the Prism runner, which downloads a binary
    from the internet: on a machine without internet access that stalls the
    job. Local runs therefore go straight to the FnApiRunner, the Python local
    engine that DirectRunner falls back to, with one worker process per core:
    the `workers` started early, or Beam's own for --direct_running_mode=multi_processing
    without them.
    """
    if not is_local_run(options):
        return options.view_as(StandardOptions).runner
    direct = options.view_as(DirectOptions)
    if not _flag_given(argv, "--direct_running_mode"):
        direct.direct_running_mode = "multi_processing"
    if not _flag_given(argv, "--direct_num_workers"):
        direct.direct_num_workers = 0  # one worker per core
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    provision_info = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    environment = None
    if workers is not None:
        workers.serve(provision_info.provision_info)
        environment = workers.environment()
        # The runner's multi_processing mode would replace this environment by
        # processes of its own; its in_memory mode keeps it and still runs
        # direct_num_workers bundles in parallel, one per worker process.
        direct.direct_running_mode = "in_memory"
        direct.direct_num_workers = workers.count
    return fn_runner.FnApiRunner(
        default_environment=environment,
        provision_info=provision_info,
        progress_request_frequency=REQUEST_SECONDS,  # live counts for pipeline.progress
    )


def configure_logging(settings: Settings) -> None:
    level = logging.INFO if settings.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", force=True)
    logging.getLogger("pipeline").setLevel(logging.INFO if not settings.quiet else logging.WARNING)
    # Pillow logs some errors of the files it then fails to open; each such file is
    # rejected with its reason in errors.jsonl.
    logging.getLogger("PIL").setLevel(logging.NOTSET if settings.verbose else logging.CRITICAL)
    if not settings.verbose:
        logging.getLogger("apache_beam").setLevel(logging.ERROR)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


_NO_SPACE = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded"}


def out_of_space(error: BaseException) -> str | None:
    """The reason if `error` comes from a full disk or quota, else None.

    A worker process's error reaches the launcher as the text of its traceback,
    so the text is searched too.
    """
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _NO_SPACE:
            return _NO_SPACE[error.errno]
        for code, text in _NO_SPACE.items():
            if f"[Errno {code}]" in str(error) or text in str(error):
                return text
        error = error.__cause__ or error.__context__
    return None


def worker_died(error: BaseException, dead: list[tuple[int, int]]) -> str | None:
    """Which worker process died, if `error` is how Beam's local runner reports a lost worker, else None.

    `dead` holds (pid, exit code) of the local worker processes that have ended
    (`WarmWorkerPool.dead()`); Beam's own error names none of them.
    """
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if "Channel closed prematurely" in str(error):
            break
        error = error.__cause__ or error.__context__
    else:
        return None
    for pid, code in sorted(dead, key=lambda worker: worker[1] >= 0):  # one killed by a signal first
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"worker process {pid} was killed ({name})"
        return f"worker process {pid} exited with code {code}"
    return "a worker process died"


# The message up to the end of its line (a literal "\n" when the traceback arrives as a repr).
_TRANSIENT_READ = re.compile(
    r"TransientReadError: (reading .+? failed \d+ times with a transient error.*?)(?:\\n|\n|$)")


def transient_read_failed(error: BaseException) -> str | None:
    """What `transforms.transient.TransientReadError` said, if `error` is or reports one, else None.

    From a worker process it arrives as the text of its traceback.
    """
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, TransientReadError):
            return str(error)
        match = _TRANSIENT_READ.search(str(error))
        if match:
            return match.group(1)
        error = error.__cause__ or error.__context__
    return None


def run(argv: list[str] | None = None) -> int:
    """Run one conversion; returns the process exit code.

    Raises:
        UserError: for bad options or input, before anything is written.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(help_text())
        return 0
    check_flags(argv)
    options = PipelineOptions(argv)
    settings = validate(options)
    configure_logging(settings)
    cloud.configure(options, settings.input_dir, settings.output_dir)  # gs:// access, Dataflow checks
    start_time = time.time()
    workers = start_workers(options, argv, settings)
    try:
        return _run(argv, options, settings, start_time, workers)
    finally:
        if workers is not None:
            workers.close()


def _run(argv: list[str], options: PipelineOptions, settings: Settings, start_time: float,
         workers: WarmWorkerPool | None) -> int:
    done = existing_dataset(settings)  # --if_exists: refuse, overwrite or skip
    if done:
        print(done)
        return 0
    plan: Plan = plan_dataset(settings)
    for note in plan.notes:
        _LOG.warning(note)
    run_id = new_run_id()
    dry_run = cloud.is_dry_run(options)
    on_dataflow = cloud.is_dataflow(options)
    if not dry_run:
        if on_dataflow:
            cloud.label_job(options, run_id)
            google = options.view_as(GoogleCloudOptions)
            holder = holder_record(run_id, "dataflow", project=google.project, region=google.region,
                                   job_name=google.job_name, job_id=None)
        else:
            holder = holder_record(run_id, "local")
        take_lock(settings, holder, options)  # one run per output folder
    try:
        # Leftovers of interrupted runs leave the folder at once and are deleted while this one runs.
        old = prepare_output(settings, run_id, dry_run=dry_run, background=True)
        if old.paths:
            _LOG.info("Removing %d leftover files of interrupted runs from %s", len(old.paths), settings.output_dir)
        _LOG.info(
            "Converting the images of %d classes in %s to %s (the job lists and counts them, then sizes the shards)",
            len(plan.class_names),
            settings.input_dir,
            settings.output_dir,
        )
    except BaseException:
        if not dry_run:
            give_back_lock(settings, run_id)
        raise
    if on_dataflow:  # runs on the service: it shows progress in the console
        p = beam.Pipeline(options=options)
        build_pipeline(p, settings, plan, start_time, run_id)
        return cloud.run_on_dataflow(p, options, settings, run_id, lambda: give_back_lock(settings, run_id))
    try:
        return _run_locally(argv, options, settings, plan, start_time, run_id, workers, old)
    finally:
        give_back_lock(settings, run_id)  # the job's last step released it, unless the run failed


def _run_locally(argv: list[str], options: PipelineOptions, settings: Settings, plan: Plan, start_time: float,
                 run_id: str, workers: WarmWorkerPool | None, old) -> int:
    worker_processes = workers is not None or options.view_as(DirectOptions).direct_running_mode == "multi_processing"
    runner = make_runner(options, argv, workers)
    with held_beam_logs(enabled=not settings.verbose) as beam_logs:
        try:
            with quiet_workers(enabled=worker_processes and not settings.verbose), \
                    show_progress(runner, enabled=not settings.quiet):
                with beam.Pipeline(runner=runner, options=options) as p:
                    build_pipeline(p, settings, plan, start_time, run_id)
        except Exception as e:
            died = worker_died(e, workers.dead() if workers is not None else [])
            if died:
                beam_logs.discard()  # Beam's lost-connection errors: the line below says what happened
                raise WorkerDied(
                    f"{died}, probably because the machine ran out of memory: lower what each worker holds with "
                    f"a lower --worker_memory_mb (now {settings.image.worker_memory_mb}, for all its conversions at "
                    f"once), --max_image_mb (now {settings.image.max_image_mb}) or --max_pixels, or "
                    "--conversion_threads=1, or use fewer --direct_num_workers; then run the same command "
                    "again: it removes this run's files and starts over cleanly"
                ) from None
            transient = transient_read_failed(e)
            if transient:
                beam_logs.discard()  # the failed bundle's traceback: the line below says what happened
                raise TransientReadFailed(
                    f"{transient.rstrip('.')}. The storage service was overloaded or unreachable, so the run "
                    "stopped rather than leave the image out; no dataset was written. Check the service's status "
                    "and your network, then run the same command again (it removes this run's files first)"
                ) from None
            reason = out_of_space(e)
            if not reason:
                raise
            beam_logs.discard()  # Beam's log of the failed step: the line below says what it means
            raise OutOfSpace(
                f"the disk of --output_dir {settings.output_dir} is full ({reason}): a run needs the new "
                "dataset's size free (the earlier dataset stays until it is complete); free some space or choose "
                "another folder, then run the same command again (it removes this run's files first)"
            ) from None
    # Only after a successful run: if this one fails, the next one finishes the deletion.
    old.wait()
    info = read_info(settings.output_dir)
    print(format_summary(info))
    if not info["files"]["written"]:
        print(f"error: no image could be converted; see {info['error_report']} for each file's reason",
              file=sys.stderr)
        return 1
    return 0
