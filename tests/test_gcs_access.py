"""GCS access as a 100-million-image run needs it: object roles only, throttling survived, one client a process.

Real components: the GCS emulator behind tests/fault_proxy.py, which refuses
bucket metadata (403, as GCS answers an account with roles/storage.objectAdmin
only), answers 429 above a read rate, and counts every request; Beam's Dataflow
client against the REST stand-in (tests/dataflow_service.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from google.api_core import exceptions as api_exceptions

from pipeline.errors import UserError
from tests.conftest import FAST, REPO
from tests.fault_proxy import BUCKET as BUCKET_CALL
from tests.fault_proxy import FaultProxy
from tests.gcs_fixtures import NO_AUTH
from transforms.base import gcs, transient
from transforms.base.transient import RETRY_BASE_ENV, ReadRate, TransientReadError, with_retries

BUCKET = "access-e2e"
IMAGES = 40
IMAGE = "europe-docker.pkg.dev/test-project/r/image-tfrecords:1"


@pytest.fixture(scope="module")
def photos(gcs_emulator, tmp_path_factory):
    from pipeline.sample_data import generate_dataset

    bucket = gcs_emulator.create_bucket(BUCKET)
    tree = tmp_path_factory.mktemp("access-photos")
    names = generate_dataset(str(tree), images_per_class=IMAGES // 4, seed=29, min_side=32, max_side=48)
    assert gcs_emulator.upload_tree(tree, f"{bucket}/photos") == len(names) == IMAGES
    return f"{bucket}/photos"


@pytest.fixture
def proxy(gcs_emulator, monkeypatch):
    """The proxy in front of the emulator, refusing bucket metadata, with this process's clients pointed at it."""
    with FaultProxy(gcs_emulator.host) as running:
        running.refuse_bucket_metadata = True
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", running.url)
        monkeypatch.setenv(RETRY_BASE_ENV, "0.01")
        yield running


def _run(photos: str, output: str, *extra) -> int:
    from pipeline.launcher import run

    return run([f"--input_dir={photos}", f"--output_dir={output}", NO_AUTH, "--quiet", "--image_size=32", *extra,
                *FAST])


def _complete(gcs_emulator, output: str) -> dict:
    info = json.loads(gcs_emulator.read(f"{output}/image_tfrecords.json"))
    assert info["files"]["found"] == info["files"]["written"] == IMAGES and info["files"]["rejected"] == 0
    assert sum(shard["records"] for split in info["splits"].values() for shard in split["shards"]) == IMAGES
    return info


@pytest.mark.timeout(300)
def test_a_local_run_needs_object_permissions_only_and_one_client(gcs_emulator, photos, proxy):
    made = gcs.clients_made()
    assert _run(photos, f"gs://{BUCKET}/local-least") == 0
    _complete(gcs_emulator, f"gs://{BUCKET}/local-least")
    traffic = proxy.reset_traffic()
    # Nothing asked for a bucket's metadata, so nothing was refused: the launcher's checks, its lock, the job's
    # listing, reads, writes and publishing all ran on object calls, and on one client of this process.
    assert proxy.refused == {} and traffic.calls_of(BUCKET_CALL) == 0, traffic.report()
    assert gcs.clients_made() - made == 1


@pytest.mark.timeout(300)
def test_a_dataflow_launch_needs_object_permissions_only(gcs_emulator, dataflow_api, photos, proxy):
    """Beam's Dataflow client stages the job (pipeline.pb) and submits it; the stand-in runs it to the end."""
    output = f"gs://{BUCKET}/dataflow-least"
    env = {**os.environ, **gcs_emulator.env, "STORAGE_EMULATOR_HOST": proxy.url}
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.main", f"--input_dir={photos}", f"--output_dir={output}",
         "--runner=DataflowRunner", "--project=test-project", "--region=europe-west4",
         f"--temp_location=gs://{BUCKET}/tmp", f"--dataflow_endpoint={dataflow_api.endpoint}",
         f"--sdk_container_image={IMAGE}", NO_AUTH, "--image_size=32"],
        cwd=REPO, capture_output=True, text=True, timeout=280, env=env)
    assert result.returncode == 0, result.stderr
    assert f"Found {IMAGES} files: {IMAGES} written, 0 rejected, 0 skipped." in result.stdout
    _complete(gcs_emulator, output)
    assert proxy.refused == {}, proxy.refused
    traffic = proxy.reset_traffic()
    assert traffic.calls_of(BUCKET_CALL) == 0
    assert traffic.calls_of("upload", "tmp/") > 0  # the staging went through the proxy, object calls only


