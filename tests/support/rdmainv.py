"""Inventories with GPUs and RDMA NICs (PFs with SR-IOV VFs) for scheduler tests.

``rdma_inventory`` builds what a node's advertiser publishes: GPUs with their NUMA node, PFs with
a line rate, NUMA node and the GPUs on their PCIe switch (``nicGpus``), and each PF's VFs named
``<pf>-vf<k>`` (``function: vf``, ``parentDevice``), as the sim plugin names them.
``sim_nic_topology`` writes a sim plugin topology file with a NIC, for tests that advertise nodes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devices.model import Device, DeviceKind, NodeInventory, Topology


@dataclass(frozen=True)
class Pf:
    name: str
    rate_gbps: float
    numa: int = -1
    near: tuple[int, ...] = ()  # GPU indices on its PCIe switch
    vfs: int = 4
    healthy: bool = True


def gpu_id(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


def rdma_inventory(node: str, gpu_numas: Sequence[int], pfs: Sequence[Pf]) -> NodeInventory:
    devices = [
        Device(gpu_id(node, i), DeviceKind.GPU, i, "A100", 81920, numa) for i, numa in enumerate(gpu_numas)
    ]
    nic_gpus = {}
    index = 0
    for pf in pfs:
        devices.append(
            Device(
                pf.name,
                DeviceKind.RDMA,
                index,
                "ConnectX-7",
                numa_node=pf.numa,
                healthy=pf.healthy,
                attributes={"function": "pf", "rateGbps": f"{pf.rate_gbps:g}", "sriovNumVfs": str(pf.vfs)},
            )
        )
        index += 1
        for k in range(pf.vfs):
            devices.append(
                Device(
                    f"{pf.name}-vf{k}",
                    DeviceKind.RDMA,
                    index,
                    "ConnectX-7 VF",
                    numa_node=pf.numa,
                    attributes={"function": "vf", "parentDevice": pf.name, "rateGbps": f"{pf.rate_gbps:g}"},
                )
            )
            index += 1
        if pf.near:
            nic_gpus[pf.name] = tuple(gpu_id(node, g) for g in pf.near)
    return NodeInventory(tuple(devices), Topology(nic_gpus=nic_gpus))


# 2 GPUs on two NUMA nodes; one 100G PF with two VFs on GPU 1's PCIe switch
SIM_NIC_TOPOLOGY = {
    "gpus": [{"index": 0, "model": "sim", "numa": 0}, {"index": 1, "model": "sim", "numa": 1}],
    "nvlink": [[0, 0], [0, 0]],
    "pcie": [["X", "SYS"], ["SYS", "X"]],
    "nics": [{"name": "mlx5_0", "numa": 1, "pcieNearGpu": 1, "rateGbps": 100, "vfs": 2}],
}


def sim_nic_topology(directory: Path) -> str:
    """``SIM_NIC_TOPOLOGY`` as a file in ``directory`` (the sim plugin's ``topology`` option)."""
    path = directory / "nic-2gpu.json"
    path.write_text(json.dumps(SIM_NIC_TOPOLOGY))
    return str(path)
