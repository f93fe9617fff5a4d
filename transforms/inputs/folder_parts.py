"""One large gs:// class folder listed in parts, on many workers at once.

Cloud Storage lists a folder one page (1,000 names) after the other, so a class folder of 50 million images
listed by one worker takes it an hour. The worker that gets a folder lists its first page; when more follow,
it cuts the names after that page into parts, [start, end) ranges of names that any worker lists with the
service's `startOffset` and `endOffset`:

1. the largest name's first characters are found by a binary search, one character at a time, with listings
   of one name (`maxResults=1`) from a given start: about 8 requests a character, a few dozen in all;
2. the names are read as numbers in the alphabet of the characters seen (the first page and the largest
   name), from their first difference on, and PROBES pages are read at evenly spaced numbers between the
   first page's last name and the largest: each tells how many names its stretch holds (exactly, when the
   page reaches the next stretch; else from the page's density);
3. that gives the number of parts (about PART_NAMES names each, at most MAX_PARTS), and their bounds, where
   the counted names are evenly split.

However uneven the names, the parts cover every name after the first page exactly once (their bounds only
increase): the estimate sets how well the work is balanced, never what is listed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from typing import NamedTuple

PART_NAMES = 50_000  # names a part aims at: about 50 pages, under a minute for one worker
MAX_PARTS = 2_000
WIDTH = 6  # characters after the first difference that set a bound: enough resolution for MAX_PARTS
MAX_CODE_POINT = 0x10FFFF
MAX_SEARCH_CHARS = 64  # characters of the largest name searched for, at most (8 requests each)


class FolderPart(NamedTuple):
    """Names of one gs:// folder (prefix) in [start, end): start inclusive, end exclusive ('' = to its end).
    `skip`: a name at the start that is already listed (the first page's last). `delimiter` '/': a level (the
    input folder, a split folder), listed a level deep: its files, and its subfolders as prefixes, each of which
    one part reports (`reports_subfolder`)."""

    bucket: str
    prefix: str
    start: str
    end: str
    skip: str = ""
    delimiter: str = ""


def _code_point(index: int) -> int:
    """The index-th Unicode scalar value: code points without the surrogates, which no name holds."""
    return index if index < 0xD800 else index + 0x800


TOP_INDEX = MAX_CODE_POINT - 0x800


def largest_name_start(names_from: Callable[[str, str, int], list[str]], prefix: str, lowest: str,
                       depth: int) -> str:
    """The first characters (after `prefix`) of the largest name below `prefix`, up to `depth` characters after
    its first difference from `lowest` (a name there, after `prefix`). `names_from(within, start, n)`: the first
    `n` names that start with `within` and are at least `start` (one listing request)."""
    known = ""
    while True:
        diverged = next((i for i, (a, b) in enumerate(zip(known, lowest, strict=False)) if a != b), None)
        if diverged is None and len(known) >= len(lowest):
            diverged = len(lowest)
        if diverged is not None and len(known) >= diverged + depth:
            return known
        within = prefix + known
        if not any(len(name) > len(within) for name in names_from(within, within, 2)):
            return known  # no longer name: `known` is the largest name itself
        # the largest character c at this place: a name >= within + c exists (ASCII first: one request decides)
        lo, hi = (0x7F, TOP_INDEX) if names_from(within, within + "\x7f", 1) else (0x01, 0x7E)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if names_from(within, within + chr(_code_point(mid)), 1):
                lo = mid
            else:
                hi = mid - 1
        known += chr(_code_point(lo))
        if len(known) >= MAX_SEARCH_CHARS:  # names alike for longer than that: one part does (see plan_parts)
            return known


def _alphabet(names: list[str], start: int) -> str:
    chars = {c for name in names for c in name[start:]}
    return "".join(sorted(chars))


def _number(name: str, start: int, alphabet: str, width: int) -> int:
    """`name`'s characters [start, start+width) as a number in base len(alphabet)+1 (0: no character; a
    character outside the alphabet counts as the largest one below it)."""
    base = len(alphabet) + 1
    value = 0
    for i in range(width):
        position = start + i
        digit = 0
        if position < len(name):
            c = name[position]
            index = alphabet.find(c)
            if index < 0:
                index = sum(1 for a in alphabet if a < c) - 1  # the largest character below it
            digit = index + 1
        value = value * base + digit
    return value


def _name_of(value: int, head: str, alphabet: str, width: int) -> str:
    """A name whose _number is about `value` (never below it): a 0 digit ("no character") inside becomes the
    smallest character, so that a bound never ends early."""
    base = len(alphabet) + 1
    digits = []
    for _ in range(width):
        value, digit = divmod(value, base)
        digits.append(digit)
    digits.reverse()
    while digits and digits[-1] == 0:  # trailing: the name simply ends there
        digits.pop()
    return head + "".join(alphabet[max(d, 1) - 1] for d in digits)


PROBES = 16  # pages read at evenly spaced names to learn how the names are spread
PAGE = 1000


def plan_parts(bucket: str, prefix: str, first_page: list[str], largest: str,
               names_from: Callable[[str, str, int], list[str]],
               part_names: int | None = None, max_parts: int | None = None) -> list[FolderPart]:
    """The parts of the names after `first_page` (its sorted full object names), up to `largest` (the first
    characters of the largest name, after `prefix`). `names_from` as for `largest_name_start`: PROBES pages,
    read at evenly spaced names, tell how many names each stretch holds (exactly, when a page reaches the next
    stretch), and the parts' bounds are put where the counted names are evenly split."""
    part_names, max_parts = part_names or PART_NAMES, max_parts or MAX_PARTS
    last = first_page[-1]
    _, bounds = _bounds(prefix, first_page, largest, names_from, part_names, max_parts, [MAX_RUNS])
    bounds = [bound for bound in bounds if bound > last]
    if len(bounds) >= max_parts:  # the runs' own bounds added to the level's: thinned to max_parts parts
        bounds = [bounds[i * len(bounds) // max_parts] for i in range(max_parts - 1)]
    ranges = zip([last, *bounds], [*bounds, ""], strict=True)
    return [FolderPart(bucket, prefix, start, end, last if start == last else "") for start, end in ranges]


SEPARATORS = "_-. "  # what ends a label at the start of a name (Abyssinian_1.jpg, cat.12.jpg, rose-7.png)
MAX_RUNS = 32  # runs of names alike that one level's plan estimates on their own, at most
RUN_RATIO = 64  # a page whose names span less than 1/RUN_RATIO of its stretch is read as a run
RUN_PROBES = 4  # pages read in a run (a label's names), and characters of its largest name searched for after
RUN_WIDTH = 3  # its first difference: a run is cut into a few parts, a level into up to MAX_PARTS


def _run_prefix(inside: list[str], head: int, prefix: str) -> str:
    """The first characters that a full page's names share, through the last separator among them (the label of
    names that start with their labels), or through the numbered characters; '' when that is no longer than what
    the stretch already shares (`head` characters) or the folder's `prefix`."""
    common = os.path.commonprefix([inside[0], inside[-1]])
    floor = max(head, len(prefix))
    cut = max(common.rfind(c) for c in SEPARATORS) + 1
    if cut > floor:
        return common[:cut]
    return common[:head + WIDTH] if len(common) > floor else ""


def _after(run: str) -> str:
    """The least name after every name that starts with `run`."""
    while run:
        code = ord(run[-1]) + 1
        code += 0x800 if code == 0xD800 else 0
        if code <= MAX_CODE_POINT:
            return run[:-1] + chr(code)
        run = run[:-1]
    return ""


def _bounds(prefix: str, first_page: list[str], largest: str, names_from: Callable[[str, str, int], list[str]],
            part_names: int, max_parts: int, runs: list[int] | None, probes: int = PROBES) -> tuple[float, list[str]]:
    """(the names estimated after `first_page` below `prefix`, sorted bounds that split them about evenly).

    A full probe page whose names span a sliver of its stretch (alike in the numbered characters, WIDTH after the
    first difference) says little of the stretch's size: a flat folder of names that start with their labels
    (Abyssinian_1.jpg, ..., cat.12.jpg) is runs of names alike for longer than that, with nothing between them.
    While `runs` (a budget, [count left], shared by a level's plan) lasts, such a run (the names that share the
    page's label, `_run_prefix`) is estimated on its own, as a folder of those names (`largest_name_start` and
    PROBES pages more), its bounds join the level's, and the stretch goes on after it with another page."""
    last = first_page[-1]
    top = max(prefix + largest, last)
    common = 0
    while common < min(len(last), len(top)) and last[common] == top[common]:
        common += 1
    alphabet = _alphabet([*first_page, top], common)
    low, high = _number(last, common, alphabet, WIDTH), _number(top, common, alphabet, WIDTH) + 1
    if not alphabet or high - low < 2:
        return 0.0, []
    head = last[:common]
    probes = min(probes, high - low)
    values = [low + (high - low) * j // probes for j in range(probes + 1)]
    starts = [last] + [_name_of(v, head, alphabet, WIDTH) for v in values[1:-1]]
    # names per stretch [values[j], values[j+1]): counted from a page read at its start
    counts, run_bounds = [], []
    spread = []  # the names of each stretch the level's own bounds split (a run's are split by its bounds)
    for j, start in enumerate(starts):
        following = starts[j + 1] if j + 1 < len(starts) else None
        count = spread_count = 0.0
        at, seen = start, last
        while True:
            page = [n for n in names_from(prefix, at, PAGE) if n > seen]
            inside = [n for n in page if following is None or n < following]
            if len(inside) < len(page) or len(page) < PAGE - 1:  # the page reached the next stretch, or the end
                count, spread_count = count + len(inside), spread_count + len(inside)
                break
            # a full page inside the stretch: its density (first name to last), over the rest of the stretch
            first_value = _number(inside[0], common, alphabet, WIDTH)
            span = _number(inside[-1], common, alphabet, WIDTH) - first_value
            width = values[j + 1] - first_value
            if (span < 2 or width > RUN_RATIO * span) and runs and runs[0] > 0:  # a sliver of its stretch
                runs[0] -= 1
                run = _run_prefix(inside, common, prefix)
                if not run:  # names alike for no label's length (a page across two runs): the stretch goes on
                    count, spread_count = count + len(inside), spread_count + len(inside)
                    at = seen = inside[-1]
                    continue
                # a run of names alike: estimated on its own
                run_largest = largest_name_start(names_from, run, inside[-1][len(run):], RUN_WIDTH)
                in_run, bounds = _bounds(run, inside, run_largest, names_from, part_names, max_parts, None,
                                         RUN_PROBES)
                count, spread_count = count + len(inside) + in_run, spread_count + len(inside)
                at = _after(run)
                run_bounds += [bound for bound in [*bounds, at] if bound and (following is None or bound < following)]
                if not at or (following is not None and at >= following):
                    break
                continue
            estimate = len(inside) * max(width, span, 1) / max(span, 1)
            count, spread_count = count + estimate, spread_count + estimate
            break
        counts.append(count)
        spread.append(spread_count)
    total = sum(spread)
    parts = max(1, min(max_parts, math.ceil(total / part_names)))
    bounds = []
    cumulative, j = 0.0, 0
    for i in range(1, parts):
        target = total * i / parts
        while j < len(spread) - 1 and cumulative + spread[j] < target:
            cumulative += spread[j]
            j += 1
        share = (target - cumulative) / spread[j] if spread[j] else 0.0
        value = values[j] + int((values[j + 1] - values[j]) * min(max(share, 0.0), 1.0))
        bound = _name_of(value, head, alphabet, WIDTH)
        if bound > last and (not bounds or bound > bounds[-1]):
            bounds.append(bound)
    return sum(counts), sorted(set(bounds) | set(run_bounds))


def reports_subfolder(part: FolderPart, subfolder: str, names_before: Callable[[str, str], bool]) -> bool:
    """Whether `part`, listed with the delimiter '/', is the one part that reports `subfolder`, a prefix its
    listing returned. GCS returns a subfolder in every part whose range holds one of its names, so a subfolder
    whose names straddle a bound comes back in two parts (or more); it belongs to the part that holds its first
    name. A subfolder at or after the part's start is the part's own; one before it (the part's start lies inside
    the subfolder's names: at most one such subfolder per part) is the part's when none of its names comes before
    the start, which `names_before(subfolder, start)` asks (one request of one name). The first pages' last name
    (`skip`) was reported with them."""
    if subfolder == part.skip:
        return False
    if subfolder >= part.start:
        return True
    return not names_before(subfolder, part.start)


def list_part(client, part: FolderPart) -> Iterator:
    """The blobs of one part, streamed page by page."""
    blobs = client.list_blobs(part.bucket, prefix=part.prefix, start_offset=part.start or None,
                              end_offset=part.end or None)
    for blob in blobs:
        if blob.name == part.skip:
            continue
        yield blob
