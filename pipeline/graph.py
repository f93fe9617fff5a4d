"""The Beam graph: ListImages -> AssignLabels -> ShuffleImages -> ConvertImages -> WriteShards -> DescribeDataset."""

from __future__ import annotations

import apache_beam as beam

from pipeline import __version__
from pipeline.options import Settings
from pipeline.plan import Plan
from transforms.convert import REJECTED, WRITTEN, ConvertImages
from transforms.describe import DescribeDataset
from transforms.labels import UNLABELED, AssignLabels
from transforms.listing import FOUND, SKIPPED, ListImages
from transforms.shuffle import ShuffleImages
from transforms.write import WriteShards


def build_pipeline(p: beam.Pipeline, settings: Settings, plan: Plan, start_time: float, run_id: str) -> dict:
    """Add the conversion to `p`; returns its main PCollections so tests can drive the graph.

    `run_id` names the run's own temporary folder in the output folder (see transforms.outputs).
    """
    listed = p | "ListImages" >> ListImages(settings.input_dir, settings.follow_symlinks)
    # FileRef -> ImageRef (label, split, shuffle key)
    labeled = listed.images | "AssignLabels" >> AssignLabels(
        plan.class_names,
        split_folders=plan.split_folders,
        seed=settings.seed,
        validation_split=settings.validation_split,
        test_split=settings.test_split,
    )
    # ImageRef, in a reproducible random order, spread over workers
    shuffled = labeled.images | "ShuffleImages" >> ShuffleImages(plan.total_images)
    # ImageRef -> serialized tf.train.Example, on one output per split
    converted = shuffled | "ConvertImages" >> ConvertImages(
        settings.image, settings.schema, settings.conversion_threads
    )
    # {split: serialized Examples} -> ShardInfo
    shards = {split: converted[split] for split in plan.num_shards} | "WriteShards" >> WriteShards(
        settings.output_dir, run_id, plan.num_shards, settings.compression, settings.index_files
    )
    rejections = (listed[SKIPPED], labeled[UNLABELED], converted[REJECTED]) | "AllRejections" >> beam.Flatten()
    info = {
        "written": converted[WRITTEN],
        "rejections": rejections,
        "shards": shards,
        "found": listed[FOUND],
    } | "DescribeDataset" >> DescribeDataset(
        settings.output_dir,
        run_id,
        plan.class_names,
        settings.schema,
        settings.as_dict(),
        plan.image_info(settings),
        start_time,
        __version__,
    )
    return {"converted": converted, "rejections": rejections, "shards": shards, "info": info}
