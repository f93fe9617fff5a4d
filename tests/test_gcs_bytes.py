"""The bytes a gs:// conversion moves to and from GCS, measured on the emulator through a counting proxy.

Issue 16's done-criterion: bytes uploaded to the output are about the
dataset's size, and bytes read back from the output are near zero. The proxy
(tests/fault_proxy.py) counts, per object, the object bytes in upload request
bodies and in media download response bodies, and the requests by kind. The
first tests check that counting against google-cloud-storage's own calls.

Before issue 16's write path, the job uploaded pieces, read them back to index
their records and copied every byte into the shards: on the 300-image run
below that was 2.00x total_bytes uploaded and 3.3x read back. Now each shard
is uploaded once and nothing but the metadata files is read back.
"""

from __future__ import annotations

import io
import json
import os
from collections import Counter
from dataclasses import dataclass

import pytest
from google.cloud.storage.fileio import BlobReader, BlobWriter

from pipeline.estimate import ENCODE_SAMPLE, SIZE_SAMPLE
from tests.conftest import FAST
from tests.fault_proxy import COMPOSE, COPY, DELETE, DOWNLOAD, LIST, METADATA, REWRITE, UPLOAD, FaultProxy, Traffic
from tests.gcs_fixtures import NO_AUTH
from transforms.base.dataset_format import DESCRIPTION_FILES, LOCK_FILE, SHARD_NAME

BUCKET = "bytes-e2e"
CHUNK = 256 * 1024  # google-cloud-storage's smallest resumable chunk


@pytest.fixture(scope="module")
def bucket(gcs_emulator):
    return gcs_emulator.create_bucket(BUCKET)


@pytest.fixture
def proxy(gcs_emulator, monkeypatch):
    """The counting proxy, with this process's new GCS clients pointed at it."""
    with FaultProxy(gcs_emulator.host) as running:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", running.url)
        yield running


def _blob(gcs_emulator, name: str):
    return gcs_emulator.client().bucket(BUCKET).blob(name)


# -- the counting itself, against google-cloud-storage's calls ------------------------------------------------------


@pytest.mark.timeout(60)
def test_simple_and_multipart_uploads_count_the_object_bytes_only(gcs_emulator, bucket, proxy):
    data = os.urandom(10_000)
    _blob(gcs_emulator, "unit/multipart.bin").upload_from_string(data)  # small: one multipart request
    _blob(gcs_emulator, "unit/empty.bin").upload_from_string(b"")

    traffic = proxy.reset_traffic()
    assert traffic.uploaded["unit/multipart.bin"] == 10_000  # not the JSON metadata part, not the boundaries
    assert traffic.uploaded["unit/empty.bin"] == 0
    assert traffic.calls[(UPLOAD, "unit/multipart.bin")] == 1
    assert sum(traffic.downloaded.values()) == 0
    assert gcs_emulator.read(f"{bucket}/unit/multipart.bin") == data  # and the proxy passed it on intact


@pytest.mark.timeout(60)
def test_resumable_uploads_count_every_chunk_once(gcs_emulator, bucket, proxy):
    data = os.urandom(3 * CHUNK + 1234)
    # As Beam's GCS writer does: a BlobWriter, which uploads in resumable chunks (PUTs of one session).
    with BlobWriter(_blob(gcs_emulator, "unit/resumable.bin"), chunk_size=CHUNK) as writer:
        for start in range(0, len(data), 100_000):
            writer.write(data[start:start + 100_000])
    # and upload_from_file of a stream of unknown size, with a chunk size: a resumable upload too
    small = os.urandom(CHUNK + 7)
    blob = _blob(gcs_emulator, "unit/resumable-2.bin")
    blob.chunk_size = CHUNK
    blob.upload_from_file(io.BytesIO(small))

    traffic = proxy.reset_traffic()
    assert traffic.uploaded["unit/resumable.bin"] == len(data)
    assert traffic.uploaded["unit/resumable-2.bin"] == len(small)
    # a session is opened (POST), then 4 and 2 chunks are PUT
    assert traffic.calls[(UPLOAD, "unit/resumable.bin")] == 1 + 4
    assert traffic.calls[(UPLOAD, "unit/resumable-2.bin")] == 1 + 2, traffic.report()
    assert "" not in traffic.uploaded  # every chunk was attributed to its object
    assert sum(traffic.downloaded.values()) == 0
    assert gcs_emulator.read(f"{bucket}/unit/resumable.bin") == data


