"""Progress of local runs: live counts from the runner's workers, a bar on a terminal, plain lines elsewhere."""

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
from apache_beam.metrics import monitoring_infos as mi
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.local.progress import (
    BundleCounts,
    bundle_counts,
    format_duration,
    observe_bundles,
    processed_images,
    progress_line,
)
from tests.conftest import REPO
from transforms.base import counters

IMAGES = 240  # small images: the conversion takes a few seconds on 2 cores, so the display refreshes


def _counter(name, value, namespace=counters.NAMESPACE):
    return mi.int64_user_counter(namespace, name, value, ptransform="ConvertImages/ConvertImage")


def test_processed_images_sums_converted_and_rejected_counters_of_our_namespace():
    infos = [
        _counter("images_converted", 7),
        _counter("rejected_truncated", 2),
        _counter("rejected_not_an_image", 1),
        _counter("files_listed", 100),  # another step's counter
        _counter("images_converted", 50, namespace="someone_else"),
    ]
    assert processed_images(infos) == 10
    assert processed_images([]) == 0


def test_the_counters_the_transforms_name_are_the_ones_the_progress_display_counts():
    # One set of names (transforms/base/counters.py) for the steps that count and the display that adds up.
    from transforms.inputs.duplicates import DUPLICATE
    from transforms.inputs.metadata import METADATA_MISSING
    from transforms.labels.layout import GROUP_BY_TIMEOUT

    reasons = [DUPLICATE, GROUP_BY_TIMEOUT, METADATA_MISSING, "truncated"]
    infos = [_counter(counters.CONVERTED, 5), *(_counter(counters.rejected(r), 1) for r in reasons),
             _counter(counters.TO_CONVERT, 12), _counter("files_listed", 12)]
    assert bundle_counts(infos) == (5 + len(reasons), 12)


def test_bundle_counts_add_running_and_finished_bundles_without_double_counting():
    counts = BundleCounts()
    counts.running("bundle_1", [_counter("images_converted", 3)])
    counts.running("bundle_2", [_counter("images_converted", 4)])
    assert counts.processed == 7
    counts.running("bundle_1", [])  # a finished bundle answers with no metrics: keep the last count
    assert counts.processed == 7
    counts.finished("bundle_1", [_counter("images_converted", 5), _counter("rejected_truncated", 1)])
    counts.running("bundle_1", [_counter("images_converted", 5)])  # a late answer after the final count
    assert counts.processed == 6 + 4


def test_plain_lines_end_with_the_final_count_even_when_the_run_ends_between_two_looks(caplog):
    """A run that finishes before the display looks again still gets its 'Converted N/N' line."""
    import logging

    from pipeline.local.progress import ProgressDisplay

    counts = BundleCounts()
    caplog.set_level(logging.INFO, logger="pipeline")
    with ProgressDisplay(counts, 5, interactive=False):
        counts.finished("bundle_1", [_counter("images_converted", 5)])  # done before the first look
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("Converted")] == [
        "Converted 5/5 images (100%); writing shards and image_tfrecords.json"]


def test_the_total_is_the_jobs_own_count_from_finished_listing_bundles(caplog):
    """The launcher no longer counts the files: the total comes from AssignLabels' `images_to_convert`."""
    import logging

    from pipeline.local.progress import ProgressDisplay

    counts = BundleCounts()
    counts.running("listing", [_counter("images_to_convert", 3)])
    assert counts.planned == 0  # a running bundle's count could still grow: only finished ones count
    counts.finished("listing", [_counter("images_to_convert", 4)])
    counts.finished("listing_2", [_counter("images_to_convert", 2), _counter("files_listed", 9)])
    assert counts.planned == 6 and counts.processed == 0
    caplog.set_level(logging.INFO, logger="pipeline")
    with ProgressDisplay(counts, interactive=False):
        counts.finished("shard_1", [_counter("images_converted", 5), _counter("rejected_truncated", 1)])
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
    """Counts each element, then holds its bundle until the file `seen` exists: the test makes it once the runner
    has reported a count of a running bundle, so no bundle can end before that, however busy the machine."""

    def __init__(self, seen: str):
        self._seen = seen

    def process(self, element):
        counters.inc("images_converted")
        while not os.path.exists(self._seen):  # in a worker process: a file is the hand-off
            time.sleep(0.01)
        yield element


@pytest.mark.timeout(300)  # no report mid-bundle: the bundles are held until then
def test_live_counts_arrive_from_worker_subprocesses_while_bundles_run(tmp_path):
    """The FnApiRunner's progress polling reaches the counters of running bundles in worker processes."""
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    reports = []
    seen = tmp_path / "seen"

    class Recording(BundleCounts):
        def running(self, instruction_id, infos):
            reports.append(processed_images(infos))
            if 0 < reports[-1] < 200:
                seen.touch()  # a count from the middle of a bundle: the bundles may go on
            super().running(instruction_id, infos)

    counts = Recording()
    options = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    runner = fn_runner.FnApiRunner(progress_request_frequency=0.2)
    with observe_bundles(counts) as observed:
        assert observed
        with beam.Pipeline(runner=runner, options=options) as p:
            _ = p | beam.Create(range(200)) | beam.Reshuffle() | beam.ParDo(_HeldCount(str(seen)))
    assert counts.processed == 200
    assert any(0 < n < 200 for n in reports), reports  # seen mid-bundle, not only at the end
    # The hook is gone after the block.
    assert fn_runner.ProgressRequester.__name__ == "ProgressRequester"


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
