"""The node's NodeResourceTopology (kubegpu/nrt.py, crishim/nrtpublisher.py, docs/nrt.md): the zones
it builds from the inventory, the ledger and the kernel's NUMA nodes, when the publisher writes,
what it leaves alone, and the CRD it ships (upstream's, in deploy/crds/ and the chart)."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from kubernetes.client.rest import ApiException

from crishim.nrtpublisher import NrtUnavailable, TopologyPublisher
from devices.model import Device, DeviceKind, NodeInventory
from devices.sim import SimPlugin
from kubegpu import nrt
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
CRD_FILE = "topology.node.k8s.io_noderesourcetopologies.yaml"


def sysfs(tmp_path: Path, nodes: dict[int, dict[str, str]]) -> str:
    """A fake sysfs root whose NUMA nodes have the given files."""
    for numa, files in nodes.items():
        folder = tmp_path / "sys/devices/system/node" / f"node{numa}"
        folder.mkdir(parents=True)
        for name, text in files.items():
            (folder / name).write_text(text)
    (tmp_path / "sys/devices/system/node/online").write_text("0-1\n")
    return str(tmp_path)


TWO_SOCKETS = {
    0: {
        "cpulist": "0-19,40-59\n",
        "meminfo": "Node 0 MemTotal:  263921612 kB\nNode 0 MemFree: 1 kB\n",
        "distance": "10 21\n",
    },
    1: {"cpulist": "20-39,60-79\n", "meminfo": "Node 1 MemTotal:  264231616 kB\n", "distance": "21 10\n"},
}


def dgx1(tmp_path: Path) -> NodeInventory:
    """The sim plugin's dgx1-v100: 8 GPUs, 4 on NUMA node 0 and 4 on 1."""
    return SimPlugin("dgx1-v100", "n", state_dir=tmp_path / "state", create_nodes=False).discover()


def test_the_kernels_numa_nodes_are_read_with_their_cpus_memory_and_distances(tmp_path: Path) -> None:
    nodes = nrt.read_numa_nodes(sysfs(tmp_path, TWO_SOCKETS))
    assert nodes == {
        0: nrt.NumaNode(0, 40, 263921612 * 1024, {0: 10, 1: 21}),
        1: nrt.NumaNode(1, 40, 264231616 * 1024, {0: 21, 1: 10}),
    }
    assert nrt.read_numa_nodes(str(tmp_path / "nowhere")) == {}


def test_unreadable_numa_files_leave_their_figures_unknown(tmp_path: Path) -> None:
    root = sysfs(tmp_path, {0: {"cpulist": "3-1", "meminfo": "nothing", "distance": "10 x"}, 1: {}})
    assert nrt.read_numa_nodes(root) == {0: nrt.NumaNode(0), 1: nrt.NumaNode(1)}
    assert nrt.count_cpus("0-3,8,10-11\n") == 7 and nrt.count_cpus("") == 0


def test_one_zone_per_numa_node_with_its_gpus_allocatable_when_healthy_and_available_when_unheld(
    tmp_path: Path,
) -> None:
    inventory = dgx1(tmp_path)
    gpus = inventory.by_kind(DeviceKind.GPU)
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    broken = NodeInventory(tuple(replace(d, healthy=d.id != gpus[5].id) for d in inventory.devices))
    held = {gpus[0].id, gpus[1].id, gpus[5].id}  # gpus[5] is broken and held: not available twice
    zones, left_out = nrt.zones(broken, held, nrt.read_numa_nodes(sysfs(tmp_path, TWO_SOCKETS)))
    assert left_out == 0
    assert zones == [
        {
            "name": "node-0",
            "type": "Node",
            "costs": [{"name": "node-0", "value": 10}, {"name": "node-1", "value": 21}],
            "resources": [{"name": "nvidia.com/gpu", "capacity": 4, "allocatable": 4, "available": 2}],
        },
        {
            "name": "node-1",
            "type": "Node",
            "costs": [{"name": "node-0", "value": 21}, {"name": "node-1", "value": 10}],
            "resources": [{"name": "nvidia.com/gpu", "capacity": 4, "allocatable": 3, "available": 3}],
        },
    ]


