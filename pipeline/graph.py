"""The Beam graph: ListImages -> AssignLabels (or LabelFromPaths; or ReadManifest; or, with --task=detection,
ReadAnnotations) -> AssignShards -> WriteShards -> PublishDataset."""

from __future__ import annotations

import apache_beam as beam

from pipeline import __version__
from pipeline.options import Settings
from pipeline.plan import Plan
from pipeline.workers import worker_processes
from transforms.base.examples import record_id
from transforms.detection.annotated import CLASS_NAMES as ANNOTATED_CLASSES
from transforms.detection.annotated import FOUND as FOUND_IMAGES
from transforms.detection.annotated import TALLY, DetectionTally, ReadAnnotations
from transforms.detection.conversion import ALREADY_IN_DATASET, DetectionRecords, duplicate_annotations
from transforms.inputs import metadata, split_lists
from transforms.inputs.append import PRESENT, PRESENT_OBJECTS, ReadSources, SkipPresent, WriteSources, old_hashes
from transforms.inputs.append import REJECTED as CHANGED
from transforms.inputs.duplicates import DROPPED, DropDuplicates
from transforms.inputs.duplicates import HASHES as DUP_HASHES
from transforms.inputs.listing import FOUND, SKIPPED, ListImages
from transforms.inputs.manifest import CLASS_NAMES, ReadManifest
from transforms.inputs.manifest import STATS as MANIFEST_STATS
from transforms.inputs.metadata import JoinMetadata
from transforms.inputs.path_labels import LabelFromPaths
from transforms.inputs.split_lists import JoinSplitLists
from transforms.labels.assign import GROUPS, UNLABELED, AssignLabels, UniqueIds
from transforms.labels.assign import REJECTED as DUPLICATE_IDS
from transforms.labels.layout import has_group_capture
from transforms.labels.sharding import AssignShards
from transforms.output.describe import PublishDataset
from transforms.output.ownership import run_dir, shards_dir
from transforms.output.resume import Resume, fingerprint
from transforms.output.write import HASHES, OBJECTS, REJECTED, RESUMED, STATS, WRITTEN, WriteShards


