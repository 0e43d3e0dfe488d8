"""The node agent against a real kube-apiserver: the advertiser and the shim's pod lookup."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from kubernetes import client as k8s

from crishim.advertiser import HEARTBEAT_ANNOTATION, INVENTORY_ANNOTATION, Advertiser
from crishim.intercept import Rejected
from crishim.podlookup import ApiPodLookup, NodePodCache
from crishim.rewrite import NodeDevices
from devices.model import NodeInventory
from devices.registry import load_plugins
from kubegpu.allocation import ANNOTATION
from kubegpu.devenv.controlplane import ControlPlane, create_fake_node

pytestmark = pytest.mark.apiserver


def sim_devices(node: str, state: Path) -> NodeDevices:
    plugins = load_plugins(["sim"], {"node_name": node, "topology": "hgx-h100", "state_dir": str(state)})
    devices = NodeDevices(plugins, sysfs_root=None)
    devices.discover()
    return devices


def test_advertiser_publishes_and_then_stays_quiet(admin_api: k8s.ApiClient, tmp_path: Path) -> None:
    core = k8s.CoreV1Api(admin_api)
    name = f"gpu-{uuid.uuid4().hex[:6]}"
    create_fake_node(core, name)
    devices = sim_devices(name, tmp_path)
    advertiser = Advertiser(core, name, devices.current_inventory, heartbeat_seconds=3600)

    assert advertiser.sync_once() == ["inventory", "heartbeat", "capacity"]
    node = core.read_node(name)
    assert node.status.capacity["nvidia.com/gpu"] == "8" and node.status.allocatable["nvidia.com/gpu"] == "8"
    # hgx-h100 has one NIC per GPU, none with VFs: no RDMA interface a pod could be given
    assert node.status.capacity["kubegpu.io/rdma"] == "0"
    published = NodeInventory.from_public(json.loads(node.metadata.annotations[INVENTORY_ANNOTATION]))
    assert published == NodeInventory(
        tuple(d.__class__(**{**d.__dict__, "device_nodes": ()}) for d in devices.inventory.devices),
        devices.inventory.topology,
    )
    assert HEARTBEAT_ANNOTATION in node.metadata.annotations

    version = node.metadata.resource_version
    for _ in range(3):
        assert advertiser.sync_once() == []
    assert core.read_node(name).metadata.resource_version == version  # nothing written at all

    sick = sorted(d for d in devices.devices if d.startswith("GPU-"))[0]
    (tmp_path / "unhealthy").write_text(sick)
    devices.refresh_health()
    assert advertiser.sync_once() == ["inventory", "heartbeat", "capacity"]
    node = core.read_node(name)
    assert node.status.capacity["nvidia.com/gpu"] == "7"
    states = {
        d["id"]: d["healthy"] for d in json.loads(node.metadata.annotations[INVENTORY_ANNOTATION])["devices"]
    }
    assert states[sick] is False


def test_advertise_cli_once_and_dry_run(
    control_plane: ControlPlane, admin_api: k8s.ApiClient, tmp_path: Path
) -> None:
    core = k8s.CoreV1Api(admin_api)
    name = f"cli-{uuid.uuid4().hex[:6]}"
    create_fake_node(core, name)
    base = [
        sys.executable,
        "-m",
        "kubegpu",
        "advertise",
        "--device-plugin",
        "sim",
        "--sim-topology",
        "pcie-4gpu",
        "--node-name",
        name,
        "--sim-state-dir",
        str(tmp_path),
    ]
    dry = subprocess.run([*base, "--dry-run"], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(dry.stdout)["capacity"] == {"kubegpu.io/rdma": "0", "nvidia.com/gpu": "4"}
    assert INVENTORY_ANNOTATION not in (core.read_node(name).metadata.annotations or {})
    once = subprocess.run(
        [*base, "--once", "--kubeconfig", str(control_plane.admin_kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(once.stdout.strip().splitlines()[-1])["wrote"] == ["inventory", "heartbeat", "capacity"]
    assert core.read_node(name).status.capacity["nvidia.com/gpu"] == "4"


def test_advertiser_loop_survives_an_unreachable_apiserver(tmp_path: Path) -> None:
    configuration = k8s.Configuration()
    configuration.host = "https://127.0.0.1:1"  # nothing listens there
    core = k8s.CoreV1Api(k8s.ApiClient(configuration))
    advertiser = Advertiser(
        core, "nowhere", sim_devices("nowhere", tmp_path).current_inventory, interval=0.05
    )
    advertiser.start()
    time.sleep(1.5)
    advertiser.stop()
    assert advertiser.patches == 0


def pod(
    namespace: str,
    name: str,
    limits: dict[str, str] | None,
    annotation: str | None,
    extra: dict[str, str] | None = None,
) -> k8s.V1Pod:
    annotations = {**({ANNOTATION: annotation} if annotation else {}), **(extra or {})}
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, annotations=annotations or None),
        spec=k8s.V1PodSpec(
            scheduler_name="nobody",
            containers=[
                k8s.V1Container(
                    name="app", image="busybox", resources=k8s.V1ResourceRequirements(limits=limits)
                )
            ],
        ),
    )


def test_pod_lookup_fallback(admin_api: k8s.ApiClient, kube_namespace: str) -> None:
    core = k8s.CoreV1Api(admin_api)
    gpu = core.create_namespaced_pod(
        kube_namespace, pod(kube_namespace, "wants-gpu", {"nvidia.com/gpu": "1"}, None)
    )
    plain = core.create_namespaced_pod(kube_namespace, pod(kube_namespace, "plain", None, None))
    annotated = core.create_namespaced_pod(
        kube_namespace, pod(kube_namespace, "annotated", {"nvidia.com/gpu": "1"}, '{"x":1}')
    )
    lookup = ApiPodLookup(core)

    async def run() -> None:
        with pytest.raises(Rejected) as caught:
            await lookup(kube_namespace, "wants-gpu", gpu.metadata.uid)
        assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert "requests nvidia.com/gpu but carries no kubegpu allocation" in caught.value.message
        assert await lookup(kube_namespace, "plain", plain.metadata.uid) is None
        assert await lookup(kube_namespace, "annotated", annotated.metadata.uid) == '{"x":1}'
        assert await lookup(kube_namespace, "plain", "some-other-uid") is None  # a recreated pod
        assert await lookup(kube_namespace, "missing", "uid") is None  # 404: scrubbed, not crashed

    asyncio.run(run())


def test_pods_asking_for_devices_any_managed_way_are_refused_without_an_allocation(
    admin_api: k8s.ApiClient, kube_namespace: str
) -> None:
    """The names come from the contract: the advertiser's kubegpu.io/rdma, the scheduler's
    share annotation kubegpu.io/gpu-milli, not a list of guesses."""
    core = k8s.CoreV1Api(admin_api)
    rdma = core.create_namespaced_pod(
        kube_namespace, pod(kube_namespace, "wants-rdma", {"kubegpu.io/rdma": "1"}, None)
    )
    share = core.create_namespaced_pod(
        kube_namespace, pod(kube_namespace, "wants-share", None, None, {"kubegpu.io/gpu-milli": "250"})
    )
    lookup = ApiPodLookup(core)

    async def run() -> None:
        for created, what in ((rdma, "kubegpu.io/rdma"), (share, "kubegpu.io/gpu-milli")):
            with pytest.raises(Rejected) as caught:
                await lookup(kube_namespace, created.metadata.name, created.metadata.uid)
            assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION
            assert f"requests {what} but carries no kubegpu allocation" in caught.value.message

    asyncio.run(run())


def test_the_lookup_reads_a_pods_rdma_resource_request_from_the_api(
    admin_api: k8s.ApiClient, kube_namespace: str
) -> None:
    """What the shim checks an allocated pod's VFs against (crishim/rewrite.py): the pod's request of
    kubegpu.io/rdma by Kubernetes' rule, as the apiserver keeps it (requests defaulted from limits),
    here an init container's 2 above the app's 1; another pod's UID, or none by that name: None."""
    core = k8s.CoreV1Api(admin_api)
    body = pod(kube_namespace, "rdma-init", {"kubegpu.io/rdma": "1"}, "anything")
    body.spec.init_containers = [
        k8s.V1Container(
            name="init",
            image="busybox",
            resources=k8s.V1ResourceRequirements(limits={"kubegpu.io/rdma": "2"}),
        )
    ]
    created = core.create_namespaced_pod(kube_namespace, body)
    plain = core.create_namespaced_pod(kube_namespace, pod(kube_namespace, "plain", None, "anything"))
    lookup = ApiPodLookup(core)

    async def run() -> None:
        assert await lookup.rdma_resource(kube_namespace, "rdma-init", created.metadata.uid) == 2
        assert await lookup.rdma_resource(kube_namespace, "plain", plain.metadata.uid) == 0
        assert await lookup.rdma_resource(kube_namespace, "rdma-init", "another-uid") is None
        assert await lookup.rdma_resource(kube_namespace, "missing", "uid") is None

    asyncio.run(run())