@pytest.mark.timeout(60)
def test_a_missing_bucket_is_still_one_clear_line(gcs_emulator, photos, proxy):
    with pytest.raises(UserError) as error:
        _run(photos, "gs://no-such-bucket-29/out")
    assert str(error.value) == ("--output_dir gs://no-such-bucket-29/out: the bucket gs://no-such-bucket-29 does "
                                "not exist: check the name, or create it with gcloud storage buckets create "
                                "gs://no-such-bucket-29")
    assert proxy.refused == {}


def test_objects_that_may_not_be_listed_are_one_line_naming_the_role(monkeypatch):
    from pipeline import cloud

    class Refusing:
        def list_blobs(self, bucket, **kwargs):
            assert kwargs == {"prefix": "photos", "max_results": 1}  # one object listing, never bucket metadata
            raise api_exceptions.Forbidden("GET ...: caller does not have storage.objects.list access")

    monkeypatch.setattr(cloud.gcs, "client", lambda: Refusing())
    with pytest.raises(UserError) as error:
        cloud.check_gcs_folder("--input_dir", "gs://locked/photos")
    assert str(error.value) == (
        "--input_dir gs://locked/photos: the objects of gs://locked cannot be listed (Forbidden): check the name and "
        "that your credentials may list and read them (roles/storage.objectViewer, or objectAdmin for an output; "
        "gcloud auth application-default login)")


