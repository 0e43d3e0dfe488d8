"""The device-plugin interface and container edits.

A device plugin runs on the node. It does three things:

1. ``discover()``: find its devices and how they connect (a ``NodeInventory``);
2. ``health()``: say which of its devices are usable now (device id -> healthy);
3. ``container_edits(devices, shares)``: say what a container must get so that it can use exactly
   ``devices``: device nodes, environment, mounts and, optionally, CDI device names.

A plugin may also name the device nodes it owns even before discovery finds them (optional
attributes ``device_patterns``, fnmatch patterns of host paths, and ``device_char_majors``): the
CRI shim scrubs those from every container that was not granted them. A plugin may also name
directories wholly of its device nodes (``device_dirs``, host paths such as ``/dev/infiniband``):
a container mounting one, or anything in one, is asking for those devices (the shim refuses it).

Edits are plain data (``ContainerEdits``); the CRI shim turns them into CreateContainer changes.
``merge_edits`` combines the edits of several plugins (GPUs from one, NICs from another) and
refuses contradictions. The plugins import this module and it imports none of them: the
registry above them (``devices.registry``) builds them by name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from devices.affinity import add_nic_affinity
from devices.model import Device, DeviceKind, NodeInventory, merge

log = logging.getLogger(__name__)


class PluginError(Exception):
    """A plugin cannot do its job; the message names the plugin and the reason."""


class PluginConfigError(PluginError):
    """Unknown plugin name, or an option a plugin needs is missing or wrong."""


class EditConflict(PluginError):
    """Two plugins want different things at the same place (env name, container path)."""


@dataclass(frozen=True)
class DeviceNode:
    """A device node to create in the container (CRI ``Device``)."""

    host_path: str
    container_path: str
    permissions: str = "rwm"


@dataclass(frozen=True)
class Mount:
    """A bind mount into the container (CRI ``Mount``)."""

    host_path: str
    container_path: str
    readonly: bool = True


@dataclass(frozen=True)
class ContainerEdits:
    """What a container needs to use a set of devices. Order is kept; ``merge_edits`` dedups."""

    device_nodes: tuple[DeviceNode, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    mounts: tuple[Mount, ...] = ()
    cdi_devices: tuple[str, ...] = ()  # fully qualified CDI names, e.g. nvidia.com/gpu=GPU-...

    def is_empty(self) -> bool:
        return not (self.device_nodes or self.env or self.mounts or self.cdi_devices)

    def public(self) -> dict[str, Any]:
        """A JSON-friendly form (for logs, ``nvidia_check`` and tests)."""
        return {
            "deviceNodes": [
                {"hostPath": d.host_path, "containerPath": d.container_path, "permissions": d.permissions}
                for d in self.device_nodes
            ],
            "env": dict(sorted(self.env.items())),
            "mounts": [
                {"hostPath": m.host_path, "containerPath": m.container_path, "readonly": m.readonly}
                for m in self.mounts
            ],
            "cdiDevices": list(self.cdi_devices),
        }


class GpuShare(Protocol):
    """A fractional share of one GPU; ``kubegpu.allocation.Share`` has this shape."""

    @property
    def milli(self) -> int: ...  # 1..1000 of the GPU's compute

    @property
    def memory_mib(self) -> int: ...  # 0: unspecified


@runtime_checkable
class DevicePlugin(Protocol):
    """What every device plugin provides. ``kinds`` says which devices it turns into edits."""

    name: str
    kinds: frozenset[DeviceKind]

    def discover(self) -> NodeInventory: ...

    def health(self) -> dict[str, bool]: ...

    def container_edits(
        self, devices: Sequence[Device], shares: Mapping[str, GpuShare] | None = None
    ) -> ContainerEdits: ...


# --- small pure helpers shared by the plugins -------------------------------------------------


def shares_env(shares: Mapping[str, GpuShare] | None, device_ids: Iterable[str]) -> dict[str, str]:
    """``KUBEGPU_GPU_SHARES=<id>:<milli>:<memoryMiB>,...`` for the shared devices among ``device_ids``.

    Advisory only: it tells the workload (or an MPS/time-slicing wrapper inside it) its share;
    nothing here enforces it. A share for a device that is not allocated is an error.
    """
    if not shares:
        return {}
    ids = list(device_ids)
    unknown = sorted(set(shares) - set(ids))
    if unknown:
        raise ValueError(f"shares given for devices that are not allocated: {', '.join(unknown)}")
    parts = []
    for device_id in ids:
        share = shares.get(device_id)
        if share is None:
            continue
        if not 1 <= int(share.milli) <= 1000:
            raise ValueError(f"share of {device_id}: milli {share.milli} not in 1..1000")
        parts.append(f"{device_id}:{int(share.milli)}:{int(share.memory_mib)}")
    return {"KUBEGPU_GPU_SHARES": ",".join(parts)} if parts else {}


def _merge_by_container_path(items: Iterable[Any], what: str) -> tuple[Any, ...]:
    seen: dict[str, Any] = {}
    for item in items:
        old = seen.get(item.container_path)
        if old is None:
            seen[item.container_path] = item
        elif old != item:
            raise EditConflict(f"{what} {item.container_path}: {old} vs {item}")
    return tuple(seen.values())


def merge_edits(edits: Iterable[ContainerEdits]) -> ContainerEdits:
    """Combine the edits of several plugins; identical entries collapse, contradictions raise."""
    edits = list(edits)
    env: dict[str, str] = {}
    for edit in edits:
        for key, value in edit.env.items():
            if key in env and env[key] != value:
                raise EditConflict(f"env {key}: {env[key]!r} vs {value!r}")
            env[key] = value
    cdi: dict[str, None] = {}
    for edit in edits:
        cdi.update(dict.fromkeys(edit.cdi_devices))
    return ContainerEdits(
        device_nodes=_merge_by_container_path((d for e in edits for d in e.device_nodes), "device node"),
        env=env,
        mounts=_merge_by_container_path((m for e in edits for m in e.mounts), "mount"),
        cdi_devices=tuple(cdi),
    )


def route_devices(
    plugins: Sequence[DevicePlugin], devices: Sequence[Device]
) -> list[tuple[DevicePlugin, list[Device]]]:
    """Give each device to the first plugin whose ``kinds`` includes its kind (plugin order)."""
    routed: dict[int, list[Device]] = {}
    for device in devices:
        for i, plugin in enumerate(plugins):
            if device.kind in plugin.kinds:
                routed.setdefault(i, []).append(device)
                break
        else:
            raise PluginError(f"no plugin handles {device.kind.value} device {device.id}")
    return [(plugins[i], routed[i]) for i in sorted(routed)]


def edits_for(
    plugins: Sequence[DevicePlugin],
    devices: Sequence[Device],
    shares: Mapping[str, GpuShare] | None = None,
) -> ContainerEdits:
    """The merged edits of all plugins for one container's devices."""
    shares = shares or {}
    parts = []
    for plugin, mine in route_devices(plugins, devices):
        ids = {d.id for d in mine}
        parts.append(plugin.container_edits(mine, {k: v for k, v in shares.items() if k in ids} or None))
    return merge_edits(parts)


