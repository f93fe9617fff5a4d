"""Progress of local runs: live counts the workers write themselves, a bar on a terminal, plain lines elsewhere."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.local.progress import FileCounts, format_duration, progress_folder, progress_line
from tests.conftest import REPO
from transforms.base import counters

IMAGES = 240  # small images: the conversion takes a few seconds on 2 cores, so the display refreshes


class _Counts:
    """Counts as the display reads them, set by the test."""

    def __init__(self, processed: int = 0, planned: int = 0):
        self.processed, self.planned = processed, planned


def _write(folder, name, text):
    (folder / name).write_text(text)


def test_file_counts_add_up_every_workers_file_and_never_go_back(tmp_path):
    counts = FileCounts(str(tmp_path))
    assert (counts.processed, counts.planned) == (0, 0)
    _write(tmp_path, f"101{counters.PROGRESS_SUFFIX}", "3 40\n")
    _write(tmp_path, f"102{counters.PROGRESS_SUFFIX}", "4 2\n")
    _write(tmp_path, "103.progress.77.tmp", "100 100\n")  # a file being written: not read
    _write(tmp_path, f"104{counters.PROGRESS_SUFFIX}", "garbage")  # not one of ours
    assert (counts.processed, counts.planned) == (7, 42)
    (tmp_path / f"102{counters.PROGRESS_SUFFIX}").unlink()  # a worker's file gone: the count stays
    assert (counts.processed, counts.planned) == (7, 42)
    _write(tmp_path, f"101{counters.PROGRESS_SUFFIX}", "10 40\n")
    assert counts.processed == 10
    gone = FileCounts(str(tmp_path / "missing"))
    assert (gone.processed, gone.planned) == (0, 0)


def test_the_counters_the_transforms_name_are_the_ones_the_progress_line_counts(tmp_path, monkeypatch):
    """One set of names (transforms/base/counters.py) for the steps that count and the line that adds up: an image
    leaves conversion converted, resumed or rejected for any reason; the total is images_to_convert."""
    from transforms.inputs.duplicates import DUPLICATE
    from transforms.inputs.metadata import METADATA_MISSING
    from transforms.labels.layout import GROUP_BY_TIMEOUT

    monkeypatch.setenv(counters.PROGRESS_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(counters, "_progress_state", (None, None))
    counters.inc(counters.CONVERTED, 5)
    counters.inc(counters.RESUMED, 2)
    for reason in (DUPLICATE, GROUP_BY_TIMEOUT, METADATA_MISSING, "truncated"):
        counters.inc(counters.rejected(reason))
    counters.inc(counters.TO_CONVERT, 12)
    counters.inc(counters.TO_CONVERT, -1)  # an append's image already in the dataset
    counters.inc("files_listed", 12)  # another step's counter
    counters.flush_progress()
    assert (tmp_path / f"{os.getpid()}{counters.PROGRESS_SUFFIX}").read_text() == "11 11\n"
    counts = FileCounts(str(tmp_path))
    assert (counts.processed, counts.planned) == (11, 11)
    monkeypatch.setattr(counters, "_progress_state", (None, None))


def test_the_progress_folder_is_named_for_the_block_and_removed_after(monkeypatch):
    monkeypatch.delenv(counters.PROGRESS_DIR_ENV, raising=False)
    with progress_folder() as folder:
        assert os.environ[counters.PROGRESS_DIR_ENV] == folder and os.path.isdir(folder)
    assert counters.PROGRESS_DIR_ENV not in os.environ and not os.path.exists(folder)
    with progress_folder(enabled=False) as folder:
        assert folder is None and counters.PROGRESS_DIR_ENV not in os.environ


def test_plain_lines_end_with_the_final_count_even_when_the_run_ends_between_two_looks(caplog):
    """A run that finishes before the display looks again still gets its 'Converted N/N' line."""
    import logging

    from pipeline.local.progress import ProgressDisplay

    counts = _Counts()
    caplog.set_level(logging.INFO, logger="pipeline")
    with ProgressDisplay(counts, 5, interactive=False):
        counts.processed = 5  # done before the first look
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("Converted")] == [
        "Converted 5/5 images (100%); writing shards and image_tfrecords.json"]


def test_the_total_is_the_jobs_own_count_of_images_to_convert(caplog):
    """The launcher does not count the files: the total comes from AssignLabels' `images_to_convert`."""
    import logging

    from pipeline.local.progress import ProgressDisplay

    counts = _Counts(planned=6)
    caplog.set_level(logging.INFO, logger="pipeline")
    with ProgressDisplay(counts, interactive=False):
        counts.processed = 6
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("Converted")] == [
        "Converted 6/6 images (100%); writing shards and image_tfrecords.json"]


def test_progress_line_states_count_share_rate_and_time_left():
    assert progress_line(120, 400, 40.0) == "Converted 120/400 images (30%), 40.0 images/s, about 7 s left"
    assert progress_line(0, 400, 0.0) == "Converted 0/400 images (0%)"
    assert progress_line(400, 400, 50.0).endswith("; writing shards and image_tfrecords.json")
    assert format_duration(3725) == "1 h 02 min"
    assert format_duration(125) == "2 min 05 s"
    assert format_duration(0.3) == "under 1 s"


class _HeldCount(beam.DoFn):
    """Counts each element, then holds its bundle until the file `seen` exists: the test makes it once it has read
    a count of a running bundle, so no bundle can end before that, however busy the machine."""

    def __init__(self, seen: str):
        self._seen = seen

    def process(self, element):
        counters.inc("images_converted")
        while not os.path.exists(self._seen):  # in a worker process: a file is the hand-off
            time.sleep(0.01)
        yield element

    def finish_bundle(self):
        counters.flush_progress()  # as the conversion does: a bundle's last counts are written at its end


