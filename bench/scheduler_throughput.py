"""Benchmark: how many pods per second the kubegpu scheduler places, in memory and against a real apiserver.

(a) **In memory**: the scheduling core alone (``scheduler.core``), as the live scheduler drives it:
5,000 nodes of 8 GPUs (a shipped topology, 96 cores, 768 GiB) in one ``ClusterState`` and 20,000
pods of mixed sizes (CPU-only, GPU shares, 1/2/4/8 whole GPUs), built from pod JSON with the live
scheduler's own ``pod_request``. Only the loop ``schedule_one`` + ``ClusterState.assume`` is timed.
It runs in a fresh (spawned) process, so its peak RSS (``ru_maxrss``) is its own: interpreter,
numpy, the cluster and the pods. The policy is the live scheduler's default
(``SchedulerConfig().policy``) when the core knows it, else ``bestfit`` (the output says which).

(b) **Against the real apiserver** (``kubegpu.devenv.controlplane``: etcd + kube-apiserver): 500
Node objects advertised as the kubegpu advertiser leaves them (sim plugin inventory, heartbeat,
``nvidia.com/gpu: 8``, CPU, memory, ``pods: 110``), one set shared by both schedulers. kubegpu (the
live ``Scheduler``, in this process) and the real kube-scheduler (which only counts
``nvidia.com/gpu``) each place 2,000 one-GPU pods, in interleaved rounds (ABBA order) so that machine
noise hits both. Client rate limits are set high enough not to be the limit, as Kubernetes'
scheduler_perf does: kube-scheduler's ``clientConnection`` qps/burst 5000/5000; kubegpu does not
throttle and gets a connection pool larger than its binder pool. Between rounds the pods are
force-deleted, so every round starts on empty nodes. Pods are created, and binds observed (one
watch), by a separate process, so neither the creation nor the measurement competes with kubegpu
for this process's GIL (the creator POSTs with ``http.client``: the generated client costs ~3 ms
of CPU per call). A round's rate is pods / (last pod seen bound - first pod creation).

``--backlog`` adds rounds whose pods all exist before the scheduler may start (kubegpu: leadership
held back; kube-scheduler: process stopped, then started), timed from the first to the last bind:
the schedulers' own capacity rather than how well they keep up with pod creation. The CPU seconds of
every process (and of kubegpu's threads by role) are reported per round.

Diagnostics: ``--profile`` (cProfile of (a)'s loop), ``--compare-explain`` (a second (a) pass with
``explain=False``), ``--what-if-release`` (kubegpu reads and releases each Binding response; see
``release_binding_connections``); none of them is part of the default numbers.

Usage::

    python bench/scheduler_throughput.py [--json] [--nodes N] [--pods N] [--api-nodes N] [--api-pods N]
                                         [--rounds N] [--backlog] [--skip-memory] [--skip-apiserver]
                                         [--profile] [--compare-explain] [--what-if-release]

Prints a table, then one JSON object (only the JSON object with ``--json``)::

    {"in_memory": {"nodes", "pods", "pods_per_second", "peak_rss_mb", ...},
     "apiserver": {"nodes", "pods", "kubegpu_pods_per_second", "kube_scheduler_pods_per_second",
                   "ratio", ...}}

Targets (docs/performance.md): (a) at least 1,000 pods/s; (b) ratio kubegpu / kube-scheduler >= 1.0.
"""

from __future__ import annotations

import argparse
import cProfile
import http.client
import io
import json
import multiprocessing
import os
import pstats
import random
import resource
import ssl
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from kubernetes import client as k8s
from kubernetes.config import load_kube_config

from crishim.advertiser import Advertiser
from devices.sim import SimPlugin
from kubegpu.allocation import KeyRing
from kubegpu.devenv.controlplane import ControlPlane, create_fake_node, ensure_namespace
from scheduler.core.policies import make_policy, policy_names
from scheduler.core.request import PodRequest
from scheduler.core.schedule import Placement, schedule_one
from scheduler.core.state import ClusterState, NodeState
from scheduler.live.config import SchedulerConfig
from scheduler.live.podspec import pod_request
from scheduler.live.reflector import parse_events, response_lines
from scheduler.live.scheduler import Scheduler

FALLBACK_POLICY = "bestfit"
NODE_CPU = "96"
NODE_MEMORY = "768Gi"
NODE_CPU_MILLI = 96_000
NODE_MEMORY_MIB = 768 * 1024
KEYS = {"k1": Ed25519PrivateKey.from_private_bytes(bytes(range(32)))}  # a fixed bench key
KUBEGPU_NAME = "kubegpu-bench"
KUBE_SCHEDULER_NAME = "default-scheduler"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# (kind, weight): the in-memory pod mix. Expected GPU demand is ~1.58 GPUs per pod, so 20,000 pods
# ask for ~79% of 5,000 x 8 GPUs; CPU ~41% and memory ~40% of the nodes.
POD_MIX: tuple[tuple[str, float], ...] = (
    ("cpu", 0.10),
    ("share", 0.20),
    ("1", 0.40),
    ("2", 0.15),
    ("4", 0.10),
    ("8", 0.05),
)


