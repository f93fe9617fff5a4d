"""Worker processes for local runs, started before the graph is built, through Beam's worker-pool API.

Beam's local runner starts its worker processes when the first stage runs, and
each spends about 2.5 s importing Beam before it does any work; at the end the
runner waits for them to exit one after the other (about 0.9 s each). Here the
workers are started as soon as the options are valid, so their imports overlap
the launcher's listing and graph building, and they are stopped together once
the job is done.

The runner gets them through Beam's own EXTERNAL environment (registered under
its own URN so that workers reach the runner at localhost): it asks this pool's
gRPC service (`BeamFnExternalWorkerPool`, on 127.0.0.1) for a worker, and the
pool hands a started process the runner's addresses. From then on each
process is exactly `apache_beam.runners.worker.sdk_worker_main`, the worker
Beam's `multi_processing` mode runs.

    python -m pipeline.warm_workers LAUNCHER_PID   # one worker; the launcher starts these
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc, beam_runner_api_pb2, endpoints_pb2
from apache_beam.runners.portability.fn_api_runner import worker_handlers
from apache_beam.runners.worker.log_handler import LOGENTRY_TO_LOG_LEVEL_MAP
from apache_beam.transforms import environments
from google.protobuf import json_format, text_format

WORKER_MODULE = "pipeline.warm_workers"
# Beam's EXTERNAL environment, except that workers reach the runner at localhost (see
# _LocalExternalWorkerHandler).
LOCAL_EXTERNAL_URN = "beam:env:image_tfrecords:local_external:v1"
_WORKER_LOG = logging.getLogger("apache_beam.worker")  # quiet unless --verbose, like the rest of Beam


class WarmWorkerPool:
    """`count` started worker processes and the gRPC service that hands them to Beam's runner."""

    def __init__(self, count: int, quiet: bool):
        self._quiet = quiet
        self._lock = threading.Lock()
        self._processes: list[subprocess.Popen] = []
        self.count = count
        self._free: list[subprocess.Popen] = [self._spawn() for _ in range(count)]
        self._options_json = "{}"
        self._server = None
        self.url = ""

    def _spawn(self) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE, str(os.getpid())],
            stdin=subprocess.PIPE,
            stderr=subprocess.DEVNULL if self._quiet else None,
            close_fds=True,
        )
        self._processes.append(process)
        return process

    def serve(self, provision_info) -> str:
        """Start the pool service for a runner with this provision info; returns its address."""
        self._options_json = json_format.MessageToJson(provision_info.pipeline_options)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(_Servicer(self), self._server)
        beam_fn_api_pb2_grpc.add_BeamFnLoggingServicer_to_server(_LogServicer(), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.url = f"127.0.0.1:{port}"
        return self.url

    def environment(self):
        """The Beam environment whose workers come from this pool."""
        return LocalExternalEnvironment(self.url, capabilities=environments.python_sdk_capabilities())

    def start_worker(self, request) -> None:
        """Give the next started process (or a new one) the runner's addresses."""
        with self._lock:
            while self._free and self._free[0].poll() is not None:
                self._free.pop(0)  # died while starting (its stderr says why with --verbose)
            process = self._free.pop(0) if self._free else self._spawn()
        assignment = {
            "CONTROL_API_SERVICE_DESCRIPTOR": text_format.MessageToString(request.control_endpoint),
            # The workers' log records come to this pool, not to the runner, which would print
            # every one of them (see _LogServicer).
            "LOGGING_API_SERVICE_DESCRIPTOR": text_format.MessageToString(
                endpoints_pb2.ApiServiceDescriptor(url=self.url)),
            "PIPELINE_OPTIONS": self._options_json,
            "WORKER_ID": request.worker_id,
        }
        process.stdin.write(json.dumps(assignment).encode("utf-8") + b"\n")
        process.stdin.close()

    def close(self) -> None:
        """Stop every worker process: the job is over, or failed, and nothing of theirs is pending."""
        if self._server is not None:
            self._server.stop(0)
        for process in self._processes:
            if process.poll() is None:
                process.kill()
        for process in self._processes:
            process.wait()
            if process.stdin and not process.stdin.closed:
                process.stdin.close()


@environments.Environment.register_urn(LOCAL_EXTERNAL_URN, beam_runner_api_pb2.ExternalPayload)
class LocalExternalEnvironment(environments.ExternalEnvironment):
    """An EXTERNAL environment whose workers run on this machine."""

    def to_runner_api_parameter(self, context):
        _, payload = super().to_runner_api_parameter(context)
        return LOCAL_EXTERNAL_URN, payload

    @staticmethod
    def from_runner_api_parameter(payload, capabilities, artifacts, resource_hints, context):
        return LocalExternalEnvironment(payload.endpoint.url, params=payload.params or None,
                                        capabilities=capabilities, artifacts=artifacts, resource_hints=resource_hints)


@worker_handlers.WorkerHandler.register_environment(LOCAL_EXTERNAL_URN, beam_runner_api_pb2.ExternalPayload)
class _LocalExternalWorkerHandler(worker_handlers.ExternalWorkerHandler):
    def host_from_worker(self) -> str:
        # Beam's EXTERNAL workers may be on other machines, so it gives them this
        # machine's fully qualified name, which takes a DNS lookup that can stall
        # offline or resolve elsewhere. These workers are local, as in Beam's own
        # multi_processing mode.
        return "localhost"


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
                level = LOGENTRY_TO_LOG_LEVEL_MAP.get(entry.severity, logging.INFO)
                _WORKER_LOG.log(level, "worker %s at %s: %s", entry.thread, entry.log_location, entry.message)
        return iter([])


def _exit_with_parent(parent: int, poll_s: float = 0.5) -> None:
    """End this worker when its launcher `parent` is gone (killed, say): Beam's worker may wait long for it."""

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-launcher", daemon=True).start()


def main(argv: list[str]) -> int:
    """One worker: import Beam's worker now, then wait for the runner's addresses on stdin.

    argv: [launcher pid]. The launcher may die before this process even runs.
    """
    _exit_with_parent(int(argv[0]))
    from apache_beam.runners.worker import sdk_worker_main

    import transforms.convert  # noqa: F401  (the conversion's modules, ready before the first bundle)
    import transforms.describe  # noqa: F401
    import transforms.write  # noqa: F401

    line = sys.stdin.readline()
    if not line:  # the launcher stopped before the job needed this worker
        return 0
    os.environ.update(json.loads(line))
    sdk_worker_main.main([])
    sys.stdout.flush()
    sys.stderr.flush()
    # Every bundle is done and every file closed; skip the interpreter's slow teardown.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