@pytest.mark.timeout(300)  # no count mid-bundle: the bundles are held until then
def test_live_counts_arrive_from_worker_subprocesses_while_bundles_run(tmp_path):
    """Workers of Beam's own multi_processing mode (fresh interpreters) write their counts while bundles run."""
    import threading

    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    seen = tmp_path / "seen"
    reports = []
    with progress_folder() as folder:
        counts = FileCounts(folder)
        stop = threading.Event()

        def watch():
            while not stop.wait(0.05):
                reports.append(counts.processed)
                if 0 < reports[-1] < 200:
                    seen.touch()  # a count from the middle of a bundle: the bundles may go on

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            options = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
            with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
                _ = p | beam.Create(range(200)) | beam.Reshuffle() | beam.ParDo(_HeldCount(str(seen)))
        finally:
            stop.set()
            watcher.join()
        assert counts.processed == 200
    assert any(0 < n < 200 for n in reports), reports  # seen mid-bundle, not only at the end


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory):
    from pipeline.sample_data import generate_dataset

    root = tmp_path_factory.mktemp("progress_in")
    generate_dataset(str(root), images_per_class=IMAGES // 4, seed=5, min_side=48, max_side=96)
    return root


def _run_on_terminal(argv, columns=100, rows=30, timeout=300):
    """Run a command with stdout and stderr on a pseudo-terminal; returns (exit code, everything printed)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: every writer has closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.slow
def test_terminal_shows_a_live_bar_with_count_rate_and_eta(small_tree, tmp_path):
    # One worker and large, carefully resampled outputs make the conversion last several seconds even
    # on a fast idle machine, so that the bar is redrawn with a rate while images are converted.
    code, text = _run_on_terminal([sys.executable, "-m", "pipeline.main", f"--input_dir={small_tree}",
                                   f"--output_dir={tmp_path / 'out'}", "--direct_num_workers=1",
                                   "--image_size=1024", "--resample=lanczos"])
    assert code == 0, text
    frames = [f for f in re.split(r"[\r\n]+", text) if f"/{IMAGES} [" in f]
    assert len(frames) >= 3, text  # redrawn while running, not printed once at the end
    converting = [f for f in frames if f.startswith("Converting")]
    # count/total [elapsed<ETA, rate]: the first frame after the clock restarts has no rate yet, and on a busy
    # machine an early rate can put the ETA an hour or more ahead (tqdm then shows H:MM:SS)
    interval = r"(\d+:)?\d\d:\d\d"
    assert all(re.search(rf"\d+/{IMAGES} \[{interval}<({interval}|\?), ([\d.]+|\?)img/s\]", f) for f in converting), \
        converting
    assert any(re.search(rf"<{interval}, [\d.]+img/s\]", f) for f in converting), converting
    assert re.search(rf"^Writing: 100%.* {IMAGES}/{IMAGES} \[\d\d:\d\d, converted at [\d.]+img/s\]$", frames[-1])
    assert f"Found {IMAGES} files:" in text.split(f"{IMAGES}/{IMAGES}")[-1]  # the summary follows the bar


@pytest.mark.slow
def test_pipes_get_plain_progress_lines_and_quiet_gets_none(small_tree, tmp_path):
    argv = [sys.executable, "-m", "pipeline.main", f"--input_dir={small_tree}"]
    piped = subprocess.run([*argv, f"--output_dir={tmp_path / 'a'}"], cwd=REPO, capture_output=True, text=True,
                           timeout=300)
    assert piped.returncode == 0, piped.stderr
    for stream in (piped.stdout, piped.stderr):
        assert "\r" not in stream and "\x1b" not in stream and "█" not in stream and "img/s" not in stream
    assert f"Converted {IMAGES}/{IMAGES} images (100%)" in piped.stderr
    assert "Converted" not in piped.stdout  # stdout holds the summary only
    assert f"Found {IMAGES} files:" in piped.stdout

    code, text = _run_on_terminal([*argv, f"--output_dir={tmp_path / 'b'}", "--quiet",
                                   "--direct_running_mode=multi_threading"])
    assert code == 0, text
    assert f"/{IMAGES} [" not in text and "Converted" not in text
    assert f"Found {IMAGES} files:" in text


@pytest.mark.slow
def test_ctrl_c_ends_with_one_line_not_every_workers_traceback(small_tree, tmp_path):
    """Ctrl-C reaches the launcher and its worker processes at once; only the launcher's message shows.

    Every conversion is held (tests/held_run_main.py) until the test has pressed Ctrl-C: the run cannot finish first.
    """
    converting = tmp_path / "converting"
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.held_run_main", f"--input_dir={small_tree}", f"--output_dir={tmp_path / 'out'}"],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, start_new_session=True,
        env=dict(os.environ, HOLD_CONVERSIONS=str(converting), HOLD_UNTIL=str(tmp_path / "never")),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a shell's foreground job
    os.close(slave)
    text, sent = "", False
    while True:
        if not sent and converting.exists():  # a worker is converting: the moment a user would press Ctrl-C
            os.killpg(proc.pid, signal.SIGINT)  # what the terminal does for ^C: the whole foreground group
            sent = True
        if not select.select([master], [], [], 0.05)[0]:
            continue
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        text += data.decode("utf-8", "replace")
    os.close(master)
    code = proc.wait(timeout=60)
    assert sent, text
    after = text.split("Converting")[-1]
    assert code == 130, text
    assert "error: interrupted; no image_tfrecords.json was written" in after
    assert "Traceback" not in after and "CRITICAL" not in after and "Exception in thread" not in after, after
    assert not (tmp_path / "out" / "image_tfrecords.json").exists()