# --------------------------------------------------------------------------- pods as API JSON


def pod_json(
    namespace: str,
    name: str,
    scheduler: str,
    gpus: int = 0,
    cpu: str = "100m",
    memory: str = "128Mi",
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A one-container pod as the API holds it (``gpus`` whole GPUs as a ``nvidia.com/gpu`` limit)."""
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "app",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": limits},
                }
            ],
        },
    }


def mixed_pod(rng: random.Random, index: int) -> tuple[str, dict[str, Any]]:
    """(kind, pod JSON) of one pod of the in-memory mix."""
    kind = rng.choices([k for k, _ in POD_MIX], [w for _, w in POD_MIX])[0]
    name = f"p{index:06d}"
    if kind == "cpu":
        cores = rng.choice((1, 2, 4, 8))
        return kind, pod_json("bench", name, KUBEGPU_NAME, cpu=str(cores), memory=f"{4 * cores}Gi")
    if kind == "share":
        milli = rng.choice((250, 500))
        return kind, pod_json(
            "bench",
            name,
            KUBEGPU_NAME,
            cpu="2",
            memory="16Gi",
            annotations={"kubegpu.io/gpu-milli": str(milli)},
        )
    gpus = int(kind)
    annotations = {"kubegpu.io/topology": "nvlink=prefer"} if gpus in (2, 4) and rng.random() < 0.5 else {}
    return kind, pod_json(
        "bench",
        name,
        KUBEGPU_NAME,
        gpus=gpus,
        cpu=str(6 * gpus),
        memory=f"{48 * gpus}Gi",
        annotations=annotations,
    )


def live_default_policy() -> tuple[str, str]:
    """(policy name, note): the live scheduler's default policy, or the fallback if the core lacks it."""
    wanted = SchedulerConfig().policy
    if wanted in policy_names():
        return wanted, f"live default policy {wanted!r}"
    return FALLBACK_POLICY, (
        f"live default policy {wanted!r} is not in the core's registry ({', '.join(policy_names())}); "
        f"used {FALLBACK_POLICY!r}"
    )


# --------------------------------------------------------------------------- (a) in memory


def build_nodes(count: int, topology: str) -> list[NodeState]:
    """``count`` nodes of ``topology`` (the sim plugin's inventory: GPU ids, models, memory, links)."""
    with tempfile.TemporaryDirectory(prefix="kubegpu-bench-") as state:
        return [
            NodeState.from_inventory(
                f"node-{i:05d}",
                NODE_CPU_MILLI,
                NODE_MEMORY_MIB,
                SimPlugin(topology, f"node-{i:05d}", state, create_nodes=False).discover(),
            )
            for i in range(count)
        ]


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@dataclass
class LoopResult:
    """One timed pass of the scheduling loop."""

    seconds: float
    cpu_seconds: float  # process CPU time over the loop (this one thread): the machine is shared
    unschedulable: Counter[str]
    per_kind_seconds: Counter[str]
    per_kind_count: Counter[str]
    gpu_allocation_percent: float


def timed_loop(
    cluster: ClusterState,
    policy_name: str,
    requests: list[tuple[str, PodRequest]],
    seed: int,
    explain: bool,
    profiler: cProfile.Profile | None = None,
) -> LoopResult:
    """Place every request in order (``schedule_one`` then ``assume``), as the live scheduler does."""
    policy = make_policy(policy_name)
    policy.bind(cluster, [])  # as the live scheduler does after each rebuild
    rng = random.Random(seed)
    per_kind_seconds: Counter[str] = Counter()
    per_kind_count: Counter[str] = Counter()
    unschedulable: Counter[str] = Counter()
    clock = time.perf_counter
    if profiler is not None:
        profiler.enable()
    cpu_started = time.process_time()
    started = clock()
    for kind, request in requests:
        t0 = clock()
        result = schedule_one(request, cluster, policy, rng, explain=explain)
        if isinstance(result, Placement):
            cluster.assume(result.allocation)
        else:
            unschedulable[kind] += 1
        per_kind_seconds[kind] += clock() - t0
        per_kind_count[kind] += 1
    seconds = clock() - started
    cpu_seconds = time.process_time() - cpu_started
    if profiler is not None:
        profiler.disable()
    allocated = 100.0 * cluster.allocated_gpu_milli() / (1000 * max(cluster.total_gpus(), 1))
    return LoopResult(
        seconds, cpu_seconds, unschedulable, per_kind_seconds, per_kind_count, round(allocated, 1)
    )


def run_in_memory(
    nodes: int, pods: int, topology: str, seed: int, profile: bool, no_explain_pass: bool
) -> dict[str, Any]:
    """Part (a); meant to run in a fresh process (``ru_maxrss`` is the process's peak).

    The measured pass is the live scheduler's call (``explain=True``: reasons are counted for every
    rejected node). With ``no_explain_pass`` a second pass on a fresh cluster times ``explain=False``
    (reasons never counted), which shows what the reason counting costs.
    """
    rss_start = rss_mb()
    policy_name, note = live_default_policy()
    built = time.perf_counter()
    cluster = ClusterState(build_nodes(nodes, topology))
    rng = random.Random(seed)
    requests = [(kind, pod_request(doc)) for kind, doc in (mixed_pod(rng, i) for i in range(pods))]
    build_seconds = time.perf_counter() - built
    rss_built = rss_mb()
    profiler = cProfile.Profile() if profile else None
    loop = timed_loop(cluster, policy_name, requests, seed, explain=True, profiler=profiler)
    peak = rss_mb()
    out: dict[str, Any] = {
        "nodes": nodes,
        "pods": pods,
        "pods_per_second": round(pods / loop.seconds, 1),
        "peak_rss_mb": round(peak, 1),
        "seconds": round(loop.seconds, 3),
        "cpu_seconds": round(loop.cpu_seconds, 3),
        "pods_per_cpu_second": round(pods / loop.cpu_seconds, 1),
        "scheduled": pods - sum(loop.unschedulable.values()),
        "unschedulable": dict(loop.unschedulable),
        "gpu_allocation_percent": loop.gpu_allocation_percent,
        "policy": policy_name,
        "policy_note": note,
        "topology": topology,
        "explain": True,
        "rss_at_start_mb": round(rss_start, 1),
        "rss_after_build_mb": round(rss_built, 1),
        "build_seconds": round(build_seconds, 2),
        "mean_us_by_kind": {
            k: round(1e6 * loop.per_kind_seconds[k] / loop.per_kind_count[k], 1)
            for k, _ in POD_MIX
            if loop.per_kind_count[k]
        },
        "profiled": profile,
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
    }
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        out["profile_top_tottime"] = text.getvalue()
    if no_explain_pass and not profile:
        del cluster
        fresh_cluster = ClusterState(build_nodes(nodes, topology))  # fresh nodes, no cached link matrices
        fresh = timed_loop(fresh_cluster, policy_name, requests, seed, explain=False)
        out["no_explain_pods_per_second"] = round(pods / fresh.seconds, 1)
        out["no_explain_seconds"] = round(fresh.seconds, 3)
        out["no_explain_pods_per_cpu_second"] = round(pods / fresh.cpu_seconds, 1)
    return out


def in_memory_in_subprocess(args: argparse.Namespace) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(
            run_in_memory, args.nodes, args.pods, args.topology, args.seed, args.profile, args.compare_explain
        ).result()


# --------------------------------------------------------------------------- (b) apiserver


def api_client(kubeconfig: Path, pool: int) -> k8s.ApiClient:
    """An ApiClient from a kubeconfig with a connection pool of ``pool`` (default is 5 x CPUs)."""
    configuration = k8s.Configuration()
    load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = pool
    return k8s.ApiClient(configuration)


def advertise_node(core: k8s.CoreV1Api, name: str, topology: str, state: str) -> None:
    """A node as kubelet plus the kubegpu advertiser leave it (as tests/test_scheduler_api.py does)."""
    create_fake_node(core, name, capacity={"cpu": NODE_CPU, "memory": NODE_MEMORY, "pods": "110"})
    inventory = SimPlugin(topology, name, os.path.join(state, name), create_nodes=False).discover()
    Advertiser(core, name, lambda: inventory).sync_once()


class RawPoster:
    """POSTs JSON with ``http.client``, one keep-alive TLS connection per thread.

    The generated Kubernetes client spends about 3 ms of CPU per create on 2 cores; the pod creator
    would then take CPU the schedulers and the apiserver need, and cap the rate it measures.
    """

    def __init__(self, configuration: k8s.Configuration) -> None:
        url = urllib.parse.urlsplit(configuration.host)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.cert_file:
            self.context.load_cert_chain(configuration.cert_file, configuration.key_file)
        self.local = threading.local()

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPSConnection(self.host, self.port, context=self.context)
        try:
            conn.request(
                "POST", path, body, {"Content-Type": "application/json", "Accept": "application/json"}
            )
            response = conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            self.local.conn = None
            raise


_ROUND: dict[str, Any] = {}  # the helper process's round in progress (see start_round / finish_round)


def start_round(
    kubeconfig: str,
    namespace: str,
    scheduler: str,
    prefix: str,
    count: int,
    threads: int,
    timeout: float,
    bodies: Sequence[bytes] | None = None,
) -> dict[str, Any]:
    """Watch ``namespace``, then create ``count`` one-GPU pods for ``scheduler`` (in the helper process).

    ``bodies`` (pod JSON, ``count`` of them, created in this order) replaces the one-GPU pods when
    given (bench/gang_throughput.py's group members). Returns once every create has been answered;
    the watch goes on recording when each pod is first seen bound until ``finish_round``. Stamps
    are wall-clock (``time.time``), comparable across processes.
    """
    cpu_start = own_cpu_seconds()
    api = api_client(Path(kubeconfig), 4)
    core = k8s.CoreV1Api(api)
    listing = json.loads(core.list_namespaced_pod(namespace, limit=1, _preload_content=False).data)
    watch = core.list_namespaced_pod(
        namespace,
        watch=True,
        resource_version=listing["metadata"]["resourceVersion"],
        timeout_seconds=int(timeout) + 60,
        _preload_content=False,
    )
    bound: dict[str, float] = {}
    done = threading.Event()
    stop = threading.Event()  # finish_round is done with this round
    streams = [watch]  # the current watch (finish_round closes the last)
    restarts: list[str] = []

    def relist() -> str:
        """After a watch ended early: every pod bound meanwhile is stamped now (a later stamp
        than its bind, so the round's rate stays a lower bound); the list's resourceVersion."""
        page = json.loads(core.list_namespaced_pod(namespace, _preload_content=False).data)
        now = time.time()
        for item in page.get("items") or []:
            name = (item.get("metadata") or {}).get("name", "")
            if (item.get("spec") or {}).get("nodeName") and name not in bound:
                bound[name] = now
        return str(page["metadata"]["resourceVersion"])

    def observe() -> None:
        stream = watch
        while True:
            try:
                for _kind, obj in parse_events(response_lines(stream)):
                    name = (obj.get("metadata") or {}).get("name", "")
                    if (obj.get("spec") or {}).get("nodeName") and name not in bound:
                        bound[name] = time.time()
                        if len(bound) >= count:
                            break
                else:
                    restarts.append("the watch ended")
            except Exception as error:  # the stream broke under us: list and watch again
                restarts.append(f"{type(error).__name__}: {str(error)[:120]}")
            if len(bound) >= count or stop.is_set() or len(restarts) > 20:
                break
            try:
                version = relist()
                if len(bound) >= count:
                    break
                stream = core.list_namespaced_pod(
                    namespace,
                    watch=True,
                    resource_version=version,
                    timeout_seconds=int(timeout) + 60,
                    _preload_content=False,
                )
                streams.append(stream)
            except Exception as error:
                if stop.is_set():
                    break
                restarts.append(f"relist: {type(error).__name__}: {str(error)[:120]}")
                time.sleep(0.5)
        done.set()

    threading.Thread(target=observe, daemon=True).start()
    errors: list[str] = []
    poster = RawPoster(api.configuration)
    path = f"/api/v1/namespaces/{namespace}/pods"
    if bodies is None:
        bodies = [
            json.dumps(pod_json(namespace, f"{prefix}-{i:05d}", scheduler, gpus=1)).encode()
            for i in range(count)
        ]

    def create(body: bytes) -> float:
        try:
            status, data = poster.post(path, body)
            if status != 201:
                errors.append(f"{status}: {data[:200]!r}")
        except (OSError, http.client.HTTPException) as error:
            errors.append(str(error)[:200])
        return time.time()

    first_create = time.time()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        created_at = list(pool.map(create, bodies))
    _ROUND.update(
        streams=streams, bound=bound, done=done, stop=stop, cpu_start=cpu_start, api=api, restarts=restarts
    )
    return {
        "first_create": first_create,
        "last_created": max(created_at, default=first_create),
        "created": count - len(errors),
        "errors": errors[:5],
    }


def finish_round(timeout: float) -> dict[str, Any]:
    """Wait (up to ``timeout``) until every pod of the round is seen bound; the bind stamps
    (``binds``: ``[name, stamp]`` in the order the watch saw them)."""
    _ROUND["done"].wait(timeout)
    _ROUND["stop"].set()
    for stream in _ROUND["streams"]:
        stream.close()
    _ROUND["api"].close()
    stamps = sorted(_ROUND["bound"].values())
    result = {
        "first_bound": stamps[0] if stamps else None,
        "last_bound": stamps[-1] if stamps else None,
        "bound": len(stamps),
        "cpu_seconds": own_cpu_seconds() - _ROUND["cpu_start"],
        "watch_restarts": list(_ROUND["restarts"]),
        "binds": [[name, stamp] for name, stamp in _ROUND["bound"].items()],
    }
    _ROUND.clear()
    return result


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def thread_group(name: str) -> str:
    """The kubegpu scheduler's threads by role (binders are ``bind_N``)."""
    for prefix in ("watch-pods", "watch-nodes", "kubegpu-run", "bind", "staleness"):
        if name.startswith(prefix):
            return prefix
    return "other"


def thread_cpu_seconds() -> dict[int, tuple[str, float]]:
    """native thread id -> (role, CPU seconds) for this process's live threads."""
    out: dict[int, tuple[str, float]] = {}
    for thread in threading.enumerate():
        try:
            out[thread.native_id or 0] = (
                thread_group(thread.name),
                process_cpu_seconds_task(thread.native_id),
            )
        except (OSError, TypeError):
            continue
    return out


def process_cpu_seconds_task(tid: int | None) -> float:
    if tid is None:
        raise TypeError("thread not started")
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def thread_cpu_delta(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds per thread role between two ``thread_cpu_seconds`` snapshots."""
    roles: Counter[str] = Counter()
    for tid, (role, seconds) in after.items():
        roles[role] += seconds - before.get(tid, (role, 0.0))[1]
    return {role: round(seconds, 2) for role, seconds in sorted(roles.items()) if seconds > 0.004}


@dataclass
class SchedulerRounds:
    """What one scheduler achieved over its rounds of one kind (concurrent creation, or backlog)."""

    name: str
    pods: int = 0
    bound: int = 0
    seconds: float = 0.0  # the rate's denominator, summed over rounds
    create_seconds: float = 0.0  # first creation -> last creation answered
    bind_window_seconds: float = 0.0  # first bound -> last bound
    cpu: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds over the rounds
    threads: dict[str, float] = field(default_factory=dict)  # kubegpu thread role -> CPU seconds
    rounds: list[dict[str, Any]] = field(default_factory=list)

    def rate(self) -> float:
        return self.bound / self.seconds if self.seconds else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "pods": self.pods,
            "bound": self.bound,
            "pods_per_second": round(self.rate(), 1),
            "seconds": round(self.seconds, 3),
            "create_pods_per_second": round(self.pods / self.create_seconds, 1)
            if self.create_seconds
            else None,
            "bind_window_pods_per_second": (
                round(self.bound / self.bind_window_seconds, 1) if self.bind_window_seconds else None
            ),
            "cpu_seconds": self.cpu,
            "kubegpu_threads_cpu_seconds": self.threads,
            "rounds": self.rounds,
        }


def release_binding_connections(scheduler: Scheduler) -> None:
    """What-if, not the shipped code: read each Binding response so urllib3 can reuse its connection.

    ``Scheduler._bind`` calls ``create_namespaced_pod_binding(..., _preload_content=False)`` and never
    reads or releases the response, so the connection never returns to the pool and every bind opens
    a new TLS connection. This wraps the scheduler's API object to release it (``--what-if-release``).
    """
    create = scheduler.core.create_namespaced_pod_binding

    def releasing(*args: Any, **kwargs: Any) -> Any:
        response = create(*args, **kwargs)
        _ = response.data  # read to the end: urllib3 then puts the connection back in the pool
        response.release_conn()
        return response

    scheduler.core.create_namespaced_pod_binding = releasing  # type: ignore[method-assign]


class ApiBench:
    """One control plane, one node set, kubegpu (in this process) and kube-scheduler (a process)."""

    def __init__(
        self, args: argparse.Namespace, cp: ControlPlane, driver: ProcessPoolExecutor, log: Any
    ) -> None:
        self.args, self.cp, self.driver, self.log = args, cp, driver, log
        self.core = k8s.CoreV1Api(api_client(cp.admin_kubeconfig, args.node_threads + 8))
        self.kube_config = {
            "clientConnection": {"qps": args.kube_qps, "burst": args.kube_qps},
            "profiles": [{"schedulerName": KUBE_SCHEDULER_NAME}],
        }
        self.kube_args: tuple[str, ...] = ()  # kube-scheduler's extra command-line arguments
        self.kube_scheduler: Any = None
        self.kubegpu: Scheduler | None = None
        self.runner: threading.Thread | None = None
        self.namespaces = {KUBEGPU_NAME: "bench-kubegpu", KUBE_SCHEDULER_NAME: "bench-kube-scheduler"}

    def create_nodes(self, state: str) -> list[str]:
        names = [f"gpu-{i:04d}" for i in range(self.args.api_nodes)]
        with ThreadPoolExecutor(max_workers=self.args.node_threads) as pool:
            list(pool.map(lambda n: advertise_node(self.core, n, self.args.topology, state), names))
        for namespace in self.namespaces.values():
            ensure_namespace(self.core, namespace)
        return names

    def start_schedulers(self, policy_name: str, nodes: int) -> None:
        self.kube_scheduler = self.cp.start_scheduler(self.kube_config, extra_args=self.kube_args)
        config = SchedulerConfig(
            scheduler_name=KUBEGPU_NAME,
            policy=policy_name,
            bind_workers=self.args.bind_workers,
            signing_key_id="k1",
            heartbeat_stale_seconds=86400.0,  # no advertiser keeps the heartbeats fresh here
        )
        api = api_client(self.cp.admin_kubeconfig, self.args.bind_workers + 8)
        kubegpu = self.kubegpu = Scheduler(config, api, KeyRing(None, KEYS), seed=self.args.seed)
        if self.args.what_if_release:
            release_binding_connections(kubegpu)
        kubegpu.start_watching()
        if not kubegpu.wait_synced(60):
            raise RuntimeError("kubegpu did not sync")
        kubegpu.leading.set()
        self.runner = threading.Thread(target=kubegpu.run, name="kubegpu-run", daemon=True)
        self.runner.start()
        wait_until(lambda: len(kubegpu.facts) >= nodes, 60, f"kubegpu to see {nodes} nodes")

    def stop(self) -> None:
        if self.kubegpu is not None:
            self.kubegpu.stop()
        if self.runner is not None:
            self.runner.join(timeout=10)

    def pids(self) -> dict[str, int]:
        pids = {c.name: c.process.pid for c in self.cp.components if c.process is not None and c.alive()}
        return {("kube-scheduler" if n.startswith("kube-scheduler") else n): p for n, p in pids.items()}

    def pending_in_kubegpu(self, namespace: str) -> int:
        assert self.kubegpu is not None
        with self.kubegpu.cond:
            return sum(
                1
                for p in self.kubegpu.pods.values()
                if (p.get("metadata") or {}).get("namespace") == namespace
                and not (p.get("spec") or {}).get("nodeName")
            )

    def round(self, name: str, r: int, count: int, backlog: bool, result: SchedulerRounds) -> None:
        """One round: ``count`` pods for scheduler ``name``; adds to ``result``; deletes the pods."""
        assert self.kubegpu is not None
        namespace, args = self.namespaces[name], self.args
        prefix = f"{'b' if backlog else 'c'}{r}"
        if backlog:  # hold the scheduler back until every pod exists
            if name == KUBEGPU_NAME:
                self.kubegpu.leading.clear()
                time.sleep(1.0)  # the run loop notices within 0.5 s
            else:
                self.kube_scheduler.stop()
        pids = self.pids()
        cpu_before = {c: process_cpu_seconds(p) for c, p in pids.items()}
        cpu_before["bench-process"] = own_cpu_seconds()
        threads_before = thread_cpu_seconds()
        created = self.driver.submit(
            start_round,
            str(self.cp.admin_kubeconfig),
            namespace,
            name,
            prefix,
            count,
            args.create_threads,
            args.round_timeout,
        ).result()
        released = None
        if backlog:
            if name == KUBEGPU_NAME:
                wait_until(lambda: self.pending_in_kubegpu(namespace) >= count, 60, "kubegpu to see the pods")
                released = time.time()
                self.kubegpu.leading.set()
            else:
                released = time.time()
                self.kube_scheduler = self.cp.start_scheduler(self.kube_config, extra_args=self.kube_args)
                pids = self.pids()
                cpu_before["kube-scheduler"] = 0.0  # a new process
        bound = self.driver.submit(finish_round, args.round_timeout).result()
        cpu_after = {c: process_cpu_seconds(p) for c, p in pids.items()}
        cpu_after["bench-process"] = own_cpu_seconds()
        threads = thread_cpu_delta(threads_before, thread_cpu_seconds())
        cpu = {c: round(cpu_after[c] - cpu_before.get(c, 0.0), 2) for c in cpu_after}
        cpu["pod-creator"] = round(bound["cpu_seconds"], 2)
        end = bound["last_bound"] or time.time()
        window = end - bound["first_bound"] if bound["first_bound"] else 0.0
        seconds = window if backlog else end - created["first_create"]
        create_seconds = created["last_created"] - created["first_create"]
        result.pods += count
        result.bound += bound["bound"]
        result.seconds += seconds
        result.create_seconds += create_seconds
        result.bind_window_seconds += window
        for c, v in cpu.items():
            result.cpu[c] = round(result.cpu.get(c, 0.0) + v, 2)
        for role, v in threads.items():
            result.threads[role] = round(result.threads.get(role, 0.0) + v, 2)
        entry = {
            "round": r,
            "pods": count,
            "bound": bound["bound"],
            "seconds": round(seconds, 3),
            "pods_per_second": round(bound["bound"] / seconds, 1) if seconds else 0.0,
            "create_seconds": round(create_seconds, 3),
            "release_to_first_bound_seconds": (
                round(bound["first_bound"] - released, 3) if released and bound["first_bound"] else None
            ),
            "cpu_seconds": cpu,
            "kubegpu_threads_cpu_seconds": threads,
            "errors": created["errors"],
            "watch_restarts": bound["watch_restarts"],
        }
        result.rounds.append(entry)
        kind = "backlog" if backlog else "concurrent"
        self.log(
            f"{kind} round {r} {result.name}: {bound['bound']}/{count} bound in {seconds:.2f} s "
            f"({entry['pods_per_second']} pods/s; created in {create_seconds:.2f} s); cpu s {cpu}; "
            f"kubegpu threads {threads}"
        )
        if bound["bound"] < count:
            self.log(f"only {bound['bound']} of {count} bound; logs:\n{self.cp.log_tails(20)}")
        self.delete_pods(namespace)

    def delete_pods(self, namespace: str, timeout: float = 120) -> None:
        """Force-delete the round's pods (no kubelet would finish a graceful delete) and wait."""
        assert self.kubegpu is not None
        self.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0, _preload_content=False)

        def gone() -> bool:
            left = self.core.list_namespaced_pod(namespace, limit=1, _preload_content=False)
            with self.kubegpu.cond:
                cached = any(
                    (p.get("metadata") or {}).get("namespace") == namespace
                    for p in self.kubegpu.pods.values()
                )
            return not json.loads(left.data)["items"] and not cached

        wait_until(gone, timeout, f"the pods of {namespace} to go")
        time.sleep(1.0)  # kube-scheduler's informer: there is no way to ask it, give it a moment

    def rounds(self, backlog: bool) -> tuple[SchedulerRounds, SchedulerRounds]:
        """Interleaved rounds, ABBA order: (kubegpu, kube-scheduler) results."""
        args = self.args
        results = {
            KUBEGPU_NAME: SchedulerRounds("kubegpu"),
            KUBE_SCHEDULER_NAME: SchedulerRounds("kube-scheduler"),
        }
        counts = [
            args.api_pods // args.rounds + (1 if r < args.api_pods % args.rounds else 0)
            for r in range(args.rounds)
        ]
        for r, count in enumerate(counts):
            order = (KUBEGPU_NAME, KUBE_SCHEDULER_NAME) if r % 2 == 0 else (KUBE_SCHEDULER_NAME, KUBEGPU_NAME)
            for name in order:
                self.round(name, r, count, backlog, results[name])
        return results[KUBEGPU_NAME], results[KUBE_SCHEDULER_NAME]


def wait_until(probe: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


@contextmanager
def bench_plane(
    make_bench: Callable[[ControlPlane, ProcessPoolExecutor], ApiBench],
    log: Any,
    plane: Callable[[], ControlPlane] = ControlPlane,
    prepare: Callable[[ControlPlane], None] | None = None,
) -> Iterator[tuple[ApiBench, ControlPlane, list[str], float]]:
    """A control plane (``plane()``, then ``prepare(cp)``), the node set advertised on it and the
    bench made by ``make_bench(cp, driver)`` (its pod-creating helper process started before any
    measured round): (bench, cp, node names, seconds the nodes took). The benchmarks of
    bench/gang_throughput.py and bench/extender_throughput.py start theirs the same way."""
    context = multiprocessing.get_context("spawn")
    with (
        plane() as cp,
        tempfile.TemporaryDirectory(prefix="kubegpu-bench-sim-") as state,
        ProcessPoolExecutor(max_workers=1, mp_context=context) as driver,
    ):
        driver.submit(time.time).result()  # start the helper process now, not in a measured round
        if prepare is not None:
            prepare(cp)
        bench = make_bench(cp, driver)
        started = time.monotonic()
        names = bench.create_nodes(state)
        nodes_seconds = time.monotonic() - started
        log(f"created and advertised {len(names)} nodes in {nodes_seconds:.1f} s")
        yield bench, cp, names, nodes_seconds


def run_apiserver(args: argparse.Namespace, policy_name: str, note: str, log: Any) -> dict[str, Any]:
    """Part (b): both schedulers on one control plane and one node set."""
    make = lambda cp, driver: ApiBench(args, cp, driver, log)  # noqa: E731
    with bench_plane(make, log) as (bench, _, names, nodes_seconds):
        try:
            bench.start_schedulers(policy_name, len(names))
            ours, theirs = bench.rounds(backlog=False)
            backlog = bench.rounds(backlog=True) if args.backlog else None
        finally:
            bench.stop()
    out: dict[str, Any] = {
        "nodes": len(names),
        "pods": args.api_pods,
        "kubegpu_pods_per_second": round(ours.rate(), 1),
        "kube_scheduler_pods_per_second": round(theirs.rate(), 1),
        "ratio": round(ours.rate() / theirs.rate(), 3) if theirs.rate() else None,
        "rounds": args.rounds,
        "kubegpu_policy": policy_name,
        "policy_note": note,
        "kubegpu_bind_workers": args.bind_workers,
        "kube_scheduler_qps_burst": args.kube_qps,
        "create_threads": args.create_threads,
        "what_if_release_bind_connections": args.what_if_release,
        "node_setup_seconds": round(nodes_seconds, 1),
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        "detail": {"kubegpu": ours.summary(), "kube-scheduler": theirs.summary()},
    }
    if backlog is not None:
        b_ours, b_theirs = backlog
        out["backlog"] = {
            "kubegpu_pods_per_second": round(b_ours.rate(), 1),
            "kube_scheduler_pods_per_second": round(b_theirs.rate(), 1),
            "ratio": round(b_ours.rate() / b_theirs.rate(), 3) if b_theirs.rate() else None,
            "detail": {"kubegpu": b_ours.summary(), "kube-scheduler": b_theirs.summary()},
        }
    return out


# --------------------------------------------------------------------------- main


def print_table(report: Mapping[str, Any]) -> None:
    memory = report.get("in_memory")
    if memory:
        print("(a) in memory: scheduling core")
        print(
            f"  {memory['nodes']} nodes x 8 GPUs ({memory['topology']}), {memory['pods']} pods, "
            f"policy {memory['policy']}"
        )
        print(
            f"  {memory['pods_per_second']:.0f} pods/s ({memory['seconds']} s; "
            f"{memory['pods_per_cpu_second']:.0f} pods per CPU second), peak RSS "
            f"{memory['peak_rss_mb']} MiB; scheduled {memory['scheduled']}, GPUs allocated "
            f"{memory['gpu_allocation_percent']}%"
        )
        print(f"  mean us per pod by kind: {memory['mean_us_by_kind']}")
        print(f"  note: {memory['policy_note']}")
    if "no_explain_pods_per_second" in (memory or {}):
        print(f"  diagnostic: {memory['no_explain_pods_per_second']:.0f} pods/s with explain=False")
    api = report.get("apiserver")
    if not api:
        return
    print("(b) real apiserver: pods bound per second")
    print(f"  {api['nodes']} nodes, {api['pods']} one-GPU pods per scheduler in {api['rounds']} rounds")
    print(f"  {'':<34}{'kubegpu':>10}{'kube-scheduler':>16}{'ratio':>8}")
    rows = [("pods created while scheduling", api)]
    if "backlog" in api:
        rows.append(("backlog (first -> last bind)", api["backlog"]))
    for label, section in rows:
        print(
            f"  {label:<34}{section['kubegpu_pods_per_second']:>10}"
            f"{section['kube_scheduler_pods_per_second']:>16}{section['ratio']!s:>8}"
        )
    ours, theirs = api["detail"]["kubegpu"], api["detail"]["kube-scheduler"]
    print(
        f"  {'pod creation rate, same rounds':<34}{ours['create_pods_per_second']!s:>10}"
        f"{theirs['create_pods_per_second']!s:>16}"
    )
    print(
        f"  scheduler CPU s: kubegpu {ours['kubegpu_threads_cpu_seconds']}, "
        f"kube-scheduler {theirs['cpu_seconds'].get('kube-scheduler')}"
    )


def add_api_arguments(parser: argparse.ArgumentParser, part: str = "") -> None:
    """The options every benchmark against a real apiserver takes (this one's part (b),
    bench/gang_throughput.py, bench/extender_throughput.py): the nodes' topology and seed, kubegpu's
    bind workers, the kube-schedulers' client qps and burst, the creating threads and a round's
    timeout. ``part`` (``"(b) "``) opens the help of those that only such a part uses."""
    parser.add_argument("--topology", default="hgx-h100", help="shipped topology of every node")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bind-workers", type=int, default=SchedulerConfig().bind_workers)
    parser.add_argument(
        "--kube-qps", type=int, default=5000, help="kube-schedulers' clientConnection qps and burst"
    )
    parser.add_argument("--create-threads", type=int, default=16, help=f"{part}pod-creating threads")
    parser.add_argument("--node-threads", type=int, default=16, help=f"{part}node-creating threads")
    parser.add_argument("--round-timeout", type=float, default=600.0)


def fill_sizes(args: argparse.Namespace, quick: Mapping[str, int], full: Mapping[str, int]) -> None:
    """For a benchmark on ``ApiBench`` with ``--quick`` and size options left None unless given:
    each such size from ``quick`` (with ``--quick``) or ``full``, and ApiBench's own names, its
    node set (``api_nodes``: ``--nodes``) and its diagnostic (``what_if_release``: off)."""
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.api_nodes = args.nodes
    args.what_if_release = False


def logger(as_json: bool) -> Callable[[str], None]:
    """A benchmark's progress lines: to stderr when stdout carries only the JSON object."""

    def log(message: str) -> None:
        print(message, file=sys.stderr if as_json else sys.stdout, flush=True)

    return log


def print_report(
    report: Mapping[str, Any], as_json: bool, table: Callable[[Mapping[str, Any]], None]
) -> None:
    """The JSON object alone, or ``table(report)`` followed by it."""
    if not as_json:
        table(report)
    print(json.dumps(report, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--nodes", type=int, default=5000, help="(a) nodes of 8 GPUs")
    parser.add_argument("--pods", type=int, default=20000, help="(a) pods")
    parser.add_argument("--api-nodes", type=int, default=500, help="(b) Node objects")
    parser.add_argument("--api-pods", type=int, default=2000, help="(b) one-GPU pods per scheduler")
    parser.add_argument("--rounds", type=int, default=2, help="(b) interleaved rounds per scheduler")
    add_api_arguments(parser, "(b) ")
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="(b) also time rounds whose pods all exist before the scheduler starts (first to last bind)",
    )
    parser.add_argument(
        "--what-if-release",
        action="store_true",
        help="(b) diagnostic: make kubegpu read and release each Binding response (see docs/performance.md)",
    )
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-apiserver", action="store_true")
    parser.add_argument("--profile", action="store_true", help="(a) cProfile the scheduling loop (slows it)")
    parser.add_argument(
        "--compare-explain",
        action="store_true",
        help="(a) diagnostic: a second pass with schedule_one(explain=False) on fresh nodes",
    )
    args = parser.parse_args(argv)
    log = logger(args.json)
    report: dict[str, Any] = {}
    if not args.skip_memory:
        log(f"(a) in memory: {args.nodes} nodes, {args.pods} pods ...")
        report["in_memory"] = in_memory_in_subprocess(args)
        if args.profile:
            log(report["in_memory"].pop("profile_top_tottime"))
    if not args.skip_apiserver:
        policy_name, note = live_default_policy()
        log(f"(b) apiserver: {args.api_nodes} nodes, {args.api_pods} pods per scheduler ...")
        report["apiserver"] = run_apiserver(args, policy_name, note, log)
    print_report(report, args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
