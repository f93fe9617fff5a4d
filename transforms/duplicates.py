"""FindDuplicates: exact-duplicate source files (same SHA-256 of their bytes) among the written images.

Every written image comes with (sha256, (split, label, relpath)) from WriteShards.
Grouping by the hash spreads the hashes over the workers (no worker holds them
all); only the groups of two or more copies go on, each as its count, its kind and
its first `EXAMPLE_COPIES` copies by path (a group is streamed once, never held: a
placeholder image repeated 5 million times is one group of five examples), and one
combine reduces them to the counts and the `MAX_EXAMPLES` largest groups that
image_tfrecords.json reports. A group is one of three kinds:

- `within_split`: every copy has the same label and the same split (harmless, but weights the image twice);
- `across_splits`: the same label in two splits (leakage: the model is evaluated on what it trained on);
- `conflicting_labels`: the copies carry different labels (a conflict: no label is right for both).
"""

from __future__ import annotations

import hashlib
import heapq
import typing
from collections.abc import Iterable
from typing import NamedTuple

import apache_beam as beam

from transforms.layout import display_path

WITHIN_SPLIT = "within_split"
ACROSS_SPLITS = "across_splits"
CONFLICTING_LABELS = "conflicting_labels"
KINDS = (WITHIN_SPLIT, ACROSS_SPLITS, CONFLICTING_LABELS)
MAX_EXAMPLES = 20  # groups listed in image_tfrecords.json, the largest first; the counts cover every group
EXAMPLE_COPIES = 5  # copies listed per group, the first by path; the group's "count" has them all
# How the converter's summary and pipeline.verify name each kind: one set of words for both.
KIND_WORDS = {WITHIN_SPLIT: "within a split", ACROSS_SPLITS: "across splits (leakage)",
              CONFLICTING_LABELS: "with different labels (conflict)"}


class DuplicateGroup(NamedTuple):
    """Byte-identical source files: their hash and copies' (split, label, relpath), sorted by path.

    Built from a stream (`duplicate_groups`), `copies` holds the first EXAMPLE_COPIES only, `count` all of them
    and `kind` their kind; built from every copy (pipeline.verify), the defaults say so.
    """

    sha256: str
    copies: tuple[tuple[str, int, str], ...]
    count: int = 0  # copies in all; 0: len(copies)
    kind: str = ""  # of all the copies; "": from `copies`

    @property
    def size(self) -> int:
        return self.count or len(self.copies)


def kind(group: DuplicateGroup) -> str:
    """The group's kind: conflicting_labels before across_splits before within_split."""
    if group.kind:
        return group.kind
    if len({label for _, label, _ in group.copies}) > 1:
        return CONFLICTING_LABELS
    if len({split for split, _, _ in group.copies}) > 1:
        return ACROSS_SPLITS
    return WITHIN_SPLIT


def label_value(label) -> int | tuple[int, ...] | None:
    """A copy's label: a class id, or (--multi_label) a tuple of class ids, compared as a set (sorted)."""
    if isinstance(label, list | tuple):
        return tuple(sorted({int(i) for i in label}))
    return None if label is None else int(label)  # None: an unlabeled set's image (--unlabeled)


def label_text(label, class_names: list[str]) -> str:
    """A copy's label as its class name; a multi-label set as its names joined by ';'."""
    if isinstance(label, list | tuple):
        return ";".join(label_text(i, class_names) for i in label)
    if label is None:  # an unlabeled set's image (--unlabeled)
        return ""
    return class_names[label] if 0 <= label < len(class_names) else str(label)


def duplicate_groups(sha256: str, copies: Iterable[tuple[str, int, str]]) -> list[DuplicateGroup]:
    """[the group] when `copies` holds two or more files, else []. One pass over `copies`, in bounded memory:
    the group keeps its count, its kind and its first EXAMPLE_COPIES copies by path."""
    seen = {"count": 0, "labels_differ": False, "splits_differ": False}
    first: list[tuple] = []

    def stream():
        for s, label, path in copies:
            copy = (str(s), label_value(label), str(path))
            seen["count"] += 1
            if not first:
                first.append(copy)
            seen["labels_differ"] = seen["labels_differ"] or copy[1] != first[0][1]
            seen["splits_differ"] = seen["splits_differ"] or copy[0] != first[0][0]
            yield copy

    examples = tuple(heapq.nsmallest(EXAMPLE_COPIES, stream(), key=_by_path))  # holds EXAMPLE_COPIES at most
    if not sha256 or seen["count"] < 2:
        return []
    found = (CONFLICTING_LABELS if seen["labels_differ"] else ACROSS_SPLITS if seen["splits_differ"]
             else WITHIN_SPLIT)
    return [DuplicateGroup(sha256, examples, seen["count"], found)]


def _by_path(copy: tuple[str, int | tuple, str]):
    return copy[2], copy


def summary_line(found: dict) -> str:
    """'Duplicates: N groups of identical source files (M files): a within a split, b across splits (leakage),
    c with different labels (conflict)': the words of the converter's summary and of pipeline.verify."""
    kinds = ", ".join(f"{found.get(k, 0)} {KIND_WORDS[k]}" for k in KINDS)
    return f"Duplicates: {found['groups']} groups of identical source files ({found['copies']} files): {kinds}"


def count_groups(groups: Iterable[DuplicateGroup]) -> dict:
    """The counts of `groups` as image_tfrecords.json's "duplicates" holds them (groups, copies, each kind)."""
    counts = {"groups": 0, "copies": 0, **dict.fromkeys(KINDS, 0)}
    for group in groups:
        counts["groups"] += 1
        counts["copies"] += group.size
        counts[kind(group)] += 1
    return counts


