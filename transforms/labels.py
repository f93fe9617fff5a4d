"""AssignLabels: class id and split for every image, from its relative path alone."""

from __future__ import annotations

import apache_beam as beam

from transforms import counters
from transforms.layout import (
    GROUP_BY_TIMEOUT,
    UNKNOWN_CLASS,
    Placement,
    compile_group_by,
    display_path,
    place,
    shuffle_key,
)
from transforms.records import FileRef, ImageRef, Rejection

UNLABELED = "unlabeled"
GROUPS = "groups"  # with --group_by: (group or '', split, relpath) of every labelled image


class _AssignLabel(beam.DoFn):
    def __init__(self, class_ids: dict[str, int], split_folders: bool, seed: int,
                 validation_split: float, test_split: float, group_by: str | None = None):
        self._class_ids = class_ids
        self._placement = dict(split_folders=split_folders, seed=seed,
                               validation_split=validation_split, test_split=test_split)
        self._seed = seed
        self._group_by = group_by

    def setup(self):
        self._placement["group_by"] = compile_group_by(self._group_by) if self._group_by else None

    def process(self, ref: FileRef):
        placed = place(ref.relpath, **self._placement)
        if not isinstance(placed, Placement):
            stage = "rejected" if placed[0] == GROUP_BY_TIMEOUT else "skipped"
            counters.inc("files_unlabeled" if stage == "skipped" else counters.rejected(GROUP_BY_TIMEOUT))
            yield beam.pvalue.TaggedOutput(UNLABELED, Rejection(ref.relpath, stage, *placed))
            return
        label = self._class_ids.get(placed.class_name)
        if label is None:
            counters.inc("files_unlabeled")
            yield beam.pvalue.TaggedOutput(
                UNLABELED,
                Rejection(ref.relpath, "skipped", UNKNOWN_CLASS,
                          f"class folder {placed.class_name!r} is not in the labels file"),
            )
            return
        counters.inc(counters.TO_CONVERT)
        if self._group_by:
            # As text for the report: a name that is not UTF-8 shows its bytes as \xNN (and can be encoded).
            yield beam.pvalue.TaggedOutput(GROUPS, (display_path(placed.group), placed.split,
                                                    display_path(ref.relpath)))
        yield ImageRef(ref.path, ref.relpath, ref.size, placed.split, placed.class_name, label,
                       shuffle_key(ref.relpath, self._seed))


class AssignLabels(beam.PTransform):
    """FileRef -> ImageRef (label, split, shuffle key), plus an UNLABELED output of Rejection and, with
    `group_by` (a regex), a GROUPS output of (group or '', split, relpath) per labelled image."""

    def __init__(self, class_names: list[str], *, split_folders: bool, seed: int,
                 validation_split: float, test_split: float, group_by: str | None = None):
        super().__init__()
        self._fn = _AssignLabel({name: i for i, name in enumerate(class_names)}, split_folders, seed,
                                validation_split, test_split, group_by)

    def expand(self, refs):
        return refs | "AssignLabel" >> beam.ParDo(self._fn).with_outputs(UNLABELED, GROUPS, main="images")
