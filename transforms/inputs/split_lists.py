"""JoinSplitLists: each class-folder image's split from the dataset's own split lists (--split_lists), joined in
the job.

Food-101 ships `meta/train.txt` and `meta/test.txt`, one image a line as `apple_pie/1005649` (its path below
`images/` without the extension); other datasets list bare file names, with or without extensions. Each list is
read in parallel byte ranges as plain lines (transforms.inputs.rows.ReadRows, format LINES: every line keeps its
number), each line is keyed by the name it gives, each listed file by the same kind of name (`MatchRule`), and the
two meet in a CoGroupByKey: neither the launcher nor one worker ever holds a list or the listing.

How a line names a file (`MatchRule`, decided by the launcher from the lists' first lines, the same for every
list): a path relative to --input_dir when a line has a '/' (`apple_pie/1005649`), else a bare file name, which
then must be unique among the files found; with the extension when every line looked at ends in an image
extension, else without it (a line's image extension, if it has one, is then dropped too). Blank lines, spaces
around a line, a trailing '\\r' and a UTF-8 BOM are ignored; a './' or the --input_dir prefix is dropped.

Every line and every file is accounted for: a file named by one list, or by lines of one list only, goes on with
that split (a second line of the same list is counted in STATS as repeated_lines); a file no list names is skipped
as `not_in_split_lists`; a file named in two lists is rejected as `listed_in_two_splits` (written in neither); a
bare name that two files found have is rejected for each of them as `listed_name_ambiguous`; a name no file
found has is one `listed_image_missing` entry (all its lines named in the detail), counted in FOUND as a
manifest's row is, so that found = written + rejected + skipped still holds.
"""

from __future__ import annotations

import posixpath
from typing import NamedTuple

import apache_beam as beam

from transforms.base import counters
from transforms.base.dataset_format import SPLITS
from transforms.base.paths import IMAGE_EXTENSIONS, name_bytes, quoted_name
from transforms.base.records import FileRef, ListedFile, Rejection
from transforms.inputs.metadata import key_of
from transforms.inputs.rows import LINES, ROWS, ReadRows, RowFields, SummariseRows

REJECTED = "rejected"
FOUND = "found"
STATS = "stats"

LISTED_IMAGE_MISSING = "listed_image_missing"  # a line names no file found (stage rejected, counted as found)
NOT_IN_SPLIT_LISTS = "not_in_split_lists"  # a file found that no list names (stage skipped)
LISTED_IN_TWO_SPLITS = "listed_in_two_splits"  # a file two lists name: written in neither (stage rejected)
LISTED_NAME_AMBIGUOUS = "listed_name_ambiguous"  # a listed bare name that several files found have (rejected)
LIST_LINE_UNREADABLE = "list_line_unreadable"  # a line over rows.MAX_LINE_BYTES (stage rejected, as found)
REPEATED_LINES = "repeated_lines"  # STATS: a line that names a file an earlier line of the same list names
SHOWN_LINES = 3  # the lines a detail names, then how many more


class MatchRule(NamedTuple):
    """How the lines of the split lists name the files found."""

    by_name: bool  # bare file names (else paths relative to --input_dir)
    with_extensions: bool  # the names carry the file's extension (else it is dropped from both sides)

    def describe(self) -> str:
        """e.g. 'relative paths without extensions', as image_tfrecords.json and the summary say it."""
        what = "bare file names" if self.by_name else "paths relative to --input_dir"
        return f"{what} {'with' if self.with_extensions else 'without'} extensions"


def has_image_extension(name: str) -> bool:
    return posixpath.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def without_image_extension(name: str) -> str:
    """`name` without its image extension (any case), if it has one; else as it is."""
    stem, ext = posixpath.splitext(name)
    return stem if ext.lower() in IMAGE_EXTENSIONS and stem and not stem.endswith("/") else name


def line_name(text: str, input_dir: str) -> str:
    """The name a list line gives, as the listing spells a relative path: spaces around it, './' and the
    --input_dir prefix dropped (`transforms.inputs.metadata.key_of`); '' for a blank line."""
    text = text.strip()
    return key_of(text, input_dir) if text else ""


def rule_of(names: list[str]) -> MatchRule:
    """The MatchRule of the lines looked at (`line_name`s, none blank): paths when one of them has a '/', else
    bare names; with extensions when every one ends in an image extension."""
    return MatchRule(by_name=not any("/" in name for name in names),
                     with_extensions=bool(names) and all(has_image_extension(name) for name in names))


def name_key(name: str, rule: MatchRule) -> bytes:
    """The join key of a list line's name (`line_name`): bytes, as the file system holds the name (a name that is
    not UTF-8 keeps its bytes)."""
    return name_bytes(name if rule.with_extensions else without_image_extension(name))