def test_host_resources_and_rdma_nics_are_listed_per_zone(tmp_path: Path) -> None:
    VF = {"function": "vf", "parentDevice": "mlx5_0"}  # noqa: N806
    devices = (
        Device("GPU-a", DeviceKind.GPU, 0, "A100", numa_node=1),
        Device("mlx5_0", DeviceKind.RDMA, 0, "CX6", numa_node=1, attributes={"rateGbps": "100"}),
        Device("mlx5_1", DeviceKind.RDMA, 1, "CX6", numa_node=1, attributes=VF),
        Device("mlx5_2", DeviceKind.RDMA, 2, "CX6", numa_node=1, healthy=False, attributes=VF),
        Device("mlx5_3", DeviceKind.RDMA, 3, "CX6", numa_node=1, attributes=VF),
        Device("mlx5_9", DeviceKind.RDMA, 9, "CX6", numa_node=1),  # a PF without VFs: no interface
    )  # fmt: skip
    zones, _ = nrt.zones(
        NodeInventory(devices),
        {"mlx5_0", "mlx5_1"},
        nrt.read_numa_nodes(sysfs(tmp_path, TWO_SOCKETS)),
        host_resources=True,
    )
    assert [r["name"] for r in zones[0]["resources"]] == ["cpu", "memory"]  # a zone without devices
    assert zones[1]["resources"] == [
        {"name": "cpu", "capacity": 40, "allocatable": 40, "available": 40},
        # VFs only, as the node's allocatable counts them: 3 VFs, 2 usable, 1 of them held
        {"name": "kubegpu.io/rdma", "capacity": 3, "allocatable": 2, "available": 1},
        {
            "name": "memory",
            "capacity": 264231616 * 1024,
            "allocatable": 264231616 * 1024,
            "available": 264231616 * 1024,
        },
        {"name": "nvidia.com/gpu", "capacity": 1, "allocatable": 1, "available": 1},
    ]


def test_a_device_of_unknown_numa_node_goes_to_the_only_one_or_is_left_out(tmp_path: Path) -> None:
    devices = NodeInventory(
        (Device("GPU-a", DeviceKind.GPU, 0, "T4"), Device("GPU-b", DeviceKind.GPU, 1, "T4"))
    )
    one = {0: nrt.NumaNode(0, 8, None, {0: 10})}
    zones, left_out = nrt.zones(devices, (), one)
    assert left_out == 0 and zones[0]["resources"][0]["capacity"] == 2
    zones, left_out = nrt.zones(devices, (), nrt.read_numa_nodes(sysfs(tmp_path, TWO_SOCKETS)))
    assert left_out == 2 and all(z["resources"] == [] for z in zones)
    assert nrt.zones(devices, (), {}) == ([], 2)  # no sysfs: nothing known to say


@pytest.mark.parametrize(
    ("policy", "scope", "value"),
    [
        ("none", "container", "None"),
        ("single-numa-node", "container", "SingleNUMANodeContainerLevel"),
        ("single-numa-node", "pod", "SingleNUMANodePodLevel"),
        ("restricted", "pod", "RestrictedPodLevel"),
        ("best-effort", "container", "BestEffortContainerLevel"),
    ],
)
def test_the_topology_manager_settings_as_attributes_and_the_deprecated_policies(
    policy: str, scope: str, value: str
) -> None:
    body = nrt.document("n1", [], policy, scope, owner_uid="u1")
    assert body["topologyPolicies"] == [value]
    assert body["attributes"] == [
        {"name": "topologyManagerPolicy", "value": policy},
        {"name": "topologyManagerScope", "value": scope},
    ]
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u1" and nrt.ours(body)
    plain = nrt.document("n1", [])
    assert "attributes" not in plain and "topologyPolicies" not in plain
    with pytest.raises(ValueError, match="unknown Topology Manager policy"):
        nrt.topology_policy("static", "pod")


