"""Launcher-side planning: check the folders, find the class folders, fix class ids and how shards are sized.

The launcher never lists every file: it lists the input's top folders (two
levels with split folders) and looks into each class folder only until its
first images. Of those, a small sample is read (`pipeline.estimate`): up to 200
headers for the input's image sizes, and a dozen images converted to measure
the bytes of one record. The job lists and counts the files itself and sizes
each split's shards from its own totals; on Dataflow it runs on the workers.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field

from apache_beam.io.filesystems import FileSystems

from pipeline import cloud, estimate, inputs
from pipeline.errors import UserError
from pipeline.options import Settings
from pipeline.report import human_bytes
from transforms.base import bounded, features
from transforms.base.dataset_format import split_of
from transforms.base.paths import IMAGE_EXTENSIONS, is_gcs, is_local, quoted_name, relative_path, text_name
from transforms.base.records import FileRef
from transforms.images.convert import WINDOWS_PATH_HINT
from transforms.inputs import manifest, metadata
from transforms.inputs import rows as reading
from transforms.inputs.listing import Folder, classify, list_folder, list_top
from transforms.labels.detection import detection_export, detection_message, export_file
from transforms.labels.layout import (
    NO_CLASS_FOLDER,
    UNLABELED_SPLIT,
    class_name_problem,
    class_order,
    class_order_note,
    nested_class_folders,
    same_class_names,
    split_folder_layout,
    split_folder_note,
)
from transforms.labels.sharding import ShardSizing

_LOG = logging.getLogger(__name__)


@dataclass
class Plan:
    """What the launcher decided before building the graph: class ids, the layout, how to size shards.

    The launcher never lists every file: it reads the input's top folders and
    a small sample of images. The job lists and counts the rest, and decides
    each split's shard count from its own totals (`sizing`).
    """

    class_names: list[str]  # empty for a --manifest without --labels_file: the job finds them
    split_folders: bool
    sizing: ShardSizing
    unknown_classes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    manifest_format: str = ""  # with --manifest: 'csv' or 'jsonl'
    manifest_file_size: int = 0  # with --manifest: the sampled files' mean size, standing in for each file's
    features: tuple = ()  # the extra features (transforms.base.features.FeatureType): declared, then string columns
    metadata_format: str = ""  # with --metadata: 'csv' or 'jsonl'
    manifest_groups: bool = False  # with --manifest: it has a group column (every image of a group in one split)
    base: dict | None = None  # --if_exists=append: the description of the dataset this run grows
    base_sources: list[str] = field(default_factory=list)  # its sources files' paths (transforms.inputs.append)
    record: dict | None = None  # plan_record: what decides the records; None: this run is not resumable
    resume_from: list = field(default_factory=list)  # output.resume.Earlier: the runs it resumes

    def image_info(self, settings: Settings) -> dict:
        image = settings.image
        fixed = image.resize_mode in ("stretch", "crop", "pad")
        return {
            "height": image.height if fixed else None,
            "width": image.width if fixed else None,
            "channels": 3,
            "format": image.image_format,
            "fixed_size": fixed,
        }


def _normalise(path: str) -> str:
    return os.path.realpath(path) if is_local(path) else path.rstrip("/")


GLOB_CHARACTERS = "[]*?"


def _check_local_output(output_dir: str) -> None:
    """The local output folder is a folder, or can be made: one clear line instead of a traceback later.

    Nothing is created: a probe folder is made in the nearest existing parent and removed at once.
    """
    if os.path.exists(output_dir):
        if not os.path.isdir(output_dir):
            what = "a file" if os.path.isfile(output_dir) else "not a folder (a device, FIFO or socket)"
            raise UserError(f"--output_dir {output_dir} is {what}: give a folder")
        return
    parent = os.path.dirname(os.path.abspath(output_dir))
    while not os.path.lexists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UserError(f"--output_dir {output_dir} cannot be created: {parent} is not a folder; give a path "
                        "under a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".image-tfrecords-probe-", dir=parent))
    except OSError as e:
        raise UserError(f"--output_dir {output_dir} cannot be created in {parent} ({e.strerror or e}): choose a "
                        "folder you can write to") from None


def check_folders(settings: Settings) -> None:
    """Input exists, output is not inside it, output is a folder or can be made, no glob characters in it."""
    if is_local(settings.input_dir) and not os.path.isdir(settings.input_dir):
        what = "is a file, not a folder" if os.path.exists(settings.input_dir) else "does not exist"
        raise UserError(f"--input_dir {settings.input_dir} {what}: give the folder that holds the class folders")
    source, target = _normalise(settings.input_dir), _normalise(settings.output_dir)
    if not settings.manifest and (target == source or target.startswith(source.rstrip("/") + "/")):
        raise UserError(
            f"--output_dir {settings.output_dir} is inside --input_dir {settings.input_dir}: the shards would be "
            "listed as input on the next run; choose an output folder outside the input folder"
        )
    glob = sorted({c for c in settings.output_dir if c in GLOB_CHARACTERS})
    if glob:
        # Beam's file sinks find their own temporary files by glob, with the folder's name in the pattern.
        raise UserError(
            f"--output_dir {settings.output_dir} contains {' and '.join(repr(c) for c in glob)}, which Beam's file "
            "writers read as glob characters: choose a folder name without [ ] * ?"
        )
    if is_local(settings.output_dir):
        _check_local_output(settings.output_dir)
    # gs:// folders are only name prefixes: what can be missing is the bucket.
    for flag, path in (("--input_dir", settings.input_dir), ("--output_dir", settings.output_dir),
                       ("--labels_file", settings.labels_file)):
        if is_gcs(path):
            cloud.check_gcs_folder(flag, path)


LABELS_FILE_BYTES = 64 << 20  # a labels file of a million classes of 60 characters


def read_labels_file(path: str) -> list[str]:
    """Class names, one per line; line i is id i. A regular file of at most LABELS_FILE_BYTES."""
    data = inputs.read_small_file("--labels_file", path, LABELS_FILE_BYTES, "labels file, one class name a line")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"--labels_file {path} is not UTF-8 text: save it as plain text, one class per line") from None
    lines = [line.strip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise UserError(f"--labels_file {path} is empty: write one class name per line")
    for number, name in enumerate(lines, 1):
        if not name:
            raise UserError(f"--labels_file {path} line {number} is blank: line i gives id i-1, so remove it")
    seen = Counter(lines)
    dupes = [name for name, n in seen.items() if n > 1]
    if dupes:
        raise UserError(f"--labels_file {path} lists the class {dupes[0]!r} more than once: keep one line per class")
    same = same_class_names(lines)
    if same:
        raise UserError(f"--labels_file {path} lists the classes {_pair(same)}, which {same[2]}, so they would be two "
                        "classes that read as one: keep one of them")
    return lines


def _pair(same: tuple[str, str, str]) -> str:
    """The two names of `same_class_names`, quoted; escaped (\\u0301) when they differ in normal form only."""
    show = ascii if "normal form" in same[2] else quoted_name
    return f"{show(same[0])} and {show(same[1])}"


def estimated_bytes_per_image(settings: Settings, source_size: int) -> float:
    """A rough output size of one image, when no image of the sample could be converted."""
    image = settings.image
    if image.resize_mode == "none":
        return float(source_size)
    pixels = image.width * image.height
    if image.image_format == "png":
        return pixels * 1.5
    return pixels * (0.08 + 0.35 * (image.jpeg_quality / 100) ** 2)


def shard_sizing(settings: Settings, sample: estimate.OutputSample | None, sampled_sizes: list[int]
                 ) -> ShardSizing:
    """How the job sizes each split's shards once it has counted them, from the sample converted here.

    For a fixed output size every image comes out about the same size; with
    --resize_mode=fit or none the output follows the source, so the sample's
    ratio of output to file bytes is applied to the split's file bytes.
    """
    if sample is None:
        typical = sum(sampled_sizes) / len(sampled_sizes) if sampled_sizes else 0
        per_image = estimated_bytes_per_image(settings, typical)
        per_source_byte = None
    else:
        per_image = sample.bytes_per_image
        per_source_byte = None
        if settings.image.resize_mode in ("fit", "none") and sample.source_bytes:
            per_source_byte = sample.record_bytes / sample.source_bytes
    return ShardSizing(dict(settings.num_shards), settings.shard_size_mb, per_image, per_source_byte)


def upscale_notice(settings: Settings, files: list[tuple[str, str, int]], sample: estimate.OutputSample | None
                   ) -> str | None:
    """The notice when most sampled images are smaller than --image_size (sizes from headers only), else None.

    The run goes on with the size given: the notice names the typical source
    size, the --image_size that keeps it, and the bytes per image at each.
    """
    image = settings.image
    if image.resize_mode in ("fit", "none"):
        return None
    sizes = estimate.sample_sizes([path for path, _, _ in files], image)
    smaller = estimate.smaller_than_output(sizes, image)
    if not sizes or smaller * 2 <= len(sizes):
        return None
    width, height = estimate.typical_size([s for s in sizes if s[0] < image.width and s[1] < image.height])
    current, suggested = estimate.size_text(image.width, image.height), estimate.size_text(width, height)
    factor = min(image.width / width, image.height / height)
    text = (f"most input images are smaller than --image_size={current}: {smaller} of {len(sizes)} sampled, "
            f"typically {width}x{height} px, will be upscaled about {factor:.1f}x, which adds bytes but no detail.")
    small = estimate.measure_output(files, estimate.at_size(image, width, height), settings.schema,
                                    settings.compression)
    if sample is not None and small is not None:
        text += (f" Each image will take about {human_bytes(sample.bytes_per_image)} at "
                 f"--image_size={current}, about {human_bytes(small.bytes_per_image)} at "
                 f"--image_size={suggested}.")
    return text + (f" To keep their size, stop this run (Ctrl-C) and run again with --image_size={suggested}; "
                   f"this run goes on at {current}.")


# Per folder, the launcher looks at no more than this many entries for images (a folder of other files
# is not read to its end), and keeps at most this many images in all as its sample.
PROBE_ENTRIES = 2_000
SAMPLE_IMAGES = 200
# The names of other files kept per folder (to recognise a detection export: transforms.labels.detection).
OTHER_FILES = 20


@dataclass
class _Probe:
    """What the launcher saw of one folder: its first images (up to `want`), and entries looked at."""

    folder: Folder
    images: list = field(default_factory=list)  # (path, relpath, size)
    others: list = field(default_factory=list)  # relpaths of its first OTHER_FILES files that are not images
    entries: int = 0
    exhausted: bool = False  # the folder holds fewer entries than the budget: `images` is all there is


def _probe(folder: Folder, input_dir: str, follow_symlinks: bool, want: int) -> _Probe:
    probe = _Probe(folder)
    # Small pages on gs://: a probe usually stops at the first image, and a page holds up to 1,000 names.
    for entry in list_folder(folder, input_dir, follow_symlinks, page_size=min(PROBE_ENTRIES, 10 * want)):
        probe.entries += 1
        ref = classify(entry, input_dir)
        if isinstance(ref, FileRef):
            probe.images.append((ref.path, ref.relpath, ref.size))
            if len(probe.images) >= want:
                return probe
        elif len(probe.others) < OTHER_FILES:
            probe.others.append(ref.relpath)
        if probe.entries >= PROBE_ENTRIES:
            return probe
    probe.exhausted = True
    return probe


def _probe_all(folders: list[Folder], settings: Settings) -> list[_Probe]:
    """Look into each folder, a few at a time: its first images, within a budget of entries."""
    want = max(1, -(-SAMPLE_IMAGES // max(1, len(folders))))
    with concurrent.futures.ThreadPoolExecutor(max_workers=PROBE_THREADS) as pool:
        return list(pool.map(lambda f: _probe(f, settings.input_dir, settings.follow_symlinks, want), folders))


PROBE_THREADS = 16


def _has_images(probe: _Probe) -> bool:
    """A folder counts as a class folder if images were seen in it, or if it was too big to look through."""
    return bool(probe.images) or not probe.exhausted


def _top(settings: Settings, below: Folder | None = None, others: list[str] | None = None
         ) -> tuple[int, list[FileRef], list[Folder]]:
    """(entries seen, image files, subfolders) directly in the input folder, or in `below`; the relpaths of the
    first OTHER_FILES other files go to `others`."""
    entries, images, folders = 0, [], []
    for item in list_top(settings.input_dir, settings.follow_symlinks, 1, below):
        if isinstance(item, Folder):
            folders.append(item)
            continue
        entries += 1
        ref = classify(item, settings.input_dir)
        if isinstance(ref, FileRef):
            images.append(ref)
        elif others is not None and (len(others) < OTHER_FILES or export_file(ref.relpath)):
            others.append(ref.relpath)  # and data.yaml or a COCO file however many files come first
    return entries, images, folders


def _refuse_detection_export(settings: Settings, probes: list[_Probe], files: list[str], folders: list[Folder]
                             ) -> None:
    """Refuse a YOLO, Pascal VOC or COCO export (boxes, not classes) from the names seen so far: the other files
    `files`, the `folders` listed, the probes' first images and other files."""
    seen = [*files, *(image[1] for p in probes for image in p.images), *(o for p in probes for o in p.others)]
    export = detection_export(seen, [_name(f, settings.input_dir) for f in (*folders, *(p.folder for p in probes))])
    if export is not None:
        raise UserError(detection_message(settings.input_dir, export))


