"""Hostile inputs: FIFOs, devices, huge and lying files, bombs under --max_pixels, TIFFs in millions of strips.

Every case runs under a time limit (pytest-timeout) and, where a regression could
take memory, in a subprocess whose process tree is watched and killed past a
memory bound (`tests.hostile_files.run_bounded`), so that a hang or a blow-up
fails the test instead of stalling CI.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib

import numpy as np
import pytest
from PIL import Image

from tests import hostile_files as hostile
from tests.conftest import convert
from tests.image_cases import jpeg, quadrants
from transforms.images import convert as convert_module
from transforms.inputs import listing

# One conversion's process imports Beam (about 170 MB resident): this leaves room for the
# conversion's own memory at the defaults (--max_image_mb=512 plus the file), and none for a
# bomb decoded in full (1.35 GB) or a read of /dev/zero.
ONE_CONVERSION_MB = 900
# A local run with two worker processes takes about 470 MB (shared pages counted once per process).
RUN_MB = 1300


def convert_one(path, *args, max_rss_mb=ONE_CONVERSION_MB) -> dict:
    run = hostile.run_bounded([str(path), *args], max_rss_mb, module="tests.convert_one")
    assert not run.killed, f"the conversion was killed, {run.killed} (peak {run.peak_rss_mb:.0f} MB)"
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def errors_by_name(output_dir) -> dict[str, str]:
    with open(os.path.join(output_dir, "errors.jsonl")) as f:
        return {os.path.basename(r["relpath"]): r["reason"] for r in map(json.loads, f)}


def files_counts(output_dir) -> dict:
    with open(os.path.join(output_dir, "image_tfrecords.json")) as f:
        return json.load(f)["files"]



# --- One file at a time ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_fifo_is_rejected_by_type_without_being_opened(tmp_path, fifos):
    fifos.append(hostile.fifo(tmp_path / "pipe.jpg"))
    result = convert_one(fifos[0], "--listed_size=0")
    assert result["outcome"] == "not_a_regular_file"
    assert "FIFO" in result["detail"]


@pytest.mark.timeout(60)
def test_a_link_to_dev_zero_is_rejected_by_type(tmp_path):
    result = convert_one(hostile.dev_zero_link(tmp_path / "zero.jpg"), "--listed_size=0")
    assert result["outcome"] == "not_a_regular_file"
    assert "character device" in result["detail"]


@pytest.mark.timeout(60)
def test_a_file_over_max_file_mb_is_rejected_by_its_size_without_being_read(tmp_path):
    sparse = hostile.sparse_jpeg(tmp_path / "huge.jpg", 3_000_000_000)
    result = convert_one(sparse)
    assert result["outcome"] == "file_too_large"
    assert "3,000,000,000 bytes" in result["detail"] and "--max_file_mb=256" in result["detail"]
    assert result["peak_rss_mb"] < ONE_CONVERSION_MB


@pytest.mark.timeout(60)
def test_a_read_stops_at_the_limit_when_the_size_lies(tmp_path):
    """A file that says it has 10 bytes (and passes the type check, as on some network file
    systems) but never ends: the read stops at --max_file_mb + 1 byte."""
    result = convert_one("/dev/zero", "--no_type_check", "--listed_size=10", "--max_file_mb=8")
    assert result["outcome"] == "file_too_large"
    assert "reading stopped at 8,000,001 bytes" in result["detail"]


def test_a_file_that_grew_since_it_was_looked_at_is_read_whole_up_to_the_limit(tmp_path, monkeypatch):
    data = jpeg(quadrants(64, 64))
    path = tmp_path / "grew.jpg"
    path.write_bytes(data)
    monkeypatch.setattr(convert_module, "check_regular_file", lambda path: 100)  # it had 100 bytes then
    assert convert_module.read_bytes(str(path), 10_000_000, size=100) == data
    with pytest.raises(convert_module.ImageRejected) as caught:
        convert_module.read_bytes(str(path), len(data) - 1, size=100)
    assert caught.value.reason == "file_too_large"


@pytest.mark.parametrize("container, inflate", [("zlib", zlib.decompress), ("gzip", gzip.decompress)])
def test_the_bombs_streams_inflate_to_their_pieces(container, inflate):
    for pieces in ([(b"abc" * 1000, 5)], [(bytes(1000), 3), (b"xyz", 1)], [(b"q", 1)], [(bytes(100), 0), (b"z", 2)]):
        assert inflate(hostile.deflated(pieces, container=container)) == b"".join(b * n for b, n in pieces)


def test_a_png_bomb_is_a_valid_png_of_black_pixels():
    for width, height, colour_type in ((1000, 1000, hostile.PNG_RGBA), (37, 53, hostile.PNG_GREY)):
        pixels = np.asarray(Image.open(io.BytesIO(hostile.png_bomb(width, height, colour_type))))
        assert pixels.shape[:2] == (height, width) and not pixels.any()


@pytest.mark.timeout(120)
def test_an_rgba_png_bomb_under_max_pixels_is_rejected_before_decoding(tmp_path):
    path = tmp_path / "bomb.png"
    path.write_bytes(hostile.png_rgba_bomb(13000, 13000))  # 169 MP < --max_pixels; 676 MB decoded
    result = convert_one(path)
    assert result["outcome"] == "image_too_large_in_memory"
    assert "13000x13000 RGBA" in result["detail"] and "--max_image_mb=512" in result["detail"]


@pytest.mark.timeout(120)
def test_a_tiff_in_four_million_strips_is_rejected_before_its_layout_is_read(tmp_path):
    path = tmp_path / "strips.tif"
    path.write_bytes(hostile.many_strips_tiff(4_000_000))  # 32 MB
    result = convert_one(path)
    assert result["outcome"] == "tiff_layout_too_large"
    assert "4,000,000 strips" in result["detail"]


# --- Through the whole converter ---------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_the_hostile_corpus_end_to_end_within_memory(tmp_path, fifos):
    """A user's run over every hostile case at once, with worker processes: each file is
    rejected with its reason, the good images are written, and the run ends in bounded memory (no time is
    measured: the test's timeout only ends a hang)."""
    good = hostile.good_tree(tmp_path / "in")
    cats = tmp_path / "in" / "cats"
    fifos.extend(hostile.fifo(cats / f"pipe{i}.jpg") for i in range(1, 4))
    hostile.dev_zero_link(cats / "zero.jpg")
    hostile.sparse_jpeg(cats / "sparse.jpg", 3_000_000_000)
    (cats / "bomb.png").write_bytes(hostile.png_rgba_bomb(13000, 13000))
    (cats / "strips.tif").write_bytes(hostile.many_strips_tiff(4_000_000))
    (cats / "bigtag.tif").write_bytes(hostile.tiff_with_a_huge_tag(8_000_000))
    out = tmp_path / "out"
    run = hostile.run_bounded([f"--input_dir={tmp_path / 'in'}", f"--output_dir={out}", "--direct_num_workers=2",
                               "--image_timeout_s=5", "--quiet"], RUN_MB)
    assert not run.killed, f"the run was killed, {run.killed} (peak {run.peak_rss_mb:.0f} MB); {run.stderr[-2000:]}"
    assert run.returncode == 0, run.stderr[-3000:]
    assert errors_by_name(out) == {
        "pipe1.jpg": "not_a_regular_file", "pipe2.jpg": "not_a_regular_file", "pipe3.jpg": "not_a_regular_file",
        # The listing's symlink policy comes first: /dev/zero is outside the input folder.
        "zero.jpg": "symlink_outside_input", "sparse.jpg": "file_too_large", "bomb.png": "image_too_large_in_memory",
        "strips.tif": "tiff_layout_too_large", "bigtag.tif": "tiff_layout_too_large",
    }
    counts = files_counts(out)
    assert (counts["found"], counts["written"], counts["rejected"]) == (good + 8, good, 8)
    assert "Found 38 files: 30 written, 8 rejected" in run.stdout


@pytest.mark.timeout(180)
def test_reads_that_never_return_do_not_hang_the_run(tmp_path, fifos, monkeypatch):
    """The original hang: six reads that never return (FIFOs that pass for regular files, as a
    hung network mount would), one worker. Each is given up after the time limit; once the
    stuck threads fill the pool's spare places, the images still waiting are rejected at once."""
    # As if they looked like regular files (raising=False: the test also runs against code without the check).
    monkeypatch.setattr(convert_module, "check_regular_file", os.path.getsize, raising=False)
    monkeypatch.setattr(listing, "_kind", lambda mode: None)  # the listing takes them for regular files too
    # No helpers added for reads ahead: they follow the good files' measured read time, which a loaded machine
    # makes long (then six stuck threads fit, and none is `stalled_worker`). This test is of the pool's cap.
    monkeypatch.setattr(convert_module.ReadPacing, "helpers", lambda pacing: pacing.slots)
    good = hostile.good_tree(tmp_path / "in")
    fifos.extend(hostile.fifo(tmp_path / "in" / "cats" / f"pipe{i}.jpg") for i in range(1, 7))
    out = tmp_path / "out"
    assert convert(tmp_path / "in", out, "--image_timeout_s=1", "--conversion_threads=2") == 0
    reasons = errors_by_name(out)
    counts = files_counts(out)
    assert counts["found"] == good + 6 == counts["written"] + counts["rejected"]
    assert {reasons[f"pipe{i}.jpg"] for i in range(1, 7)} <= {"timeout", "stalled_worker"}
    # Two helpers and two spare places: four stuck threads at most (per DoFn instance: one here),
    # then the rest are not tried.
    assert sum(reason == "timeout" for reason in reasons.values()) >= 4
    assert set(reasons.values()) == {"timeout", "stalled_worker"}


@pytest.mark.timeout(120)
def test_three_stuck_reads_leave_the_run_working(tmp_path, fifos, monkeypatch):
    """Three stuck reads, two helpers: a helper is left, and every good image is written."""
    monkeypatch.setattr(convert_module, "check_regular_file", os.path.getsize, raising=False)
    monkeypatch.setattr(listing, "_kind", lambda mode: None)  # the listing takes them for regular files too
    good = hostile.good_tree(tmp_path / "in")
    fifos.extend(hostile.fifo(tmp_path / "in" / "cats" / f"pipe{i}.jpg") for i in range(1, 4))
    out = tmp_path / "out"
    assert convert(tmp_path / "in", out, "--image_timeout_s=1", "--conversion_threads=2") == 0
    assert errors_by_name(out) == {f"pipe{i}.jpg": "timeout" for i in range(1, 4)}
    assert files_counts(out)["written"] == good


@pytest.mark.timeout(120)
def test_the_memory_flags_reach_the_conversion(tmp_path):
    hostile.good_tree(tmp_path / "in", per_class=2)
    big = tmp_path / "in" / "cats" / "big.png"
    big.write_bytes(hostile.png_rgba_bomb(1000, 1000))  # 8 MB to convert, 4 kB of file
    out = tmp_path / "out"
    assert convert(tmp_path / "in", out, "--max_image_mb=5", "--max_file_mb=1") == 0
    assert errors_by_name(out) == {"big.png": "image_too_large_in_memory"}
    out2 = tmp_path / "out2"
    assert convert(tmp_path / "in", out2, "--max_image_mb=9") == 0
    assert files_counts(out2)["rejected"] == 0
    small = tmp_path / "in" / "dogs" / "noise.png"
    small.write_bytes(os.urandom(1_200_000))  # not an image, but 1.2 MB: never read with --max_file_mb=1
    out3 = tmp_path / "out3"
    assert convert(tmp_path / "in", out3, "--max_file_mb=1") == 0
    assert errors_by_name(out3) == {"noise.png": "file_too_large"}


@pytest.mark.parametrize("flag", ["--max_image_mb=0", "--max_file_mb=-1"])
def test_memory_flags_must_be_positive(tmp_path, flag):
    from pipeline.errors import UserError

    with pytest.raises(UserError, match=flag.split("=")[0] + "=.* must be a positive number of MB"):
        convert(tmp_path, tmp_path / "out", flag)
