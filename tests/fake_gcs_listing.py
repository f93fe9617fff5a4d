"""A fake GCS JSON API on loopback that lists a huge synthetic bucket without storing it.

    with serve(classes=1000, per_class=10_000) as fake:   # 10 M objects, nothing held in memory
        env = fake.client_env(tmp_dir)                     # STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT, no credentials
        ...                                                # google-cloud-storage and Beam's gcsio list gs://b/in
        fake.stats()                                       # {"list_requests": ..., "objects_listed": ..., ...}

    python -m tests.fake_gcs_listing --classes 1000 --per_class 1000 --port 8123   # stand-alone

Bucket `b` (or the `bucket_name` given) holds `in/class_{c:04d}/img_{i:08d}.jpg` for c < classes and i < per_class,
or with `splits` `in/<split>/class_{c:04d}/img_{i:08d}.jpg` for each split; with `flat`, a flat folder of files
named by their labels, `in/class_{c:04d}_img_{i:08d}.jpg` (Oxford Pets' images/Abyssinian_1.jpg), but for the classes
in `folder_classes`, which stay folders among the files (`in/class_0003/img_{i:08d}.jpg`). `extras`, {name: bytes},
adds a few stored objects among the computed ones (a COCO export's annotation file beside its images).
Every name is computed from its index j = c * per_class + i; the names are all of one
length, so their sorted order is the index order and a prefix covers one range of
indices, found by binary search. A page token is the index the next page starts at, so
each page costs O(page size x log N), whatever its position in the listing. (With `extras`, a page token is
the name the next page starts at, and the computed names and the extras are merged in name order.)

What it answers (what google-cloud-storage 3.x and Beam 2.77's gcsio ask, read from
their code: `Client.list_blobs`, `Client.lookup_bucket`, `Blob.reload`, `Blob._get_download_url`,
`gcsio.BeamBlobReader`):

- `GET /storage/v1/b/b` : the bucket (any other bucket is a 404);
- `GET /storage/v1/b/b/o?prefix=&delimiter=&pageToken=&maxResults=&startOffset=&endOffset=` : a page of objects
  (maxResults at most 1000, the default), with `prefixes` when a delimiter is given and
  `nextPageToken` while more follow; `projection`, `fields`, `prettyPrint`, `userProject`
  and `includeTrailingDelimiter=false` are accepted and ignored (the full resource is sent);
- `GET /storage/v1/b/b/o/NAME` : one object's metadata, or a 404;
- `GET /download/storage/v1/b/b/o/NAME?alt=media` (and `/storage/v1/b/b/o/NAME?alt=media`):
  the same small valid JPEG for every object, honouring a `Range` header.

Anything else (uploads, deletes, other query parameters such as matchGlob) is answered 501
and printed to stderr, and counted in `stats()["unknown"]`, so a gap in the fake is
visible instead of looking like an empty listing.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import io
import json
import re
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

BUCKET = "b"
ROOT = "in"
MAX_RESULTS = 1000  # GCS's default and its maximum for objects.list
GENERATION = "1764460800000000"
TIMESTAMP = "2025-11-30T00:00:00.000Z"
PROJECT_NUMBER = "123456789"

# Query parameters that change nothing in what this fake sends.
_IGNORED = {"projection", "fields", "prettyPrint", "userProject", "alt", "generation", "ifGenerationMatch",
            "ifMetagenerationMatch"}
_LIST_PARAMS = {"prefix", "delimiter", "pageToken", "maxResults", "includeTrailingDelimiter", "startOffset",
                "endOffset"} | _IGNORED


def make_jpeg(width: int = 480, height: int = 360) -> bytes:
    """A small photo-like JPEG (a gradient with a disc), made once; every object has these bytes."""
    from PIL import Image, ImageDraw

    image = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    ImageDraw.Draw(image).ellipse((width // 4, height // 4, width // 2, height // 2), fill=(200, 60, 40))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    return out.getvalue()


def _crc32c_b64(data: bytes) -> str:
    import google_crc32c

    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode()


class SyntheticBucket:
    """`classes` x `per_class` object names, computed from their index; nothing is stored per object.

    With `splits` (e.g. ("train", "validation")), each split folder holds all the classes:
    `in/<split>/class_{c:04d}/img_{i:08d}.jpg`, classes x per_class names per split. With `flat`, each class
    is a run of files `class_{c:04d}_img_{i:08d}.jpg` directly in its folder, but those of `folder_classes`, which
    are folders (the names keep one length, so index order is still name order).
    """

    def __init__(self, classes: int, per_class: int, root: str = ROOT, splits: tuple[str, ...] = (),
                 flat: bool = False, folder_classes: tuple[int, ...] = (), extras: dict[str, bytes] | None = None):
        if not 0 < classes <= 10_000 or not 0 < per_class <= 100_000_000:
            raise ValueError("classes must be in 1..10000 and per_class in 1..10^8 (the names' fixed widths)")
        if any(not split or "/" in split for split in splits) or len(set(splits)) != len(splits):
            raise ValueError(f"splits must be distinct folder names without '/': {splits!r}")
        self.classes = classes
        self.per_class = per_class
        self.separators = ["/" if not flat or c in folder_classes else "_" for c in range(classes)]
        self.root = root
        # In the order of their names' bytes, so that index order stays name order.
        self.splits = sorted(splits, key=lambda split: (split + "/").encode())
        self._folders = [f"{root}/{split}" for split in self.splits] or [root]
        self.count = len(self._folders) * classes * per_class
        split_part = "(?:(" + "|".join(re.escape(split) for split in self.splits) + ")/)" if splits else "()"
        self._pattern = re.compile(re.escape(root) + "/" + split_part + r"class_(\d{4})([/_])img_(\d{8})\.jpg")
        self.extras = dict(extras or {})
        self._extra_names = sorted(self.extras)
        if any(self.index(name) is not None for name in self.extras):
            raise ValueError("an extra object may not have the name of a computed one")

    def name(self, j: int) -> str:
        group, rest = divmod(j, self.classes * self.per_class)
        c, i = divmod(rest, self.per_class)
        return f"{self._folders[group]}/class_{c:04d}{self.separators[c]}img_{i:08d}.jpg"

    def index(self, name: str) -> int | None:
        """The index of an object's name, or None when there is no such object."""
        match = self._pattern.fullmatch(name)
        if not match:
            return None
        group = self.splits.index(match.group(1)) if self.splits else 0
        c, i = int(match.group(2)), int(match.group(4))
        if c >= self.classes or i >= self.per_class or match.group(3) != self.separators[c]:
            return None
        return (group * self.classes + c) * self.per_class + i

    def _first(self, above) -> int:
        """The first index j (0..count) for which above(name(j)) holds; `above` is monotonic."""
        lo, hi = 0, self.count
        while lo < hi:
            mid = (lo + hi) // 2
            if above(self.name(mid)):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def range_of(self, prefix: str) -> tuple[int, int]:
        """[start, end) of the indices whose names start with `prefix`."""
        n = len(prefix)
        return self._first(lambda name: name >= prefix), self._first(lambda name: name[:n] > prefix)

    def data(self, name: str, jpeg: bytes) -> bytes | None:
        """An object's bytes (`jpeg` for a computed one), None when there is no such object."""
        if name in self.extras:
            return self.extras[name]
        return None if self.index(name) is None else jpeg

    def merged_page(self, prefix: str, delimiter: str, token: str, max_results: int, start_offset: str = "",
                    end_offset: str = "") -> tuple[list[str], list[str], str | None]:
        """(object names, common prefixes, the name the next page starts at or None) of one page of a listing of
        the computed names and the extras together; `token`: the name this page starts at ('' for the first)."""
        lower = max(prefix, start_offset, token)
        j = self._first(lambda name: name >= lower)
        end = self.range_of(prefix)[1]
        if end_offset:
            end = min(end, self._first(lambda name: name >= end_offset))
        k = bisect.bisect_left(self._extra_names, lower)

        def extra(k: int) -> str | None:
            name = self._extra_names[k] if k < len(self._extra_names) else None
            inside = name is not None and name.startswith(prefix) and (not end_offset or name < end_offset)
            return name if inside else None

        names: list[str] = []
        prefixes: list[str] = []
        while True:
            computed = self.name(j) if j < end else None
            candidates = [name for name in (computed, extra(k)) if name is not None]
            if not candidates:
                return names, prefixes, None
            name = min(candidates)
            if len(names) + len(prefixes) >= max_results:
                return names, prefixes, name
            cut = name.find(delimiter, len(prefix)) if delimiter else -1
            if cut < 0:
                names.append(name)
                if name == computed:
                    j += 1
                else:
                    k += 1
                continue
            common = name[:cut + len(delimiter)]
            prefixes.append(common)
            j = max(j, self._first(lambda other, common=common: other[:len(common)] > common))
            while k < len(self._extra_names) and self._extra_names[k][:len(common)] <= common:
                k += 1

    def page(self, prefix: str, delimiter: str, start: int,
             max_results: int, start_offset: str = "", end_offset: str = "") -> tuple[list[int], list[str], int | None]:
        """(object indices, common prefixes, next start index or None) of one page of a listing; names from
        `start_offset` (inclusive) and before `end_offset`, as GCS's startOffset and endOffset."""
        begin, end = self.range_of(prefix)
        if start_offset:
            begin = max(begin, self._first(lambda name: name >= start_offset))
        if end_offset:
            end = min(end, self._first(lambda name: name >= end_offset))
        j = max(start, begin)
        items: list[int] = []
        prefixes: list[str] = []
        while j < end and len(items) + len(prefixes) < max_results:
            name = self.name(j)
            cut = name.find(delimiter, len(prefix)) if delimiter else -1
            if cut < 0:
                items.append(j)
                j += 1
            else:
                common = name[:cut + len(delimiter)]
                prefixes.append(common)
                j = self._first(lambda other, common=common: other[:len(common)] > common)
        return items, prefixes, (j if j < end else None)


