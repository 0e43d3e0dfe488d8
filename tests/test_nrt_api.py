"""The node agent's NodeResourceTopology against a real kube-apiserver (docs/nrt.md).

A control plane of this module's own, so that whether the CRD is there, and which copy, is the
test's to say: without it, or with an old copy that serves only v1alpha1, the real publisher fails
each round with one clear log line and keeps running; with the CRD of deploy/crds/ the object is
created, owned by its Node, and follows the node ledger's holdings; another writer's object is
left alone.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from crishim.nrtpublisher import NrtUnavailable, TopologyPublisher
from devices.model import DeviceKind, NodeInventory
from devices.sim import SimPlugin
from kubegpu import nrt
from kubegpu.devenv.controlplane import ControlPlane, create_fake_node
from kubegpu.devenv.manifests import apply_manifests
from tests.support.schedtrial import wait_for
from tests.test_nrt import TWO_SOCKETS, sysfs

pytestmark = pytest.mark.apiserver
CRD = (
    Path(__file__).resolve().parents[1]
    / "deploy"
    / "crds"
    / "topology.node.k8s.io_noderesourcetopologies.yaml"
)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver of this module's own (the session one may have the CRD)."""
    private = ControlPlane(run_dir=tmp_path_factory.mktemp("nrt-plane"), binaries=control_plane.binaries)
    private.start()
    yield private
    private.stop()


@pytest.fixture
def api(plane: ControlPlane) -> Iterator[k8s.ApiClient]:
    client = plane.admin_client()
    yield client
    client.close()


def serves(api: k8s.ApiClient, version: str) -> bool:
    try:
        k8s.CustomObjectsApi(api).list_cluster_custom_object(nrt.GROUP, version, nrt.PLURAL)
        return True
    except k8s.ApiException as error:
        assert error.status == 404, error
        return False


def remove_crd(api: k8s.ApiClient) -> None:
    extensions = k8s.ApiextensionsV1Api(api)
    try:
        extensions.delete_custom_resource_definition(nrt.CRD_NAME)
    except k8s.ApiException as error:
        assert error.status == 404, error

    def gone() -> bool:
        try:
            extensions.read_custom_resource_definition(nrt.CRD_NAME)
            return False
        except k8s.ApiException as error:
            return error.status == 404

    wait_for(gone, "the CRD is deleted")
    wait_for(
        lambda: not serves(api, "v1alpha2") and not serves(api, "v1alpha1"), "the CRD is no longer served"
    )


class Node:
    """A fake Node with the sim plugin's dgx1-v100 (8 GPUs, 4 per NUMA node), two NUMA nodes in a
    fake sysfs, a ledger the test fills, and the real publisher on the given client."""

    def __init__(self, api: k8s.ApiClient, tmp_path: Path, name: str) -> None:
        self.name = name
        create_fake_node(k8s.CoreV1Api(api), name)
        self.inventory: NodeInventory = SimPlugin(
            "dgx1-v100", name, state_dir=tmp_path / "state", create_nodes=False
        ).discover()
        self.gpus = [g.id for g in self.inventory.by_kind(DeviceKind.GPU)]
        self.held: set[str] = set()
        numa = nrt.read_numa_nodes(sysfs(tmp_path, TWO_SOCKETS))
        self.publisher = TopologyPublisher(
            k8s.CustomObjectsApi(api),
            k8s.CoreV1Api(api),
            name,
            lambda: self.inventory,
            lambda: self.held,
            lambda: numa,
            interval=0.05,
            host_resources=True,
        )


