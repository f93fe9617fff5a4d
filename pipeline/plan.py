"""Launcher-side planning: check the folders, read file metadata, fix class ids and shard counts.

Besides file names and sizes, only a small sample of the images is read here
(`pipeline.estimate`): up to 200 headers for the input's image sizes, and a
dozen images converted to measure the bytes of one record. The graph does the
real work, and on Dataflow it runs on the workers.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field

from apache_beam.io.filesystems import FileSystems

from pipeline import cloud, estimate
from pipeline.errors import UserError
from pipeline.options import Settings
from pipeline.report import human_bytes
from transforms.layout import (
    IMAGE_EXTENSIONS,
    SPLITS,
    Placement,
    class_folder_names,
    class_name_problem,
    place,
    quoted_name,
    split_folder_layout,
)
from transforms.listing import classify, is_local, list_entries
from transforms.outputs import SHARD_NAME, own_outputs
from transforms.records import FileRef

_LOG = logging.getLogger(__name__)


@dataclass
class Plan:
    """What the launcher decided before building the graph."""

    class_names: list[str]
    split_folders: bool
    expected_per_split: dict[str, int]
    num_shards: dict[str, int]
    files_found: int
    unknown_classes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def total_images(self) -> int:
        return sum(self.expected_per_split.values())

    def splits_text(self) -> str:
        """e.g. 'train 3000 in 3 shards, validation 800 in 1 shard', splits in the order train, validation, test."""
        return ", ".join(f"{split} {self.expected_per_split[split]} in {plural(self.num_shards[split], 'shard')}"
                         for split in SPLITS if split in self.expected_per_split)

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
    if target == source or target.startswith(source.rstrip("/") + "/"):
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
        if cloud.is_gcs(path):
            cloud.check_gcs_folder(flag, path)


def read_labels_file(path: str) -> list[str]:
    """Class names, one per line; line i is id i."""
    try:
        with FileSystems.open(path, compression_type="uncompressed") as f:
            text = f.read().decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"--labels_file {path} is not UTF-8 text: save it as plain text, one class per line") from None
    except Exception as e:
        raise UserError(f"--labels_file {path} cannot be read ({type(e).__name__}): check the path") from None
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
    return lines


def estimated_bytes_per_image(settings: Settings, source_size: int) -> float:
    """A rough output size of one image, when no image of the sample could be converted."""
    image = settings.image
    if image.resize_mode == "none":
        return float(source_size)
    pixels = image.width * image.height
    if image.image_format == "png":
        return pixels * 1.5
    return pixels * (0.08 + 0.35 * (image.jpeg_quality / 100) ** 2)


def split_bytes(settings: Settings, sample: estimate.OutputSample | None, images: int, source_bytes: int) -> float:
    """The bytes a split's shards will hold, from the sample converted with the run's settings.

    For a fixed output size every image comes out about the same size; with
    --resize_mode=fit or none the output follows the source, so the sample's
    ratio of output to file bytes is applied to the split's file bytes.
    """
    if sample is None:
        return images * estimated_bytes_per_image(settings, source_bytes / max(images, 1))
    if settings.image.resize_mode in ("fit", "none") and sample.source_bytes:
        return source_bytes * sample.record_bytes / sample.source_bytes
    return images * sample.bytes_per_image


def shards_for(total_bytes: float, shard_size_mb: int) -> int:
    """The shard count that brings shards closest to `shard_size_mb` (shards hold equal numbers of records)."""
    return max(1, round(total_bytes / (shard_size_mb * 1e6)))


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def upscale_notice(settings: Settings, files: list[tuple[str, str, int]], sample: estimate.OutputSample | None,
                   total_images: int) -> str | None:
    """The notice when most images are smaller than --image_size (sizes from headers only), else None.

    The run goes on with the size given: the notice names the typical source
    size, the --image_size that keeps it, and the dataset's size at each.
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
        text += (f" The dataset will be about {human_bytes(sample.bytes_per_image * total_images)} at "
                 f"--image_size={current}, about {human_bytes(small.bytes_per_image * total_images)} at "
                 f"--image_size={suggested}.")
    return text + (f" To keep their size, stop this run (Ctrl-C) and run again with --image_size={suggested}; "
                   f"this run goes on at {current}.")