class FakeGcs(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, bucket: SyntheticBucket, port: int = 0, quiet_unknown: bool = False,
                 bucket_name: str = BUCKET):
        super().__init__(("127.0.0.1", port), _Handler)
        self.bucket = bucket
        self.bucket_name = bucket_name
        self.jpeg = make_jpeg()
        self.md5 = base64.b64encode(hashlib.md5(self.jpeg).digest()).decode()
        self.crc32c = _crc32c_b64(self.jpeg)
        self.counts: Counter = Counter()
        self.unknown: list[str] = []
        self.level_range_starts: set[str] = set()  # the startOffset of each listing a level deep from a name on
        self.part_range_starts: set[str] = set()  # the startOffset of each whole listing of a folder's part
        self.quiet_unknown = quiet_unknown
        self._lock = threading.Lock()

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n

    def stats(self) -> dict:
        with self._lock:
            return {**{key: self.counts[key] for key in
                       ("list_requests", "objects_listed", "prefixes_listed", "bucket_gets", "metadata_gets",
                        "downloads", "not_found", "level_range_lists")},
                    "level_range_starts": sorted(self.level_range_starts),
                    "part_range_starts": sorted(self.part_range_starts),
                    "unknown": list(self.unknown)}

    def reset_stats(self) -> None:
        with self._lock:
            self.counts.clear()
            self.unknown.clear()
            self.level_range_starts.clear()
            self.part_range_starts.clear()

    def client_env(self, config_dir: str) -> dict:
        """What a process (a client of this one, or a subprocess) needs to use this fake and nothing else.

        `config_dir`: an empty folder for gcloud's configuration, so no user credentials are picked up.
        Beam's GCS file system still looks for credentials unless the run passes --no_auth
        (`pipeline.cloud.skip_credential_lookup` in-process).
        """
        closed = closed_port()
        return {
            "STORAGE_EMULATOR_HOST": self.host,
            "NO_GCE_CHECK": "True",
            "GCE_METADATA_HOST": f"127.0.0.1:{closed}",
            "GCE_METADATA_IP": f"127.0.0.1:{closed}",
            "CLOUDSDK_CONFIG": config_dir,
            "GOOGLE_CLOUD_PROJECT": "test-project",
        }

    def object_resource(self, name: str) -> str:
        quoted = quote(name, safe="")
        host, size, md5, crc32c, bucket = self.host, len(self.jpeg), self.md5, self.crc32c, self.bucket_name
        content_type = "image/jpeg"
        if name in self.bucket.extras:
            data = self.bucket.extras[name]
            size, md5, crc32c = len(data), base64.b64encode(hashlib.md5(data).digest()).decode(), _crc32c_b64(data)
            content_type = "application/octet-stream"
        return (
            f'{{"kind":"storage#object","id":"{bucket}/{name}/{GENERATION}",'
            f'"selfLink":"{host}/storage/v1/b/{bucket}/o/{quoted}",'
            f'"mediaLink":"{host}/download/storage/v1/b/{bucket}/o/{quoted}?generation={GENERATION}&alt=media",'
            f'"name":"{name}","bucket":"{bucket}","generation":"{GENERATION}","metageneration":"1",'
            f'"contentType":"{content_type}","storageClass":"STANDARD","size":"{size}","md5Hash":"{md5}",'
            f'"crc32c":"{crc32c}","etag":"CAE=","timeCreated":"{TIMESTAMP}","updated":"{TIMESTAMP}",'
            f'"timeStorageClassUpdated":"{TIMESTAMP}"}}'
        )