@pytest.mark.timeout(60)
def test_downloads_count_the_bytes_received_whole_or_ranged(gcs_emulator, bucket, proxy, monkeypatch):
    data = os.urandom(100_000)
    # Uploaded past the proxy: the emulator keeps the host of the upload in the object's mediaLink, which the
    # proxy must rewrite for a BlobReader's reads to pass through it.
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.host)
    gcs_emulator.write(f"{bucket}/unit/read.bin", data)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    assert sum(proxy.reset_traffic().calls.values()) == 0

    blob = _blob(gcs_emulator, "unit/read.bin")
    assert blob.download_as_bytes() == data
    assert blob.download_as_bytes(start=1000, end=1999) == data[1000:2000]  # a ranged GET: 1,000 bytes
    traffic = proxy.reset_traffic()
    assert traffic.downloaded["unit/read.bin"] == 100_000 + 1000
    assert traffic.calls[(DOWNLOAD, "unit/read.bin")] == 2
    assert sum(traffic.uploaded.values()) == 0

    # As Beam's GCS reader does: a BlobReader, which reads in ranged chunks after a metadata GET.
    blob = _blob(gcs_emulator, "unit/read.bin")
    blob.reload()
    with BlobReader(blob, chunk_size=30_000) as reader:
        assert reader.read(10) == data[:10]
    traffic = proxy.reset_traffic()
    # the chunk it fetched, not the 10 bytes it returned: it asks for "bytes=0-30000" (the end is inclusive)
    assert traffic.downloaded["unit/read.bin"] == 30_001, traffic.report()
    assert traffic.calls[(METADATA, "unit/read.bin")] == 1 and traffic.calls[(DOWNLOAD, "unit/read.bin")] == 1


@pytest.mark.timeout(60)
def test_server_side_operations_are_calls_not_bytes(gcs_emulator, bucket, proxy):
    client = gcs_emulator.client()
    store = client.bucket(BUCKET)
    for part in ("a", "b"):
        gcs_emulator.write(f"{bucket}/unit/part-{part}", part.encode() * 50_000)
    proxy.reset_traffic()

    store.blob("unit/composed").compose([store.blob("unit/part-a"), store.blob("unit/part-b")])
    store.blob("unit/rewritten").rewrite(store.blob("unit/composed"))
    store.copy_blob(store.blob("unit/composed"), store, "unit/copied")
    assert [b.name for b in client.list_blobs(BUCKET, prefix="unit/part-")] == ["unit/part-a", "unit/part-b"]
    with client.batch():  # as Beam's delete_batch does: one /batch request of several deletes
        store.delete_blob("unit/part-a")
        store.delete_blob("unit/part-b")
    store.delete_blob("unit/copied")

    traffic = proxy.reset_traffic()
    assert sum(traffic.uploaded.values()) == sum(traffic.downloaded.values()) == 0
    assert traffic.calls[(COMPOSE, "unit/composed")] == 1
    assert traffic.calls[(REWRITE, "unit/rewritten")] == 1
    assert traffic.calls[(COPY, "unit/copied")] == 1
    assert traffic.calls[(LIST, "unit/part-")] == 1
    assert {name: n for (kind, name), n in traffic.calls.items() if kind == DELETE} == {
        "unit/part-a": 1, "unit/part-b": 1, "unit/copied": 1}
    assert gcs_emulator.read(f"{bucket}/unit/rewritten") == b"a" * 50_000 + b"b" * 50_000


# -- a gs:// conversion, measured ----------------------------------------------------------------------------------

INPUT, OUTPUT = "photos", "out"  # prefixes in the bucket
SHARDS = "--num_shards=train=4,validation=2"


@dataclass
class Measured:
    traffic: Traffic  # the whole run: launcher and job
    launcher: Traffic  # the launcher's sample of the input (images converted to size the shards, headers read)
    samples: Counter  # the launcher's sampling calls: estimate.measure_output, estimate.sample_sizes -> calls
    info: dict  # image_tfrecords.json
    inputs: dict[str, int]  # input object name -> size
    outputs: dict[str, int]  # object name left below the output prefix -> size


