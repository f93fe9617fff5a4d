"""benchmarks/publish_bench: the last step timed on the emulator, for a few shards (the figures are BENCHMARKS.md's)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import cli

pytestmark = pytest.mark.bench  # a benchmarks/ script: make test runs it; leave it out while you work


@pytest.mark.timeout(300)
def test_a_few_shards_are_published_and_timed(tmp_path):
    result = cli("benchmarks.publish_bench", "--shards=5", "--latency_ms=1", f"--out={tmp_path}", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    [run] = json.loads((tmp_path / "summary.json").read_text())["runs"]
    assert run["shards"] == 5 and run["latency_ms"] == 1 and run["most_requests_at_once"] >= 1
    # the times are recorded; what they are is the benchmark's to say (BENCHMARKS.md), not a test's
    assert all(isinstance(run[k], float) for k in ("publish_s", "window_s", "cleanup_s"))
    assert "| 5 | 1 |" in result.stdout
