"""Prometheus metrics of the scheduler (docs/scheduler.md lists them).

Two families: kubegpu's own (``kubegpu_scheduler_*``, kept for the dashboards that use them) and
kube-scheduler v1.37's names where they mean the same (``scheduler_*``: the same labels, label
values and buckets, so the alerts operators have for kube-scheduler work on kubegpu too).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def exponential_buckets(start: float, factor: float, count: int) -> tuple[float, ...]:
    """Prometheus' ``ExponentialBuckets``, which kube-scheduler's histograms use."""
    return tuple(start * factor**i for i in range(count))


KUBE_DURATION_BUCKETS = exponential_buckets(0.001, 2, 15)  # 1 ms .. 16.4 s
# kube-scheduler's attempt results; kubegpu's "invalid" (a malformed kubegpu request) is a pod no
# node can take as it is: kube-scheduler counts a plugin's UnschedulableAndUnresolvable as unschedulable
KUBE_RESULT = {"scheduled": "scheduled", "unschedulable": "unschedulable", "invalid": "unschedulable",
               "error": "error"}
# kube-scheduler's pending_pods queues for kubegpu's queues
KUBE_QUEUE = {"active": "active", "backoff": "backoff", "parked": "unschedulable"}


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
        self.decision = Histogram(
            "kubegpu_scheduler_scheduling_duration_seconds",
            "Time to decide one pod (filter, score, pick devices).",
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.algorithm = Histogram(
            "scheduler_scheduling_algorithm_duration_seconds",
            "Seconds to decide one pod (filter, score, pick devices, preemption), kube-scheduler's name.",
            buckets=KUBE_DURATION_BUCKETS,
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
        # kube-scheduler's names (pkg/scheduler/metrics/metrics.go of v1.37)
        self.pending_pods = Gauge(
            "scheduler_pending_pods",
            "Pods waiting to be scheduled by queue: active (ready), backoff (backing off after a failed "
            "attempt), unschedulable (tried, waiting for the cluster to change).",
            ["queue"],
            registry=self.registry,
        )
        self.schedule_attempts = Counter(
            "scheduler_schedule_attempts_total",
            "Scheduling attempts by result: scheduled (bound), unschedulable (no node fits), error (a "
            "scheduler or API problem, a failed Binding included).",
            ["result", "profile"],
            registry=self.registry,
        )
        self.attempt_duration = Histogram(
            "scheduler_scheduling_attempt_duration_seconds",
            "Seconds from taking a pod from the queue to the end of its attempt (deciding, and binding "
            "when it was placed), by result.",
            ["result", "profile"],
            buckets=KUBE_DURATION_BUCKETS,
            registry=self.registry,
        )
        self.pod_attempts = Histogram(
            "scheduler_pod_scheduling_attempts",
            "Attempts a pod took until it was bound.",
            buckets=exponential_buckets(1, 2, 5),
            registry=self.registry,
        )
        self.preemption_attempts = Counter(
            "scheduler_preemption_attempts_total",
            "Preemptions tried: an unschedulable pod looked for lower-priority pods to evict.",
            registry=self.registry,
        )
        self.preemption_victims = Histogram(
            "scheduler_preemption_victims",
            "Victims chosen by each preemption of a single pod.",
            buckets=exponential_buckets(1, 2, 7),
            registry=self.registry,
        )

    def decided(self, seconds: float) -> None:
        """One pod (or group) was decided in ``seconds``, under both names."""
        self.decision.observe(seconds)
        self.algorithm.observe(seconds)

    def attempt(self, profile: str, result: str, seconds: float) -> None:
        """One scheduling attempt ended (kube-scheduler's ``result``: scheduled, unschedulable,
        error), ``seconds`` after the pod was taken from the queue."""
        self.schedule_attempts.labels(result, profile).inc()
        self.attempt_duration.labels(result, profile).observe(max(0.0, seconds))

    def queues(self, counts: dict[str, int]) -> None:
        """The queues' sizes, under both names."""
        for name, count in counts.items():
            self.queue_depth.labels(name).set(count)
            if name in KUBE_QUEUE:
                self.pending_pods.labels(KUBE_QUEUE[name]).set(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)
