"""``kubegpu devices``: discover this node's devices with the chosen plugins and print them.

    kubegpu devices --plugin sim --topology dgx1-v100 --node-name n1 --state-dir /tmp/x
    kubegpu devices --plugin nvidia --plugin rdma --json
    kubegpu devices --plugin rdma --sysfs-root /

``register(subparsers)`` adds the subcommand to the ``kubegpu`` parser; ``python -m devices.cli``
runs it alone. Exit status: 0 printed; 2 a plugin could not run (the message says why).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import Sequence

from devices.model import DeviceKind, NodeInventory
from devices.plugin import PluginError, discover_all, health_all
from devices.registry import load_plugins, plugin_names
from devices.sim import DEFAULT_STATE_DIR
from kubegpu import cliargs


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``devices`` subcommand; it sets ``run`` (args -> exit status) like the others."""
    parser = subparsers.add_parser(
        "devices",
        help="discover this node's devices and print inventory and topology",
        description="Run device plugins' discovery and print the node inventory and GPU topology.",
    )
    parser.add_argument(
        "--plugin",
        action="append",
        required=True,
        choices=plugin_names(),
        help="device plugin to run; repeat for several (e.g. --plugin nvidia --plugin rdma)",
    )
    parser.add_argument("--topology", help="sim: topology file, or the name of a shipped one (dgx1-v100)")
    parser.add_argument(
        "--node-name",
        default=socket.gethostname(),
        help="sim: node name, seeds GPU ids (default: %(default)s)",
    )
    parser.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        type=cliargs.absent_or_directory,
        help="sim: device nodes and health file (default: %(default)s)",
    )
    parser.add_argument(
        "--sysfs-root",
        default="/",
        type=cliargs.directory,
        help="rdma, nvidia, NIC affinity: root holding sys/",
    )
    parser.add_argument("--cdi", action="store_true", help="nvidia: also name CDI devices in edits")
    parser.add_argument("--json", action="store_true", help="print the published inventory as JSON")
    parser.set_defaults(run=run)
    return parser


def topology_matrix(inventory: NodeInventory) -> list[str]:
    """GPU-to-GPU links as ``nvidia-smi topo -m`` shows them: ``NV<n>``, else the PCIe relation."""
    gpus = inventory.by_kind(DeviceKind.GPU)
    if len(gpus) < 2:
        return []
    topo = inventory.topology
    names = [f"GPU{g.index}" for g in gpus]
    width = max(6, *(len(n) + 1 for n in names))
    lines = [" " * width + "".join(n.ljust(width) for n in names)]
    for a, name in zip(gpus, names, strict=True):
        cells = []
        for b in gpus:
            if a.id == b.id:
                cells.append("X")
            elif topo.nvlink_count(a.id, b.id):
                cells.append(f"NV{topo.nvlink_count(a.id, b.id)}")
            else:
                cells.append(topo.pcie_relation(a.id, b.id).name)
        lines.append(name.ljust(width) + "".join(c.ljust(width) for c in cells))
    return [line.rstrip() for line in lines]


def format_table(inventory: NodeInventory) -> str:
    """A human table of devices, the GPU link matrix and NIC-GPU affinity."""
    header = ("ID", "KIND", "IDX", "MODEL", "MEM_MIB", "NUMA", "PCI", "HEALTHY")
    rows = [header] + [
        (
            d.id,
            d.kind.value,
            str(d.index),
            d.model,
            str(d.memory_mib or "-"),
            str(d.numa_node),
            d.pci_bus_id or "-",
            "yes" if d.healthy else "NO",
        )
        for d in inventory.devices
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    matrix = topology_matrix(inventory)
    if matrix:
        lines += ["", *matrix]
    by_id = inventory.by_id()
    if inventory.topology.nic_gpus:
        lines.append("")
        for nic, gpus in sorted(inventory.topology.nic_gpus.items()):
            near = ",".join(f"GPU{by_id[g].index}" if g in by_id else g for g in gpus)
            lines.append(f"{nic} near {near}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    options = {
        "topology": args.topology,
        "node_name": args.node_name,
        "state_dir": args.state_dir,
        "sysfs_root": args.sysfs_root,
        "cdi": args.cdi,
    }
    try:
        plugins = load_plugins(args.plugin, options)
        inventory = discover_all(plugins, args.sysfs_root)
        health = health_all(plugins)
    except (PluginError, OSError) as exc:
        print(f"kubegpu devices: {exc}", file=sys.stderr)
        return 2
    unknown = sorted(set(health) - set(inventory.by_id()))
    if unknown:
        print(f"kubegpu devices: health names unknown devices: {', '.join(unknown)}", file=sys.stderr)
    if args.json:
        print(json.dumps(inventory.public(), indent=2))
    else:
        print(format_table(inventory))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = cliargs.Parser(prog="kubegpu")
    register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
