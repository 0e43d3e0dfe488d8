"""The RDMA plugin on a fake sysfs tree laid out as the kernel does (symlinks included)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devices.model import DeviceKind
from devices.plugin import DeviceNode, PluginError
from devices.rdma import RdmaPlugin, natural_key, parse_port_state, parse_rate


def _link(target: Path, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


class FakeSysfs:
    """Builds ``<root>/sys`` and ``<root>/dev/infiniband`` the way Linux lays them out."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def pci(self, host_bridge: str, *chain: str, numa: int = 0) -> Path:
        """A PCI function below ``host_bridge`` through bridges ``chain[:-1]``; linked from bus/pci."""
        path = self.root / "sys/devices" / host_bridge / Path(*chain)
        path.mkdir(parents=True, exist_ok=True)
        for depth in range(1, len(chain) + 1):  # every bridge on the way is a PCI device too
            node = self.root / "sys/devices" / host_bridge / Path(*chain[:depth])
            link = self.root / "sys/bus/pci/devices" / chain[depth - 1]
            if not link.is_symlink():
                _link(node, link)
        (path / "numa_node").write_text(f"{numa}\n")
        return path

    def ib(
        self,
        name: str,
        pci: Path,
        ports: list[tuple[str, str, str]],
        uverbs: int | None,
        physfn: Path | None = None,
        num_vfs: int | None = None,
        hca_type: str = "MT4123",
    ) -> None:
        dev = pci / "infiniband" / name
        dev.mkdir(parents=True)
        (dev / "hca_type").write_text(f"{hca_type}\n")
        _link(pci, dev / "device")
        _link(dev, self.root / "sys/class/infiniband" / name)
        for number, (rate, state, layer) in enumerate(ports, start=1):
            port = dev / "ports" / str(number)
            port.mkdir(parents=True)
            (port / "rate").write_text(f"{rate}\n")
            (port / "state").write_text(f"{state}\n")
            (port / "link_layer").write_text(f"{layer}\n")
        if physfn is not None:
            _link(physfn, pci / "physfn")
        if num_vfs is not None:
            (pci / "sriov_numvfs").write_text(f"{num_vfs}\n")
        if uverbs is not None:
            verbs = pci / "infiniband_verbs" / f"uverbs{uverbs}"
            verbs.mkdir(parents=True)
            (verbs / "ibdev").write_text(f"{name}\n")
            (verbs / "dev").write_text(f"231:{192 + uverbs}\n")
            _link(verbs, self.root / "sys/class/infiniband_verbs" / f"uverbs{uverbs}")
            (self.root / "dev/infiniband").mkdir(parents=True, exist_ok=True)
            (self.root / f"dev/infiniband/uverbs{uverbs}").touch()

    def rdma_cm(self) -> None:
        (self.root / "dev/infiniband").mkdir(parents=True, exist_ok=True)
        (self.root / "dev/infiniband/rdma_cm").touch()


EDR = "100 Gb/sec (4X EDR)"
ACTIVE, DOWN = "4: ACTIVE", "1: DOWN"

# Bridges of the machine below: socket 0 has a switch (up 01:00.0) with GPU0 and the NIC on two
# downstream ports, GPU1 on its own root port; socket 1 has a NIC and, two switches down, GPU2.
GPU0 = ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0")
NIC0 = ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:04:00.0")
NIC1 = NIC0[:-1] + ("0000:04:00.1",)
VF0 = NIC0[:-1] + ("0000:04:00.2",)
GPU1 = ("pci0000:00", "0000:00:02.0", "0000:06:00.0")
GPU2 = ("pci0000:80", "0000:80:01.0", "0000:81:00.0", "0000:82:00.0", "0000:83:00.0", "0000:84:00.0",
        "0000:85:00.0")
NIC4 = ("pci0000:80", "0000:80:01.0", "0000:81:00.0", "0000:82:01.0", "0000:86:00.0")


