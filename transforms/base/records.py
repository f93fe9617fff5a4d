"""Typed elements that flow through the graph, so steps never index tuples."""

from __future__ import annotations

from typing import NamedTuple

from transforms.base.paths import display_path


class FileRef(NamedTuple):
    """A file found under the input folder (metadata only, no bytes)."""

    path: str  # full path or URL, as the file system names it
    relpath: str  # path below input_dir, always with '/' separators; not-UTF-8 bytes as surrogates
    size: int  # bytes


class ListedFile(NamedTuple):
    """A file found under the input folder, and the split a --split_lists list gives it
    (transforms.inputs.split_lists)."""

    file: FileRef
    split: str


class ImageRef(NamedTuple):
    """An image file with its label and split assigned; still no bytes read."""

    path: str
    relpath: str
    size: int
    split: str
    class_name: str
    label: int | None  # None: an image of an unlabeled set (--unlabeled), which has no class
    shuffle_key: int  # 64-bit hash of (seed, relpath): a stable random order
    # --multi_label: the class ids (sorted, no repeats; () for an image of no class) and their names in the
    # same order; `label` is then -1 and `class_name` the names joined by ';'. None for a single label.
    labels: tuple[int, ...] | None = None
    label_names: tuple[str, ...] = ()
    extras: tuple = ()  # typed extra features, ((key, dtype, values), ...): see transforms.base.features
    # --task=detection: the image's objects (transforms.detection.objects.ImageAnnotations, without the problems
    # its parser set aside: those are in errors.jsonl already); None for a classification record
    annotations: object | None = None


def label_of(ref: ImageRef) -> int | tuple[int, ...]:
    """What an image's label is, for tallies and duplicate reports: its class id, or its tuple of class ids."""
    return ref.label if ref.labels is None else ref.labels


class Rejection(NamedTuple):
    """A file that is not in the dataset, and why. Feeds the error report."""

    relpath: str
    # 'skipped' (by name, never opened) or 'rejected' (not converted, or an entry the listing cannot use); of a
    # detection dataset also 'annotation': one annotation set aside (its image, relpath, may well be written)
    stage: str
    reason: str  # short machine-readable reason, e.g. 'truncated'
    detail: str  # human-readable message, e.g. the decoder's own

    def to_json(self) -> dict:
        """As written to errors.jsonl: a file name that is not UTF-8 shows its bytes as \\xNN."""
        return {key: display_path(value) if isinstance(value, str) else value for key, value in self._asdict().items()}
