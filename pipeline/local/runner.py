"""A local run: worker processes started early, Beam's FnApiRunner, held logs, progress, and its failures in one line.

    with LocalRun(options, argv, settings) as local:  # worker processes start now, while the launcher plans
        pipeline = beam.Pipeline(runner=local.runner(), options=options)
        build_pipeline(pipeline, ...)
        local.run(pipeline)  # raises WorkerDied, TransientReadFailed or OutOfSpace with the line to print

Only `pipeline.launcher` uses this package; for a Dataflow run `LocalRun` does
nothing and `runner()` is the runner the options name.
"""

from __future__ import annotations

import errno
import os
import re
import signal

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from pipeline import cloud
from pipeline.errors import InputDamaged, OutOfSpace, TransientReadFailed, UserError, WorkerDied
from pipeline.local.progress import REQUEST_SECONDS, show_progress
from pipeline.local.quiet import held_beam_logs, quiet_workers
from pipeline.local.warm_workers import WarmWorkerPool
from pipeline.options import Settings
from pipeline.workers import is_local_run
from transforms.base.transient import TransientReadError
from transforms.inputs.rows import TruncatedFile
from transforms.output.ownership import UnsafePath, completion_marker
from transforms.output.publishing import ShardSizeMismatch, interrupted_publish


def _flag_given(argv: list[str], name: str) -> bool:
    return any(a == name or a.startswith(name + "=") for a in argv)


def start_workers(options: PipelineOptions, argv: list[str], settings: Settings) -> WarmWorkerPool | None:
    """For a local run with worker processes (the default), start them now; None for other runs.

    They import Beam while the launcher plans the run and builds the graph
    (see `pipeline.local.warm_workers`).
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
        progress_request_frequency=REQUEST_SECONDS,  # live counts for pipeline.local.progress
    )


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


# transforms.output.publishing.ShardSizeMismatch's message, as the text of a worker's traceback shows it.
_SHARD_SIZE = re.compile(r"ShardSizeMismatch: (the shard file .+? run the same command again)")
# The message up to the end of its line (a literal "\n" when the traceback arrives as a repr).
_TRANSIENT_READ = re.compile(
    r"TransientReadError: (reading .+? failed \d+ times with a transient error.*?)(?:\\n|\n|$)")


def _reported(error: BaseException, kind: type, pattern: re.Pattern) -> str | None:
    """What an exception of `kind` said, if `error` is one, reports one (its cause or context) or holds its
    traceback's text (from a worker process it arrives as text: `pattern`'s first group), else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, kind):
            return str(error)
        match = pattern.search(str(error))
        if match:
            return match.group(1)
        error = error.__cause__ or error.__context__
    return None


def transient_read_failed(error: BaseException) -> str | None:
    """What `transforms.base.transient.TransientReadError` said, if `error` is or reports one, else None."""
    return _reported(error, TransientReadError, _TRANSIENT_READ)


_TRUNCATED = re.compile(r"TruncatedFile: (.+? (?:is damaged|ends before).*?)(?:\\n|\n|$)")


def truncated_file(error: BaseException) -> str | None:
    """What `transforms.inputs.rows.TruncatedFile` said (a compressed manifest or metadata file cut short or damaged),
    if `error` is or reports one, else None."""
    return _reported(error, TruncatedFile, _TRUNCATED)


# transforms.output.ownership.UnsafePath's message, as the text of a worker's traceback shows it.
_UNSAFE_PATH = re.compile(r"UnsafePath: (.+? and run again)")


def unsafe_path(error: BaseException) -> str | None:
    """The message if `error` comes from a path under the output folder that the job refused to act on."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        match = _UNSAFE_PATH.search(f"{type(error).__name__}: {error}" if isinstance(error, UnsafePath) else str(error))
        if match:
            return match.group(1)
        error = error.__cause__ or error.__context__
    return None


def output_state(output_dir: str) -> str:
    """What --output_dir holds after a run failed: the earlier dataset, a publishing to finish, or nothing."""
    try:
        if interrupted_publish(output_dir) is not None:
            return ("the run stopped while it published its dataset, and --output_dir holds no complete one "
                    "until the same command, run again, finishes publishing it")
        if completion_marker(output_dir) is not None:
            return "the dataset already in --output_dir is unchanged"
    except (OSError, UnsafePath):
        return "--output_dir could not be checked"
    return "no dataset was written"


class LocalRun:
    """The local runner's machinery for one run: its worker processes, runner, logs, progress and errors.

    For a Dataflow run (or any non-local runner) it holds no workers and
    `runner()` is the name the options give.
    """

    def __init__(self, options: PipelineOptions, argv: list[str], settings: Settings) -> None:
        self.options = options
        self.argv = argv
        self.settings = settings
        self.workers = start_workers(options, argv, settings)

    def __enter__(self) -> LocalRun:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()

    def runner(self):
        """The runner to build the pipeline with (see `make_runner`)."""
        return make_runner(self.options, self.argv, self.workers)

    def run(self, pipeline) -> None:
        """Run the built `pipeline` to its end, with progress on the console.

        Raises:
            WorkerDied, TransientReadFailed, OutOfSpace: with the one line that says what happened and what to do.
        """
        settings = self.settings
        worker_processes = (self.workers is not None
                            or self.options.view_as(DirectOptions).direct_running_mode == "multi_processing")
        with held_beam_logs(enabled=not settings.verbose) as beam_logs:
            try:
                with quiet_workers(enabled=worker_processes and not settings.verbose), \
                        show_progress(pipeline.runner, enabled=not settings.quiet):
                    with pipeline:  # leaving the block runs the pipeline and waits for it
                        pass
            except Exception as e:
                explained = self.explain(e)
                if explained is None:
                    raise
                beam_logs.discard()  # Beam's own log of the failure: the line of `explained` says what happened
                raise explained from None

    def explain(self, error: Exception) -> UserError | None:
        """The error to stop with in one line, if `error` is a lost worker, a cut-short compressed input, a failed
        read, a full disk or a path the job would not act on; else None."""
        settings = self.settings
        unsafe = unsafe_path(error)
        if unsafe:
            return UserError(unsafe)
        died = worker_died(error, self.workers.dead() if self.workers is not None else [])
        if died:
            return WorkerDied(
                f"{died}, probably because the machine ran out of memory: lower what each worker holds with "
                f"a lower --worker_memory_mb (now {settings.image.worker_memory_mb}, for all its conversions at "
                f"once), --max_image_mb (now {settings.image.max_image_mb}) or --max_pixels, or "
                "--conversion_threads=1, or use fewer --direct_num_workers; then run the same command "
                "again: it removes this run's files and starts over cleanly"
            )
        mismatch = _reported(error, ShardSizeMismatch, _SHARD_SIZE)
        if mismatch:  # nothing was published
            return UserError(mismatch)
        truncated = truncated_file(error)
        if truncated:
            return InputDamaged(f"{truncated.rstrip('.')}; no dataset was written")
        transient = transient_read_failed(error)
        if transient:
            return TransientReadFailed(
                f"{transient.rstrip('.')}. The storage service was overloaded or unreachable, so the run "
                "stopped rather than leave the image out; no dataset was written. Check the service's status "
                "and your network, then run the same command again (it removes this run's files first)"
            )
        reason = out_of_space(error)
        if not reason:
            return None
        return OutOfSpace(
            f"the disk of --output_dir {settings.output_dir} is full ({reason}), and "
            f"{output_state(settings.output_dir)}: a run needs the new dataset's size free; free some space or "
            "choose another folder, then run the same command again (it removes this run's files first)"
        )
