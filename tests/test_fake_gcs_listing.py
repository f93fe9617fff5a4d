"""tests/fake_gcs_listing.py answers the real google-cloud-storage client and Beam's gcsio as GCS would.

The launcher benchmark (benchmarks/launcher_listing.py) trusts this fake's paging
at millions of names; here it is checked on a small bucket, name by name.
"""

from __future__ import annotations

import io

import pytest
from PIL import Image

from tests.fake_gcs_listing import BUCKET, SyntheticBucket, serve

CLASSES, PER_CLASS = 7, 1234  # 8638 names: pages of 1000 end inside a class, and the last page is partial
EXPECTED = [f"in/class_{c:04d}/img_{i:08d}.jpg" for c in range(CLASSES) for i in range(PER_CLASS)]


@pytest.fixture
def fake(monkeypatch, tmp_path):
    with serve(CLASSES, PER_CLASS) as server:
        for name, value in server.client_env(str(tmp_path)).items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
        yield server
        assert server.stats()["unknown"] == []  # every request the clients made was one the fake knows


@pytest.fixture
def client(fake):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project="test-project", credentials=AnonymousCredentials())


@pytest.mark.timeout(60)
def test_listing_without_delimiter_pages_through_every_name_once_in_order(fake, client):
    names = [blob.name for blob in client.list_blobs(BUCKET, prefix="in/")]
    assert names == EXPECTED
    stats = fake.stats()
    assert stats["list_requests"] == 9  # ceil(8638 / 1000)
    assert stats["objects_listed"] == len(EXPECTED)


@pytest.mark.timeout(60)
def test_page_tokens_and_max_results(fake, client):
    sizes, names = [], []
    for page in client.list_blobs(BUCKET, prefix="in/class_0002/", page_size=500).pages:
        page_names = [blob.name for blob in page]
        sizes.append(len(page_names))
        names += page_names
    assert sizes == [500, 500, 234]
    assert names == EXPECTED[2 * PER_CLASS:3 * PER_CLASS]
    # A page token taken from one listing resumes it in a new one, at the same name.
    first = client.list_blobs(BUCKET, prefix="in/", page_size=1000)
    page = next(first.pages)
    assert [b.name for b in page] == EXPECTED[:1000]
    resumed = client.list_blobs(BUCKET, prefix="in/", page_size=3, page_token=first.next_page_token)
    assert [b.name for b in next(resumed.pages)] == EXPECTED[1000:1003]
    # More than GCS's maximum of 1000 per page gives 1000.
    big = client.list_blobs(BUCKET, prefix="in/", page_size=5000)
    assert len(list(next(big.pages))) == 1000


@pytest.mark.timeout(60)
def test_listing_with_delimiter_gives_the_class_folders_as_prefixes(fake, client):
    listing = client.list_blobs(BUCKET, prefix="in/", delimiter="/")
    assert list(listing) == []
    assert sorted(listing.prefixes) == [f"in/class_{c:04d}/" for c in range(CLASSES)]
    # One level up, and a small page size: prefixes are paged like objects.
    top = client.list_blobs(BUCKET, prefix="", delimiter="/")
    assert list(top) == [] and top.prefixes == {"in/"}
    paged = client.list_blobs(BUCKET, prefix="in/", delimiter="/", page_size=3)
    per_page = [len(page.prefixes) for page in paged.pages]
    assert per_page == [3, 3, 1]
    assert sorted(paged.prefixes) == [f"in/class_{c:04d}/" for c in range(CLASSES)]
    # Inside a class folder the delimiter leaves only objects.
    inside = client.list_blobs(BUCKET, prefix="in/class_0006/", delimiter="/")
    assert [b.name for b in inside] == EXPECTED[6 * PER_CLASS:]
    assert inside.prefixes == set()
    assert fake.stats()["prefixes_listed"] == CLASSES + 1 + CLASSES