def _name(folder: Folder, input_dir: str) -> str:
    """A folder's path below the input folder, as the listing names it (`classify`: UTF-8 in any locale)."""
    name = relative_path(folder.path, input_dir).rstrip("/")
    return text_name(name) if is_local(folder.path) else name


def nested_layout_message(input_dir: str, nested: dict[str, set[str]], split_folders: bool) -> str:
    """The one line that refuses folders of class folders taken as classes (training_set/{cats,dogs}/)."""
    shown = ", ".join(f"{folder}/{{{','.join(sorted(inner)[:3])}{',...' if len(inner) > 3 else ''}}}/"
                      for folder, inner in sorted(nested.items())[:3])
    where = "the class folders inside the split folders" if split_folders else "the folders"
    return (f"every image found in {input_dir} is inside a folder within {where} ({shown}): they are not "
            "classes but folders of class folders, most likely split folders under names this tool does not "
            "know; rename them train/, validation/ (or val/, dev/) and test/, or move their class folders up "
            "a level, or list the images and labels in a --manifest")


def plan_dataset(settings: Settings) -> Plan:
    """Look at the input's top folders and a sample of its images; decide class ids, the layout, shard sizing.

    Bounded whatever the input's size: the class folders are listed, not the
    files in them; each folder is looked into only until its first images.

    Raises:
        UserError: for an empty input, no images, no class folders, or a bad layout.
    """
    check_folders(settings)
    if settings.manifest:
        return plan_manifest(settings)
    input_dir = settings.input_dir
    flat_splits = []  # (name, images, path) of each split folder of images and no class folders
    try:
        other_files: list[str] = []  # the first names of files that are not images (and data.yaml, COCO files)
        entries, loose, top_folders = _top(settings, others=other_files)
        if not entries and not top_folders:
            raise UserError(f"--input_dir {input_dir} is empty: put images in <input_dir>/<class>/<image>")
        probes = _probe_all(top_folders, settings)
        if not settings.unlabeled:  # a YOLO, VOC or COCO export: boxes, not classes
            _refuse_detection_export(settings, probes, other_files, top_folders)
        top_with_images = {_name(p.folder, input_dir) for p in probes if _has_images(p)}
        seen = entries + sum(p.entries for p in probes)
        if not top_with_images and not loose:
            raise UserError(
                f"no images found in {input_dir}: {seen} files looked at, none with an image extension "
                f"({' '.join(sorted(IMAGE_EXTENSIONS))})"
            )
        if settings.unlabeled:
            return plan_unlabeled(settings, loose, sorted(top_with_images))
        try:
            split_folders = split_folder_layout(top_with_images)
        except ValueError as e:
            raise UserError(str(e)) from None
        if split_folders:
            class_probes, loose, class_folders = [], [], []
            for split_folder in (p.folder for p in probes if _has_images(p)):
                _, images, folders = _top(settings, split_folder, other_files)
                loose += images
                if images and not folders:
                    flat_splits.append((_name(split_folder, input_dir), len(images), split_folder.path))
                class_probes += _probe_all(folders, settings)
                class_folders += folders
            _refuse_detection_export(settings, class_probes, [*other_files, *(i.relpath for i in loose[:20])],
                                     class_folders)
            probes = class_probes
            folder_classes = class_order({_name(p.folder, input_dir).split("/")[1] for p in probes if _has_images(p)})
        else:
            folder_classes = class_order(top_with_images)
        nested = nested_class_folders([image[1] for p in probes for image in p.images], split_folders)
        if nested:
            raise UserError(nested_layout_message(input_dir, nested, split_folders))
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"--input_dir {input_dir} cannot be listed ({type(e).__name__}: {e})") from None
    for name in folder_classes:
        problem = class_name_problem(name)
        if problem:
            raise UserError(f"the class folder {quoted_name(name)} in {input_dir} has {problem}: rename the folder")
    same = same_class_names(folder_classes)
    if same:
        raise UserError(f"the class folders {_pair(same)} in {input_dir} {same[2]}, so they would be two classes "
                        "that read as one: merge them into one folder, or rename one")
    if not folder_classes:
        where = "its split folders" if split_folders else input_dir
        raise UserError(
            f"found {len(loose)} images directly in {where} but no class folders: expected "
            "<input_dir>/<class>/<image> (or <input_dir>/<split>/<class>/<image>), one folder per class"
            + ("" if split_folders else "; to convert them without labels (a test set to predict), give --unlabeled")
        )
    notes = [split_folder_note(top_with_images)] if split_folders else []
    # Kaggle's layout: train/<class>/ and a flat test/ of images to predict
    notes += [f"{name}/ holds {count} images and no class folders, an unlabeled set: they are skipped "
              f"({NO_CLASS_FOLDER}); convert them on their own with --input_dir={path.rstrip('/')} --unlabeled"
              for name, count, path in flat_splits]
    notes += linked_class_notes([p.folder for p in probes if _has_images(p)], input_dir)
    if settings.labels_file:
        class_names = read_labels_file(settings.labels_file)
        unknown = sorted(set(folder_classes) - set(class_names))
        if unknown:
            notes.append(
                f"{len(unknown)} class folder(s) are not in the labels file and their images will be skipped "
                f"as unknown_class: {', '.join(unknown[:10])}"
            )
        if not set(folder_classes) & set(class_names):
            raise UserError(
                f"none of the {len(folder_classes)} class folders in {input_dir} is a class in the labels file "
                f"{settings.labels_file}: check that the class folder names match its lines"
            )
    else:
        class_names, unknown = folder_classes, []
        order = class_order_note(class_names)
        if order:
            notes.append(order + ("; an append keeps the ids of the dataset it grows (its labels.txt)"
                                  if settings.if_exists == "append" else ""))
    known = set(class_names)
    sample_files = [image for p in probes for image in p.images if _class_of(image[1], split_folders) in known]
    sample = estimate.measure_output(sample_files, settings.image, settings.schema, settings.compression)
    # --quiet prints nothing but errors and the summary: no advice either.
    upscale = None if settings.quiet else upscale_notice(settings, sample_files, sample)
    if upscale:
        notes.insert(0, upscale)
    plan = Plan(
        class_names=class_names,
        split_folders=split_folders,
        sizing=shard_sizing(settings, sample, [size for _, _, size in sample_files]),
        unknown_classes=unknown,
        notes=notes,
    )
    return plan_metadata(settings, plan) if settings.metadata else plan


