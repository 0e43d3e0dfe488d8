"""Pure functions that change a CRI ContainerConfig: scrub device visibility, apply plugin edits.

Scrubbing comes first for every container: whatever a user put in the pod spec or an image can
make visible (NVIDIA_VISIBLE_DEVICES=all from a CUDA base image, KUBEGPU_* variables, CDI
requests, the NVIDIA runtime's volume-mount device list, device nodes the node's plugins manage)
is removed, and NVIDIA_VISIBLE_DEVICES is set to ``void``. Only then are the edits for the
devices the allocation grants applied, so a container sees exactly its allocation.
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection

from crishim.cri import api_pb2
from devices.plugin import ContainerEdits

# NVIDIA's runtime hook reads these; "void" means: no GPU at all.
NVIDIA_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
NO_DEVICES = "void"
# Environment a user may not set: the plugins' own variables and the runtime's device selectors.
SCRUBBED_ENV_PREFIXES = ("KUBEGPU_",)
SCRUBBED_ENV = frozenset({NVIDIA_VISIBLE, "NVIDIA_REQUIRE_CUDA_DEVICES"})
# The NVIDIA runtime can also take the device list as volume mounts under this directory.
NVIDIA_DEVICE_MOUNTS = "/var/run/nvidia-container-devices"
SCRUBBED_CDI_VENDORS = ("nvidia.com/", "kubegpu.io/")
# CDI device requests by annotation, and our own marks (only the shim may write those).
SCRUBBED_ANNOTATION_PREFIXES = ("cdi.k8s.io/", "kubegpu.io/")


def _scrubbed_env(key: str) -> bool:
    return key in SCRUBBED_ENV or key.startswith(SCRUBBED_ENV_PREFIXES)


def scrub(config: api_pb2.ContainerConfig, managed_host_paths: Collection[str]) -> None:
    """Remove every way the request could make a managed device visible; set NVIDIA to void."""
    kept_env = [kv for kv in config.envs if not _scrubbed_env(kv.key)]
    del config.envs[:]
    config.envs.extend(kept_env)
    config.envs.add(key=NVIDIA_VISIBLE, value=NO_DEVICES.encode())

    kept_devices = [d for d in config.devices if d.host_path not in managed_host_paths]
    del config.devices[:]
    config.devices.extend(kept_devices)

    kept_mounts = [m for m in config.mounts if not _under(m.container_path, NVIDIA_DEVICE_MOUNTS)]
    del config.mounts[:]
    config.mounts.extend(kept_mounts)

    kept_cdi = [c for c in config.CDI_devices if not c.name.startswith(SCRUBBED_CDI_VENDORS)]
    del config.CDI_devices[:]
    config.CDI_devices.extend(kept_cdi)

    for key in [k for k in config.annotations if k.startswith(SCRUBBED_ANNOTATION_PREFIXES)]:
        del config.annotations[key]


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _clean(path: str) -> str:
    """A container path as the runtime reads it: ``/dev//shm/`` and ``/dev/./shm`` are ``/dev/shm``."""
    return "/" + posixpath.normpath("/" + path).lstrip("/")


def apply(config: api_pb2.ContainerConfig, edits: ContainerEdits) -> None:
    """Add the plugins' device nodes, env, mounts and CDI names (env and mounts replace the request's
    at the same name or container path, and a plugin's mount drops the request's inside it: an MPS
    client's /dev/shm must be the daemon's, and no pod may put mount points in it)."""
    if edits.env:
        kept = [kv for kv in config.envs if kv.key not in edits.env]
        del config.envs[:]
        config.envs.extend(kept)
        for key, value in sorted(edits.env.items()):
            config.envs.add(key=key, value=value.encode())
    taken = {d.container_path for d in config.devices}
    for node in edits.device_nodes:
        if node.container_path not in taken:
            config.devices.add(
                container_path=node.container_path, host_path=node.host_path, permissions=node.permissions
            )
    if edits.mounts:  # a plugin's mount replaces the request's at its container path and inside it
        taken = [_clean(m.container_path) for m in edits.mounts]
        kept_mounts = [
            m for m in config.mounts if not any(_under(_clean(m.container_path), t) for t in taken)
        ]
        del config.mounts[:]
        config.mounts.extend(kept_mounts)
    for mount in edits.mounts:
        config.mounts.add(
            container_path=mount.container_path, host_path=mount.host_path, readonly=mount.readonly
        )
    for name in edits.cdi_devices:
        config.CDI_devices.add(name=name)