@pytest.mark.timeout(60)
def test_prefixes_that_match_part_of_a_name_or_nothing(fake, client):
    assert [b.name for b in client.list_blobs(BUCKET, prefix="in/class_0003/img_0000001")] == \
        [f"in/class_0003/img_{i:08d}.jpg" for i in range(10, 20)]
    assert list(client.list_blobs(BUCKET, prefix="in/class_0007/")) == []  # one past the last class
    assert list(client.list_blobs(BUCKET, prefix="out/")) == []
    assert len(list(client.list_blobs(BUCKET, prefix="in/class_000"))) == len(EXPECTED)


@pytest.mark.timeout(60)
def test_objects_have_metadata_and_the_same_valid_jpeg(fake, client):
    bucket = client.lookup_bucket(BUCKET)
    assert bucket is not None and client.lookup_bucket("other") is None
    blob = bucket.get_blob("in/class_0004/img_00001233.jpg")
    data = blob.download_as_bytes()  # the client checks the bytes against the X-Goog-Hash header
    assert blob.size == len(data) == len(fake.jpeg)
    assert blob.md5_hash and blob.crc32c and blob.updated is not None and blob.generation
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        assert image.format == "JPEG" and image.size == (480, 360)
    assert blob.download_as_bytes(start=2, end=9) == data[2:10]
    assert bucket.get_blob("in/class_0004/img_00001234.jpg") is None  # one past the last image
    assert bucket.get_blob("in/class_0007/img_00000000.jpg") is None


@pytest.mark.timeout(60)
def test_beams_file_systems_match_and_read(fake):
    from apache_beam.io.filesystems import FileSystems

    from pipeline.cloud import skip_credential_lookup

    skip_credential_lookup()  # what --no_auth does: Beam's gcsio connects anonymously, to the fake
    matched = FileSystems.match(["gs://b/in/class_0001/*"])[0].metadata_list
    assert sorted(m.path for m in matched) == [f"gs://b/{name}" for name in EXPECTED[PER_CLASS:2 * PER_CLASS]]
    assert {m.size_in_bytes for m in matched} == {len(fake.jpeg)}
    everything = FileSystems.match(["gs://b/in/**"])[0].metadata_list
    assert len(everything) == len(EXPECTED)
    with FileSystems.open("gs://b/in/class_0000/img_00000000.jpg") as f:
        assert f.read() == fake.jpeg


def test_unknown_requests_are_a_loud_501(fake, client, capsys):
    from google.api_core.exceptions import GoogleAPICallError

    with pytest.raises(GoogleAPICallError):
        client.bucket(BUCKET).blob("in/new.jpg").upload_from_string(b"x")
    with pytest.raises(GoogleAPICallError):
        list(client.list_blobs(BUCKET, prefix="in/", match_glob="**/*.jpg"))
    unknown = fake.stats()["unknown"]
    assert len(unknown) == 2 and "matchGlob" in unknown[1]
    assert "fake_gcs_listing: 501" in capsys.readouterr().err
    fake.reset_stats()  # the fixture's check is for the requests the other tests make


def test_page_cost_does_not_depend_on_the_position():
    """A page is computed from its token: the last page of 10^10 names costs what the first does (no scan)."""
    bucket = SyntheticBucket(10_000, 1_000_000)
    calls = 0
    real_name = bucket.name

    def counting(j):
        nonlocal calls
        calls += 1
        return real_name(j)

    bucket.name = counting
    items, prefixes, following = bucket.page("in/", "", bucket.count - 1000, 1000)
    assert [real_name(j) for j in items][-1] == "in/class_9999/img_00999999.jpg" and following is None
    assert calls < 1000 + 200  # the page's names and two binary searches
    calls = 0
    _, prefixes, following = bucket.page("in/", "/", 0, 1000)
    assert len(prefixes) == 1000 and following == 1000 * 1_000_000
    assert calls < 1000 * 80  # one binary search per prefix


