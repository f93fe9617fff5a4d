"""run(argv): validate options, plan, prepare the output, build the graph, run it and print the summary.

The run's story is `run` below; each step is a module of its own: options
(pipeline/options.py), planning the input (pipeline/plan.py), the output folder
(pipeline/output_folder.py), the graph (pipeline/graph.py), the local runner
(pipeline/local/) or Dataflow (pipeline/cloud.py), the summary (pipeline/report.py).

    python -m pipeline.main --input_dir=photos/ --output_dir=tfrecords/
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, StandardOptions

from pipeline import cloud
from pipeline.errors import UserError
from pipeline.flags import help_text
from pipeline.graph import build_pipeline
from pipeline.options import Settings, check_flags, check_split_list_flags, ignored_options, validate
from pipeline.output_folder import OldOutputs, append_base, existing_dataset, give_back_lock, prepare_output, take_lock
from pipeline.plan import Plan, plan_dataset, plan_record
from pipeline.report import summarise_run
from pipeline.workers import is_local_run
from transforms.base.paths import is_gcs
from transforms.output.lock import holder_record
from transforms.output.ownership import new_run_id

__all__ = ["run"]

_LOG = logging.getLogger("pipeline")


class RunOptions(PipelineOptions):
    """The run's PipelineOptions, each of whose views (`view_as`) is made once.

    Beam asks the pipeline's options for a view on every step it applies and
    in every type check (about 480 times for the default graph), and each new
    view builds an argparse parser of its class's flags and parses the command
    line again: about 1 ms of CPU each. A view holds no values of its own (they
    live in the dict its options share with every view), so one view per class
    serves every caller, and a value set through one is seen through all.
    """

    def view_as(self, cls):
        views = self.__dict__.setdefault("_views", {})
        if cls not in views:
            views[cls] = super().view_as(cls)
        return views[cls]


def configure_logging(settings: Settings) -> None:
    level = logging.INFO if settings.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", force=True)
    logging.getLogger("pipeline").setLevel(logging.INFO if not settings.quiet else logging.WARNING)
    # Pillow logs some errors of the files it then fails to open; each such file is
    # rejected with its reason in errors.jsonl.
    logging.getLogger("PIL").setLevel(logging.NOTSET if settings.verbose else logging.CRITICAL)
    if not settings.verbose:
        logging.getLogger("apache_beam").setLevel(logging.ERROR)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def run(argv: list[str] | None = None) -> int:
    """Run one conversion; returns the process exit code.

    Raises:
        UserError: for bad options or input, before anything is written.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(help_text())
        return 0
    check_flags(argv)
    options = RunOptions(argv)
    settings = validate(options)
    check_split_list_flags(argv, settings)
    configure_logging(settings)
    local_manifest = next((entry for entry in settings.manifests if not is_gcs(entry)), None)
    if local_manifest and cloud.is_dataflow(options):
        raise UserError(f"--manifest {local_manifest} is not a gs:// path, and Dataflow workers read the manifest: "
                        "copy it to a bucket (gcloud storage cp) and give its gs:// path")
    if settings.metadata and cloud.is_dataflow(options) and not is_gcs(settings.metadata):
        raise UserError(f"--metadata {settings.metadata} is not a gs:// path, and Dataflow workers read it: "
                        "copy it to a bucket (gcloud storage cp) and give its gs:// path")
    for _, path in settings.split_lists:
        if cloud.is_dataflow(options) and not is_gcs(path):
            raise UserError(f"--split_lists {path} is not a gs:// path, and Dataflow workers read the lists: copy it "
                            "to a bucket (gcloud storage cp) and give its gs:// path")
    cloud.configure(options, settings.input_dir, settings.output_dir)  # gs:// access, Dataflow checks
    # seconds, not minutes, to say there is no network
    cloud.check_network(options, [settings.input_dir, settings.output_dir, *settings.manifests, settings.metadata,
                                  settings.labels_file, *(path for _, path in settings.split_lists)])
    start_time = time.time()
    local = None
    if is_local_run(options) and not cloud.is_dataflow(options):
        from pipeline.local import LocalRun  # the local machinery, never imported by a Dataflow launch

        local = LocalRun(options, argv, settings)  # worker processes start now, while we plan
    with local or contextlib.nullcontext():
        done = existing_dataset(settings, options)  # --if_exists: refuse, overwrite or skip
        if done:
            print(done)  # a template launch still writes a job file: one of a job that does nothing
            return cloud.launch_nothing(options, done) if cloud.is_template_launch(options) else 0
        plan = plan_dataset(settings)  # pipeline/plan.py: the classes, the shard sizes
        for note in plan.notes + ignored_options(argv, options, settings, dataflow=cloud.is_dataflow(options),
                                                 split_folders=plan.split_folders or plan.folder_splits):
            _LOG.warning(note)
        run_id = new_run_id()
        old = _prepare_output(options, settings, plan, run_id)  # the folder's lock; leftovers leave
        if old.done:  # an interrupted run's publishing, finished, left the dataset --if_exists=skip accepts
            give_back_lock(settings, run_id)
            print(old.done)
            return cloud.launch_nothing(options, old.done) if cloud.is_template_launch(options) else 0
        try:
            append_base(settings, plan)  # --if_exists=append: the dataset it grows, read under the lock
            runner = local.runner() if local is not None else options.view_as(StandardOptions).runner
            job = beam.Pipeline(runner=runner, options=options)
            build_pipeline(job, settings, plan, start_time, run_id)  # the graph: pipeline/graph.py
            if cloud.is_dataflow(options):
                cloud.add_job_checks(job, options, settings, run_id)  # the workers' code, a template job's id
        except BaseException:
            _give_back_lock(options, settings, run_id)
            raise
        if cloud.is_dataflow(options):  # runs on the service: it shows progress in the console
            return cloud.run_on_dataflow(job, options, settings, run_id,
                                         lambda: give_back_lock(settings, run_id))
        try:
            if local is not None:
                local.run(job, run_id)
            else:  # another runner: as Beam runs it
                with job:
                    pass
            old.wait()  # only after a successful run: if this one fails, the next one finishes the deletion
            return summarise_run(settings.output_dir, run_id)
        finally:
            give_back_lock(settings, run_id)  # the job's last step released it, unless the run failed


