"""gcp-storage-emulator with generation preconditions: `python -m tests.gcs_emulator_server start ...`.

The emulator writes an object's name into its `mediaLink` as it is, where Cloud Storage percent-encodes it (a
`/`, `#`, `?` or `%` in the name); Beam's reader downloads through that link. The link is made as GCS makes it.

The emulator ignores `ifGenerationMatch`, which the output folder's lock relies
on (create only if absent: `ifGenerationMatch=0`; delete only the version that
was read). Real GCS answers 412 Precondition Failed when the condition does not
hold; this wraps the emulator's handlers to do the same, then starts it as
`python -m gcp_storage_emulator` would. In memory, it also skips the snapshot
of its metadata after every change, so that thousands of objects stay quick.
"""

from __future__ import annotations

import sys
import threading
import urllib.parse
from http import HTTPStatus, server

from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects
from gcp_storage_emulator.storage import Storage

_CONDITION_NOT_MET = {"error": {"code": 412, "message": "At least one of the pre-conditions did not hold.",
                                "errors": [{"domain": "global", "reason": "conditionNotMet",
                                            "message": "Precondition Failed"}]}}


def _object_name(request) -> str | None:
    if "object_id" in request.params:
        return request.params["object_id"]
    if "name" in request.query:
        return request.query["name"][0]
    data = request.data
    if isinstance(data, dict):
        meta = data.get("meta") if isinstance(data.get("meta"), dict) else data
        return meta.get("name")
    return None


def _holds(request, storage) -> bool:
    wanted = request.query.get("ifGenerationMatch")
    if not wanted:
        return True
    bucket, name = request.params.get("bucket_name"), _object_name(request)
    try:
        current = str(storage.get_file_obj(bucket, name).get("generation"))
    except NotFound:
        current = None
    return current is None if wanted[0] == "0" else current == wanted[0]


_ATOMIC = threading.Lock()  # the check and the write are one step, as on GCS, also when requests come at once


def _with_precondition(handler):
    def checked(request, response, storage, *args, **kwargs):
        if not request.query.get("ifGenerationMatch"):
            return handler(request, response, storage, *args, **kwargs)
        with _ATOMIC:
            if not _holds(request, storage):
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json(_CONDITION_NOT_MET)
                return None
            return handler(request, response, storage, *args, **kwargs)

    return checked


for _name in ("insert", "delete", "get", "download"):
    setattr(objects, _name, _with_precondition(getattr(objects, _name)))


def _encoded_media_link(make):
    """The object resource with its mediaLink's name percent-encoded, as Cloud Storage gives it: Beam's GCS reader
    (google-cloud-storage's BlobReader) downloads an object through its mediaLink, and a name with '#' (a
    fragment), '?' (a query) or '%' would otherwise ask for another object."""

    def made(base_url, bucket_name, object_name, *args, **kwargs):
        resource = make(base_url, bucket_name, object_name, *args, **kwargs)
        link = resource.get("mediaLink")
        if isinstance(link, str):
            encoded = urllib.parse.quote(object_name, safe="")
            resource["mediaLink"] = (f"{base_url}/download/storage/v1/b/{bucket_name}/o/{encoded}"
                                     f"?generation={resource['generation']}&alt=media")
        return resource

    return made


objects._make_object_resource = _encoded_media_link(objects._make_object_resource)


def _write_config_unless_in_memory(write):
    """The emulator saves all of its metadata as one JSON file after every change, which makes a write cost
    time in the number of objects stored (a test of thousands of objects: minutes). In memory, nothing ever
    reads that file back: skipped."""

    def written(storage):
        if not storage._use_memory_fs:
            write(storage)

    return written


Storage._write_config_to_file = _write_config_unless_in_memory(Storage._write_config_to_file)
# One request at a time, as the emulator's storage is not thread-safe; but clients working in parallel (the
# publishing's copies, the lock's racers) queue rather than see their connections refused past 5 waiting.
server.HTTPServer.request_queue_size = 128
# A client stopped in the middle of sending a request (a launcher's SIGTERM or Ctrl-C lands while it writes an
# object) leaves its connection open and the request unfinished; the one-at-a-time server would wait on it for
# ever, and every other client with it, where Cloud Storage serves each connection on its own. A connection that
# sends nothing for this long is dropped (BaseHTTPRequestHandler answers its timeout by closing it).
from gcp_storage_emulator.server import RequestHandler  # noqa: E402

RequestHandler.timeout = 10

if __name__ == "__main__":
    from gcp_storage_emulator.__main__ import main  # imports the server, which takes the wrapped handlers

    sys.exit(main())
