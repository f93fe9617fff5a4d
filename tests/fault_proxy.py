"""A fault-injecting, byte-counting HTTP proxy on 127.0.0.1 in front of the GCS emulator.

Point STORAGE_EMULATOR_HOST at `FaultProxy.url` and every request passes
through to the emulator, except those a rule fails: the first `times` GET
requests that name a chosen object get a 503, 429 or other status with GCS's
JSON error body, or their connection is reset ("reset": no response at all).
Later requests for the object pass through. `requests` and `injected` count
what happened, per object name. `read_latency_s` delays every read of an
object's bytes (alt=media) by that much before it is passed on, as a store far
away does (the benchmarks' latency case). `refuse_bucket_metadata` answers
403 to every request for a bucket's metadata (`storage.buckets.get`), as GCS
answers an account with object roles only (roles/storage.objectAdmin);
`refused` counts them. `throttle(per_s, burst)` answers 429 to object reads
above that rate (a token bucket), as a cold bucket does; `throttled` counts them.

It also measures the traffic that passed through, per object name (see `Traffic`):
- `uploaded`: the object's bytes in request bodies sent upstream, for every kind
  of upload google-cloud-storage and Beam make: `uploadType=media`, `multipart`
  (the media part only, not the JSON metadata part) and `resumable` (the PUT
  chunks, attributed to the object named when the session was opened);
- `downloaded`: the bytes of media response bodies (`alt=media`, ranged or not);
- `calls`: requests by kind and object name: upload (each request: a resumable
  upload is its session's POST and one PUT per chunk), download, metadata, list
  (named by its prefix), compose, rewrite, copy (named by their destination),
  delete, also the ones inside a `/batch` request; bucket (a bucket's metadata,
  named by the bucket) and other.
`latency_s` delays every request so (a round trip to a store far away).
`in_flight` and `max_in_flight` count the requests being passed on at once (a client
working in parallel shows more than one).
Server-side operations (compose, rewrite, copy) move no bytes through the
client, so they count as calls, never as uploaded or downloaded bytes. Only
requests passed on to the emulator are counted there, not failures a rule sent.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# /storage/v1/b/BUCKET/o/NAME (metadata) and /download/storage/v1/b/BUCKET/o/NAME?alt=media (bytes)
_OBJECT = re.compile(r"^(?:/download)?/storage/v1/b/(?P<bucket>[^/]+)/o/(?P<name>[^/?]+)$")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
               "content-length"}
RESET = "reset"
# /upload/storage/v1/b/BUCKET/o?uploadType=... (and the resumable session's PUTs to the same path)
_UPLOAD = re.compile(r"^/upload/storage/v1/b/(?P<bucket>[^/]+)/o$")
# Traffic accounting. An object name is %-encoded in a path, except in a mediaLink (what BlobReader downloads
# from), which keeps its slashes: names here may hold "/".
# /storage/v1/b/BUCKET/o/SOURCE/(rewriteTo|copyTo)/b/BUCKET/o/DESTINATION and /storage/v1/b/BUCKET/o/NAME/compose
_SERVER_SIDE = re.compile(r"^/storage/v1/b/(?P<bucket>[^/]+)/o/(?P<name>.+?)"
                          r"(?:/(?P<op>rewriteTo|copyTo)/b/[^/]+/o/(?P<dest>.+)|/(?P<compose>compose))$")
_ANY_OBJECT = re.compile(r"^(?P<download>/download)?/storage/v1/b/(?P<bucket>[^/]+)/o/(?P<name>.+)$")
_LIST = re.compile(r"^/storage/v1/b/(?P<bucket>[^/]+)/o$")
# An object's mediaLink (what BlobReader downloads from) holds the host it was uploaded through, kept by the
# emulator: an object uploaded straight to it, or through another proxy, would be read past this one.
_MEDIA_LINK = re.compile(rb'("mediaLink"\s*:\s*")https?://[^/"]+(/download/)')
_BUCKET = re.compile(r"^/storage/v1/b/(?P<bucket>[^/]+)$")
# a request line inside a /batch/storage/v1 body: "DELETE /storage/v1/b/B/o/NAME?x=y HTTP/1.1"
_BATCH_LINE = re.compile(rb"^(?P<method>[A-Z]+) (?:https?://[^/\s]+)?(?P<path>/\S*) HTTP/1\.[01]\r?$", re.MULTILINE)
UPLOAD, DOWNLOAD, METADATA, LIST, COMPOSE, REWRITE, COPY, DELETE, BUCKET, OTHER = (
    "upload", "download", "metadata", "list", "compose", "rewrite", "copy", "delete", "bucket", "other")


@dataclass
class Traffic:
    """What passed through the proxy, per object name (the name within its bucket)."""

    uploaded: Counter = field(default_factory=Counter)  # name -> object bytes sent upstream in request bodies
    downloaded: Counter = field(default_factory=Counter)  # name -> media bytes received in response bodies
    calls: Counter = field(default_factory=Counter)  # (kind, name) -> requests; a list's name is its prefix

    def uploaded_under(self, prefix: str) -> int:
        return sum(n for name, n in self.uploaded.items() if name.startswith(prefix))

    def downloaded_under(self, prefix: str) -> int:
        return sum(n for name, n in self.downloaded.items() if name.startswith(prefix))

    def calls_of(self, kind: str, prefix: str = "") -> int:
        return sum(n for (k, name), n in self.calls.items() if k == kind and name.startswith(prefix))

    def report(self, prefix: str = "") -> str:
        """One line per object below `prefix`: its uploaded and downloaded bytes and its calls by kind."""
        names = sorted({name for name in (*self.uploaded, *self.downloaded, *(n for _, n in self.calls))
                        if name.startswith(prefix)})
        lines = []
        for name in names:
            calls = ", ".join(f"{kind} x{n}" for (kind, other), n in sorted(self.calls.items()) if other == name)
            lines.append(f"  {name}: up {self.uploaded[name]} B, down {self.downloaded[name]} B ({calls})")
        return "\n".join(lines)


def _query(path: str) -> dict[str, str]:
    return {key: values[0] for key, values in urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).items()}


def _multipart_parts(content_type: str, body: bytes) -> list[bytes]:
    """The bodies of the parts of a multipart/related or multipart/mixed `body` (their headers stripped)."""
    boundary = re.search(r'boundary="?([^";]+)"?', content_type)
    if not boundary:
        return []
    delimiter = b"--" + boundary.group(1).encode()
    parts = []
    for chunk in body.split(delimiter)[1:]:
        if chunk.startswith(b"--"):  # the closing delimiter
            break
        head, sep, content = chunk.partition(b"\r\n\r\n")
        if not sep:
            head, sep, content = chunk.partition(b"\n\n")
        # the CRLF before the next delimiter belongs to the delimiter (RFC 2046)
        parts.append(content[:-2] if content.endswith(b"\r\n") else content[:-1] if content.endswith(b"\n")
                     else content)
    return parts


def _named(body: bytes | None) -> str | None:
    """The object name in a JSON metadata body, if any."""
    try:
        return json.loads(body or b"{}").get("name")
    except (ValueError, AttributeError):
        return None


def classify(method: str, path: str, headers, body: bytes | None) -> list[tuple[str, str]]:
    """The (kind, object name) of each operation a request makes; a /batch request makes several."""
    url_path = urllib.parse.urlsplit(path).path
    query = _query(path)
    if url_path.startswith("/batch/"):
        ops = []
        for line in _BATCH_LINE.finditer(body or b""):
            ops += classify(line["method"].decode(), line["path"].decode(), {}, None)
        return ops
    if _UPLOAD.match(url_path):
        return [(UPLOAD, query.get("name", ""))]  # the name may be in the body: see Traffic accounting
    match = _SERVER_SIDE.match(url_path)
    if match:
        if match["compose"]:
            return [(COMPOSE, urllib.parse.unquote(match["name"]))]
        kind = REWRITE if match["op"] == "rewriteTo" else COPY
        return [(kind, urllib.parse.unquote(match["dest"]))]
    match = _LIST.match(url_path)
    if match and method == "GET":
        return [(LIST, query.get("prefix", ""))]
    match = _BUCKET.match(url_path)
    if match:  # the bucket's metadata: its name stands for the object name
        return [(BUCKET, match["bucket"])]
    match = _ANY_OBJECT.match(url_path)
    if match:
        name = urllib.parse.unquote(match["name"])
        if method == "DELETE":
            return [(DELETE, name)]
        if method == "GET" and (match["download"] or query.get("alt") == "media"):
            return [(DOWNLOAD, name)]
        return [(METADATA, name)]
    return [(OTHER, url_path)]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # clients working in parallel connect at once

    def handle_error(self, request, client_address):  # a client that hung up (after a reset) is no error
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass
class _Rule:
    how: int | str  # an HTTP status, or RESET
    times: int | None  # None: every request


class FaultProxy:
    """A pass-through proxy to `upstream` (http://host:port) that fails chosen object reads."""

    def __init__(self, upstream: str):
        self.upstream = urllib.parse.urlsplit(upstream).netloc
        self._rules: dict[str, _Rule] = {}
        self._lock = threading.Lock()
        self.requests: Counter = Counter()  # object name -> GET requests that named it
        # object name -> those of them that read its bytes (alt=media), not its metadata: a BlobReader's
        # metadata GET is retried by google-api-core's own backoff, a number of times that depends on timing
        self.media_requests: Counter = Counter()
        self.injected: Counter = Counter()  # (object name, how) -> failures sent
        self.traffic = Traffic()  # the requests passed on to the emulator, and their bytes
        self._sessions: dict[str, str] = {}  # resumable upload id -> object name
        self.read_latency_s = 0.0  # added before each media download is passed on
        self.refuse_bucket_metadata = False  # True: 403 to GET/PATCH/... /storage/v1/b/BUCKET
        self.refused: Counter = Counter()  # bucket -> metadata requests refused
        self.throttled = 0  # object reads answered 429 by the rate limit
        self._rate: tuple[float, float] | None = None  # (reads a second, burst) of `throttle`
        self._tokens, self._filled = 0.0, 0.0
        self.latency_s = 0.0  # added before every request is passed on: a store a network round trip away
        # requests being passed on at this moment, and the most at once so far: whether a client works in parallel
        self.in_flight = 0
        self.max_in_flight = 0
        self._server = _Server(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    def fail(self, name: str, how: int | str, times: int | None = 1) -> None:
        """Fail the first `times` GET requests naming the object `name` (None: all of them)."""
        self._rules[name] = _Rule(how, times)

    def throttle(self, per_s: float, burst: float) -> None:
        """Answer 429 to object reads (GETs of an object's bytes or metadata) above `per_s` a second."""
        with self._lock:
            self._rate, self._tokens, self._filled = (per_s, burst), burst, time.monotonic()

    def _over_rate(self) -> bool:  # under self._lock
        if self._rate is None:
            return False
        per_s, burst = self._rate
        now = time.monotonic()
        self._tokens, self._filled = min(burst, self._tokens + (now - self._filled) * per_s), now
        if self._tokens < 1:
            self.throttled += 1
            return True
        self._tokens -= 1
        return False

    def clear(self) -> None:
        """Pass every request on from now on."""
        self._rules.clear()

    def snapshot(self) -> Traffic:
        """A copy of what was counted so far (counting goes on)."""
        with self._lock:
            return Traffic(Counter(self.traffic.uploaded), Counter(self.traffic.downloaded),
                           Counter(self.traffic.calls))

    def reset_traffic(self) -> Traffic:
        """Start counting afresh; returns what was counted so far."""
        with self._lock:
            counted, self.traffic = self.traffic, Traffic()
        return counted

    def _account(self, method: str, path: str, headers, body: bytes | None, status: int, location: str | None,
                 data: bytes) -> None:
        """Count a request that was passed on, with the emulator's answer (status, Location header, body)."""
        query = _query(path)
        with self._lock:
            for kind, name in classify(method, path, headers, body):
                if kind == UPLOAD:
                    if "upload_id" in query:  # a chunk of a resumable upload (or a status query: no body)
                        name = self._sessions.get(query["upload_id"], name)
                        self.traffic.uploaded[name] += len(body or b"")
                    elif query.get("uploadType") == "resumable":  # opens the session; the metadata is no data
                        name = name or _named(body) or ""
                        session = _query(location or "").get("upload_id")
                        if session:
                            self._sessions[session] = name
                    elif query.get("uploadType") == "multipart":  # JSON metadata part, then the media part
                        parts = _multipart_parts(headers.get("Content-Type", ""), body or b"")
                        name = name or (_named(parts[0]) if parts else None) or ""
                        self.traffic.uploaded[name] += len(parts[1]) if len(parts) > 1 else 0
                    else:  # uploadType=media: the body is the object
                        self.traffic.uploaded[name] += len(body or b"")
                elif kind == DOWNLOAD and status in (200, 206):
                    self.traffic.downloaded[name] += len(data)
                self.traffic.calls[(kind, name)] += 1

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _fault(self, method: str, path: str) -> int | str | None:
        """What to do instead of passing the request on, if anything; counts it."""
        bucket = _BUCKET.match(urllib.parse.urlsplit(path).path)
        if bucket and self.refuse_bucket_metadata:
            with self._lock:
                self.refused[bucket["bucket"]] += 1
            return 403
        match = _OBJECT.match(urllib.parse.urlsplit(path).path)
        if method != "GET" or not match:
            return None
        with self._lock:
            if self._over_rate():
                return 429
        name = urllib.parse.unquote(match["name"])
        media = path.startswith("/download/") or _query(path).get("alt") == "media"
        with self._lock:
            self.requests[name] += 1
            self.media_requests[name] += media
            rule = self._rules.get(name)
            if rule is None or (rule.times is not None and self.requests[name] > rule.times):
                return None
            self.injected[(name, rule.how)] += 1
            return rule.how

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _body(self) -> bytes | None:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else None

            def _serve(self) -> None:
                body = self._body()
                fault = proxy._fault(self.command, self.path)
                if fault == RESET:  # close with a TCP reset: the client sees "connection reset by peer"
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    return
                if fault is not None:
                    payload = json.dumps({"error": {"code": fault, "message": f"injected {fault}",
                                                    "errors": [{"message": f"injected {fault}"}]}}).encode()
                    self.send_response(fault)
                    self.send_header("Content-Type", "application/json; charset=UTF-8")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if proxy.read_latency_s and self.command == "GET" and (
                        self.path.startswith("/download/") or _query(self.path).get("alt") == "media"):
                    time.sleep(proxy.read_latency_s)
                if proxy.latency_s:
                    time.sleep(proxy.latency_s)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                upstream = HTTPConnection(proxy.upstream, timeout=60)
                with proxy._lock:
                    proxy.in_flight += 1
                    proxy.max_in_flight = max(proxy.max_in_flight, proxy.in_flight)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                    if response.getheader("Content-Type", "").startswith("application/json"):
                        data = _MEDIA_LINK.sub(rb"\g<1>" + proxy.url.encode() + rb"\g<2>", data)
                    # counted before the client has its answer: the counts are complete once its call returns
                    proxy._account(self.command, self.path, self.headers, body, response.status,
                                   response.getheader("Location"), data if self.command != "HEAD" else b"")
                    self.send_response(response.status, response.reason)
                    for key, value in response.getheaders():
                        if key.lower() in _HOP_BY_HOP:
                            continue
                        if key.lower() == "location":  # a resumable upload's session: through the proxy too
                            value = value.replace(proxy.upstream, proxy.url[len("http://"):])
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    with proxy._lock:
                        proxy.in_flight -= 1
                    upstream.close()

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _serve

        return Handler
