"""Prometheus metrics of the CRI shim (served by ``kubegpu.httpserve.MetricsServer``).

prometheus-client is used rather than hand-written exposition: it gives correct text format,
thread-safe counters/histograms and the standard process_* metrics for free.

Metrics (see docs/crishim.md):
- kubegpu_crishim_calls_total{method, code}: completed CRI calls by gRPC status code.
- kubegpu_crishim_call_duration_seconds{method}: latency of a proxied call, shim in to shim out.
- kubegpu_crishim_inflight_calls: calls (and open streams) being proxied now.
"""

from __future__ import annotations

from prometheus_client import (
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