@pytest.fixture(scope="module")
def measured(gcs_emulator, bucket, tmp_path_factory):
    """A few hundred small images converted gs:// to gs:// through the counting proxy, once."""
    from pipeline import estimate
    from pipeline.launcher import run
    from pipeline.sample_data import generate_dataset

    root = tmp_path_factory.mktemp("bytes-tree")
    names = generate_dataset(str(root), images_per_class=75, classes=("cat", "dog", "fox", "owl"), seed=16,
                             min_side=32, max_side=64)
    assert gcs_emulator.upload_tree(root, f"{bucket}/{INPUT}") == len(names) == 300
    inputs = {f"{INPUT}/{name}": (root / name).stat().st_size for name in names}

    launcher, samples = Traffic(), Counter()
    with FaultProxy(gcs_emulator.host) as proxy, pytest.MonkeyPatch.context() as patch:
        patch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        for sampler in ("measure_output", "sample_sizes"):  # what the launcher reads of the input, apart

            def sampled(*args, _real=getattr(estimate, sampler), _name=sampler, **kwargs):
                samples[_name] += 1
                before = proxy.snapshot()
                try:
                    return _real(*args, **kwargs)
                finally:
                    after = proxy.snapshot()
                    launcher.downloaded.update(after.downloaded - before.downloaded)
                    launcher.calls.update(after.calls - before.calls)

            patch.setattr(estimate, sampler, sampled)
        # As a user runs it (not --quiet: the launcher also samples image headers for its advice).
        assert run([f"--input_dir={bucket}/{INPUT}", f"--output_dir={bucket}/{OUTPUT}", NO_AUTH, SHARDS,
                    *FAST]) == 0
        traffic = proxy.reset_traffic()
    outputs = {blob.name: blob.size for blob in gcs_emulator.client().list_blobs(BUCKET, prefix=f"{OUTPUT}/")}
    info = json.loads(gcs_emulator.read(f"{bucket}/{OUTPUT}/image_tfrecords.json"))
    assert info["files"]["written"] == 300
    return Measured(traffic, launcher, samples, info, inputs, outputs)


def _metadata(m: Measured) -> dict[str, int]:
    """The run's files other than shards, and their sizes: the description files as the run left them, and
    the lock (which the run removes at its end) as it was uploaded."""
    sizes = {f"{OUTPUT}/{name}": m.outputs[f"{OUTPUT}/{name}"] for name in DESCRIPTION_FILES
             if f"{OUTPUT}/{name}" in m.outputs}  # one schema's TFDS labels file of the two
    sizes[f"{OUTPUT}/{LOCK_FILE}"] = m.traffic.uploaded[f"{OUTPUT}/{LOCK_FILE}"]
    return sizes


def _shards(m: Measured) -> dict[str, int]:
    shards = {f"{OUTPUT}/{shard['file']}": shard["bytes"] for split in m.info["splits"].values()
              for shard in split["shards"]}
    assert len(shards) == 6 and all(SHARD_NAME.fullmatch(name.split("/")[-1]) for name in shards)
    assert sum(shards.values()) == m.info["total_bytes"]
    return shards


def _per_object(counts, traffic: Traffic, kind: str) -> str:
    return "\n".join(f"  {name}: {n} B in {traffic.calls[(kind, name)]} request(s)"
                      for name, n in sorted(counts.items()) if n)


@pytest.mark.timeout(120)
def test_each_input_image_is_downloaded_once_by_the_job(measured):
    """The input side: the job reads every image once, in full; the launcher reads a bounded sample besides."""
    inputs, traffic, launcher = measured.inputs, measured.traffic, measured.launcher
    read = Counter({name: n for name, n in traffic.downloaded.items() if name.startswith(f"{INPUT}/")})
    assert set(read) == set(inputs)

    # The launcher's sample: each estimate.measure_output converts up to ENCODE_SAMPLE images (it runs twice
    # when the images are smaller than --image_size: for the shard plan, and at the suggested size for the
    # notice), estimate.sample_sizes reads up to SIZE_SAMPLE headers; each read is at most the whole file.
    samples = measured.samples
    assert samples["measure_output"] in (1, 2) and samples["sample_sizes"] == 1, samples
    most = samples["measure_output"] * ENCODE_SAMPLE + samples["sample_sizes"] * SIZE_SAMPLE
    assert set(launcher.downloaded) <= set(inputs)
    assert 0 < launcher.calls_of(DOWNLOAD, f"{INPUT}/") <= most
    for name, n in launcher.downloaded.items():
        assert n <= launcher.calls[(DOWNLOAD, name)] * inputs[name], name

    # The job: every image exactly once, in full (no retried or repeated reads).
    by_job = read - launcher.downloaded
    assert by_job == Counter(inputs), "\n".join(
        f"  {name}: {by_job[name]} B read for a file of {size} B" for name, size in sorted(inputs.items())
        if by_job[name] != size)
    print(f"\ninput: {sum(inputs.values())} B in {len(inputs)} images; downloaded {sum(read.values())} B, of which "
          f"the launcher's sample {sum(launcher.downloaded.values())} B in "
          f"{launcher.calls_of(DOWNLOAD, f'{INPUT}/')} requests")


