"""A worker process killed by the kernel (the OOM killer's SIGKILL): one line that says what to do, and a rerun."""

from __future__ import annotations

import json

import pytest

from tests import hostile_files as hostile
from tests.conftest import cli
from tests.image_cases import jpeg, quadrants


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_killed_worker_gives_one_line_and_the_same_command_again_completes(tmp_path):
    good = hostile.good_tree(tmp_path / "in")
    killer = tmp_path / "in" / "cats" / "sigkill.jpg"  # tests.killed_worker_main: its worker kills itself
    killer.write_bytes(jpeg(quadrants(32, 32)))
    args = [f"--input_dir={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}", "--direct_num_workers=2", "--quiet"]
    result = cli("tests.killed_worker_main", *args, timeout=300)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    line = lines[0]
    assert line.startswith("error: worker process ") and "was killed (SIGKILL)" in line, line
    assert "out of memory" in line
    assert "--conversion_threads" in line and "--max_image_mb" in line and "--max_pixels" in line
    assert "--worker_memory_mb (now 2048, for all its conversions at once)" in line
    assert "run the same command again" in line
    assert not (tmp_path / "out" / "image_tfrecords.json").exists()

    killer.unlink()  # the memory-hungry file is dealt with; the same command, as a user would run it
    again = cli("pipeline.main", *args, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    info = json.loads((tmp_path / "out" / "image_tfrecords.json").read_text())
    assert (info["files"]["found"], info["files"]["written"]) == (good, good)


def test_a_dead_worker_is_recognised_by_beams_error_and_nothing_else_is():
    from pipeline.local.runner import worker_died

    lost = RuntimeError("Channel closed prematurely.")
    assert worker_died(lost, [(1234, -9)]) == "worker process 1234 was killed (SIGKILL)"
    assert worker_died(lost, [(1234, -11)]) == "worker process 1234 was killed (SIGSEGV)"
    assert worker_died(lost, [(1000, 1), (1234, -9)]) == "worker process 1234 was killed (SIGKILL)"
    assert worker_died(lost, [(1000, 1)]) == "worker process 1000 exited with code 1"
    assert worker_died(lost, []) == "a worker process died"
    wrapped = RuntimeError("Pipeline failed")
    wrapped.__context__ = lost
    assert worker_died(wrapped, []) == "a worker process died"
    assert worker_died(ValueError("image too large"), []) is None
    assert worker_died(ValueError("image too large"), [(1234, -9)]) is None  # the error is not Beam's lost channel
