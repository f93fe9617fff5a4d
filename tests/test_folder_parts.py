"""A large gs:// class folder is listed in parts by many workers (transforms/inputs/folder_parts.py): every name once,
the parts about even, through the real GCS client against tests/fake_gcs_listing.py and through the graph."""

from __future__ import annotations

import bisect
import random
import string

import pytest

from tests.fake_gcs_listing import BUCKET, serve
from transforms.inputs import folder_parts as fp
from transforms.inputs import listing

PREFIX = "in/c/"


def _names_from(names):
    calls = []

    def names_from(within, start, count):
        calls.append(start)
        i, out = bisect.bisect_left(names, start), []
        while i < len(names) and len(out) < count and names[i].startswith(within):
            out.append(names[i])
            i += 1
        return out

    return names_from, calls


def _split(names, page=1000, part_names=2000):
    """(first page + every part's names in order, the parts' sizes, requests made) for sorted `names`."""
    names_from, calls = _names_from(names)
    first = names[:page]
    largest = fp.largest_name_start(names_from, PREFIX, first[-1][len(PREFIX):], fp.WIDTH)
    parts = fp.plan_parts("b", PREFIX, first, largest, names_from, part_names=part_names)
    listed, sizes = list(first), []
    for part in parts:
        lo = bisect.bisect_left(names, part.start)
        hi = bisect.bisect_left(names, part.end) if part.end else len(names)
        chunk = [n for n in names[lo:hi] if n != part.skip]
        sizes.append(len(chunk))
        listed += chunk
    return listed, sizes, len(calls)


RNG = random.Random(7)
PETS = ("Abyssinian", "Bengal", "Birman", "Bombay", "British_Shorthair", "Egyptian_Mau", "Maine_Coon", "Persian",
        "Ragdoll", "Russian_Blue", "Siamese", "Sphynx", "american_bulldog", "beagle", "boxer", "chihuahua", "havanese",
        "keeshond", "leonberger", "pug", "samoyed", "shiba_inu", "yorkshire_terrier")  # Oxford Pets' labels
KINDS = {
    "numbered": lambda i: f"img_{i:08d}.jpg",
    "hashes": lambda i: f"{RNG.getrandbits(64):016x}.jpg",
    "words": lambda i: "".join(RNG.choice(string.ascii_letters) for _ in range(RNG.randint(3, 12))) + f"_{i}.png",
    "unicode": lambda i: f"ph\u00f6to_{RNG.randint(0, 10 ** 9)}\u4e00{i}.jpg",
    "dates": lambda i: f"2024-{RNG.randint(1, 12):02d}-{RNG.randint(1, 28):02d}T{i}.jpg",
    # flat folders of names that start with their labels: runs alike past the numbered characters, nothing between
    "labels": lambda i: f"{('Abyssinian', 'american_bulldog', 'cat', 'yorkshire_terrier')[i % 4]}_{i}.jpg",
    "cats_dogs": lambda i: f"{('cat', 'dog')[i % 2]}.{i}.jpg",
    "pets": lambda i: f"{PETS[i % len(PETS)]}_{i // len(PETS) + 1}.jpg",
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_parts_cover_every_name_once_and_about_evenly(kind):
    names = sorted({PREFIX + KINDS[kind](i) for i in range(40_000)})
    listed, sizes, requests = _split(names)
    assert listed == names  # every name once, in order
    assert len(sizes) >= 8  # 39,000 names after the first page, at 2,000 a part: spread out
    assert max(sizes) <= 4 * 2000, sorted(sizes)[-5:]
    # the largest name's search and the probes (and each run's, of a flat folder of labelled names): a fixed cost,
    # whatever the folder's size, not a listing of it
    assert requests <= 800


@pytest.mark.parametrize("names", [
    [f"{i}.jpg" for i in range(1001)],  # one name after the first page
    ["a" * i for i in range(1, 1500)],  # every name extends the one before: found by its length alone
    [f"x{i:05d}" for i in range(2000)] + ["\U0010fffd"],  # the largest name far above the others
    [f"x{i:05d}" for i in range(2000)] + ["zz\ud7ffz"],  # just below the surrogates
    [f"x{i:05d}" for i in range(1000)] + ["x99999/", "x99999/a.jpg"],  # a folder placeholder at the end
    [f"a{i}.jpg" for i in range(1200)] + [f"b_{i}" for i in range(1200)],  # two runs, one page across them
])
def test_odd_names_are_all_listed(names):
    names = sorted(PREFIX + n for n in names)
    listed, sizes, requests = _split(names)
    assert listed == names
    assert requests <= 700


@pytest.mark.timeout(300)
def test_a_large_folder_is_listed_in_parts_through_the_gcs_client_and_the_graph(monkeypatch, tmp_path):
    """gs://b/in/ with 2 class folders of 9,000 images: the first page of each on the worker that got it, the rest
    in parts (startOffset/endOffset on the fake), every image found once by ListImages on the local runner."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from pipeline.cloud import skip_credential_lookup
    from tests.pipelines import TestPipeline
    from transforms.inputs.listing import ListImages

    monkeypatch.setattr(fp, "PART_NAMES", 1500)
    monkeypatch.setattr(listing, "SMALL_FOLDER_PAGES", 1)  # parts after the first page (10 by default)
    with serve(2, 9000) as server:
        for name, value in server.client_env(str(tmp_path)).items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
        skip_credential_lookup()
        expected = [f"class_{c:04d}/img_{i:08d}.jpg" for c in range(2) for i in range(9000)]
        with TestPipeline(options=beam.options.pipeline_options.PipelineOptions(
                ["--direct_running_mode=in_memory", "--direct_num_workers=1"])) as p:
            listed = p | ListImages(f"gs://{BUCKET}/in")
            assert_that(listed["images"] | beam.Map(lambda ref: ref.relpath), equal_to(expected))
        stats = server.stats()
        assert stats["unknown"] == []
        assert stats["objects_listed"] < 2 * 9000 + 2 * (fp.PROBES + 2) * 1000  # the parts, plus the probes' pages
    result = p.result
    parts = result.metrics().query(beam.metrics.MetricsFilter().with_name("folder_parts"))["counters"]
    assert sum(c.committed for c in parts) >= 2 * 4  # 8,000 names after each first page, at 1,500 a part


@pytest.mark.parametrize("per_class, requests", [(1300, 2), (10_000, 10)])
def test_a_medium_folder_is_listed_whole_in_its_pages(monkeypatch, tmp_path, per_class, requests):
    """ImageNet's class folders (1,300 names): 2 list requests each, no parts; up to SMALL_FOLDER_PAGES pages
    the same. (Issue 29: planning parts took 144 requests for 1,300 names.)"""
    from pipeline.cloud import skip_credential_lookup
    from transforms.inputs.listing import Folder, list_folder_or_parts

    with serve(1, per_class) as server:
        for name, value in server.client_env(str(tmp_path)).items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
        skip_credential_lookup()
        listed = list(list_folder_or_parts(Folder(f"gs://{BUCKET}/in/class_0000"), f"gs://{BUCKET}/in"))
        stats = server.stats()
    assert [entry.path for entry in listed] == [f"gs://{BUCKET}/in/class_0000/img_{i:08d}.jpg"
                                                for i in range(per_class)]
    assert stats["list_requests"] == requests and stats["unknown"] == []