def _prepare_output(options: PipelineOptions, settings: Settings, plan: Plan, run_id: str) -> OldOutputs:
    """Take the output folder's lock (one run per folder) and clear leftovers of interrupted runs.

    A dry run takes no lock and changes nothing. If this fails, the lock goes back.
    """
    dry_run = cloud.is_dry_run(options)
    if not dry_run:
        if cloud.is_dataflow(options):
            cloud.label_job(options, run_id)
            google = options.view_as(GoogleCloudOptions)
            holder = holder_record(run_id, "dataflow", project=google.project, region=google.region,
                                   job_name=google.job_name, job_id=None,
                                   template=cloud.is_template_launch(options))
        else:
            holder = holder_record(run_id, "local")
        take_lock(settings, holder, options)  # one run per output folder
    try:
        # Leftovers of interrupted runs leave the folder at once and are deleted while this one runs.
        # What decides the records: an interrupted run of the same plan is resumed (an append is not resumable:
        # the dataset it grows decides its class names once the lock is held). A detection run's done records hold
        # its annotation tallies too.
        record = plan_record(settings, plan) if settings.if_exists != "append" else None
        old = prepare_output(settings, run_id, dry_run=dry_run, background=True, record=record)
        plan.record, plan.resume_from = (record if not dry_run else None), old.resumed
        for earlier in old.resumed:
            _LOG.warning("Resuming the interrupted run %s: each chunk it converted is checked (its file and its "
                         "images' SHA-256) and taken; the rest is converted", earlier.run_id)
        if old.paths:
            _LOG.info("Removing %d leftover files of interrupted runs from %s", len(old.paths), settings.output_dir)
        _LOG.info(
            "Converting the images of %s in %s to %s (the job lists and counts them, then sizes the shards)",
            "an unlabeled set" if settings.unlabeled else "a detection dataset" if settings.detection
            else f"{len(plan.class_names)} classes" if plan.class_names
            else "the classes",
            f"the manifest {settings.manifest}" if settings.manifest else settings.input_dir,
            settings.output_dir,
        )
    except BaseException:
        _give_back_lock(options, settings, run_id)
        raise
    return old


def _give_back_lock(options: PipelineOptions, settings: Settings, run_id: str) -> None:
    if not cloud.is_dry_run(options):  # a dry run took none
        give_back_lock(settings, run_id)

