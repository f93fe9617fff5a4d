"""`python -m tests.killed_publish_main ARGS`: pipeline.main, killed with SIGKILL at a point of its publishing.

$KILL_AT says where: `create:<name>` at the first file created whose name (without a leading dot) starts with
<name> (errors.jsonl: while the new descriptions are written); `rename:<n>` at the n-th rename of a file into
--output_dir itself (inside the window, once n - 1 files have taken their final names). For tests: run it with
the in-process runner (--direct_running_mode=in_memory), so that the last step runs in this process.
"""

import os
import signal
import sys

import pipeline.main  # first: it sets up the environment before Beam is imported

_KIND, _, _WHERE = os.environ["KILL_AT"].partition(":")
_OUTPUT_DIR = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--output_dir=")).rstrip("/")
_real_rename = os.rename
_renamed = []


def _killed():
    os.kill(os.getpid(), signal.SIGKILL)


def _create(path, *args, **kwargs):
    if _KIND == "create" and os.path.basename(path).lstrip(".").startswith(_WHERE):
        _killed()
    return _real_create(path, *args, **kwargs)  # noqa: F821 (set by _install)


def _rename(source, destination, *args, **kwargs):
    if _KIND == "rename" and os.path.dirname(os.fspath(destination)) == _OUTPUT_DIR:
        _renamed.append(destination)
        if len(_renamed) == int(_WHERE):
            _killed()
    return _real_rename(source, destination, *args, **kwargs)


def _install() -> None:
    global _real_create
    from apache_beam.io.filesystems import FileSystems

    _real_create = FileSystems.create
    FileSystems.create = _create
    os.rename = _rename


_install()

if __name__ == "__main__":
    sys.exit(pipeline.main.main())
