"""Benchmark: what utilisation-aware placement costs the API server and the scheduler (issue #24).

(a) **Publish rate, against the real apiserver** (``kubegpu.devenv.controlplane``: etcd +
kube-apiserver, the NodeGpuMetric CRD of deploy/crds/): ``--nodes`` (1,000) fake GPU nodes of
``--topology`` (hgx-h100, 8 GPUs of 80 GiB), each with the node agent's real ``Smoother`` (moving
average, weight 0.3) sampled every 15 s and its real ``MetricsPublisher`` (default policy: every
30 s, utilisation 5 points, memory 5 %, refresh 300 s) writing to the apiserver. Time is simulated
(``--minutes`` of cluster time, 30 by default, after 5 minutes of warm-up that are not counted, the
creates included); every write is a real API call, done by 16 threads per 15 s step. Agents are
not synchronised: each node's publish tick has its own offset.

The GPUs' load (``GpuLoad``): each GPU alternates idle periods (exponential, mean 10 min: 0 %, no
memory in use) and jobs (exponential, mean 20 min), so about two thirds are busy; a job has its
own level, utilisation uniform 40..100 % and memory 30..95 % of the GPU, and each 15 s reading
varies around it (utilisation +-8 points, memory +-1 % of the GPU, normal). The write rate depends
on this model: a steadier load writes less (down to the refresh bound, ``nodes / 300`` per second),
a noisier one more (up to ``nodes / 30``, what writing every interval would cost).

(b) **Scheduler cost, in memory**: ``--sched-nodes`` (1,000) nodes of the same shape whose GPUs
report readings (``ClusterState.set_live``: memory in use from the same model, so the memory guard
works in every pass), and ``--pods`` (4 per node) pods of bench/scheduler_throughput.py's mix,
placed with the live scheduler's default policy (``topology``) without and with the utilisation
term (``utilizationWeight`` 1). To measure what the term costs and nothing else, every GPU reports
the same utilisation in these two passes: the term then changes no decision, both passes make the
same choices on the same states (``same_decisions_with_and_without``). The ``utilization`` policy
is timed too, on the model's varied utilisation. Same pods, a fresh cluster each pass, passes
interleaved (without, with, utilization, x ``--repeats``), the best pass of each kept, by wall
time (``pods_per_second``, the top-level ``ratio``) and by the loop's CPU time
(``pods_per_cpu_second``, ``ratio_cpu``: less sensitive to a shared machine).

Usage::

    python bench/utilisation_publish.py [--json] [--nodes N] [--minutes M] [--sched-nodes N]
                                        [--pods N] [--repeats N] [--skip-apiserver] [--skip-scheduler]
                                        [--utilization-threshold P] [--memory-threshold P]
                                        [--job-minutes M] [--idle-minutes M] [--noise P]

Prints a table, then one JSON object (only the JSON object with ``--json``)::

    {"writes_per_second_1000_nodes", "pods_per_second_with", "pods_per_second_without", "ratio",
     "publish": {...}, "scheduler": {...}}

Targets (docs/utilisation.md): ``ratio`` (with / without) at least 0.9.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import random
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from crishim.gpumetrics import GpuRow
from crishim.metricspublisher import MetricsPublisher, PublishPolicy
from devices.model import Device, DeviceKind
from devices.sim import SimPlugin
from devices.telemetry import GpuTelemetry, Smoother
from kubegpu import livemetrics
from kubegpu.devenv.controlplane import ControlPlane, create_fake_node
from kubegpu.devenv.manifests import apply_manifests
from scheduler.core.policies import make_policy
from scheduler.core.request import PodRequest
from scheduler.core.schedule import Placement, schedule_one
from scheduler.core.state import ClusterState, LiveGpu
from scheduler.live.podspec import pod_request

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scheduler_throughput import build_nodes, mixed_pod  # noqa: E402

CRDS = Path(__file__).resolve().parents[1] / "deploy" / "crds"
SAMPLE_SECONDS = 15.0  # the node agent's --telemetry-interval default
WARMUP_SECONDS = 300.0
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class GpuLoad:
    """One GPU's load over time (module docstring): jobs and idle periods, readings around a level."""

    IDLE_MEAN = 600.0
    JOB_MEAN = 1200.0
    UTIL_NOISE = 8.0
    MEMORY_NOISE = 0.01

    def __init__(self, rng: random.Random, memory_mib: int) -> None:
        self.rng = rng
        self.memory = memory_mib
        busy_share = self.JOB_MEAN / (self.JOB_MEAN + self.IDLE_MEAN)
        self.busy = rng.random() < busy_share
        self.left = rng.expovariate(1.0 / (self.JOB_MEAN if self.busy else self.IDLE_MEAN))
        self.util, self.used = self._levels()

    def _levels(self) -> tuple[float, float]:
        return self.rng.uniform(40.0, 100.0), self.rng.uniform(0.30, 0.95) * self.memory

    def step(self, seconds: float) -> GpuTelemetry:
        """Advance ``seconds`` and read."""
        self.left -= seconds
        while self.left <= 0:
            self.busy = not self.busy
            self.left += self.rng.expovariate(1.0 / (self.JOB_MEAN if self.busy else self.IDLE_MEAN))
            if self.busy:
                self.util, self.used = self._levels()
        if not self.busy:
            return GpuTelemetry(0.0, 0.0, self.memory, xid=0, ecc_uncorrected=0)
        util = min(100.0, max(0.0, self.rng.gauss(self.util, self.UTIL_NOISE)))
        used = min(float(self.memory), max(0.0, self.rng.gauss(self.used, self.MEMORY_NOISE * self.memory)))
        return GpuTelemetry(util, used, self.memory, xid=0, ecc_uncorrected=0)


