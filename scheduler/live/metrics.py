"""Prometheus metrics of the scheduler (docs/scheduler.md lists them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class SchedulerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        self.queue_depth = Gauge(
            "kubegpu_scheduler_queue_depth",
            "Pods waiting to be scheduled, by queue.",
            ["queue"],
            registry=self.registry,
        )
        self.attempts = Counter(
            "kubegpu_scheduler_attempts", "Scheduling attempts by result.", ["result"], registry=self.registry
        )
        self.latency = Histogram(
            "kubegpu_scheduler_scheduling_duration_seconds",
            "Time to decide one pod (filter, score, pick devices).",
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "kubegpu_scheduler_e2e_duration_seconds",
            "From pod creation to a successful binding.",
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.binds = Counter(
            "kubegpu_scheduler_bindings", "Binding calls by result.", ["result"], registry=self.registry
        )
        self.nodes = Gauge(
            "kubegpu_scheduler_nodes",
            "Nodes kubegpu can place pods on (usable) and nodes it leaves out (excluded, reason logged).",
            ["state"],
            registry=self.registry,
        )
        self.assumed = Gauge(
            "kubegpu_scheduler_assumed_pods",
            "Pods decided and booked whose binding is not yet seen on the watch.",
            registry=self.registry,
        )
        self.read_backs = Counter(
            "kubegpu_scheduler_read_backs",
            "Pods read back after a binding of unknown outcome, by what the read showed.",
            ["outcome"],
            registry=self.registry,
        )
        self.preemptions = Counter(
            "kubegpu_scheduler_preemptions",
            "Preemptions started: a pod that fit nowhere had lower-priority pods evicted.",
            registry=self.registry,
        )
        self.evictions = Counter(
            "kubegpu_scheduler_evictions",
            "Eviction API calls for preemption victims, by result (ok, gone, or the HTTP status).",
            ["result"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "kubegpu_scheduler_is_leader",
            "1 while this replica holds the leader lease.",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
