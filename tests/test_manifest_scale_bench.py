"""benchmarks/manifest_scale: a tiny manifest measured end to end (the launcher to a built graph; every range
parsed with its row numbers)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import cli

pytestmark = pytest.mark.bench  # a benchmarks/ script: make test runs it; leave it out while you work


@pytest.mark.timeout(300)
def test_a_small_manifest_is_measured(tmp_path):
    result = cli("benchmarks.manifest_scale", "--rows=3000", "--classes=7", "--range_mb=0.01",
                 f"--dir={tmp_path}", f"--out={tmp_path / 'out'}", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    [run] = json.loads((tmp_path / "out" / "summary.json").read_text())["runs"]
    manifest = (tmp_path / "m-3000-7.csv").read_text().splitlines()
    assert len(manifest) == 3001 and manifest[0] == "path,label,split"
    assert run["manifest_bytes"] == (tmp_path / "m-3000-7.csv").stat().st_size
    parse = run["parse"]
    assert parse["ranges"] == parse["ranges_timed"] == -(-run["manifest_bytes"] // run["range_bytes"]) > 5
    assert len(parse["count_s"]) == parse["ranges"] - 1 and len(parse["parse_s"]) == parse["ranges"]
    assert parse["rows_parsed"] == 3000 and parse["rows_numbered_in_order"] is True
    launcher = run["launcher"]
    assert "error" not in launcher, launcher
    # the figures are recorded; what they are is the benchmark's to say (BENCHMARKS.md), not a test's
    assert launcher["peak_rss_bytes"] > 0 and all(isinstance(launcher[k], float) for k in ("build_s", "wall_s"))
    assert "| 3,000 |" in result.stdout