def test_names_are_in_index_order_and_map_back_to_their_index():
    """Index order must be name order (GCS lists in name order), also for split names that prefix each other."""
    for bucket in (SyntheticBucket(3, 4), SyntheticBucket(2, 3, splits=("validation", "a-b", "a", "train"))):
        names = [bucket.name(j) for j in range(bucket.count)]
        assert names == sorted(names) and len(set(names)) == bucket.count
        assert [bucket.index(name) for name in names] == list(range(bucket.count))
        assert bucket.index(names[-1].replace(".jpg", ".png")) is None
    assert SyntheticBucket(2, 3, splits=("a",)).index("in/class_0000/img_00000000.jpg") is None


@pytest.mark.timeout(60)
def test_split_folders_list_at_two_levels(monkeypatch, tmp_path):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    with serve(3, 5, splits=("validation", "train")) as server:
        for name, value in server.client_env(str(tmp_path)).items():
            monkeypatch.setenv(name, value)
        client = storage.Client(project="test-project", credentials=AnonymousCredentials())
        top = client.list_blobs(BUCKET, prefix="in/", delimiter="/")
        assert list(top) == [] and sorted(top.prefixes) == ["in/train/", "in/validation/"]
        classes = client.list_blobs(BUCKET, prefix="in/validation/", delimiter="/")
        assert list(classes) == [] and sorted(classes.prefixes) == [f"in/validation/class_{c:04d}/" for c in range(3)]
        names = [b.name for b in client.list_blobs(BUCKET, prefix="in/")]
        assert len(names) == 2 * 3 * 5 and names == sorted(names)
        assert names[0] == "in/train/class_0000/img_00000000.jpg"
        assert client.bucket(BUCKET).get_blob("in/validation/class_0002/img_00000004.jpg").size == len(server.jpeg)
        assert server.stats()["unknown"] == []


def test_extra_objects_are_listed_among_the_computed_names_as_gcs_would():
    """`extras` (a COCO file beside its images) merge into the computed names in name order: every listing
    (prefix, delimiter, startOffset, endOffset, any page size) gives what GCS gives for the same names, paged by
    name tokens; the extras are described and downloaded with their own bytes."""
    import random

    extras = {"in/train/_annotations.coco.json": b"{}", "in/annotations/instances_train.json": b"[]",
              "in/train/zz/a.txt": b"", "in/readme": b"r", "out/x": b""}
    bucket = SyntheticBucket(3, 7, splits=("train",), flat=True, folder_classes=(1,), extras=extras)
    names = sorted([bucket.name(j) for j in range(bucket.count)] + list(extras))

    def as_gcs(prefix, delimiter, start, end):
        files, prefixes = [], []
        for name in names:
            if not name.startswith(prefix) or (start and name < start) or (end and name >= end):
                continue
            cut = name.find(delimiter, len(prefix)) if delimiter else -1
            if cut < 0:
                files.append(name)
            elif name[:cut + 1] not in prefixes:
                prefixes.append(name[:cut + 1])
        return files, prefixes

    rng = random.Random(7)
    for _ in range(200):
        prefix = rng.choice(["", "in/", "in/train/", "in/train/class_0001/", "in/a"])
        delimiter = rng.choice(["", "/"])
        start, end = rng.choice(["", *names]), rng.choice(["", *names])
        page_size = rng.randint(1, 6)
        files, prefixes, token = [], [], ""
        while token is not None:
            page_files, page_prefixes, token = bucket.merged_page(prefix, delimiter, token, page_size, start, end)
            assert len(page_files) + len(page_prefixes) <= page_size
            files, prefixes = files + page_files, prefixes + page_prefixes
        assert (files, prefixes) == as_gcs(prefix, delimiter, start, end), (prefix, delimiter, start, end)
    assert bucket.data("in/train/_annotations.coco.json", b"jpeg") == b"{}"
    assert bucket.data(bucket.name(0), b"jpeg") == b"jpeg" and bucket.data("in/train/nothing.jpg", b"jpeg") is None
    with pytest.raises(ValueError, match="name of a computed one"):
        SyntheticBucket(1, 2, extras={"in/class_0000/img_00000000.jpg": b""})
