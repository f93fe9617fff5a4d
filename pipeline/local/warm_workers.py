"""Worker processes for local runs, started before the graph is built, through Beam's worker-pool API.

Beam's local runner starts its worker processes when the first stage runs, and
each spends about 2.5 s of CPU importing Beam before it does any work; at the
end the runner waits for them to exit one after the other (about 0.9 s each).
Here the launcher, which has imported Beam already, forks the workers as soon
as the options are valid: they start with Beam and the conversion's modules
loaded, for no CPU at all, and wait while the launcher plans the run and
builds the graph. They are stopped together once the job is done. Where
forking is not safe (not Linux, or the launcher already runs threads, as when
a started worker died and the pool's service must replace it) a worker is
started afresh instead, with multiprocessing's spawn, and imports Beam itself.

Everything here is Beam's public portability API, as Beam ships it: the runner
(`FnApiRunner`, given `environments.ExternalEnvironment` as its default
environment) asks this pool's gRPC service (the Fn API's
`BeamFnExternalWorkerPool`, on 127.0.0.1) for each worker, and the pool hands a
started process the runner's addresses. From then on each process is exactly
`apache_beam.runners.worker.sdk_worker_main`, the worker Beam's
`multi_processing` mode runs. Nothing of Beam is patched or subclassed.
`missing()` names what this relies on that the installed Beam lacks; the
runner then falls back to Beam's own `multi_processing` mode with one warning.

Measured (BENCHMARKS.md, "Local workers"): 32 workers on 2 cores start for
about 0.1 s of launcher CPU each instead of about 2.5 s of CPU each importing
Beam in a fresh interpreter.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import sys
import threading
import time
from concurrent import futures

import grpc
from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc, endpoints_pb2
from apache_beam.runners.worker import sdk_worker_main
from apache_beam.transforms import environments
from google.protobuf import text_format

import transforms.images.convert  # noqa: F401  (the conversion's modules: loaded before a worker is forked)
import transforms.output.describe  # noqa: F401
import transforms.output.write  # noqa: F401

WORKER_NAME = "image-tfrecords-worker"  # each worker's multiprocessing name
_WORKER_LOG = logging.getLogger("apache_beam.worker")  # quiet unless --verbose, like the rest of Beam


# The Fn API's log severities (a public proto enum) as logging levels.
_SEVERITY = beam_fn_api_pb2.LogEntry.Severity
_LEVELS = {_SEVERITY.TRACE: logging.DEBUG, _SEVERITY.DEBUG: logging.DEBUG, _SEVERITY.INFO: logging.INFO,
           _SEVERITY.NOTICE: logging.INFO, _SEVERITY.WARN: logging.WARNING, _SEVERITY.ERROR: logging.ERROR,
           _SEVERITY.CRITICAL: logging.CRITICAL}
# Threads of the pool's service besides one per worker (whose log stream holds one for the whole run): the
# runner's StartWorker and StopWorker calls.
_SPARE_THREADS = 4


def missing() -> list[str]:
    """What this pool needs of Beam's public API that the installed Beam lacks (empty when it has it all)."""
    needs = [(environments, "ExternalEnvironment"), (environments, "python_sdk_capabilities"),
             (sdk_worker_main, "main"), (beam_fn_api_pb2_grpc, "BeamFnExternalWorkerPoolServicer"),
             (beam_fn_api_pb2_grpc, "add_BeamFnExternalWorkerPoolServicer_to_server"),
             (beam_fn_api_pb2_grpc, "BeamFnLoggingServicer"), (beam_fn_api_pb2_grpc,
                                                               "add_BeamFnLoggingServicer_to_server")]
    return [f"{module.__name__}.{name}" for module, name in needs if not hasattr(module, name)]


def can_fork() -> bool:
    """Whether a worker may be forked from this process now: Linux, and no thread but this one.

    A thread holding a lock at the fork would leave the child waiting on it forever.
    """
    return sys.platform == "linux" and threading.active_count() == 1


class WorkerStartFailed(OSError):
    """The machine refused to start another worker process (too many processes, or no memory left)."""

    def __init__(self, started: int, count: int, error: OSError):
        super().__init__(error.errno, f"only {started} of {count} worker processes could be started "
                                      f"({error.strerror or error})")
        self.started, self.count = started, count


class _Worker:
    """One worker process, and the pipe on which it waits for the runner's addresses."""

    def __init__(self, context, quiet: bool):
        reader, self.assignments = context.Pipe(duplex=False)
        self.process = context.Process(target=serve, args=(reader, os.getpid(), quiet), name=WORKER_NAME,
                                       daemon=True)
        self.process.start()
        reader.close()

    def alive(self) -> bool:
        return self.process.is_alive()

    given = False  # handed to the runner

    def assign(self, assignment: dict[str, str]) -> None:
        self.given = True
        self.assignments.send(assignment)
        self.assignments.close()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()

    def join(self) -> None:
        self.process.join()
        self.assignments.close()


