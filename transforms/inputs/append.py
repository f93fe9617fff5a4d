"""--if_exists=append: which images a dataset already holds, the sources files that say so, and the new shards' names.

Every run writes, beside its shards, the list of the records it added (`WriteSources`:
`sources-<run id>-00000-of-00002.jsonl`, one `[relpath, sha256, split, label]` JSON list a
line). An append reads those lists of the dataset in the job (`ReadSources`, in parallel, never
on the launcher) and joins them with the listed images by relative path (`SkipPresent`, a
CoGroupByKey): an image whose path is recorded is hashed, and

* the same SHA-256: it is in the dataset already, and is not converted again (counted);
* other bytes: it is rejected as `changed_since_dataset` (errors.jsonl names the old and new hashes):
  the dataset keeps its record, and `--if_exists=overwrite` rebuilds it with the new bytes;
* a path not recorded: a new image, converted into new shards.

The sources files must account for every record the dataset holds: a path listed twice stops the run here, and
PublishDataset, before it writes anything, compares the lines per split with the description's records
(`check_held`): a sources file that went missing, empty or lost lines at a line boundary would otherwise let
the append write the images it listed a second time. No shard is read.

The new shards of a split take the indices after the old ones (`appended_shards`), and the old ones the new total
in their names (train-00000-of-00004 -> train-00000-of-00006): the globs the docs recommend, TFDS's shard
template, Kaggle's names and the index files see every shard exactly once.
"""

from __future__ import annotations

import json

import apache_beam as beam

from transforms.base import counters
from transforms.base.dataset_format import (
    CHANGED_SINCE_DATASET,
    KAGGLE,
    KAGGLE_NAME,
    SHARD_NAME,
    SOURCES_SUFFIX,
    index_name,
    kaggle_name,
    parse_source_line,
    shard_name,
    sources_prefix,
)
from transforms.base.paths import display_path
from transforms.base.records import Rejection
from transforms.inputs.duplicates import hash_file
from transforms.inputs.rows import TruncatedFile

CHANGED = CHANGED_SINCE_DATASET
PRESENT = "images_already_in_dataset"  # the counter, and PublishDataset's input of their number
# --task=detection: the objects of each image already in the dataset (found by the parser, never written again)
PRESENT_OBJECTS = "objects_already_in_dataset"

# Options that may differ from the dataset's on an append: where the images come from and how new shards are
# sized. Every other recorded option shapes the records or their splits, and must be the dataset's.
FREE_OPTIONS = frozenset({"input_dir", "manifest", "metadata", "labels_file", "num_shards", "shard_size_mb",
                          "follow_symlinks", "duplicates", "max_file_mb", "image_timeout_s"})


def source_line(hashed) -> str:
    """(sha256, (split, label, relpath)) of a written image -> its sources line."""
    sha256, (split, label, relpath) = hashed
    return json.dumps([relpath, sha256, split, list(label) if isinstance(label, tuple | list) else label])


def checked_source_line(path: str, line: str):
    """`parse_source_line` of a line of the sources file `path`.

    Raises:
        TruncatedFile: the line is not a sources record: the dataset's own list of what it holds is damaged, and
            appending would convert the image it named again, beside its record.
    """
    parsed = parse_source_line(line)
    if parsed is None:
        raise TruncatedFile(f"the dataset's sources file {path} is damaged (a line that is not [relpath, sha256, "
                            f"split, label]: {line[:80]!r}): appending would write its image twice; convert the "
                            "folder again with --if_exists=overwrite")
    return parsed


REBUILD = "convert the folder again with --if_exists=overwrite"


def check_held(held: dict, splits: dict) -> None:
    """The dataset's sources lines per split (`held`, from ReadSources) against its description's `splits`.

    Raises:
        TruncatedFile: they differ: the dataset's own list of what it holds is damaged (a sources file missing,
            emptied or cut at a line boundary), and appending would write the images it lost a second time.
    """
    for split in sorted(set(held) | set(splits)):
        lines, records = held.get(split, 0), (splits.get(split) or {}).get("records", 0)
        if lines != records:
            raise TruncatedFile(
                f"the dataset's list of its records is damaged: its sources files list {lines} images of split "
                f"{split!r}, but it holds {records} records there (a sources file missing, emptied or cut short), "
                f"so an append would write images it already holds a second time: {REBUILD}")


class WriteSources(beam.PTransform):
    """(sha256, (split, label, relpath)) of each written image -> the sources files' paths, in `folder`."""

    def __init__(self, folder: str, run_id: str):
        super().__init__()
        self._prefix = folder.rstrip("/") + "/" + sources_prefix(run_id)

    def expand(self, hashes):
        return (
            hashes
            | "SourceLines" >> beam.Map(source_line)
            # the paths of the files written: -00000-of-00002.jsonl
            | "WriteSourceFiles" >> beam.io.WriteToText(self._prefix, file_name_suffix=SOURCES_SUFFIX,
                                                         shard_name_template="-SSSSS-of-NNNNN")
        )


class ReadSources(beam.PTransform):
    """PBegin -> (relpath, (sha256, split, label)) of every record the dataset's sources files list."""

    def __init__(self, paths: list[str]):
        super().__init__()
        self._paths = list(paths)

    def expand(self, pbegin):
        return (
            pbegin
            | "SourceFiles" >> beam.Create(self._paths)
            # (file, line): a line that is not a record fails the run, never drops its image from the dataset
            | "ReadSourceLines" >> beam.io.ReadAllFromText(with_filename=True)
            | "ParseSources" >> beam.MapTuple(checked_source_line)
        )


