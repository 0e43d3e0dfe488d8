"""The rewrite core: scrub device visibility from a container, then apply the plugins' edits.

Both work on a ``crishim.container.ContainerSpec``, whichever front brought the container (the
CRI proxy's ``ContainerConfig``, NRI's container); ``scrub`` and ``apply`` are the CRI proxy's
shorthands that convert a ``ContainerConfig`` in and out.

Scrubbing comes first for every container: whatever a user put in the pod spec or an image can
make visible is removed or overridden, whatever its spelling:
- environment the NVIDIA toolkit reads to pick devices (``NVIDIA_VISIBLE_DEVICES``,
  ``NVIDIA_IMEX_CHANNELS``, the MIG and feature switches that add device nodes) and the plugins'
  own ``KUBEGPU_*`` variables are removed, then set to values that select nothing, so that an
  image's own values (a CUDA base image says ``NVIDIA_VISIBLE_DEVICES=all``) are overridden;
- mounts over the toolkit's device-list directory (``/var/run/nvidia-container-devices``) in any
  spelling: the toolkit cleans the path and prefix-matches it, so ``/var/run//nvidia-container-
  devices/all`` and ``/var/run/nvidia-container-devicesall`` are requests too;
- CDI requests of NVIDIA's and our vendors, as names or as entries of ``cdi.k8s.io/`` annotations
  (other vendors' entries are kept: the annotation is rewritten to what is left);
- device entries whose host path reaches a managed device node, however it is spelled
  (``crishim.hostpaths``: cleaned, resolved through symlinks and ``/dev/char/M:m``, compared by
  device number);
- our own ``kubegpu.io/`` marks.
What the shim cannot decide (a relative or unresolvable device path, a directory holding managed
nodes, an environment name with ``=``, a malformed CDI name, a CDI annotation entry that is not a
qualified name but mentions a managed vendor) raises ``Ambiguous``: the container
is refused rather than guessed about. Only then are the edits for the devices the allocation
grants applied, so a container sees exactly its allocation.

``rdma_requests`` reads, before the scrub, how a container asks for RDMA devices itself: device
entries that reach an RDMA device node (in any spelling, or by number), and mounts of, into or at
an RDMA device directory (``/dev/infiniband``) or of an RDMA node. The rewriter refuses those
mounts always, and the device entries when the pod holds no RDMA interfaces (with interfaces the
scrub drops them and the pod's own VFs are added).
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass

from crishim.container import ContainerSpec, DeviceEntry, MountEntry, from_cri, to_cri
from crishim.cri import api_pb2
from crishim.hostpaths import (
    Ambiguous,
    HostFS,
    ManagedDevices,
    clean,
    device_entry_verdict,
    number_of,
)
from devices.plugin import ContainerEdits

NVIDIA_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
NO_DEVICES = "void"
# What every container gets after the scrub: toolkit selectors that select nothing. Setting them
# (not only removing them) overrides the image's own environment, which the shim never sees.
NEUTRAL_ENV = (
    (NVIDIA_VISIBLE, NO_DEVICES),
    ("NVIDIA_IMEX_CHANNELS", NO_DEVICES),
    # The toolkit adds every GDS, MOFED (all of /dev/infiniband), NVSwitch or GDRCopy device
    # node to a container that asks for any GPU and sets one of these to "enabled".
    ("NVIDIA_GDS", "disabled"),
    ("NVIDIA_MOFED", "disabled"),
    ("NVIDIA_NVSWITCH", "disabled"),
    ("NVIDIA_GDRCOPY", "disabled"),
)
# Environment a user may not set (compared upper-cased): the above, MIG management selectors,
# the plugins' own variables, and Docker swarm's generic-resource selectors.
SCRUBBED_ENV = frozenset(
    {key for key, _ in NEUTRAL_ENV}
    | {"NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES", "NVIDIA_REQUIRE_CUDA_DEVICES"}
)
SCRUBBED_ENV_PREFIXES = ("KUBEGPU_", "DOCKER_RESOURCE_")
# The NVIDIA toolkit reads volume mounts under this directory as device requests (its
# accept-nvidia-visible-devices-as-volume-mounts setting); /run is where /var/run points.
NVIDIA_DEVICE_MOUNTS = "/var/run/nvidia-container-devices"
DEVICE_MOUNT_ROOTS = (NVIDIA_DEVICE_MOUNTS, "/run/nvidia-container-devices")
# CDI vendors whose devices are managed here (compared lower-cased): NVIDIA's GPUs, its
# management devices, its device plugin's specs, and ours.
SCRUBBED_CDI_VENDORS = frozenset(
    {"nvidia.com", "management.nvidia.com", "k8s.device-plugin.nvidia.com", "kubegpu.io"}
)
# Annotation keys (lower-cased) that request CDI devices (containerd reads cdi.k8s.io/; the
# toolkit's annotation prefixes are configurable, NVIDIA's device plugin uses nvidia.cdi.k8s.io/).
CDI_ANNOTATION = "cdi.k8s.io/"
# A malformed entry of a CDI annotation that mentions one of these (NFKC, case-folded) could be
# read as a managed device by a reader more lenient than containerd's: it is refused.
MANAGED_VENDOR_MARKS = ("nvidia.com", "kubegpu.io")
# The CDI library's grammar of a qualified name (container-device-interface pkg/parser), which
# containerd and the NVIDIA toolkit apply to every entry of a CDI annotation: vendor and class
# start with an ASCII letter, end with a letter or digit, and hold letters, digits, _ . - between;
# the device name starts and ends with a letter or digit and may also hold ':'.
_CDI_VENDOR_OR_CLASS = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
_CDI_DEVICE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")
OWN_ANNOTATION_PREFIX = "kubegpu.io/"


def is_scrubbed_env(key: str) -> bool:
    """Whether the scrub takes this variable out of a container (or sets it to a neutral value)."""
    upper = key.upper()
    return upper in SCRUBBED_ENV or upper.startswith(SCRUBBED_ENV_PREFIXES)


def is_device_request_mount(container_path: str) -> bool:
    """Whether the NVIDIA toolkit could read this mount as a device request, in any spelling."""
    canonical = clean(container_path).lower()
    return canonical.startswith(DEVICE_MOUNT_ROOTS)


def cdi_vendor(name: str) -> str:
    """The vendor part of a qualified CDI name ``vendor/class=device``; Ambiguous if malformed."""
    vendor, slash, rest = name.partition("/")
    if not slash or "=" not in rest or not vendor.strip():
        raise Ambiguous(f"CDI device name {name[:200]!r} is not vendor/class=device")
    return vendor.strip().lower()


def is_scrubbed_cdi(name: str) -> bool:
    return is_managed_vendor(cdi_vendor(name))


def is_managed_vendor(vendor: str) -> bool:
    """Whether a CDI vendor (any case, surrounding blanks ignored) is one whose devices we manage."""
    vendor = vendor.strip().lower()
    return vendor in SCRUBBED_CDI_VENDORS or vendor.endswith(".nvidia.com")


def qualified_cdi_vendor(name: str) -> str | None:
    """The vendor of ``name`` if it is a qualified CDI name as containerd parses the entries of a
    ``cdi.k8s.io/`` annotation (split at the first ``=``, then the first ``/``; no trimming); None
    for anything containerd would reject."""
    qualifier, equals, device = name.partition("=")
    vendor, slash, kind = qualifier.partition("/")
    if not (equals and slash) or name.startswith("/"):
        return None
    if not (
        _CDI_VENDOR_OR_CLASS.fullmatch(vendor)
        and _CDI_VENDOR_OR_CLASS.fullmatch(kind)
        and _CDI_DEVICE_NAME.fullmatch(device)
    ):
        return None
    return vendor


def is_scrubbed_annotation(key: str) -> bool:
    """Our own marks: removed whatever their value."""
    return key.lower().startswith(OWN_ANNOTATION_PREFIX)


def is_cdi_annotation(key: str) -> bool:
    return CDI_ANNOTATION in key.lower()


def scrubbed_cdi_annotation(key: str, value: str) -> str | None:
    """What is left of a CDI request annotation once the managed vendors' entries are taken out:
    the value unchanged when it names none, the other entries (in order) when it mixes, None
    (drop the key) when every entry was managed.

    Entries are split at ``,`` exactly as containerd and the NVIDIA toolkit split them. An entry
    that is not a qualified CDI name makes containerd and the toolkit fail the whole create, so
    keeping it grants nothing; but if it mentions a managed vendor in any spelling, a more
    lenient reader could take it for a managed device: Ambiguous, naming the annotation.
    """
    kept = []
    for entry in value.split(","):
        vendor = qualified_cdi_vendor(entry)
        if vendor is None:
            folded = unicodedata.normalize("NFKC", entry).casefold()
            if any(mark in folded for mark in MANAGED_VENDOR_MARKS):
                raise Ambiguous(
                    f"CDI annotation {key[:200]!r}: entry {entry[:200]!r} is not a qualified CDI name "
                    f"(vendor/class=device) and mentions a vendor whose devices are managed here"
                )
            kept.append(entry)
        elif not is_managed_vendor(vendor):
            kept.append(entry)
    if len(kept) == value.count(",") + 1:
        return value
    return ",".join(kept) if kept else None


def _scrub_annotations(annotations: MutableMapping[str, str], own_marks: bool) -> None:
    """Apply the CDI annotation rule (and, for a container, drop our own marks) in place."""
    for key in list(annotations):
        if own_marks and is_scrubbed_annotation(key):
            del annotations[key]
        elif is_cdi_annotation(key):
            left = scrubbed_cdi_annotation(key, annotations[key])
            if left is None:
                del annotations[key]
            elif left != annotations[key]:
                annotations[key] = left


def _keep_device(device: DeviceEntry, managed: ManagedDevices, fs: HostFS | None) -> bool:
    """Whether a device entry reaches no managed node: by its number when the front gives one (an
    OCI device is made from its numbers, whatever its path), else by its host path."""
    if device.number is not None:
        return not managed.has_number(device.number)
    return device_entry_verdict(device.host_path, managed, fs)


@dataclass(frozen=True)
class RdmaRequests:
    """How a container asks for RDMA devices itself (``rdma_requests``): what each entry is."""

    devices: tuple[str, ...] = ()  # device entries reaching an RDMA device node
    mounts: tuple[str, ...] = ()  # mounts showing RDMA device nodes or covering their directory


def _is_under_any(path: str, directories: tuple[str, ...]) -> bool:
    return any(_under(path, d) for d in directories)


def _filesystems(places: Iterable[str], fs: HostFS) -> frozenset[int]:
    """The filesystems (``st_dev``) of the nearest existing ancestor of each of ``places``."""
    found = set()
    for place in places:
        path = clean(place)
        while True:
            try:
                found.add(fs.stat(path).st_dev)
                break
            except OSError:
                if path == "/":
                    break
                path = os.path.dirname(path)
    return frozenset(found)


def _elsewhere(spellings: Iterable[str], filesystems: frozenset[int], fs: HostFS) -> bool:
    """Every spelling exists, is no device node and is on none of ``filesystems``: it cannot be
    an RDMA directory, a path inside one or a node (they all lie on the filesystems of the RDMA
    places, /dev's devtmpfs on a real node), so resolving it through symlinks can be skipped."""
    for path in spellings:
        try:
            st = fs.stat(path)
        except OSError:
            return False
        if number_of(st) is not None or st.st_dev in filesystems:
            return False
    return True


def _mount_reaches(
    mount: MountEntry,
    rdma: ManagedDevices,
    dirs: tuple[str, ...],
    fs: HostFS,
    filesystems: frozenset[int] | None = None,
) -> bool:
    """Whether a mount shows RDMA device nodes: its host path (cleaned, and resolved through
    symlinks) is an RDMA directory, inside one, or an RDMA node; or it is mounted at or inside
    an RDMA directory's place in the container, where the node puts the pod's VFs. A mount of
    a directory above them (``/dev``) is not: its nodes stay shut by the device cgroup.
    ``filesystems`` (``_filesystems`` of the RDMA places): a source on none of them, and no
    device node, is answered from one ``stat`` (kubelet's sources are on disk or tmpfs, and
    resolving each through symlinks was most of a create's time on an RDMA node)."""
    if _is_under_any(clean(mount.container_path), dirs):
        return True
    if "\x00" in mount.host_path:
        raise Ambiguous(f"mount host path {mount.host_path[:200]!r} has a NUL")
    if not mount.host_path.startswith("/"):
        return False  # containerd refuses a relative mount source itself
    canonical = clean(mount.host_path)
    if filesystems is not None and _elsewhere(dict.fromkeys((mount.host_path, canonical)), filesystems, fs):
        return False
    spellings = [canonical]
    try:
        # each distinct spelling resolved once: kubelet's sources are clean, so usually one walk
        spellings += [fs.realpath(p) for p in dict.fromkeys((mount.host_path, canonical))]
    except OSError:
        pass  # an unreadable symlink on the way: containerd cannot mount through it either
    for path in dict.fromkeys(spellings):
        if _is_under_any(path, dirs) or rdma.has_path(path):
            return True
        try:
            number = number_of(fs.stat(path))
        except OSError:
            continue
        if number is not None and rdma.has_number(number):
            return True
    return False


def rdma_requests(
    spec: ContainerSpec, rdma: ManagedDevices, dirs: tuple[str, ...], fs: HostFS | None = None
) -> RdmaRequests:
    """The container's own requests for RDMA devices (``rdma``: the RDMA plugins' nodes, ``dirs``:
    their directories), read before the scrub. A device entry the scrub refuses as undecidable
    (a relative path, a directory holding managed nodes) is left to the scrub's refusal; a mount
    source with a NUL raises ``Ambiguous``."""
    if rdma.is_empty() and not dirs:
        return RdmaRequests()
    fs = fs or HostFS()
    devices = []
    for device in spec.devices:
        try:
            reaches = not _keep_device(device, rdma, fs)
        except Ambiguous:
            continue
        if reaches:
            devices.append(device.host_path or f"{device.container_path} ({device.number})")
    places = [*dirs, *(os.path.dirname(p) for p in rdma.patterns)]
    filesystems = _filesystems(places, fs) if spec.mounts else frozenset()
    mounts = [
        m.host_path or m.container_path for m in spec.mounts if _mount_reaches(m, rdma, dirs, fs, filesystems)
    ]
    return RdmaRequests(tuple(devices), tuple(mounts))


def scrub_spec(spec: ContainerSpec, managed: ManagedDevices, fs: HostFS | None = None) -> None:
    """Remove every way the container could make a managed device visible (see module docstring).

    Raises Ambiguous, naming the entry, for what cannot be decided; ``spec`` is then unusable.
    """
    kept_env = []
    for key, value in spec.env:
        if "=" in key or "\x00" in key or b"\x00" in value:
            raise Ambiguous(f"environment variable {key[:200]!r} has '=' or NUL in its name or value")
        if not is_scrubbed_env(key):
            kept_env.append((key, value))
    spec.env = kept_env + [(key, value.encode()) for key, value in NEUTRAL_ENV]
    if spec.devices:
        spec.devices = [d for d in spec.devices if _keep_device(d, managed, fs)]
    for mount in spec.mounts:
        if "\x00" in mount.container_path:
            raise Ambiguous(f"mount path {mount.container_path[:200]!r} has a NUL")
    spec.mounts = [m for m in spec.mounts if not is_device_request_mount(m.container_path)]
    if spec.cdi_devices:
        spec.cdi_devices = [name for name in spec.cdi_devices if not is_scrubbed_cdi(name)]
    _scrub_annotations(spec.annotations, own_marks=True)


def scrub(config: api_pb2.ContainerConfig, managed: ManagedDevices, fs: HostFS | None = None) -> None:
    """``scrub_spec`` on a CRI ContainerConfig, in place."""
    spec = from_cri(config)
    scrub_spec(spec, managed, fs)
    to_cri(spec, config)


def scrub_annotations(annotations: MutableMapping[str, str]) -> None:
    """CDI requests in the pod's annotations (containerd can pass them to containers): the same
    rule as a container's, in place. Raises Ambiguous like ``scrub_spec``."""
    _scrub_annotations(annotations, own_marks=False)


def scrub_sandbox_annotations(sandbox: api_pb2.PodSandboxConfig) -> None:
    """``scrub_annotations`` on a CRI PodSandboxConfig's annotations."""
    scrub_annotations(sandbox.annotations)


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def apply_spec(spec: ContainerSpec, edits: ContainerEdits) -> None:
    """Add the plugins' device nodes, env, mounts and CDI names. What the plugins give wins: env
    of the same name, device nodes at the same container path and mounts at or inside a plugin
    mount's container path (in any spelling) are replaced or dropped, so a request cannot shadow
    a granted device with something else (and an MPS client's /dev/shm is the daemon's, with no
    pod mount points in it)."""
    if edits.env:
        spec.env = [(key, value) for key, value in spec.env if key not in edits.env]
        spec.env += [(key, value.encode()) for key, value in sorted(edits.env.items())]
    if edits.device_nodes:
        ours = {clean(n.container_path) for n in edits.device_nodes}
        spec.devices = [d for d in spec.devices if clean(d.container_path) not in ours]
        spec.devices += [
            DeviceEntry(node.container_path, node.host_path, node.permissions) for node in edits.device_nodes
        ]
    if edits.mounts:
        taken = [clean(m.container_path) for m in edits.mounts]
        spec.mounts = [m for m in spec.mounts if not any(_under(clean(m.container_path), t) for t in taken)]
        spec.mounts += [MountEntry(m.container_path, m.host_path, m.readonly) for m in edits.mounts]
    spec.cdi_devices += list(edits.cdi_devices)


def apply(config: api_pb2.ContainerConfig, edits: ContainerEdits) -> None:
    """``apply_spec`` on a CRI ContainerConfig, in place."""
    spec = from_cri(config)
    apply_spec(spec, edits)
    to_cri(spec, config)