def discover_all(plugins: Iterable[DevicePlugin], sysfs_root: str | None = "/") -> NodeInventory:
    """The node's inventory: every plugin's inventory merged (see ``devices.model.merge``).

    With ``sysfs_root``, NICs without GPU affinity get it from their PCI placement relative to
    the GPUs (``devices.affinity.add_nic_affinity``): GPUs from one plugin, NICs from another.
    """
    inventory = merge(plugin.discover() for plugin in plugins)
    return inventory if sysfs_root is None else add_nic_affinity(inventory, sysfs_root)


def device_patterns(plugins: Iterable[DevicePlugin]) -> list[str]:
    """The host paths (fnmatch patterns) of every device node the plugins manage, whether or not
    discovery has found them: a plugin's optional ``device_patterns`` attribute."""
    return [p for plugin in plugins for p in getattr(plugin, "device_patterns", ())]


def device_dirs(plugins: Iterable[DevicePlugin]) -> list[str]:
    """Host directories wholly of the plugins' device nodes (optional ``device_dirs`` attribute)."""
    return [d for plugin in plugins for d in getattr(plugin, "device_dirs", ())]


def device_char_majors(plugins: Iterable[DevicePlugin]) -> set[int]:
    """Char-device majors wholly owned by the plugins' drivers (optional ``device_char_majors``)."""
    return {m for plugin in plugins for m in getattr(plugin, "device_char_majors", ())}


def health_all(plugins: Iterable[DevicePlugin]) -> dict[str, bool]:
    result: dict[str, bool] = {}
    for plugin in plugins:
        result.update(plugin.health())
    return result