def build_machine(root: Path) -> FakeSysfs:
    fs = FakeSysfs(root)
    fs.pci(*GPU0, numa=0)
    fs.pci(*GPU1, numa=0)
    fs.pci(*GPU2, numa=1)
    pf = fs.pci(*NIC0, numa=0)
    fs.ib("mlx5_0", pf, [(EDR, ACTIVE, "InfiniBand")], uverbs=0, num_vfs=1)
    fs.ib("mlx5_1", fs.pci(*NIC1, numa=0), [("40 Gb/sec (4X QDR)", DOWN, "InfiniBand")], uverbs=1, num_vfs=0)
    vf = fs.pci(*VF0, numa=0)
    fs.ib("mlx5_2", vf, [(EDR, ACTIVE, "InfiniBand")], uverbs=2, physfn=pf, hca_type="MT4124")
    fs.ib(
        "mlx5_10",
        fs.pci(*NIC4, numa=1),
        [("200 Gb/sec (4X HDR)", DOWN, "Ethernet"), ("25 Gb/sec (1X EDR)", ACTIVE, "Ethernet")],
        uverbs=3,
    )
    fs.rdma_cm()
    return fs


@pytest.fixture
def machine(tmp_path: Path) -> Path:
    build_machine(tmp_path)
    return tmp_path


def test_inventory(machine: Path) -> None:
    inventory = RdmaPlugin(str(machine)).discover()
    assert [d.id for d in inventory.devices] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_10"]
    assert [d.index for d in inventory.devices] == [0, 1, 2, 3]
    assert {d.kind for d in inventory.devices} == {DeviceKind.RDMA}
    by_id = inventory.by_id()
    pf, down, vf, roce = by_id["mlx5_0"], by_id["mlx5_1"], by_id["mlx5_2"], by_id["mlx5_10"]
    assert (pf.pci_bus_id, pf.numa_node, pf.model) == ("0000:04:00.0", 0, "MT4123")
    assert dict(pf.attributes) == {
        "function": "pf", "ports": "1", "rateGbps": "100", "state": "ACTIVE",
        "linkLayer": "InfiniBand", "sriovNumVfs": "1", "uverbs": "uverbs0",
    }
    assert pf.device_nodes == (f"{machine}/dev/infiniband/uverbs0",)  # the node below the root
    assert pf.healthy
    assert (down.attributes["state"], down.attributes["rateGbps"], down.healthy) == ("DOWN", "40", False)
    assert vf.attributes["function"] == "vf"
    assert vf.attributes["parentPf"] == "0000:04:00.0"
    assert vf.attributes["parentDevice"] == "mlx5_0"
    assert "sriovNumVfs" not in vf.attributes and vf.model == "MT4124"
    # the best port is the active one, even if slower
    attrs = roce.attributes
    assert (attrs["state"], attrs["rateGbps"], attrs["ports"]) == ("ACTIVE", "25", "2")
    assert roce.attributes["linkLayer"] == "Ethernet"
    assert roce.attributes["uverbs"] == "uverbs3" and roce.numa_node == 1
    assert inventory.topology.nic_gpus == {}


def test_health(machine: Path) -> None:
    plugin = RdmaPlugin(str(machine))
    assert plugin.health() == {"mlx5_0": True, "mlx5_1": False, "mlx5_2": True, "mlx5_10": True}
    (machine / "sys/class/infiniband/mlx5_0/ports/1/state").write_text("1: DOWN\n")
    assert plugin.health()["mlx5_0"] is False


def test_edits(machine: Path) -> None:
    plugin = RdmaPlugin(str(machine))
    by_id = plugin.discover().by_id()
    edits = plugin.container_edits([by_id["mlx5_10"], by_id["mlx5_0"]])
    host = f"{machine}/dev/infiniband"  # the host paths are below the root; inside, /dev/infiniband
    assert edits.device_nodes == (
        DeviceNode(f"{host}/uverbs3", "/dev/infiniband/uverbs3", "rwm"),
        DeviceNode(f"{host}/uverbs0", "/dev/infiniband/uverbs0", "rwm"),
        DeviceNode(f"{host}/rdma_cm", "/dev/infiniband/rdma_cm", "rwm"),
    )
    assert edits.env == {"KUBEGPU_RDMA_DEVICES": "mlx5_10,mlx5_0", "NCCL_IB_HCA": "=mlx5_10,mlx5_0"}
    for node in edits.device_nodes:
        assert os.path.exists(node.host_path)


