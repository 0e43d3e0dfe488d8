"""Check the NVIDIA plugin on a real GPU machine: ``python -m devices.nvidia_check``.

Prints the discovered inventory, the health, and the edits for all GPUs as one JSON document on
stdout, then checks that the inventory is consistent, that every device node the edits name exists
on the host as a character device (``/dev/nvidia<N>`` as 195:N), and that ``/dev/nvidiactl`` is
there. Problems go to stderr, one a line.

Exit status: 0 all good; 1 problems found; 2 NVML not available (no driver, no library).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Sequence
from typing import Any

from devices.model import DeviceKind, NodeInventory
from devices.nvidia import NvidiaPlugin, NvidiaUnavailable

NVIDIA_MAJOR = 195  # the major number registered for /dev/nvidia<minor> and /dev/nvidiactl


def char_device_numbers(path: str) -> tuple[int, int] | None:
    """(major, minor) of a character device at ``path``; None when it is missing or not one."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.major(st.st_rdev), os.minor(st.st_rdev)) if stat.S_ISCHR(st.st_mode) else None


def device_node_problems(
    paths: Sequence[str], numbers: Callable[[str], tuple[int, int] | None]
) -> list[str]:
    """Every path must be a char device; ``/dev/nvidia<N>`` must be 195:N; nvidiactl must exist."""
    problems: list[str] = []
    for path in paths:
        found = numbers(path)
        if found is None:
            problems.append(f"device node {path} is not a character device on this host")
            continue
        match = re.fullmatch(r"/dev/nvidia(\d+)", path)
        if match and found != (NVIDIA_MAJOR, int(match.group(1))):
            want = f"{NVIDIA_MAJOR}:{match.group(1)}"
            problems.append(f"device node {path} is {found[0]}:{found[1]}, want {want}")
    if paths and "/dev/nvidiactl" not in paths:
        problems.append("/dev/nvidiactl is missing on this host")
    return problems


def inventory_problems(inventory: NodeInventory) -> list[str]:
    """Consistency checks that need no hardware: ids unique, every GPU pair has a PCIe relation."""
    problems: list[str] = []
    gpus = inventory.by_kind(DeviceKind.GPU)
    if not gpus:
        problems.append("no GPUs found")
    ids = [g.id for g in gpus]
    if len(set(ids)) != len(ids):
        problems.append(f"duplicate GPU ids: {ids}")
    for i, a in enumerate(gpus):
        if not a.id.startswith("GPU-"):
            problems.append(f"GPU {a.index}: id {a.id!r} is not a GPU UUID")
        if a.memory_mib <= 0:
            problems.append(f"GPU {a.index}: no memory reported")
        for b in gpus[i + 1 :]:
            if (min(a.id, b.id), max(a.id, b.id)) not in inventory.topology.pcie:
                problems.append(f"GPUs {a.index} and {b.index}: no PCIe relation")
    return problems


def check(
    plugin: NvidiaPlugin, numbers: Callable[[str], tuple[int, int] | None] = char_device_numbers
) -> tuple[dict[str, Any], list[str]]:
    """Run discovery, health and edits; return (report, problems). Raises ``NvidiaUnavailable``."""
    inventory = plugin.discover()
    problems = list(plugin.last_errors) + inventory_problems(inventory)
    health = plugin.health()
    problems += [f"GPU {gpu_id} unhealthy" for gpu_id, ok in sorted(health.items()) if not ok]
    edits = plugin.container_edits(inventory.by_kind(DeviceKind.GPU))
    problems += device_node_problems([node.host_path for node in edits.device_nodes], numbers)
    report = {
        "inventory": inventory.public(),
        "deviceNodes": {d.id: list(d.device_nodes) for d in inventory.devices},
        "health": health,
        "edits": edits.public(),
        "problems": problems,
    }
    return report, problems


def main(argv: Sequence[str] | None = None, nvml: Any = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devices.nvidia_check", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--sysfs-root", default="/", help="root holding sys/ (default: %(default)s)")
    parser.add_argument("--cdi", action="store_true", help="also name CDI devices in the edits")
    args = parser.parse_args(argv)
    plugin = NvidiaPlugin(nvml=nvml, sysfs_root=args.sysfs_root, cdi=args.cdi)
    try:
        report, problems = check(plugin)
    except NvidiaUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
