"""`python -m pipeline.main` whose worker processes kill themselves with SIGKILL (for tests).

A worker that converts a file whose name contains `sigkill` sends itself SIGKILL, as the
kernel's OOM killer would. Worker processes are forked from this launcher, so the patch reaches them.
"""

from __future__ import annotations

import os
import signal

import pipeline.main  # first: it sets up the environment before Beam is imported
from transforms.images import convert

_real_read_and_convert = convert.read_and_convert


def _killing_read_and_convert(path, *args, **kwargs):
    if "sigkill" in os.path.basename(path):
        os.kill(os.getpid(), signal.SIGKILL)
    return _real_read_and_convert(path, *args, **kwargs)


convert.read_and_convert = _killing_read_and_convert

if __name__ == "__main__":
    raise SystemExit(pipeline.main.main())
