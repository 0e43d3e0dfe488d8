"""A container as the rewrite core sees it, whichever front brought it (the CRI proxy or NRI).

The rewrite core (``crishim.edits``: the scrub and the plugins' edits) reads and changes only what
decides which devices a container can reach: its environment, device entries, mounts, CDI device
names and annotations. Each front translates its own message into a ``ContainerSpec`` and the
changed spec back: the CRI proxy into the ``ContainerConfig`` it forwards (``from_cri``,
``to_cri``), the NRI plugin into the adjustment it returns. Entries a front brought keep their
original message in ``origin`` so that what the core keeps is written back exactly as it came
(a CRI mount's propagation, SELinux relabel and ID mappings included).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from crishim.cri import api_pb2
from crishim.hostpaths import DeviceNumber


@dataclass
class DeviceEntry:
    """A device node the container asks for: where it appears, which host node it is."""

    container_path: str
    host_path: str  # "" when the front names the node only by its number (NRI: an OCI device)
    permissions: str = "rwm"
    origin: Any = None  # the front's own entry, when it brought this one
    number: DeviceNumber | None = None  # the node's type and numbers, when the front knows them


@dataclass
class MountEntry:
    """A mount: where it appears in the container and what host path it shows."""

    container_path: str
    host_path: str
    readonly: bool = False
    origin: Any = None


@dataclass
class ContainerSpec:
    """The parts of a container that decide what it can reach (see the module docstring)."""

    env: list[tuple[str, bytes]] = field(default_factory=list)  # in order; values as raw bytes
    devices: list[DeviceEntry] = field(default_factory=list)
    mounts: list[MountEntry] = field(default_factory=list)
    cdi_devices: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)

    def copy(self) -> ContainerSpec:
        """A copy whose lists can change without changing this one (the entries are shared, so
        a front can tell which of its own entries a changed copy kept)."""
        return ContainerSpec(
            env=list(self.env),
            devices=list(self.devices),
            mounts=list(self.mounts),
            cdi_devices=list(self.cdi_devices),
            annotations=dict(self.annotations),
        )


def from_cri(config: api_pb2.ContainerConfig) -> ContainerSpec:
    """The spec of a CRI ContainerConfig (the config is left as it is)."""
    return ContainerSpec(
        env=[(kv.key, kv.value) for kv in config.envs],
        devices=[DeviceEntry(d.container_path, d.host_path, d.permissions, d) for d in config.devices],
        mounts=[MountEntry(m.container_path, m.host_path, m.readonly, m) for m in config.mounts],
        cdi_devices=[c.name for c in config.CDI_devices],
        annotations=dict(config.annotations),
    )


def to_cri(spec: ContainerSpec, config: api_pb2.ContainerConfig) -> None:
    """Write ``spec`` into ``config``: entries the config brought are written back unchanged,
    new ones are made from the spec's fields."""
    envs = [api_pb2.KeyValue(key=key, value=value) for key, value in spec.env]
    del config.envs[:]
    config.envs.extend(envs)
    devices = [
        d.origin
        if isinstance(d.origin, api_pb2.Device)
        else api_pb2.Device(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
        for d in spec.devices
    ]
    del config.devices[:]
    config.devices.extend(devices)
    mounts = [
        m.origin
        if isinstance(m.origin, api_pb2.Mount)
        else api_pb2.Mount(container_path=m.container_path, host_path=m.host_path, readonly=m.readonly)
        for m in spec.mounts
    ]
    del config.mounts[:]
    config.mounts.extend(mounts)
    cdi = [api_pb2.CDIDevice(name=name) for name in spec.cdi_devices]
    del config.CDI_devices[:]
    config.CDI_devices.extend(cdi)
    if dict(config.annotations) != spec.annotations:
        config.annotations.clear()
        config.annotations.update(spec.annotations)
