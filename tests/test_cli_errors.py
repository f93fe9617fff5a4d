"""Every bad input gets one line on stderr, exit code 2, no traceback, and nothing written."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from pipeline.errors import UserError
from tests.conftest import cli, convert, main_in_process
from tests.error_lines import full_disk_line


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    for name in ("cat", "dog"):
        (root / name).mkdir()
        for i in range(3):
            Image.new("RGB", (20, 20), (i * 80, 100, 50)).save(root / name / f"{i}.jpg")
    return root


def error_of(*argv) -> str:
    with pytest.raises(UserError) as caught:
        from pipeline.launcher import run

        run(list(argv))
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_missing_input_dir_as_a_user_sees_it(tmp_path):
    result = cli("pipeline.main", f"--input_dir={tmp_path / 'nope'}", f"--output_dir={tmp_path / 'out'}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: --input_dir {tmp_path / 'nope'} does not exist: give the folder that holds the class folders"
    ]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_empty_input_dir(tmp_path):
    (tmp_path / "in").mkdir()
    assert "is empty" in error_of(f"--input_dir={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}")


def test_no_images(tmp_path):
    (tmp_path / "in" / "docs").mkdir(parents=True)
    (tmp_path / "in" / "docs" / "a.txt").write_text("x")
    message = error_of(f"--input_dir={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}")
    assert message.startswith("no images found in") and ".jpg" in message


def test_images_only_at_top_level(tmp_path):
    (tmp_path / "in").mkdir()
    for i in range(3):
        Image.new("RGB", (8, 8)).save(tmp_path / "in" / f"{i}.png")
    message = error_of(f"--input_dir={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}")
    assert "found 3 images directly in" in message
    assert "<input_dir>/<class>/<image>" in message


def test_existing_dataset_needs_overwrite(small_tree, tmp_path):
    out = tmp_path / "out"
    assert convert(small_tree, out) == 0
    (out / "my_notes.txt").write_text("mine")
    message = error_of(f"--input_dir={small_tree}", f"--output_dir={out}")
    assert "already holds a dataset" in message and "--overwrite" in message
    assert convert(small_tree, out, "--overwrite", "--num_shards=1") == 0
    assert (out / "my_notes.txt").read_text() == "mine"  # never delete what we did not write
    assert json.loads((out / "image_tfrecords.json").read_text())["files"]["written"] == 6


def test_output_inside_input(small_tree):
    message = error_of(f"--input_dir={small_tree}", f"--output_dir={small_tree / 'cat' / 'out'}")
    assert "is inside --input_dir" in message


@pytest.mark.parametrize(
    "flag, expected",
    [
        ("--validation_split=1.5", "--validation_split=1.5 is out of range"),
        ("--jpeg_quality=0", "--jpeg_quality=0 is out of range: give 1 to 100"),
        ("--image_size=big", "--image_size='big' is not a size"),
        ("--image_size=0", "is out of range: each side must be 1 to 16384 pixels"),
        ("--resize_mode=squash", "argument --resize_mode: invalid choice: 'squash'"),
        ("--jpeg_quality=high", "argument --jpeg_quality: invalid int value: 'high'"),
        ("--background=teal-ish", "--background='teal-ish' is not a colour"),
        ("--num_shards=-1", "--num_shards='-1' is not a shard count: give a number such as 8 (for train)"),
        ("--input_dri=x", "unknown option --input_dri"),
        ("--conversion_threads=0", "--conversion_threads=0 must be between 1 and 32: 2 suits most machines"),
        ("--conversion_threads=33", "--conversion_threads=33 must be between 1 and 32"),
        ("--worker_memory_mb=256", "--worker_memory_mb=256 is below --max_image_mb=512: an image allowed to need "
                                   "that much would have to run beyond the worker's budget; give --worker_memory_mb "
                                   "at least --max_image_mb (or 0 for no budget), or lower --max_image_mb"),
        ("--worker_memory_mb=-1", "--worker_memory_mb=-1 must be a number of MB, or 0 for no limit"),
    ],
)
def test_invalid_option_values(small_tree, tmp_path, flag, expected):
    assert expected in error_of(f"--input_dir={small_tree}", f"--output_dir={tmp_path / 'out'}", flag)


def test_split_sum_must_leave_training_images(small_tree, tmp_path):
    message = error_of(f"--input_dir={small_tree}", f"--output_dir={tmp_path}", "--validation_split=0.5",
                       "--test_split=0.5")
    assert "leaves no training images" in message


def test_labels_file_problems(small_tree, tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\ncat\n")
    assert "more than once" in error_of(f"--input_dir={small_tree}", f"--output_dir={tmp_path / 'o'}",
                                        f"--labels_file={labels}")
    labels.write_text("bird\n")
    assert "none of the 2 class folders" in error_of(f"--input_dir={small_tree}", f"--output_dir={tmp_path / 'o'}",
                                              f"--labels_file={labels}")
    assert "does not exist" in error_of(f"--input_dir={small_tree}", f"--output_dir={tmp_path / 'o'}",
                                        f"--labels_file={tmp_path / 'missing.txt'}")


def test_mixed_split_and_class_folders(tmp_path):
    for folder in ("train/cat", "val/cat", "dog"):
        (tmp_path / "in" / folder).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "in" / folder / "a.png")
    message = error_of(f"--input_dir={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}")
    assert "mixes split folders (train, val) with other folders (dog)" in message


def test_help_lists_the_options():
    result = cli("pipeline.main", "--help")
    assert result.returncode == 0
    for option in ("--input_dir", "--output_dir", "--labels_file", "--resize_mode", "--overwrite"):
        assert option in result.stdout


# --- a full disk during a run ---------------------------------------------------------------------------------


def test_a_full_disk_mid_run_is_one_line_with_what_to_do(small_tree, tmp_path, monkeypatch, capsys):
    import errno

    from pipeline.cli import main_of
    from pipeline.launcher import run
    from tests.conftest import FAST
    from transforms.output import shardfiles

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shardfiles, "frame_record", full_disk)  # where each record is written to its shard
    out = tmp_path / "out"
    code = main_of(run, [f"--input_dir={small_tree}", f"--output_dir={out}", "--quiet", *FAST])

    assert code == 1
    # Beam's own error log of the failed step is not shown: this line says what it means.
    assert capsys.readouterr().err.splitlines() == [full_disk_line(out)]
    assert not (out / "image_tfrecords.json").exists()


def test_a_full_disk_in_worker_processes_is_one_line_and_other_disk_errors_keep_beams_log(small_tree, tmp_path):
    """As a user runs it, with the default worker processes; the shard copy fails in a worker."""
    import errno

    out = tmp_path / "out"
    args = ("tests.broken_disk_main", f"--input_dir={small_tree}", f"--output_dir={out}", "--quiet")
    full = cli(*args, env={"BROKEN_DISK_ERRNO": str(errno.ENOSPC)})
    assert full.returncode == 1
    assert full.stderr.splitlines() == [full_disk_line(out)]

    broken = cli(*args, "--overwrite", env={"BROKEN_DISK_ERRNO": str(errno.EIO)})
    assert broken.returncode == 1  # not recognised: Beam's log and the traceback, as before
    assert "ERROR apache_beam" in broken.stderr
    assert broken.stderr.count("OSError: [Errno 5] Input/output error") >= 2
    assert not (out / "image_tfrecords.json").exists()


def test_beams_log_records_wait_for_the_outcome_and_show_in_order_unless_discarded(monkeypatch):
    import io
    import logging

    from pipeline.local import quiet

    monkeypatch.setattr(quiet._Held, "LIMIT", 2)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        for discard in (False, True):
            with quiet.held_beam_logs() as held:
                for i in range(4):
                    logging.getLogger("apache_beam.worker").error("step failed %d", i)
                logging.getLogger("pipeline").warning("live")
                assert stream.getvalue().splitlines()[-1] == "pipeline live"  # ours at once, Beam's not yet
                if discard:
                    held.discard()
            if not discard:
                assert stream.getvalue().splitlines() == [
                    "pipeline live", "apache_beam.worker step failed 0", "apache_beam.worker step failed 1",
                    "pipeline 2 more of Beam's log records are not shown; --verbose shows them",
                ]
        assert stream.getvalue().splitlines()[-1] == "pipeline live"  # the discarded ones never appear
        logging.getLogger("apache_beam.worker").error("after")
        assert stream.getvalue().splitlines()[-1] == "apache_beam.worker after"  # no longer held
    finally:
        root.removeHandler(handler)


def test_a_full_disk_is_recognised_in_a_worker_process_traceback_and_nothing_else_is():
    from pipeline.local.runner import out_of_space

    worker = RuntimeError('Traceback (most recent call last):\n  File "x.py", line 1\n'
                          "OSError: [Errno 28] No space left on device [while running 'WriteShards/CopyShards']")
    assert out_of_space(worker) == "No space left on device"
    quota = RuntimeError("wrapped")
    quota.__cause__ = OSError(122, "Disk quota exceeded")
    assert out_of_space(quota) == "Disk quota exceeded"
    assert out_of_space(RuntimeError("OSError: [Errno 2] No such file or directory")) is None
    assert out_of_space(ValueError("image too large")) is None


# --- a bad image is a line in errors.jsonl, not a log line -----------------------------------------------------


def _tiff_with_too_many_samples() -> bytes:
    """A TIFF whose SamplesPerPixel is 65535: Pillow logs an error about it before failing to open it."""
    import io
    import struct

    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (1, 2, 3)).save(buffer, format="TIFF")
    data = bytearray(buffer.getvalue())
    ifd = struct.unpack_from("<I", data, 4)[0]
    for i in range(struct.unpack_from("<H", data, ifd)[0]):
        entry = ifd + 2 + 12 * i
        if struct.unpack_from("<H", data, entry)[0] == 277:  # SamplesPerPixel
            struct.pack_into("<H", data, entry + 8, 65535)
    return bytes(data)


def test_pillows_own_error_log_stays_out_of_the_console_and_the_file_is_rejected(small_tree, tmp_path):
    """With the default worker processes: the file's reason is in errors.jsonl; Pillow's log only with --verbose."""
    import shutil

    tree = tmp_path / "in"
    shutil.copytree(small_tree, tree)
    (tree / "cat" / "odd.tif").write_bytes(_tiff_with_too_many_samples())
    result = cli("pipeline.main", f"--input_dir={tree}", f"--output_dir={tmp_path / 'out'}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "samples per pixel" not in result.stderr
    assert "Rejected: decode_error 1" in result.stdout
    rejected = [json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert [(r["relpath"], r["reason"]) for r in rejected] == [("cat/odd.tif", "decode_error")]

    verbose = cli("pipeline.main", f"--input_dir={tree}", f"--output_dir={tmp_path / 'verbose'}", "--verbose")
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert "More samples per pixel than can be decoded: 65535" in verbose.stderr


@pytest.mark.parametrize("flag, value", [
    ("--output_dir", "gs://gs://bucket/out"),   # gs:// given twice (a shell variable that already holds it)
    ("--input_dir", "gs://My_Bucket/photos"),   # upper case
    ("--manifest", "gs://-bucket/list.csv"),    # starts with '-'
    ("--labels_file", "gs://labels_/labels.txt"),  # ends with '_'
])
def test_a_gs_path_whose_bucket_name_cloud_storage_refuses_is_one_line(small_tree, tmp_path, flag, value, capsys):
    argv = {"--input_dir": str(small_tree), "--output_dir": str(tmp_path / "out"), flag: value}
    code, stderr = main_in_process(capsys, *(f"{k}={v}" for k, v in argv.items()))
    assert code == 2, stderr
    bucket = value[len("gs://"):].split("/")[0]
    assert stderr.strip().splitlines() == [
        f"error: {flag}={value}: {bucket!r} is not a Cloud Storage bucket name (lower-case letters, digits, "
        "'-', '_' or '.', starting and ending with a letter or digit): give gs://BUCKET/folder"]
    assert not (tmp_path / "out").exists()


REFUSED_BUCKET_LINE = ("error: gs://gs://bucket/out: 'gs:' is not a Cloud Storage bucket name (lower-case letters, "
                       "digits, '-', '_' or '.', starting and ending with a letter or digit): give gs://BUCKET/folder")


def test_verify_names_a_bucket_cloud_storage_refuses_in_one_line(capsys):
    from pipeline.verify import run

    code, stderr = main_in_process(capsys, "gs://gs://bucket/out", run=run)
    assert code == 2, stderr
    assert stderr.strip().splitlines() == [REFUSED_BUCKET_LINE]


def test_benchmark_names_a_bucket_cloud_storage_refuses_in_one_line_as_a_user_sees_it():
    """The benchmark's "one line, exit 2" contract, in a fresh interpreter (TensorFlow's import is quiet)."""
    result = cli("pipeline.benchmark", "gs://gs://bucket/out")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == REFUSED_BUCKET_LINE
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("tool, says", [
    ("pipeline.verify", "verify stopped before it checked the whole dataset, which it never changes: run "
                                "the same command again"),
    ("pipeline.preview", "preview stopped; the dataset is unchanged, and a contact sheet or chart it was "
                                 "writing may be incomplete: run the same command again"),
    ("pipeline.benchmark", "the benchmark stopped before its report; the dataset is unchanged: run the "
                                   "same command again"),
])
@pytest.mark.parametrize("signal_name, code", [("interrupted", 130), ("terminated (SIGTERM)", 143)])
@pytest.mark.parametrize("form", ["python -m", "image-tfrecords"])
def test_each_read_side_tool_says_what_its_own_interruption_left(tool, says, signal_name, code, form, monkeypatch,
                                                                 capsys):
    # The converter's advice (no image_tfrecords.json was written) is not a read-side tool's: each says its own,
    # whether it runs as `python -m pipeline.verify` or as `image-tfrecords verify`.
    import importlib

    from pipeline import command
    from pipeline.errors import Terminated

    module = importlib.import_module(tool)

    def stopped(argv):
        raise KeyboardInterrupt() if code == 130 else Terminated()

    monkeypatch.setattr(module, "run", stopped)
    subcommand = tool.rsplit(".", 1)[1]
    assert (module.main(["x"]) if form == "python -m" else command.main([subcommand, "x"])) == code
    assert capsys.readouterr().err == f"error: {signal_name}; {says}\n"


@pytest.mark.timeout(120)
def test_a_stdout_that_cannot_encode_a_class_name_gets_escapes_not_a_traceback(tmp_path, monkeypatch):
    """PYTHONIOENCODING=ascii (or a C locale) and a class named café: the summary shows caf\\xe9, exit 0."""
    import io
    import sys

    from pipeline.cli import main_of
    from pipeline.launcher import run
    from tests.conftest import FAST

    for name in ("caf\u00e9", "dog"):
        (tmp_path / "in" / name).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (20, 20), (i * 80, 100, 50)).save(tmp_path / "in" / name / f"{i}.jpg")
    out, err = io.BytesIO(), io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding="ascii", errors="strict"))
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(err, encoding="ascii", errors="strict"))
    code = main_of(run, [f"--input_dir={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}",
                         "--image_size=16", "--validation_split=0", *FAST])
    sys.stdout.flush(), sys.stderr.flush()
    assert code == 0, err.getvalue()
    assert b"caf\\xe9" in out.getvalue()  # the class counts line names it, escaped
    assert b"Traceback" not in err.getvalue()
    assert sys.stdout.errors == "strict"  # the stream is given back as it was


@pytest.mark.timeout(120)
def test_an_output_folder_deleted_mid_run_is_one_line_and_no_traceback(small_tree, tmp_path, monkeypatch, capsys):
    import shutil

    from pipeline.cli import main_of
    from pipeline.launcher import run
    from tests.conftest import FAST
    from transforms.output import shardfiles

    out = tmp_path / "out"
    frame = shardfiles.frame_record

    def delete_then_frame(*args, **kwargs):
        shutil.rmtree(out, ignore_errors=True)  # someone deletes the folder while the run writes its first piece
        return frame(*args, **kwargs)

    monkeypatch.setattr(shardfiles, "frame_record", delete_then_frame)
    code = main_of(run, [f"--input_dir={small_tree}", f"--output_dir={out}", "--quiet", *FAST])

    assert code == 1
    assert capsys.readouterr().err.splitlines() == [
        f"error: --output_dir {out} was deleted or moved while the run wrote into it, so the run stopped and no "
        "dataset was written: keep the folder in place and writable while a run writes it, then run the same "
        "command again"]


def test_an_output_folder_made_unwritable_mid_run_is_named_with_what_happened(tmp_path, monkeypatch):
    """chattr +i refuses even root; a failed probe file stands for it here. A folder that is fine says nothing."""
    import errno
    import tempfile

    from pipeline.local.runner import output_lost
    from transforms.base.dataset_format import LOCK_FILE, TEMP_DIR

    out = tmp_path / "out"
    (out / TEMP_DIR / "run-1").mkdir(parents=True)
    (out / LOCK_FILE).write_text("{}")
    assert output_lost(str(out), "run-1") is None
    (out / TEMP_DIR / "run-1").rmdir()
    assert output_lost(str(out), "run-1") == (
        f"this run's folder {out / TEMP_DIR / 'run-1'} in --output_dir was deleted or moved while the run wrote "
        "into it")
    (out / TEMP_DIR / "run-1").mkdir()
    (out / LOCK_FILE).unlink()
    assert "its lock file .image-tfrecords.lock is gone" in output_lost(str(out), "run-1")
    (out / LOCK_FILE).write_text("{}")

    def refused(*args, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    assert output_lost(str(out), "run-1") == (
        f"--output_dir {out} can no longer be written (Operation not permitted: it was made read-only or immutable "
        "while the run wrote into it)")
    assert output_lost("gs://bucket/out", "run-1") is None  # only a local folder is probed
