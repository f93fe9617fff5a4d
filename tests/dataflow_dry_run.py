"""The Dataflow scripts run offline (run_dataflow.sh --dry_run, build_template.sh) and the staged job's graph checks."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

from tests.conftest import REPO

BUCKET = "dataflow-dry"
SCRIPT = os.path.join(REPO, "run_dataflow.sh")
BUILD_SCRIPT = os.path.join(REPO, "dataflow", "build_template.sh")
JOB_ENV = {
    "PROJECT": "test-project",
    "REGION": "europe-west4",
    "BUCKET": BUCKET,
    "SERVICE_ACCOUNT": "converter@test-project.iam.gserviceaccount.com",
    "MACHINE_TYPE": "n2-standard-8",
    "MAX_WORKERS": "7",
    "PYTHON": sys.executable,
}


def run_script(script, *args, env=None, timeout=300):
    """`bash SCRIPT ARGS` from the repository's root, as a user runs it."""
    return subprocess.run(["bash", script, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else dict(os.environ))


def pipeline_proto(gcs_emulator, staging):
    """The staged job's graph (`pipeline.pb` in the staging location) as a Beam Pipeline proto."""
    from apache_beam.portability.api import beam_runner_api_pb2

    return beam_runner_api_pb2.Pipeline.FromString(gcs_emulator.read(f"{staging}/pipeline.pb"))


def optimized_stages(proto):
    """The fused stages of the staged graph, as Beam's own optimizer makes them for its runners."""
    from apache_beam.portability import common_urns
    from apache_beam.runners.portability.fn_api_runner import translations as t

    _, stages = t.create_and_optimize_stages(
        copy.deepcopy(proto),
        phases=[t.annotate_downstream_side_inputs, t.fix_side_input_pcoll_coders, t.pack_combiners,
                t.lift_combiners, t.expand_sdf, t.expand_gbk, t.sink_flattens, t.greedily_fuse],
        known_runner_urns=frozenset([common_urns.primitives.FLATTEN.urn, common_urns.primitives.GROUP_BY_KEY.urn]),
    )
    return stages


# Side inputs that a single-element stage may read: each is bounded whatever the number of images.
BOUNDED_SIDE_INPUTS = {
    "AssignShards/LayOut": "the bucket counts (at most 3 x 65,536 pairs) laid out: one small layout per split",
    "PublishDataset/CountTallies": "one count per (split, class) and per rejection reason",
    "PublishDataset/ShardStats": "one line per shard",
    "PublishDataset/FindDuplicates": "one dict: the duplicate counts and the first 20 groups",
    "PublishDataset/SummariseGroups": "one dict: the --group_by counts and the first 10 examples",
    "PublishDataset/CombineStats": "one SplitStats per split: pixel sums and source-size histograms",
    "WriteSources/WriteSourceFiles": "the names of the run's sources files: one per bundle of written images",
    "PublishDataset/CountPresent": "--if_exists=append: one count, the images already in the dataset",
    # errors.jsonl: one line per rejected or skipped file, streamed by the step that writes the description.
    "AllRejections": "the rejected and skipped files, streamed once into errors.jsonl",
}


def assert_single_element_stages_are_bounded(proto, per_image_steps, bounded_side_inputs) -> list:
    """No stage that starts from a single element (an Impulse) holds a step of `per_image_steps` or reads a side
    input other than those of `bounded_side_inputs` (by the name of the step that makes it); returns those
    stages."""
    from apache_beam.portability import common_urns

    stages = optimized_stages(proto)
    producer = {pcoll: t.unique_name for t in proto.components.transforms.values() if not t.subtransforms
                for pcoll in t.outputs.values()}
    single = [s for s in stages if any(x.spec.urn == common_urns.primitives.IMPULSE.urn for x in s.transforms)]
    for stage in single:
        names = [x.unique_name for x in stage.transforms]
        assert not [n for n in names if n.startswith(per_image_steps)], names
        for pcoll in stage.side_inputs():
            made_by = producer[pcoll]
            assert any(made_by.startswith(prefix) for prefix in bounded_side_inputs), (
                f"{stage.name} reads {made_by} as a side input on one worker")
    return single