def linked_class_notes(folders: list[Folder], input_dir: str) -> list[str]:
    """A line for each local class folder that is a symlink to another class folder: its images are read once,
    under the folder's own name, and every name through the link is skipped (symlink_alias)."""
    real = {}
    for folder in folders:
        if is_local(folder.path) and not os.path.islink(folder.path):
            real.setdefault(os.path.realpath(folder.path), folder)
    notes = []
    for folder in folders:
        target = real.get(os.path.realpath(folder.path)) if is_local(folder.path) else None
        if target is not None and target is not folder:
            notes.append(f"the class folder {quoted_name(_name(folder, input_dir))} is a symlink to the class folder "
                         f"{quoted_name(_name(target, input_dir))}: its images are read once, in that class, and "
                         "each name through the link is skipped (symlink_alias); remove the link to drop the class")
    return notes


def plan_unlabeled(settings: Settings, images: list[FileRef], folders: list[str]) -> Plan:
    """Plan an --unlabeled run: the images directly in --input_dir (`images`), no classes, one split; refused
    when folders in it hold images (`folders`): class or split folders, whose images would be left out.

    Raises:
        UserError: for folders with images, or no image directly in --input_dir.
    """
    input_dir = settings.input_dir
    if folders:
        shown_folders = ", ".join(f"{shown(name, 40)}/" for name in folders[:5]) + (", ..." if len(folders) > 5
                                                                                    else "")
        flat = next((name for name in folders if split_of(name) == UNLABELED_SPLIT), folders[0])
        raise UserError(
            f"--unlabeled converts the images directly in {input_dir}, and it holds folders of images "
            f"({shown_folders}) whose images would be left out: give the folder of images itself, e.g. "
            f"--input_dir={input_dir.rstrip('/')}/{flat}, or drop --unlabeled to read class folders")
    if not images:
        raise UserError(f"--unlabeled: no images directly in {input_dir}: put the images to convert in it")
    sample_files = [(ref.path, ref.relpath, ref.size) for ref in images[:SAMPLE_IMAGES]]
    sample = estimate.measure_output(sample_files, settings.image, settings.schema, settings.compression)
    upscale = None if settings.quiet else upscale_notice(settings, sample_files, sample)
    notes = [f"unlabeled set: the images directly in {input_dir} ({len(images)}) go into one split, "
             f"{UNLABELED_SPLIT}, each record with an id (its file name without the extension) and no label"]
    plan = Plan(
        class_names=[],
        split_folders=False,
        sizing=shard_sizing(settings, sample, [size for _, _, size in sample_files]),
        notes=([upscale] if upscale else []) + notes,
    )
    return plan_metadata(settings, plan) if settings.metadata else plan


