"""The allocation contract: which devices each container of a pod gets, signed by the scheduler.

The scheduler writes it as the pod annotation ``kubegpu.io/allocation`` (through the Binding, so
a pod is never bound without it); kubelet copies pod annotations into the CRI sandbox config,
where the shim reads it. Schema (version 1, or 2 when the pod holds RDMA interfaces;
docs/allocation.md is the normative description)::

    {"version": 1, "node": "gpu-node-7", "podUID": "5f0c...",
     "containers": {"train": {"devices": ["GPU-aaaa", "GPU-bbbb"]},
                    "infer": {"devices": ["GPU-cccc"],
                              "shares": {"GPU-cccc": {"milli": 250, "memoryMiB": 4096}}}},
     "keyId": "k1", "signature": "<base64 Ed25519 signature>"}

Version 2 adds ``"rdma"``: the pod's RDMA interfaces (SR-IOV VFs), pod-wide, each with its PF and
bandwidth in Mbit/s, ``[{"device": "mlx5_0-vf1", "pf": "mlx5_0", "minMbps": 100000}]`` (and
``maxMbps`` when capped); its ``containers`` may then be empty. The scheduler writes version 1
whenever the pod holds no VF, so nodes that know only version 1 keep running every other pod; they
refuse a version-2 annotation ("unsupported allocation version 2"), never half-apply it.

The signature is Ed25519 with the private key named by ``keyId`` over the canonical form: the
document without ``signature``, as JSON with sorted keys, no whitespace, ASCII only. Only the
scheduler holds private keys; nodes hold the public keys, one file per key id (``KeyRing``).
Annotations never carry host paths: paths come only from the node's own plugins.

This module also owns what both sides must agree on besides the document: the key files and
the names of the resources and annotations through which a pod asks for managed devices.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kubegpu.bandwidth import MAX_MBPS
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.allocation")

ANNOTATION = "kubegpu.io/allocation"
VERSION = 2  # the newest this module writes and reads
SUPPORTED_VERSIONS = (1, 2)
RDMA_VERSION = 2  # the first version with ``rdma``
MAX_RDMA_INTERFACES = 32
MAX_ANNOTATION_BYTES = 64 * 1024  # UTF-8 bytes of the annotation value
MAX_NESTING = 32  # arrays and objects within each other (the schema itself needs 5)
MAX_CONTAINERS = 64
MAX_DEVICES_PER_CONTAINER = 64
MAX_MEMORY_MIB = 1 << 30
# Device ids are GPU UUIDs, RDMA device names, or sim ids: no slashes, no dots-only, no spaces.
DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_:\-]{0,127}$")
CONTAINER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # DNS-1123 label
KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")
SIGNATURE_BYTES = 64

# How a pod asks for managed devices: the extended resources the advertiser publishes (and the
# scheduler counts), and the annotations that ask for a share of one GPU. A pod that asks through
# any of these but carries no allocation was not scheduled by kubegpu (the shim refuses it).
GPU_RESOURCE = "nvidia.com/gpu"
RDMA_RESOURCE = "kubegpu.io/rdma"
MANAGED_RESOURCES = (GPU_RESOURCE, RDMA_RESOURCE)
GPU_MILLI_ANNOTATION = "kubegpu.io/gpu-milli"
GPU_MEMORY_ANNOTATION = "kubegpu.io/gpu-memory-mib"
SHARE_ANNOTATIONS = (GPU_MILLI_ANNOTATION, GPU_MEMORY_ANNOTATION)
# The pod-wide RDMA interfaces a pod asks for (docs/scheduler.md; the scheduler reads it strictly)
RDMA_INTERFACES_ANNOTATION = "kubegpu.io/rdma-interfaces"


# A count of zero as the scheduler reads the annotation (scheduler/live/podspec.py: ASCII digits,
# spaces or tabs around): "0", "00", " 0\t"
_ZERO_COUNT = re.compile(r"[ \t]*0+[ \t]*")


def asks_rdma(annotations: Mapping[str, str]) -> bool:
    """Whether a pod's annotations ask for RDMA interfaces: ``kubegpu.io/rdma-interfaces`` set to
    anything but a count of zero as the scheduler reads it (a value the scheduler would not read
    asks too: such a pod was not scheduled by kubegpu)."""
    raw = annotations.get(RDMA_INTERFACES_ANNOTATION)
    if raw is None:
        return False
    return _ZERO_COUNT.fullmatch(str(raw)) is None


SigningKey = Ed25519PrivateKey
VerifyingKey = Ed25519PublicKey


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
class RdmaInterface:
    """One RDMA interface of the pod: a VF, its PF, and its bandwidth (Mbit/s; ``max_mbps`` 0: no cap)."""

    device: str
    pf: str
    min_mbps: int = 0
    max_mbps: int = 0

    def to_document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"device": self.device, "pf": self.pf, "minMbps": self.min_mbps}
        if self.max_mbps:
            doc["maxMbps"] = self.max_mbps
        return doc


@dataclass(frozen=True)
class Allocation:
    """A verified (or to-be-signed) allocation of one pod on one node."""

    node: str
    pod_uid: str
    containers: Mapping[str, ContainerAllocation]
    rdma: tuple[RdmaInterface, ...] = ()  # pod-wide RDMA interfaces (version 2)

    @property
    def version(self) -> int:
        """The schema version it is written in: 2 with RDMA interfaces, else 1."""
        return RDMA_VERSION if self.rdma else 1

    def misplaced(self, node: str, pod_uid: str | None) -> str | None:
        """Why it is not this pod's on ``node``: it names another node, or (``pod_uid`` given)
        another pod UID; None when it is. The shim and kubegpu-cni check a verified allocation so."""
        if self.node != node:
            return f"allocation is for node {self.node!r}, this is {node!r}"
        if pod_uid is not None and self.pod_uid != pod_uid:
            return f"allocation is for pod UID {self.pod_uid}, sandbox has {pod_uid}"
        return None

    def all_devices(self) -> set[str]:
        """Every device it names: the containers' and the RDMA VFs."""
        return {d for c in self.containers.values() for d in c.devices} | {r.device for r in self.rdma}

    def to_document(self) -> dict[str, Any]:
        containers: dict[str, Any] = {}
        for name, alloc in sorted(self.containers.items()):
            entry: dict[str, Any] = {"devices": list(alloc.devices)}
            if alloc.shares:
                entry["shares"] = {dev: _share_doc(s) for dev, s in sorted(alloc.shares.items())}
            if alloc.init:
                entry["init"] = True
            containers[name] = entry
        doc: dict[str, Any] = {
            "version": self.version,
            "node": self.node,
            "podUID": self.pod_uid,
            "containers": containers,
        }
        if self.rdma:
            doc["rdma"] = [r.to_document() for r in self.rdma]
        return doc


