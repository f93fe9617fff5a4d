"""FindDuplicates: exact-duplicate source files (same SHA-256 of their bytes) among the written images.

Every written image comes with (sha256, (split, label, relpath)) from WriteShards.
Grouping by the hash spreads the hashes over the workers (no worker holds them
all); only the groups of two or more copies go on, and one combine reduces them
to the counts and the `MAX_EXAMPLES` largest groups (each as its count, its kind and its first
`EXAMPLE_COPIES` copies by path; a group is streamed once, never held) that image_tfrecords.json
reports. A group is one of three kinds (transforms/base/duplicate_kinds.py, which has no Beam).
"""

from __future__ import annotations

import hashlib
import heapq
import os
import stat
import typing
from collections.abc import Iterable

import apache_beam as beam

from transforms.base.duplicate_kinds import (
    KINDS,
    MAX_EXAMPLES,
    DuplicateGroup,
    duplicate_groups,
    empty_summary,
    kind,
    label_text,
    label_value,
)
from transforms.base.paths import display_path, is_local


def _rank(group: DuplicateGroup):
    """Which groups image_tfrecords.json lists: the largest, then by first path."""
    return -group.size, group.copies[0][2]


class _Summarise(beam.CombineFn):
    """DuplicateGroup -> the counts per kind and the MAX_EXAMPLES largest groups (then by first path)."""

    def create_accumulator(self):
        return empty_summary()

    def add_input(self, acc, group):
        group = DuplicateGroup(group[0], tuple(tuple(c) for c in group[1]), *group[2:])
        acc["groups"] += 1
        acc["copies"] += group.size
        acc[kind(group)] += 1
        acc["examples"] = heapq.nsmallest(MAX_EXAMPLES, [*acc["examples"], (_rank(group), group)])
        return acc

    def merge_accumulators(self, accs):
        out = self.create_accumulator()
        for acc in accs:
            for key in ("groups", "copies", *KINDS):
                out[key] += acc[key]
            out["examples"] = heapq.nsmallest(MAX_EXAMPLES, [*out["examples"], *acc["examples"]])
        return out

    def extract_output(self, acc):
        return acc


def describe(summary: dict | None, class_names: list[str]) -> dict:
    """The `duplicates` section of image_tfrecords.json from the combined summary (None: no duplicates):
    the counts, and for each listed group its hash, kind, count and first copies."""
    summary = summary or empty_summary()
    examples = []
    for _, (sha256, copies, *rest) in sorted(summary["examples"]):
        group = DuplicateGroup(sha256, tuple((s, label_value(label), path) for s, label, path in copies), *rest)
        examples.append({
            "sha256": sha256,
            "kind": kind(group),
            "count": group.size,
            "copies": [{"relpath": path, "split": split,
                        "class_name": label_text(label, class_names)}
                       for split, label, path in group.copies],
        })
    return {"groups": summary["groups"], "copies": summary["copies"],
            **{k: summary[k] for k in KINDS}, "examples": examples}


class FindDuplicates(beam.PTransform):
    """(sha256, (split, label, relpath)) of every written image -> one summary dict (see `describe`), or none
    when no image has a copy (`describe(None)`: no duplicates); without a default, no step of its own makes one."""

    def expand(self, hashes):
        return (
            hashes
            # (sha256, [(split, label, relpath)]): spread over the workers by hash
            | "GroupByHash" >> beam.GroupByKey()
            | "KeepCopies" >> beam.FlatMapTuple(duplicate_groups)
            | "Summarise" >> beam.CombineGlobally(_Summarise()).without_defaults()
        )


# --- --duplicates=drop: a hashing pass before the shards are assigned ---------------------------------------------

DUPLICATE = "duplicate"
DUPLICATE_CONFLICT = "duplicate_conflict"
DROPPED = "dropped"
UNHASHED = "unhashed"
HASH_CHUNK = 1 << 20


