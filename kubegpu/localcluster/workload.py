"""The demo's mixed workload on the local cluster, and the report of who got which GPUs.

Five pods in namespace ``kubegpu-demo``, all scheduled by kubegpu onto the node's 8 simulated
DGX-1 V100 GPUs:

* ``train-4``: 4 whole GPUs for a short job (it finishes after ``JOB_SECONDS``);
* ``train-2``: 2 whole GPUs;
* ``infer-a`` and ``infer-b``: a 500- and a 250-milli share of one GPU;
* ``train-4-next``: 4 whole GPUs, which cannot fit until ``train-4`` finishes: it waits, with the
  scheduler's reason, then runs on the freed GPUs.

Each container prints the devices it sees; the report shows, per pod, the GPUs (``gpuN`` as on
the node), the share, how well a multi-GPU set is linked (NVLink pairs and the weakest PCIe
path, from the node's published topology) and what the container itself saw.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from devices.model import NodeInventory, PCIeRelation, Topology
from kubegpu.allocation import ANNOTATION, verify
from kubegpu.devenv.containerd import BUSYBOX_IMAGE
from kubegpu.localcluster.cluster import INVENTORY_ANNOTATION, LocalCluster, verifying_keys

NAMESPACE = "kubegpu-demo"
JOB_SECONDS = 15
SHOW = "echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; echo SEES $(ls /dev/kubegpu-sim 2>/dev/null)"


def demo_pod(name: str, gpus: int = 0, milli: int = 0, seconds: int | None = None,
             scheduler: str = "kubegpu") -> dict[str, Any]:
    """A busybox pod that shows its devices, then sleeps (``seconds``: exits after that)."""
    then = f"sleep {seconds}" if seconds else "sleep 1000000"
    annotations = {"kubegpu.io/gpu-milli": str(milli)} if milli else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations},
        "spec": {
            "schedulerName": scheduler,
            "hostNetwork": True,
            "restartPolicy": "Never" if seconds else "Always",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", f"{SHOW}; {then}"],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {},
            }],
        },
    }


WORKLOAD = (
    demo_pod("train-4", gpus=4, seconds=JOB_SECONDS),
    demo_pod("train-2", gpus=2),
    demo_pod("infer-a", milli=500),
    demo_pod("infer-b", milli=250),
)
WAITER = demo_pod("train-4-next", gpus=4)


def link_summary(topology: Topology, devices: list[str]) -> str:
    """How well a GPU set is linked: NVLink on every pair (and how many links), else the weakest path."""
    if len(devices) < 2:
        return "-"
    pairs = list(itertools.combinations(devices, 2))
    links = [topology.nvlink_count(a, b) for a, b in pairs]
    if all(links) and len(pairs) == 1:
        return f"NVLink ({links[0]} links)"
    if all(links):
        return f"NVLink on all {len(pairs)} pairs ({sum(links)} links)"
    worst = max(topology.pcie_relation(a, b) for a, b in pairs)
    nvlinked = sum(1 for n in links if n)
    return f"NVLink on {nvlinked}/{len(pairs)} pairs; weakest path {PCIeRelation(worst).name}"


@dataclass
class PodReport:
    name: str
    phase: str
    gpus: str
    share: str
    links: str
    seen: str


def _indices(inventory: NodeInventory, devices: list[str]) -> list[str]:
    by_id = inventory.by_id()
    return [f"gpu{by_id[d].index}" if d in by_id else d for d in devices]


def report_pod(core: k8s.CoreV1Api, found: k8s.V1Pod, keys: Mapping[str, Any], inventory: NodeInventory
               ) -> PodReport:
    name = found.metadata.name
    value = (found.metadata.annotations or {}).get(ANNOTATION)
    if not value:
        return PodReport(name, found.status.phase or "?", "-", "-", "-", "(waiting for GPUs)")
    allocation = verify(value, keys)
    entry = allocation.containers["app"]
    devices = list(entry.devices)
    share = ", ".join(f"{s.milli}/1000" for s in entry.shares.values()) or "whole"
    try:
        log = core.read_namespaced_pod_log(name, NAMESPACE, container="app")
        seen = next((line[5:] for line in log.splitlines() if line.startswith("SEES ")), "")
    except k8s.ApiException:
        seen = ""
    return PodReport(name, found.status.phase or "?", " ".join(_indices(inventory, devices)), share,
                     link_summary(inventory.topology, devices), seen or "(not started)")


def format_table(rows: list[PodReport]) -> str:
    header = ("POD", "PHASE", "GPUS", "SHARE", "LINKS", "CONTAINER SEES")
    cells = [header] + [(r.name, r.phase, r.gpus, r.share, r.links, r.seen) for r in rows]
    widths = [max(len(str(row[i])) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def _wait(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"demo: {what} not done after {timeout:.0f}s")
        time.sleep(0.5)


def _phase(core: k8s.CoreV1Api, name: str) -> str:
    return core.read_namespaced_pod(name, NAMESPACE).status.phase or ""


def _waiting_reason(core: k8s.CoreV1Api, name: str) -> str:
    events = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}").items
    reasons = [e.message for e in events if e.reason == "FailedScheduling" and e.message]
    return reasons[-1] if reasons else ""


def run(cluster: LocalCluster, node: str, out: Callable[[str], None] = print, timeout: float = 120) -> int:
    """Run the workload on ``node``, print what happened; 0 when every pod ran as expected."""
    keys = verifying_keys(cluster.node_keys)
    with cluster.admin_client() as admin:
        core = k8s.CoreV1Api(admin)
        if not any(n.metadata.name == NAMESPACE for n in core.list_namespace().items):
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE)))
        _wait("the default ServiceAccount", lambda: bool(core.list_namespaced_service_account(
            NAMESPACE, field_selector="metadata.name=default").items), 30)
        inventory = NodeInventory.from_public(
            json.loads(core.read_node(node).metadata.annotations[INVENTORY_ANNOTATION]))
        for body in WORKLOAD:
            core.create_namespaced_pod(NAMESPACE, body)
        names = [b["metadata"]["name"] for b in WORKLOAD]
        started = ("Running", "Succeeded")
        _wait("the first pods", lambda: all(_phase(core, n) in started for n in names), timeout)
        core.create_namespaced_pod(NAMESPACE, WAITER)
        waiter = WAITER["metadata"]["name"]
        _wait(f"the scheduler's answer for {waiter}", lambda: bool(_waiting_reason(core, waiter)), 60)

        def table() -> str:
            pods = [core.read_namespaced_pod(n, NAMESPACE) for n in [*names, "train-4-next"]]
            return format_table([report_pod(core, p, keys, inventory) for p in pods])

        out(f"\nkubegpu placed the workload on {node} (8 simulated DGX-1 V100 GPUs):\n")
        out(table())
        out(f"\ntrain-4-next waits: {_waiting_reason(core, 'train-4-next')}")
        out(f"train-4 is a {JOB_SECONDS}s job; when it finishes its GPUs go to train-4-next ...")
        _wait("train-4-next", lambda: _phase(core, "train-4-next") == "Running", timeout + JOB_SECONDS)
        out("\n" + table())
    return 0