def file_key(relpath: str, rule: MatchRule) -> bytes:
    """The join key of a file found: its path below --input_dir, or with `rule.by_name` its file name."""
    return name_key(relpath.rsplit("/", 1)[-1] if rule.by_name else relpath, rule)


class ListedLine(NamedTuple):
    """A line of a split list that names a file."""

    split: str
    line: int  # 1 = the list's first line
    name: str  # the line's name (`line_name`)


def _keyed_line(item: RowFields, split: str, rule: MatchRule, input_dir: str):
    """RowFields of a list line -> (key, ListedLine); a blank line: STATS ('blank_<split>', 1, ''); a line too long
    to hold: REJECTED, and FOUND 1 (an entry of the input that no file stands for)."""
    if isinstance(item.fields, str):  # rows.LONG_LINE: read through, not held
        counters.inc("split_list_lines_unreadable")
        yield beam.pvalue.TaggedOutput(REJECTED, Rejection(
            f"{split} list line {item.row}", "rejected", LIST_LINE_UNREADABLE, f"{split} list line {item.row}: "
            f"{item.fields}"))
        yield beam.pvalue.TaggedOutput(FOUND, 1)
        return
    name = line_name(item.fields["line"], input_dir)
    if not name:
        yield beam.pvalue.TaggedOutput(STATS, (f"blank_{split}", 1, ""))
        return
    yield name_key(name, rule), ListedLine(split, item.row, name)


def _where(line: ListedLine, lists: dict[str, str]) -> str:
    return f"line {line.line} of the {line.split} list {lists[line.split]}"


def _wheres(lines: list[ListedLine], lists: dict[str, str]) -> str:
    shown = ", ".join(_where(line, lists) for line in lines[:SHOWN_LINES])
    return shown + (f" and {len(lines) - SHOWN_LINES} more" if len(lines) > SHOWN_LINES else "")


def _order(line: ListedLine) -> tuple:
    return SPLITS.index(line.split), line.line


class _Match(beam.DoFn):
    """(key, {'files': [FileRef], 'lines': [ListedLine]}) -> ListedFile of a file one list names; REJECTED:
    Rejection of a file that is not (not listed, in two lists, an ambiguous name) and of a name no file has;
    FOUND: 1 for each such name; STATS: (REPEATED_LINES, line, detail) of each line that repeats a name of its
    list."""

    def __init__(self, lists: dict[str, str], rule: MatchRule):
        self._lists, self._rule = lists, rule

    def process(self, item):
        _, grouped = item
        files = sorted(grouped["files"], key=lambda ref: name_bytes(ref.relpath))
        lines = sorted(grouped["lines"], key=_order)
        if not lines:
            for ref in files:
                yield self._not_listed(ref)
            return
        if not files:
            yield from self._missing(lines)
            return
        if len(files) > 1:  # a bare name (or a name without its extension) that several files have
            names = ", ".join(quoted_name(ref.relpath) for ref in files[:SHOWN_LINES])
            for ref in files:
                counters.inc("split_list_files_ambiguous")
                yield beam.pvalue.TaggedOutput(REJECTED, Rejection(
                    ref.relpath, "rejected", LISTED_NAME_AMBIGUOUS,
                    f"{_wheres(lines, self._lists)} names {quoted_name(lines[0].name)}, which {len(files)} files "
                    f"found have ({names}{', ...' if len(files) > SHOWN_LINES else ''}), so it is written in no "
                    "split: list the images by their paths below --input_dir (class/name), or rename the files"))
            return
        ref = files[0]
        splits = sorted({line.split for line in lines}, key=SPLITS.index)
        if len(splits) > 1:
            counters.inc("split_list_files_in_two_splits")
            yield beam.pvalue.TaggedOutput(REJECTED, Rejection(
                ref.relpath, "rejected", LISTED_IN_TWO_SPLITS,
                f"listed in {' and '.join(splits)} ({_wheres(lines, self._lists)}), so it is written in neither "
                "(an image in two splits leaks between them): keep it in one list"))
            return
        for line in lines[1:]:
            yield beam.pvalue.TaggedOutput(STATS, (REPEATED_LINES, line.line, (
                f"{_where(line, self._lists)} names {ref.relpath!r} again (first in line {lines[0].line}); "
                "it is written once")))
        yield ListedFile(ref, splits[0])

    def _not_listed(self, ref: FileRef):
        counters.inc("split_list_files_not_listed")
        return beam.pvalue.TaggedOutput(REJECTED, Rejection(
            ref.relpath, "skipped", NOT_IN_SPLIT_LISTS,
            f"no line of --split_lists ({', '.join(self._lists.values())}) names it, as "
            f"{self._rule.describe()}: add it to a list to convert it"))

    def _missing(self, lines: list[ListedLine]):
        counters.inc("split_list_names_missing")
        name = lines[0].name
        hint = ""
        if self._rule.by_name and "/" in name:
            hint = (" (the lists name images by bare file name, decided from their first lines, and this line has "
                    "a '/')")
        elif not self._rule.by_name and "/" not in name:
            hint = (" (the lists name images by their path below --input_dir, class/name, decided from their first "
                    "lines, and this line has no '/')")
        yield beam.pvalue.TaggedOutput(REJECTED, Rejection(
            name, "rejected", LISTED_IMAGE_MISSING,
            f"{_wheres(lines, self._lists)} names {quoted_name(name)}, and no image found below --input_dir has "
            f"that name ({self._rule.describe()}){hint}: add the image, or remove the line"))
        yield beam.pvalue.TaggedOutput(FOUND, 1)


