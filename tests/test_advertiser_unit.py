"""The advertiser's decisions, on a fake CoreV1Api (the real apiserver test is test_advertiser_api.py)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from crishim.advertiser import (
    HEARTBEAT_ANNOTATION,
    INVENTORY_ANNOTATION,
    Advertiser,
    backoff,
    publication,
)
from devices.model import Device, DeviceKind, NodeInventory, PCIeRelation, Topology, pair
from tests.support.rdmainv import Pf, rdma_inventory


def inventory(healthy_second: bool = True) -> NodeInventory:
    gpus = (
        Device("GPU-a", DeviceKind.GPU, 0, "L4", 23034, 0),
        Device("GPU-b", DeviceKind.GPU, 1, "L4", 23034, 0, healthy=healthy_second),
        Device("mlx5_0", DeviceKind.RDMA, 0, "ConnectX-6"),
    )
    return NodeInventory(
        gpus,
        Topology(
            {pair("GPU-a", "GPU-b"): 0}, {pair("GPU-a", "GPU-b"): PCIeRelation.PIX}, {"mlx5_0": ("GPU-a",)}
        ),
    )


class FakeCoreApi:
    """Stores one node and applies merge patches the way the apiserver does for these fields."""

    def __init__(self) -> None:
        self.node = SimpleNamespace(
            metadata=SimpleNamespace(annotations={}),
            status=SimpleNamespace(capacity={"cpu": "4"}, allocatable={"cpu": "4"}),
        )
        self.writes: list[tuple[str, dict[str, Any]]] = []
        self.fail_next = 0

    def read_node(self, name: str) -> Any:
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("apiserver down")
        return self.node

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        self.writes.append(("node", body))
        self.node.metadata.annotations.update(body["metadata"]["annotations"])

    def patch_node_status(self, name: str, body: dict[str, Any]) -> None:
        self.writes.append(("status", body))
        self.node.status.capacity.update(body["status"]["capacity"])
        self.node.status.allocatable.update(body["status"]["allocatable"])


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now


def test_publication_counts_healthy_devices_only() -> None:
    wanted = publication(inventory(healthy_second=False))
    # mlx5_0 is a NIC without VFs: no interface a pod could be given (kubegpu.io/rdma counts VFs)
    assert dict(wanted.capacity) == {"kubegpu.io/rdma": "0", "nvidia.com/gpu": "1"}
    doc = json.loads(wanted.inventory)
    assert doc["version"] == 1 and [d["id"] for d in doc["devices"]] == ["GPU-a", "GPU-b", "mlx5_0"]
    assert doc["topology"]["nicGpus"] == {"mlx5_0": ["GPU-a"]}
    assert "/dev" not in wanted.inventory


def test_the_rdma_resource_counts_the_vfs_a_pod_can_be_given() -> None:
    """``kubegpu.io/rdma`` is what kube-scheduler counts a pod's request of the resource against, and
    the pod gets that many VFs: the healthy VFs of healthy PFs, never the PFs themselves. Before, every
    healthy RDMA device counted, PFs included, so kube-scheduler saw room that the VF filter had not."""
    inv = rdma_inventory(
        "n", [0, 0], [Pf("mlx5_0", 100, 0, (0,), vfs=3), Pf("mlx5_1", 100, 0, (1,), vfs=2, healthy=False)]
    )
    assert dict(publication(inv).capacity) == {"kubegpu.io/rdma": "3", "nvidia.com/gpu": "2"}
    sick = tuple(replace(d, healthy=False) if d.id == "mlx5_0-vf1" else d for d in inv.devices)
    assert publication(NodeInventory(sick, inv.topology)).capacity["kubegpu.io/rdma"] == "2"


def test_patches_only_on_change_plus_heartbeat() -> None:
    api, clock = FakeCoreApi(), Clock()
    state = {"healthy": True}
    advertiser = Advertiser(api, "n1", lambda: inventory(state["healthy"]), heartbeat_seconds=30, clock=clock)
    assert advertiser.sync_once() == ["inventory", "heartbeat", "capacity"]
    assert api.node.status.capacity["nvidia.com/gpu"] == "2" and api.node.status.allocatable["cpu"] == "4"
    assert api.node.metadata.annotations[HEARTBEAT_ANNOTATION] == "2026-11-26T12:00:00Z"
    clock.now += dt.timedelta(seconds=10)
    assert advertiser.sync_once() == []  # nothing changed, heartbeat not due
    clock.now += dt.timedelta(seconds=25)
    assert advertiser.sync_once() == ["heartbeat"]
    state["healthy"] = False
    assert advertiser.sync_once() == ["inventory", "heartbeat", "capacity"]
    assert api.node.status.capacity["nvidia.com/gpu"] == "1"
    assert json.loads(api.node.metadata.annotations[INVENTORY_ANNOTATION])["devices"][1]["healthy"] is False
    assert advertiser.patches == len(api.writes) == 5  # 2 + 1 heartbeat + 2


@pytest.mark.parametrize(("failures", "wait"), [(0, 0.0), (1, 1.0), (2, 2.0), (5, 16.0), (20, 60.0)])
def test_backoff(failures: int, wait: float) -> None:
    assert backoff(failures) == wait


def test_run_loop_backs_off_and_recovers() -> None:
    api, clock = FakeCoreApi(), Clock()
    api.fail_next = 2
    advertiser = Advertiser(api, "n1", inventory, interval=0.01, clock=clock)
    waits: list[float] = []

    def fake_wait(seconds: float) -> bool:
        waits.append(seconds)
        if len(waits) >= 3:
            advertiser._stop.set()
        return advertiser._stop.is_set()

    advertiser._stop.wait = fake_wait  # type: ignore[method-assign]
    advertiser.run()
    assert waits == [1.0, 2.0, 0.01]
    assert api.node.status.capacity["nvidia.com/gpu"] == "2"
