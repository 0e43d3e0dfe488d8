"""What the scheduler accepts from a node agent: the limits a published Node must keep.

A node agent writes its inventory (``kubegpu.io/inventory``), heartbeat and device counts on its
own Node; a broken or hostile one can write anything its credentials allow. The scheduler reads
those objects with pure checks from this module before any of it reaches a decision:

- ``document_problem(doc)``: the inventory document, field by field, before it becomes a
  ``NodeInventory`` (types, ranges, sizes, links naming listed devices, each pair once);
- ``heartbeat_problem(heartbeat, now)``: a heartbeat more than ``CLOCK_SKEW_SECONDS`` ahead of the
  scheduler's clock (a node whose heartbeat is from the future would never go stale);
- ``allocatable_problem(...)``: CPU, memory, pods and GPU counts beyond any real machine (they
  would stretch the scores every node is normalised against).

Fields it does not know are ignored (a newer agent may publish more). Each returns '' for what is
fine, else one sentence naming the field; the node is then left out
of every decision with that reason (docs/errors.md) until it publishes something valid. The limits
are far above real hardware so that they never refuse a real node.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from devices.model import DeviceKind, PCIeRelation

MAX_INVENTORY_BYTES = 256 * 1024  # the API server's limit on all of an object's annotations together
MAX_DEVICES = 512  # per node, GPUs and NICs together (a DGX H100: 8 GPUs, 10 NICs)
MAX_GPUS = 128
MAX_ID_CHARS = 128
MAX_TEXT_CHARS = 1024  # model names, PCI ids, attribute keys and values
MAX_ATTRIBUTES = 64
MAX_INDEX = 4095
MAX_NUMA = 1023
MAX_GPU_MEMORY_MIB = 16 * 1024 * 1024  # 16 TiB per GPU
MAX_NVLINKS = 256  # links between one pair of GPUs
MAX_CPU_MILLI = 1_000_000 * 1000  # a million cores
MAX_MEMORY_MIB = 1024**3  # 1 EiB
MAX_PODS = 100_000
MAX_GPU_RESOURCE = 100_000  # the GPU resource's count (time-sliced replicas included)
CLOCK_SKEW_SECONDS = 300.0  # how far ahead of the scheduler's clock a heartbeat may be

_KINDS = {k.value for k in DeviceKind}
_RELATIONS = {r.name for r in PCIeRelation}


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any, limit: int = MAX_TEXT_CHARS) -> bool:
    return isinstance(value, str) and len(value) <= limit and value.isprintable()


def _device_problem(k: int, device: Any) -> str:
    where = f"devices[{k}]"
    if not isinstance(device, Mapping):
        return f"{where} is not an object"
    ident = device.get("id")
    if not (_text(ident, MAX_ID_CHARS) and ident and ident.strip() == ident):
        return f"{where}.id must be a non-empty printable string of at most {MAX_ID_CHARS} characters"
    where = f"device {ident[:48]}"
    if not isinstance(device.get("kind"), str) or device["kind"] not in _KINDS:
        return f"{where}: kind must be one of {', '.join(sorted(_KINDS))}"
    index = device.get("index")
    if not (_whole(index) and 0 <= index <= MAX_INDEX):
        return f"{where}: index must be a whole number from 0 to {MAX_INDEX}"
    memory = device.get("memoryMiB", 0)
    if not (_whole(memory) and 0 <= memory <= MAX_GPU_MEMORY_MIB):
        return f"{where}: memoryMiB must be a whole number from 0 to {MAX_GPU_MEMORY_MIB}"
    numa = device.get("numa", -1)
    if not (_whole(numa) and -1 <= numa <= MAX_NUMA):
        return f"{where}: numa must be a whole number from -1 to {MAX_NUMA}"
    if not isinstance(device.get("healthy", True), bool):
        return f"{where}: healthy must be true or false"
    for key in ("model", "pci"):
        if not _text(device.get(key, "")):
            return f"{where}: {key} must be a printable string of at most {MAX_TEXT_CHARS} characters"
    attributes = device.get("attributes", {})
    if not isinstance(attributes, Mapping) or len(attributes) > MAX_ATTRIBUTES:
        return f"{where}: attributes must be an object of at most {MAX_ATTRIBUTES} entries"
    if not all(_text(key) and _text(value) for key, value in attributes.items()):
        return f"{where}: attribute keys and values must be printable strings"
    return ""


def _pair_problem(
    section: str, k: int, entry: Any, ids: set[str], seen: set[tuple[str, str]]
) -> tuple[str, tuple[str, str] | None]:
    where = f"topology.{section}[{k}]"
    if not isinstance(entry, list) or len(entry) != 3:
        return f"{where} must be [device, device, value]", None
    a, b, _ = entry
    if not (isinstance(a, str) and isinstance(b, str)):
        return f"{where} must name two devices by id", None
    for name in (a, b):
        if name not in ids:
            return f"{where} names {name[:48]!r}, which is not listed", None
    if a == b:
        return f"{where} links {a[:48]} with itself", None
    key = (a, b) if a <= b else (b, a)
    if key in seen:
        return f"{where}: that pair is listed twice", None
    return "", key


def _topology_problem(topology: Any, gpus: set[str], nics: set[str]) -> str:
    if not isinstance(topology, Mapping):
        return "topology must be an object"
    nvlink, pcie = topology.get("nvlink", []), topology.get("pcie", [])
    limit = len(gpus | nics) ** 2
    for section, entries in (("nvlink", nvlink), ("pcie", pcie)):
        if not isinstance(entries, list) or len(entries) > limit:
            return f"topology.{section} must be a list of at most one entry per pair of devices"
    seen: set[tuple[str, str]] = set()
    for k, entry in enumerate(nvlink):
        problem, key = _pair_problem("nvlink", k, entry, gpus, seen)
        if problem:
            return problem
        if not (_whole(entry[2]) and 0 <= entry[2] <= MAX_NVLINKS):
            return f"topology.nvlink[{k}]: the link count must be a whole number from 0 to {MAX_NVLINKS}"
        seen.add(key)  # type: ignore[arg-type]
    seen.clear()
    for k, entry in enumerate(pcie):
        problem, key = _pair_problem("pcie", k, entry, gpus | nics, seen)
        if problem:
            return problem
        if not isinstance(entry[2], str) or entry[2] not in _RELATIONS:
            return f"topology.pcie[{k}]: the relation must be one of {', '.join(sorted(_RELATIONS))}"
        seen.add(key)  # type: ignore[arg-type]
    near = topology.get("nicGpus", {})
    if not isinstance(near, Mapping):
        return "topology.nicGpus must be an object"
    for nic, listed in near.items():
        if nic not in nics:
            return f"topology.nicGpus names {str(nic)[:48]!r}, which is not a listed NIC"
        if not isinstance(listed, list) or not all(isinstance(g, str) for g in listed):
            return f"topology.nicGpus[{nic[:48]}] must be a list of GPU ids"
        if len(set(listed)) != len(listed):
            return f"topology.nicGpus[{nic[:48]}] lists a GPU twice"
        strays = [g for g in listed if g not in gpus]
        if strays:
            return f"topology.nicGpus[{nic[:48]}] names {strays[0][:48]!r}, which is not a listed GPU"
    return ""


def document_problem(doc: Any) -> str:
    """'' if the parsed inventory document keeps every limit, else what is wrong with it."""
    if not isinstance(doc, Mapping):
        return "the inventory is not a JSON object"
    devices = doc.get("devices", [])
    if not isinstance(devices, list):
        return "devices must be a list"
    if len(devices) > MAX_DEVICES:
        return f"{len(devices)} devices (at most {MAX_DEVICES})"
    for k, device in enumerate(devices):
        problem = _device_problem(k, device)
        if problem:
            return problem
    ids = [d["id"] for d in devices]
    if len(set(ids)) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        return f"two devices share the id {duplicate[:48]}"
    gpus = {d["id"] for d in devices if d["kind"] == DeviceKind.GPU.value}
    nics = set(ids) - gpus
    if len(gpus) > MAX_GPUS:
        return f"{len(gpus)} GPUs (at most {MAX_GPUS})"
    indices = [d["index"] for d in devices if d["kind"] == DeviceKind.GPU.value]
    if len(set(indices)) != len(indices):
        return "two GPUs share an index"
    return _topology_problem(doc.get("topology", {}), gpus, nics)


def heartbeat_problem(heartbeat: dt.datetime | None, now: dt.datetime) -> str:
    """'' unless the heartbeat is further ahead of ``now`` than any clock skew explains."""
    if heartbeat is not None and (heartbeat - now).total_seconds() > CLOCK_SKEW_SECONDS:
        return f"node's device heartbeat is from the future ({heartbeat:%Y-%m-%dT%H:%M:%SZ})"
    return ""


def allocatable_problem(
    cpu_milli: int, memory_mib: int, max_pods: int | None, gpu_resource: int | None
) -> str:
    """'' if the node's allocatable could be a real machine's, else which figure could not."""
    if not 0 <= cpu_milli <= MAX_CPU_MILLI:
        return f"node's allocatable cpu is absurd ({cpu_milli // 1000} cores)"
    if not 0 <= memory_mib <= MAX_MEMORY_MIB:
        return f"node's allocatable memory is absurd ({memory_mib} MiB)"
    if max_pods is not None and not 0 <= max_pods <= MAX_PODS:
        return f"node's allocatable pods is absurd ({max_pods})"
    if gpu_resource is not None and not 0 <= gpu_resource <= MAX_GPU_RESOURCE:
        return f"node's allocatable GPU count is absurd ({gpu_resource})"
    return ""
