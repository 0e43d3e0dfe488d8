"""A small HTTP endpoint for /metrics (Prometheus text) and health probes, in its own thread.

Shared by the CRI shim and the scheduler. Probes return (ok, detail): 200 or 503 with the detail.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST

from kubegpu.cliargs import split_host_port

HealthProbe = Callable[[], tuple[bool, str]]


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def bound_server(address: str, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A threading HTTP server bound to ``address`` (HOST:PORT, [IPv6]:PORT or :PORT for
    loopback), its request threads daemons."""
    host, port = split_host_port(address)
    server = (_IPv6Server if ":" in host else ThreadingHTTPServer)((host or "127.0.0.1", port), handler)
    server.daemon_threads = True
    return server


class MetricsServer:
    """Serve ``render()`` at /metrics and each probe at its path over HTTP."""

    def __init__(self, address: str, render: Callable[[], bytes], probes: Mapping[str, HealthProbe]) -> None:
        self._server = bound_server(address, self._handler(render, dict(probes)))
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @staticmethod
    def _handler(render: Callable[[], bytes], probes: dict[str, HealthProbe]) -> type[BaseHTTPRequestHandler]:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                return

            def _send(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, render())
                elif path in probes:
                    ok, detail = probes[path]()
                    self._send(200 if ok else 503, "text/plain", (detail + "\n").encode())
                else:
                    self._send(404, "text/plain", b"not found\n")

        return Handler
