"""Benchmark: what the kubegpu shim costs a node, through the real kubelet.

One local cluster (kubegpu/localcluster) with one node per path, all on this machine and the
same containerd line: kubelet pointed directly at containerd (``direct``), through ``kubegpu
crishim`` with the sim plugin and its advertiser as a GPU node runs it (``shim``), and with
``--peer-binary`` through another CRI proxy (``peer``, e.g. Koordinator's koord-runtime-proxy).

* Pod start: ``--pods`` host-network pods per path, bound by ``spec.nodeName`` (no scheduler in
  the loop), started one at a time with the paths interleaved pod by pod (the order rotating), so
  machine noise hits every path alike. A pod's time runs from its create call to the event of one
  long-lived watch that shows all its containers running. Reported: p50 and p99 per path, the
  shim/direct (peer/direct) ratios, and the median of the paired differences (each path's pod
  minus direct's pod of the same turn), which cancels load that moves a whole turn. The pods
  stay, so later pods start on a fuller node, on every path alike.
* Steady state: every node topped up to ``--steady-pods`` (kubelet's default max, 110), then, after
  a settling pause, all measured over the same ``--steady-seconds``: kubelet's CRI calls per second
  by method (from the shim's metrics), the shim's and the peer's CPU as a percent of one core
  (utime+stime from /proc), and each kubelet's CPU for scale. No pod was deleted before, so no
  garbage collection runs in the window.

``--shim-without-api`` adds the shim with no API access (no advertiser, no pod lookups) as a
fourth path, to show what the API lookup of a pod without an allocation costs.

``--nri`` (needs ``--containerd 2``) adds the node agent as containerd's required NRI plugin
(``kubegpu crishim --front nri``, docs/nri.md; kubelet talks straight to containerd) as one more
path, interleaved with the others and measured in the same steady window. The JSON's ``"nri"``
object (``null`` without ``--nri``) gives ``pods`` (pods started on that path),
``pod_start_ratio_p50`` (its p50 over direct's p50 in the same run), the p50, p99, p99 ratio and
paired difference as for the other paths, ``agent_cpu_percent_of_core`` (the agent process's CPU
over the steady window, measured as the proxies' is) with ``steady_pods`` running, and its
kubelet's CPU.

Usage: ``python bench/node_overhead.py [--json] [--pods N] [--steady-pods N]
[--steady-seconds S] [--containerd debian|2] [--peer-binary PATH] [--shim-without-api] [--nri]``.
Needs root and the testbin binaries. Prints a table and one JSON object (only the JSON object
with ``--json``).
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
from kubegpu.localcluster.node import NRI_FRONT, LocalNode, PeerProxy

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


def refuse_unusable_peer(parser: argparse.ArgumentParser, peer_binary: str | None) -> None:
    """Exit 2 (argparse's usage error) when ``--peer-binary`` names no executable file."""
    if peer_binary and not os.access(peer_binary, os.X_OK):
        parser.error(f"--peer-binary {peer_binary} is not an executable file")


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


class RunningTimes:
    """One watch on a namespace for the whole run: when each pod was first seen with all its
    containers running (monotonic seconds)."""

    def __init__(self, core: k8s.CoreV1Api, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        self.times: dict[str, float] = {}
        self.changed = threading.Condition()
        self.stream = watch.Watch()
        self.stopped = False
        listing = core.list_namespaced_pod(namespace)
        self.version = listing.metadata.resource_version
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped:
            try:
                for event in self.stream.stream(self.core.list_namespaced_pod, self.namespace,
                                                resource_version=self.version, _preload_content=False,
                                                timeout_seconds=300):
                    found = event["raw_object"]
                    self.version = found["metadata"]["resourceVersion"]
                    name = found["metadata"]["name"]
                    if name not in self.times and all_running(found):
                        with self.changed:
                            self.times[name] = time.monotonic()
                            self.changed.notify_all()
            except Exception:  # an expired or broken watch: list again and go on
                if not self.stopped:
                    time.sleep(0.5)
                    self.version = self.core.list_namespaced_pod(self.namespace).metadata.resource_version

    def wait(self, names: list[str], timeout: float) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not all(name in self.times for name in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [n for n in names if n not in self.times]
                    raise TimeoutError(f"{self.namespace}: {len(missing)} pods not running after "
                                       f"{timeout:.0f}s: {missing[:5]}")
                self.changed.wait(min(left, 1.0))
            return {name: self.times[name] for name in names}

    def stop(self) -> None:
        self.stopped = True
        self.stream.stop()


@dataclass
class Route:
    """One way kubelet reaches containerd (a node), the namespace of its pods and their watch."""

    name: str
    node: LocalNode
    namespace: str
    running: RunningTimes
    latencies: list[float] = field(default_factory=list)
    started: int = 0

    def start(self, core: k8s.CoreV1Api, count: int, timeout: float) -> list[float]:
        """Create ``count`` pods at once; return each one's create-to-running time."""
        created = {}
        for _ in range(count):
            name = f"pod-{self.started}"
            self.started += 1
            created[name] = time.monotonic()
            core.create_namespaced_pod(self.namespace, plain_pod(name, self.node.name))
        running = self.running.wait(list(created), timeout)
        return [running[name] - created[name] for name in created]


def ensure_namespace(core: k8s.CoreV1Api, name: str) -> None:
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    deadline = time.monotonic() + 60
    while not core.list_namespaced_service_account(name, field_selector="metadata.name=default").items:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no default ServiceAccount in {name}")
        time.sleep(0.2)


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
    """The process of the node's CRI proxy, or of its NRI agent (``proxy="kubegpu-nri"``)."""
    if node.shim is not None and node.shim.process is not None:
        return node.shim.process.pid
    if node.peer is not None and node.peer.process is not None:
        return node.peer.process.pid  # nsenter, unshare and sh exec: this is the proxy itself
    return None


def kubelet_pid(node: LocalNode) -> int:
    assert node.kubelet is not None and node.kubelet.component is not None
    assert node.kubelet.component.process is not None
    return node.kubelet.component.process.pid


def steady_state(routes: list[Route], seconds: float) -> dict[str, dict[str, Any]]:
    """CPU of each route's proxy (or NRI agent) and kubelet (and, through the shim, kubelet's CRI
    calls by method) over the same ``seconds``, all routes at once."""
    pids = {route.name: (kubelet_pid(route.node), proxy_pid(route.node)) for route in routes}
    # the NRI agent is on no CRI call's path: it counts no CRI calls
    calls_before = {r.name: shim_calls(r.node) for r in routes if r.node.proxy == "kubegpu"}
    cpu_before = {pid: process_cpu_seconds(pid) for pair in pids.values() for pid in pair if pid}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    cpu = {pid: (process_cpu_seconds(pid) - before) / elapsed * 100 for pid, before in cpu_before.items()}
    results: dict[str, dict[str, Any]] = {}
    for route in routes:
        kubelet, proxy = pids[route.name]
        result: dict[str, Any] = {"seconds": round(elapsed, 1),
                                  "kubelet_cpu_percent_of_core": round(cpu[kubelet], 2)}
        if proxy:
            result["proxy_cpu_percent_of_core"] = round(cpu[proxy], 2)
        if route.name in calls_before:
            after = shim_calls(route.node)
            before = calls_before[route.name]
            rates = {m: round((after[m] - before.get(m, 0.0)) / elapsed, 3) for m in sorted(after)}
            result["cri_calls_per_second"] = {m: r for m, r in rates.items() if r > 0}
            result["cri_calls_per_second_total"] = round(sum(rates.values()), 3)
        results[route.name] = result
    return results


def summary(latencies: list[float]) -> dict[str, float]:
    return {"p50_s": round(statistics.median(latencies), 4), "p99_s": round(percentile(latencies, 99), 4)}


def paired_difference(path: list[float], direct: list[float]) -> float:
    """Median over the interleaved turns of (path's pod start - direct's pod start in the same turn):
    noise that moves a whole turn (the machine's load) cancels out."""
    return round(statistics.median(a - b for a, b in zip(path, direct, strict=True)), 4)


def nri_result(latencies: list[float], direct: list[float], steady: dict[str, Any],
               steady_pods: int) -> dict[str, Any]:
    """The JSON's ``"nri"`` object from the NRI path's pod starts, direct's pod starts of the same
    turns, and the NRI route's steady-state figures (those of ``steady_state``)."""
    nri, base = summary(latencies), summary(direct)
    return {
        "pods": len(latencies),
        "p50_s": nri["p50_s"],
        "p99_s": nri["p99_s"],
        "pod_start_ratio_p50": round(nri["p50_s"] / base["p50_s"], 3),
        "pod_start_ratio_p99": round(nri["p99_s"] / base["p99_s"], 3),
        "paired_difference_p50_s": paired_difference(latencies, direct),
        "steady_pods": steady_pods,
        "agent_cpu_percent_of_core": steady["proxy_cpu_percent_of_core"],
        "kubelet_cpu_percent_of_core": steady["kubelet_cpu_percent_of_core"],
    }


def run(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="kgbench-", dir="/tmp"))
    cluster = LocalCluster(state)
    bin_dir = containerd2_bin_dir() if args.containerd == "2" else None
    if args.containerd == "2" and bin_dir is None:
        raise SystemExit("containerd 2.x is not built: bash tests/containerd/build.sh")
    max_pods = max(args.pods + 1, args.steady_pods)
    routes: dict[str, Route] = {}
    try:
        say("starting the cluster")
        cluster.start()
        nodes = {
            "direct": cluster.add_node("bench-direct", bin_dir, proxy="none", max_pods=max_pods),
            "shim": cluster.add_node("bench-shim", bin_dir, proxy="kubegpu", max_pods=max_pods,
                                     advertise_interval=PRODUCTION_ADVERTISE_INTERVAL),
        }
        if args.shim_without_api:
            nodes["shim-no-api"] = cluster.add_node("bench-shim-no-api", bin_dir, proxy="kubegpu",
                                                    max_pods=max_pods, node_agent_api=False)
        if args.nri:
            nodes["nri"] = cluster.add_node("bench-nri", bin_dir, proxy=NRI_FRONT, max_pods=max_pods,
                                            advertise_interval=PRODUCTION_ADVERTISE_INTERVAL)
        if args.peer_binary:
            peer = PeerProxy(Path(args.peer_binary).name, koord_runtime_proxy(args.peer_binary))
            nodes["peer"] = cluster.add_node("bench-peer", bin_dir, proxy=peer, max_pods=max_pods)
        with cluster.admin_client() as admin:
            core = k8s.CoreV1Api(admin)
            for name, node in nodes.items():
                ensure_namespace(core, f"bench-{name}")
                routes[name] = Route(name, node, f"bench-{name}", RunningTimes(core, f"bench-{name}"))
            for route in routes.values():  # unpack the image, warm each node's caches
                route.start(core, 1, args.timeout)
            say(f"pod start: {args.pods} pods per path, one at a time, paths interleaved")
            order = list(routes)
            for index in range(args.pods):
                turn = index % len(order)
                for name in order[turn:] + order[:turn]:
                    routes[name].latencies += routes[name].start(core, 1, args.timeout)
                if (index + 1) % 20 == 0:
                    say(f"  {index + 1}/{args.pods}: " + ", ".join(
                        f"{n} p50 {statistics.median(r.latencies):.3f}s" for n, r in routes.items()))
            for route in routes.values():  # every node up to the steady-state count
                missing = args.steady_pods - route.started
                if missing > 0:
                    route.start(core, missing, args.timeout)
            say(f"steady state: {args.steady_pods} pods per node, {args.steady_seconds:.0f}s")
            time.sleep(SETTLE_SECONDS)
            steady = steady_state(list(routes.values()), args.steady_seconds)
            for route in routes.values():
                route.running.stop()
    finally:
        left = cluster.stop()
        shutil.rmtree(state, ignore_errors=True)
        if left:
            say(f"warning: left behind: {left}")
    direct, shim = summary(routes["direct"].latencies), summary(routes["shim"].latencies)
    direct_latencies = routes["direct"].latencies
    shim_steady = steady["shim"]
    result: dict[str, Any] = {
        "pod_start": {
            "pods": len(routes["shim"].latencies),
            "direct_p50_s": direct["p50_s"],
            "shim_p50_s": shim["p50_s"],
            "direct_p99_s": direct["p99_s"],
            "shim_p99_s": shim["p99_s"],
            "ratio_p50": round(shim["p50_s"] / direct["p50_s"], 3),
            "ratio_p99": round(shim["p99_s"] / direct["p99_s"], 3),
            "paired_difference_p50_s": paired_difference(routes["shim"].latencies, direct_latencies),
        },
        "steady_state": {
            "pods": args.steady_pods,
            "seconds": shim_steady["seconds"],
            "cri_calls_per_second": shim_steady.get("cri_calls_per_second", {}),
            "cri_calls_per_second_total": shim_steady.get("cri_calls_per_second_total", 0.0),
            "shim_cpu_percent_of_core": shim_steady.get("proxy_cpu_percent_of_core"),
            "kubelet_cpu_percent_of_core": shim_steady["kubelet_cpu_percent_of_core"],
            "direct_kubelet_cpu_percent_of_core": steady["direct"]["kubelet_cpu_percent_of_core"],
        },
        "peer": None,
        "nri": None,
        "containerd": "debian 1.6" if bin_dir is None else bin_dir.name,
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "load_average": [round(x, 2) for x in os.getloadavg()]},
    }
    if "shim-no-api" in routes:
        bare = summary(routes["shim-no-api"].latencies)
        result["shim_without_api"] = {
            "p50_s": bare["p50_s"], "p99_s": bare["p99_s"],
            "ratio_p50": round(bare["p50_s"] / direct["p50_s"], 3),
            "ratio_p99": round(bare["p99_s"] / direct["p99_s"], 3),
            "paired_difference_p50_s": paired_difference(routes["shim-no-api"].latencies, direct_latencies),
            "cpu_percent_of_core": steady["shim-no-api"].get("proxy_cpu_percent_of_core"),
        }
    if "nri" in routes:
        result["nri"] = nri_result(routes["nri"].latencies, direct_latencies, steady["nri"], args.steady_pods)
    if "peer" in routes:
        peer = summary(routes["peer"].latencies)
        result["peer"] = {
            "name": Path(args.peer_binary).name,
            "binary": str(args.peer_binary),
            "p50_s": peer["p50_s"],
            "p99_s": peer["p99_s"],
            "ratio_p50": round(peer["p50_s"] / direct["p50_s"], 3),
            "ratio_p99": round(peer["p99_s"] / direct["p99_s"], 3),
            "paired_difference_p50_s": paired_difference(routes["peer"].latencies, direct_latencies),
            "cpu_percent_of_core": steady["peer"].get("proxy_cpu_percent_of_core"),
            "kubelet_cpu_percent_of_core": steady["peer"]["kubelet_cpu_percent_of_core"],
        }
    return result


def table(result: dict[str, Any]) -> str:
    start, steady, peer = result["pod_start"], result["steady_state"], result["peer"]
    rows = [("path", "pod start p50 s", "p99 s", "p50 / direct", "paired diff s",
             f"CPU % of a core ({steady['pods']} pods)"),
            ("direct", f"{start['direct_p50_s']:.3f}", f"{start['direct_p99_s']:.3f}", "1.000", "-", "-"),
            ("kubegpu shim", f"{start['shim_p50_s']:.3f}", f"{start['shim_p99_s']:.3f}",
             f"{start['ratio_p50']:.3f}", f"{start['paired_difference_p50_s']:+.3f}",
             f"{steady['shim_cpu_percent_of_core']}")]
    bare = result.get("shim_without_api")
    if bare:
        rows.append(("shim, no API access", f"{bare['p50_s']:.3f}", f"{bare['p99_s']:.3f}",
                     f"{bare['ratio_p50']:.3f}", f"{bare['paired_difference_p50_s']:+.3f}",
                     f"{bare['cpu_percent_of_core']}"))
    nri = result.get("nri")
    if nri:
        rows.append(("kubegpu NRI agent", f"{nri['p50_s']:.3f}", f"{nri['p99_s']:.3f}",
                     f"{nri['pod_start_ratio_p50']:.3f}", f"{nri['paired_difference_p50_s']:+.3f}",
                     f"{nri['agent_cpu_percent_of_core']}"))
    if peer:
        rows.append((peer["name"], f"{peer['p50_s']:.3f}", f"{peer['p99_s']:.3f}", f"{peer['ratio_p50']:.3f}",
                     f"{peer['paired_difference_p50_s']:+.3f}", f"{peer['cpu_percent_of_core']}"))
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
    parser.add_argument("--pods", type=int, default=100, help="pods started per path (default 100)")
    parser.add_argument("--steady-pods", type=int, default=110, help="steady-state pods (default 110)")
    parser.add_argument("--steady-seconds", type=float, default=120.0, help="steady window, s (default 120)")
    parser.add_argument("--containerd", choices=["debian", "2"], default="debian")
    parser.add_argument("--peer-binary", help="another CRI proxy to measure beside the shim "
                        "(koord-runtime-proxy command line)")
    parser.add_argument("--shim-without-api", action="store_true",
                        help="also measure the shim with no API access (no advertiser, no pod lookups)")
    parser.add_argument("--nri", action="store_true",
                        help="also measure the node agent as containerd's NRI plugin (needs --containerd 2)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-run timeout in seconds")
    args = parser.parse_args(argv)
    if args.pods < 1 or args.steady_pods < 1 or args.steady_seconds <= 0:
        parser.error("--pods, --steady-pods and --steady-seconds must be positive")
    refuse_unusable_peer(parser, args.peer_binary)
    if args.nri and args.containerd != "2":
        parser.error("--nri needs --containerd 2 (containerd 1.6 has no NRI)")
    say: Callable[[str], None] = (lambda _: None) if args.json else (lambda m: print(m, file=sys.stderr))
    result = run(args, say)
    if not args.json:
        print(table(result))
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
