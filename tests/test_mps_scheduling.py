"""The scheduler's rule for enforced shares: a pod that asks for enforcement gets a GPU whose node
enforces shares (the advertised ``sharing: mps``), under every policy; other pods go anywhere."""

from __future__ import annotations

import datetime as dt
import json
import random

import kubernetes.client as k8s
import pytest

from devices.model import Device, DeviceKind, NodeInventory, Sharing, with_sharing
from kubegpu.allocation import Allocation as Signed
from kubegpu.allocation import ContainerAllocation, KeyRing, sign
from kubegpu.allocation import Share as SignedShare
from scheduler.core import (
    Allocation,
    ClusterState,
    GpuGrant,
    GpuState,
    NodeState,
    Placement,
    PodRequest,
    Unschedulable,
    make_policy,
    policy_names,
    run_filters,
    schedule_one,
)
from scheduler.core.filters import failed_nodes
from scheduler.live.config import SchedulerConfig
from scheduler.live.podspec import SHARE_ENFORCED_ANNOTATION, PodSpecError, pod_request
from scheduler.live.scheduler import Scheduler
from scheduler.live.translate import node_facts, node_state
from tests.fixtures.keys import SIGNING


def node(name: str, enforced: list[bool], memory: int = 81920) -> NodeState:
    gpus = [GpuState(i, f"{name}-g{i}", "H100", memory, share_enforced=e) for i, e in enumerate(enforced)]
    return NodeState(name, 64_000, 512_000, gpus)


def share(name: str = "s", milli: int = 250, enforced: bool = True) -> PodRequest:
    return PodRequest(name, cpu_milli=100, gpu_count=1, gpu_milli=milli, enforced_share=enforced)


def test_enforced_share_only_on_enforcing_nodes() -> None:
    cluster = ClusterState([node("advisory", [False, False]), node("mps", [True, True])])
    idx, _ = run_filters(share(), cluster)
    assert [cluster.nodes[i].name for i in idx] == ["mps"]
    idx, _ = run_filters(share(enforced=False), cluster)
    assert sorted(cluster.nodes[i].name for i in idx) == ["advisory", "mps"]
    assert failed_nodes(share(), cluster) == {"advisory": "no GPU that enforces shares (MPS)"}


def test_unschedulable_message_names_enforcement() -> None:
    cluster = ClusterState([node("a1", [False]), node("a2", [False]), node("full", [True])])
    cluster.assume(Allocation("full", "hog", gpus=(GpuGrant(0, "full-g0", 900, 1000),), gpu_tag="share-gpu"))
    result = schedule_one(share(milli=500), cluster, make_policy("binpack"), random.Random(0))
    assert isinstance(result, Unschedulable)
    assert result.message() == (
        "0/3 nodes are available: 2 no GPU that enforces shares (MPS), "
        "1 no GPU that enforces shares (MPS) with 500 milli free."
    )


@pytest.mark.parametrize("memory", [81920, 0])
@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_puts_an_enforced_share_on_an_enforcing_gpu(policy: str, memory: int) -> None:
    # GPU 0 does not enforce and comes first (and, with known memory, is the better fit: fuller).
    mixed = node("mixed", [False, True, False], memory=memory)
    cluster = ClusterState([mixed])
    if memory:
        half = GpuGrant(0, "mixed-g0", 500, memory // 2)
        cluster.assume(Allocation("mixed", "other", gpus=(half,), gpu_tag="share-gpu"))
    chosen = make_policy(policy)
    chosen.bind(cluster, [share(), share(enforced=False)], random.Random(1))
    result = schedule_one(share(), cluster, chosen, random.Random(1))
    assert isinstance(result, Placement)
    assert [g.id for g in result.allocation.gpus] == ["mixed-g1"]


def test_state_reads_the_advertised_sharing_attribute() -> None:
    gpus = tuple(Device(f"GPU-{i}", DeviceKind.GPU, i, "H100", memory_mib=81920) for i in range(2))
    published = with_sharing(NodeInventory(gpus), lambda d: Sharing.MPS if d.index else Sharing.ADVISORY)
    api_node = {
        "metadata": {
            "name": "n",
            "annotations": {"kubegpu.io/inventory": json.dumps({"version": 1, **published.public()})},
        },
        "status": {"allocatable": {"cpu": "8", "memory": "64Gi"}},
    }
    state = node_state(node_facts(api_node))
    assert [g.share_enforced for g in state.gpus] == [False, True]
    # An inventory published before this attribute existed: shares are not enforced there.
    plain = NodeState.from_inventory("old", 8000, 8000, NodeInventory(gpus))
    assert [g.share_enforced for g in plain.gpus] == [False, False]


def pod(annotations: dict[str, str], gpus: int = 0) -> dict[str, object]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": "u", "annotations": annotations},
        "spec": {"containers": [{"name": "app", "resources": {"limits": limits}}]},
    }


def test_podspec_reads_the_enforcement_annotation() -> None:
    asked = pod({"kubegpu.io/gpu-milli": "250", SHARE_ENFORCED_ANNOTATION: "true"})
    assert pod_request(asked).enforced_share
    declined = pod({"kubegpu.io/gpu-milli": "250", SHARE_ENFORCED_ANNOTATION: "False"})
    assert pod_request(declined).enforced_share is False
    assert pod_request(pod({"kubegpu.io/gpu-milli": "250"})).enforced_share is False
    assert share().shape() != share(enforced=False).shape()


