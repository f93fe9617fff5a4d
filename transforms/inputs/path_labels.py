"""LabelFromPaths: each listed image's class name taken from its path by --label_from, labelled as a manifest's rows.

`--label_from` is a regular expression with a named group `label`, searched (the `regex` engine, with
--group_by's time limit) in each image's path below --input_dir, its split folder included
(`train/cat.123.jpg`). An optional named group `group` is the image's --group_by group. Split folders give
the split; without them the hash split applies (by the group when there is one). Class folders play no part.

A listed file becomes a `ManifestRow` (row 0, its listed size) and goes through the manifest's labelling
(`transforms.inputs.manifest.label_rows`): without --labels_file the class names are the distinct labels, found
in the job (never on the launcher), and a label that labels.txt cannot hold, one in another letter case or
Unicode normal form than its class's, or one not in --labels_file, is reported as a manifest row's would be.
"""

from __future__ import annotations

import apache_beam as beam

from transforms.base import counters
from transforms.base.records import FileRef, ListedFile, Rejection
from transforms.inputs.manifest import CLASS_NAMES, GROUPS, SKIPPED, LabelRow, ManifestRow, label_rows
from transforms.labels.layout import LABEL_FROM_TIMEOUT, PathLabel, compile_group_by, has_group_capture, place_by_path

__all__ = ["CLASS_NAMES", "GROUPS", "SKIPPED", "LabelFromPaths", "path_row"]


class _PathRow(beam.DoFn):
    """FileRef -> ManifestRow (split folder's split or '', label and group from the path); SKIPPED: a Rejection
    for a path the pattern finds no label in (no_label_in_path), outside the split folders, or a timeout."""

    def __init__(self, label_from: str, split_folders: bool):
        self._label_from, self._split_folders = label_from, split_folders
        self._pattern = None

    def setup(self):
        self._pattern = compile_group_by(self._label_from)

    def process(self, ref: FileRef | ListedFile):
        row = path_row(ref, self._pattern, self._split_folders)
        if isinstance(row, Rejection):
            counters.inc("files_unlabeled" if row.stage == "skipped" else "files_rejected_by_label")
            yield beam.pvalue.TaggedOutput(SKIPPED, row)
            return
        yield row


def path_row(ref: FileRef | ListedFile, pattern, split_folders: bool) -> ManifestRow | Rejection:
    """A listed image as the manifest row --label_from makes of it, or why it has none (`place_by_path`). A
    ListedFile (--split_lists) takes the split its list gives."""
    listed_split = ""
    if isinstance(ref, ListedFile):
        ref, listed_split = ref.file, ref.split
    placed = place_by_path(ref.relpath, pattern, split_folders=split_folders)
    if not isinstance(placed, PathLabel):
        reason, detail = placed
        stage = "rejected" if reason == LABEL_FROM_TIMEOUT else "skipped"
        return Rejection(ref.relpath, stage, reason, detail)
    return ManifestRow(0, ref.path, ref.relpath, placed.class_name, listed_split or placed.split,
                       group=placed.group, size=ref.size)


class LabelFromPaths(beam.PTransform):
    """FileRef -> {"images": ImageRef, SKIPPED: Rejection, GROUPS: (group or '', split, relpath)} and, without
    `class_names`, CLASS_NAMES: one sorted list, the labels found in the job.

    `class_names`: --labels_file's (or an append's dataset's) classes, in id order; None: found in the job.
    `group_by`: --group_by, when the pattern has no group `group` of its own.
    """

    def __init__(self, label_from: str, class_names: list[str] | None, *, split_folders: bool, seed: int,
                 validation_split: float, test_split: float, group_by: str | None = None):
        super().__init__()
        self._label_from, self._split_folders = label_from, split_folders
        self._find_names = class_names is None
        ids = None if class_names is None else {name: i for i, name in enumerate(class_names)}
        groups = bool(group_by) or has_group_capture(label_from)
        # size 0: every row carries its listed size
        self._label = LabelRow(ids, seed, validation_split, test_split, 0, group_by=group_by, groups=groups,
                             from_paths=True)

    def expand(self, refs):
        rows = refs | "PathLabels" >> beam.ParDo(_PathRow(self._label_from, self._split_folders)).with_outputs(
            SKIPPED, main="rows")
        # ManifestRow -> ImageRef: class ids (found in the job without given names), split, group
        labeled = label_rows(rows.rows, self._label, self._find_names)
        skipped = (rows[SKIPPED], labeled[SKIPPED]) | "LabelRejections" >> beam.Flatten()
        return {**labeled, SKIPPED: skipped}
