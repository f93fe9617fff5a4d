"""A local run: worker processes started early, Beam's FnApiRunner, held logs, progress, and its failures in one line.

    with LocalRun(options, argv, settings) as local:  # worker processes start now, while the launcher plans
        pipeline = beam.Pipeline(runner=local.runner(), options=options)
        build_pipeline(pipeline, ...)
        local.run(pipeline)  # raises WorkerDied, TransientReadFailed or OutOfSpace with the line to print

Only `pipeline.launcher` uses this package; for a Dataflow run `LocalRun` does
nothing and `runner()` is the runner the options name.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import signal
import tempfile
import threading
import time

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

from pipeline import lean_beam
from pipeline.errors import InputDamaged, OutOfSpace, OutputLost, TransientReadFailed, UserError, WorkerDied
from pipeline.local.progress import progress_folder, show_progress
from pipeline.local.quiet import held_beam_logs, quiet_workers
from pipeline.options import Settings
from transforms.base.dataset_format import LOCK_FILE
from transforms.base.paths import is_local
from transforms.base.transient import TransientReadError
from transforms.inputs.rows import TruncatedFile
from transforms.output.describe import DatasetIncomplete
from transforms.output.lock import lock_path
from transforms.output.ownership import UnsafePath, completion_marker, run_dir
from transforms.output.publishing import ShardSizeMismatch, interrupted_publish

_LOG = logging.getLogger("pipeline")


def _flag_given(argv: list[str], name: str) -> bool:
    return any(a == name or a.startswith(name + "=") for a in argv)


def worker_count(options: PipelineOptions, argv: list[str]) -> int:
    """The local run's worker processes: --direct_num_workers when given (0: one per core), else one per core."""
    direct = options.view_as(DirectOptions)
    given = direct.direct_num_workers if _flag_given(argv, "--direct_num_workers") else 0
    return given or os.cpu_count() or 1


def start_workers(options: PipelineOptions, argv: list[str], settings: Settings):
    """Start the local run's worker processes now, while the launcher plans (`pipeline.local.warm_workers`);
    None where the run uses Beam's own modes instead: --direct_running_mode other than multi_processing,
    IMAGE_TFRECORDS_PLAIN_BEAM=1, or a Beam without the worker-pool API this needs (with one warning)."""
    direct = options.view_as(DirectOptions)
    if _flag_given(argv, "--direct_running_mode") and direct.direct_running_mode != "multi_processing":
        return None
    if lean_beam.plain():
        return None
    try:
        from pipeline.local import warm_workers

        gaps = warm_workers.missing()
    except ImportError as e:
        gaps = [str(e)]
    if gaps:
        _LOG.warning("The installed Beam lacks %s: the run uses Beam's own multi_processing mode, whose workers "
                     "each import Beam first (slower to start)", ", ".join(gaps))
        return None
    count = worker_count(options, argv)
    try:
        return warm_workers.WarmWorkerPool(count, quiet=not settings.verbose)
    except warm_workers.WorkerStartFailed as e:
        raise WorkerDied(f"{e.strerror}: this machine cannot hold {count} worker processes; give fewer with "
                         f"--direct_num_workers (now {count}), or raise the limit on processes (ulimit -u)") from None


def worker_options_json(options: PipelineOptions) -> str:
    """The pipeline options as Beam's worker reads them from PIPELINE_OPTIONS."""
    given = {name: value for name, value in options.get_all_options(retain_unknown_options=True).items()
             if value is not None}  # Beam's worker takes an option it is sent as set
    return json.dumps({"options": given}, default=str)