@pytest.mark.parametrize(
    ("annotations", "gpus", "message"),
    [
        ({"kubegpu.io/gpu-milli": "250", SHARE_ENFORCED_ANNOTATION: "yes"}, 0, "is not true or false"),
        ({SHARE_ENFORCED_ANNOTATION: "true"}, 2, "needs a GPU share"),
        ({SHARE_ENFORCED_ANNOTATION: "true"}, 0, "needs a GPU share"),
    ],
)
def test_podspec_refuses_a_meaningless_enforcement_request(
    annotations: dict[str, str], gpus: int, message: str
) -> None:
    with pytest.raises(PodSpecError, match=message):
        pod_request(pod(annotations, gpus))


def test_core_refuses_enforcement_of_whole_gpus() -> None:
    with pytest.raises(ValueError, match="only a share of one GPU"):
        PodRequest("w", gpu_count=2, enforced_share=True)


@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.parametrize("memory", [0, 81920])
@pytest.mark.parametrize("policy", ["fgd", "fgd-align", "gpupacking"])
def test_packing_policies_score_an_enforced_share_on_the_gpus_it_can_take(
    policy: str, memory: int, warm: bool
) -> None:
    """Each node has one GPU half used and one free; only one of them enforces shares. Scored on the
    GPUs it can take, the share fills the half-used enforcing GPU (n1) instead of breaking the free
    one (n0), whatever the seed, and whether or not a share of the same size that does not ask for
    enforcement was scored first (the scores are memoised per request shape)."""
    layout = {"n0": [False, True], "n1": [True, False]}
    workload = [share("a", 250), share("b", 500, enforced=False), PodRequest("w", cpu_milli=100, gpu_count=1)]
    chosen = set()
    for seed in range(6):
        cluster = ClusterState([node(name, enforced, memory=memory) for name, enforced in layout.items()])
        for name, enforced in layout.items():
            half = enforced.index(name == "n1")  # n0: its advisory GPU, n1: its enforcing GPU
            grant = GpuGrant(half, f"{name}-g{half}", 500, memory // 2)
            cluster.assume(Allocation(name, f"{name}-half", gpus=(grant,), gpu_tag="share-gpu"))
        scheduler = make_policy(policy)
        scheduler.bind(cluster, workload, random.Random(seed))
        if warm:
            plain = share("p", 100, enforced=False)
            scheduler.score(plain, cluster, cluster.all_indices)
            for i in range(len(cluster)):
                scheduler.share_gpu(plain, cluster, i)
        result = schedule_one(share("s", 100), cluster, scheduler, random.Random(seed))
        assert isinstance(result, Placement)
        chosen.add(result.allocation.gpus[0].id)
    assert chosen == {"n1-g0"}


def test_the_live_cache_follows_a_gpu_flipping_between_mps_and_advisory_while_a_share_runs() -> None:
    """The advertiser flips GPU 0 to advisory (its daemon failed) while a bound share runs there:
    the cache rebuilds, keeps the running share booked, and places enforced shares only on GPU 1;
    flipped back, GPU 0 takes enforced shares again, in the room the running share leaves."""
    key = SIGNING["k1"]
    gpus = tuple(Device(f"GPU-{i}", DeviceKind.GPU, i, "H100", memory_mib=81920) for i in range(2))

    def api_node(gpu0: Sharing) -> dict[str, object]:
        published = with_sharing(NodeInventory(gpus), lambda d: gpu0 if d.index == 0 else Sharing.MPS)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "metadata": {
                "name": "n",
                "annotations": {
                    "kubegpu.io/inventory": json.dumps({"version": 1, **published.public()}),
                    "kubegpu.io/heartbeat": now,
                },
            },
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "2"}},
        }

    running = Signed(
        "n", "u-running", {"app": ContainerAllocation(("GPU-0",), {"GPU-0": SignedShare(600, 8192)})}
    )
    bound = {
        "metadata": {
            "namespace": "ns",
            "name": "running",
            "uid": "u-running",
            "annotations": {"kubegpu.io/allocation": sign(running, "k1", key)},
        },
        "spec": {"nodeName": "n", "containers": [{"name": "app"}]},
        "status": {"phase": "Running"},
    }
    scheduler = Scheduler(SchedulerConfig(), k8s.ApiClient(), KeyRing(None, SIGNING), seed=0)
    try:
        scheduler.replace_nodes([api_node(Sharing.MPS)])
        scheduler.replace_pods([bound])
        scheduler._view()

        def place(milli: int) -> str | None:
            assert scheduler.cluster is not None
            result = schedule_one(share("new", milli), scheduler.cluster, scheduler.policy, random.Random(0))
            return result.allocation.gpus[0].id if isinstance(result, Placement) else None

        assert scheduler.cluster is not None and scheduler.cluster.node("n").gpus[0].free_milli == 400
        scheduler.apply_node("MODIFIED", api_node(Sharing.ADVISORY))
        assert scheduler.cache.dirty
        scheduler._view()
        gpu0 = scheduler.cluster.node("n").gpus[0]
        assert (gpu0.share_enforced, gpu0.free_milli) == (False, 400)  # the running share stays booked
        assert place(300) == "GPU-1"
        scheduler.apply_node("MODIFIED", api_node(Sharing.MPS))
        scheduler._view()
        scheduler.cluster.assume(
            Allocation("n", "u-gpu1", gpus=(GpuGrant(1, "GPU-1", 1000, 81920),), gpu_tag="1-gpu")
        )
        assert place(300) == "GPU-0"
        assert place(500) is None  # GPU 0 has 400 left beside the running share
    finally:
        scheduler.stop()
