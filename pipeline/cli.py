"""Shared by the command-line tools: user errors become one line on stderr and exit code 2; a quiet TensorFlow.

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
import sys
from collections.abc import Callable

from pipeline.errors import UserError


def main_of(run: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """Call `run(argv)` and turn a UserError into `error: <message>` and its exit code."""
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("error: interrupted; no image_tfrecords.json was written, so run the same command again",
              file=sys.stderr)
        return 130


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