def use_in_process(server: FakeGcs, monkeypatch, config_dir: str) -> None:
    """Point this process's GCS clients (google-cloud-storage, Beam's gcsio) at `server` for a test, with no
    credentials looked up (what --no_auth does)."""
    from pipeline.cloud import skip_credential_lookup

    for name, value in server.client_env(config_dir).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    skip_credential_lookup()


def closed_port() -> int:
    """A loopback port nothing listens on (a metadata-server probe there fails at once)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeGcs

    def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler's signature
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json; charset=UTF-8",
              headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        if status == 404:
            self.server.count("not_found")
        self._send(status, json.dumps({"error": {"code": status, "message": message,
                                                 "errors": [{"message": message, "reason": "notFound"
                                                             if status == 404 else "notImplemented"}]}}).encode())

    def _unknown(self, why: str) -> None:
        line = f"{self.command} {self.path}: {why}"
        with self.server._lock:
            self.server.unknown.append(line)
        if not self.server.quiet_unknown:
            print(f"fake_gcs_listing: 501 for {line}", file=sys.stderr, flush=True)
        self._error(501, f"not implemented by tests/fake_gcs_listing.py: {line}")

    def _drain(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)

    def do_POST(self):  # noqa: N802
        self._drain()
        self._unknown("uploads and other writes are not supported")

    do_PUT = do_POST  # noqa: N815
    do_PATCH = do_POST  # noqa: N815
    do_DELETE = do_POST  # noqa: N815

    def do_GET(self):  # noqa: N802
        bucket = self.server.bucket_name
        split = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(split.query, keep_blank_values=True).items()}
        path = split.path
        if path == "/":
            self._send(200, b"OK", "text/plain")
            return
        for media_root in (f"/download/storage/v1/b/{bucket}/o/", f"/storage/v1/b/{bucket}/o/"):
            if path.startswith(media_root) and (media_root.startswith("/download") or query.get("alt") == "media"):
                self._download(unquote(path[len(media_root):]), query)
                return
        if path == f"/storage/v1/b/{bucket}/o":
            self._list(query)
        elif path.startswith(f"/storage/v1/b/{bucket}/o/"):
            self._metadata(unquote(path[len(f"/storage/v1/b/{bucket}/o/"):]), query)
        elif path == f"/storage/v1/b/{bucket}":
            self._check_params(query, _IGNORED) and self._bucket()
        elif re.fullmatch(r"/storage/v1/b/[^/]+", path):
            self._error(404, f"The specified bucket does not exist: {unquote(path.rsplit('/', 1)[1])}")
        else:
            self._unknown("no such route in the fake")

    do_HEAD = do_GET  # noqa: N815

    def _check_params(self, query: dict, allowed: set) -> bool:
        extra = sorted(set(query) - allowed)
        if query.get("includeTrailingDelimiter", "false").lower() == "true":
            extra.append("includeTrailingDelimiter=true")
        if extra:
            self._unknown(f"query parameters {extra} are not supported")
            return False
        return True

    def _bucket(self) -> None:
        bucket = self.server.bucket_name
        self.server.count("bucket_gets")
        self._send(200, json.dumps({
            "kind": "storage#bucket", "id": bucket, "selfLink": f"{self.server.host}/storage/v1/b/{bucket}",
            "projectNumber": PROJECT_NUMBER, "name": bucket, "timeCreated": TIMESTAMP, "updated": TIMESTAMP,
            "metageneration": "1", "location": "US", "locationType": "multi-region", "storageClass": "STANDARD",
            "etag": "CAE=",
        }).encode())

    def _list(self, query: dict) -> None:
        if not self._check_params(query, _LIST_PARAMS):
            return
        bucket = self.server.bucket
        try:
            max_results = max(1, min(int(query.get("maxResults") or MAX_RESULTS), MAX_RESULTS))
            listed = (query.get("prefix", ""), query.get("delimiter", ""))
            offsets = (query.get("startOffset", ""), query.get("endOffset", ""))
            if bucket.extras:
                names, prefixes, following = bucket.merged_page(*listed, query.get("pageToken", ""), max_results,
                                                                *offsets)
            else:
                items, prefixes, following = bucket.page(*listed, int(query.get("pageToken") or 0), max_results,
                                                         *offsets)
                names = [bucket.name(j) for j in items]
        except ValueError:
            self._send(400, b'{"error":{"code":400,"message":"Invalid pageToken or maxResults"}}')
            return
        self.server.count("list_requests")
        if query.get("delimiter") and query.get("startOffset"):  # a part of a level (listing.list_folder_part)
            self.server.count("level_range_lists")
            with self.server._lock:
                self.server.level_range_starts.add(query["startOffset"])
        elif query.get("startOffset") and not query.get("maxResults"):  # a part of a folder (listing.list_part)
            with self.server._lock:
                self.server.part_range_starts.add(query["startOffset"])
        self.server.count("objects_listed", len(names))
        self.server.count("prefixes_listed", len(prefixes))
        parts = ['"kind":"storage#objects"']
        if following is not None:
            parts.append(f'"nextPageToken":{json.dumps(str(following))}')
        if prefixes:
            parts.append('"prefixes":' + json.dumps(prefixes))
        if names:
            parts.append('"items":[' + ",".join(self.server.object_resource(name) for name in names) + "]")
        self._send(200, ("{" + ",".join(parts) + "}").encode())

    def _metadata(self, name: str, query: dict) -> None:
        if not self._check_params(query, _IGNORED):
            return
        self.server.count("metadata_gets")
        if self.server.bucket.data(name, self.server.jpeg) is None:
            self._error(404, f"No such object: {self.server.bucket_name}/{name}")
            return
        self._send(200, self.server.object_resource(name).encode())

    def _download(self, name: str, query: dict) -> None:
        if not self._check_params(query, _IGNORED):
            return
        data = self.server.bucket.data(name, self.server.jpeg)
        if data is None:
            self._error(404, f"No such object: {self.server.bucket_name}/{name}")
            return
        self.server.count("downloads")
        crc32c, md5 = self.server.crc32c, self.server.md5
        if data is not self.server.jpeg:
            crc32c, md5 = _crc32c_b64(data), base64.b64encode(hashlib.md5(data).digest()).decode()
        headers = {
            "X-Goog-Hash": f"crc32c={crc32c},md5={md5}",
            "X-Goog-Generation": GENERATION,
            "X-Goog-Metageneration": "1",
            "X-Goog-Stored-Content-Length": str(len(data)),
            "X-Goog-Stored-Content-Encoding": "identity",
            "ETag": "CAE=",
            "Accept-Ranges": "bytes",
        }
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "").strip())
        if wanted:
            first = int(wanted.group(1))
            last = min(int(wanted.group(2)) if wanted.group(2) else len(data) - 1, len(data) - 1)
            if first >= len(data):
                self._send(416, b'{"error":{"code":416,"message":"Requested range not satisfiable"}}',
                           headers={"Content-Range": f"bytes */{len(data)}"})
                return
            headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
            self._send(206, data[first:last + 1], "image/jpeg", headers)
            return
        self._send(200, data, "image/jpeg", headers)


@contextmanager
def serve(classes: int, per_class: int, port: int = 0, quiet_unknown: bool = False, bucket_name: str = BUCKET,
          splits: tuple[str, ...] = (), flat: bool = False, folder_classes: tuple[int, ...] = (),
          extras: dict[str, bytes] | None = None):
    """A FakeGcs serving classes x per_class objects (per split) in gs://`bucket_name` on a background thread
    (`flat`, `folder_classes`, `extras`: as SyntheticBucket's)."""
    server = FakeGcs(SyntheticBucket(classes, per_class, splits=splits, flat=flat, folder_classes=folder_classes,
                                     extras=extras), port, quiet_unknown, bucket_name)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
                              name="fake-gcs-listing")
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--per_class", type=int, default=1000)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bucket", default=BUCKET)
    parser.add_argument("--splits", default="", help="comma-separated split folders, e.g. train,validation")
    args = parser.parse_args(argv)
    splits = tuple(split for split in args.splits.split(",") if split)
    with serve(args.classes, args.per_class, args.port, bucket_name=args.bucket, splits=splits) as server:
        print(f"STORAGE_EMULATOR_HOST={server.host}  gs://{args.bucket}/{ROOT}: {server.bucket.count} objects",
              flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print(json.dumps(server.stats()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