def test_a_pod_read_for_its_allocation_is_not_read_again_for_its_rdma_resource(
    admin_api: k8s.ApiClient, kube_namespace: str
) -> None:
    """A create whose sandbox lacks the allocation asks the lookup for it, then for the pod's
    kubegpu.io/rdma: both come from the one read (the pod is gone before the second question)."""
    core = k8s.CoreV1Api(admin_api)
    created = core.create_namespaced_pod(
        kube_namespace, pod(kube_namespace, "read-once", {"kubegpu.io/rdma": "1"}, "anything")
    )
    lookup = ApiPodLookup(core)

    async def run() -> None:
        assert await lookup(kube_namespace, "read-once", created.metadata.uid) == "anything"
        core.delete_namespaced_pod("read-once", kube_namespace, grace_period_seconds=0)
        wait_for(lambda: not core.list_namespaced_pod(kube_namespace).items, "the deletion")
        assert await lookup.rdma_resource(kube_namespace, "read-once", created.metadata.uid) == 1

    asyncio.run(run())


def test_an_unreachable_api_server_means_no_allocation_never_an_exception() -> None:
    """urllib3's MaxRetryError used to escape the lookup and fail every such create with UNKNOWN."""
    configuration = k8s.Configuration()
    configuration.host = "https://127.0.0.1:1"  # nothing listens there
    configuration.retries = 1
    lookup = ApiPodLookup(k8s.CoreV1Api(k8s.ApiClient(configuration)), timeout=1.0)
    assert asyncio.run(lookup("default", "anything", "uid")) is None


