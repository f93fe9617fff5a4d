"""Shared by the command-line tools: user errors become one line on stderr and exit code 2; a quiet TensorFlow.

SIGTERM (Airflow, Kubernetes, systemd) stops a tool as Ctrl-C does: the same
clean-up (a converter's lock goes back), one line, and exit code 143.

    from pipeline.cli import import_tensorflow
    tf = import_tensorflow(verbose=False)

TF_CPP_MIN_LOG_LEVEL set from Python is not enough: TensorFlow 2.21's native
libraries log "Could not find cuda drivers" while loading, whatever the
variable says once the process runs (it only works when set in the shell). So
the import itself runs with file descriptor 2 pointed at /dev/null.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable

from pipeline.errors import Terminated, UserError

# What a stopped conversion left, as the converter says it; each read-side tool says its own.
CONVERTER_STOPPED = "no image_tfrecords.json was written, so run the same command again"
_program_name: str | None = None  # set while the image-tfrecords command runs a tool (pipeline/command.py)


def program_name(module_form: str) -> str:
    """The name a tool's usage line shows: `module_form` (python -m pipeline.verify), or the command's own
    (image-tfrecords verify) while the command runs the tool."""
    return _program_name or module_form


@contextlib.contextmanager
def running_as(name: str):
    """For the block, the tools' usage lines and help pages name the program `name`."""
    global _program_name
    saved, _program_name = _program_name, name
    try:
        yield
    finally:
        _program_name = saved


def main_of(run: Callable[[list[str]], int], argv: list[str] | None = None, stopped: str = CONVERTER_STOPPED) -> int:
    """Call `run(argv)` and turn a UserError into `error: <message>` and its exit code.

    Ctrl-C ends it with exit code 130, SIGTERM with 143, each after the same clean-up and with one line that
    ends in `stopped`: what the stopped tool left, and what to do.
    """
    with escaped_output():
        try:
            with sigterm_as_interrupt():
                return run(sys.argv[1:] if argv is None else argv)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return e.exit_code
        except Terminated as e:
            print(f"error: terminated (SIGTERM); {stopped}", file=sys.stderr)
            return e.exit_code
        except KeyboardInterrupt:
            print(f"error: interrupted; {stopped}", file=sys.stderr)
            return 130


@contextlib.contextmanager
def escaped_output():
    """For the block, stdout and stderr write what their encoding cannot hold as backslash escapes (`caf\\xe9`)
    instead of failing: a class or file name must never turn a finished run into a traceback, whatever the locale
    or PYTHONIOENCODING. Streams without `reconfigure` (a StringIO) hold any text anyway."""
    saved = []
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and getattr(stream, "errors", None) in ("strict", "surrogateescape"):
            with contextlib.suppress(Exception):  # a closed or unusual stream: left as it is
                errors = stream.errors
                stream.reconfigure(errors="backslashreplace")
                saved.append((stream, errors))
    try:
        yield
    finally:
        for stream, errors in saved:
            with contextlib.suppress(Exception):
                stream.reconfigure(errors=errors)


@contextlib.contextmanager
def sigterm_as_interrupt():
    """For the block, SIGTERM raises Terminated in the main thread, as Ctrl-C raises KeyboardInterrupt.

    Only where SIGTERM has its default action (an embedding program's own
    handler stays), and only in this process: a process forked from it inside
    the block (a local worker) still ends at once on SIGTERM. The clean-up that
    follows the first SIGTERM is not interrupted by a second.
    """
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    here = os.getpid()

    def on_sigterm(signum, frame):
        if os.getpid() != here:  # a forked worker: end as SIGTERM ends a process
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) in (on_sigterm, signal.SIG_IGN):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


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


class _KerasNotLoaded:
    """A meta path finder for the length of `import tensorflow`: Keras is found (TensorFlow asks where its
    package is) but not loaded. TensorFlow's import ends by loading Keras's optimizers, and with them Keras and
    pandas, in a `try ... except ImportError` (so that a SavedModel's optimizers are registered): 1.4 s of its
    4.7 s of CPU, which no tool that reads, checks, draws or times records uses. `tf.keras` still loads Keras
    on first use (TensorFlow's lazy loader), once this finder is gone."""

    class _Loader:
        def create_module(self, spec):
            raise ImportError(f"{spec.name} is not loaded while TensorFlow imports")

        def exec_module(self, module):  # never reached: create_module refuses
            raise ImportError(module.__name__)

    def find_spec(self, name, path=None, target=None):
        if name != "keras":
            return None
        from pipeline.lean_beam import spec_past  # (stdlib only: no Beam)

        spec = spec_past(self, name)
        if spec is not None:
            spec.loader = self._Loader()
        return spec


@contextlib.contextmanager
def _keras_not_loaded():
    finder = _KerasNotLoaded()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def import_tensorflow(verbose: bool = False):
    """The tensorflow module; quiet unless `verbose`. A no-op past the first import. Keras is left to load when
    it is first used (see _KerasNotLoaded): the command-line tools use none of it."""
    try:
        if "tensorflow" in sys.modules:
            import tensorflow as tf

            return tf
        if not verbose:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        with contextlib.nullcontext() if verbose else silenced_stderr(), _keras_not_loaded():
            import tensorflow as tf
    except ImportError as e:
        raise UserError(f"TensorFlow cannot be imported ({e}); install it with pip install -e '.[tf]' (on a TPU VM "
                        "use the image's TensorFlow)") from None
    if not verbose:
        tf.get_logger().setLevel(logging.ERROR)
        logging.getLogger("absl").setLevel(logging.ERROR)
    return tf


def parse_image_size(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", str(text))
    if not match:
        raise UserError(f"--image_size={text!r} is not a size: give N (square) or WxH such as 640x480")
    width = int(match.group(1))
    height = int(match.group(2) or width)
    if not (1 <= width <= 16384 and 1 <= height <= 16384):
        raise UserError(f"--image_size={text!r} is out of range: each side must be 1 to 16384 pixels")
    return width, height