def plan_dataset(settings: Settings) -> Plan:
    """List the input (metadata, and a sample of images: `pipeline.estimate`); decide class ids, splits, shards.

    Raises:
        UserError: for an empty input, no images, no class folders, or a bad layout.
    """
    check_folders(settings)
    found = 0
    candidates = []
    try:
        for entry in list_entries(settings.input_dir, settings.follow_symlinks):
            found += 1
            ref = classify(entry, settings.input_dir)
            if isinstance(ref, FileRef):
                candidates.append((ref.relpath, ref.size, ref.path))
    except Exception as e:
        raise UserError(f"--input_dir {settings.input_dir} cannot be listed ({type(e).__name__}: {e})") from None
    if not found:
        raise UserError(f"--input_dir {settings.input_dir} is empty: put images in <input_dir>/<class>/<image>")
    if not candidates:
        raise UserError(
            f"no images found in {settings.input_dir}: {found} files, none with an image extension "
            f"({' '.join(sorted(IMAGE_EXTENSIONS))})"
        )
    top_level = {relpath.split("/")[0] for relpath, _, _ in candidates if "/" in relpath}
    try:
        split_folders = split_folder_layout(top_level)
    except ValueError as e:
        raise UserError(str(e)) from None
    folder_classes = class_folder_names((relpath for relpath, _, _ in candidates), split_folders)
    for name in folder_classes:
        problem = class_name_problem(name)
        if problem:
            raise UserError(f"the class folder {quoted_name(name)} in {settings.input_dir} has {problem}: "
                            "rename the folder")
    if not folder_classes:
        where = "its split folders" if split_folders else settings.input_dir
        raise UserError(
            f"found {len(candidates)} images directly in {where} but no class folders: expected "
            "<input_dir>/<class>/<image> (or <input_dir>/<split>/<class>/<image>), one folder per class"
        )
    notes = []
    if settings.labels_file:
        class_names = read_labels_file(settings.labels_file)
        unknown = sorted(set(folder_classes) - set(class_names))
        if unknown:
            notes.append(
                f"{len(unknown)} class folder(s) are not in the labels file and their images will be skipped "
                f"as unknown_class: {', '.join(unknown[:10])}"
            )
    else:
        class_names, unknown = folder_classes, []
    known = set(class_names)

    expected = Counter()
    source_bytes = Counter()
    placed_files = []  # (path, relpath, size) of the images that will be converted
    for relpath, size, path in candidates:
        placed = place(
            relpath,
            split_folders=split_folders,
            seed=settings.seed,
            validation_split=settings.validation_split,
            test_split=settings.test_split,
        )
        if isinstance(placed, Placement) and placed.class_name in known:
            expected[placed.split] += 1
            source_bytes[placed.split] += size
            placed_files.append((path, relpath, size))
    if not expected:
        raise UserError(
            f"none of the {len(candidates)} images in {settings.input_dir} belongs to a class in the labels file "
            f"{settings.labels_file}: check that the class folder names match its lines"
        )
    sample = estimate.measure_output(placed_files, settings.image, settings.schema, settings.compression)
    estimated_bytes = {split: split_bytes(settings, sample, expected[split], source_bytes[split])
                       for split in expected}
    # --quiet prints nothing but errors and the summary: no advice either.
    upscale = None if settings.quiet else upscale_notice(settings, placed_files, sample, sum(expected.values()))
    if upscale:
        notes.insert(0, upscale)
    num_shards = {}
    for split in SPLITS:
        count = expected[split]
        if not count:
            continue
        if split in settings.num_shards:
            shards = settings.num_shards[split]
            if shards > count:
                notes.append(f"--num_shards={split}={shards} is more than the {count} {split} images: writing "
                             f"{plural(count, 'shard')}")
                shards = count
        else:
            shards = shards_for(estimated_bytes[split], settings.shard_size_mb)
            shards = max(1, min(shards, count))
        num_shards[split] = shards
    return Plan(
        class_names=class_names,
        split_folders=split_folders,
        expected_per_split={split: expected[split] for split in SPLITS if expected[split]},
        num_shards=num_shards,
        files_found=found,
        unknown_classes=unknown,
        notes=notes,
    )


# The output folder's names live in transforms.outputs; these stay importable from here.
__all__ = ["SHARD_NAME", "Plan", "own_outputs", "plan_dataset"]