def test_edits_on_the_real_root_name_the_hosts_nodes() -> None:
    plugin = RdmaPlugin("/", exists=lambda path: True)
    assert plugin.device_patterns == ("/dev/infiniband/*",)
    assert plugin.device_dirs == ("/dev/infiniband",)
    from devices.rdma import rdma_edits

    edits = rdma_edits([("mlx5_4", "uverbs4")], True)
    assert edits.device_nodes == (
        DeviceNode("/dev/infiniband/uverbs4", "/dev/infiniband/uverbs4"),
        DeviceNode("/dev/infiniband/rdma_cm", "/dev/infiniband/rdma_cm"),
    )


def test_edits_refuse_a_device_gone_from_sysfs_since_discovery(machine: Path) -> None:
    """A VF removed (sriov_numvfs lowered) after discovery: no edit for a node that is not there."""
    plugin = RdmaPlugin(str(machine))
    vf = plugin.discover().by_id()["mlx5_2"]
    (machine / "sys/class/infiniband/mlx5_2").unlink()
    with pytest.raises(PluginError, match="mlx5_2 is not on this host now"):
        plugin.container_edits([vf])


def test_edits_refuse_a_device_whose_verbs_node_is_missing(machine: Path) -> None:
    plugin = RdmaPlugin(str(machine))
    vf = plugin.discover().by_id()["mlx5_2"]
    (machine / "dev/infiniband/uverbs2").unlink()
    with pytest.raises(PluginError, match="verbs node /dev/infiniband/uverbs2 is missing"):
        plugin.container_edits([vf])


def test_edits_from_published_devices_and_without_rdma_cm(machine: Path) -> None:
    from devices.model import NodeInventory

    plugin = RdmaPlugin(str(machine))
    published = NodeInventory.from_public(plugin.discover().public())
    (machine / "dev/infiniband/rdma_cm").unlink()
    edits = plugin.container_edits([published.by_id()["mlx5_2"]])
    assert [d.container_path for d in edits.device_nodes] == ["/dev/infiniband/uverbs2"]


def test_edits_refuse_unknown_devices_and_shares(machine: Path) -> None:
    from devices.model import Device

    plugin = RdmaPlugin(str(machine))
    with pytest.raises(PluginError, match="mlx5_9 is not on this host now"):
        plugin.container_edits([Device(id="mlx5_9", kind=DeviceKind.RDMA, index=9, model="")])
    nic = plugin.discover().devices[0]
    with pytest.raises(PluginError, match="fractionally"):
        plugin.container_edits([nic], {"mlx5_0": object()})  # type: ignore[dict-item]


def test_no_rdma_on_this_host(tmp_path: Path) -> None:
    plugin = RdmaPlugin(str(tmp_path))
    assert plugin.discover().devices == ()
    assert plugin.health() == {}
    assert plugin.container_edits([]).is_empty()


@pytest.mark.parametrize(
    ("text", "want"),
    [("100 Gb/sec (4X EDR)", 100.0), ("2.5 Gb/sec (1X SDR)", 2.5), ("400 Gb/sec (4X NDR)", 400.0), ("", 0.0),
     ("Invalid argument", 0.0)],
)
def test_parse_rate(text: str, want: float) -> None:
    assert parse_rate(text) == want


def test_parse_port_state_and_natural_order() -> None:
    assert parse_port_state("4: ACTIVE") == "ACTIVE"
    assert parse_port_state("1: DOWN\n") == "DOWN"
    assert sorted(["mlx5_10", "mlx5_2", "mlx5_1"], key=natural_key) == ["mlx5_1", "mlx5_2", "mlx5_10"]