def hash_file(path: str, max_bytes: int, size: int | None = None, throttled_s: float | None = None,
              start_rate: float | None = None) -> str:
    """The hex SHA-256 of the file at `path` (local or gs://), read in 1 MB pieces (memory stays small);
    '' for a file that is not hashed here: larger than `max_bytes`, not a regular file, or unreadable (the
    conversion then rejects it with its reason).

    Raises:
        TransientReadError: the read kept failing with transient errors (the bundle fails and is retried).
    """
    from apache_beam.io.filesystems import FileSystems

    from transforms.base.transient import THROTTLED_RETRY_S, TransientReadError, with_retries

    def read(_timeout: float) -> str:
        digest, total = hashlib.sha256(), 0
        with FileSystems.open(path, compression_type="uncompressed") as f:
            while piece := f.read(HASH_CHUNK):
                total += len(piece)
                if total > max_bytes:
                    return ""
                digest.update(piece)
        return digest.hexdigest()

    try:
        if is_local(path):  # links followed; a FIFO or a device is never opened (it could block or never end)
            info = os.stat(path)
            if not stat.S_ISREG(info.st_mode):
                return ""
            size = info.st_size
        if size is not None and size > max_bytes:
            return ""
        return with_retries(read, path, throttled_s=THROTTLED_RETRY_S if throttled_s is None else throttled_s,
                            start_rate=start_rate)
    except TransientReadError:
        raise
    except Exception:  # not this step's to judge: the conversion reads it again and rejects it with the reason
        return ""


def _dropped(ref, rejection, lost=None) -> Iterable:
    """A dropped copy's Rejection on DROPPED, and with `lost` (--task=detection), its annotations' lines."""
    yield beam.pvalue.TaggedOutput(DROPPED, rejection)
    for line in lost(ref, rejection) if lost is not None else ():
        yield beam.pvalue.TaggedOutput(DROPPED, line)


def resolve(sha256: str, refs: Iterable, lost=None) -> Iterable:
    """One group of byte-identical files -> the ImageRef to write (the first path) and a Rejection (DROPPED) of
    each other copy; copies under different labels are all rejected (no label is picked). A lone file is kept.
    `lost(ref, rejection)`: the errors.jsonl lines of a dropped copy's annotations (a detection image's, whose
    copies may carry other annotations: the first path's are written, the others' are each a line)."""
    from transforms.base import counters
    from transforms.base.records import Rejection, label_of

    refs = sorted(refs, key=lambda r: r.relpath)
    if len(refs) == 1:
        yield refs[0]
        return
    # The report's test (`kind`): the same normalised label (a class id, or a set of ids), not the same text.
    shown = {label_value(label_of(ref)): ref.class_name for ref in refs}
    if len(set(shown.values())) < len(shown):  # different sets whose names join alike: ['a;b'] and ['a', 'b']
        shown = {label_value(label_of(ref)): list(ref.label_names) for ref in refs}
    labels = sorted(map(repr, shown.values()))
    if len(labels) > 1:
        for ref in refs:
            counters.inc(counters.rejected(DUPLICATE_CONFLICT))
            others = [display_path(r.relpath) for r in refs if r is not ref]
            yield from _dropped(ref, Rejection(
                ref.relpath, "rejected", DUPLICATE_CONFLICT,
                f"the same bytes as {', '.join(repr(o) for o in others[:3])}{' ...' if len(others) > 3 else ''} "
                f"under the classes {', '.join(labels)}: no copy is written "
                f"(--duplicates=drop; SHA-256 {sha256})"), lost)
        return
    keeper, *copies = refs
    yield keeper
    for ref in copies:
        counters.inc(counters.rejected(DUPLICATE))
        yield from _dropped(ref, Rejection(
            ref.relpath, "rejected", DUPLICATE,
            f"the same bytes as {display_path(keeper.relpath)!r}, which is written "
            f"(--duplicates=drop; SHA-256 {sha256})"), lost)