class SimNode:
    """One node agent: its GPUs' load, the real smoother, the sampler's last round, the real publisher."""

    def __init__(self, name: str, gpus: list[Device], rng: random.Random) -> None:
        self.name = name
        self.gpus = gpus
        self.loads = {g.id: GpuLoad(rng, g.memory_mib) for g in gpus}
        self.smoother = Smoother(0.3)
        self.rows: tuple[GpuRow, ...] = ()
        self.sampled_at: dt.datetime | None = None
        self.offset = rng.uniform(0.0, 30.0)  # its publish tick, within the interval
        self.publisher: MetricsPublisher | None = None

    def sample(self, now: float) -> None:
        readings = {gid: load.step(SAMPLE_SECONDS) for gid, load in self.loads.items()}
        averages = self.smoother.update(readings)
        self.rows = tuple(GpuRow(g, readings[g.id], averages[g.id], ()) for g in self.gpus)
        self.sampled_at = T0 + dt.timedelta(seconds=now)


def node_gpus(topology: str, name: str) -> list[Device]:
    with tempfile.TemporaryDirectory(prefix="kubegpu-bench-") as state:
        inventory = SimPlugin(topology, name, state, create_nodes=False).discover()
    return list(inventory.by_kind(DeviceKind.GPU))


# --------------------------------------------------------------------------- (a) publish rate


