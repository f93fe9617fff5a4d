"""Transient read errors (429, 5xx, reset connections) are retried, and never turned into rejections.

Real components: the GCS emulator, with a fault-injecting proxy (tests/fault_proxy.py)
in front of it that fails the first requests for chosen objects.
"""

from __future__ import annotations

import errno
import gc
import itertools
import json
from collections import Counter

import pytest
import requests
from apache_beam.io.filesystems import FileSystems
from google.api_core import exceptions as api_exceptions

from pipeline import estimate
from tests.conftest import cli, convert
from tests.fault_proxy import RESET, FaultProxy
from tests.gcs_fixtures import NO_AUTH
from transforms.base import transient
from transforms.base.tfrecord import iter_records
from transforms.base.transient import RETRY_BASE_ENV, TransientReadError, is_transient, with_retries

BUCKET = "transient-e2e"
FAST_BACKOFF = "0.01"  # seconds: the first wait's bound in these tests


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory):
    """3 classes of 6 small images each."""
    from pipeline.sample_data import generate_dataset

    root = tmp_path_factory.mktemp("transient-tree")
    names = generate_dataset(str(root), images_per_class=6, classes=("cat", "dog", "fox"), seed=3,
                             min_side=24, max_side=48)
    return root, sorted(names)


@pytest.fixture(scope="module")
def gcs_photos(gcs_emulator, small_tree):
    root, names = small_tree
    bucket = gcs_emulator.create_bucket(BUCKET)
    assert gcs_emulator.upload_tree(root, f"{bucket}/photos") == len(names) == 18
    return bucket


@pytest.fixture
def proxy(gcs_emulator, monkeypatch):
    """The proxy, with this process's GCS clients (and its worker processes') pointed at it."""
    with FaultProxy(gcs_emulator.host) as running:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", running.url)
        monkeypatch.setenv(RETRY_BASE_ENV, FAST_BACKOFF)
        yield running


def _records(info: dict, directory: str) -> Counter:
    return Counter(record for split_info in info["splits"].values() for shard in split_info["shards"]
                   for record in iter_records(FileSystems.join(directory, shard["file"])))


@pytest.mark.timeout(180)
def test_transient_errors_are_retried_and_no_image_is_lost(gcs_emulator, gcs_photos, small_tree, proxy,
                                                           tmp_path, monkeypatch):
    root, names = small_tree
    # Only the job's reads are counted: the launcher's sample of a dozen images (for the shard size) is off.
    monkeypatch.setattr(estimate, "measure_output", lambda *args, **kwargs: None)
    faults = {  # object -> (how, how many first requests fail)
        names[0]: (503, 1), names[1]: (503, 2), names[4]: (429, 1), names[7]: (500, 1),
        names[9]: (502, 1), names[12]: (504, 3), names[13]: (RESET, 1), names[17]: (RESET, 2),
    }
    for name, (how, times) in faults.items():
        proxy.fail(f"photos/{name}", how, times)
    output = f"{gcs_photos}/out-retried"
    assert convert(f"{gcs_photos}/photos", output, NO_AUTH) == 0

    # The proxy really failed those reads, and each one was then read once more, successfully.
    assert sum(proxy.injected.values()) == sum(times for _, times in faults.values()) == 12
    assert {name[len("photos/"):]: count for (name, _), count in proxy.injected.items()} == {
        name: times for name, (_, times) in faults.items()}
    for name, (_, times) in faults.items():
        assert proxy.requests[f"photos/{name}"] == times + 1, name
    assert all(proxy.requests[f"photos/{name}"] == 1 for name in names if name not in faults)

    info = json.loads(gcs_emulator.read(f"{output}/image_tfrecords.json"))
    assert info["files"]["found"] == info["files"]["written"] == 18
    assert info["files"]["rejected"] == 0 and info["rejected_by_reason"] == {}
    assert gcs_emulator.read(f"{output}/errors.jsonl") == b""
    # The very same records (pixels, labels, paths) as a local conversion of the same files.
    local = tmp_path / "local"
    assert convert(root, local) == 0
    local_info = json.loads((local / "image_tfrecords.json").read_text())
    remote = _records(info, output)
    assert sum(remote.values()) == 18
    assert remote == _records(local_info, str(local))