# The launcher reads the header and this many rows (their files size the shards), never the whole manifest.
MANIFEST_SAMPLE_ROWS = 12
MANIFEST_SAMPLE_LIMIT = 1000  # rows looked at for the sample at most, should the first ones be unusable


def plan_manifest(settings: Settings) -> Plan:
    """Plan a --manifest run: check its header, take the class names from --labels_file (without it, the job
    finds them: Plan.class_names is empty) and size shards from its first rows' files."""
    path = settings.manifest
    fmt, columns = read_header(path, "--manifest", "path,label[,split]", '"path": ..., "label": ...')
    check_manifest_columns(path, columns, settings)
    sample_rows = []
    with _damaged_is_an_error("--manifest", path), reading.open_file(path) as raw:  # from the start (.gz: no seek)
        for number, row in manifest.read_rows(reading.file_lines(raw), fmt, settings.input_dir):
            if isinstance(row, manifest.ManifestRow):
                sample_rows.append(row)
            if len(sample_rows) >= MANIFEST_SAMPLE_ROWS or number >= MANIFEST_SAMPLE_LIMIT:
                break
    notes = []
    found = plan_features(settings, columns, f"--manifest {path}", notes)
    if settings.multi_label and "label" in columns:
        notes.append("the manifest's label column is ignored: --multi_label reads the labels column")
    # without --labels_file the job finds the class names (the rows' distinct labels)
    class_names = read_labels_file(settings.labels_file) if settings.labels_file else []
    sample_files, missing = [], []
    for row in sample_rows:
        try:
            sample_files.append((row.path, row.relpath, FileSystems.match([row.path])[0].metadata_list[0]
                                 .size_in_bytes))
        except Exception:
            missing.append(row)  # a missing file is the job's to report (read_error)
    windows = [row for row in missing if "\\" in row.relpath]
    if windows:  # said once here, and in each errors.jsonl detail (read_error)
        notes.append(f"{len(windows)} of the first {len(sample_rows)} rows name files that are not found, e.g. row "
                     f"{windows[0].row} '{shown(windows[0].relpath)}': {WINDOWS_PATH_HINT}")
    sample = estimate.measure_output(sample_files, settings.image, settings.schema, settings.compression)
    upscale = None if settings.quiet else upscale_notice(settings, sample_files, sample)  # as for class folders
    if upscale:
        notes.insert(0, upscale)
    sizes = [s for _, _, s in sample_files]
    extra = features.mean_extras_bytes(found, (dict(row.columns) for row in sample_rows))
    return Plan(
        class_names=class_names,
        split_folders=False,
        sizing=shard_sizing(settings, sample, sizes)._replace(extra_bytes_per_image=extra),
        notes=notes,
        manifest_format=fmt,
        manifest_file_size=int(sum(sizes) / len(sizes)) if sizes else 100_000,
        features=found,
        manifest_groups="group" in columns,
    )


