"""Import TensorFlow without its start-up chatter (CUDA probing, CPU feature notes) unless asked for.

    from pipeline.tf_quiet import import_tensorflow
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
    if verbose or "tensorflow" in sys.modules:
        import tensorflow as tf

        return tf
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with silenced_stderr():
        import tensorflow as tf
    tf.get_logger().setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)
    return tf