def test_without_the_crd_or_with_an_old_copy_the_agent_logs_one_clear_line_and_runs_on(
    api: k8s.ApiClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    remove_crd(api)
    node = Node(api, tmp_path, "gpu-no-crd")
    with pytest.raises(NrtUnavailable, match="CRD noderesourcetopologies.topology.node.k8s.io absent"):
        node.publisher.sync_once()
    # an old copy (as NFD releases before v1alpha2 installed): v1alpha1 only
    old = yaml.safe_load(CRD.read_text())
    old["spec"]["versions"] = [copy.deepcopy(v) for v in old["spec"]["versions"] if v["name"] == "v1alpha1"]
    old["spec"]["versions"][0]["storage"] = True
    k8s.ApiextensionsV1Api(api).create_custom_resource_definition(old)
    try:
        wait_for(lambda: serves(api, "v1alpha1"), "the old copy is served")
        with caplog.at_level(logging.INFO, logger="kubegpu.crishim.nrtpublisher"):
            node.publisher.start()
            wait_for(
                lambda: any(r.getMessage() == "node.nrt_publish_failed" for r in caplog.records), "logged"
            )
            time.sleep(0.5)  # ten more rounds fail the same way
            assert node.publisher._thread is not None and node.publisher._thread.is_alive()
            node.publisher.stop()
        failed = [r for r in caplog.records if r.getMessage() == "node.nrt_publish_failed"]
        assert len(failed) == 1
        assert "serves no NodeResourceTopology topology.node.k8s.io/v1alpha2" in failed[0].fields["error"]  # type: ignore[attr-defined]
        assert node.publisher.writes == 0
    finally:
        remove_crd(api)


def test_with_the_shipped_crd_the_object_is_created_and_follows_the_allocation(
    api: k8s.ApiClient, tmp_path: Path
) -> None:
    apply_manifests(api, [CRD])
    wait_for(lambda: serves(api, "v1alpha2"), "the CRD is served")
    node = Node(api, tmp_path, "gpu-nrt")
    custom = k8s.CustomObjectsApi(api)

    def stored() -> dict[str, Any]:
        return custom.get_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, node.name)

    def gpus_available() -> list[int]:
        return [
            r["available"] for z in stored()["zones"] for r in z["resources"] if r["name"] == "nvidia.com/gpu"
        ]

    assert node.publisher.sync_once() == "created"
    first = stored()
    uid = k8s.CoreV1Api(api).read_node(node.name).metadata.uid
    assert first["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": uid}
    ]
    assert [(z["name"], z["type"]) for z in first["zones"]] == [("node-0", "Node"), ("node-1", "Node")]
    assert first["zones"][0]["costs"] == [{"name": "node-0", "value": 10}, {"name": "node-1", "value": 21}]
    assert {r["name"]: r["capacity"] for r in first["zones"][1]["resources"]} == {
        "cpu": 40,
        "memory": 264231616 * 1024,
        "nvidia.com/gpu": 4,
    }
    assert gpus_available() == [4, 4]
    # nothing changed: no write, the object's resourceVersion stays
    assert (
        node.publisher.sync_once() == ""
        and stored()["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    )
    node.held |= {node.gpus[0], node.gpus[1], node.gpus[7]}  # two containers started
    assert node.publisher.sync_once() == "changed" and gpus_available() == [2, 3]
    node.held -= {node.gpus[0]}
    assert node.publisher.sync_once() == "changed" and gpus_available() == [3, 3]
    assert node.publisher.writes == 3
    # the same object read through v1alpha1 (served by upstream's CRD for older readers)
    old = custom.get_cluster_custom_object(nrt.GROUP, "v1alpha1", nrt.PLURAL, node.name)
    assert [z["name"] for z in old["zones"]] == ["node-0", "node-1"]


def test_another_writers_object_is_left_alone(api: k8s.ApiClient, tmp_path: Path) -> None:
    apply_manifests(api, [CRD])
    wait_for(lambda: serves(api, "v1alpha2"), "the CRD is served")
    custom = k8s.CustomObjectsApi(api)
    theirs = {
        "apiVersion": nrt.API_VERSION,
        "kind": nrt.KIND,
        "metadata": {"name": "gpu-nfd", "labels": {"app.kubernetes.io/managed-by": "nfd-topology-updater"}},
        "zones": [{"name": "node-0", "type": "Node", "resources": []}],
    }
    custom.create_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, theirs)
    before = custom.get_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, "gpu-nfd")
    node = Node(api, tmp_path, "gpu-nfd")
    assert node.publisher.sync_once() == "" and node.publisher.writes == 0
    after = custom.get_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, "gpu-nfd")
    assert after == before
