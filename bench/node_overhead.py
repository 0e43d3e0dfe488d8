"""Benchmark: what the kubegpu shim costs a node, through the real kubelet.

One local cluster (kubegpu/localcluster) with one node per path, all on this machine and the
same containerd line: kubelet pointed directly at containerd (``direct``), through ``kubegpu
crishim`` with the sim plugin and its advertiser as a GPU node runs it (``shim``), and with
``--peer-binary`` through another CRI proxy (``peer``, e.g. Koordinator's koord-runtime-proxy).

* Pod start: ``--pods`` host-network pods bound by ``spec.nodeName`` (no scheduler in the loop)
  are created at once on one path; each pod's time from its create call to the watch event that
  shows all its containers running is recorded; then they are deleted and the next path goes.
  ``--rounds`` rounds, the path order rotating each round, so machine noise hits every path alike.
  Reported: p50 and p99 per path, and shim/direct (peer/direct) ratios.
* Steady state: ``--steady-pods`` pods (kubelet's default max, 110) running on the shim's node for
  ``--steady-seconds``: kubelet's CRI calls per second by method (from the shim's metrics) and
  the shim's CPU as a percent of one core (utime+stime from /proc); the same CPU figure for the
  peer proxy, and kubelet's own CPU on each node for scale.

Usage: ``python bench/node_overhead.py [--json] [--pods N] [--rounds N] [--steady-pods N]
[--steady-seconds S] [--containerd debian|2] [--peer-binary PATH]``. Needs root and the testbin
binaries. Prints a table and one JSON object (only the JSON object with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch

from kubegpu.devenv.containerd import BUSYBOX_IMAGE, containerd2_bin_dir
from kubegpu.localcluster.cluster import LocalCluster
from kubegpu.localcluster.node import LocalNode, PeerProxy

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PRODUCTION_ADVERTISE_INTERVAL = 10.0  # kubegpu crishim's default --advertise-interval
SETTLE_SECONDS = 10.0


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def percentile(samples: list[float], pct: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def koord_runtime_proxy(binary: str) -> Callable[[Path, str], list[str]]:
    """Command of koord-runtime-proxy in front of containerd.

    It creates and watches ``/etc/runtime/hookserver.d``; a tmpfs over /etc in its own mount
    namespace keeps that off the host (it needs nothing else from /etc: unix sockets only).
    """
    def command(listen: Path, runtime_endpoint: str) -> list[str]:
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                'mount -t tmpfs kubegpu-peer-etc /etc && exec "$0" "$@"', binary,
                f"--koord-runtimeproxy-endpoint={listen}",
                f"--remote-runtime-service-endpoint={runtime_endpoint.removeprefix('unix://')}",
                "--backend-runtime-mode=Containerd"]
    return command


def plain_pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "hostNetwork": True,
            "terminationGracePeriodSeconds": 1,
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "containers": [{"name": "app", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                            "command": ["/bin/sleep", "1000000"]}],
        },
    }


def all_running(found: Any) -> bool:
    """A watched pod (dict from the raw stream) with every container running."""
    status = found.get("status") or {}
    statuses = status.get("containerStatuses") or []
    return status.get("phase") == "Running" and bool(statuses) and all(
        "running" in (s.get("state") or {}) for s in statuses)


@dataclass
class Route:
    """One way kubelet reaches containerd (a node), and the namespace of its pods."""

    name: str
    node: LocalNode
    namespace: str
    latencies: list[float] = field(default_factory=list)


def ensure_namespace(core: k8s.CoreV1Api, name: str) -> None:
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    deadline = time.monotonic() + 60
    while not core.list_namespaced_service_account(name, field_selector="metadata.name=default").items:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no default ServiceAccount in {name}")
        time.sleep(0.2)


def start_pods(core: k8s.CoreV1Api, path: Route, count: int, prefix: str, timeout: float) -> list[float]:
    """Create ``count`` pods at once on the path's node; return each one's create-to-running time."""
    created: dict[str, float] = {}
    running: dict[str, float] = {}
    stream = watch.Watch()
    ready = threading.Event()

    def watcher() -> None:
        listing = core.list_namespaced_pod(path.namespace)
        ready.set()
        for event in stream.stream(core.list_namespaced_pod, path.namespace,
                                   resource_version=listing.metadata.resource_version,
                                   _preload_content=False, timeout_seconds=int(timeout)):
            found = event["raw_object"]
            name = found["metadata"]["name"]
            if name not in running and all_running(found):
                running[name] = time.monotonic()
                if len(running) == count:
                    stream.stop()

    thread = threading.Thread(target=watcher, daemon=True)
    thread.start()
    ready.wait(30)
    for index in range(count):
        name = f"{prefix}-{index}"
        created[name] = time.monotonic()
        core.create_namespaced_pod(path.namespace, plain_pod(name, path.node.name))
    thread.join(timeout)
    stream.stop()
    missing = sorted(set(created) - set(running))
    if missing:
        raise TimeoutError(f"{path.name}: {len(missing)} pods not running after {timeout:.0f}s: "
                           f"{missing[:5]}")
    return [running[name] - created[name] for name in created]


def delete_pods(core: k8s.CoreV1Api, namespace: str, timeout: float) -> None:
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=1)
    deadline = time.monotonic() + timeout
    while core.list_namespaced_pod(namespace).items:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods of {namespace} not gone after {timeout:.0f}s")
        time.sleep(0.5)


def shim_calls(node: LocalNode) -> dict[str, float]:
    """kubegpu_crishim_calls_total summed over codes, by method."""
    assert node.shim is not None
    text = urllib.request.urlopen(node.shim.metrics_url + "/metrics", timeout=10).read().decode()
    calls: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("kubegpu_crishim_calls_total{"):
            labels, value = line.rsplit(" ", 1)
            method = labels.split('method="', 1)[1].split('"', 1)[0]
            calls[method] = calls.get(method, 0.0) + float(value)
    return calls


def proxy_pid(node: LocalNode) -> int | None:
    if node.shim is not None and node.shim.process is not None:
        return node.shim.process.pid
    if node.peer is not None and node.peer.process is not None:
        return node.peer.process.pid  # nsenter, unshare and sh exec: this is the proxy itself
    return None


def steady_state(core: k8s.CoreV1Api, path: Route, pods: int, seconds: float, timeout: float
                 ) -> dict[str, Any]:
    start_pods(core, path, pods, "steady", timeout)
    time.sleep(SETTLE_SECONDS)
    node = path.node
    assert node.kubelet is not None and node.kubelet.component is not None
    assert node.kubelet.component.process is not None
    kubelet = node.kubelet.component.process.pid
    proxy = proxy_pid(node)
    calls_before = shim_calls(node) if node.shim else {}
    cpu_before = {pid: process_cpu_seconds(pid) for pid in (kubelet, proxy) if pid}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    cpu = {pid: (process_cpu_seconds(pid) - before) / elapsed * 100 for pid, before in cpu_before.items()}
    result: dict[str, Any] = {"pods": pods, "seconds": round(elapsed, 1),
                              "kubelet_cpu_percent_of_core": round(cpu[kubelet], 2)}
    if proxy:
        result["proxy_cpu_percent_of_core"] = round(cpu[proxy], 2)
    if node.shim:
        after = shim_calls(node)
        rates = {m: round((after[m] - calls_before.get(m, 0.0)) / elapsed, 3) for m in sorted(after)}
        result["cri_calls_per_second"] = {m: r for m, r in rates.items() if r > 0}
        result["cri_calls_per_second_total"] = round(sum(rates.values()), 3)
    delete_pods(core, path.namespace, timeout)
    return result


def summary(latencies: list[float]) -> dict[str, float]:
    return {"p50_s": round(statistics.median(latencies), 4), "p99_s": round(percentile(latencies, 99), 4)}


def run(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="kgbench-", dir="/tmp"))
    cluster = LocalCluster(state)
    bin_dir = containerd2_bin_dir() if args.containerd == "2" else None
    if args.containerd == "2" and bin_dir is None:
        raise SystemExit("containerd 2.x is not built: bash tests/containerd/build.sh")
    try:
        say("starting the cluster")
        cluster.start()
        nodes = {
            "direct": cluster.add_node("bench-direct", bin_dir, proxy="none", max_pods=args.steady_pods),
            "shim": cluster.add_node("bench-shim", bin_dir, proxy="kubegpu", max_pods=args.steady_pods,
                                     advertise_interval=PRODUCTION_ADVERTISE_INTERVAL),
        }
        if args.peer_binary:
            peer = PeerProxy(Path(args.peer_binary).name, koord_runtime_proxy(args.peer_binary))
            nodes["peer"] = cluster.add_node("bench-peer", bin_dir, proxy=peer, max_pods=args.steady_pods)
        with cluster.admin_client() as admin:
            core = k8s.CoreV1Api(admin)
            paths = {}
            for name, node in nodes.items():
                ensure_namespace(core, f"bench-{name}")
                paths[name] = Route(name, node, f"bench-{name}")
            for route in paths.values():  # unpack the image and warm each node's caches first
                start_pods(core, route, 1, "warmup", args.timeout)
                delete_pods(core, route.namespace, args.timeout)
            order = list(paths)
            for round_index in range(args.rounds):
                rotated = order[round_index % len(order):] + order[:round_index % len(order)]
                for name in rotated:
                    latencies = start_pods(core, paths[name], args.pods, f"r{round_index}", args.timeout)
                    paths[name].latencies += latencies
                    say(f"round {round_index + 1}/{args.rounds} {name}: p50 "
                        f"{statistics.median(latencies):.3f}s")
                    delete_pods(core, paths[name].namespace, args.timeout)
            say(f"steady state: {args.steady_pods} pods for {args.steady_seconds:.0f}s on the shim's node")
            steady = steady_state(core, paths["shim"], args.steady_pods, args.steady_seconds, args.timeout)
            peer_steady = None
            if "peer" in paths:
                say(f"steady state: {args.steady_pods} pods for {args.steady_seconds:.0f}s on the peer's "
                    "node")
                peer_steady = steady_state(core, paths["peer"], args.steady_pods, args.steady_seconds,
                                           args.timeout)
    finally:
        left = cluster.stop()
        shutil.rmtree(state, ignore_errors=True)
        if left:
            say(f"warning: left behind: {left}")
    direct, shim = summary(paths["direct"].latencies), summary(paths["shim"].latencies)
    result: dict[str, Any] = {
        "pod_start": {
            "pods": len(paths["shim"].latencies),
            "rounds": args.rounds,
            "pods_per_round": args.pods,
            "direct_p50_s": direct["p50_s"],
            "shim_p50_s": shim["p50_s"],
            "direct_p99_s": direct["p99_s"],
            "shim_p99_s": shim["p99_s"],
            "ratio_p50": round(shim["p50_s"] / direct["p50_s"], 3),
            "ratio_p99": round(shim["p99_s"] / direct["p99_s"], 3),
        },
        "steady_state": {
            "pods": steady["pods"],
            "seconds": steady["seconds"],
            "cri_calls_per_second": steady.get("cri_calls_per_second", {}),
            "cri_calls_per_second_total": steady.get("cri_calls_per_second_total", 0.0),
            "shim_cpu_percent_of_core": steady.get("proxy_cpu_percent_of_core"),
            "kubelet_cpu_percent_of_core": steady["kubelet_cpu_percent_of_core"],
        },
        "peer": None,
        "containerd": "debian 1.6" if bin_dir is None else bin_dir.name,
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "load_average": [round(x, 2) for x in os.getloadavg()]},
    }
    if "peer" in paths and peer_steady is not None:
        peer = summary(paths["peer"].latencies)
        result["peer"] = {
            "name": Path(args.peer_binary).name,
            "binary": str(args.peer_binary),
            "p50_s": peer["p50_s"],
            "p99_s": peer["p99_s"],
            "ratio_p50": round(peer["p50_s"] / direct["p50_s"], 3),
            "ratio_p99": round(peer["p99_s"] / direct["p99_s"], 3),
            "cpu_percent_of_core": peer_steady.get("proxy_cpu_percent_of_core"),
            "kubelet_cpu_percent_of_core": peer_steady["kubelet_cpu_percent_of_core"],
        }
    return result


def table(result: dict[str, Any]) -> str:
    start, steady, peer = result["pod_start"], result["steady_state"], result["peer"]
    rows = [("path", "pod start p50 s", "p99 s", "p50 / direct", f"CPU % of a core ({steady['pods']} pods)"),
            ("direct", f"{start['direct_p50_s']:.3f}", f"{start['direct_p99_s']:.3f}", "1.000", "-"),
            ("kubegpu shim", f"{start['shim_p50_s']:.3f}", f"{start['shim_p99_s']:.3f}",
             f"{start['ratio_p50']:.3f}", f"{steady['shim_cpu_percent_of_core']}")]
    if peer:
        rows.append((peer["name"], f"{peer['p50_s']:.3f}", f"{peer['p99_s']:.3f}", f"{peer['ratio_p50']:.3f}",
                     f"{peer['cpu_percent_of_core']}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    rates = sorted(steady["cri_calls_per_second"].items(), key=lambda item: -item[1])
    calls = ", ".join(f"{method} {rate}" for method, rate in rates)
    lines.append(f"kubelet's CRI calls/s with {steady['pods']} pods: {steady['cri_calls_per_second_total']} "
                 f"({calls})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--pods", type=int, default=100, help="pods per pod-start run (default 100)")
    parser.add_argument("--rounds", type=int, default=3, help="pod-start rounds per path (default 3)")
    parser.add_argument("--steady-pods", type=int, default=110, help="steady-state pods (default 110)")
    parser.add_argument("--steady-seconds", type=float, default=120.0, help="steady window, s (default 120)")
    parser.add_argument("--containerd", choices=["debian", "2"], default="debian")
    parser.add_argument("--peer-binary", help="another CRI proxy to measure beside the shim "
                        "(koord-runtime-proxy command line)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-run timeout in seconds")
    args = parser.parse_args(argv)
    if args.pods < 1 or args.rounds < 1 or args.steady_pods < 1 or args.steady_seconds <= 0:
        parser.error("--pods, --rounds, --steady-pods and --steady-seconds must be positive")
    if args.peer_binary and not os.access(args.peer_binary, os.X_OK):
        parser.error(f"--peer-binary {args.peer_binary} is not an executable file")
    say: Callable[[str], None] = (lambda _: None) if args.json else (lambda m: print(m, file=sys.stderr))
    result = run(args, say)
    if not args.json:
        print(table(result))
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
