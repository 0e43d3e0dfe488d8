"""The scheduler's rule for enforced shares: a pod that asks for enforcement gets a GPU whose node
enforces shares (the advertised ``sharing: mps``), under every policy; other pods go anywhere."""

from __future__ import annotations

import json
import random

import pytest

from devices.model import Device, DeviceKind, NodeInventory, Sharing, with_sharing
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
from scheduler.live.podspec import SHARE_ENFORCED_ANNOTATION, PodSpecError, pod_request
from scheduler.live.translate import node_facts, node_state


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
