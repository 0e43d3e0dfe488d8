"""Prometheus metrics of the CRI shim and the HTTP endpoint serving them with /healthz.

prometheus-client is used rather than hand-written exposition: it gives correct text format,
thread-safe counters/histograms and the standard process_* metrics for free.

Metrics (see docs/crishim.md):
- kubegpu_crishim_calls_total{method, code}: completed CRI calls by gRPC status code.
- kubegpu_crishim_call_duration_seconds{method}: latency of a proxied call, shim in to shim out.
- kubegpu_crishim_inflight_calls: calls (and open streams) being proxied now.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

# The *_created series double the output for no use here.
disable_created_metrics()

# Sub-millisecond buckets: a passthrough call costs a few hundred microseconds.
LATENCY_BUCKETS = (
    0.0002,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    120,
)


class ShimMetrics:
    """The shim's metric families, registered on a private registry (one per shim instance)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.calls = Counter(
            "kubegpu_crishim_calls",
            "CRI calls proxied, by method and gRPC status code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "kubegpu_crishim_call_duration_seconds",
            "Latency of proxied CRI calls (for streams: the stream's lifetime).",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.inflight = Gauge(
            "kubegpu_crishim_inflight_calls",
            "CRI calls and streams being proxied now.",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


HealthProbe = Callable[[], tuple[bool, str]]


class MetricsServer:
    """Serve /metrics, /healthz (the shim serves) and /readyz (the runtime answers) over HTTP."""

    def __init__(
        self,
        address: str,
        metrics: ShimMetrics,
        healthz: HealthProbe,
        readyz: HealthProbe,
    ) -> None:
        host, _, port = address.rpartition(":")
        self._server = ThreadingHTTPServer(
            (host or "127.0.0.1", int(port)), self._handler(metrics, {"/healthz": healthz, "/readyz": readyz})
        )
        self._server.daemon_threads = True
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
    def _handler(metrics: ShimMetrics, probes: dict[str, HealthProbe]) -> type[BaseHTTPRequestHandler]:
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
                    self._send(200, CONTENT_TYPE_LATEST, metrics.render())
                elif path in probes:
                    ok, detail = probes[path]()
                    self._send(200 if ok else 503, "text/plain", (detail + "\n").encode())
                else:
                    self._send(404, "text/plain", b"not found\n")

        return Handler
