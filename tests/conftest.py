"""Shared fixtures: generated image trees and a helper that runs the converter like a user."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.dataflow_service import dataflow_api  # noqa: F401  (a stand-in of the Dataflow API on loopback)
from tests.gcs_fixtures import gcs_emulator  # noqa: F401  (session fixture: GCS emulator on loopback)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# pytest removes earlier sessions' temporary folders with shutil.rmtree, which recurses once per folder level:
# a test tree deeper than Python's default limit (tests/test_hostile_listing.py makes one of 1,100 levels,
# and removes it itself) would otherwise end a later session in a RecursionError after its summary.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))

# A test process holds TensorFlow's, Beam's and Keras's millions of objects, and Python's default thresholds
# walk them all in a full collection every few thousand allocations: that was about 70 ms a test (7.5 s of
# garbage collection in 107 in-process runs; 3.5 s with these). Garbage without cycles is freed at once either way.
gc.set_threshold(10_000, 50, 50)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_sessionstart(session):
    """Under make test's PYTHONPYCACHEPREFIX, the modules earlier sessions ran from temporary folders (their test
    trees, TensorFlow's generated autograph modules) left compiled copies that no run asks for again: they go."""
    prefix = sys.pycache_prefix
    if prefix and not os.environ.get("PYTEST_XDIST_WORKER"):
        import shutil
        import tempfile

        shutil.rmtree(prefix + os.path.realpath(tempfile.gettempdir()), ignore_errors=True)

# Tests run the local runner in-process with one worker unless they test the default.
FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def convert(input_dir, output_dir, *args, fast=True):
    """Run `pipeline.launcher.run` in-process; returns its exit code. UserError propagates."""
    from pipeline.launcher import run

    argv = [f"--input_dir={input_dir}", f"--output_dir={output_dir}", "--quiet", *args]
    return run(argv + (FAST if fast else []))


def doc_examples(doc: str, marker: str = "", section: str = "") -> list[str]:
    """The ```python blocks of `doc` (a path below the repository) that hold `marker`, dedented; with `section`,
    only those after that text (a heading)."""
    text = open(os.path.join(REPO, doc)).read()
    if section:
        text = text.split(section, 1)[1]
    return [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL) if marker in b]


def doc_example(doc: str, marker: str) -> str:
    """The one ```python block of `doc` that holds `marker`."""
    blocks = doc_examples(doc, marker)
    assert len(blocks) == 1, f"{doc} should have one python example with {marker}"
    return blocks[0]


def main_in_process(capsys, *argv, run=None) -> tuple[int, str]:
    """A tool's entry point (the converter's unless `run` is another tool's `run`) called in this process as
    `python -m ... ARGS` calls it: (its exit code, what it printed on stderr). Seconds faster than `cli`; each entry
    point keeps one `cli` test of its "one line, exit 2" contract, which only a fresh interpreter shows whole."""
    from pipeline.cli import main_of

    if run is None:
        from pipeline.launcher import run
    capsys.readouterr()  # what the test printed before
    code = main_of(run, [str(arg) for arg in argv])
    return code, capsys.readouterr().err


def cli(*args, timeout=600, env=None):
    """Run `python -m pipeline.main` (or another module via args) as a user would: a subprocess."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=full_env
    )


def run_tool(module: str, *args) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` (the converter, pipeline.main, or a read-side tool: pipeline.verify, preview,
    benchmark) called in this process: its exit code, stdout and stderr, as `cli` gives them. Seconds faster than
    `cli` (no new interpreter; Beam and TensorFlow are imported once); each tool keeps `cli` tests of its entry
    point and of its "one line, exit 2" contract (tests/test_cli_errors.py), which only a fresh interpreter shows
    whole."""
    import contextlib
    import importlib
    import io

    from pipeline.cli import main_of

    if module == "pipeline.main":  # its main() also freezes the process's objects, for a process that then ends
        from pipeline.launcher import run

        main = lambda argv: main_of(run, argv)  # noqa: E731
    else:
        main = importlib.import_module(module).main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(arg) for arg in args])
    return subprocess.CompletedProcess([sys.executable, "-m", module, *args], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def sample_tree(tmp_path_factory):
    """A 4-class tree of 40 photo-like JPEG/PNG images per class, plus a text file."""
    from pipeline.sample_data import generate_dataset

    root = tmp_path_factory.mktemp("sample")
    generate_dataset(str(root), images_per_class=40, seed=1, min_side=64, max_side=256)
    (root / "README.txt").write_text("not an image")
    return root


@pytest.fixture(scope="session")
def sample_output(sample_tree, tmp_path_factory):
    """The sample tree converted once with default options (but in-memory, one worker)."""
    out = tmp_path_factory.mktemp("sample_out")
    assert convert(sample_tree, out) == 0
    return out


@pytest.fixture
def fifos():
    """Paths of FIFOs made in a test (tests/hostile_files.fifo); every reader still blocked on one is let go at
    the end."""
    from tests import hostile_files

    made: list[str] = []
    yield made
    hostile_files.release_fifos(made)