class WarmWorkerPool:
    """`count` started worker processes and the gRPC service that hands them to Beam's runner."""

    def __init__(self, count: int, quiet: bool):
        self._quiet = quiet
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self.count = count
        self._server = None
        self.url = ""
        try:
            self._free: list[_Worker] = [self._start() for _ in range(count)]
        except OSError as e:  # fork or spawn refused: out of processes (ulimit -u) or memory
            self.close()
            raise WorkerStartFailed(len(self._workers), count, e) from None
        self._options_json = "{}"

    def _start(self) -> _Worker:
        if can_fork():
            # The child's garbage collections then skip everything loaded so far,
            # instead of touching (and so copying) every shared page.
            gc.freeze()
            context = multiprocessing.get_context("fork")
        else:
            context = multiprocessing.get_context("spawn")
        worker = _Worker(context, self._quiet)
        self._workers.append(worker)
        return worker

    def serve(self, options_json: str) -> str:
        """Start the pool service for a runner whose workers take these pipeline options; returns its address.

        `options_json` is what Beam's worker reads from PIPELINE_OPTIONS (`{"options": {...}}`).
        """
        self._options_json = options_json
        # Each worker's log stream holds a thread of the service for the whole run: with fewer threads than
        # workers, the runner's later StartWorker calls waited until gRPC dropped them ("Too many pings").
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.count + _SPARE_THREADS,
                                                              thread_name_prefix="worker-pool"))
        beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(_Servicer(self), self._server)
        beam_fn_api_pb2_grpc.add_BeamFnLoggingServicer_to_server(_LogServicer(), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.url = f"127.0.0.1:{port}"
        return self.url

    def environment(self):
        """The Beam environment whose workers come from this pool."""
        return environments.ExternalEnvironment(self.url, capabilities=environments.python_sdk_capabilities())

    def start_worker(self, request) -> None:
        """Give the next started process (or a new one) the runner's addresses."""
        with self._lock:
            while self._free and not self._free[0].alive():
                self._free.pop(0)  # died while starting (its stderr says why with --verbose)
            worker = self._free.pop(0) if self._free else self._start()
        # The runner names its own host (socket.getfqdn(), for workers that may be elsewhere); its services
        # listen on every interface, and these workers are on this machine.
        control = endpoints_pb2.ApiServiceDescriptor()
        control.CopyFrom(request.control_endpoint)
        control.url = "localhost:" + control.url.rsplit(":", 1)[-1]
        worker.assign({
            "CONTROL_API_SERVICE_DESCRIPTOR": text_format.MessageToString(control),
            # The workers' log records come to this pool, not to the runner, which would print
            # every one of them (see _LogServicer).
            "LOGGING_API_SERVICE_DESCRIPTOR": text_format.MessageToString(
                endpoints_pb2.ApiServiceDescriptor(url=self.url)),
            "PIPELINE_OPTIONS": self._options_json,
            "WORKER_ID": request.worker_id,
        })

    def assigned_dead(self) -> bool:
        """Whether a worker the runner was given has ended: the run cannot finish without it."""
        with self._lock:
            return any(w.given and w.process.exitcode is not None for w in self._workers)

    def dead(self) -> list[tuple[int, int]]:
        """(pid, exit code) of each worker process that has ended; a negative code is the signal that killed it."""
        return [(w.process.pid, w.process.exitcode) for w in self._workers if w.process.exitcode is not None]

    def pids(self) -> list[int]:
        return [worker.process.pid for worker in self._workers]

    def close(self) -> None:
        """Stop every worker process: the job is over, or failed, and nothing of theirs is pending."""
        if self._server is not None:
            self._server.stop(0)
        for worker in self._workers:
            worker.kill()
        for worker in self._workers:
            worker.join()


class _Servicer(beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolServicer):
    def __init__(self, pool: WarmWorkerPool):
        self._pool = pool

    def StartWorker(self, request, context):  # noqa: N802 (gRPC method name)
        try:
            self._pool.start_worker(request)
        except Exception as e:  # the runner reports it as "Error starting worker"
            return beam_fn_api_pb2.StartWorkerResponse(error=f"{type(e).__name__}: {e}")
        return beam_fn_api_pb2.StartWorkerResponse()

    def StopWorker(self, request, context):  # noqa: N802
        return beam_fn_api_pb2.StopWorkerResponse()  # WarmWorkerPool.close() stops them all at once


class _LogServicer(beam_fn_api_pb2_grpc.BeamFnLoggingServicer):
    """The workers' log records, on the `apache_beam.worker` logger: shown with --verbose, and errors always."""

    def Logging(self, log_bundles, context=None):  # noqa: N802 (gRPC method name)
        for bundle in log_bundles:
            for entry in bundle.log_entries:
                level = _LEVELS.get(entry.severity, logging.INFO)
                _WORKER_LOG.log(level, "worker %s at %s: %s", entry.thread, entry.log_location, entry.message)
        return iter([])


def _exit_with_parent(parent: int, poll_s: float = 0.5) -> None:
    """End this worker when its launcher `parent` is gone (killed, say): Beam's worker may wait long for it."""

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-launcher", daemon=True).start()


def _reset_logging() -> None:
    """Logging as in a fresh interpreter: a forked worker inherits the launcher's handlers and levels.

    Beam's worker then sends its records to the launcher's log service, which
    filters them (see _LogServicer).
    """
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    for name in ("apache_beam", "pipeline"):
        logging.getLogger(name).setLevel(logging.NOTSET)


def serve(assignments, parent: int, quiet: bool) -> None:
    """One worker: wait for the runner's addresses on `assignments`, then run Beam's worker until killed.

    `parent` is the launcher's pid; it may die before this process even runs.
    """
    _exit_with_parent(parent)
    if quiet:  # native libraries and tracebacks; log records go to the launcher's log service
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
    _reset_logging()
    if quiet:  # as in the launcher (configure_logging): each such file's rejection says why
        logging.getLogger("PIL").setLevel(logging.CRITICAL)
    try:
        assignment = assignments.recv()
    except EOFError:  # the launcher closed the pipe: the job ended before it needed this worker
        return
    os.environ.update(assignment)
    sdk_worker_main.main([])
    sys.stdout.flush()
    sys.stderr.flush()
    # Every bundle is done and every file closed; skip the interpreter's slow teardown.
    os._exit(0)
