"""A small HTTP endpoint for /metrics (Prometheus text) and health probes, in its own thread.

Shared by the CRI shim and the scheduler. Probes return (ok, detail): 200 or 503 with the detail.
``bound_server`` also serves the scheduler extender's verbs: its connections are served by
threads that are kept for the next connection (``ThreadReusingHTTPServer``), as starting a
thread per connection cost the extender about as much CPU as answering a verb
(docs/performance.md).
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from kubegpu.cliargs import split_host_port

HealthProbe = Callable[[], tuple[bool, str]]


IDLE_THREAD_SECONDS = 60.0


class ThreadReusingHTTPServer(HTTPServer):
    """An HTTP server that serves each connection in a thread of its own, as ``ThreadingHTTPServer``
    does, but keeps a thread that has finished its connection, for ``idle_seconds``, to serve the
    next one, instead of starting a new thread per connection. Never fewer threads than
    connections in service: a connection that finds no idle thread gets a new one. Threads are
    daemons; ``server_close`` ends the idle ones."""

    idle_seconds = IDLE_THREAD_SECONDS
    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handoff: queue.SimpleQueue[tuple[Any, Any] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a connection (each hand-off is taken by exactly one)
        self._closed = False
        self.threads_started = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
                self._handoff.put((request, client_address))
                return
            self.threads_started += 1
        threading.Thread(
            target=self._serve, args=(request, client_address), name="http-connection", daemon=True
        ).start()

    def _serve(self, request: Any, client_address: Any) -> None:
        item: tuple[Any, Any] | None = (request, client_address)
        while item is not None:
            request, client_address = item
            try:
                self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)
            item = self._next_connection()

    def _next_connection(self) -> tuple[Any, Any] | None:
        """The next connection handed to this thread, or None: the server closed, or idle too long."""
        with self._lock:
            if self._closed:
                return None
            self._idle += 1
        try:
            return self._handoff.get(timeout=self.idle_seconds)
        except queue.Empty:
            with self._lock:
                try:  # handed off between the timeout and the lock: this thread takes it
                    return self._handoff.get_nowait()
                except queue.Empty:
                    if not self._closed:  # else server_close counted it out already (its wake-up
                        self._idle -= 1  # is on its way to the queue, where no one will take it)
                    return None

    def server_close(self) -> None:
        super().server_close()
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._handoff.put(None)


class _IPv6Server(ThreadReusingHTTPServer):
    address_family = socket.AF_INET6


def bound_server(address: str, handler: type[BaseHTTPRequestHandler]) -> ThreadReusingHTTPServer:
    """A threaded HTTP server (``ThreadReusingHTTPServer``) bound to ``address`` (HOST:PORT,
    [IPv6]:PORT or :PORT for loopback)."""
    host, port = split_host_port(address)
    return (_IPv6Server if ":" in host else ThreadReusingHTTPServer)((host or "127.0.0.1", port), handler)


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