class FakeCustom:
    """CustomObjectsApi's cluster-scoped calls on noderesourcetopologies over a dict."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.served = True

    def _check(self, group: str, version: str, plural: str) -> None:
        assert (group, version, plural) == ("topology.node.k8s.io", "v1alpha2", "noderesourcetopologies")
        if not self.served:
            raise ApiException(status=404, reason="Not Found")

    def get_cluster_custom_object(self, group, version, plural, name):  # noqa: ANN001, ANN201
        self.calls.append("get")
        self._check(group, version, plural)
        if name not in self.objects:
            raise ApiException(status=404)
        return json.loads(json.dumps(self.objects[name]))

    def patch_cluster_custom_object(self, group, version, plural, name, body, _content_type=None):  # noqa: ANN001, ANN201
        self.calls.append("patch")
        self._check(group, version, plural)
        assert _content_type == "application/merge-patch+json"
        if name not in self.objects:
            raise ApiException(status=404)
        stored = self.objects[name]
        for key, value in body.items():
            if key == "metadata":
                stored["metadata"].setdefault("labels", {}).update(value["labels"])
            elif value is None:
                stored.pop(key, None)
            else:
                stored[key] = value

    def create_cluster_custom_object(self, group, version, plural, body):  # noqa: ANN001, ANN201
        self.calls.append("create")
        self._check(group, version, plural)
        self.objects[body["metadata"]["name"]] = json.loads(json.dumps(body))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def publisher_on(
    tmp_path: Path, custom: FakeCustom, held: set[str], **kw: Any
) -> tuple[TopologyPublisher, Clock]:
    inventory = dgx1(tmp_path)
    numa = nrt.read_numa_nodes(sysfs(tmp_path, TWO_SOCKETS))
    core = SimpleNamespace(read_node=lambda name: SimpleNamespace(metadata=SimpleNamespace(uid="uid-7")))
    clock = Clock()
    publisher = TopologyPublisher(
        custom, core, "gpu-7", lambda: inventory, lambda: held, lambda: numa, refresh=300, clock=clock, **kw
    )
    return publisher, clock


def available(obj: dict[str, Any]) -> list[int]:
    return [r["available"] for z in obj["zones"] for r in z["resources"] if r["name"] == "nvidia.com/gpu"]


def test_it_creates_the_object_then_writes_only_when_a_zone_changes(tmp_path: Path) -> None:
    custom = FakeCustom()
    held: set[str] = set()
    publisher, clock = publisher_on(tmp_path, custom, held, policy="single-numa-node", scope="pod")
    assert publisher.sync_once() == "created" and custom.calls == ["get", "create"]
    stored = custom.objects["gpu-7"]
    assert stored["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "kubegpu"}
    assert stored["metadata"]["ownerReferences"][0] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "gpu-7",
        "uid": "uid-7",
    }
    assert available(stored) == [4, 4] and stored["topologyPolicies"] == ["SingleNUMANodePodLevel"]
    clock.now = 30
    assert publisher.sync_once() == "" and publisher.writes == 1  # nothing changed: no API call
    gpu = dgx1(tmp_path).by_kind(DeviceKind.GPU)[6].id
    held.add(gpu)  # a container took a GPU of NUMA node 1
    clock.now = 60
    assert publisher.sync_once() == "changed" and custom.calls[-1] == "patch"
    assert available(custom.objects["gpu-7"]) == [4, 3]
    held.discard(gpu)
    clock.now = 90
    assert publisher.sync_once() == "changed" and available(custom.objects["gpu-7"]) == [4, 4]
    assert custom.calls == ["get", "create", "patch", "patch"]
    # quiet: rewritten after the refresh bound; deleted behind its back: created again
    del custom.objects["gpu-7"]
    clock.now = 389
    assert publisher.sync_once() == ""
    clock.now = 390
    assert publisher.sync_once() == "refresh" and custom.calls[-2:] == ["patch", "create"]
    assert available(custom.objects["gpu-7"]) == [4, 4] and publisher.writes == 4


def test_a_write_someone_else_made_first_is_not_taken_as_written_and_the_next_round_reads_first(
    tmp_path: Path,
) -> None:
    """A 409 on the create (made meanwhile) or on the patch (written since, by its resourceVersion)."""
    custom = FakeCustom()
    held: set[str] = set()
    publisher, clock = publisher_on(tmp_path, custom, held)
    real_create, real_patch = custom.create_cluster_custom_object, custom.patch_cluster_custom_object

    def conflict(*_: Any, **__: Any) -> None:
        custom.calls.append("conflict")
        raise ApiException(status=409, reason="Conflict")

    custom.create_cluster_custom_object = conflict  # type: ignore[method-assign]
    assert publisher.sync_once() == "" and publisher.writes == 0 and custom.calls == ["get", "conflict"]
    custom.create_cluster_custom_object = real_create  # type: ignore[method-assign]
    clock.now = 30
    assert publisher.sync_once() == "created" and publisher.writes == 1
    held.add(dgx1(tmp_path).by_kind(DeviceKind.GPU)[0].id)
    custom.patch_cluster_custom_object = conflict  # type: ignore[method-assign]
    clock.now = 60
    assert publisher.sync_once() == "" and publisher.writes == 1 and custom.calls[-1] == "conflict"
    custom.patch_cluster_custom_object = real_patch  # type: ignore[method-assign]
    clock.now = 90
    assert publisher.sync_once() == "changed" and custom.calls[-2:] == ["get", "patch"]
    assert available(custom.objects["gpu-7"]) == [3, 4] and publisher.writes == 2


def test_another_writers_object_is_left_alone_and_looked_at_again_after_the_refresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    custom = FakeCustom()
    theirs = {"metadata": {"name": "gpu-7", "labels": {"app.kubernetes.io/managed-by": "nfd"}}, "zones": []}
    custom.objects["gpu-7"] = theirs
    publisher, clock = publisher_on(tmp_path, custom, set())
    with caplog.at_level(logging.INFO, logger="kubegpu.crishim.nrtpublisher"):
        assert publisher.sync_once() == "" and custom.calls == ["get"]
        clock.now = 299
        assert publisher.sync_once() == "" and custom.calls == ["get"]  # not even read meanwhile
        clock.now = 300
        assert publisher.sync_once() == "" and custom.calls == ["get", "get"]
    assert custom.objects["gpu-7"] == theirs and publisher.writes == 0
    lines = [r for r in caplog.records if r.getMessage() == "node.nrt_not_ours"]
    assert len(lines) == 1 and lines[0].fields["writer"] == "nfd"  # type: ignore[attr-defined]
    del custom.objects["gpu-7"]  # the other writer went: kubegpu takes over
    clock.now = 600
    assert publisher.sync_once() == "created" and nrt.ours(custom.objects["gpu-7"])


def test_without_the_crd_a_round_fails_with_a_clear_error_and_the_loop_logs_it_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    custom = FakeCustom()
    custom.served = False
    publisher, _ = publisher_on(tmp_path, custom, set(), interval=0.01)
    with pytest.raises(NrtUnavailable, match=r"serves no NodeResourceTopology topology.node.k8s.io/v1alpha2"):
        publisher.sync_once()
    with caplog.at_level(logging.INFO, logger="kubegpu.crishim.nrtpublisher"):
        publisher.start()
        wait_for(lambda: custom.calls.count("create") >= 5, 10, 0.01)
        custom.served = True
        wait_for(lambda: "gpu-7" in custom.objects, 10, 0.01)
        publisher.stop()
    events = [r.getMessage() for r in caplog.records]
    assert events.count("node.nrt_publish_failed") == 1 and "node.nrt_publish_recovered" in events
    failed = next(r for r in caplog.records if r.getMessage() == "node.nrt_publish_failed")
    assert "noderesourcetopologies.topology.node.k8s.io" in failed.fields["error"]  # type: ignore[attr-defined]


def test_a_crd_that_refuses_the_object_is_named_in_the_error(tmp_path: Path) -> None:
    custom = FakeCustom()

    def refuse(*_: Any, **__: Any) -> None:
        raise ApiException(status=422, reason="Unprocessable Entity")

    custom.create_cluster_custom_object = refuse  # type: ignore[method-assign]
    publisher, _ = publisher_on(tmp_path, custom, set())
    with pytest.raises(NrtUnavailable, match="refused NodeResourceTopology gpu-7 .*upstream's schema"):
        publisher.sync_once()


def test_the_shipped_crd_is_upstreams_and_the_chart_ships_the_same_copy() -> None:
    shipped = ROOT / "deploy" / "crds" / CRD_FILE
    assert shipped.read_bytes() == (ROOT / "deploy/helm/kubegpu/crds" / CRD_FILE).read_bytes()
    crd = yaml.safe_load(shipped.read_text())
    assert crd["metadata"]["name"] == nrt.CRD_NAME
    assert crd["metadata"]["annotations"]["api-approved.kubernetes.io"].endswith("/pull/1870")
    spec = crd["spec"]
    assert (spec["group"], spec["scope"], spec["names"]["kind"], spec["names"]["plural"]) == (
        nrt.GROUP,
        "Cluster",
        nrt.KIND,
        nrt.PLURAL,
    )
    versions = {v["name"]: v for v in spec["versions"]}
    assert (
        versions["v1alpha2"]["storage"] and versions["v1alpha2"]["served"] and versions["v1alpha1"]["served"]
    )
    schema = versions["v1alpha2"]["schema"]["openAPIV3Schema"]
    assert schema["required"] == ["zones"] and set(schema["properties"]) == {
        "apiVersion",
        "kind",
        "metadata",
        "topologyPolicies",
        "zones",
        "attributes",
    }
    resource = schema["properties"]["zones"]["items"]["properties"]["resources"]["items"]
    assert resource["required"] == ["allocatable", "available", "capacity", "name"]


def test_the_flags_build_the_publisher(tmp_path: Path) -> None:
    from kubernetes import client

    from crishim.assemble import build_nrt_publisher
    from kubegpu.cli import build_parser

    rewriter = SimpleNamespace(ledger=SimpleNamespace(holdings=lambda: [SimpleNamespace(device="GPU-x")]))
    devices = SimpleNamespace(current_inventory=lambda: dgx1(tmp_path))
    root = sysfs(tmp_path, TWO_SOCKETS)
    base = ["crishim", "--device-plugin", "sim", "--node-name", "n", "--advertise", "--sysfs-root", root]
    built = build_nrt_publisher(build_parser().parse_args(base), devices, rewriter, client.ApiClient())
    assert built is not None and (built.interval, built.refresh, built.host_resources, built.policy) == (
        30.0,
        300.0,
        False,
        "",
    )
    body = built.desired()
    assert [z["name"] for z in body["zones"]] == ["node-0", "node-1"] and "attributes" not in body
    flags = ["--nrt-publish-interval", "600", "--nrt-host-resources", "--nrt-topology-manager-policy"]
    flags += ["single-numa-node", "--nrt-topology-manager-scope", "pod"]
    built = build_nrt_publisher(
        build_parser().parse_args(base + flags), devices, rewriter, client.ApiClient()
    )
    assert built is not None and (built.interval, built.refresh, built.host_resources) == (600.0, 600.0, True)
    assert built.desired()["topologyPolicies"] == ["SingleNUMANodePodLevel"]
    off = build_parser().parse_args([*base, "--nrt-publish-interval", "0"])
    assert build_nrt_publisher(off, devices, rewriter, client.ApiClient()) is None
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--nrt-topology-manager-policy", "static"])