def plan_features(settings: Settings, columns: list[str], where: str, notes: list[str]) -> tuple:
    """The extra features of a manifest or metadata file with `columns`: the declared ones (each must be a
    column), then the other columns as string (named once in `notes`)."""
    missing = [f.name for f in settings.features if f.name not in columns]
    if missing:
        raise UserError(f"--features types the column {missing[0]!r}, which {where} does not have (its columns: "
                        f"{shown_columns(columns)}): add the column, or drop it from --features")
    found, stored, left_out = features.with_columns(settings.features, columns)
    if stored:
        notes.append(f"{len(stored)} extra column(s) without a --features type, stored as string: "
                     f"{shown_columns(stored, 10)}")
    if left_out:
        notes.append(f"{len(left_out)} extra column(s) ignored, their names cannot be feature keys: "
                     f"{shown_columns(left_out, 10)} (rename them to lower-case letters, digits and _, not a stored "
                     "key, to keep them)")
    return found


@contextlib.contextmanager
def _damaged_is_an_error(flag: str, path: str = ""):
    """A compressed file found cut short or damaged, or a CSV file that ends inside a quoted field, while the
    launcher reads its first rows: one line."""
    try:
        yield
    except reading.UnclosedQuote as e:
        raise UserError(f"{flag}: {e.of(path)}; nothing was written") from None
    except reading.TruncatedFile as e:
        raise UserError(f"{flag}: {e}") from None