@pytest.mark.timeout(120)
def test_the_counts_see_every_output_byte_arrive_and_no_server_side_copy_as_a_download(measured):
    """The measurement itself: each output byte reached GCS through an upload the proxy counted, and a
    compose, rewrite or copy (which moves the bytes inside GCS) is never counted as bytes downloaded."""
    traffic = measured.traffic
    shards, metadata = _shards(measured), _metadata(measured)
    assert traffic.uploaded_under(f"{OUTPUT}/") >= measured.info["total_bytes"]
    server_side = (COMPOSE, REWRITE, COPY)
    for name, size in {**shards, **metadata}.items():
        if name == f"{OUTPUT}/{LOCK_FILE}":
            continue  # removed at the end of the run
        assert measured.outputs[name] == size, name
        # uploaded under its own name, or put together inside GCS from objects that were
        assert traffic.uploaded[name] >= size or any(traffic.calls[(kind, name)] for kind in server_side), name
    for (kind, name), _ in traffic.calls.items():
        if kind in server_side and not traffic.calls[(DOWNLOAD, name)]:
            assert traffic.downloaded[name] == 0, name
    for name in shards:
        assert traffic.downloaded[name] == 0, traffic.report(name)
    print(f"\noutput: total_bytes {measured.info['total_bytes']} B; uploaded below {OUTPUT}/ "
          f"{traffic.uploaded_under(f'{OUTPUT}/')} B, elsewhere "
          f"{sum(traffic.uploaded.values()) - traffic.uploaded_under(f'{OUTPUT}/')} B; downloaded from {OUTPUT}/ "
          f"{traffic.downloaded_under(f'{OUTPUT}/')} B; requests by kind: "
          f"{dict(sorted(Counter(kind for (kind, _), n in traffic.calls.items() for _ in range(n)).items()))}")


@pytest.mark.timeout(120)
def test_bytes_uploaded_are_about_the_datasets_size(measured):
    """Each output byte is uploaded once: everything the run uploads is the shards and the metadata files."""
    total, metadata = measured.info["total_bytes"], _metadata(measured)
    uploaded = sum(measured.traffic.uploaded.values())  # everything the run uploads, wherever
    limit = total * 1.05 + sum(metadata.values())
    assert uploaded <= limit, (
        f"the run uploaded {uploaded} B for a dataset of {total} B ({uploaded / total:.2f}x; the limit is "
        f"{limit:.0f} B: 1.05x + {sum(metadata.values())} B of metadata files); per object:\n"
        + _per_object(measured.traffic.uploaded, measured.traffic, UPLOAD))


@pytest.mark.timeout(120)
def test_bytes_read_back_from_the_output_are_near_zero(measured):
    """No shard or piece of one is read back: at most the metadata files (the lock, the completion marker), once."""
    metadata = _metadata(measured)
    read = {name: n for name, n in measured.traffic.downloaded.items() if name.startswith(f"{OUTPUT}/") and n}
    unexpected = sorted(set(read) - set(metadata))
    assert not unexpected and sum(read.values()) <= sum(metadata.values()), (
        f"{sum(read.values())} B were downloaded from the output (at most {sum(metadata.values())} B of metadata "
        f"files may be), {len(unexpected)} object(s) other than metadata files; per object:\n"
        + _per_object(read, measured.traffic, DOWNLOAD))


@pytest.mark.timeout(60)
def test_a_header_read_of_a_large_image_downloads_only_its_header(gcs_emulator, bucket, proxy):
    """estimate.header_size reads HEADER_BYTES of a file for its size: on GCS, no more than those should move."""
    from PIL import Image

    from pipeline.estimate import HEADER_BYTES, header_size

    noise = Image.frombytes("RGB", (1000, 1000), os.urandom(3_000_000))  # a PNG of about 3 MB: no compression
    data = io.BytesIO()
    noise.save(data, "PNG")
    assert len(data.getvalue()) > 10 * HEADER_BYTES
    gcs_emulator.write(f"{bucket}/unit/large.png", data.getvalue())
    proxy.reset_traffic()

    assert header_size(f"{bucket}/unit/large.png") == (1000, 1000)
    traffic = proxy.reset_traffic()
    assert traffic.calls[(DOWNLOAD, "unit/large.png")] >= 1
    assert traffic.downloaded["unit/large.png"] <= HEADER_BYTES + 1, (
        f"{traffic.downloaded['unit/large.png']} B downloaded of a {len(data.getvalue())} B file to read its "
        f"header ({HEADER_BYTES} B)")
