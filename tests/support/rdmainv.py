"""Inventories with GPUs and RDMA NICs (PFs with SR-IOV VFs) for scheduler tests.

``rdma_inventory`` builds what a node's advertiser publishes: GPUs with their NUMA node, PFs with
a line rate, NUMA node and the GPUs on their PCIe switch (``nicGpus``), and each PF's VFs named
``<pf>-vf<k>`` (``function: vf``, ``parentDevice``), as the sim plugin names them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