def resolve_held(sha256: str, joined: dict, lost=None) -> Iterable:
    """One group of byte-identical files on an append, {"new": [ImageRef], "held": [(split, label, relpath)] of the
    dataset's records}: with no record of these bytes, `resolve`; with one, every new copy is rejected, DUPLICATE
    under the record's label, DUPLICATE_CONFLICT under another (the record stays: an append never removes one), so
    that a copy an earlier run dropped is not written now."""
    from transforms.base import counters
    from transforms.base.records import Rejection, label_of

    refs, held = sorted(joined["new"], key=lambda r: r.relpath), sorted(joined["held"], key=lambda h: h[2])
    if not held:
        yield from resolve(sha256, refs, lost)
        return
    labels = {label_value(label) for _, label, _ in held}
    for ref in refs:
        same = [path for _, label, path in held if label_value(label) == label_value(label_of(ref))]
        reason = DUPLICATE if same else DUPLICATE_CONFLICT
        counters.inc(counters.rejected(reason))
        yield from _dropped(ref, Rejection(
            ref.relpath, "rejected", reason,
            f"the same bytes as {(same or [held[0][2]])[0]!r}, a record of the dataset"
            f"{'' if same else ' under another class' + ('es' if len(labels) > 1 else '')}: this copy is not "
            f"written (--duplicates=drop; SHA-256 {sha256})"), lost)


class _Hash(beam.DoFn):
    """ImageRef -> (sha256, ImageRef); one that is not hashed here on UNHASHED; (sha256, (split, label, relpath))
    on HASHES for the duplicate report."""

    def __init__(self, max_bytes: int, throttled_s: float | None = None, start_rate: float | None = None):
        self._max_bytes = max_bytes
        self._throttled_s = throttled_s
        self._start_rate = start_rate

    def process(self, ref):
        digest = hash_file(ref.path, self._max_bytes, ref.size, self._throttled_s, self._start_rate)
        if not digest:
            yield beam.pvalue.TaggedOutput(UNHASHED, ref)
            return
        label = ref.label if ref.labels is None else ref.labels
        yield beam.pvalue.TaggedOutput(HASHES, (digest, (ref.split, label, display_path(ref.relpath))))
        yield digest, ref


HASHES = "hashes"


class DropDuplicates(beam.PTransform):
    """ImageRef -> the ImageRefs to write ('kept'); DROPPED: Rejection of each copy not written; HASHES:
    (sha256, (split, label, relpath)) of every hashed image, for the duplicate report. `held` (an append): the
    dataset's records as (sha256, (split, label, relpath)): no copy of one is written (`resolve_held`). `lost`
    (--task=detection; `resolve`): a dropped copy's annotations as errors.jsonl lines, on DROPPED too.

    Every file is read once here, before the shards are assigned (the shards are counted from the kept
    images), and again when it is converted: that second read is the price of --duplicates=drop.
    """

    def __init__(self, max_file_bytes: int, throttled_s: float | None = None, start_rate: float | None = None,
                 held=None, lost=None):
        super().__init__()
        self._lost = lost  # --task=detection: (ImageRef, Rejection) -> its annotations' Rejections
        self._max_bytes = max_file_bytes
        self._throttled_s = throttled_s  # --throttled_retry_s (None: transient.THROTTLED_RETRY_S)
        self._start_rate = start_rate  # a process's first read rate (None: transient.INITIAL_READS_PER_S)
        self._held = held  # an append: (sha256, (split, label, relpath)) of the dataset's records, a PCollection

    def expand(self, refs):
        hash_step = _Hash(self._max_bytes, self._throttled_s, self._start_rate)
        hashed = refs | "HashSources" >> beam.ParDo(hash_step).with_output_types(
            tuple[str, typing.Any]).with_outputs(UNHASHED, HASHES, main="hashed")
        if self._held is None:
            resolved = (
                hashed.hashed
                # (sha256, [ImageRef]): spread over the workers by hash
                | "GroupByHash" >> beam.GroupByKey()
                | "KeepOnePerGroup" >> beam.FlatMapTuple(resolve, lost=self._lost).with_outputs(DROPPED, main="kept")
            )
        else:
            resolved = (
                {"new": hashed.hashed, "held": self._held}
                # (sha256, {"new": [ImageRef], "held": [(split, label, relpath)]}): spread over the workers by hash
                | "GroupByHash" >> beam.CoGroupByKey()
                | "KeepOnePerGroup" >> beam.FlatMapTuple(resolve_held, lost=self._lost).with_outputs(DROPPED,
                                                                                                    main="kept")
            )
        kept = (resolved.kept, hashed[UNHASHED]) | "KeptAndUnhashed" >> beam.Flatten()
        return {"kept": kept, DROPPED: resolved[DROPPED], HASHES: hashed[HASHES]}
