"""benchmarks/convert_bench: one command measures the floor and the pipeline on the same files, with medians."""

from __future__ import annotations

import json

from tests.conftest import cli


def test_repeated_runs_report_the_median_pair_and_consistent_ratios(tmp_path):
    result = cli("benchmarks.convert_bench", "--images=12", "--skip_notebook", "--repeat=3",
                 f"--workdir={tmp_path}", f"--json={tmp_path / 'result.json'}", "--pipeline_args=--image_size=16")
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads((tmp_path / "result.json").read_text())
    assert figures["images"] == 12
    assert len(figures["runs"]) == 3
    for run in figures["runs"]:
        assert run["floor"]["images"] == 12
        assert run["pipeline"]["images"] == 12  # every generated photo written
        assert run["pipeline"]["peak_rss_bytes"] > 0
    floors = sorted(run["floor"]["images_per_second"] for run in figures["runs"])
    pipelines = sorted(run["pipeline"]["images_per_second"] for run in figures["runs"])
    assert figures["floor"]["images_per_second"] == floors[1]
    assert figures["pipeline"]["images_per_second"] == pipelines[1]
    assert figures["pipeline_vs_floor"] == figures["pipeline"]["images_per_second"] / floors[1]
    assert "medians of 3" in result.stdout