def run_publish(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    rng = random.Random(args.seed)
    with ControlPlane() as plane:
        api = plane.admin_client()
        api.configuration.connection_pool_maxsize = 32
        core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
        apply_manifests(api, [CRDS])
        deadline = time.monotonic() + 60
        while True:
            try:
                custom.list_cluster_custom_object(livemetrics.GROUP, livemetrics.VERSION, livemetrics.PLURAL)
                break
            except k8s.ApiException as error:
                if error.status != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        started = time.monotonic()
        names = [f"gpu-node-{i:05d}" for i in range(args.nodes)]
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda n: create_fake_node(core, n, capacity={"cpu": "96", "memory": "768Gi"}), names
                )
            )
        log(f"created {len(names)} nodes in {time.monotonic() - started:.1f} s")
        now = [0.0]
        nodes = []
        policy = PublishPolicy(
            utilization_points=args.utilization_threshold, memory_percent=args.memory_threshold
        )
        for name in names:
            node = SimNode(name, node_gpus(args.topology, name), rng)
            node.publisher = MetricsPublisher(
                custom,
                core,
                name,
                lambda n=node: n.rows,
                lambda n=node: n.sampled_at,
                policy,
                clock=lambda: now[0],
            )
            nodes.append(node)
        interval = policy.interval
        total = WARMUP_SECONDS + 60.0 * args.minutes
        reasons: Counter[str] = Counter()
        counted: Counter[str] = Counter()
        write_seconds = 0.0
        errors = 0
        steps = int(total // SAMPLE_SECONDS)
        with ThreadPoolExecutor(16) as pool:
            for step in range(steps):
                t0, t1 = step * SAMPLE_SECONDS, (step + 1) * SAMPLE_SECONDS
                now[0] = t1
                for node in nodes:
                    node.sample(t1)
                # a node publishes at offset + k x interval; those ticks in (t0, t1]
                due = [
                    n
                    for n in nodes
                    if math.floor((t1 - n.offset) / interval) > math.floor((t0 - n.offset) / interval)
                ]
                began = time.monotonic()
                outcomes = list(pool.map(_sync, due))
                write_seconds += time.monotonic() - began
                for reason in outcomes:
                    if reason == "error":
                        errors += 1
                    elif reason:
                        reasons[reason] += 1
                        if t1 > WARMUP_SECONDS:
                            counted[reason] += 1
        writes = sum(n.publisher.writes for n in nodes if n.publisher is not None)
        stored = custom.list_cluster_custom_object(livemetrics.GROUP, livemetrics.VERSION, livemetrics.PLURAL)
        measured = total - WARMUP_SECONDS
        rate = sum(counted.values()) / measured
    return {
        "nodes": args.nodes,
        "gpus_per_node": len(nodes[0].gpus) if nodes else 0,
        "simulated_minutes": args.minutes,
        "warmup_minutes": WARMUP_SECONDS / 60,
        "writes_per_second": round(rate, 2),
        "writes_per_second_per_1000_nodes": round(rate * 1000 / max(args.nodes, 1), 2),
        "writes_by_reason": dict(counted),
        "writes_total_with_warmup": writes,
        "every_interval_writes_per_second": round(args.nodes / interval, 2),
        "refresh_only_writes_per_second": round(args.nodes / policy.refresh, 2),
        "api_write_seconds": round(write_seconds, 1),
        "api_write_ms_mean": round(1000 * write_seconds / max(writes, 1), 2),
        "errors": errors,
        "objects": len(stored["items"]),
        "policy": vars(policy),
        "load": {
            "job_minutes_mean": GpuLoad.JOB_MEAN / 60,
            "idle_minutes_mean": GpuLoad.IDLE_MEAN / 60,
            "utilization_noise_points": GpuLoad.UTIL_NOISE,
            "memory_noise_percent": 100 * GpuLoad.MEMORY_NOISE,
        },
    }


def _sync(node: SimNode) -> str:
    try:
        assert node.publisher is not None
        return node.publisher.sync_once()
    except Exception:  # counted; the run goes on
        return "error"


# --------------------------------------------------------------------------- (b) scheduler cost


def live_snapshot(cluster: ClusterState, rng: random.Random, uniform: float | None) -> None:
    """Every node's GPUs report one reading of the load model (as a smoothed average would); with
    ``uniform``, every GPU reports that utilisation (memory in use still from the model)."""
    for node in cluster.nodes:
        readings = {}
        for gpu in node.gpus:
            reading = GpuLoad(rng, gpu.memory_mib).step(0.0)
            util = reading.utilization if uniform is None else uniform
            readings[gpu.id] = LiveGpu(round(util, 1), int(reading.memory_used_mib))
        cluster.set_live(node.name, readings)


def timed_pass(
    args: argparse.Namespace, policy: str, weight: float, requests: list[PodRequest], uniform: float | None
) -> dict[str, Any]:
    cluster = ClusterState(build_nodes(args.sched_nodes, args.topology))
    live_snapshot(cluster, random.Random(args.seed), uniform)
    chosen = make_policy(policy, utilization_weight=weight)
    chosen.bind(cluster, [])
    rng = random.Random(args.seed)
    choices = []
    cpu_started = time.process_time()
    started = time.perf_counter()
    for request in requests:
        result = schedule_one(request, cluster, chosen, rng)
        if isinstance(result, Placement):
            cluster.assume(result.allocation)
            choices.append((result.node, result.allocation.device_ids()))
        else:
            choices.append(None)
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    placed = sum(1 for c in choices if c is not None)
    return {
        "pods_per_second": len(requests) / seconds,
        "pods_per_cpu_second": len(requests) / max(cpu_seconds, 1e-9),
        "placed": placed,
        "choices": hash(tuple(choices)),
    }


def run_scheduler(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    """Without and with the term on GPUs that all report the same utilisation, so both passes make
    the very same decisions on the very same states and differ only by the term's cost; then the
    ``utilization`` policy on the model's varied readings (for reference)."""
    rng = random.Random(args.seed)
    count = args.pods or 4 * args.sched_nodes
    requests = [pod_request(doc) for _, doc in (mixed_pod(rng, i) for i in range(count))]
    variants = {
        "without": ("topology", 0.0, 50.0),
        "with": ("topology", 1.0, 50.0),
        "utilization": ("utilization", 0.0, None),
    }
    best: dict[str, dict[str, Any]] = {}
    best_cpu: dict[str, float] = {}
    for repeat in range(args.repeats):
        for label, (policy, weight, uniform) in variants.items():
            result = timed_pass(args, policy, weight, requests, uniform)
            rate = result["pods_per_second"]
            cpu_rate = result["pods_per_cpu_second"]
            placed = result["placed"]
            log(f"  pass {repeat + 1} {label}: {rate:.0f} pods/s, {cpu_rate:.0f} per CPU s, {placed} placed")
            if label not in best or rate > best[label]["pods_per_second"]:
                best[label] = result
            best_cpu[label] = max(best_cpu.get(label, 0.0), cpu_rate)
    return {
        "nodes": args.sched_nodes,
        "pods": count,
        "repeats": args.repeats,
        "policy": "topology (the live default); utilization: the policy itself",
        "same_decisions_with_and_without": best["with"]["choices"] == best["without"]["choices"],
        **{
            label: {
                "pods_per_second": round(r["pods_per_second"], 1),
                "pods_per_cpu_second": round(best_cpu[label], 1),
                "placed": r["placed"],
            }
            for label, r in best.items()
        },
        "ratio_cpu": round(best_cpu["with"] / best_cpu["without"], 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--nodes", type=int, default=1000, help="(a) simulated nodes")
    parser.add_argument("--minutes", type=float, default=30.0, help="(a) simulated minutes measured")
    parser.add_argument("--sched-nodes", type=int, default=1000, help="(b) nodes")
    parser.add_argument("--pods", type=int, default=0, help="(b) pods (default 4 per node)")
    parser.add_argument("--repeats", type=int, default=5, help="(b) interleaved passes of each variant")
    parser.add_argument("--topology", default="hgx-h100")
    parser.add_argument("--utilization-threshold", type=float, default=PublishPolicy().utilization_points)
    parser.add_argument("--memory-threshold", type=float, default=PublishPolicy().memory_percent)
    parser.add_argument(
        "--job-minutes", type=float, default=GpuLoad.JOB_MEAN / 60, help="(a) mean job length"
    )
    parser.add_argument(
        "--idle-minutes", type=float, default=GpuLoad.IDLE_MEAN / 60, help="(a) mean idle gap"
    )
    parser.add_argument(
        "--noise", type=float, default=GpuLoad.UTIL_NOISE, help="(a) utilisation noise, points"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-apiserver", action="store_true")
    parser.add_argument("--skip-scheduler", action="store_true")
    args = parser.parse_args(argv)
    GpuLoad.JOB_MEAN, GpuLoad.IDLE_MEAN = 60 * args.job_minutes, 60 * args.idle_minutes
    GpuLoad.UTIL_NOISE = args.noise

    def log(message: str) -> None:
        print(message, file=sys.stderr if args.json else sys.stdout, flush=True)

    report: dict[str, Any] = {}
    if not args.skip_apiserver:
        log(f"(a) publish: {args.nodes} nodes, {args.minutes:g} simulated minutes ...")
        publish = report["publish"] = run_publish(args, log)
        report["writes_per_second_1000_nodes"] = publish["writes_per_second_per_1000_nodes"]
    if not args.skip_scheduler:
        log(f"(b) scheduler: {args.sched_nodes} nodes ...")
        sched = report["scheduler"] = run_scheduler(args, log)
        report["pods_per_second_with"] = sched["with"]["pods_per_second"]
        report["pods_per_second_without"] = sched["without"]["pods_per_second"]
        report["ratio"] = round(report["pods_per_second_with"] / report["pods_per_second_without"], 3)
    if not args.json:
        for key in (
            "writes_per_second_1000_nodes",
            "pods_per_second_without",
            "pods_per_second_with",
            "ratio",
        ):
            if key in report:
                print(f"{key:<32}{report[key]}")
    print(json.dumps(report, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