@pytest.mark.timeout(180)
def test_a_read_that_keeps_failing_fails_the_run_in_one_line(gcs_emulator, gcs_photos, small_tree, proxy):
    _, names = small_tree
    # every request; a 500, not a throttling answer (429, 503: retried for minutes, see tests/test_gcs_access.py)
    proxy.fail(f"photos/{names[5]}", 500, times=None)
    output = f"{gcs_photos}/out-failing"
    env = dict(gcs_emulator.env, STORAGE_EMULATOR_HOST=proxy.url, **{RETRY_BASE_ENV: FAST_BACKOFF})
    # A short time limit per image: before, google-cloud-storage's own retries ran until it, and the image
    # became a `timeout` rejection of a run that succeeded.
    result = cli("pipeline.main", f"--input_dir={gcs_photos}/photos", f"--output_dir={output}", NO_AUTH,
                 "--image_timeout_s=10", env=env, timeout=150)

    assert result.returncode == 1, result.stderr
    path = f"{gcs_photos}/photos/{names[5]}"
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == result.stderr.splitlines()[-1:], result.stderr  # one line, the last
    url = f"http://127.0.0.1:{proxy.url.rsplit(':', 1)[1]}/download/storage/v1/b/{BUCKET}/o/" + (
        f"photos/{names[5]}".replace("/", "%2F"))
    assert errors[0].startswith(f"error: reading {path} failed {transient.READ_ATTEMPTS} times with a transient "
                                "error over ")
    assert errors[0].endswith(
        f"s (retried with backoff); the last error: InternalServerError: 500 GET {url}?alt=media: injected 500. "
        "The storage service was overloaded or unreachable, so the run stopped rather than leave the image out; "
        "no dataset was written. Check the service's status and your network, then run the same command again "
        "(it removes this run's files first)")
    assert "Traceback" not in result.stderr
    assert proxy.injected[(f"photos/{names[5]}", 500)] == proxy.requests[f"photos/{names[5]}"]
    # each try of the bundle, or of the launcher's sample (its header read and its conversions): 5 reads. Not
    # every GET: google-cloud-storage retries metadata requests a number of times that depends on timing.
    reads = proxy.media_requests[f"photos/{names[5]}"]
    assert reads > 0 and reads % transient.READ_ATTEMPTS == 0, reads
    left = gcs_emulator.list_names(output)
    assert "image_tfrecords.json" not in left and ".image-tfrecords.lock" not in left

    # What the line says to do works: once the service answers again, the same command converts everything.
    proxy.clear()
    result = cli("pipeline.main", f"--input_dir={gcs_photos}/photos", f"--output_dir={output}", NO_AUTH,
                 "--image_timeout_s=10", env=env, timeout=150)
    assert result.returncode == 0, result.stderr
    info = json.loads(gcs_emulator.read(f"{output}/image_tfrecords.json"))
    assert info["files"]["found"] == info["files"]["written"] == 18 and info["files"]["rejected"] == 0


@pytest.mark.timeout(180)
def test_missing_and_forbidden_objects_are_still_rejections(gcs_emulator, gcs_photos, small_tree, proxy,
                                                            monkeypatch):
    _, names = small_tree
    monkeypatch.setattr(estimate, "measure_output", lambda *args, **kwargs: None)  # only the job's reads count
    proxy.fail(f"photos/{names[2]}", 404, times=None)
    proxy.fail(f"photos/{names[10]}", 403, times=None)
    output = f"{gcs_photos}/out-rejected"
    assert convert(f"{gcs_photos}/photos", output, NO_AUTH) == 0

    assert proxy.requests[f"photos/{names[2]}"] == proxy.requests[f"photos/{names[10]}"] == 1  # not retried
    info = json.loads(gcs_emulator.read(f"{output}/image_tfrecords.json"))
    assert info["files"]["found"] == 18 and info["files"]["written"] == 16 and info["files"]["rejected"] == 2
    assert info["rejected_by_reason"] == {"read_error": 2}
    lines = {json.loads(line)["relpath"]: json.loads(line)
             for line in gcs_emulator.read(f"{output}/errors.jsonl").decode().splitlines()}
    assert sorted(lines) == sorted([names[2], names[10]])
    assert lines[names[2]]["reason"] == lines[names[10]]["reason"] == "read_error"
    for name, status in ((names[2], "NotFound: 404"), (names[10], "Forbidden: 403")):
        url = f"{proxy.url}/download/storage/v1/b/{BUCKET}/o/" + f"photos/{name}".replace("/", "%2F")
        assert lines[name]["detail"] == f"{status} GET {url}?alt=media: injected {status[-3:]}"


@pytest.mark.parametrize("error, transient_", [
    (api_exceptions.TooManyRequests("slow down"), True),
    (api_exceptions.InternalServerError("x"), True),
    (api_exceptions.BadGateway("x"), True),
    (api_exceptions.ServiceUnavailable("x"), True),
    (api_exceptions.GatewayTimeout("x"), True),
    (api_exceptions.RetryError("library retries ran out", None), True),
    (requests.exceptions.ConnectionError("Connection aborted."), True),
    (requests.exceptions.ReadTimeout("read timed out"), True),
    (requests.exceptions.ChunkedEncodingError("x"), True),
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), True),
    (OSError(errno.ETIMEDOUT, "Connection timed out"), True),  # a network file system
    (OSError(errno.ECONNABORTED, "Software caused connection abort"), True),
    (TimeoutError("timed out"), True),
    (api_exceptions.NotFound("no such object"), False),
    (api_exceptions.Forbidden("no access"), False),
    (api_exceptions.BadRequest("x"), False),
    (FileNotFoundError(errno.ENOENT, "No such file or directory"), False),
    (PermissionError(errno.EACCES, "Permission denied"), False),
    (OSError(errno.EIO, "Input/output error"), False),
    (ValueError("x"), False),
])
def test_which_errors_are_transient(error, transient_):
    assert is_transient(error) is transient_


