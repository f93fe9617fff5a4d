"""`python -m pipeline.main` whose shard writing fails with the errno in $BROKEN_DISK_ERRNO (for tests).

Worker processes are forked from this launcher, so the broken copy reaches them too.
"""

from __future__ import annotations

import os

import pipeline.main  # first: it sets up the environment before Beam is imported
from transforms.output import shardfiles


def _broken_write(*args, **kwargs):
    code = int(os.environ["BROKEN_DISK_ERRNO"])
    raise OSError(code, os.strerror(code))


shardfiles.frame_record = _broken_write  # called as each record is written to its shard

if __name__ == "__main__":
    raise SystemExit(pipeline.main.main())