# --------------------------------------------------------------------------- the node's pod cache


def unreachable_core() -> k8s.CoreV1Api:
    configuration = k8s.Configuration()
    configuration.host = "https://127.0.0.1:1"  # nothing listens there
    configuration.retries = 0
    return k8s.CoreV1Api(k8s.ApiClient(configuration))


def bound(created: k8s.V1Pod, node: str) -> k8s.V1Pod:
    created.spec.node_name = node
    return created


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_pod_cache_decides_for_the_nodes_pods_without_reading_them(
    admin_api: k8s.ApiClient, kube_namespace: str
) -> None:
    core = k8s.CoreV1Api(admin_api)
    node = f"cache-{uuid.uuid4().hex[:6]}"
    create_fake_node(core, node)
    cache = NodePodCache(core, node).start()
    try:
        assert cache.synced.wait(30)
        ns = kube_namespace
        gpu = core.create_namespaced_pod(ns, bound(pod(ns, "wants-gpu", {"nvidia.com/gpu": "1"}, None), node))
        share = core.create_namespaced_pod(
            ns, bound(pod(ns, "wants-share", None, None, {"kubegpu.io/gpu-milli": "250"}), node)
        )
        plain = core.create_namespaced_pod(ns, bound(pod(ns, "plain", None, None), node))
        annotated = core.create_namespaced_pod(
            ns, bound(pod(ns, "annotated", {"nvidia.com/gpu": "1"}, '{"x":1}'), node)
        )
        elsewhere = core.create_namespaced_pod(ns, pod(ns, "elsewhere", {"nvidia.com/gpu": "1"}, None))
        wait_for(lambda: len(cache) == 4, "the cache to see the four bound pods")
        assert cache.get(ns, "elsewhere", elsewhere.metadata.uid) is None  # not this node's

        # Every read of the API fails: whatever is decided here came from the cache.
        cached_only = ApiPodLookup(unreachable_core(), timeout=1.0, cache=cache)

        async def run() -> None:
            for refused, what in ((gpu, "nvidia.com/gpu"), (share, "kubegpu.io/gpu-milli")):
                with pytest.raises(Rejected) as caught:
                    await cached_only(ns, refused.metadata.name, refused.metadata.uid)
                assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION
                assert f"pod {ns}/{refused.metadata.name} requests {what} but carries no kubegpu" in (
                    caught.value.message
                )
            assert await cached_only(ns, "plain", plain.metadata.uid) is None
            assert await cached_only(ns, "annotated", annotated.metadata.uid) == '{"x":1}'

        asyncio.run(run())
        core.delete_namespaced_pod("wants-gpu", ns, grace_period_seconds=0)
        wait_for(lambda: cache.get(ns, "wants-gpu", gpu.metadata.uid) is None, "the deletion")
        assert len(cache) == 3
    finally:
        cache.stop()


