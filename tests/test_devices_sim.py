"""The simulated plugin: topology files, stable ids, stand-in device nodes, health, edits."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from devices.model import DeviceKind, NodeInventory, PCIeRelation
from devices.plugin import DeviceNode, PluginError
from devices.sim import (
    TOPOLOGY_DIR,
    SimPlugin,
    TopologyFileError,
    ensure_device_node,
    parse_topology,
    parse_unhealthy,
    resolve_topology,
    sim_gpu_id,
)

FIXTURES = sorted(p.stem for p in TOPOLOGY_DIR.glob("*.json"))


def doc(name: str) -> dict[str, Any]:
    return json.loads((TOPOLOGY_DIR / f"{name}.json").read_text())


def test_all_five_fixtures_are_shipped() -> None:
    assert FIXTURES == ["dgx-a100", "dgx1-v100", "hgx-h100", "hgx-h100-sriov", "pcie-4gpu", "rtx8000-4gpu"]


@pytest.mark.parametrize("name", FIXTURES)
def test_inventory_and_topology_equal_the_file(name: str, tmp_path: Path) -> None:
    d = doc(name)
    inventory = SimPlugin(name, "node-a", tmp_path).discover()
    gpus = inventory.by_kind(DeviceKind.GPU)
    assert [(g.index, g.model, g.memory_mib, g.numa_node) for g in gpus] == [
        (g["index"], g["model"], g["memoryMiB"], g["numa"]) for g in d["gpus"]
    ]
    for i, a in enumerate(gpus):
        for j, b in enumerate(gpus):
            if i != j:
                assert inventory.topology.nvlink_count(a.id, b.id) == d["nvlink"][i][j]
                assert inventory.topology.pcie_relation(a.id, b.id) is PCIeRelation[d["pcie"][i][j]]
    rdma = inventory.by_kind(DeviceKind.RDMA)
    nics = [n for n in rdma if n.attributes.get("function") != "vf"]
    assert [n.id for n in nics] == [n["name"] for n in d.get("nics", [])]
    for nic, want in zip(nics, d.get("nics", []), strict=True):
        assert nic.numa_node == want["numa"]
        assert nic.attributes["rateGbps"] == str(want["rateGbps"])
        assert inventory.topology.nic_gpus[nic.id] == (gpus[want["pcieNearGpu"]].id,)
        vfs = [v for v in rdma if v.attributes.get("parentDevice") == nic.id]
        assert [v.id for v in vfs] == [f"{nic.id}-vf{k}" for k in range(want.get("vfs", 0))]
        assert all(v.attributes["function"] == "vf" and v.numa_node == nic.numa_node for v in vfs)


@pytest.mark.parametrize("name", FIXTURES)
def test_public_round_trip(name: str, tmp_path: Path) -> None:
    inventory = SimPlugin(name, "node-a", tmp_path, create_nodes=False).discover()
    published = json.loads(json.dumps(inventory.public()))
    back = NodeInventory.from_public(published)
    assert back.public() == published
    assert back.topology == inventory.topology
    # host paths are node-local: never published
    assert "dev/kubegpu-sim" not in json.dumps(published)
    assert [d.device_nodes for d in back.devices] == [()] * len(back.devices)


def test_sriov_fixture_gives_the_scheduler_pfs_with_vfs_beside_each_gpu(tmp_path: Path) -> None:
    from scheduler.core.rdma import nic_state

    inventory = SimPlugin("hgx-h100-sriov", "node-a", tmp_path, create_nodes=False).discover()
    nics = nic_state(NodeInventory.from_public(json.loads(json.dumps(inventory.public()))))
    gpus = inventory.by_kind(DeviceKind.GPU)
    assert sorted(nics.pfs) == [f"mlx5_{k}" for k in range(8)]
    for k, pf in enumerate(sorted(nics.pfs.values(), key=lambda p: p.id)):
        assert (pf.rate_mbps, len(pf.vfs), pf.gpus) == (400_000, 8, {gpus[k].id})


@pytest.mark.parametrize(
    ("vfs", "why"), [(-1, "vfs must be a count"), (65, "vfs must be a count"), ("8", "vfs must be a count")]
)
def test_a_bad_vf_count_is_named(vfs: object, why: str, tmp_path: Path) -> None:
    topology = {**doc("pcie-4gpu"), "nics": [{"name": "mlx5_0", "numa": 0, "rateGbps": 100, "vfs": vfs}]}
    with pytest.raises(TopologyFileError, match=why):
        SimPlugin(topology, "node-a", tmp_path, create_nodes=False)


def test_ids_are_stable_and_node_specific(tmp_path: Path) -> None:
    first = SimPlugin("pcie-4gpu", "node-a", tmp_path / "1").discover()
    again = SimPlugin("pcie-4gpu", "node-a", tmp_path / "2").discover()
    other = SimPlugin("pcie-4gpu", "node-b", tmp_path / "3").discover()
    assert [d.id for d in first.devices] == [d.id for d in again.devices]
    assert not {d.id for d in first.devices} & {d.id for d in other.devices}
    assert first.devices[0].id == sim_gpu_id("node-a", 0)
    assert first.devices[0].id.startswith("GPU-") and len(first.devices[0].id) == 40


def test_device_nodes_are_char_devices_1_3(tmp_path: Path) -> None:
    plugin = SimPlugin("dgx-a100", "n1", tmp_path)
    inventory = plugin.discover()
    paths = [p for d in inventory.devices for p in d.device_nodes]
    assert len(paths) == 16
    assert paths[0] == f"{tmp_path}/dev/kubegpu-sim/gpu0"
    assert paths[8] == f"{tmp_path}/dev/kubegpu-sim/mlx5_0"
    for path in paths:
        st = os.stat(path)
        assert stat.S_ISCHR(st.st_mode), path
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
    if os.geteuid() == 0:
        assert stat.S_IMODE(os.lstat(paths[0]).st_mode) == 0o666
        assert stat.S_ISCHR(os.lstat(paths[0]).st_mode)  # a real node, not the symlink fallback
    plugin.discover()  # idempotent


def test_ensure_device_node_replaces_a_wrong_file(tmp_path: Path) -> None:
    path = tmp_path / "dev" / "gpu0"
    path.parent.mkdir()
    path.write_text("not a device")
    ensure_device_node(str(path))
    assert stat.S_ISCHR(os.stat(path).st_mode)


def test_ensure_device_node_without_mknod_falls_back_to_dev_null(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_mknod(*args: Any) -> None:
        raise PermissionError("Operation not permitted")

    monkeypatch.setattr(os, "mknod", no_mknod)
    path = tmp_path / "gpu0"
    ensure_device_node(str(path))
    assert os.readlink(path) == "/dev/null"
    assert os.stat(path).st_rdev == os.makedev(1, 3)


def test_health_follows_the_unhealthy_file(tmp_path: Path) -> None:
    plugin = SimPlugin("dgx1-v100", "n1", tmp_path)
    ids = [d.id for d in plugin.discover().devices]
    assert all(plugin.health().values()) and len(plugin.health()) == 8
    (tmp_path / "unhealthy").write_text(f"# broken\n{ids[2]}, {ids[5]}\n")
    assert [i for i, ok in plugin.health().items() if not ok] == [ids[2], ids[5]]
    assert [d.index for d in plugin.discover().devices if not d.healthy] == [2, 5]
    plugin.set_unhealthy([])
    assert all(plugin.health().values())


def test_parse_unhealthy() -> None:
    assert parse_unhealthy("a b,c\n# d\n e # f\n\n") == {"a", "b", "c", "e"}


def test_edits(tmp_path: Path) -> None:
    plugin = SimPlugin("hgx-h100", "n1", tmp_path)
    inventory = plugin.discover()
    gpus, nics = inventory.by_kind(DeviceKind.GPU), inventory.by_kind(DeviceKind.RDMA)
    edits = plugin.container_edits([gpus[2], gpus[3], nics[2]])
    assert edits.device_nodes == (
        DeviceNode(f"{tmp_path}/dev/kubegpu-sim/gpu2", "/dev/kubegpu-sim/gpu2", "rwm"),
        DeviceNode(f"{tmp_path}/dev/kubegpu-sim/gpu3", "/dev/kubegpu-sim/gpu3", "rwm"),
        DeviceNode(f"{tmp_path}/dev/kubegpu-sim/mlx5_2", "/dev/kubegpu-sim/mlx5_2", "rwm"),
    )
    assert edits.env == {
        "KUBEGPU_VISIBLE_DEVICES": f"{gpus[2].id},{gpus[3].id},mlx5_2",
        "NVIDIA_VISIBLE_DEVICES": f"{gpus[2].id},{gpus[3].id}",
        "KUBEGPU_RDMA_DEVICES": "mlx5_2",
    }
    for node in edits.device_nodes:
        assert stat.S_ISCHR(os.stat(node.host_path).st_mode)


def test_edits_accept_published_devices_and_shares(tmp_path: Path) -> None:
    """The shim may only know ids (from the allocation): paths come from the plugin itself."""
    plugin = SimPlugin("pcie-4gpu", "n1", tmp_path)
    published = NodeInventory.from_public(plugin.discover().public())
    gpu = published.devices[1]
    edits = plugin.container_edits([gpu], {gpu.id: SimpleNamespace(milli=500, memory_mib=0)})
    assert edits.device_nodes[0].host_path == f"{tmp_path}/dev/kubegpu-sim/gpu1"
    assert edits.env["KUBEGPU_GPU_SHARES"] == f"{gpu.id}:500:0"
    assert "KUBEGPU_RDMA_DEVICES" not in edits.env


def test_edits_refuse_devices_of_another_node(tmp_path: Path) -> None:
    mine = SimPlugin("pcie-4gpu", "n1", tmp_path / "a")
    theirs = SimPlugin("pcie-4gpu", "n2", tmp_path / "b", create_nodes=False).discover()
    with pytest.raises(PluginError, match="not on node n1"):
        mine.container_edits([theirs.devices[0]])


def test_resolve_topology(tmp_path: Path) -> None:
    assert resolve_topology("dgx1-v100") == TOPOLOGY_DIR / "dgx1-v100.json"
    assert resolve_topology("rtx8000-4gpu.json") == TOPOLOGY_DIR / "rtx8000-4gpu.json"
    own = tmp_path / "mine.json"
    own.write_text("{}")
    assert resolve_topology(own) == own
    with pytest.raises(TopologyFileError, match="not found.*dgx1-v100"):
        resolve_topology("no-such-machine")


def _tiny() -> dict[str, Any]:
    return {
        "gpus": [{"index": 0, "model": "m", "memoryMiB": 1, "numa": 0}, {"index": 1, "model": "m"}],
        "nvlink": [[0, 1], [1, 0]],
        "pcie": [["X", "PIX"], ["PIX", "X"]],
        "nics": [{"name": "ib0", "numa": 0, "pcieNearGpu": [0, 1], "rateGbps": 2.5}],
    }


def test_tiny_document_with_list_of_near_gpus() -> None:
    inventory = parse_topology(_tiny(), "n", "/state/dev/kubegpu-sim")
    ids = [d.id for d in inventory.by_kind(DeviceKind.GPU)]
    assert inventory.topology.nic_gpus == {"ib0": tuple(ids)}
    assert inventory.by_id()["ib0"].attributes["rateGbps"] == "2.5"
    assert inventory.devices[1].numa_node == -1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(gpus=[]), "non-empty list"),
        (lambda d: d["gpus"].reverse(), "listed by index"),
        (lambda d: d.update(nvlink=[[0, 1]]), "2x2 matrix"),
        (lambda d: d["nvlink"][0].__setitem__(1, 2), r"nvlink\[0\]\[1\] != nvlink\[1\]\[0\]"),
        (lambda d: d.update(nvlink=[[0, -1], [-1, 0]]), "count >= 0"),
        (lambda d: d.update(pcie=[["X", "BAD"], ["BAD", "X"]]), "unknown PCIe relation"),
        (lambda d: d.update(pcie=[["PIX", "PIX"], ["PIX", "X"]]), r"pcie\[0\]\[0\] must be 'X'"),
        (lambda d: d["nics"][0].update(name="../etc"), "needs a name"),
        (lambda d: d["nics"][0].update(pcieNearGpu=7), "not a GPU index"),
    ],
)
def test_bad_documents_are_named(change: Any, message: str) -> None:
    d = _tiny()
    change(d)
    with pytest.raises(TopologyFileError, match=message):
        parse_topology(d, "n", "/x", where="tiny.json")


def test_bad_file_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(TopologyFileError, match="broken.json"):
        SimPlugin(bad, "n1", tmp_path)