class _InMemoryWarning(logging.Filter):
    """Drops the FnApiRunner's warning that `in_memory` mode with several workers is not parallel: it is about
    Beam's embedded environment, and the runner is given the worker pool's environment instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("If direct_num_workers is not equal to 1")


_IN_MEMORY_WARNING = _InMemoryWarning()


def make_runner(options: PipelineOptions, argv: list[str], workers=None):
    """The runner of a local run: Beam's FnApiRunner, on the started `workers` or in Beam's own mode.

    Beam's DirectRunner first tries the Prism runner, which downloads a binary
    from the internet: on a machine without internet access that stalls the
    job. Local runs therefore go straight to the FnApiRunner (its public
    module), the Python local engine DirectRunner falls back to. With the
    started `workers` its default environment is theirs (Beam's EXTERNAL
    environment) and it runs `direct_num_workers` bundles at once, one per
    worker; without them, Beam's `multi_processing` mode starts a fresh
    interpreter per worker, one per core unless --direct_num_workers says.
    """
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    direct = options.view_as(DirectOptions)
    if workers is None:
        if not _flag_given(argv, "--direct_running_mode"):
            direct.direct_running_mode = "multi_processing"
        if not _flag_given(argv, "--direct_num_workers"):
            direct.direct_num_workers = 0  # one worker per core
        return FnApiRunner()
    workers.serve(worker_options_json(options))
    direct.direct_running_mode = "in_memory"  # the runner keeps the environment it is given only in this mode
    direct.direct_num_workers = workers.count
    logging.getLogger("apache_beam.runners.portability.fn_api_runner.fn_runner").addFilter(_IN_MEMORY_WARNING)
    return FnApiRunner(default_environment=workers.environment())


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


_TRUNCATED = re.compile(r"(?:TruncatedFile|UnclosedQuote): (.+? (?:is damaged|ends before).*?)(?:\\n|\n|$)")


def truncated_file(error: BaseException) -> str | None:
    """What `transforms.inputs.rows.TruncatedFile` said (a compressed manifest or metadata file cut short or damaged,
    a CSV one that ends inside a quoted field: UnclosedQuote),
    if `error` is or reports one, else None; without the step Beam names (`[while running 'Step']`)."""
    said = _reported(error, TruncatedFile, _TRUNCATED)
    return None if said is None else re.sub(r" \[while running '[^']*'\]", "", said)


# transforms.output.describe.DatasetIncomplete's message, up to the end of its line.
_INCOMPLETE = re.compile(r"DatasetIncomplete: (.+?)(?:\\n|\n|$)")


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
    if is_local(output_dir) and not os.path.isdir(output_dir):
        return "no dataset was written"
    try:
        if interrupted_publish(output_dir) is not None:
            return ("the run stopped while it published its dataset, and --output_dir holds no complete one "
                    "until the same command, run again, finishes publishing it")
        if completion_marker(output_dir) is not None:
            return "the dataset already in --output_dir is unchanged"
    except (OSError, UnsafePath):
        return "--output_dir could not be checked"
    return "no dataset was written"


def output_lost(output_dir: str, run_id: str | None) -> str | None:
    """What happened to a local --output_dir that the run can no longer write (deleted, moved, made read-only or
    immutable while the run wrote into it), else None. Asked once a run has failed: its workers' errors (an
    IndexError of a file that vanished, PermissionError) say only where they tripped."""
    if not is_local(output_dir):
        return None
    if not os.path.isdir(output_dir):
        return f"--output_dir {output_dir} was deleted or moved while the run wrote into it"
    if not os.path.lexists(lock_path(output_dir)):  # the run held it from its start: someone removed it
        return (f"files of this run in --output_dir {output_dir} were deleted while it wrote into them (its lock "
                f"file {LOCK_FILE} is gone)")
    folder = run_dir(output_dir, run_id) if run_id else output_dir
    if not os.path.isdir(folder):
        return f"this run's folder {folder} in --output_dir was deleted or moved while the run wrote into it"
    try:
        handle, probe = tempfile.mkstemp(prefix=".probe-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as e:
        return (f"--output_dir {output_dir} can no longer be written ({e.strerror}: it was made read-only or "
                "immutable while the run wrote into it)")
    return None


class WorkerLost(RuntimeError):
    """A worker process the runner was given ended, and the runner was still waiting on it."""


# How long a worker may be dead before the run is stopped: Beam's runner reports a worker whose connection it loses
# by itself ("Channel closed prematurely") at once; one that dies before it connects, it would wait for forever.
LOST_WORKER_GRACE_S = 5.0


@contextlib.contextmanager
def stop_on_lost_worker(workers, grace_s: float = LOST_WORKER_GRACE_S):
    """For the block (in the main thread), a worker of `workers` that has been dead for `grace_s` raises WorkerLost
    in the main thread, wherever it waits."""
    if workers is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    done = threading.Event()

    def on_signal(signum, frame):
        if not done.is_set():
            raise WorkerLost("a worker process ended before the runner heard from it")

    def watch():
        dead_since = None
        while not done.wait(0.5):
            if not workers.assigned_dead():
                continue
            dead_since = dead_since or time.monotonic()
            if time.monotonic() - dead_since >= grace_s:
                signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
                return

    previous = signal.signal(signal.SIGUSR1, on_signal)
    watcher = threading.Thread(target=watch, name="lost-worker-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        signal.signal(signal.SIGUSR1, previous)


class LocalRun:
    """The local runner's machinery for one run: its worker processes, runner, logs, progress and errors."""

    def __init__(self, options: PipelineOptions, argv: list[str], settings: Settings) -> None:
        self.options = options
        self.argv = argv
        self.settings = settings
        self.workers = None
        lean_beam.memoize_signatures()  # a third of a small run's graph building and checking
        # The workers count into this folder for the progress line: named before they start.
        self._progress = contextlib.ExitStack()
        self.progress = self._progress.enter_context(progress_folder(enabled=not settings.quiet))
        try:
            self.workers = start_workers(options, argv, settings)
        except BaseException:
            self._progress.close()
            raise

    def __enter__(self) -> LocalRun:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            if self.workers is not None:
                self.workers.close()
        finally:
            self._progress.close()

    def runner(self):
        """The runner to build the pipeline with (see `make_runner`)."""
        return make_runner(self.options, self.argv, self.workers)

    def run(self, pipeline, run_id: str | None = None) -> None:
        """Run the built `pipeline` (of run `run_id`) to its end, with progress on the console.

        Raises:
            WorkerDied, TransientReadFailed, OutOfSpace, UserError: with the one line that says what happened and
                what to do.
        """
        self.run_id = run_id
        settings = self.settings
        with held_beam_logs(enabled=not settings.verbose) as beam_logs:
            try:
                with quiet_workers(enabled=not settings.verbose), show_progress(self.progress), \
                        stop_on_lost_worker(self.workers):
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
        dead = self.workers.dead() if self.workers is not None else []
        died = worker_died(error, dead)
        if died is None and isinstance(error, WorkerLost):
            died = worker_died(RuntimeError("Channel closed prematurely."), dead)
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
            return InputDamaged(f"{truncated.rstrip('.')}; {output_state(settings.output_dir)}")
        incomplete = _reported(error, DatasetIncomplete, _INCOMPLETE)
        if incomplete:  # the records, the sources lines or the files found do not add up: nothing was published
            return InputDamaged(incomplete)
        transient = transient_read_failed(error)
        if transient:
            return TransientReadFailed(
                f"{transient.rstrip('.')}. The storage service was overloaded or unreachable, so the run "
                "stopped rather than leave the image out; no dataset was written. Check the service's status "
                "and your network, then run the same command again (it removes this run's files first)"
            )
        reason = out_of_space(error)
        if not reason:
            lost = output_lost(settings.output_dir, getattr(self, "run_id", None))
            if lost is None:
                return None
            _LOG.debug("The run failed with: %s", error)  # the details, for --verbose's debug level
            return OutputLost(f"{lost}, so the run stopped and {output_state(settings.output_dir)}: keep the "
                              "folder in place and writable while a run writes it, then run the same command again")
        return OutOfSpace(
            f"the disk of --output_dir {settings.output_dir} is full ({reason}), and "
            f"{output_state(settings.output_dir)}: a run needs the new dataset's size free; free some space or "
            "choose another folder, then run the same command again (it removes this run's files first)"
        )
