"""The allocation contract: which devices each container of a pod gets, signed by the scheduler.

The scheduler writes it as the pod annotation ``kubegpu.io/allocation`` (through the Binding, so
a pod is never bound without it); kubelet copies pod annotations into the CRI sandbox config,
where the shim reads it. Schema (version 1; docs/allocation.md is the normative description)::

    {"version": 1, "node": "gpu-node-7", "podUID": "5f0c...",
     "containers": {"train": {"devices": ["GPU-aaaa", "GPU-bbbb"]},
                    "infer": {"devices": ["GPU-cccc"],
                              "shares": {"GPU-cccc": {"milli": 250, "memoryMiB": 4096}}}},
     "keyId": "k1", "signature": "<base64 HMAC-SHA256>"}

The signature is HMAC-SHA256 with the cluster key named by ``keyId`` over the canonical form: the
document without ``signature``, as JSON with sorted keys, no whitespace, ASCII only. Annotations
never carry host paths: paths come only from the node's own plugins.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ANNOTATION = "kubegpu.io/allocation"
VERSION = 1
MAX_ANNOTATION_BYTES = 64 * 1024
MAX_CONTAINERS = 64
MAX_DEVICES_PER_CONTAINER = 64
# Device ids are GPU UUIDs, RDMA device names, or sim ids: no slashes, no dots-only, no spaces.
DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_:\-]{0,127}$")
CONTAINER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # DNS-1123 label
KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")


class AllocationError(ValueError):
    """The annotation is malformed, unsigned or badly signed; the message says which and why."""


@dataclass(frozen=True)
class Share:
    """A fractional share of one GPU."""

    milli: int  # 1..1000 of the GPU's compute
    memory_mib: int = 0  # 0: unspecified


@dataclass(frozen=True)
class ContainerAllocation:
    devices: tuple[str, ...]
    shares: Mapping[str, Share] = field(default_factory=dict, hash=False)
    # a regular init container: it runs alone, before the app containers start, so it may reuse
    # devices other containers of the pod get (Kubernetes' rule for init containers' resources)
    init: bool = False


@dataclass(frozen=True)
class Allocation:
    """A verified (or to-be-signed) allocation of one pod on one node."""

    node: str
    pod_uid: str
    containers: Mapping[str, ContainerAllocation]

    def all_devices(self) -> set[str]:
        return {d for c in self.containers.values() for d in c.devices}

    def to_document(self) -> dict[str, Any]:
        containers: dict[str, Any] = {}
        for name, alloc in sorted(self.containers.items()):
            entry: dict[str, Any] = {"devices": list(alloc.devices)}
            if alloc.shares:
                entry["shares"] = {dev: _share_doc(s) for dev, s in sorted(alloc.shares.items())}
            if alloc.init:
                entry["init"] = True
            containers[name] = entry
        return {"version": VERSION, "node": self.node, "podUID": self.pod_uid, "containers": containers}


def _share_doc(share: Share) -> dict[str, int]:
    if share.memory_mib:
        return {"milli": share.milli, "memoryMiB": share.memory_mib}
    return {"milli": share.milli}


def canonical_bytes(document: Mapping[str, Any]) -> bytes:
    """The bytes that are signed: the document without its signature, canonical JSON."""
    unsigned = {k: v for k, v in document.items() if k != "signature"}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _mac(key: bytes, document: Mapping[str, Any]) -> str:
    return base64.b64encode(hmac.new(key, canonical_bytes(document), hashlib.sha256).digest()).decode()


def sign(allocation: Allocation, key_id: str, key: bytes) -> str:
    """The annotation value for ``allocation``, signed with ``key`` under ``key_id``."""
    if not KEY_ID.match(key_id):
        raise AllocationError(f"invalid key id {key_id!r}")
    document = allocation.to_document()
    document["keyId"] = key_id
    document["signature"] = _mac(key, document)
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def verify(value: str, keys: Mapping[str, bytes]) -> Allocation:
    """Parse and verify an annotation value; raise AllocationError naming the problem."""
    if len(value) > MAX_ANNOTATION_BYTES:
        raise AllocationError(f"annotation is {len(value)} bytes, more than {MAX_ANNOTATION_BYTES}")
    try:
        document = json.loads(value)
    except (ValueError, RecursionError) as exc:
        raise AllocationError(f"annotation is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise AllocationError("annotation is not a JSON object")
    key_id = document.get("keyId")
    signature = document.get("signature")
    if not isinstance(signature, str) or not signature:
        raise AllocationError("annotation is unsigned")
    if not isinstance(key_id, str) or key_id not in keys:
        raise AllocationError(f"annotation is signed with unknown key id {key_id!r}")
    if not hmac.compare_digest(_mac(keys[key_id], document), signature):
        raise AllocationError(f"annotation signature does not verify with key {key_id!r}")
    return parse_document(document)


def parse_document(document: Mapping[str, Any]) -> Allocation:
    """Validate the shape of an allocation document (signature already checked)."""
    if document.get("version") != VERSION:
        raise AllocationError(f"unsupported allocation version {document.get('version')!r}")
    node, pod_uid, containers = document.get("node"), document.get("podUID"), document.get("containers")
    if not isinstance(node, str) or not node:
        raise AllocationError("allocation has no node name")
    if not isinstance(pod_uid, str) or not pod_uid:
        raise AllocationError("allocation has no pod UID")
    if not isinstance(containers, dict) or not containers:
        raise AllocationError("allocation has no containers")
    if len(containers) > MAX_CONTAINERS:
        raise AllocationError(f"allocation names {len(containers)} containers, more than {MAX_CONTAINERS}")
    parsed = {name: _parse_container(name, entry) for name, entry in containers.items()}
    _check_device_sharing(parsed)
    return Allocation(node=node, pod_uid=pod_uid, containers=parsed)


def _check_device_sharing(containers: Mapping[str, ContainerAllocation]) -> None:
    """A device may appear in several containers only as shares that add up to at most 1000,
    except that init containers (which run alone, before the others) may reuse any device."""
    holders: dict[str, list[str]] = {}
    for name, alloc in containers.items():
        for device in alloc.devices:
            if not alloc.init:
                holders.setdefault(device, []).append(name)
    for device, names in holders.items():
        if len(names) == 1:
            continue
        if any(device not in containers[n].shares for n in names):
            raise AllocationError(f"device {device} is given whole to one of {', '.join(sorted(names))}")
        if sum(containers[n].shares[device].milli for n in names) > 1000:
            raise AllocationError(f"shares of device {device} add up to more than 1000 milli")


def _parse_container(name: Any, entry: Any) -> ContainerAllocation:
    if not isinstance(name, str) or not CONTAINER_NAME.match(name):
        raise AllocationError(f"invalid container name {str(name)[:80]!r}")
    if not isinstance(entry, dict):
        raise AllocationError(f"container {name}: entry is not an object")
    devices = entry.get("devices")
    if not isinstance(devices, list) or not devices:
        raise AllocationError(f"container {name}: no device list")
    if len(devices) > MAX_DEVICES_PER_CONTAINER:
        raise AllocationError(
            f"container {name}: {len(devices)} devices, more than {MAX_DEVICES_PER_CONTAINER}"
        )
    for device in devices:
        if not isinstance(device, str) or not DEVICE_ID.match(device):
            raise AllocationError(f"container {name}: invalid device id {str(device)[:80]!r}")
    if len(set(devices)) != len(devices):
        raise AllocationError(f"container {name}: a device is listed twice")
    shares_doc = entry.get("shares", {})
    if not isinstance(shares_doc, dict):
        raise AllocationError(f"container {name}: shares is not an object")
    shares: dict[str, Share] = {}
    for device, share in shares_doc.items():
        if device not in devices:
            raise AllocationError(f"container {name}: share for unlisted device {str(device)[:80]!r}")
        if not isinstance(share, dict):
            raise AllocationError(f"container {name}: share of {device} is not an object")
        milli, memory = share.get("milli"), share.get("memoryMiB", 0)
        if type(milli) is not int or not 1 <= milli <= 1000:
            raise AllocationError(f"container {name}: share of {device} needs milli in 1..1000")
        if type(memory) is not int or not 0 <= memory <= 1 << 30:
            raise AllocationError(f"container {name}: share of {device} has invalid memoryMiB")
        shares[device] = Share(milli=milli, memory_mib=memory)
    init = entry.get("init", False)
    if type(init) is not bool:
        raise AllocationError(f"container {name}: init must be true or false")
    return ContainerAllocation(devices=tuple(devices), shares=shares, init=init)


def load_keys(directory: Path) -> dict[str, bytes]:
    """Keys from a mounted Secret: one file per key id, the file's bytes are the key."""
    keys: dict[str, bytes] = {}
    if not directory.is_dir():
        return keys
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or not path.is_file() or not KEY_ID.match(path.name):
            continue  # Secret volumes hold ..data symlinks and timestamped dirs
        key = path.read_bytes().strip()
        if len(key) >= 16:
            keys[path.name] = key
    return keys
