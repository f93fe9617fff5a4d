"""A fault-injecting HTTP proxy on 127.0.0.1 in front of the GCS emulator.

Point STORAGE_EMULATOR_HOST at `FaultProxy.url` and every request passes
through to the emulator, except those a rule fails: the first `times` GET
requests that name a chosen object get a 503, 429 or other status with GCS's
JSON error body, or their connection is reset ("reset": no response at all).
Later requests for the object pass through. `requests` and `injected` count
what happened, per object name.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# /storage/v1/b/BUCKET/o/NAME (metadata) and /download/storage/v1/b/BUCKET/o/NAME?alt=media (bytes)
_OBJECT = re.compile(r"^(?:/download)?/storage/v1/b/(?P<bucket>[^/]+)/o/(?P<name>[^/?]+)$")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
               "content-length"}
RESET = "reset"


class _Server(ThreadingHTTPServer):
    daemon_threads = True

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
        self.injected: Counter = Counter()  # (object name, how) -> failures sent
        self._server = _Server(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    def fail(self, name: str, how: int | str, times: int | None = 1) -> None:
        """Fail the first `times` GET requests naming the object `name` (None: all of them)."""
        self._rules[name] = _Rule(how, times)

    def clear(self) -> None:
        """Pass every request on from now on."""
        self._rules.clear()

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _fault(self, method: str, path: str) -> int | str | None:
        """What to do instead of passing the request on, if anything; counts it."""
        match = _OBJECT.match(urllib.parse.urlsplit(path).path)
        if method != "GET" or not match:
            return None
        name = urllib.parse.unquote(match["name"])
        with self._lock:
            self.requests[name] += 1
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
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                upstream = HTTPConnection(proxy.upstream, timeout=60)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
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
                    upstream.close()

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _serve

        return Handler
