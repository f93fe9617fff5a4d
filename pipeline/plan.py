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
import csv
import fnmatch
import itertools
import json
import logging
import os
import shlex
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
from transforms.detection.annotated import BoxFile, DetectionInput
from transforms.detection.boxes import box_row
from transforms.detection.coco import find_coco
from transforms.detection.parsing import LayoutError
from transforms.detection.voc import IMAGES_DIR, SEGMENTATION_CLASS, find_voc
from transforms.detection.yolo import DATA_YAML, read_data_yaml
from transforms.images.convert import WINDOWS_PATH_HINT
from transforms.inputs import manifest, metadata, split_lists
from transforms.inputs import rows as reading
from transforms.inputs.listing import Folder, classify, gcs_list, list_folder, list_level, list_top
from transforms.labels.detection import detection_export, detection_message, export_file
from transforms.labels.layout import (
    LABEL_FROM_EXAMPLE,
    NO_CLASS_FOLDER,
    NO_LABEL_IN_PATH,
    UNLABELED_SPLIT,
    PathLabel,
    class_name_problem,
    class_order,
    class_order_note,
    compile_group_by,
    nested_class_folders,
    place_by_path,
    same_class_names,
    split_folder_layout,
    split_folder_note,
    suggest_label_from,
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
    split_list_rule: split_lists.MatchRule | None = None  # with --split_lists: how their lines name the images
    split_list_sizes: dict = field(default_factory=dict)  # with --split_lists: each list's bytes (split -> size)
    manifest_files: tuple = ()  # with --manifest: its files' paths (one, or those its entries and globs match)
    manifest_readings: tuple = ()  # with --manifest: how each file's rows are read (manifest.RowReading)
    class_columns: tuple = ()  # a one-hot manifest's ((column, class name), ...): the classes are the header's
    base: dict | None = None  # --if_exists=append: the description of the dataset this run grows
    base_sources: list[str] = field(default_factory=list)  # its sources files' paths (transforms.inputs.append)
    # --task=detection with --if_exists=append: the dataset's class names, which keep their ids (new ones follow)
    base_class_names: list[str] | None = None
    record: dict | None = None  # plan_record: what decides the records; None: this run is not resumable
    detection: DetectionInput | None = None  # --task=detection: the format and layout found (plan_detection)
    resume_from: list = field(default_factory=list)  # output.resume.Earlier: the runs it resumes

    @property
    def folder_splits(self) -> bool:
        """A manifest of one file per split folder (train/_classes.csv, ...): its files' folders give the splits."""
        return bool(self.manifest_readings) and all(how.split for how in self.manifest_readings)

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


# Files (not folders) of one level the launcher looks at: a few pages. A level with more is a flat folder (images
# directly in it, labelled by their names or not at all): its first TOP_FILES files decide the layout, give the
# sample and the hints, and the job lists and counts the rest. Folders are not counted: the class folders are
# listed whole, as their names are the classes.
TOP_FILES = 5_000


def _top(settings: Settings, below: Folder | None = None, label_files: list | None = None,
         others: list[str] | None = None) -> tuple[int, list[FileRef], list[Folder], bool]:
    """(entries seen, image files, subfolders, whether the level was seen to its end) directly in the input
    folder, or in `below`; the files that may hold labels (LABEL_FILE_ENDINGS, their paths below the input folder)
    go to `label_files`, a few of them; the relpaths of the first OTHER_FILES other files (and of every detection
    export's own file) go to `others`.

    Bounded: the look stops after TOP_FILES files, wherever the level's folders are. On gs:// the names come in
    order, folders as prefixes among the files, so the folders seen are those whose names come before the
    TOP_FILES-th file's; a local folder's order is the file system's (`listing.list_level`)."""
    folder = below or Folder(settings.input_dir)
    if below is None and is_local(settings.input_dir):
        os.scandir(settings.input_dir).close()  # the input folder itself: an error here is plan_dataset's to report
    entries, images, folders = 0, [], []
    for item in list_level(folder, settings.input_dir, settings.follow_symlinks, page_size=TOP_PAGE):
        if isinstance(item, Folder):
            folders.append(item)
            continue
        if entries >= TOP_FILES:
            return entries, images, folders, False
        entries += 1
        ref = classify(item, settings.input_dir)
        if isinstance(ref, FileRef):
            images.append(ref)
        elif (label_files is not None and len(label_files) < LABEL_FILES_KEPT
              and ref.relpath.lower().endswith(LABEL_FILE_ENDINGS)):
            label_files.append(ref.relpath)
        if (others is not None and not isinstance(ref, FileRef)
                and (len(others) < OTHER_FILES or export_file(ref.relpath))):
            others.append(ref.relpath)  # and data.yaml or a COCO file however many files come first
    return entries, images, folders, True


TOP_PAGE = 1_000  # names per page of the look at a gs:// level (GCS's largest)


def _at_least(count: int, complete: bool) -> str:
    """A count of what the launcher saw of a level: exact when it saw the level to its end."""
    return str(count) if complete else f"at least {count}"


def _many_files_beside_folders(where: str, folders: list[str]) -> UserError:
    """The one line that refuses class (or split) folders beside more files than the launcher looks at."""
    shown_folders = ", ".join(f"{shown(name, 40)}/" for name in folders[:5]) + (", ..." if len(folders) > 5 else "")
    return UserError(
        f"{where} holds more than {TOP_FILES} files directly beside its folders ({shown_folders}): the launcher "
        f"looks at the first {TOP_FILES} files of a folder, so it cannot find every class folder among them; move "
        "the loose files into a folder of their own (or out of the input folder), or give --label_from or a "
        "--manifest")


# Files beside the images that may list their labels: named in the "no class folders" error, up to a few.
LABEL_FILE_ENDINGS = (".csv", ".jsonl", ".ndjson", ".json", ".txt")
MANIFEST_ENDINGS = (".csv", ".jsonl", ".ndjson")
LABEL_FILES_KEPT = 20


def label_files_hint(input_dir: str, label_files: list[str]) -> str:
    """The part of the "no class folders" error that names the files beside the images that may hold their
    labels, with the --manifest that reads the CSV and JSON Lines ones ('' when there is none)."""
    if not label_files:
        return ""
    manifests = [name for name in label_files if name.lower().endswith(MANIFEST_ENDINGS)]
    named = manifests or label_files  # a README.txt beside a _classes.csv is not named
    shown_files = ", ".join(shown(name, 60) for name in named[:4]) + (", ..." if len(named) > 4 else "")
    base = input_dir.rstrip("/")
    if not manifests:
        return (f"; {shown_files} may hold the labels: a manifest is a CSV or JSON Lines file with a path column "
                "and a label column, or one 0/1 column per class (docs/manifest.md), given as --manifest")
    names = {name.rsplit("/", 1)[-1] for name in manifests}
    nested = all("/" in name for name in manifests)
    if len(names) == 1 and nested and len(manifests) > 1:
        command = f"--manifest='{base}/*/{names.pop()}'"
    else:
        command = "--manifest=" + ",".join(f"{base}/{name}" for name in manifests)
    what = "look like label files" if len(manifests) > 1 else "looks like a label file"
    return f"; {shown_files} {what}: give {command}"


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
    if settings.detection:
        return plan_detection(settings)
    if settings.manifest:
        return plan_manifest(settings)
    input_dir = settings.input_dir
    flat_splits = []  # (name, images, path) of each split folder of images and no class folders
    label_files: list[str] = []  # files beside loose images that may list their labels (for the error)
    try:
        other_files: list[str] = []  # the first names of files that are not images (and data.yaml, COCO files)
        entries, loose, top_folders, complete = _top(settings, label_files=label_files, others=other_files)
        if not entries and not top_folders:
            raise UserError(f"--input_dir {input_dir} is empty: put images in <input_dir>/<class>/<image>")
        probes = _probe_all(top_folders, settings)
        if not settings.unlabeled:  # a YOLO, VOC or COCO export: boxes, not classes
            _refuse_detection_export(settings, probes, other_files, top_folders)
        top_with_images = {_name(p.folder, input_dir) for p in probes if _has_images(p)}
        seen = entries + sum(p.entries for p in probes)
        if not top_with_images and not loose:
            first = "" if complete else f" (the first {TOP_FILES} of its top level, and its folders)"
            raise UserError(
                f"no images found in {input_dir}: {seen} files looked at{first}, none with an image extension "
                f"({' '.join(sorted(IMAGE_EXTENSIONS))})"
            )
        if settings.unlabeled:
            return plan_unlabeled(settings, loose, sorted(top_with_images), complete)
        if not complete and top_with_images and not settings.label_from:
            raise _many_files_beside_folders(input_dir, sorted(top_with_images))
        try:
            split_folders = split_folder_layout(top_with_images)
        except ValueError as e:
            raise UserError(str(e)) from None
        if split_folders and settings.split_lists:
            raise UserError(f"--input_dir {input_dir} has split folders ({', '.join(sorted(top_with_images))}), which "
                            "give every image's split, and --split_lists gives them too: drop --split_lists, or give "
                            "a folder of class folders")
        if split_folders:
            class_probes, loose, label_files, class_folders = [], [], [], []
            for split_folder in (p.folder for p in probes if _has_images(p)):
                _, images, folders, whole = _top(settings, split_folder, label_files, other_files)
                complete = complete and whole
                loose += images
                if not whole and folders and not settings.label_from:
                    raise _many_files_beside_folders(f"{input_dir.rstrip('/')}/{_name(split_folder, input_dir)}",
                                                     [_name(f, input_dir).split("/")[-1] for f in folders])
                if images and not folders:
                    flat_splits.append((_name(split_folder, input_dir), _at_least(len(images), whole),
                                        split_folder.path))
                class_probes += _probe_all(folders, settings)
                class_folders += folders
            _refuse_detection_export(settings, class_probes, [*other_files, *(i.relpath for i in loose[:20])],
                                     class_folders)
            probes = class_probes
            folder_classes = class_order({_name(p.folder, input_dir).split("/")[1] for p in probes if _has_images(p)})
        else:
            folder_classes = class_order(top_with_images)
        # with --label_from, folders are not classes: a folder of folders is no mistake
        nested = None if settings.label_from else nested_class_folders(
            [image[1] for p in probes for image in p.images], split_folders)
        if nested:
            if settings.split_lists and len(nested) == 1:  # Food-101's root given: food-101/images/<class>/
                folder = next(iter(nested))
                raise UserError(f"every image found in {input_dir} is inside its folder {folder}/, whose folders "
                                f"({', '.join(sorted(nested[folder])[:3])}, ...) are the classes: give "
                                f"--input_dir={input_dir.rstrip('/')}/{folder}, the folder the --split_lists lines "
                                "are relative to")
            raise UserError(nested_layout_message(input_dir, nested, split_folders))
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"--input_dir {input_dir} cannot be listed ({type(e).__name__}: {e})") from None
    if settings.label_from:
        return plan_label_from(settings, split_folders, sorted(top_with_images), folder_classes, loose, probes)
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
        # label files beside the images (Roboflow's _classes.csv) are the likeliest labels; else the file names
        hint = label_files_hint(input_dir, label_files)
        if not hint:
            names = label_from_hint([ref.relpath for ref in loose[:SUGGESTION_NAMES]])
            hint = (f"; if the file names hold the labels, give {names}, or list the images and their labels in a "
                    "--manifest (docs/manifest.md)")
        raise UserError(
            f"found {_at_least(len(loose), complete)} images directly in {where} but no class folders: expected "
            "<input_dir>/<class>/<image> (or <input_dir>/<split>/<class>/<image>), one folder per class"
            + hint
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
    if settings.split_lists:
        plan_split_lists(settings, plan)
    return plan_metadata(settings, plan) if settings.metadata else plan


# -- --task=detection ----------------------------------------------------------------------------------------------

BOX_COLUMNS = ("path", "label", "xmin", "ymin", "xmax", "ymax")
FORMAT_NAMES = {"coco": "COCO", "voc": "Pascal VOC", "yolo": "YOLO", "boxes": "box rows"}


def find_export(input_dir: str) -> tuple[DetectionInput, list[str]]:
    """The detection export in `input_dir` (a few names looked at, no annotation file read but data.yaml), and the
    folders of its images (for the sample). YOLO's data.yaml first, then COCO's JSON files, then Pascal VOC's
    Annotations/.

    Raises:
        UserError: no export, or one the format's reader refuses (one line: what is wrong, what to do).
    """
    join = lambda *parts: "/".join(part.strip("/") if i else part.rstrip("/")  # noqa: E731
                                   for i, part in enumerate(parts) if part)
    try:
        if FileSystems.exists(join(input_dir, DATA_YAML)):
            yolo = read_data_yaml(input_dir)
            return (DetectionInput("yolo", yolo, splits=True),
                    [join(input_dir, folder) for folder in sorted({folder for _, folder in yolo.folders})])
        try:
            coco = find_coco(input_dir)
            return (DetectionInput("coco", coco, splits=any(source.split for source in coco)),
                    sorted({join(input_dir, source.images_rel) for source in coco}))
        except LayoutError:
            pass
        try:
            voc = find_voc(input_dir)
        except LayoutError as e:
            if str(e).startswith("more than one"):
                raise
            if _holds_nothing(input_dir):  # a gs:// name no object is below: no folder, nothing checked it before
                raise LayoutError(f"--input_dir {input_dir} is empty or does not exist: give the folder of the "
                                  "detection export (YOLO's data.yaml, COCO's JSON files or Pascal VOC's "
                                  "Annotations/ in it)") from None
            raise LayoutError(
                f"found no detection export in --input_dir {input_dir}: expected YOLO's {DATA_YAML}, a COCO "
                "_annotations.coco.json (in the folder or in each split folder) or annotations/instances_<name>.json, "
                "or Pascal VOC's Annotations/*.xml beside JPEGImages/; for boxes in a CSV or JSON Lines file, give it "
                "as --manifest (path,label,xmin,ymin,xmax,ymax)") from None
        return (DetectionInput("voc", voc, semantic_masks=SEGMENTATION_CLASS in voc.masks,
                               splits=bool(voc.split_files)), [join(input_dir, voc.root, IMAGES_DIR)])
    except LayoutError as e:
        raise UserError(str(e)) from None


def _holds_nothing(folder: str) -> bool:
    """Whether `folder` holds no entry (on Cloud Storage: no object below its name); one entry is looked at. A
    listing that fails says nothing (False): this only chooses the message of a launch that stops anyway."""
    try:
        return next(list_top(folder, False, 1), None) is None
    except FileNotFoundError:
        return True
    except Exception:  # noqa: BLE001 - a store's error: the message says what the export needs instead
        return False


SAMPLE_BYTES = 1 << 16  # of a box file: its first rows, for the sample of images


def plan_boxes(settings: Settings) -> tuple[DetectionInput, list[tuple[str, str, int]]]:
    """A --manifest of boxes with --task=detection: its format and columns checked, and the first images it names
    (path, relpath, size) for the sample. Raises UserError."""
    paths = manifest_files(settings)
    if len(paths) != 1:
        raise UserError(f"--manifest with --task=detection reads one box file, and it names {len(paths)}: join them "
                        "into one CSV or JSON Lines file")
    path = paths[0]
    fmt, columns, _ = read_header_names(path, "--manifest", ",".join(BOX_COLUMNS), '"path": ..., "xmin": ...')
    missing = [name for name in BOX_COLUMNS if name not in columns]
    if missing:
        raise UserError(f"--manifest {path} has no {', '.join(missing)} column: a box file has one row per box with "
                        f"the columns {','.join(BOX_COLUMNS)} (and optionally split, width, height, unit)")
    with _damaged_is_an_error("--manifest", path), reading.open_file(path) as raw:
        lines = raw.read(SAMPLE_BYTES).decode("utf-8-sig", "replace").splitlines()[:-1] or []
    if fmt == "csv":
        rows = list(csv.DictReader(lines))
    else:
        rows = []
        for line in lines:
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
    samples, seen = [], set()
    for number, fields in enumerate(rows, 1):
        parsed = box_row(number, {str(k).strip().lower(): v for k, v in fields.items() if k is not None}
                         if isinstance(fields, dict) else "", settings.input_dir)
        if isinstance(parsed, tuple) and parsed[0] not in seen and len(seen) < MANIFEST_SAMPLE_ROWS:
            seen.add(parsed[0])
            with contextlib.suppress(Exception):  # a missing file is the job's to report (missing_image)
                samples.append((parsed[0], parsed[1], FileSystems.match([parsed[0]])[0].metadata_list[0].size_in_bytes))
    return DetectionInput("boxes", BoxFile(path, fmt, settings.input_dir), splits="split" in columns), samples


def plan_detection(settings: Settings) -> Plan:
    """Plan a --task=detection run: find the export (or the --manifest of boxes), the class names when the
    launcher can know them (--labels_file, YOLO's names; else the job finds them), and size shards from a sample
    of its images. The annotation files are read in the job, never here (but YOLO's data.yaml)."""
    if settings.manifest:
        detection, samples = plan_boxes(settings)
    else:
        detection, folders = find_export(settings.input_dir)
        samples = [image for probe in _probe_all([Folder(folder) for folder in folders], settings)
                   for image in probe.images]
    if settings.labels_file:
        class_names = read_labels_file(settings.labels_file)
    elif detection.input_format == "yolo":
        names = detection.layout.names
        class_names = [names.get(i, str(i)) for i in range(max(names) + 1)]  # YOLO's ids, in order
    else:
        class_names = []  # found in the job
    sample = estimate.measure_output(samples, settings.image, "default", settings.compression)
    notes = [] if samples else [f"no image of the {FORMAT_NAMES[detection.input_format]} dataset was found in a "
                                 "first look (the job lists them all): shards are sized from an estimate"]
    return Plan(class_names=class_names, split_folders=False, notes=notes, detection=detection,
                sizing=shard_sizing(settings, sample, [size for _, _, size in samples]))


def detection_identity(detection: DetectionInput) -> dict:
    """What a resume must find unchanged of a detection export (`plan_record`): its format and layout, and the
    identity (path, size, modification time) of the annotation files the launcher knows: COCO's JSON files, the box
    file (YOLO's data.yaml is read: its names and folders are the layout). The per-image files (VOC's XML, YOLO's
    labels) are too many to list here: each chunk's done record is named after its images' annotations as parsed,
    and the class names found (`resume.chunk_digest`), so a chunk whose annotations changed is converted again."""
    layout = detection.layout
    if detection.input_format == "coco":
        files = [source.annotations for source in layout]
    elif detection.input_format == "boxes":
        files = [layout.path]
    else:  # YOLO's data.yaml is in its layout (names, folders)
        files = []
    identity = []
    for path, found in zip(files, FileSystems.match(files) if files else [], strict=True):
        meta = found.metadata_list[0] if found.metadata_list else None
        identity.append([path, meta.size_in_bytes if meta else None, meta.last_updated_in_seconds if meta else None])
    return {"input_format": detection.input_format, "layout": repr(layout), "semantic_masks": detection.semantic_masks,
            "splits": detection.splits, "annotation_files": identity}


SUGGESTION_NAMES = 20  # the first image names a --label_from suggestion must fit


def label_from_hint(relpaths: list[str]) -> str:
    """A --label_from to suggest: a pattern that finds a label in each of a folder's first image names
    (`relpaths`), with what it gives on them, or the option's form with an example."""
    found = suggest_label_from(relpaths)
    if found is None:
        return f"--label_from=REGEX with a named group label, e.g. --label_from={LABEL_FROM_EXAMPLE}"
    pattern, examples = found
    shown_examples = ", ".join(f"{shown(name, 40)} -> {shown(label, 40)}" for name, label in examples)
    return f"--label_from={shlex.quote(pattern)} ({shown_examples})"


def plan_label_from(settings: Settings, split_folders: bool, top_folders: list[str], folder_classes: list[str],
                    loose: list[FileRef], probes: list[_Probe]) -> Plan:
    """Plan a --label_from run: the layout (split folders or not) as found, the classes from --labels_file (else
    found in the job: Plan.class_names is empty), shard sizes from a sample of the images the pattern labels.

    Raises:
        UserError: the pattern finds a label in none of the image paths looked at.
    """
    pattern = compile_group_by(settings.label_from)
    looked = [(ref.path, ref.relpath, ref.size) for ref in loose[:SAMPLE_IMAGES]]
    looked += [image for p in probes for image in p.images][:max(0, 2 * SAMPLE_IMAGES - len(looked))]
    placed = [(image, place_by_path(image[1], pattern, split_folders=split_folders)) for image in looked]
    labelled = [(image, where) for image, where in placed if isinstance(where, PathLabel)]
    flag = f"--label_from={shlex.quote(settings.label_from)}"
    if not labelled:
        first = shown(looked[0][1], 80) if looked else "none"
        below = "--input_dir, split folder included" if split_folders else "--input_dir"
        hint = label_from_hint([relpath for _, relpath, _ in looked[:SUGGESTION_NAMES]])
        raise UserError(f"{flag} finds no label in any of the {len(looked)} image paths looked at (the first: "
                        f"{first}, a path below {below}): give a pattern whose group label matches a part of "
                        f"them, such as {hint}")
    firsts: dict[str, str] = {}  # the first path of each label the sample holds
    for image, where in labelled:
        firsts.setdefault(where.class_name, image[1])
    shown_labels = ", ".join(f"{shown(path, 40)} -> {shown(label, 40)}"
                             for path, label in sorted((path, label) for label, path in firsts.items())[:3])
    notes = [split_folder_note(top_folders)] if split_folders else []
    notes.append(f"labels from the paths ({flag}): {shown_labels}; the classes are "
                 + ("--labels_file's" if settings.labels_file else "the distinct labels, found in the job"))
    unlabelled = [image[1] for image, where in placed if not isinstance(where, PathLabel)]
    if unlabelled:
        notes.append(f"{len(unlabelled)} of the {len(looked)} image paths looked at have no label for {flag} "
                     f"(e.g. {shown(unlabelled[0], 80)}): such images are skipped ({NO_LABEL_IN_PATH})")
    if folder_classes:
        listed = ", ".join(shown(name, 40) for name in folder_classes[:5]) + (", ..." if len(folder_classes) > 5
                                                                             else "")
        notes.append(f"the folders ({listed}) are not the labels: --label_from takes each image's class from its "
                     "path; drop --label_from to take the classes from the folders")
    class_names = read_labels_file(settings.labels_file) if settings.labels_file else []
    if class_names:
        unknown = sorted({where.class_name for _, where in labelled} - set(class_names))
        if unknown:
            notes.append(f"{len(unknown)} label(s) found in the sample are not in the labels file, and their "
                         f"images will be skipped as unknown_class: {', '.join(shown(n, 40) for n in unknown[:10])}")
        labelled = [(image, where) for image, where in labelled if where.class_name in class_names]
    sample_files = [image for image, _ in labelled][:SAMPLE_IMAGES]
    sample = estimate.measure_output(sample_files, settings.image, settings.schema, settings.compression)
    upscale = None if settings.quiet else upscale_notice(settings, sample_files, sample)
    plan = Plan(
        class_names=class_names,
        split_folders=split_folders,
        sizing=shard_sizing(settings, sample, [size for _, _, size in sample_files]),
        notes=([upscale] if upscale else []) + notes,
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


def plan_unlabeled(settings: Settings, images: list[FileRef], folders: list[str], complete: bool = True) -> Plan:
    """Plan an --unlabeled run: the images directly in --input_dir (`images`: those among the first TOP_FILES
    files; all of them when `complete`), no classes, one split; refused when folders in it hold images (`folders`,
    those seen): class or split folders, whose images would be left out (the job skips an image in a folder the
    launcher did not see as in_a_subfolder).

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
    count = _at_least(len(images), complete)
    notes = [f"unlabeled set: the images directly in {input_dir} ({count}) go into one split, "
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
    """Plan a --manifest run: find its files (entries and glob patterns), check each one's header, take the class
    names from --labels_file, or from the header's class columns of a one-hot CSV (without either, the job finds
    them: Plan.class_names is empty), and size shards from the first rows' files."""
    paths = manifest_files(settings)
    headers = _read_headers(paths, settings.multi_label)
    fmt, columns, names = headers[0]
    if any(h[0] != fmt for h in headers):
        other, other_fmt = next((path, h[0]) for path, h in zip(paths, headers, strict=True) if h[0] != fmt)
        raise UserError(f"--manifest: {paths[0]} is {_FORMATS[fmt]} and {other} {_FORMATS[other_fmt]}: give "
                        "files of one format")
    for path, (_, file_columns, _) in zip(paths, headers, strict=True):
        check_manifest_columns(path, file_columns, settings, fmt)
    class_columns = one_hot_columns(paths[0], fmt, columns, names, settings)
    _same_columns(paths, headers, class_columns)
    path_column = _path_column(columns)
    # several files (entries, or a glob): each one's split folder gives the split of its rows without one
    several = len(paths) > 1 or len(settings.manifests) > 1 or any(_is_glob(entry) for entry in settings.manifests)
    common = _common_folder(paths)
    readings = tuple(manifest.RowReading(
        _folder(path) if settings.paths_below_manifest else settings.input_dir,
        split_of(_folder(path).rsplit("/", 1)[-1]) or "" if several else "",
        _shown_file(path, common) if several else "",
        path_column, class_columns, settings.multi_label,
        # each file's relative paths below its own folder: named from the files' common folder (train/a.jpg)
        _folder(_shown_file(path, common)) + "/" if several and settings.paths_below_manifest
        and "/" in _shown_file(path, common) else "") for path in paths)
    notes = [_files_note(paths, readings)] if several else []
    sample_rows = []
    per_file = max(2, -(-MANIFEST_SAMPLE_ROWS // len(paths)))
    for path, how in zip(paths[:MANIFEST_SAMPLE_ROWS], readings, strict=False):
        with _damaged_is_an_error("--manifest", path), reading.open_file(path) as raw:  # from the start (.gz: no seek)
            kept = 0
            for number, row in manifest.read_rows(reading.file_lines(raw), fmt, how):
                if isinstance(row, manifest.ManifestRow):
                    sample_rows.append(row)
                    kept += 1
                if kept >= per_file or len(sample_rows) >= MANIFEST_SAMPLE_ROWS or number >= MANIFEST_SAMPLE_LIMIT:
                    break
        if len(sample_rows) >= MANIFEST_SAMPLE_ROWS:
            break
    found = plan_features(settings, [c for c in columns if c not in {path_column, *dict(class_columns)}],
                          f"--manifest {paths[0]}", notes)
    if settings.multi_label and "label" in columns:
        notes.append("the manifest's label column is ignored: --multi_label reads the labels column")
    # without --labels_file the job finds the class names (the rows' distinct labels), unless the header has them
    header_classes = manifest.class_names_of((name, 1) for _, name in class_columns)
    if settings.labels_file:
        class_names = read_labels_file(settings.labels_file)
        if class_columns:
            notes += _labels_file_notes(paths[0], header_classes, class_names, settings.labels_file)
    else:
        class_names = header_classes
    if class_columns:
        notes.append(_class_columns_note(class_columns, settings))
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
        manifest_files=tuple(paths),
        manifest_readings=readings,
        class_columns=class_columns,
    )


_FORMATS = {"csv": "CSV", "jsonl": "JSON Lines"}
# --manifest's entries and glob patterns may name this many files at most: each one's header is read here.
MAX_MANIFEST_FILES = 1000


def manifest_files(settings: Settings) -> list[str]:
    """--manifest's files: each comma-separated entry a file, or a glob pattern (Beam's FileSystems.match, local
    or gs://) matched here, its files sorted; a file named twice counts once.

    A gs:// pattern with a glob character in a folder's name (`gs://b/data/*/_classes.csv`) has its folders
    listed a level at a time (a delimiter listing: the names of the folders, not the objects in them); Cloud
    Storage's own match would list every object below `data/`, each image included.

    Raises:
        UserError: for a pattern that matches no file, or more than MAX_MANIFEST_FILES files.
    """
    paths: list[str] = []
    for entry in settings.manifests or (settings.manifest,):
        if not _is_glob(entry) or (is_local(entry) and os.path.isfile(entry)):
            paths.append(entry)
            continue
        try:
            matched = _match(entry)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - what the file system says, named
            raise UserError(f"--manifest {entry} cannot be matched ({type(e).__name__}: {shown(str(e), 120)}): "
                            "check the pattern") from None
        if not matched:
            raise UserError(f"--manifest {entry} matches no file: check the pattern (quote it in the shell, "
                            f"--manifest='{entry}', so that the shell does not expand it)")
        paths += matched
    paths = list(dict.fromkeys(paths))
    if len(paths) > MAX_MANIFEST_FILES:
        raise UserError(f"--manifest names {len(paths)} files, more than {MAX_MANIFEST_FILES}: the launcher reads "
                        "each one's header; join them into fewer files")
    return paths


def _is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def _match(pattern: str) -> list[str]:
    """The files a glob pattern matches, sorted."""
    folder, _, name = pattern.rpartition("/")
    if is_gcs(pattern) and _is_glob(folder):
        return sorted(path for each in _gcs_folders(folder) for path in _match(f"{each}/{name}"))
    if not _is_glob(pattern):
        return [pattern] if FileSystems.exists(pattern) else []
    return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list if not m.path.endswith("/"))


def _gcs_folders(pattern: str) -> list[str]:
    """The gs:// folders a pattern of folders names (`gs://b/data/*`), listed a level at a time."""
    parts = pattern.split("/")  # 'gs:', '', bucket, ...
    folders = ["/".join(parts[:3])]
    for part in parts[3:]:
        if not _is_glob(part):
            folders = [f"{folder}/{part}" for folder in folders]
            continue
        folders = [item.path for folder in folders for item in gcs_list(folder, folders_too=True)
                   if isinstance(item, Folder) and fnmatch.fnmatchcase(item.path.rsplit("/", 1)[-1], part)]
    return folders


def _read_headers(paths: list[str], multi_label: bool) -> list[tuple[str, list[str], list[str]]]:
    """(format, columns, names as written) of each file's header, a few files at a time."""
    label = "labels" if multi_label else "label"
    read = lambda path: read_header_names(path, "--manifest", f"path,{label}[,split]",  # noqa: E731
                                          f'"path": ..., "{label}": ...')
    if len(paths) == 1:
        return [read(paths[0])]
    with concurrent.futures.ThreadPoolExecutor(max_workers=PROBE_THREADS) as pool:
        return list(pool.map(read, paths))


def _folder(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else "."


def _common_folder(paths: list[str]) -> str:
    """The deepest folder that holds every one of the files ('' for none)."""
    common = []
    for parts in zip(*(_folder(path).split("/") for path in paths), strict=False):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return "/".join(common)


def _shown_file(path: str, folder: str) -> str:
    """A manifest file's name in messages and errors.jsonl: below `folder` when it is in it, else its path."""
    prefix = folder.rstrip("/") + "/"
    return path[len(prefix):] if folder not in ("", ".") and path.startswith(prefix) else path


def _path_column(columns: list[str]) -> str:
    return next((c for c in manifest.PATH_COLUMNS if c in columns), "path")


def _same_columns(paths: list[str], headers: list, class_columns: tuple) -> None:
    """Several manifest files have one set of columns (in any order); else one line naming the difference."""
    first = set(headers[0][1])
    for path, (_, columns, _) in zip(paths[1:], headers[1:], strict=True):
        if set(columns) == first:
            continue
        missing, extra = sorted(first - set(columns)), sorted(set(columns) - first)
        what = "class columns" if class_columns else "columns"
        diff = "; ".join(part for part in (
            f"it lacks {shown_columns(missing, 5)}" if missing else "",
            f"it has {shown_columns(extra, 5)} too" if extra else "") if part)
        raise UserError(f"--manifest: {path} and {paths[0]} have different {what} ({diff}): give every file the "
                        "same columns, in any order" + (" (a column of 0s for a class without images)"
                                                        if class_columns else ""))


def _files_note(paths: list[str], readings: tuple) -> str:
    """The note that names a manifest's files and the split each one's folder gives."""
    shown_files = ", ".join(f"{how.shown} ({how.split or 'hash split'})" for how in readings[:6])
    return (f"--manifest: {len(paths)} files, read together: {shown_files}{', ...' if len(paths) > 6 else ''}; a "
            "row's split is its split column's, else its file's folder's, else the hash split")


def one_hot_columns(path: str, fmt: str, columns: list[str], names: list[str], settings: Settings) -> tuple:
    """The class columns of a CSV manifest without a label or labels column: ((column, class name), ...), every
    column that is not the path, split, group or a --features column, named as the header writes it (stripped);
    () for a manifest with a label (or labels) column.

    Raises:
        UserError: for a class name labels.txt cannot hold, two names that read as one, or no class column.
    """
    if "label" in columns or "labels" in columns or fmt != "csv":
        return ()
    known = {*manifest.PATH_COLUMNS, *features.RESERVED_COLUMNS, *(f.name for f in settings.features)}
    found = tuple((column, name) for column, name in zip(columns, names, strict=True) if column not in known)
    if not found:
        raise UserError(f"--manifest {path} has no {_label_column(settings)} column and no class columns (columns: "
                        f"{shown_columns(columns)}): {_column_hint(settings, True)}")
    for _, name in found:
        problem = class_name_problem(name)
        if problem:
            raise UserError(f"--manifest {path}: the class column {quoted_name(name)} has {problem}: rename it")
    same = same_class_names([name for _, name in found])
    if same:
        raise UserError(f"--manifest {path} has the class columns {_pair(same)}, which {same[2]}, so they would be "
                        "two classes that read as one: keep one of them")
    _check_class_cells(path, fmt, found, settings)
    return found


def _check_class_cells(path: str, fmt: str, class_columns: tuple, settings: Settings) -> None:
    """The first rows' class cells: a column none of whose cells is 0 or 1 is no class column (a feature, or a
    label column under another name), and rows that mostly set several classes want --multi_label: one line each,
    before any image is read."""
    cells: dict[str, list[str]] = {column: [] for column, _ in class_columns}
    several = rows = 0
    with _damaged_is_an_error("--manifest", path), reading.open_file(path) as raw:
        _, records = reading.read_records(reading.file_lines(raw), fmt)
        for item in itertools.islice(records, MANIFEST_SAMPLE_LIMIT):
            if isinstance(item.fields, str):
                continue
            rows += 1
            hot = 0
            for column, _ in class_columns:
                value = str(item.fields.get(column) or "").strip()
                cells[column].append(value)
                hot += manifest.CLASS_CELLS.get(value, False)
            several += hot > 1
            if rows >= MANIFEST_SAMPLE_ROWS:
                break
    for column, name in class_columns:
        values = cells[column]
        if values and not any(v in manifest.CLASS_CELLS for v in values):
            declare = f" or type it with --features={column}:string to keep it as a feature," if len(
                class_columns) > 1 else ""
            raise UserError(
                f"--manifest {path} has no {_label_column(settings)} column, so its other columns are read as one 0/1 "
                f"column per class (one-hot), and the column {quoted_name(name)} holds {shown(repr(values[0]), 40)} "
                f"in row 1, not 0 or 1:{declare} {_column_hint(settings, True)}")
    if several > 1 and several * 2 > rows and not settings.multi_label:
        raise UserError(f"--manifest {path}: {several} of its first {rows} rows set several class columns to 1 "
                        "(multi-hot), and without --multi_label each row needs exactly one: give --multi_label")


def _label_column(settings: Settings) -> str:
    return "'labels'" if settings.multi_label else "'label'"


def _column_hint(settings: Settings, one_hot: bool = False) -> str:
    """What a manifest's header should hold, for the options given (`one_hot`: a CSV, which may instead hold one
    0/1 column per class)."""
    if settings.multi_label:
        hint = "name the image column path and the class column labels (class names separated by ';')"
    else:
        hint = "name the image column path and the class column label"
    return hint + (", or keep one 0/1 column per class and no other" if one_hot else "")


def _class_columns_note(class_columns: tuple, settings: Settings) -> str:
    names = [name for _, name in class_columns]
    hot = ("multi-hot (--multi_label): a row's classes are its columns holding 1, none for an image of no class"
           if settings.multi_label else "one-hot: a row's class is its one column holding 1")
    ids = "ids from --labels_file" if settings.labels_file else "ids in sorted order"
    return f"--manifest: {len(names)} class columns ({ids}), {hot}: {shown_columns(names, 10)}"


def _labels_file_notes(path: str, header_classes: list[str], class_names: list[str], labels_file: str) -> list[str]:
    unknown = [name for name in header_classes if name not in set(class_names)]
    if len(unknown) == len(header_classes):
        raise UserError(f"none of the {len(header_classes)} class columns of --manifest {path} is a class in the "
                        f"labels file {labels_file}: check that the column names match its lines")
    if not unknown:
        return []
    return [f"{len(unknown)} class column(s) are not in the labels file and their rows will be skipped as "
            f"unknown_class: {shown_columns(unknown, 10)}"]


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


def unreadable(flag: str, path: str, what: str, error: Exception) -> UserError:
    """The one line for a file the launcher could not open or read: it does not exist, or the file system's error."""
    missing = False
    try:
        missing = not FileSystems.exists(path)
    except Exception:  # noqa: BLE001 - a file system that cannot say: the error itself is named
        pass
    if missing:
        return UserError(f"{flag} {path} does not exist: give the {what}")
    return UserError(f"{flag} {path} cannot be read ({type(error).__name__}: {shown(str(error), 120)}): give the "
                     f"{what}")


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
    """(format, column names) of a CSV or JSON Lines file: read_header_names without the names as written."""
    fmt, columns, _ = read_header_names(path, flag, header, fields)
    return fmt, columns


def read_header_names(path: str, flag: str, header: str = "path,...", fields: str = '"path": ...'
                      ) -> tuple[str, list[str], list[str]]:
    """(format, column names, the names as written) of a CSV or JSON Lines file, from its first line (read within a
    bound); the column names are stripped and lower case, the names as written only stripped. `header` and
    `fields` show the user what the first line should hold.

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
        raise unreadable(flag, path, what, e) from None
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
        columns, names = manifest.csv_header(first), manifest.csv_names(first)
    else:
        try:
            row = bounded.loads(first)
            if not isinstance(row, dict):
                raise TypeError
        except (ValueError, TypeError):
            raise UserError(f"{flag} {path}: its first line is not a JSON object: write one "
                            f"{{{fields}}} object per line, or give a .csv") from None
        columns, names = [str(k).lower() for k in row], [str(k) for k in row]
    twice = sorted({c for c in columns if columns.count(c) > 1})
    if twice:  # the last one would win, silently
        raise UserError(f"{flag} {path} has the column '{shown(twice[0])}' more than once (columns: "
                        f"{shown_columns(columns)}): name each column once (column names are not case-sensitive)")
    return fmt, columns, names


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


# The launcher reads at most this many lines of each split list (their rule, and a probe of a few of their names),
# never a whole list: a list may have a hundred million lines, read in the job.
SPLIT_LIST_SAMPLE_LINES = 1000
SPLIT_LIST_SAMPLE_BYTES = 4 << 20
SPLIT_LIST_PROBES = 5  # names of each list looked for below --input_dir (paths only: a bare name needs the listing)


def _list_sample(split: str, path: str, input_dir: str) -> list[str]:
    """The names (`split_lists.line_name`) of the first non-blank lines of a split list, up to
    SPLIT_LIST_SAMPLE_LINES, looking at no more than ten times as many lines and SPLIT_LIST_SAMPLE_BYTES.

    Raises:
        UserError: for a missing, unreadable or empty list, one that is not a regular file, or one whose first
            lines hold a line over rows.MAX_LINE_BYTES (not a list of names).
    """
    flag, what = f"--split_lists {split}={path}:", "list of the split's images, one a line"
    inputs.check_file(f"--split_lists {split} list", path, what)
    names, looked, size, ended = [], 0, 0, True
    try:
        with _damaged_is_an_error(f"--split_lists {split} list", path), reading.open_file(path) as raw:
            for line in reading.file_lines(raw):
                looked += 1
                if isinstance(line, reading.LongLine):
                    raise UserError(f"{flag} its line {looked} is over {reading.MAX_LINE_BYTES >> 20} MiB "
                                    f"({line.size} bytes): a line names one image; is it the {what}?")
                size += len(line)
                name = split_lists.line_name(line, input_dir)
                if name:
                    names.append(name)
                if (len(names) >= SPLIT_LIST_SAMPLE_LINES or looked >= 10 * SPLIT_LIST_SAMPLE_LINES
                        or size >= SPLIT_LIST_SAMPLE_BYTES):
                    ended = False
                    break
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - what the file system says, named
        raise unreadable(f"--split_lists {split} list", path, what, e) from None
    if not names and ended:
        raise UserError(f"{flag} the list is empty: write one image a line, as its path below --input_dir "
                        "(apple_pie/1005649) or its file name")
    return names


def _probe_list_names(settings: Settings, names: list[str], rule: split_lists.MatchRule) -> bool:
    """Whether one of `names` (paths below --input_dir) is a file there: with extensions the file itself, without
    them a file of that name and any extension (a pattern, matched by the file system)."""
    for name in names:
        name = name if rule.with_extensions else split_lists.without_image_extension(name)
        if any(c in name for c in GLOB_CHARACTERS) or name.startswith("../") or name == "..":
            continue
        path = FileSystems.join(settings.input_dir, name)
        try:
            if rule.with_extensions:
                if FileSystems.exists(path):
                    return True
            elif FileSystems.match([path + ".*"], limits=[1])[0].metadata_list:
                return True
        except Exception:  # noqa: BLE001 - a name the file system cannot look for: the job reports it
            continue
    return False


def plan_split_lists(settings: Settings, plan: Plan) -> None:
    """With --split_lists: check each list (a regular, readable, non-empty file), decide from their first lines how
    they name the images (`split_lists.rule_of`: the same rule for every list), and look for a few of their names
    below --input_dir. Sets `plan.split_list_rule` and `plan.split_list_sizes` and adds a note.

    Raises:
        UserError: for a list that cannot be read or is empty, lists that name images in two ways, or lists of
            paths none of whose first names is found below --input_dir.
    """
    samples = {split: _list_sample(split, path, settings.input_dir) for split, path in settings.split_lists}
    forms = {split: split_lists.rule_of(names).by_name for split, names in samples.items() if names}
    if len(set(forms.values())) > 1:
        by_path = next(split for split, by_name in forms.items() if not by_name)
        by_name = next(split for split, by_name in forms.items() if by_name)
        raise UserError(f"--split_lists: the {by_path} list names images by path ({shown(samples[by_path][0])!r}) "
                        f"and the {by_name} list by bare file name ({shown(samples[by_name][0])!r}): name them one "
                        "way in every list")
    rule = split_lists.rule_of([name for names in samples.values() for name in names])
    for split, names in samples.items():
        probes = names[:SPLIT_LIST_PROBES]
        if not rule.by_name and probes and not _probe_list_names(settings, probes, rule):
            raise UserError(
                f"--split_lists: none of the first {len(probes)} names of the {split} list is an image below "
                f"--input_dir {settings.input_dir} (its first names {shown(probes[0])!r}, read as {rule.describe()}): "
                "give as --input_dir the folder the lines' paths are relative to (Food-101: food-101/images)")
    sizes = {}
    for split, path in settings.split_lists:
        try:
            sizes[split] = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
        except Exception:  # noqa: BLE001 - read above; its size only tells a resume apart
            sizes[split] = -1
    plan.split_list_rule, plan.split_list_sizes = rule, sizes
    plan.notes.append("splits from --split_lists (" + ", ".join(f"{split}: {path}" for split, path in
                                                                 settings.split_lists)
                      + f"), their lines read as {rule.describe()}; images no list names are skipped "
                      f"({split_lists.NOT_IN_SPLIT_LISTS})")


def check_manifest_columns(path: str, columns: list[str], settings: Settings, fmt: str = "csv") -> None:
    """The manifest's header has what the options need: path (or filename), and label (or labels with
    --multi_label), or in a CSV neither: one 0/1 column per class (`one_hot_columns`)."""
    if not any(c in columns for c in manifest.PATH_COLUMNS):
        raise UserError(f"--manifest {path} has no 'path' column (columns: {shown_columns(columns)}): "
                        f"{_column_hint(settings)}")
    one_hot = fmt == "csv"  # a CSV without label or labels columns: one 0/1 column per class
    if settings.multi_label:
        if "labels" not in columns and ("label" in columns or not one_hot):
            raise UserError(f"--manifest {path} has no 'labels' column, which --multi_label reads (columns: "
                            f"{shown_columns(columns)}): name the column of class names labels (separated by ';'), "
                            "or drop --multi_label for one label per image")
    elif "labels" in columns:
        raise UserError(f"--manifest {path} has a 'labels' column: give --multi_label to read several classes per "
                        "image from it, or name a one-class column label")
    elif "label" not in columns and not one_hot:
        raise UserError(f"--manifest {path} has no 'label' column (columns: {shown_columns(columns)}): "
                        f"{_column_hint(settings)}")
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
            **({"split_lists": [list(plan.split_list_rule), plan.split_list_sizes]} if plan.split_list_rule else {}),
            "manifest_files": [[path, *how] for path, how in zip(plan.manifest_files, plan.manifest_readings,
                                                                 strict=True)],
            **({"detection": detection_identity(plan.detection)} if plan.detection is not None else {}),
        },
        "code": {"version": __version__, "code": code_hash(), "format_version": FORMAT_VERSION,
                 "libraries": converter_libraries()},
    }, sort_keys=True))
