"""benchmarks/launcher_listing: the launcher's plan measured against the fake GCS, and runs over the caps stopped."""

from __future__ import annotations

import json

import pytest

from tests.conftest import cli

pytestmark = pytest.mark.bench  # a benchmarks/ script: make test runs it; leave it out while you work


@pytest.mark.timeout(300)
def test_a_small_listing_is_planned_and_measured(tmp_path):
    result = cli("benchmarks.launcher_listing", "--names=3000", "--classes=30", f"--out={tmp_path}", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    [run] = summary["runs"]
    assert run["stopped_after_plan"] is True, run
    assert run["stop_after"] == "pipeline.plan:plan_dataset"
    assert run["fake"]["unknown"] == []  # every request of the launcher was one the fake knows
    assert run["plan"]["classes"] == 30
    assert run["fake"]["downloads"] > 0  # the launcher's sample of images read the fake's JPEG
    assert run["peak_rss_bytes"] > run["peak_rss_before_plan_bytes"] > 0
    # the times are recorded; what they are is the benchmark's to say (BENCHMARKS.md), not a test's
    assert all(isinstance(run[k], float) for k in ("plan_s", "wall_s", "cpu_s", "cpu_before_plan_s"))
    assert "| 3,000 | 30 |" in result.stdout and "done: plan_dataset" in result.stdout
    assert json.loads((tmp_path / "names-3000.json").read_text())["names"] == 3000


@pytest.mark.timeout(300)
def test_a_run_over_the_memory_cap_is_stopped_and_reported(tmp_path):
    # 50 MB: Python with Beam imported is over it long before any plan.
    result = cli("benchmarks.launcher_listing", "--names=3000", "--classes=30", "--max_gb=0.05",
                 f"--out={tmp_path}", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    [run] = json.loads((tmp_path / "summary.json").read_text())["runs"]
    assert run["stopped_after_plan"] is False
    assert run["stopped"].startswith("over 0.05 GiB RSS"), run["stopped"]
    assert run["peak_rss_sampled_bytes"] > 0.05 * 2**30
    assert "over 0.05 GiB RSS" in result.stdout


@pytest.mark.timeout(300)
def test_the_launcher_lists_class_folders_not_files_whatever_the_input_size(tmp_path):
    """Issue 16: 5 million names in 50 class folders; the launcher asks for the folders and a few names of each."""
    result = cli("benchmarks.launcher_listing", "--names=5000000", "--classes=50", f"--out={tmp_path}", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    [run] = json.loads((tmp_path / "summary.json").read_text())["runs"]
    assert run["stopped_after_plan"] is True and run["plan"]["classes"] == 50
    # One listing of the top (its 50 prefixes), then one small page per class folder for the sample of 200
    # images (4 a folder, pages of 10 x that): 2,000 names, never the 5 M. Plus the launcher's probe of each
    # gs:// folder it checks (input and output: one listing of at most one name, never the bucket's metadata).
    assert run["fake"]["prefixes_listed"] == 50, run["fake"]
    assert run["fake"]["objects_listed"] <= 2_000 + 2, run["fake"]
    assert run["fake"]["list_requests"] <= 51 + 2, run["fake"]