def old_hashes(source):
    """(relpath, (sha256, split, label)) -> (sha256, (split, label, relpath)), as WriteShards sends its own."""
    relpath, (sha256, split, label) = source
    return sha256, (split, label, relpath)


class _Judge(beam.DoFn):
    """(relpath, {"new": [ImageRef], "old": [(sha256, split, label)]}) -> the ImageRefs to convert; a Rejection
    of each changed file on REJECTED; 1 per image already in the dataset on PRESENT, and a detection image's
    number of objects on PRESENT_OBJECTS."""

    def __init__(self, max_bytes: int, throttled_s: float | None = None, start_rate: float | None = None):
        self._max_bytes = max_bytes
        self._throttled_s = throttled_s
        self._start_rate = start_rate  # a process's first read rate (None: transient.INITIAL_READS_PER_S)

    def process(self, element):
        relpath, joined = element
        old = list(joined["old"])
        if len(old) > 1:  # one path is one record: a line twice hides a line lost (the counts would still agree)
            raise TruncatedFile(f"the dataset's list of its records is damaged: its sources files list {relpath!r} "
                                f"{len(old)} times, and a path is one record: {REBUILD}")
        for ref in joined["new"]:
            if not old:
                yield ref
                continue
            digest = hash_file(ref.path, self._max_bytes, ref.size, self._throttled_s, self._start_rate)
            recorded = {sha256 for sha256, _, _ in old}
            if digest and digest in recorded:
                counters.inc(PRESENT)
                counters.inc(counters.TO_CONVERT, -1)  # the progress line's total: the images to convert
                yield beam.pvalue.TaggedOutput(PRESENT, 1)
                if ref.annotations is not None:  # a detection image: its objects are the dataset's already
                    yield beam.pvalue.TaggedOutput(PRESENT_OBJECTS, len(ref.annotations.objects))
            elif digest:
                counters.inc(counters.rejected(CHANGED))
                yield beam.pvalue.TaggedOutput(REJECTED, Rejection(
                    ref.relpath, "rejected", CHANGED,
                    f"the dataset holds a record of this path with other bytes (SHA-256 {sorted(recorded)[0]}, now "
                    f"{digest}): it keeps that record; --if_exists=overwrite converts the folder again with the "
                    "new bytes"))
            else:  # not hashed here (too large, unreadable): the conversion judges it and says why
                yield ref


REJECTED = "rejected"


class SkipPresent(beam.PTransform):
    """ImageRef -> the ImageRefs not yet in the dataset ('images'); REJECTED: Rejection of each changed file;
    PRESENT: 1 per image already in the dataset (PRESENT_OBJECTS: a detection image's objects). `sources`:
    (relpath, (sha256, split, label)) from ReadSources."""

    def __init__(self, sources, max_file_bytes: int, throttled_s: float | None = None,
                 start_rate: float | None = None):
        super().__init__()
        self._sources = sources
        self._fn = _Judge(max_file_bytes, throttled_s, start_rate)

    def expand(self, refs):
        keyed = refs | "KeyByPath" >> beam.Map(lambda ref: (display_path(ref.relpath), ref))
        return (
            {"new": keyed, "old": self._sources}
            # (relpath, {"new": [ImageRef], "old": [(sha256, split, label)]})
            | "JoinByPath" >> beam.CoGroupByKey()
            | "Judge" >> beam.ParDo(self._fn).with_outputs(REJECTED, PRESENT, PRESENT_OBJECTS, main="images")
        )


def appended_shards(old_splits: dict, new_shards: list, compression: str, file_format: str, shard_names: str,
                    ) -> tuple[list, list]:
    """The shards of the grown dataset, and the renames of the old ones.

    `old_splits`: the dataset's description's splits; `new_shards`: this run's ShardInfo tuples (split, file,
    records, bytes, index or '', name in the run's folder or ''). Returns (ShardInfo tuples of every shard, old
    and new, with their final names: a new one's name in the run's folder last; [(old name, new name)] of the
    old shards and index files, whose names change when their split grows).
    """
    news: dict[str, list] = {}
    for shard in new_shards:
        news.setdefault(shard[0], []).append(shard)
    kaggle = shard_names == KAGGLE

    def final(split, index, count, records):
        if kaggle:
            return kaggle_name(split, index, count, records, compression, file_format)
        return shard_name(split, index, count, compression, file_format)

    shards, renames = [], []
    for split in sorted(set(old_splits) | set(news)):
        old = (old_splits.get(split) or {}).get("shards") or []
        new = sorted(news.get(split, []), key=lambda s: s[5] or s[1])
        total = len(old) + len(new)
        for index, entry in enumerate(old):
            name = final(split, index, total, entry["records"])
            renames.append((entry["file"], name))
            indexed = ""
            if entry.get("index"):
                indexed = index_name(name)
                renames.append((entry["index"], indexed))
            shards.append((split, name, entry["records"], entry["bytes"], indexed, entry["file"], "old"))
        for shard in new:
            split_, file, records, size, index, temp = (list(shard) + ["", ""])[:6]
            temp = temp or file
            number = int((SHARD_NAME.fullmatch(file) or KAGGLE_NAME.fullmatch(file)).group("index"))
            name = final(split, len(old) + number, total, records)
            shards.append((split, name, records, size, index_name(name) if index else "", temp, "new"))
    return shards, renames
