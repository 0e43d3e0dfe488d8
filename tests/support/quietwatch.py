"""A loopback HTTP server that answers a Kubernetes list and then holds every watch open, silent.

A watch on a quiet cluster sends nothing for minutes: a thread reading it is blocked in a read
until the server ends the watch. Tests use this to show that an owner's stop() breaks such a read
off, instead of leaving the thread to outlive its owner (and its test run).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from kubernetes import client as k8s


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        return

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        query = parse_qs(urlparse(self.path).query)
        if query.get("watch") == ["true"]:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            self.server.watching.set()
            self.server.closing.wait()  # never an event; the connection ends with the server
            return
        body = json.dumps({"kind": "List", "metadata": {"resourceVersion": "1"}, "items": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.watching = threading.Event()  # a watch request is being held
        self.closing = threading.Event()


@contextmanager
def quiet_watch_api() -> Iterator[tuple[k8s.ApiClient, threading.Event]]:
    """An API client for the server, and the event set once a watch is held open."""
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, name="quiet-watch-api", daemon=True)
    thread.start()
    configuration = k8s.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    api = k8s.ApiClient(configuration)
    try:
        yield api, server.watching
    finally:
        server.closing.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        api.close()