@pytest.mark.timeout(30)
def test_retries_are_bounded_and_other_errors_pass_at_once(monkeypatch):
    monkeypatch.setenv(RETRY_BASE_ENV, FAST_BACKOFF)
    calls = []

    def always(exc):
        def read(timeout):
            calls.append(timeout)
            raise exc
        return read

    with pytest.raises(TransientReadError) as error:
        with_retries(always(api_exceptions.InternalServerError("busy")), "gs://b/x.jpg")
    assert len(calls) == error.value.attempts == transient.READ_ATTEMPTS
    assert str(error.value).startswith(f"reading gs://b/x.jpg failed {transient.READ_ATTEMPTS} times with a "
                                       "transient error over ")
    assert str(error.value).endswith("the last error: InternalServerError: 500 busy")

    calls.clear()
    with pytest.raises(FileNotFoundError):
        with_retries(always(FileNotFoundError(errno.ENOENT, "gone")), "x.jpg")
    assert len(calls) == 1

    calls.clear()
    outcomes = [ConnectionResetError(errno.ECONNRESET, "reset"), api_exceptions.TooManyRequests("slow"), b"ok"]

    def flaky(timeout):
        calls.append(timeout)
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert with_retries(flaky, "x.jpg") == b"ok"
    assert len(calls) == 3


@pytest.mark.timeout(30)
def test_retries_end_before_the_images_deadline(monkeypatch):
    """With little time left, the retries stop early: the bundle fails rather than the image timing out."""
    import time

    monkeypatch.setattr(transient, "exponential_sleep_generator", lambda base, maximum: itertools.repeat(1.0))
    calls = []

    def read(timeout):
        calls.append(timeout)
        raise api_exceptions.InternalServerError("busy")

    with pytest.raises(TransientReadError) as error:
        with_retries(read, "gs://b/x.jpg", deadline=time.monotonic() + 1.5)
    # Half of the 1.5 s left is for retrying: a wait of 1 s does not fit, so there is no second try.
    assert error.value.attempts == len(calls) == 1


@pytest.mark.timeout(30)
def test_a_local_read_on_a_flaky_network_mount_is_retried(tmp_path, monkeypatch, small_tree):
    """A network file system's ETIMEDOUT or ECONNRESET is retried too; a vanished file stays a rejection."""
    from transforms.images import convert as convert_module
    from transforms.images.diagnosis import ImageRejected
    from transforms.images.settings import ImageSettings

    monkeypatch.setenv(RETRY_BASE_ENV, FAST_BACKOFF)
    root, names = small_tree
    path = str(root / names[3])
    real_open = FileSystems.open
    failures = {path: [OSError(errno.ETIMEDOUT, "Connection timed out"),
                       ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")]}
    opened = Counter()

    def flaky_open(name, *args, **kwargs):
        opened[name] += 1
        if failures.get(name):
            raise failures[name].pop(0)
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(FileSystems, "open", staticmethod(flaky_open))
    assert convert_module.read_bytes(path, 10_000_000) == (root / names[3]).read_bytes()
    assert opened[path] == 3

    image = convert_module.read_and_convert(path, ImageSettings(), None)
    assert image.data[:2] == b"\xff\xd8" and (image.width, image.height) == (512, 512)

    failures[path] = [ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")] * 99
    with pytest.raises(TransientReadError, match=f"reading {path} failed {transient.READ_ATTEMPTS} times"):
        convert_module.read_and_convert(path, ImageSettings(), None)  # not a read_error rejection

    with pytest.raises(ImageRejected) as rejected:
        convert_module.read_and_convert(str(root / "gone.jpg"), ImageSettings(), None)
    assert rejected.value.reason == "read_error" and "FileNotFoundError" in rejected.value.detail


@pytest.mark.timeout(120)
def test_in_process_run_raises_the_one_line_error(gcs_emulator, gcs_photos, small_tree, proxy):
    """The same through `pipeline.launcher.run` with the worker in this process (how tests and notebooks run it)."""
    from pipeline.errors import TransientReadFailed

    _, names = small_tree
    proxy.fail(f"photos/{names[8]}", RESET, times=None)
    output = f"{gcs_photos}/out-failing-in-process"
    with pytest.raises(TransientReadFailed) as error:
        convert(f"{gcs_photos}/photos", output, NO_AUTH)
    message = str(error.value)
    assert error.value.exit_code == 1 and "\n" not in message
    assert message.startswith(f"reading {gcs_photos}/photos/{names[8]} failed {transient.READ_ATTEMPTS} times with "
                              "a transient error over ")
    assert "the last error: ConnectionError" in message, message
    assert proxy.requests[f"photos/{names[8]}"] == transient.READ_ATTEMPTS
    # The failed bundle's open GCS writers are reachable from the error's context. Garbage-collected, they
    # upload what they hold (Beam's BlobWriter closes on collection); after the proxy is gone that would retry
    # for minutes at the end of the session, so they go now, while it passes requests on.
    del error
    gc.collect()
    assert "image_tfrecords.json" not in gcs_emulator.list_names(output)