def test_beams_gcs_clients_are_the_process_client():
    """The one place that leans on Beam 2.77: if Beam stops building its clients through
    `gcsio.create_storage_client`, or keeps its options elsewhere, this fails."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.io.gcp import gcsio
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.dataflow.internal import apiclient

    assert getattr(gcsio.create_storage_client, "shared_client", False)
    assert apiclient.create_storage_client is gcsio.create_storage_client
    one = gcs.client()
    assert isinstance(one, gcs.ObjectLevelClient)
    assert gcsio.GcsIO().client is one  # what Beam's file system builds for every call
    assert FileSystems.get_filesystem("gs://b/x")._gcsIO().client is one
    options = PipelineOptions(["--project=p-29"])
    FileSystems.set_options(options)
    try:
        assert gcs._file_system_options() is options  # the options a worker's Beam set
    finally:
        FileSystems.set_options(PipelineOptions())
    assert one.get_bucket("any").name == "any"  # no storage.buckets.get


@pytest.mark.timeout(300)
def test_a_throttled_run_loses_nothing(gcs_emulator, photos, proxy, monkeypatch):
    """The store answers 429 above 20 object reads a second: every image is written, none rejected, exit 0."""
    from pipeline import estimate

    monkeypatch.setattr(estimate, "measure_output", lambda *args, **kwargs: None)
    monkeypatch.setattr(transient, "_rates", {})  # this run's process starts its ramp afresh
    proxy.throttle(per_s=20, burst=2)
    output = f"gs://{BUCKET}/throttled"
    # A time limit per image below what the throttled waits add up to: those waits are not the image's time.
    # It starts at 50 reads a second (a local run's share: the job's rate over one process per core).
    start_rate = f"--initial_read_rate={50 * (os.cpu_count() or 1)}"
    assert _run(photos, output, "--image_timeout_s=60", "--conversion_threads=4", start_rate) == 0
    _complete(gcs_emulator, output)
    assert proxy.throttled > 0  # it really was throttled
    assert transient.read_rate().rate() < 50  # and the process slowed down


@pytest.mark.timeout(120)
def test_throttling_that_outlasts_the_bound_fails_the_run_in_one_line(gcs_emulator, photos, proxy):
    proxy.fail("photos/" + gcs_emulator.list_names(photos)[0], 503, times=None)
    output = f"gs://{BUCKET}/throttled-out"
    env = {**os.environ, **gcs_emulator.env, "STORAGE_EMULATOR_HOST": proxy.url, RETRY_BASE_ENV: "0.01"}
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.main", f"--input_dir={photos}", f"--output_dir={output}", NO_AUTH,
         "--image_size=32", "--throttled_retry_s=0.2"], cwd=REPO, capture_output=True, text=True, timeout=110,
        env=env)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: reading gs://") and "ServiceUnavailable: 503" in last, result.stderr
    assert "Traceback" not in result.stderr


class _Clock:
    def __init__(self):
        self.now = 1000.0
        self.slept = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_read_rate_ramps_up_and_halves_on_throttling():
    clock = _Clock()
    rate = ReadRate(initial_per_s=10, doubling_s=1200, most_per_s=1000, least_per_s=2, clock=lambda: clock.now,
                    sleep=clock.sleep)
    assert rate.rate() == 10
    for _ in range(30):  # a second's burst of 10, then one read a tenth of a second
        rate.wait()
    assert len(clock.slept) == 20 and sum(clock.slept) == pytest.approx(2.0, rel=0.01)  # (the ramp goes on meanwhile)
    clock.now = 1000 + 1200  # 20 minutes after the start
    assert rate.rate() == pytest.approx(20)  # doubled, as GCS's ramp rule allows
    clock.now += 2400
    assert rate.rate() == pytest.approx(80)
    rate.slow_down()
    assert rate.rate() == pytest.approx(40)
    rate.slow_down()  # the answers of reads sent at the old rate: once a second at most
    assert rate.rate() == pytest.approx(40)
    clock.now += transient.RECOVERY_DOUBLING_S
    assert rate.rate() == pytest.approx(80)  # back to the rate that was throttled, within a minute
    clock.now += 1200
    assert rate.rate() == pytest.approx(160)  # and on at the 20-minute ramp
    for _ in range(10):
        clock.now += transient.SLOW_DOWN_GAP_S
        rate.slow_down()
    assert rate.rate() == 2  # never below the least rate
    clock.now += 1e9
    assert rate.rate() == 1000  # nor above the most


def test_throttling_answers_are_retried_past_the_other_errors_bound(monkeypatch):
    monkeypatch.setenv(RETRY_BASE_ENV, "0.001")
    monkeypatch.setattr(transient, "RETRY_MAX_S", 0.002)  # every wait: a few ms
    answers = [api_exceptions.TooManyRequests("slow")] * 12 + [api_exceptions.ServiceUnavailable("busy")] * 8
    rate = ReadRate(initial_per_s=1e6, least_per_s=1e5)

    def read(timeout):
        if answers:
            raise answers.pop(0)
        return b"bytes"

    assert with_retries(read, "gs://b/x.jpg", rate=rate) == b"bytes"  # 21 tries, far past READ_ATTEMPTS
    answers[:] = [api_exceptions.TooManyRequests("slow")] * 10_000
    with pytest.raises(TransientReadError) as error:
        with_retries(read, "gs://b/x.jpg", throttled_s=0.05, rate=rate)
    assert 1 < error.value.attempts < 10_000
    assert str(error.value).endswith("the last error: TooManyRequests: 429 slow")


def test_only_gcs_reads_take_the_read_rates_tokens(tmp_path, monkeypatch):
    """GCS's ramp is a rule of GCS: a local file is read at once, however many were read before it."""
    from transforms.images.convert import read_bytes

    clock = _Clock()
    rate = ReadRate(initial_per_s=2, least_per_s=1, clock=lambda: clock.now, sleep=clock.sleep)
    monkeypatch.setattr(transient, "read_rate", lambda start_per_s=None: rate)
    image = tmp_path / "a.jpg"
    image.write_bytes(b"jpeg bytes")
    for _ in range(50):
        assert read_bytes(str(image), 1000) == b"jpeg bytes"
    assert clock.slept == []
    for _ in range(4):  # a burst of 2, then one read every half second
        assert with_retries(lambda timeout: b"object", "gs://b/x.jpg") == b"object"
    assert clock.slept == pytest.approx([0.5, 0.5], rel=0.01)  # (the ramp goes on meanwhile)