def test_a_pod_the_cache_has_not_seen_is_read_from_the_api(
    admin_api: k8s.ApiClient, kube_namespace: str
) -> None:
    """Fail closed: a cache that is behind, never synced (no list/watch rights, API gone) or asked
    under another name or UID never lets a GPU pod without an allocation through."""
    core = k8s.CoreV1Api(admin_api)
    node = f"cache-{uuid.uuid4().hex[:6]}"
    create_fake_node(core, node)
    ns = kube_namespace
    gpu = core.create_namespaced_pod(ns, bound(pod(ns, "wants-gpu", {"nvidia.com/gpu": "1"}, None), node))
    blind = NodePodCache(unreachable_core(), node, retry_seconds=0.1).start()
    seeing = NodePodCache(core, node).start()
    try:
        wait_for(lambda: seeing.get(ns, "wants-gpu", gpu.metadata.uid) is not None, "the cache")
        assert not blind.synced.is_set() and len(blind) == 0

        async def run() -> None:
            for cache in (blind, seeing):
                with pytest.raises(Rejected):
                    await ApiPodLookup(core, cache=cache)(ns, "wants-gpu", gpu.metadata.uid)
            # The seen pod asked for under another UID or name: not the cache's to answer.
            assert seeing.get(ns, "wants-gpu", "another-uid") is None
            assert seeing.get(ns, "another-name", gpu.metadata.uid) is None
            assert seeing.get("another-ns", "wants-gpu", gpu.metadata.uid) is None
            assert await ApiPodLookup(core, cache=seeing)(ns, "wants-gpu", "another-uid") is None

        asyncio.run(run())
    finally:
        blind.stop()
        seeing.stop()


def test_the_pod_cache_follows_across_watches_the_server_ends(
    admin_api: k8s.ApiClient, kube_namespace: str
) -> None:
    core = k8s.CoreV1Api(admin_api)
    node = f"cache-{uuid.uuid4().hex[:6]}"
    create_fake_node(core, node)
    cache = NodePodCache(core, node)
    cache.WATCH_SECONDS = 1  # the server ends every watch after a second
    cache.start()
    try:
        assert cache.synced.wait(30)
        uids = []
        for index in range(3):
            time.sleep(1.2)  # at least one watch ended since the last pod
            made = core.create_namespaced_pod(
                kube_namespace, bound(pod(kube_namespace, f"p{index}", None, None), node)
            )
            uids.append(made.metadata.uid)
            wait_for(lambda uid=made.metadata.uid: uid in cache._pods, f"pod p{index}")
        assert sorted(cache._pods) == sorted(uids)
    finally:
        cache.stop()
