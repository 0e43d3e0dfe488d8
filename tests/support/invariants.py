"""The device invariants of a node, checked by comparing what the API and containerd say.

* the API: the verified ``kubegpu.io/allocation`` of every pod bound to the node;
* containerd (asked directly, not through the shim): every live container the shim created
  carries ``kubegpu.io/devices`` (pod UID, container name, device -> milli), which is also what
  the shim rebuilds its ledger from after a restart.

``problems(...)`` lists every violation:

* a device held past 1000 milli by live containers (a double allocation, the one that matters;
  the attempts of one container count once, as the shim's ledger counts them);
* a live container holding a device its pod's allocation does not give that container;
* (``settled=True``) a live container of a pod the API no longer has, or a running GPU pod
  whose containers containerd does not know (a lost pod).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client as k8s

from crishim.cri import api_pb2
from kubegpu.allocation import ANNOTATION, AllocationError, verify
from kubegpu.devenv.cri import CriClient
from kubegpu.localcluster.cluster import verifying_keys

MARK = "kubegpu.io/devices"
LIVE_STATES = (api_pb2.CONTAINER_CREATED, api_pb2.CONTAINER_RUNNING)


@dataclass
class Holding:
    pod_uid: str
    container: str
    devices: dict[str, int]
    container_id: str = ""
    state: str = ""
    attempt: int = 0

    def describe(self, names: Mapping[str, str]) -> str:
        pod = names.get(self.pod_uid, f"pod {self.pod_uid} (gone from the API)")
        return f"{pod}/{self.container} attempt {self.attempt} ({self.container_id[:12]}, {self.state})"


@dataclass
class NodeView:
    """One look at the API and at containerd."""

    # pod uid -> container -> device -> milli
    api: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # uid -> namespace/name
    running_gpu_pods: set[str] = field(default_factory=set)  # uids the API says run with devices
    live: list[Holding] = field(default_factory=list)  # live marked containers in containerd


def api_allocations(core: k8s.CoreV1Api, node: str, keys_dir: Path) -> tuple[
        dict[str, dict[str, dict[str, int]]], dict[str, str], set[str]]:
    keys = verifying_keys(keys_dir)
    allocations: dict[str, dict[str, dict[str, int]]] = {}
    names: dict[str, str] = {}
    running: set[str] = set()
    for found in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items:
        value = (found.metadata.annotations or {}).get(ANNOTATION)
        if not value:
            continue
        try:
            allocation = verify(value, keys)
        except AllocationError:
            continue
        uid = found.metadata.uid
        names[uid] = f"{found.metadata.namespace}/{found.metadata.name}"
        allocations[uid] = {
            name: {d: (entry.shares[d].milli if d in entry.shares else 1000) for d in entry.devices}
            for name, entry in allocation.containers.items()
        }
        if found.status.phase == "Running" and not found.metadata.deletion_timestamp:
            running.add(uid)
    return allocations, names, running


def runtime_holdings(endpoint: str) -> list[Holding]:
    client = CriClient(endpoint)
    try:
        listing = client.runtime.ListContainers(api_pb2.ListContainersRequest(), timeout=30)
    finally:
        client.close()
    holdings = []
    for entry in listing.containers:
        if entry.state not in LIVE_STATES or MARK not in entry.annotations:
            continue
        mark = json.loads(entry.annotations[MARK])
        devices = {k: int(v) for k, v in mark["devices"].items()}
        holdings.append(Holding(mark["pod"], mark["container"], devices, entry.id,
                                api_pb2.ContainerState.Name(entry.state), entry.metadata.attempt))
    return holdings


def look(core: k8s.CoreV1Api, node: str, keys_dir: Path, containerd_endpoint: str) -> NodeView:
    allocations, names, running = api_allocations(core, node, keys_dir)
    return NodeView(allocations, names, running, runtime_holdings(containerd_endpoint))


def problems(view: NodeView, settled: bool = False) -> list[str]:
    found = []
    # device -> (pod uid, container name) -> the live attempts holding it. Attempts of one
    # container (kubelet creates the next before the last is removed) count once.
    held: dict[str, dict[tuple[str, str], list[Holding]]] = {}
    for holding in view.live:
        for device in holding.devices:
            held.setdefault(device, {}).setdefault((holding.pod_uid, holding.container), []).append(holding)
        granted = view.api.get(holding.pod_uid)
        if granted is None:
            if settled:
                found.append(f"containerd runs {holding.container} of pod {holding.pod_uid}, "
                             "which the API no longer has")
            continue
        allowed: Mapping[str, int] = granted.get(holding.container, {})
        extra = {d: m for d, m in holding.devices.items() if allowed.get(d) != m}
        if extra:
            found.append(f"{view.names[holding.pod_uid]}/{holding.container} holds {extra}, "
                         f"its allocation gives {dict(allowed)}")
    for device, holders in held.items():
        milli = sum(max(h.devices[device] for h in attempts) for attempts in holders.values())
        if milli > 1000:
            who = "; ".join(h.describe(view.names) for attempts in holders.values() for h in attempts)
            found.append(f"device {device} held {milli} milli (> 1000) by {who}")
    if settled:
        live_pods = {h.pod_uid for h in view.live}
        found += [f"{view.names[uid]} runs per the API but containerd has no container of it"
                  for uid in view.running_gpu_pods if uid not in live_pods]
    return found