def shown(text: str, limit: int = 60) -> str:
    """A safe excerpt of a user's text for a terminal line: as it is when printable, else its ascii() (control
    characters, terminal escape sequences and bytes that are not UTF-8 are never echoed raw); cut to about
    `limit` characters."""
    text = text if text.isprintable() else ascii(text)
    return text if len(text) <= limit else text[:limit] + "..."


def shown_columns(columns: list[str], first: int = 20) -> str:
    """Column names, each a safe excerpt (`shown`), the first `first` of them."""
    return ", ".join(shown(c, 40) for c in columns[:first]) + (" ..." if len(columns) > first else "")


def read_header(path: str, flag: str, header: str = "path,...", fields: str = '"path": ...'
                ) -> tuple[str, list[str]]:
    """(format, column names) of a CSV or JSON Lines file, from its first line (read within a bound); `header`
    and `fields` show the user what the first line should hold.

    Raises:
        UserError: for a missing file, one that is not a regular file, or cannot be read; an empty one; a first
        line over MAX_LINE_BYTES, not UTF-8, with a column twice, or not a JSON object.
    """
    what = "CSV or JSON Lines file that lists the images" if flag == "--manifest" else "CSV or JSON Lines file"
    inputs.check_file(flag, path, what)
    try:
        with _damaged_is_an_error(flag), reading.open_file(path) as raw:
            first = next(reading.file_lines(raw), "")
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - what the file system says, named
        missing = False
        try:
            missing = not FileSystems.exists(path)
        except Exception:  # noqa: BLE001
            pass
        if missing:
            raise UserError(f"{flag} {path} does not exist: give the {what}") from None
        raise UserError(f"{flag} {path} cannot be read ({type(e).__name__}: {shown(str(e), 120)}): give the "
                        f"{what}") from None
    if isinstance(first, reading.LongLine):
        raise UserError(f"{flag} {path}: its first line is over {reading.MAX_LINE_BYTES >> 20} MiB ({first.size} "
                        f"bytes, read without being held): a header line is a few column names; is it the {what}?")
    if not first.strip():
        raise UserError(f"{flag} {path} is empty: write a header line ({header}) and one row per image, or one "
                        "JSON object per line")
    bad = reading.not_utf8(first, 1)
    if bad:
        raise UserError(f"{flag} {path}: {bad}")
    fmt = manifest.manifest_format(path, first)
    if fmt == "csv":
        columns = manifest.csv_header(first)
    else:
        try:
            row = bounded.loads(first)
            if not isinstance(row, dict):
                raise TypeError
        except (ValueError, TypeError):
            raise UserError(f"{flag} {path}: its first line is not a JSON object: write one "
                            f"{{{fields}}} object per line, or give a .csv") from None
        columns = [str(k).lower() for k in row]
    twice = sorted({c for c in columns if columns.count(c) > 1})
    if twice:  # the last one would win, silently
        raise UserError(f"{flag} {path} has the column '{shown(twice[0])}' more than once (columns: "
                        f"{shown_columns(columns)}): name each column once (column names are not case-sensitive)")
    return fmt, columns


