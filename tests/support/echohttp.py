"""An echoing ``LeanHead`` handler served by ``ThreadReusingHTTPServer`` on loopback, for the
tests of kubegpu/httphead.py and kubegpu/httpserve.py: GET answers with its path, POST with a
JSON summary of what it read (path, body length, the ``X-Thing`` header)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from kubegpu.httphead import LeanHead
from kubegpu.httpserve import ThreadReusingHTTPServer, bound_server


class EchoHandler(LeanHead):
    timeout = 5

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        doc = {"path": self.path, "length": len(body), "x": self.headers.get("x-thing")}
        self.send_answer(200, "application/json", json.dumps(doc).encode())

    def do_GET(self) -> None:  # noqa: N802
        self.send_answer(200, "text/plain", self.path.encode())


@contextmanager
def echo_server() -> Iterator[ThreadReusingHTTPServer]:
    """An ``EchoHandler`` server on 127.0.0.1 (any port) until the block ends."""
    http_server = bound_server("127.0.0.1:0", EchoHandler)
    thread = threading.Thread(target=http_server.serve_forever, daemon=True)
    thread.start()
    try:
        yield http_server
    finally:
        http_server.shutdown()
        http_server.server_close()