def build_pipeline(p: beam.Pipeline, settings: Settings, plan: Plan, start_time: float, run_id: str) -> None:
    """Add the conversion to `p`.

    `run_id` names the run's own temporary folder in the output folder (see transforms.output.ownership).
    """
    sources = None  # an append's: the records of the dataset it grows
    # the hash split of an image whose split no folder, list or row gives
    hash_split = dict(seed=settings.seed, validation_split=settings.validation_split, test_split=settings.test_split)
    # the class names the labelling takes as given (--labels_file's, or an append's dataset's); None: found in the job
    given_names = plan.class_names if settings.labels_file or plan.base is not None else None
    annotations = None  # --task=detection: ReadAnnotations' outputs
    if settings.detection:
        # ImageRef of every image the annotations keep (its objects, its split), read and joined in the job
        annotations = p | "ReadAnnotations" >> ReadAnnotations(
            settings.input_dir,
            plan.detection,  # the format and layout the launcher found
            plan.class_names or None,  # YOLO's names or --labels_file's; None: found in the job
            **hash_split,
            drop_empty=settings.images_without_objects == "drop",
            segmentations=settings.instance_masks,
            known=plan.base_class_names,  # an append's: the dataset's classes keep their ids, new ones follow
        )
        images, not_listed, found = annotations["images"], [annotations["rejections"]], annotations[FOUND_IMAGES]
        class_names = annotations.get(ANNOTATED_CLASSES, plan.class_names)  # found in the job: one list
    elif settings.manifest:
        # ImageRef of every usable manifest row (label and split from the row); the manifest is read in the job
        read = p | "ReadManifest" >> ReadManifest(
            plan.manifest_files or settings.manifest,  # its files (entries and globs matched by the launcher)
            plan.manifest_format,
            plan.manifest_readings or settings.input_dir,  # how each file's rows are read
            # None: the rows' labels, found in the job; an append's are the dataset's; a one-hot header's
            plan.class_names if given_names is not None or plan.class_columns else None,
            **hash_split,
            size=plan.manifest_file_size,
            features=plan.features,
            multi_label=settings.multi_label,
            group_by=settings.group_by,
            groups=plan.manifest_groups,
        )
        images, not_listed, found, groups = read["images"], [read[SKIPPED]], read[FOUND], read[GROUPS]
        manifest_stats = read[MANIFEST_STATS]
        class_names = read.get(CLASS_NAMES, plan.class_names)  # found in the job: a PCollection of one list
    else:
        # FileRef of every candidate image, listed class folder by class folder on the workers
        listed = p | "ListImages" >> ListImages(settings.input_dir, settings.follow_symlinks, plan.split_folders)
        files, found, list_rejections = listed["images"], listed[FOUND], []
        if settings.split_lists:
            # FileRef -> ListedFile (the file and the split its list gives): the lists and the files joined by name
            joined = files | "JoinSplitLists" >> JoinSplitLists(settings.split_lists, plan.split_list_rule,
                                                                 settings.input_dir)
            files, list_stats = joined["files"], joined[split_lists.STATS]
            list_rejections = [joined[split_lists.REJECTED]]
            # the names no file has count as found, as a manifest's rows do: each is in errors.jsonl
            found = (found, joined[split_lists.FOUND]) | "FoundAndListed" >> beam.Flatten()
        class_names = plan.class_names
        if settings.label_from:
            # FileRef (or ListedFile) -> ImageRef: the class name --label_from finds in the path; ids found in the
            # job, unless given
            labeled = files | "LabelFromPaths" >> LabelFromPaths(
                settings.label_from,
                given_names,
                split_folders=plan.split_folders,
                **hash_split,
                group_by=settings.group_by,
            )
            images, groups = labeled["images"], labeled[GROUPS]
            not_listed = [listed[SKIPPED], *list_rejections, labeled[SKIPPED]]
            class_names = labeled.get(CLASS_NAMES, plan.class_names)  # found in the job: a PCollection of one list
        else:
            # FileRef (or ListedFile) -> ImageRef (label, split, shuffle key)
            labeled = files | "AssignLabels" >> AssignLabels(
                plan.class_names,
                split_folders=plan.split_folders,
                **hash_split,
                group_by=settings.group_by,
                unlabeled=settings.unlabeled,
            )
            images, not_listed = labeled.images, [listed[SKIPPED], *list_rejections, labeled[UNLABELED]]
            groups = labeled[GROUPS]
        if settings.unlabeled:
            # ImageRef -> ImageRef of distinct ids (a record's id is its file name without the extension); on an
            # append, an id the dataset holds is its record's file's only
            taken = None
            if plan.base is not None:
                sources = p | "ReadSources" >> ReadSources(plan.base_sources)
                taken = sources | "DatasetIds" >> beam.MapTuple(lambda relpath, _: (record_id(relpath), relpath))
            unique = images | "UniqueIds" >> UniqueIds(taken)
            images = unique.images
            not_listed.append(unique[DUPLICATE_IDS])
        if settings.metadata:
            # ImageRef -> ImageRef with its --metadata row's extras: the file and the images joined by relpath
            joined = images | "JoinMetadata" >> JoinMetadata(settings.metadata, plan.metadata_format,
                                                             settings.input_dir, plan.features)
            images, metadata_stats = joined["images"], joined[metadata.STATS]
            not_listed.append(joined[metadata.SKIPPED])
    present = old_records = None
    if plan.base is not None:
        # --if_exists=append: (relpath, (sha256, split, label)) of every record the dataset holds, from its sources
        # files; ImageRef -> the ImageRefs it does not hold yet (a changed file is rejected, one there is counted)
        if sources is None:
            sources = p | "ReadSources" >> ReadSources(plan.base_sources)
        judged = images | "SkipPresent" >> SkipPresent(sources, settings.image.max_file_bytes,
                                                       settings.image.throttled_retry_s,
                                                       settings.image.reads_per_s_at_start)
        images, present = judged.images, judged[PRESENT]
        not_listed.append(judged[CHANGED])
        old_records = sources | "OldHashes" >> beam.Map(old_hashes)  # the duplicate report covers the dataset
    dropped, source_hashes = [], None
    if settings.duplicates == "drop":
        # ImageRef -> the ImageRefs to write: every file hashed first (a read of its own), one copy per group kept;
        # on an append, no copy of a record the dataset holds (a copy an earlier run dropped stays dropped)
        deduped = images | "DropDuplicates" >> DropDuplicates(settings.image.max_file_bytes,
                                                               settings.image.throttled_retry_s,
                                                               settings.image.reads_per_s_at_start,
                                                               held=old_records,
                                                               # a dropped copy's annotations: errors.jsonl lines
                                                               lost=duplicate_annotations if settings.detection
                                                               else None)
        images, dropped, source_hashes = deduped["kept"], [deduped[DROPPED]], deduped[DUP_HASHES]
    # ImageRef -> (ShardKey, ImageRef): shards counted, balanced and fixed before any image is read
    assign = AssignShards(plan.sizing)
    placed = images | "AssignShards" >> assign
    resume = None
    if plan.record is not None:  # done records of the chunks converted; an interrupted run's taken instead
        resume = Resume(fingerprint(plan.record), run_id, run_dir(settings.output_dir, run_id), plan.resume_from,
                        settings.image.max_file_bytes, settings.image.throttled_retry_s,
                        settings.image.reads_per_s_at_start)
    # (ShardKey, ImageRef) -> ShardInfo: each shard converted and written where its images are grouped
    written = placed | "WriteShards" >> WriteShards(
        settings.output_dir, run_id, settings.image, settings.schema, settings.conversion_threads,
        settings.compression, settings.index_files, settings.file_format, settings.shard_names, resume=resume,
        workers=worker_processes(p.options), layouts=assign.layouts,  # chunks sized so that every worker gets several
        detection=detection_records(settings) if settings.detection else None,  # records of boxes (and masks)
        class_names=class_names if settings.detection else None,
    )
    rejections = (*not_listed, *dropped, written[REJECTED]) | "AllRejections" >> beam.Flatten()
    # every written image's source hash; with drop, every hashed source's (the report covers the input)
    hashes = written[HASHES] if source_hashes is None else source_hashes
    if old_records is not None:
        hashes = (hashes, old_records) | "DatasetHashes" >> beam.Flatten()
    inputs = {
        "written": written[WRITTEN],
        "rejections": rejections,
        "shards": written.shards,
        "found": found,
        "hashes": hashes,
        "stats": written[STATS],  # (split, SplitStats) per shard: pixel sums, source sizes, upscaled
        # the paths of this run's sources files, [relpath, sha256, split, label] per written image, beside its shards
        "sources": written[HASHES] | "WriteSources" >> WriteSources(shards_dir(settings.output_dir, run_id), run_id),
        "lines": written[HASHES],  # the sources lines, counted per split against the records
    }
    if present is not None:
        inputs["present"] = present
        inputs["held"] = sources  # the dataset's sources lines, counted per split against its description
    if resume is not None:
        inputs["resumed"] = written[RESUMED]
    grouped = ((bool(settings.group_by) and not settings.unlabeled) or plan.manifest_groups
               or has_group_capture(settings.label_from))
    if grouped:
        inputs["groups"] = groups
    if settings.metadata:
        inputs["metadata"] = metadata_stats
    if settings.manifest and not settings.detection:
        inputs["manifest"] = manifest_stats
    if annotations is not None:  # the parsers' tally and the objects written: every annotation accounted for
        tallies = [annotations[TALLY], written[OBJECTS]]
        if present is not None:  # an append: the objects of the images the dataset holds already
            tallies.append(judged[PRESENT_OBJECTS] | "ObjectsHeld" >> beam.Map(lambda n: {ALREADY_IN_DATASET: n}))
        inputs["detection"] = (tallies
                               | "AnnotationTallies" >> beam.Flatten()
                               | "SumAnnotations" >> beam.CombineGlobally(DetectionTally()))
    if settings.split_lists:
        inputs["split_lists"] = list_stats
    split_by = ("unlabeled" if settings.unlabeled else "dataset_splits" if plan.detection and plan.detection.splits
                else "split_folders" if plan.split_folders or plan.folder_splits
                else "split_lists" if settings.split_lists else "group_hash" if grouped else "path_hash")
    inputs | "PublishDataset" >> PublishDataset(
        settings.output_dir,
        run_id,
        class_names,
        settings.schema,
        settings.as_dict(),
        plan.image_info(settings),
        start_time,
        __version__,
        split_by,
        extra_features=plan.features,
        base=plan.base,
        earlier_runs=[earlier[0] for earlier in plan.resume_from],
        detection=dict(first_id=settings.first_class_id, instance_masks=settings.instance_masks,
                       semantic_masks=plan.detection.semantic_masks, input_format=plan.detection.input_format)
        if settings.detection else None,
    )


def detection_records(settings: Settings) -> DetectionRecords:
    """How --task=detection's records are built (transforms.detection.conversion)."""
    return DetectionRecords(first_id=settings.first_class_id, instance_masks=settings.instance_masks,
                            drop_empty=settings.images_without_objects == "drop",
                            max_mask_bytes=settings.image.max_file_bytes)