def empty_summary() -> dict:
    return {"groups": 0, "copies": 0, **{k: 0 for k in KINDS}, "examples": []}


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
    """(sha256, (split, label, relpath)) of every written image -> one summary dict (see `describe`)."""

    def expand(self, hashes):
        return (
            hashes
            # (sha256, [(split, label, relpath)]): spread over the workers by hash
            | "GroupByHash" >> beam.GroupByKey()
            | "KeepCopies" >> beam.FlatMapTuple(duplicate_groups)
            | "Summarise" >> beam.CombineGlobally(_Summarise())
        )


# --- --duplicates=drop: a hashing pass before the shards are assigned ---------------------------------------------

DUPLICATE = "duplicate"
DUPLICATE_CONFLICT = "duplicate_conflict"
DROPPED = "dropped"
UNHASHED = "unhashed"
HASH_CHUNK = 1 << 20


def hash_file(path: str, max_bytes: int, size: int | None = None, throttled_s: float | None = None) -> str:
    """The hex SHA-256 of the file at `path` (local or gs://), read in 1 MB pieces (memory stays small);
    '' for a file that is not hashed here: larger than `max_bytes`, not a regular file, or unreadable (the
    conversion then rejects it with its reason).

    Raises:
        TransientReadError: the read kept failing with transient errors (the bundle fails and is retried).
    """
    from apache_beam.io.filesystems import FileSystems

    from transforms.convert import check_regular_file
    from transforms.transient import THROTTLED_RETRY_S, TransientReadError, with_retries

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
        if FileSystems.get_scheme(path) is None:
            size = check_regular_file(path)
        if size is not None and size > max_bytes:
            return ""
        return with_retries(read, path, throttled_s=THROTTLED_RETRY_S if throttled_s is None else throttled_s)
    except TransientReadError:
        raise
    except Exception:  # not this step's to judge: the conversion reads it again and rejects it with the reason
        return ""


def resolve(sha256: str, refs: Iterable) -> Iterable:
    """One group of byte-identical files -> the ImageRef to write (the first path) and a Rejection (DROPPED) of
    each other copy; copies under different labels are all rejected (no label is picked). A lone file is kept."""
    from transforms import counters
    from transforms.records import Rejection, label_of

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
            counters.inc(f"rejected_{DUPLICATE_CONFLICT}")
            others = [display_path(r.relpath) for r in refs if r is not ref]
            yield beam.pvalue.TaggedOutput(DROPPED, Rejection(
                ref.relpath, "rejected", DUPLICATE_CONFLICT,
                f"the same bytes as {', '.join(repr(o) for o in others[:3])}{' ...' if len(others) > 3 else ''} "
                f"under the classes {', '.join(labels)}: no copy is written "
                f"(--duplicates=drop; SHA-256 {sha256})"))
        return
    keeper, *copies = refs
    yield keeper
    for ref in copies:
        counters.inc(f"rejected_{DUPLICATE}")
        yield beam.pvalue.TaggedOutput(DROPPED, Rejection(
            ref.relpath, "rejected", DUPLICATE,
            f"the same bytes as {display_path(keeper.relpath)!r}, which is written "
            f"(--duplicates=drop; SHA-256 {sha256})"))


class _Hash(beam.DoFn):
    """ImageRef -> (sha256, ImageRef); one that is not hashed here on UNHASHED; (sha256, (split, label, relpath))
    on HASHES for the duplicate report."""

    def __init__(self, max_bytes: int, throttled_s: float | None = None):
        self._max_bytes = max_bytes
        self._throttled_s = throttled_s

    def process(self, ref):
        digest = hash_file(ref.path, self._max_bytes, ref.size, self._throttled_s)
        if not digest:
            yield beam.pvalue.TaggedOutput(UNHASHED, ref)
            return
        label = ref.label if ref.labels is None else ref.labels
        yield beam.pvalue.TaggedOutput(HASHES, (digest, (ref.split, label, display_path(ref.relpath))))
        yield digest, ref


HASHES = "hashes"


class DropDuplicates(beam.PTransform):
    """ImageRef -> the ImageRefs to write ('kept'); DROPPED: Rejection of each copy not written; HASHES:
    (sha256, (split, label, relpath)) of every hashed image, for the duplicate report.

    Every file is read once here, before the shards are assigned (the shards are counted from the kept
    images), and again when it is converted: that second read is the price of --duplicates=drop.
    """

    def __init__(self, max_file_bytes: int, throttled_s: float | None = None):
        super().__init__()
        self._max_bytes = max_file_bytes
        self._throttled_s = throttled_s  # --throttled_retry_s (None: transient.THROTTLED_RETRY_S)

    def expand(self, refs):
        hashed = refs | "HashSources" >> beam.ParDo(_Hash(self._max_bytes, self._throttled_s)).with_output_types(
            tuple[str, typing.Any]).with_outputs(UNHASHED, HASHES, main="hashed")
        resolved = (
            hashed.hashed
            # (sha256, [ImageRef]): spread over the workers by hash
            | "GroupByHash" >> beam.GroupByKey()
            | "KeepOnePerGroup" >> beam.FlatMapTuple(resolve).with_outputs(DROPPED, main="kept")
        )
        kept = (resolved.kept, hashed[UNHASHED]) | "KeptAndUnhashed" >> beam.Flatten()
        return {"kept": kept, DROPPED: resolved[DROPPED], HASHES: hashed[HASHES]}