class SummariseSplitLists(SummariseRows):
    """Events of the lists -> what image_tfrecords.json's "split_lists" says: the lists, the rule, each list's
    lines (not blank) and blank lines, and the lines that repeat a name of their list, with the first few."""

    def __init__(self, lists: dict[str, str], rule: MatchRule):
        totals = tuple(f"{kind}_{split}" for split in lists for kind in ("rows", "blank"))
        super().__init__((REPEATED_LINES,), totals)
        self._lists, self._rule = lists, rule

    def extract_output(self, acc):
        found = super().extract_output(acc)
        return {
            "lists": dict(self._lists),
            "match": self._rule.describe(),
            "lines": {split: found[f"rows_{split}"] - found[f"blank_{split}"] for split in self._lists},
            "blank_lines": sum(found[f"blank_{split}"] for split in self._lists),
            REPEATED_LINES: found[REPEATED_LINES],
            "examples": found["examples"],
        }


class JoinSplitLists(beam.PTransform):
    """FileRef -> ListedFile of every file one list names ('files'); REJECTED: Rejection of every other file, of
    every name no file has and of every line too long to read; FOUND: 1 for each such name or line; STATS: one
    dict (SummariseSplitLists).

    `lists`: (split, path) of each list; `rule`: how their lines name files (decided by the launcher)."""

    def __init__(self, lists: tuple, rule: MatchRule, input_dir: str, range_bytes: int = 0):
        super().__init__()
        self._lists = {split: path for split, path in sorted(lists, key=lambda pair: SPLITS.index(pair[0]))}
        self._rule, self._input_dir = rule, input_dir
        self._range_bytes = range_bytes  # 0: transforms.inputs.rows.RANGE_BYTES (tests cut small files finely)

    def expand(self, files):
        rule, p = self._rule, files.pipeline
        listed, rejected, found, events = [], [], [], []
        for split, path in self._lists.items():
            step = split.capitalize()
            # RowFields of every line, read in parallel byte ranges, each with its line number
            read = p | f"Read{step}List" >> ReadRows(path, LINES, self._range_bytes)
            # (key, ListedLine)
            keyed = read.fields | f"Key{step}Lines" >> beam.FlatMap(
                _keyed_line, split, rule, self._input_dir).with_outputs(STATS, REJECTED, FOUND, main="lines")
            listed.append(keyed.lines)
            rejected.append(keyed[REJECTED])
            found.append(keyed[FOUND])
            # (kind, number, detail) events: the list's lines (per range), its blank lines
            events += [keyed[STATS],
                       read[ROWS] | f"Count{step}Lines" >> beam.Map(lambda n, s=split: (f"rows_{s}", n, ""))]
        lines = listed | "AllListedLines" >> beam.Flatten()
        # (key, FileRef)
        keyed_files = files | "KeyFiles" >> beam.Map(lambda ref: (file_key(ref.relpath, rule), ref))
        joined = ({"files": keyed_files, "lines": lines}
                  # (key, {'files': [FileRef], 'lines': [ListedLine]})
                  | "GroupByListedName" >> beam.CoGroupByKey()
                  | "Match" >> beam.ParDo(_Match(self._lists, rule)).with_outputs(REJECTED, FOUND, STATS,
                                                                                   main="files"))
        stats = ((*events, joined[STATS]) | "SplitListEvents" >> beam.Flatten()
                 | "SummariseSplitLists" >> beam.CombineGlobally(SummariseSplitLists(self._lists, rule)))
        return {"files": joined.files,
                REJECTED: (*rejected, joined[REJECTED]) | "ListRejections" >> beam.Flatten(),
                FOUND: (*found, joined[FOUND]) | "ListedNotFound" >> beam.Flatten(),
                STATS: stats}
