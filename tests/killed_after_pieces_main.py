"""`python -m tests.killed_after_pieces_main ARGS`: pipeline.main, killed with SIGKILL mid-conversion (for tests).

Once $KILL_AFTER_PIECES chunks have their done record (transforms/output/resume.py) in the run's folder, the worker
that wrote the last one sends SIGKILL to the whole process group: the launcher and every worker end at once, as
when a machine is switched off. The test starts this in a session of its own (start_new_session=True). Worker
processes are forked from this launcher, so the patch reaches them.

`install(end)` is the same hook with another ending: the Dataflow stand-in's worker (tests/dataflow_service.py)
exits instead, so that its job ends FAILED after converting some chunks.
"""

from __future__ import annotations

import os
import signal

import pipeline.main  # first: it sets up the environment before Beam is imported
from transforms.output import resume


def _kill_everything() -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


def install(end=_kill_everything) -> None:
    """Call `end()` once $KILL_AFTER_PIECES chunks of the run have their done record."""
    real = resume.write_done

    def write_done(run_folder, record, key):
        real(run_folder, record, key)
        done = resume.FileSystems.join(run_folder, resume.DONE_DIR, "*.json")
        if len(resume.FileSystems.match([done])[0].metadata_list) >= int(os.environ["KILL_AFTER_PIECES"]):
            end()

    resume.write_done = write_done


if __name__ == "__main__":
    install()
    raise SystemExit(pipeline.main.main())