def plan_metadata(settings: Settings, plan: Plan) -> Plan:
    """With --metadata: check its header (a path column, the --features columns) and add its features to `plan`."""
    fmt, columns = read_header(settings.metadata, "--metadata")
    if "path" not in columns:
        raise UserError(f"--metadata {settings.metadata} has no 'path' column (columns: {shown_columns(columns)}): "
                        "name the column of image paths below --input_dir path")
    plan.features = plan_features(settings, columns, f"--metadata {settings.metadata}", plan.notes)
    plan.metadata_format = fmt
    # Shards are sized with the features' bytes of the first rows (a stream: the rest is never read here).
    rows = []
    with _damaged_is_an_error("--metadata", settings.metadata), reading.open_file(settings.metadata) as raw:
        lines = reading.file_lines(raw)
        for seen, (key, row) in enumerate(metadata.read_metadata(lines, fmt, settings.input_dir), start=1):
            if key is not None:
                rows.append(dict(row.columns))
            if len(rows) >= MANIFEST_SAMPLE_ROWS or seen >= 100 * MANIFEST_SAMPLE_ROWS:
                break
    plan.sizing = plan.sizing._replace(extra_bytes_per_image=features.mean_extras_bytes(plan.features, rows))
    return plan


def check_manifest_columns(path: str, columns: list[str], settings: Settings) -> None:
    """The manifest's header has what the options need: path, and label (or labels with --multi_label)."""
    if "path" not in columns:
        raise UserError(f"--manifest {path} has no 'path' column (columns: {shown_columns(columns)}): "
                        "name the image column path and the class column label")
    if settings.multi_label:
        if "labels" not in columns:
            raise UserError(f"--manifest {path} has no 'labels' column, which --multi_label reads (columns: "
                            f"{shown_columns(columns)}): name the column of class names labels (separated by ';'), "
                            "or drop --multi_label for one label per image")
    elif "labels" in columns:
        raise UserError(f"--manifest {path} has a 'labels' column: give --multi_label to read several classes per "
                        "image from it, or name a one-class column label")
    elif "label" not in columns:
        raise UserError(f"--manifest {path} has no 'label' column (columns: {shown_columns(columns)}): "
                        "name the image column path and the class column label")
    if settings.group_by and "group" in columns:
        raise UserError(f"--manifest {path} has a 'group' column and --group_by is given: the column gives each "
                        "image's group, so drop --group_by (or rename the column)")


