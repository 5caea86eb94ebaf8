"""A real S3-compatible HTTP server on loopback for tests and benchmarks, with a counting,
fault-injecting proxy in front of it.

``S3Server`` starts moto's standalone server as a child process on a free loopback port, and
stops it. moto checks ``If-None-Match: *`` and then writes, two steps that concurrent requests
can interleave, so two conditional creates of one key can both succeed (a store that breaks
live datasets, which ``probe_conditional_create`` detects). S3 makes the check and the write
one atomic step; so does this server, by running moto's own WSGI application behind a lock
taken by conditional PUTs (``serve``; ``linearizable=False`` runs moto as it comes, for the
test that the probe refuses it). ``S3Proxy`` is an HTTP proxy between a client and that
server: it counts every request and the body bytes of every response (the bytes a rank
fetched, as the server side sees them), and on a chosen fraction of requests it answers ``503
SlowDown`` or drops the connection (before answering, or halfway through the body), so that
retries can be tested against real sockets. Clients reach the proxy through
``AWS_ENDPOINT_URL`` like any S3 endpoint; nothing in the client is mocked.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "zerobatch-test",
    "AWS_SECRET_ACCESS_KEY": "zerobatch-test-secret",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
}
"""Dummy credentials: moto accepts any signature, and the clients need some to sign with."""

SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """moto's S3-compatible server as a child process on a free loopback port."""

    def __init__(self, *, linearizable: bool = True) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        # Objects stay in memory: moto spools larger ones to disk and reads the whole object
        # back for every ranged GET, which would make a range's cost the object's size.
        env = {**os.environ, **CREDENTIALS, "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(2**30)}
        command = ["-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        if linearizable:
            command = ["-m", "tests.s3server", str(self.port)]
        self._process = subprocess.Popen(
            [sys.executable, *command],
            cwd=Path(__file__).resolve().parent.parent,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        atexit.register(self.stop)  # a script that fails before stopping it leaves no server
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/", timeout=2):
                    break
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the S3 test server did not start") from None
                time.sleep(0.1)

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (moto needs no signature for this)."""
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=30):
            pass

    def stop(self) -> None:
        """Stop the server (idempotent)."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


class S3Proxy:
    """A counting proxy to ``upstream`` that injects faults on a fraction of requests.

    ``slowdown`` is the fraction answered ``503 SlowDown``, ``drop`` the fraction whose
    connection is closed before any answer, ``cut`` the fraction whose response body is cut
    off halfway; draws come from ``random.Random(seed)``. ``counts`` holds ``requests``,
    ``gets``, ``get_bytes`` (response body bytes of GET requests) and the injected faults.
    """

    def __init__(
        self,
        upstream: str,
        *,
        slowdown: float = 0.0,
        drop: float = 0.0,
        cut: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.slowdown, self.drop, self.cut = slowdown, drop, cut
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.reset()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                proxy.handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward  # noqa: N815

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def reset(self) -> None:
        """Zero the counters and empty the log."""
        with self._lock:
            self.log: list[tuple[str, str, int]] = []
            """Every request answered by the upstream: method, path, response body bytes."""
            self.counts = dict.fromkeys(
                ("requests", "gets", "get_bytes", "slowdowns", "drops", "cuts"), 0
            )

    def _count(self, **amounts: int) -> None:
        with self._lock:
            for key, value in amounts.items():
                self.counts[key] += value

    def _fault(self) -> str | None:
        with self._lock:
            x = self._random.random()
        if x < self.slowdown:
            return "slowdown"
        if x < self.slowdown + self.drop:
            return "drop"
        if x < self.slowdown + self.drop + self.cut:
            return "cut"
        return None

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        """Serve one request: a fault, or the upstream's answer."""
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        self._count(requests=1)
        fault = self._fault()
        if fault == "slowdown":
            self._count(slowdowns=1)
            handler.send_response(503, "Slow Down")
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(SLOWDOWN)))
            handler.end_headers()
            handler.wfile.write(SLOWDOWN)
            return
        if fault == "drop":
            self._count(drops=1)
            handler.close_connection = True
            with contextlib.suppress(OSError):
                handler.connection.shutdown(socket.SHUT_RDWR)
            return
        connection = http.client.HTTPConnection(self.upstream, timeout=120)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() != "connection"}
            connection.request(handler.command, handler.path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        if handler.command == "GET":
            self._count(gets=1, get_bytes=len(data))
        with self._lock:
            self.log.append((handler.command, handler.path.split("?")[0], len(data)))
        handler.send_response(response.status, response.reason)
        skip = ("connection", "transfer-encoding", "content-length")
        for key, value in response.getheaders():
            if key.lower() not in skip or (handler.command == "HEAD" and key.lower() == skip[2]):
                handler.send_header(key, value)
        if handler.command != "HEAD":
            handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if fault == "cut" and handler.command == "GET" and len(data) > 1:
            self._count(cuts=1)
            handler.wfile.write(data[: len(data) // 2])
            handler.wfile.flush()
            handler.close_connection = True
            with contextlib.suppress(OSError):
                handler.connection.shutdown(socket.SHUT_RDWR)
            return
        if handler.command != "HEAD":
            handler.wfile.write(data)

    def stop(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def environment(endpoint: str) -> Iterator[None]:
    """``AWS_*`` variables that point S3 clients at ``endpoint`` with the dummy credentials."""
    values = {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true"}
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def serve(port: int) -> None:
    """Run moto's S3 application on ``127.0.0.1:port``, conditional PUTs made atomic."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import run_simple

    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def linearized(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        conditional = environ.get("HTTP_IF_NONE_MATCH") or environ.get("HTTP_IF_MATCH")
        if environ.get("REQUEST_METHOD") == "PUT" and conditional:
            with lock:  # the check and the write as one step, as S3 does them
                return list(app(environ, start_response))
        result: Iterable[bytes] = app(environ, start_response)
        return result

    run_simple("127.0.0.1", port, linearized, threaded=True)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
