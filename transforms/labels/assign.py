"""AssignLabels: class id and split for every image, from its relative path alone."""

from __future__ import annotations

import apache_beam as beam

from transforms.base import counters
from transforms.base.examples import record_id
from transforms.base.paths import display_path, name_bytes, quoted_name
from transforms.base.records import FileRef, ImageRef, ListedFile, Rejection
from transforms.labels.layout import GROUP_BY_TIMEOUT, UNKNOWN_CLASS, Placement, compile_group_by, place, shuffle_key

UNLABELED = "unlabeled"
GROUPS = "groups"  # with --group_by: (group or '', split, relpath) of every labelled image
DUPLICATE_ID = "duplicate_id"  # --unlabeled: a file whose id (record_id) another file has, rejected
REJECTED = "rejected"


class _AssignLabel(beam.DoFn):
    def __init__(self, class_ids: dict[str, int], split_folders: bool, seed: int,
                 validation_split: float, test_split: float, group_by: str | None = None, unlabeled: bool = False):
        self._class_ids = class_ids
        self._unlabeled = unlabeled
        self._placement = dict(split_folders=split_folders, seed=seed,
                               validation_split=validation_split, test_split=test_split, unlabeled=unlabeled)
        self._seed = seed
        self._group_by = group_by

    def setup(self):
        self._placement["group_by"] = compile_group_by(self._group_by) if self._group_by else None

    def process(self, ref: FileRef | ListedFile):
        split = None  # the split hash's, or the split folder's
        if isinstance(ref, ListedFile):  # --split_lists: the split its list gives
            ref, split = ref
        placed = place(ref.relpath, **self._placement, split=split)
        if not isinstance(placed, Placement):
            stage = "rejected" if placed[0] == GROUP_BY_TIMEOUT else "skipped"
            counters.inc("files_unlabeled" if stage == "skipped" else counters.rejected(GROUP_BY_TIMEOUT))
            yield beam.pvalue.TaggedOutput(UNLABELED, Rejection(ref.relpath, stage, *placed))
            return
        label = None if self._unlabeled else self._class_ids.get(placed.class_name)
        if label is None and not self._unlabeled:
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
    """FileRef (or, with --split_lists, ListedFile: the file and its list's split) -> ImageRef (label, split,
    shuffle key), plus an UNLABELED output of Rejection and, with
    `group_by` (a regex), a GROUPS output of (group or '', split, relpath) per labelled image.

    With `unlabeled` (--unlabeled), an image directly in the input folder gets no label (None) and the one
    split UNLABELED_SPLIT; `class_names` is then empty."""

    def __init__(self, class_names: list[str], *, split_folders: bool, seed: int,
                 validation_split: float, test_split: float, group_by: str | None = None, unlabeled: bool = False):
        super().__init__()
        self._fn = _AssignLabel({name: i for i, name in enumerate(class_names)}, split_folders, seed,
                                validation_split, test_split, None if unlabeled else group_by, unlabeled)

    def expand(self, refs):
        return refs | "AssignLabel" >> beam.ParDo(self._fn).with_outputs(UNLABELED, GROUPS, main="images")


def _first_of_each_id(item):
    """(id, [ImageRef]) -> the first ImageRef by name; each other one as a Rejection on REJECTED."""
    taken, refs = item
    first, *others = sorted(refs, key=lambda ref: name_bytes(ref.relpath))
    yield first
    for ref in others:
        counters.inc(counters.rejected(DUPLICATE_ID))
        yield beam.pvalue.TaggedOutput(REJECTED, Rejection(
            ref.relpath, "rejected", DUPLICATE_ID,
            f"its id {quoted_name(taken)} (the file name without its extension) is also the id of "
            f"{quoted_name(first.relpath)}, which is written: rename one of them"))


def _unique_against_dataset(item):
    """(id, {"new": [ImageRef], "old": [relpath]}) -> `_first_of_each_id` of the new ones, or, when the dataset an
    append grows has a record of that id (`old`), the file of that record (for SkipPresent to judge) and each
    other one as a Rejection on REJECTED: the id is taken."""
    taken, joined = item
    old, refs = sorted(joined["old"]), list(joined["new"])
    if not old:
        if refs:
            yield from _first_of_each_id((taken, refs))
        return
    for ref in refs:
        if display_path(ref.relpath) in old:
            yield ref
            continue
        counters.inc(counters.rejected(DUPLICATE_ID))
        yield beam.pvalue.TaggedOutput(REJECTED, Rejection(
            ref.relpath, "rejected", DUPLICATE_ID,
            f"its id {quoted_name(taken)} (the file name without its extension) is also the id of "
            f"{quoted_name(old[0])}, a record of the dataset: rename it"))


class UniqueIds(beam.PTransform):
    """ImageRef -> ImageRef, one per id (`transforms.base.examples.record_id`, the key an unlabeled set's records
    are told apart by): of the files that share an id the first by name is kept, each other goes to REJECTED
    as a Rejection (duplicate_id). `taken` (an append): (id, relpath) of each record of the dataset it grows; a
    file of such an id is kept only if it is that record's file."""

    def __init__(self, taken=None):
        super().__init__()
        self._taken = taken

    def expand(self, images):
        # (id, ImageRef)
        keyed = images | "KeyById" >> beam.Map(lambda ref: (record_id(ref.relpath), ref))
        if self._taken is not None:
            return (
                {"new": keyed, "old": self._taken}
                # (id, {"new": [ImageRef], "old": [relpath]})
                | "JoinDatasetIds" >> beam.CoGroupByKey()
                | "KeepFirst" >> beam.FlatMap(_unique_against_dataset).with_outputs(REJECTED, main="images")
            )
        return (
            keyed
            # (id, [ImageRef]): a file's id is its name without the extension, so a group is a handful at most
            | "GroupById" >> beam.GroupByKey()
            | "KeepFirst" >> beam.FlatMap(_first_of_each_id).with_outputs(REJECTED, main="images")
        )