def _share_doc(share: Share) -> dict[str, int]:
    if share.memory_mib:
        return {"milli": share.milli, "memoryMiB": share.memory_mib}
    return {"milli": share.milli}


def canonical_bytes(document: Mapping[str, Any]) -> bytes:
    """The bytes that are signed: the document without its signature, canonical JSON."""
    unsigned = {k: v for k, v in document.items() if k != "signature"}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sign(allocation: Allocation, key_id: str, key: SigningKey) -> str:
    """The annotation value for ``allocation``, signed with the private ``key`` under ``key_id``."""
    if not KEY_ID.fullmatch(key_id):
        raise AllocationError(f"invalid key id {key_id!r}")
    document = allocation.to_document()
    document["keyId"] = key_id
    document["signature"] = base64.b64encode(key.sign(canonical_bytes(document))).decode()
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def annotation_size(value: str) -> int:
    """The annotation's size as the API server counts it: UTF-8 bytes."""
    return len(value.encode("utf-8", "surrogatepass"))


def verify(value: str, keys: Mapping[str, VerifyingKey]) -> Allocation:
    """Parse and verify an annotation value; raise AllocationError naming the problem."""
    size = annotation_size(value)
    if size > MAX_ANNOTATION_BYTES:
        raise AllocationError(f"annotation is {size} bytes, more than {MAX_ANNOTATION_BYTES}")
    try:
        document = json.loads(value)
    except (ValueError, RecursionError) as exc:
        raise AllocationError(f"annotation is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise AllocationError("annotation is not a JSON object")
    if _nesting(document) > MAX_NESTING:
        # json.dumps (the canonical form) would hit the recursion limit where json.loads did not
        raise AllocationError(f"annotation nests arrays and objects more than {MAX_NESTING} deep")
    key_id = document.get("keyId")
    signature = document.get("signature")
    if not isinstance(signature, str) or not signature:
        raise AllocationError("annotation is unsigned")
    if not isinstance(key_id, str) or key_id not in keys:
        raise AllocationError(f"annotation is signed with unknown key id {str(key_id)[:80]!r}")
    try:
        raw = base64.b64decode(signature.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error):
        raise AllocationError("annotation signature is not base64") from None
    try:
        if len(raw) != SIGNATURE_BYTES:
            raise InvalidSignature
        keys[key_id].verify(raw, canonical_bytes(document))
    except InvalidSignature:
        raise AllocationError(f"annotation signature does not verify with key {key_id!r}") from None
    return parse_document(document)


def _nesting(value: Any) -> int:
    """How many arrays and objects are within each other in a parsed JSON value (iteratively)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_NESTING:
            pending.extend((child, depth + 1) for child in children)
    return deepest


def parse_document(document: Mapping[str, Any]) -> Allocation:
    """Validate the shape of an allocation document (signature already checked)."""
    version = document.get("version")
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        known = ", ".join(map(str, SUPPORTED_VERSIONS))
        shown = version if type(version) is int else repr(str(version)[:20])
        raise AllocationError(f"unsupported allocation version {shown} (this node reads versions {known})")
    node, pod_uid, containers = document.get("node"), document.get("podUID"), document.get("containers")
    if not isinstance(node, str) or not node:
        raise AllocationError("allocation has no node name")
    if not isinstance(pod_uid, str) or not pod_uid:
        raise AllocationError("allocation has no pod UID")
    if "rdma" in document and version < RDMA_VERSION:
        raise AllocationError(f"allocation version {version} cannot carry rdma (version {RDMA_VERSION} can)")
    rdma = _parse_rdma(document.get("rdma", []))
    if not isinstance(containers, dict) or (not containers and not rdma):
        raise AllocationError("allocation has no containers")
    if len(containers) > MAX_CONTAINERS:
        raise AllocationError(f"allocation names {len(containers)} containers, more than {MAX_CONTAINERS}")
    parsed = {name: _parse_container(name, entry) for name, entry in containers.items()}
    _check_device_sharing(parsed)
    in_containers = {d for c in parsed.values() for d in c.devices}
    for interface in rdma:
        if interface.device in in_containers:
            raise AllocationError(f"RDMA VF {interface.device} is also a container's device")
    return Allocation(node=node, pod_uid=pod_uid, containers=parsed, rdma=rdma)


def _parse_rdma(entries: Any) -> tuple[RdmaInterface, ...]:
    """The ``rdma`` list of a version-2 document: distinct VFs, each with its PF and bandwidth."""
    if not isinstance(entries, list):
        raise AllocationError("rdma is not a list")
    if len(entries) > MAX_RDMA_INTERFACES:
        raise AllocationError(f"rdma names {len(entries)} interfaces, more than {MAX_RDMA_INTERFACES}")
    out: list[RdmaInterface] = []
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise AllocationError(f"rdma[{k}] is not an object")
        device, pf = entry.get("device"), entry.get("pf")
        low, high = entry.get("minMbps", 0), entry.get("maxMbps", 0)
        for what, value in (("device", device), ("pf", pf)):
            if not isinstance(value, str) or not DEVICE_ID.fullmatch(value):
                raise AllocationError(f"rdma[{k}]: invalid {what} id {str(value)[:80]!r}")
        for what, value in (("minMbps", low), ("maxMbps", high)):
            if type(value) is not int or not 0 <= value <= MAX_MBPS:
                raise AllocationError(f"rdma[{k}]: {what} must be a whole number 0..{MAX_MBPS}")
        if high and low > high:
            raise AllocationError(f"rdma[{k}]: minMbps {low} is above maxMbps {high}")
        if device == pf:
            raise AllocationError(f"rdma[{k}]: device {device} is its own PF")
        out.append(RdmaInterface(device, pf, low, high))
    devices = [r.device for r in out]
    if len(set(devices)) != len(devices):
        raise AllocationError("rdma lists a VF twice")
    return tuple(out)


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
    if not isinstance(name, str) or not CONTAINER_NAME.fullmatch(name):
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
        if not isinstance(device, str) or not DEVICE_ID.fullmatch(device):
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
        if type(memory) is not int or not 0 <= memory <= MAX_MEMORY_MIB:
            raise AllocationError(f"container {name}: share of {device} has invalid memoryMiB")
        shares[device] = Share(milli=milli, memory_mib=memory)
    init = entry.get("init", False)
    if type(init) is not bool:
        raise AllocationError(f"container {name}: init must be true or false")
    return ContainerAllocation(devices=tuple(devices), shares=shares, init=init)


# --- keys -------------------------------------------------------------------------------------
# On disk (docs/allocation.md, "Key files"): one file per key id, named after it (a Secret volume,
# or files copied onto a node). A file holds one Ed25519 key:
#   - private: PEM PKCS#8, "-----BEGIN PRIVATE KEY-----" (openssl genpkey -algorithm ed25519,
#     Helm's genPrivateKey "ed25519", kubegpu keys generate); only the scheduler may hold these;
#   - public: PEM SubjectPublicKeyInfo, "-----BEGIN PUBLIC KEY-----" (openssl pkey -pubout,
#     kubegpu keys public), or the raw 32-byte key as base64 on one line.
MAX_KEY_FILE_BYTES = 16 * 1024
PUBLIC_KEY_BYTES = 32
_PRIVATE_PEM = b"-----BEGIN PRIVATE KEY-----"
_PUBLIC_PEM = b"-----BEGIN PUBLIC KEY-----"


class KeyFileError(ValueError):
    """A key file holds no usable Ed25519 key; the message says why."""


def parse_key(data: bytes) -> SigningKey | VerifyingKey:
    """The Ed25519 key in a key file's bytes (see the formats above)."""
    text = data.strip()
    if text.startswith(b"-----BEGIN"):
        try:
            if text.startswith(_PRIVATE_PEM):
                key: Any = serialization.load_pem_private_key(text, password=None)
            elif text.startswith(_PUBLIC_PEM):
                key = serialization.load_pem_public_key(text)
            else:
                label = text.split(b"\n", 1)[0].decode("ascii", "replace")[:60]
                raise KeyFileError(f"unsupported PEM block {label!r} (want PRIVATE KEY or PUBLIC KEY)")
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            if isinstance(exc, KeyFileError):
                raise
            raise KeyFileError(f"not a readable PEM key: {exc}") from None
        if not isinstance(key, Ed25519PrivateKey | Ed25519PublicKey):
            raise KeyFileError(f"not an Ed25519 key but {type(key).__name__}")
        return key
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error:
        raise KeyFileError("neither PEM nor base64") from None
    if len(raw) != PUBLIC_KEY_BYTES:
        raise KeyFileError(f"a raw public key is {PUBLIC_KEY_BYTES} bytes in base64, this is {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def public_key_of(key: SigningKey | VerifyingKey) -> VerifyingKey:
    return key.public_key() if isinstance(key, Ed25519PrivateKey) else key


def private_key_pem(key: SigningKey) -> bytes:
    """PEM PKCS#8, the private key file format."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def public_key_pem(key: SigningKey | VerifyingKey) -> bytes:
    """PEM SubjectPublicKeyInfo, the usual public key file format."""
    return public_key_of(key).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def public_key_base64(key: SigningKey | VerifyingKey) -> str:
    """The raw public key in base64 (the one-line public key file format)."""
    raw = public_key_of(key).public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


@dataclass(frozen=True)
class Keys:
    """What a key directory holds: verifying keys by id, signing keys by id, and what was skipped."""

    public: Mapping[str, VerifyingKey]
    private: Mapping[str, SigningKey]
    problems: tuple[str, ...] = ()


def _trusted_uids() -> frozenset[int]:
    """Who may own what the keys depend on: root, and the user this process runs as (the
    scheduler may run as another user, with a key directory of its own)."""
    return frozenset({0, os.geteuid()})


def writers_problem(path: Path | str, st: os.stat_result) -> str | None:
    """Why someone other than root (or this process's own user) could change ``path``, or None:
    another owner, or write permission for group or others. A sticky directory of a trusted owner
    is fine (others may add entries there but not replace the owner's: a Secret volume's tmpfs
    is 1777); what is added there is checked on its own."""
    if st.st_uid not in _trusted_uids():
        return f"{path} is owned by uid {st.st_uid}, not root"
    writable = st.st_mode & 0o022
    if not writable or (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return None
    who = {0o022: "its group and others", 0o020: "its group", 0o002: "others"}[writable]
    return f"{path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"


def _chain(path: Path, below: Path | None) -> list[Path]:
    """``path`` and the directories above it, innermost first, stopping above ``below``."""
    chain = [path, *path.parents]
    if below is None:
        return chain
    return [p for p in chain if p != below and p not in below.parents]


def path_problems(path: Path, below: Path | None = None) -> list[str]:
    """Why ``path`` (a key directory) could be changed by anyone but root: it or a directory above
    it (up to, not including, ``below``) has another owner or is writable by others, as spelled
    (a symlink on the way must be root's too) and as resolved. Missing entries are skipped."""
    problems: list[str] = []
    seen: set[tuple[int, int]] = set()
    spelled = Path(os.path.abspath(path))
    real_below = Path(os.path.realpath(below)) if below is not None else None
    for entry, follow in [
        *((p, False) for p in _chain(spelled, below)),
        *((p, True) for p in _chain(Path(os.path.realpath(spelled)), real_below)),
    ]:
        try:
            if not follow:
                link = os.lstat(entry)
                if stat.S_ISLNK(link.st_mode) and link.st_uid not in _trusted_uids():
                    problems.append(f"{entry} is a symlink owned by uid {link.st_uid}, not root")
            st = os.stat(entry)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        problem = writers_problem(entry, st)
        if problem:
            problems.append(problem)
    return problems


def _read_key_file(path: Path, directory: Path) -> bytes:
    """A key file's bytes, once it is known that only root could have written them: the entry (a
    symlink must be root's), the file itself (checked on the open file, so it cannot be swapped
    after the check), and, for a symlink out of the directory, the directories it leads through.
    KeyFileError says why not."""
    entry = os.lstat(path)
    if stat.S_ISLNK(entry.st_mode) and entry.st_uid not in _trusted_uids():
        raise KeyFileError(f"{path} is a symlink owned by uid {entry.st_uid}, not root")
    if not path.is_file():  # a FIFO or /dev/zero would block or never end: never opened
        raise KeyFileError("not a regular file, skipped")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError("not a regular file")
        problem = writers_problem(path, st)
        if problem:
            raise KeyFileError(problem)
        real_parent = Path(os.path.realpath(path)).parent
        if real_parent != Path(os.path.realpath(directory)):
            problems = path_problems(real_parent)
            if problems:
                raise KeyFileError(problems[0])
        if st.st_size > MAX_KEY_FILE_BYTES:
            raise KeyFileError(f"larger than {MAX_KEY_FILE_BYTES} bytes")
        data = os.read(fd, MAX_KEY_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"larger than {MAX_KEY_FILE_BYTES} bytes")
    return data


def load_keys(directory: Path, allow_private: bool = False) -> Keys:
    """The keys in a key directory: one file per key id (see the formats above).

    Private keys are used only with ``allow_private`` (the scheduler); on a node a private key
    file is a deployment mistake: it is skipped and reported, never used. Unreadable or malformed
    files are skipped and reported too, so one bad file does not revoke the other keys.

    Only keys that nobody but root (or this process's own user) could have put there are used: a
    directory that others could change (it or one above it: another owner, writable by group or
    others) gives no key at all; a key file (or its symlink) that others could change is skipped.
    """
    public: dict[str, VerifyingKey] = {}
    private: dict[str, SigningKey] = {}
    problems: list[str] = []
    if not directory.is_dir():
        return Keys(public, private, (f"{directory} is not a directory",))
    untrusted = path_problems(directory)
    if untrusted:
        why = "; ".join(untrusted)
        return Keys(public, private, (f"{directory}: no key used, the directory is not root's alone: {why}",))
    try:
        listing = sorted(directory.iterdir())
    except OSError as error:  # removed or replaced since the check above
        return Keys(public, private, (f"{directory}: {error.strerror}",))
    for path in listing:
        if path.name.startswith("."):
            continue  # Secret volumes hold ..data symlinks and timestamped dirs
        if not KEY_ID.fullmatch(path.name):
            problems.append(f"{path.name}: not a valid key id, skipped")
            continue
        try:
            key = parse_key(_read_key_file(path, directory))
        except (OSError, KeyFileError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else error
            problems.append(f"{path.name}: {reason}")
            continue
        if isinstance(key, Ed25519PrivateKey):
            if not allow_private:
                problems.append(f"{path.name}: a private key; nodes must hold public keys only, skipped")
                continue
            private[path.name] = key
        public[path.name] = public_key_of(key)
    return Keys(public, private, tuple(problems))


def directory_stamp(directory: Path) -> Any:
    """Changes whenever an entry of ``directory`` is added, removed, renamed or rewritten.

    Covers what a Secret volume update does (a new timestamped dir, ``..data`` re-pointed) and
    what an operator does by hand (deleting a key file, overwriting one in place).
    """
    try:
        entries = []
        with os.scandir(directory) as scan:
            for entry in scan:
                try:
                    st = entry.stat()  # follows symlinks: ..data and the key links
                    facts: tuple[int, ...] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                except OSError:
                    facts = ()
                entries.append((entry.name, entry.inode(), facts))
        own = os.stat(directory)
        # who may write the directory and those above it: a change of owner or mode re-reads
        trust = tuple(
            (st.st_ino, st.st_mode, st.st_uid)
            for st in map(os.stat, [directory, *Path(os.path.abspath(directory)).parents])
        )
    except OSError as error:
        return ("error", error.errno)
    return (own.st_ino, own.st_mtime_ns, trust, tuple(sorted(entries)))


class KeyRing:
    """The allocation keys from a key directory, re-read whenever the directory's entries change.

    ``static`` gives keys directly (tests, benchmarks): private keys also count as their public
    key. ``allow_private``: the directory may hold private keys (the scheduler); a node's ring
    uses public keys only. The directory is checked at most every ``recheck_seconds``.
    """

    def __init__(
        self,
        directory: Path | None,
        static: Mapping[str, SigningKey | VerifyingKey] | None = None,
        *,
        allow_private: bool = False,
        recheck_seconds: float = 5.0,
    ) -> None:
        self._directory = directory
        self._allow_private = allow_private
        self._public: dict[str, VerifyingKey] = {k: public_key_of(v) for k, v in (static or {}).items()}
        self._private: dict[str, SigningKey] = {
            k: v for k, v in (static or {}).items() if isinstance(v, Ed25519PrivateKey)
        }
        self._recheck = recheck_seconds
        self._checked = -float("inf")
        self._stamp: Any = None

    def _refresh(self) -> None:
        if self._directory is None:
            return
        now = time.monotonic()
        if now - self._checked < self._recheck:
            return
        self._checked = now
        stamp = directory_stamp(self._directory)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        loaded = load_keys(self._directory, self._allow_private)
        self._public, self._private = dict(loaded.public), dict(loaded.private)
        for problem in loaded.problems:
            log_event(log, "keys.skipped", logging.WARNING, directory=str(self._directory), problem=problem)
        log_event(
            log,
            "keys.loaded",
            directory=str(self._directory),
            key_ids=sorted(self._public),
            signing_key_ids=sorted(self._private),
        )

    def keys(self) -> Mapping[str, VerifyingKey]:
        """The verifying (public) keys by key id."""
        self._refresh()
        return self._public

    def signing_key(self, key_id: str) -> SigningKey | None:
        """The private key of ``key_id``, if this ring holds it (only the scheduler's does)."""
        self._refresh()
        return self._private.get(key_id)