def test_a_job_starts_at_the_buckets_read_rate_shared_by_its_processes():
    """5,000 reads a second (a cold bucket's capacity) over the job's processes: --max_num_workers x vCPUs."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.options import validate
    from pipeline.workers import machine_vcpus

    def start(*flags):
        options = PipelineOptions(["--input_dir=gs://b/photos", "--output_dir=gs://b/out", *flags])
        return validate(options).image.reads_per_s_at_start

    dataflow = ["--runner=DataflowRunner", "--project=p", "--region=r", "--temp_location=gs://b/tmp"]
    assert start(*dataflow, "--max_num_workers=10", "--machine_type=n2-standard-4") == 5000 / 40
    assert start(*dataflow, "--num_workers=25", "--machine_type=n2-highcpu-16") == 5000 / 400
    assert start(*dataflow, "--max_num_workers=10") == 5000 / 10  # Dataflow's n1-standard-1 when not given
    assert start(*dataflow, "--max_num_workers=4000", "--machine_type=n2-standard-8") == 1.0  # at least 1 a second
    assert start(*dataflow, "--max_num_workers=1", "--initial_read_rate=40000") == 2000  # at most 2,000 a process
    assert start(*dataflow) == transient.INITIAL_READS_PER_S == 50  # unbounded: 100 processes' shares, as before
    # A local run's processes share the job's rate too: --direct_num_workers, else one per core.
    assert start("--direct_num_workers=4") == 5000 / 4
    assert start("--direct_num_workers=200") == 5000 / 200
    assert start() == min(2000, 5000 / (os.cpu_count() or 1))
    assert start("--direct_num_workers=1") == start()  # Beam's default: as if not given (one per core)
    assert [machine_vcpus(t) for t in ("n2-standard-4", "custom-8-32768", "e2-medium", "c3d-highmem-360-lssd",
                                       "zones/z/machineTypes/n2d-highcpu-32", "t2a-standard-1", "gpu-x")] == [
        4, 8, 2, 360, 32, 1, None]


@pytest.mark.parametrize("value", ["0", "-5", "inf", "nan"])
def test_a_bad_initial_read_rate_is_one_line(capsys, value):
    from tests.conftest import main_in_process

    code, err = main_in_process(capsys, "--input_dir=gs://b/photos", "--output_dir=gs://b/out",
                                f"--initial_read_rate={value}")
    assert code == 2
    assert err.strip().splitlines() == [f"error: --initial_read_rate={float(value):g} must be a positive number of "
                                        "reads a second: 5000 suits a cold bucket"]


@pytest.mark.timeout(300)
def test_the_initial_read_rate_reaches_the_workers_reads(gcs_emulator, photos, proxy, monkeypatch):
    """A local run's processes read at 100 processes' shares of --initial_read_rate: the option reaches the reads."""
    from pipeline import estimate

    monkeypatch.setattr(estimate, "measure_output", lambda *args, **kwargs: None)
    monkeypatch.setattr(transient, "_rates", {})  # this run's process makes its ReadRate afresh
    monkeypatch.delenv(transient.INITIAL_RATE_ENV, raising=False)
    output = f"gs://{BUCKET}/initial-rate"
    assert _run(photos, output, "--initial_read_rate=800") == 0
    _complete(gcs_emulator, output)
    # 800 over the local run's processes, one per core: the rate the process's bucket started at (its rate at
    # its own start, which no time since can change), not the default share nor one of 100 processes'
    rate = transient.read_rate()
    assert rate._rate(rate._since) == pytest.approx(800 / (os.cpu_count() or 1), rel=1e-9)


@pytest.mark.parametrize("share, expected", [(1.0, 500.0), (2000.0, 2000.0), (None, 500.0)])
def test_the_launchers_sample_reads_gcs_on_many_threads_at_a_rate_of_its_own(share, expected, monkeypatch):
    """The size sample's header reads from gs:// run on GCS_SAMPLE_THREADS threads at once (each waits on the
    network), starting at LAUNCHER_READS_PER_S or the run's share if higher, not at a worker's small share."""
    import threading

    from pipeline import estimate
    from transforms.images.settings import ImageSettings

    paths = [f"gs://{BUCKET}/photos/{i}.jpg" for i in range(estimate.GCS_SAMPLE_THREADS)]
    together = threading.Barrier(estimate.GCS_SAMPLE_THREADS, timeout=60)  # passes only with every read at once
    rates = []

    def read_head(path, count, throttled_s, start_rate):
        rates.append(start_rate)
        together.wait()
        raise OSError("no image here")  # header_size leaves it out of the sample

    monkeypatch.setattr(estimate, "read_head", read_head)
    monkeypatch.setattr(estimate, "_readable", lambda path: True)
    settings = ImageSettings(width=64, height=64, reads_per_s_at_start=share)
    assert estimate.sample_sizes(paths, settings) == []
    assert not together.broken and rates == [expected] * len(paths)
