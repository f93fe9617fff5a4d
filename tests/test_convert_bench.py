"""benchmarks/convert_bench: one command measures the floor and the pipeline on the same files, with medians."""

from __future__ import annotations

import json

import pytest

from tests.conftest import cli
from tests.datasets import read_records, write_tiny_tree

pytestmark = pytest.mark.bench  # a benchmarks/ script: make test runs it; leave it out while you work


@pytest.mark.slow
def test_repeated_runs_report_the_median_pair_and_consistent_ratios(tmp_path):
    result = cli("benchmarks.convert_bench", "--images=12", "--skip_notebook", "--repeat=2",
                 f"--workdir={tmp_path}", f"--json={tmp_path / 'result.json'}", "--pipeline_args=--image_size=16")
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads((tmp_path / "result.json").read_text())
    assert figures["images"] == 12
    assert len(figures["runs"]) == 2
    for run in figures["runs"]:
        assert run["floor"]["images"] == 12
        assert run["fast_floor"]["images"] == 12 and run["fast_floor"]["output_bytes"] > 0
        assert run["pipeline"]["images"] == 12  # every generated photo written
        assert run["pipeline"]["peak_rss_bytes"] > 0
        assert isinstance(run["pipeline"]["cpu_seconds"], float)  # reported through the launcher; value not checked
        assert run["graph_only"]["images"] == 12
    floors = sorted(run["floor"]["images_per_second"] for run in figures["runs"])
    pipelines = sorted(run["pipeline"]["images_per_second"] for run in figures["runs"])
    # Of two runs, the median is the slower one (the lower middle; test_the_median_run_is_the_middle_one).
    assert figures["floor"]["images_per_second"] == floors[0]
    assert figures["pipeline"]["images_per_second"] == pipelines[0]
    assert figures["pipeline_vs_floor"] == figures["pipeline"]["images_per_second"] / floors[0]
    assert "medians of 2" in result.stdout
    graphs = sorted(run["graph_only"]["images_per_second"] for run in figures["runs"])
    assert figures["graph_only"]["images_per_second"] == graphs[0]
    floor_seconds, graph_seconds = figures["floor"]["seconds"], figures["graph_only"]["seconds"]
    assert figures["additive_vs_floor"] == floor_seconds / (floor_seconds + graph_seconds)
    assert "(d) graph only" in result.stdout
    fasts = sorted(run["fast_floor"]["images_per_second"] for run in figures["runs"])
    assert figures["pipeline_vs_fast_floor"] == figures["pipeline"]["images_per_second"] / fasts[0]
    assert figures["startup"]["images"] == 8  # the fixed start-up, measured on 8 small photos
    assert "pipeline / fast floor" in result.stdout


def test_the_median_run_is_the_middle_one():
    from benchmarks.convert_bench import _median_run

    runs = [{"images_per_second": rate, "n": i} for i, rate in enumerate([30.0, 10.0, 20.0, 40.0])]
    assert _median_run(runs[:3])["n"] == 2  # 10, 20, 30: the middle one
    assert _median_run(runs)["n"] == 2  # 10, 20, 30, 40: the lower middle one
    assert _median_run(runs[:1])["n"] == 0


@pytest.mark.slow
def test_graph_only_runs_the_whole_pipeline_with_one_converted_image_for_all(tmp_path):
    """benchmarks.graph_only: every record written and labelled as usual, all with the first image's bytes.

    One worker process, forked from the launcher as by default: the stand-in reaches it.
    """
    names = write_tiny_tree(tmp_path / "in", {"a": 6, "b": 5})  # 11 different colours
    options = [f"--input_dir={tmp_path / 'in'}", "--image_size=16", "--direct_num_workers=1", "--quiet"]
    result = cli("benchmarks.graph_only", f"--output_dir={tmp_path / 'out'}", *options)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [row for split in read_records(tmp_path / "out").values() for row in split]
    assert sorted(row["source_path"] for row in rows) == sorted(names)
    assert {row["class_name"] for row in rows if row["source_path"].startswith("a/")} == {"a"}
    assert len({row["image"] for row in rows}) == 1
    assert (rows[0]["height"], rows[0]["width"]) == (16, 16)

    real = cli("pipeline.main", f"--output_dir={tmp_path / 'real'}", *options)
    assert real.returncode == 0, real.stderr[-3000:]
    assert len({row["image"] for split in read_records(tmp_path / "real").values() for row in split}) == 11
