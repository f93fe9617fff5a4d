"""One google-cloud-storage client per process, for every read, listing and write, with object permissions only.

Why one client: google-cloud-storage 3.x starts, for each new client, a
background GET of each bucket's metadata (for its tracing attributes), and Beam
2.77's GCS file system builds a new client (`gcsio.GcsIO()`) for every call:
an 80-image job made 103 clients and 92 bucket GETs, and opened a new
connection (and TLS session) for most requests. Here every client this
process asks for, Beam's included, is one client, built once per process
(and per storage endpoint: tests point STORAGE_EMULATOR_HOST at an emulator or
a proxy) with the options of the run, and with a connection pool as large as
the threads that share it.

Why object permissions only: `roles/storage.objectAdmin`, the role Google's
Dataflow documentation gives a job's service account, does not grant
`storage.buckets.get`. This project never needs a bucket's metadata; Beam's
Dataflow staging (`apiclient.DataflowApplicationClient.stage_file`) asks for it
only to make a `Bucket` to upload into. The client's `get_bucket` therefore
returns the bucket without a request (a missing bucket then fails at the first
object call, with 404), and the tracing fetch is switched off with
google-cloud-storage's own variable, so no process sends `storage.buckets.get`.

The one place that leans on Beam: `gcsio.create_storage_client` (a public
module function) is wrapped, in `gcsio` and in the Dataflow `apiclient`, which
imports it by name (if it is imported already; one imported later takes the
wrapped one). tests/test_gcs_access.py fails if Beam 2.77 stops building
its clients through it. Pinned: apache-beam 2.77 (setup.py).
"""

from __future__ import annotations

import os
import sys
import threading

from google.cloud import storage

from transforms.base.paths import BUCKET_METADATA_ENV

POOL_CONNECTIONS = 64  # connections kept per host: a worker's reading and writing threads share the client

_lock = threading.Lock()
_clients: dict[tuple, storage.Client] = {}
_pid = os.getpid()
_made = 0  # clients built by this process (tests count them)


class ObjectLevelClient(storage.Client):
    """A storage client that never asks for a bucket's metadata (`storage.buckets.get`)."""

    def get_bucket(self, bucket_or_name, *args, **kwargs):
        """The bucket, without the metadata GET: what follows (an upload, a read) finds out if it is missing."""
        return bucket_or_name if isinstance(bucket_or_name, storage.Bucket) else self.bucket(bucket_or_name)


def _key(pipeline_options, use_credentials: bool) -> tuple:
    """What makes two clients differ: the endpoint, and the identity the options ask for.

    Beam resolves the credentials once a process (`auth._Credentials`), so only an impersonated account or none
    at all gives another identity; the project only matters to bucket calls, which this project does not make.
    """
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    account = pipeline_options.view_as(GoogleCloudOptions).impersonate_service_account if pipeline_options else None
    return os.environ.get("STORAGE_EMULATOR_HOST"), use_credentials, account


def _as_object_level(client: storage.Client) -> storage.Client:
    """`client`, its class made ObjectLevelClient, with a connection pool for the threads that share it."""
    import requests

    client.__class__ = ObjectLevelClient
    session = getattr(client, "_http", None)  # google-cloud-storage's requests session (an AuthorizedSession)
    if isinstance(session, requests.Session):
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=POOL_CONNECTIONS)
        session.mount("https://", adapter)
        session.mount("http://", adapter)
    return client


def _shared(build, pipeline_options, use_credentials: bool = True) -> storage.Client:
    """The process's client for these options, built once with `build` (Beam's own factory)."""
    global _pid, _made
    os.environ.setdefault(BUCKET_METADATA_ENV, "true")
    key = _key(pipeline_options, use_credentials)
    with _lock:
        if _pid != os.getpid():  # a forked child: a client's connections must not be shared across processes
            _clients.clear()
            _pid, _made = os.getpid(), 0
        if key not in _clients:
            _clients[key] = _as_object_level(build(pipeline_options, use_credentials))
            _made += 1
        return _clients[key]


def clients_made() -> int:
    """How many clients this process has built (one per endpoint and identity)."""
    return _made


def install() -> None:
    """Make Beam's GCS clients this process's one client. Idempotent; done when this module is imported."""
    from apache_beam.io.gcp import gcsio

    if getattr(gcsio.create_storage_client, "shared_client", False):
        return
    build = gcsio.create_storage_client

    def create_storage_client(pipeline_options, use_credentials=True):
        return _shared(build, pipeline_options, use_credentials)

    create_storage_client.shared_client = True
    gcsio.create_storage_client = create_storage_client
    # The Dataflow apiclient takes the function by name when it is imported: one imported later takes this one.
    # It is not imported here: it loads the Dataflow API client, which a local run never uses (0.2 s).
    apiclient = sys.modules.get("apache_beam.runners.dataflow.internal.apiclient")
    if apiclient is not None:
        apiclient.create_storage_client = create_storage_client


def client() -> storage.Client:
    """The process's GCS client with the run's options (credentials, --no_auth, STORAGE_EMULATOR_HOST).

    The options are the ones Beam's file systems use: the launcher's (`FileSystems.set_options`), or on a
    worker those Beam set there.
    """
    from apache_beam.io.gcp import gcsio

    install()
    return gcsio.GcsIO(pipeline_options=_file_system_options()).client


def _file_system_options():
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    # Beam 2.77 keeps them in FileSystems._pipeline_options (set_options has no public getter).
    return getattr(FileSystems, "_pipeline_options", None) or PipelineOptions()


install()