def _class_of(relpath: str, split_folders: bool) -> str | None:
    parts = relpath.split("/")[1:] if split_folders else relpath.split("/")
    return parts[0] if len(parts) >= 2 else None


__all__ = ["Plan", "plan_dataset"]


def plan_record(settings: Settings, plan: Plan) -> dict:
    """Everything that decides this run's records, as JSON: two runs of equal records convert the same chunks into
    the same bytes (`transforms.output.resume`: an interrupted run's converted chunks are taken only when it matches).

    'options': the record-shaping options (`Settings.as_dict`: size, mode, format, quality, schema, splits and
    their seed, shard sizing, compression, index files, names...); 'plan': what the launcher decided from the input
    (class names, the layout, how shards are sized from its sample, the extra features); 'code': the package
    version, the code's hash, the dataset format's version and the versions of the libraries that decode, resize
    and encode (`converter_libraries`). The options that only say how to run (threads,
    memory, --if_exists, logging) are not in it.
    """
    from pipeline import __version__
    from pipeline.code_version import code_hash
    from transforms.base.dataset_format import FORMAT_VERSION
    from transforms.images.imaging import converter_libraries

    return bounded.loads(json.dumps({
        "options": settings.as_dict(),
        "plan": {
            "class_names": list(plan.class_names),
            "split_folders": plan.split_folders,
            "sizing": [dict(plan.sizing.explicit), plan.sizing.shard_size_mb, plan.sizing.bytes_per_image,
                       plan.sizing.bytes_per_source_byte, plan.sizing.extra_bytes_per_image],
            "manifest_format": plan.manifest_format,
            "manifest_file_size": plan.manifest_file_size,
            "features": repr(plan.features),
            "metadata_format": plan.metadata_format,
            "manifest_groups": plan.manifest_groups,
        },
        "code": {"version": __version__, "code": code_hash(), "format_version": FORMAT_VERSION,
                 "libraries": converter_libraries()},
    }, sort_keys=True))
