"""Keep Beam's own output of a local run out of the user's way unless --verbose.

Local runs start one Beam worker subprocess per core, and each inherits the
launcher's stderr. On Ctrl-C every one of them prints its own traceback, and the
launcher's worker threads and log relay add theirs: a screenful for one key.
`quiet_workers()` gives the workers /dev/null as stderr (their log records still
reach the launcher through Beam's logging service, filtered by level) and, once
interrupted, drops Beam's records and thread tracebacks, so that an interrupt
ends with the launcher's one line.

A step that fails in a worker is logged by Beam, traceback and all, once by the
step and again by the worker harness, before the run ends with the same error.
`held_beam_logs()` keeps Beam's records back until the run's outcome is known,
so that an error the launcher explains in one line (a full disk) is not
preceded by two hundred lines of Beam's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading


class _AfterInterrupt(logging.Filter):
    """Drops Beam's log records once the run was interrupted: they only describe workers being stopped."""

    def __init__(self, interrupted) -> None:
        super().__init__()
        self._interrupted = interrupted

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self._interrupted.is_set() and record.name.startswith("apache_beam"))


# The runner's threads that read a worker's gRPC streams: when the worker process dies, each
# ends with an RpcError traceback, and the run fails with Beam's "Channel closed prematurely",
# which the launcher explains in one line (`pipeline.launcher.worker_died`).
_WORKER_STREAM_THREADS = ("read_grpc_client_inputs", "beam_control_read")


def _lost_worker_stream(args) -> bool:
    return (type(args.exc_value).__name__ == "RpcError" and args.thread is not None
            and args.thread.name in _WORKER_STREAM_THREADS)


@contextlib.contextmanager
def quiet_workers(enabled: bool = True):
    """For the block: worker subprocesses started in it get /dev/null as stderr; Ctrl-C ends quietly.

    The launcher keeps writing to the terminal through a duplicate of its
    stderr, which becomes sys.stderr and the stream of the console log
    handlers for the block. Must be entered from the main thread.
    """
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    import signal

    interrupted = threading.Event()
    sys.stderr.flush()
    original_stream = sys.stderr
    original_fd = os.dup(2)
    launcher_stream = os.fdopen(os.dup(original_fd), "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None),
                                errors="backslashreplace")
    handlers = [h for h in logging.getLogger().handlers
                if isinstance(h, logging.StreamHandler) and h.stream is original_stream]
    quiet_filter = _AfterInterrupt(interrupted)
    previous_hook = threading.excepthook
    previous_sigint = signal.getsignal(signal.SIGINT)

    def on_sigint(signum, frame):
        interrupted.set()
        if callable(previous_sigint):
            previous_sigint(signum, frame)
        raise KeyboardInterrupt

    def thread_hook(args):
        if not interrupted.is_set() and not _lost_worker_stream(args):
            previous_hook(args)

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stderr = launcher_stream
    for handler in handlers:
        handler.setStream(launcher_stream)
        handler.addFilter(quiet_filter)
    threading.excepthook = thread_hook
    if previous_sigint is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    except KeyboardInterrupt:
        interrupted.set()
        raise
    finally:
        if signal.getsignal(signal.SIGINT) is on_sigint:
            signal.signal(signal.SIGINT, previous_sigint)
        launcher_stream.flush()
        os.dup2(original_fd, 2)
        os.close(original_fd)
        sys.stderr = original_stream
        for handler in handlers:
            handler.setStream(original_stream)
        launcher_stream.close()
        if not interrupted.is_set():
            # After an interrupt, workers and their threads are still going down: keep those quiet too.
            threading.excepthook = previous_hook
            for handler in handlers:
                handler.removeFilter(quiet_filter)


class _Held(logging.Filter):
    """Takes Beam's records out of one handler's stream and keeps them, in order, up to a limit."""

    LIMIT = 1000

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.over_limit = 0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("apache_beam"):
            return True
        with self._lock:
            if len(self.records) < self.LIMIT:
                self.records.append(record)
            else:
                self.over_limit += 1
        return False


class HeldLogs:
    """What `held_beam_logs()` kept back; `discard()` drops it instead of showing it at the end."""

    def __init__(self) -> None:
        self.discarded = False

    def discard(self) -> None:
        self.discarded = True


@contextlib.contextmanager
def held_beam_logs(enabled: bool = True):
    """For the block, Beam's log records wait; at its end they are shown, unless discarded or interrupted.

    Yields a HeldLogs. Applies to the root logger's handlers present at entry
    (the console's); other records pass as usual.
    """
    held = {handler: _Held() for handler in logging.getLogger().handlers} if enabled else {}
    for handler, keeper in held.items():
        handler.addFilter(keeper)
    logs = HeldLogs()
    try:
        yield logs
    except KeyboardInterrupt:
        logs.discard()  # the interrupt's one line says it all
        raise
    finally:
        for handler, keeper in held.items():
            handler.removeFilter(keeper)
            if not logs.discarded:
                for record in keeper.records:
                    handler.handle(record)
                if keeper.over_limit:
                    handler.handle(logging.makeLogRecord({
                        "name": "pipeline", "levelno": logging.WARNING, "levelname": "WARNING",
                        "msg": f"{keeper.over_limit} more of Beam's log records are not shown; --verbose shows them",
                    }))
