"""The plugin interface: edits, merging, routing devices to plugins, the registry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from devices.model import Device, DeviceKind, NodeInventory
from devices.nvidia import NvidiaPlugin
from devices.plugin import (
    ContainerEdits,
    DeviceNode,
    DevicePlugin,
    EditConflict,
    GpuShare,
    Mount,
    PluginConfigError,
    PluginError,
    edits_for,
    health_all,
    merge_edits,
    route_devices,
    shares_env,
)
from devices.rdma import RdmaPlugin
from devices.registry import load_plugins, plugin_names, register_plugin
from devices.sim import SimPlugin


def test_merge_edits_combines_and_dedups() -> None:
    gpu = ContainerEdits(
        device_nodes=(
            DeviceNode("/dev/nvidia0", "/dev/nvidia0"),
            DeviceNode("/dev/nvidiactl", "/dev/nvidiactl"),
        ),
        env={"NVIDIA_VISIBLE_DEVICES": "GPU-a"},
        cdi_devices=("nvidia.com/gpu=GPU-a",),
    )
    nic = ContainerEdits(
        device_nodes=(DeviceNode("/dev/infiniband/uverbs0", "/dev/infiniband/uverbs0"),),
        env={"KUBEGPU_RDMA_DEVICES": "mlx5_0"},
        mounts=(Mount("/etc/ib", "/etc/ib"),),
    )
    again = ContainerEdits(device_nodes=(DeviceNode("/dev/nvidiactl", "/dev/nvidiactl"),))
    merged = merge_edits([gpu, nic, again])
    assert [d.container_path for d in merged.device_nodes] == [
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/infiniband/uverbs0",
    ]
    assert merged.env == {"NVIDIA_VISIBLE_DEVICES": "GPU-a", "KUBEGPU_RDMA_DEVICES": "mlx5_0"}
    assert merged.mounts == (Mount("/etc/ib", "/etc/ib", True),)
    assert merged.cdi_devices == ("nvidia.com/gpu=GPU-a",)
    assert merge_edits([]) == ContainerEdits() and ContainerEdits().is_empty()


@pytest.mark.parametrize(
    ("a", "b", "message"),
    [
        (ContainerEdits(env={"X": "1"}), ContainerEdits(env={"X": "2"}), "env X"),
        (
            ContainerEdits(device_nodes=(DeviceNode("/a", "/dev/x"),)),
            ContainerEdits(device_nodes=(DeviceNode("/b", "/dev/x"),)),
            "device node /dev/x",
        ),
        (
            ContainerEdits(mounts=(Mount("/a", "/m"),)),
            ContainerEdits(mounts=(Mount("/a", "/m", readonly=False),)),
            "mount /m",
        ),
    ],
)
def test_merge_edits_refuses_contradictions(a: ContainerEdits, b: ContainerEdits, message: str) -> None:
    with pytest.raises(EditConflict, match=message):
        merge_edits([a, b])


def test_edits_public_form() -> None:
    edits = ContainerEdits(
        device_nodes=(DeviceNode("/h", "/c"),), env={"B": "2", "A": "1"}, mounts=(Mount("/x", "/y"),)
    )
    assert edits.public() == {
        "deviceNodes": [{"hostPath": "/h", "containerPath": "/c", "permissions": "rwm"}],
        "env": {"A": "1", "B": "2"},
        "mounts": [{"hostPath": "/x", "containerPath": "/y", "readonly": True}],
        "cdiDevices": [],
    }


def test_shares_env() -> None:
    share = SimpleNamespace(milli=250, memory_mib=4096)
    assert shares_env(None, ["a"]) == {}
    assert shares_env({"b": share}, ["a", "b"]) == {"KUBEGPU_GPU_SHARES": "b:250:4096"}
    with pytest.raises(ValueError, match="not allocated: c"):
        shares_env({"c": share}, ["a"])
    with pytest.raises(ValueError, match="not in 1..1000"):
        shares_env({"a": SimpleNamespace(milli=0, memory_mib=0)}, ["a"])


def test_allocation_share_type_fits() -> None:
    from kubegpu.allocation import Share

    assert shares_env({"a": Share(milli=100)}, ["a"]) == {"KUBEGPU_GPU_SHARES": "a:100:0"}


class _Fake:
    def __init__(self, name: str, kinds: set[DeviceKind]) -> None:
        self.name, self.kinds = name, frozenset(kinds)
        self.seen: list[tuple[list[str], dict[str, GpuShare] | None]] = []

    def discover(self) -> NodeInventory:
        return NodeInventory(())

    def health(self) -> dict[str, bool]:
        return {f"{self.name}-dev": True}

    def container_edits(
        self, devices: Sequence[Device], shares: Mapping[str, GpuShare] | None = None
    ) -> ContainerEdits:
        self.seen.append(([d.id for d in devices], dict(shares) if shares else None))
        return ContainerEdits(env={f"{self.name.upper()}": ",".join(d.id for d in devices)})


def _dev(i: str, kind: DeviceKind) -> Device:
    return Device(id=i, kind=kind, index=0, model="")


def test_route_and_edits_for() -> None:
    gpus, nics = _Fake("gpus", {DeviceKind.GPU}), _Fake("nics", {DeviceKind.RDMA, DeviceKind.GPU})
    assert isinstance(gpus, DevicePlugin)
    devices = [_dev("g1", DeviceKind.GPU), _dev("n1", DeviceKind.RDMA), _dev("g2", DeviceKind.GPU)]
    routed = route_devices([gpus, nics], devices)
    assert [(p.name, [d.id for d in ds]) for p, ds in routed] == [("gpus", ["g1", "g2"]), ("nics", ["n1"])]
    share = SimpleNamespace(milli=500, memory_mib=0)
    edits = edits_for([gpus, nics], devices, {"g2": share})
    assert edits.env == {"GPUS": "g1,g2", "NICS": "n1"}
    assert gpus.seen == [(["g1", "g2"], {"g2": share})] and nics.seen == [(["n1"], None)]
    with pytest.raises(PluginError, match="no plugin handles rdma device n1"):
        route_devices([gpus], devices)
    assert health_all([gpus, nics]) == {"gpus-dev": True, "nics-dev": True}


def test_load_plugins(tmp_path: Path) -> None:
    assert plugin_names() == ["nvidia", "rdma", "sim"]
    options = {"topology": "pcie-4gpu", "node_name": "n1", "state_dir": tmp_path, "sysfs_root": "/x"}
    plugins = load_plugins(["sim", "rdma"], options)
    assert [type(p) for p in plugins] == [SimPlugin, RdmaPlugin]
    assert plugins[1].root == "/x"
    assert all(isinstance(p, DevicePlugin) for p in plugins)
    nvidia = load_plugins(["nvidia"], {"cdi": True, "nvml": object()})[0]
    assert isinstance(nvidia, NvidiaPlugin) and nvidia.cdi
    with pytest.raises(PluginConfigError, match="unknown device plugin 'amd'.*nvidia, rdma, sim"):
        load_plugins(["amd"])
    with pytest.raises(PluginConfigError, match="needs|needed"):
        load_plugins(["sim"], {"node_name": "n1"})
    with pytest.raises(PluginConfigError, match="node name"):
        load_plugins(["sim"], {"topology": "pcie-4gpu"})
    with pytest.raises(PluginConfigError, match="listed twice"):
        load_plugins(["rdma", "rdma"])


def test_register_plugin() -> None:
    register_plugin("fake-for-test", lambda options: _Fake(str(options["label"]), {DeviceKind.GPU}))
    try:
        assert load_plugins(["fake-for-test"], {"label": "x"})[0].name == "x"
    finally:
        from devices import registry as module

        module._REGISTRY.pop("fake-for-test")
