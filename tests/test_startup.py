"""The fixed cost of a run (issue 28's start-up target): what the launcher does once per run, counted, never timed."""

from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, TypeOptions

from pipeline.launcher import RunOptions
from tests.conftest import convert


def test_run_options_make_each_view_once_and_a_value_set_through_one_is_seen_through_all():
    options = RunOptions(["--input_dir=in", "--output_dir=out", "--direct_num_workers=2"])
    direct = options.view_as(DirectOptions)
    assert options.view_as(DirectOptions) is direct
    assert direct.direct_num_workers == 2
    direct.direct_running_mode = "in_memory"
    assert options.view_as(DirectOptions).direct_running_mode == "in_memory"
    assert options.get_all_options()["direct_running_mode"] == "in_memory"
    assert options.view_as(TypeOptions).type_check_strictness == "DEFAULT_TO_ANY"  # another class, its defaults


@pytest.fixture
def options_made(monkeypatch):
    """The PipelineOptions objects (views included) made while a test runs."""
    made = []
    init = PipelineOptions.__init__

    def counted(self, *args, **kwargs):
        made.append(type(self).__name__)
        init(self, *args, **kwargs)

    monkeypatch.setattr(PipelineOptions, "__init__", counted)
    return made


def test_a_run_parses_its_options_a_few_times_not_once_per_step(sample_tree, tmp_path, options_made):
    """Beam asks for a view of the options on every step it applies (about 480 times for this graph); each new
    view parses the command line again."""
    assert convert(sample_tree, tmp_path / "out") == 0
    assert (tmp_path / "out" / "image_tfrecords.json").exists()
    assert len(options_made) < 60, sorted(options_made)


def test_the_local_graph_has_few_steps_each_a_stage_round_trip_or_a_dofn_to_inspect(sample_tree, tmp_path,
                                                                                    monkeypatch):
    """Each ParDo costs Beam a few DoFn signature inspections at build time and an operation in every bundle of its
    stage; each GroupByKey ends a stage, so does each Impulse start one, and every stage is one sequential round
    trip to a worker. The default graph for a local folder had 50 ParDos, 12 GroupByKeys and 4 Impulses."""
    from apache_beam.portability import common_urns

    import pipeline.launcher as launcher

    jobs = []
    build = launcher.build_pipeline

    def kept(job, *args, **kwargs):
        jobs.append(job)
        return build(job, *args, **kwargs)

    monkeypatch.setattr(launcher, "build_pipeline", kept)
    assert convert(sample_tree, tmp_path / "out") == 0
    proto = jobs[0].to_runner_api()
    leaves = [t for t in proto.components.transforms.values() if not t.subtransforms]
    # A budget, not Beam's shape: Beam's own composites (the sources list's WriteToText) may take more or fewer
    # primitives in another Beam; what is ours is counted apart, and both stay within their budgets.
    ours = [t.spec.urn for t in leaves if not t.unique_name.startswith("WriteSources/Write")]
    every = [t.spec.urn for t in leaves]
    boundaries = (common_urns.primitives.GROUP_BY_KEY.urn, common_urns.primitives.IMPULSE.urn)
    assert sum(urn in boundaries for urn in ours) <= 14, "more stages than the budget: each is a round trip"
    assert ours.count(common_urns.primitives.PAR_DO.urn) <= 40, "more DoFns than the budget"
    assert sum(urn in boundaries for urn in every) <= 18
    assert every.count(common_urns.primitives.PAR_DO.urn) <= 56
    assert [t.unique_name for t in leaves if "TallyResumed" in t.unique_name]
    assert not [t.unique_name for t in leaves if "SpreadParts" in t.unique_name]  # a local folder has no parts
