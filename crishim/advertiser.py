"""The advertiser: publish this node's devices on its Node object, off the CRI path.

What it writes (docs/advertiser.md is the contract the scheduler reads):
- annotation ``kubegpu.io/inventory``: ``{"version": 1, "devices": [...], "topology": {...}}``
  (``NodeInventory.public()``: ids, models, memory, NUMA, PCI ids, health, links; no host paths);
- annotation ``kubegpu.io/heartbeat``: RFC 3339 UTC time of the last successful publish; the
  scheduler treats a node whose heartbeat is older than its staleness limit as unschedulable;
- ``status.capacity`` and ``status.allocatable``: device counts as extended resources
  (``nvidia.com/gpu`` by default: the healthy GPUs; ``kubegpu.io/rdma`` by default: the RDMA
  interfaces a pod can be given, the usable VFs as the scheduler reads them, ``devices.nics``:
  healthy VFs of a healthy PF with a known rate, never the PFs), so that kube-scheduler's own count
  of the resource and kubegpu's VF filter agree.

Inventory and capacity are patched only when they differ from what the Node already says; the
heartbeat alone is refreshed every ``heartbeat_seconds``. API errors back off exponentially. It
runs in its own thread: a slow or absent API server never delays a CRI call.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from devices.model import DeviceKind, NodeInventory
from devices.nics import assignable_vfs
from kubegpu.allocation import GPU_RESOURCE, RDMA_RESOURCE
from kubegpu.logs import log_event
from kubegpu.nodeannotations import HEARTBEAT_ANNOTATION as HEARTBEAT_ANNOTATION
from kubegpu.nodeannotations import INVENTORY_ANNOTATION as INVENTORY_ANNOTATION
from kubegpu.nodeannotations import INVENTORY_VERSION

log = logging.getLogger("kubegpu.advertiser")
DEFAULT_RESOURCES: Mapping[DeviceKind, str] = {
    DeviceKind.GPU: GPU_RESOURCE,
    DeviceKind.RDMA: RDMA_RESOURCE,
}


@dataclass(frozen=True)
class Publication:
    """What the node should say about its devices."""

    inventory: str  # the annotation value (canonical JSON)
    capacity: Mapping[str, str]  # extended resource name -> count

    def as_dict(self) -> dict[str, Any]:
        return {
            "annotations": {INVENTORY_ANNOTATION: json.loads(self.inventory)},
            "capacity": dict(self.capacity),
        }


def publication(
    inventory: NodeInventory, resources: Mapping[DeviceKind, str] = DEFAULT_RESOURCES
) -> Publication:
    """The annotation and capacity for ``inventory`` (health already folded into the devices)."""
    doc = {"version": INVENTORY_VERSION, **inventory.public()}
    counts = {name: 0 for name in resources.values()}
    for device in inventory.devices:
        name = resources.get(device.kind)
        if name is not None and device.healthy and device.kind is not DeviceKind.RDMA:
            counts[name] += 1
    rdma = resources.get(DeviceKind.RDMA)
    if rdma is not None:  # what a pod asking for the resource gets: VFs (kubegpu.io/rdma-interfaces)
        counts[rdma] += assignable_vfs(inventory)
    return Publication(
        inventory=json.dumps(doc, sort_keys=True, separators=(",", ":")),
        capacity={name: str(count) for name, count in sorted(counts.items())},
    )


def needed_changes(node: Any, wanted: Publication) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(metadata patch, status patch) to make ``node`` say ``wanted``; None where already true."""
    annotations = (node.metadata.annotations or {}) if node.metadata else {}
    metadata_patch = None
    if annotations.get(INVENTORY_ANNOTATION) != wanted.inventory:
        metadata_patch = {"metadata": {"annotations": {INVENTORY_ANNOTATION: wanted.inventory}}}
    capacity = (node.status.capacity or {}) if node.status else {}
    allocatable = (node.status.allocatable or {}) if node.status else {}
    status_patch = None
    if any(capacity.get(k) != v or allocatable.get(k) != v for k, v in wanted.capacity.items()):
        status_patch = {"status": {"capacity": dict(wanted.capacity), "allocatable": dict(wanted.capacity)}}
    return metadata_patch, status_patch


def heartbeat_patch(now: dt.datetime) -> dict[str, Any]:
    stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"metadata": {"annotations": {HEARTBEAT_ANNOTATION: stamp}}}


def backoff(failures: int, base: float = 1.0, cap: float = 60.0) -> float:
    """Seconds to wait after ``failures`` consecutive API errors."""
    return min(cap, base * (2 ** max(0, failures - 1))) if failures else 0.0


class Advertiser:
    """Keeps one Node object's device annotation, capacity and heartbeat current."""

    def __init__(
        self,
        core_api: Any,
        node_name: str,
        inventory: Callable[[], NodeInventory],
        resources: Mapping[DeviceKind, str] = DEFAULT_RESOURCES,
        interval: float = 10.0,
        heartbeat_seconds: float = 30.0,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        self._api = core_api
        self.node_name = node_name
        self._inventory = inventory
        self._resources = resources
        self.interval = interval
        self.heartbeat_seconds = heartbeat_seconds
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self._last_heartbeat: dt.datetime | None = None
        self.patches = 0  # counts API writes, for tests and metrics
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sync_once(self) -> list[str]:
        """Publish if needed; returns what was written ('inventory', 'capacity', 'heartbeat')."""
        wanted = publication(self._inventory(), self._resources)
        node = self._api.read_node(self.node_name)
        metadata_patch, status_patch = needed_changes(node, wanted)
        written = []
        now = self._clock()
        due = (
            self._last_heartbeat is None
            or (now - self._last_heartbeat).total_seconds() >= self.heartbeat_seconds
        )
        if metadata_patch is not None or due:
            body = heartbeat_patch(now)
            if metadata_patch is not None:
                body["metadata"]["annotations"].update(metadata_patch["metadata"]["annotations"])
                written.append("inventory")
            self._api.patch_node(self.node_name, body)
            self.patches += 1
            self._last_heartbeat = now
            written.append("heartbeat")
        if status_patch is not None:
            self._api.patch_node_status(self.node_name, status_patch)
            self.patches += 1
            written.append("capacity")
        if written != ["heartbeat"] and written:
            log_event(
                log, "node.published", node=self.node_name, wrote=written, capacity=dict(wanted.capacity)
            )
        return written

    def run(self) -> None:
        """Loop until stop(): sync every interval, backing off on API errors."""
        failures = 0
        while not self._stop.is_set():
            try:
                self.sync_once()
                failures = 0
                wait = self.interval
            except Exception as error:  # API errors, network errors, plugin errors alike
                failures += 1
                wait = backoff(failures)
                log_event(
                    log,
                    "node.publish_failed",
                    logging.WARNING,
                    node=self.node_name,
                    error=str(error)[:300],
                    retry_in_seconds=wait,
                )
            self._stop.wait(wait)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="advertiser", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
