"""Keep TensorFlow's and Beam's own output out of the user's way unless --verbose.

    from pipeline.quiet import import_tensorflow
    tf = import_tensorflow(verbose=False)

TF_CPP_MIN_LOG_LEVEL set from Python is not enough: TensorFlow 2.21's native
libraries log "Could not find cuda drivers" while loading, whatever the
variable says once the process runs (it only works when set in the shell). So
the import itself runs with file descriptor 2 pointed at /dev/null.

Local runs start one Beam worker subprocess per core, and each inherits the
launcher's stderr. On Ctrl-C every one of them prints its own traceback, and the
launcher's worker threads and log relay add theirs: a screenful for one key.
`quiet_workers()` gives the workers /dev/null as stderr (their log records still
reach the launcher through Beam's logging service, filtered by level) and, once
interrupted, drops Beam's records and thread tracebacks, so that an interrupt
ends with the launcher's one line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading

from pipeline.errors import UserError


@contextlib.contextmanager
def silenced_stderr():
    """Point file descriptor 2 (native libraries' stderr) at /dev/null for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def import_tensorflow(verbose: bool = False):
    """The tensorflow module; quiet unless `verbose`. A no-op past the first import."""
    try:
        if verbose or "tensorflow" in sys.modules:
            import tensorflow as tf

            return tf
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        with silenced_stderr():
            import tensorflow as tf
    except ImportError as e:
        raise UserError(f"TensorFlow cannot be imported ({e}); install it with pip install -e '.[tf]' (on a TPU VM "
                        "use the image's TensorFlow)") from None
    tf.get_logger().setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)
    return tf


class _AfterInterrupt(logging.Filter):
    """Drops Beam's log records once the run was interrupted: they only describe workers being stopped."""

    def __init__(self, interrupted) -> None:
        super().__init__()
        self._interrupted = interrupted

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self._interrupted.is_set() and record.name.startswith("apache_beam"))


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
        if not interrupted.is_set():
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
