"""RDMA VFs in the scheduling core: the bandwidth notation, a node's PFs and VFs from its inventory,
the filter and its reasons, the choice beside the pod's GPUs, and the books (a VF held once, a PF's
reservations within its line rate), including a randomized run of assume/forget."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from devices.model import Device, DeviceKind, NodeInventory
from scheduler.core import (
    AllocationConflict,
    ClusterState,
    NodeState,
    PodRequest,
    make_policy,
    run_filters,
    schedule_one,
)
from scheduler.core.rdma import (
    NO_BANDWIDTH,
    NO_FREE_VFS,
    RdmaRequest,
    VfGrant,
    choose_vfs,
    format_mbps,
    nic_state,
    parse_bandwidth,
)
from scheduler.core.scoring import Policy
from scheduler.core.state import Allocation, GpuGrant
from tests.support.rdmainv import Pf, gpu_id, rdma_inventory

# --- the bandwidth notation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100Gbps", (100_000, 0)),
        ("25Gbps-50Gbps", (25_000, 50_000)),
        (" 25 Gbps - 50 Gbps ", (25_000, 50_000)),
        ("2.5Gbps", (2_500, 0)),
        ("12.125Gbps", (12_125, 0)),
        ("500Mbps", (500, 0)),
        ("500Mbps-1Gbps", (500, 1_000)),
        ("0Gbps", (0, 0)),
        ("0Gbps-10Gbps", (0, 10_000)),
        ("007Gbps", (7_000, 0)),
        ("10000Gbps", (10_000_000, 0)),
        ("25Gbps-25Gbps", (25_000, 25_000)),
    ],
)
def test_bandwidth_notation(text: str, expected: tuple[int, int]) -> None:
    assert parse_bandwidth(text) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("25G", "not a bandwidth"),
        ("25gbps", "not a bandwidth"),
        ("25GB/s", "not a bandwidth"),
        ("25", "not a bandwidth"),
        ("-25Gbps", "not a bandwidth"),
        ("+25Gbps", "not a bandwidth"),
        ("٢٥Gbps", "not a bandwidth"),
        ("2_5Gbps", "not a bandwidth"),
        ("1e2Gbps", "not a bandwidth"),
        ("1.2345Gbps", "not a bandwidth"),
        ("25Gbps-", "not a bandwidth"),
        ("25Gbps-50", "not a bandwidth"),
        ("", "not a bandwidth"),
        (None, "not a bandwidth"),
        (25, "not a bandwidth"),
        ("1.5Mbps", "whole numbers"),
        ("50Gbps-25Gbps", "at least the minimum"),
        ("1Gbps-0Gbps", "at least the minimum"),
        ("10001Gbps", "above 10000 Gbps"),
        ("99999999999999999999Gbps", "above 10000 Gbps"),
        ("1Gbps-99999999999Gbps", "above 10000 Gbps"),
    ],
)
def test_bandwidth_notation_refuses(text: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_bandwidth(text)


def test_format_mbps_reads_back() -> None:
    for mbps in (0, 300, 999, 1000, 2500, 12125, 100_000):
        low, _ = parse_bandwidth(format_mbps(mbps))
        assert low == mbps
    assert format_mbps(100_000) == "100Gbps"
    assert format_mbps(300) == "300Mbps"


def test_request_rules() -> None:
    assert not RdmaRequest()
    assert RdmaRequest(2, 1000)
    with pytest.raises(ValueError, match="outside 0..32"):
        RdmaRequest(33)
    with pytest.raises(ValueError, match="minimum 2000 above its maximum 1000"):
        RdmaRequest(1, 2000, 1000)
    with pytest.raises(ValueError, match="bandwidth outside"):
        RdmaRequest(1, -1)
    a = PodRequest("a", cpu_milli=1, rdma=RdmaRequest(1, 1000))
    b = PodRequest("b", cpu_milli=1, rdma=RdmaRequest(1, 2000))
    assert a.shape() != b.shape()  # memoised scores must tell them apart
    assert a.shape() == replace(a, name="c", uid="c").shape()


# --- a node's PFs and VFs ---------------------------------------------------------------------


def test_nic_state_from_inventory() -> None:
    inv = rdma_inventory(
        "n",
        [0, 0, 1, 1],
        [Pf("mlx5_0", 200, 0, (0, 1), vfs=2), Pf("mlx5_1", 100, 1, (2,), vfs=3), Pf("mlx5_2", 100, 1, vfs=0)],
    )
    nics = nic_state(inv)
    assert sorted(nics.pfs) == ["mlx5_0", "mlx5_1"]  # a PF without VFs offers no interface
    pf = nics.pfs["mlx5_0"]
    assert (pf.rate_mbps, pf.numa, pf.vfs) == (200_000, 0, ("mlx5_0-vf0", "mlx5_0-vf1"))
    assert pf.gpus == {gpu_id("n", 0), gpu_id("n", 1)}
    assert nics.pf_of["mlx5_1-vf2"] == "mlx5_1"
    assert nics.free_vfs() == 5


def test_nic_state_skips_unhealthy_and_unrated_and_finds_parents_by_pci() -> None:
    pf = Device("mlx5_0", DeviceKind.RDMA, 0, "CX", 0, 0, "0000:17:00.0", attributes={"rateGbps": "100"})
    vf_by_pci = Device(
        "mlx5_5", DeviceKind.RDMA, 1, "CX", 0, 0, "0000:17:00.2",
        attributes={"function": "vf", "parentPf": "0000:17:00.0"},
    )  # fmt: skip
    vf_sick = Device(
        "mlx5_6",
        DeviceKind.RDMA,
        2,
        "CX",
        healthy=False,
        attributes={"function": "vf", "parentDevice": "mlx5_0"},
    )
    orphan = Device("mlx5_7", DeviceKind.RDMA, 3, "CX", attributes={"function": "vf", "parentDevice": "gone"})
    nics = nic_state(NodeInventory((pf, vf_by_pci, vf_sick, orphan)))
    assert nics.pfs["mlx5_0"].vfs == ("mlx5_5",)
    assert set(nics.pf_of) == {"mlx5_5"}
    unrated = replace(pf, attributes={"rateGbps": "nan"})
    assert not nic_state(NodeInventory((unrated, vf_by_pci)))
    sick_pf = replace(pf, healthy=False)
    assert not nic_state(NodeInventory((sick_pf, vf_by_pci)))


# --- choosing VFs -----------------------------------------------------------------------------


def dgx_like(name: str = "n", vfs: int = 4, rate: float = 200) -> NodeInventory:
    """8 GPUs on two NUMA nodes; one PF per pair of GPUs, on their PCIe switch."""
    return rdma_inventory(
        name,
        [0, 0, 0, 0, 1, 1, 1, 1],
        [Pf(f"mlx5_{k}", rate, 0 if k < 2 else 1, (2 * k, 2 * k + 1), vfs) for k in range(4)],
    )


def test_vfs_beside_the_gpus_on_their_switch_first() -> None:
    nics = nic_state(dgx_like())
    got = choose_vfs(RdmaRequest(1, 50_000), nics, [gpu_id("n", 5)], {1})
    assert got == (VfGrant("mlx5_2-vf0", "mlx5_2", 50_000, 0),)


def test_vfs_on_the_gpus_numa_node_when_their_switch_has_none_left() -> None:
    nics = nic_state(dgx_like())
    nics.apply([VfGrant("mlx5_2-vf0", "mlx5_2", 200_000)], 1)  # the switch's PF is fully reserved
    got = choose_vfs(RdmaRequest(1, 50_000), nics, [gpu_id("n", 5)], {1})
    assert got is not None and got[0].pf == "mlx5_3"  # same NUMA node, not mlx5_0/1
    nics.apply([VfGrant("mlx5_3-vf0", "mlx5_3", 200_000)], 1)
    got = choose_vfs(RdmaRequest(1, 50_000), nics, [gpu_id("n", 5)], {1})
    assert got is not None and got[0].pf in ("mlx5_0", "mlx5_1")  # only then across the sockets


def test_interfaces_stay_on_one_pf_when_it_has_the_bandwidth() -> None:
    nics = nic_state(dgx_like())
    got = choose_vfs(RdmaRequest(2, 100_000), nics, [gpu_id("n", 0)], {0})
    assert got is not None and {g.pf for g in got} == {"mlx5_0"} and len({g.id for g in got}) == 2


def test_interfaces_spread_over_pfs_when_one_pf_lacks_bandwidth() -> None:
    nics = nic_state(dgx_like())
    got = choose_vfs(RdmaRequest(2, 150_000), nics, [gpu_id("n", 0), gpu_id("n", 2)], {0})
    assert got is not None and sorted(g.pf for g in got) == ["mlx5_0", "mlx5_1"]  # both beside the GPUs


def test_interfaces_spread_over_pfs_when_one_pf_lacks_vfs() -> None:
    nics = nic_state(dgx_like(vfs=2))
    got = choose_vfs(RdmaRequest(3, 0), nics, [gpu_id("n", 0)], {0})
    assert got is not None
    assert [g.pf for g in got] == ["mlx5_0", "mlx5_0", "mlx5_1"]  # its switch's PF, then its NUMA node's


def test_best_fit_keeps_the_roomier_pf_for_bigger_pods() -> None:
    nics = nic_state(dgx_like())
    nics.apply([VfGrant("mlx5_1-vf0", "mlx5_1", 150_000)], 1)  # mlx5_1 has 50 Gbps left
    got = choose_vfs(RdmaRequest(1, 40_000), nics)  # no GPUs: every PF is as near
    assert got is not None and got[0].pf == "mlx5_1"


def test_no_choice_when_the_node_cannot_give_it() -> None:
    nics = nic_state(dgx_like(vfs=1))
    assert choose_vfs(RdmaRequest(5), nics) is None
    assert choose_vfs(RdmaRequest(2, 150_000), nic_state(dgx_like(rate=200, vfs=4))) is not None
    assert (
        choose_vfs(RdmaRequest(3, 150_000), nic_state(rdma_inventory("n", [0], [Pf("p", 200, 0, vfs=8)])))
        is None
    )
    assert nic_state(dgx_like(vfs=1)).shortage(RdmaRequest(5)) == NO_FREE_VFS
    assert nic_state(dgx_like()).shortage(RdmaRequest(5, 150_000)) == NO_BANDWIDTH
    assert nic_state(dgx_like()).shortage(RdmaRequest(4, 150_000)) == ""


# --- the cluster: filter, books, schedule_one -------------------------------------------------


def state(name: str, inventory: NodeInventory, cpu: int = 64_000) -> NodeState:
    return NodeState.from_inventory(name, cpu, 512_000, inventory)


def test_filter_counts_reasons_like_kube_scheduler() -> None:
    one_pf = rdma_inventory("a", [0, 0], [Pf("mlx5_0", 100, 0, (0,), vfs=4)])  # bandwidth short
    few_vfs = rdma_inventory("b", [0, 0], [Pf("mlx5_0", 400, 0, (0,), vfs=1)])  # VFs short
    no_nics = rdma_inventory("c", [0, 0], [])
    cluster = ClusterState([state("a", one_pf), state("b", few_vfs), state("c", no_nics), state("d", one_pf)])
    pod = PodRequest("p", gpu_count=1, rdma=RdmaRequest(2, 100_000))
    idx, why = run_filters(pod, cluster)
    assert not len(idx)
    assert dict(why) == {NO_BANDWIDTH: 2, NO_FREE_VFS: 2}
    result = schedule_one(pod, cluster, make_policy("bestfit"), random.Random(0))
    assert result.message() == (  # type: ignore[union-attr]
        "0/4 nodes are available: 2 node(s) had insufficient RDMA bandwidth, "
        "2 node(s) had too few free RDMA virtual functions."
    )
    assert why == run_filters(replace(pod, rdma=RdmaRequest(2, 100_000, 200_000)), cluster)[1]
    idx, _ = run_filters(replace(pod, rdma=RdmaRequest(1, 100_000)), cluster)
    assert sorted(cluster.nodes[i].name for i in idx.tolist()) == ["a", "b", "d"]


def test_pod_lands_where_vfs_beside_its_gpus_have_the_bandwidth() -> None:
    far = rdma_inventory("far", [0, 0, 1, 1], [Pf("mlx5_0", 400, 1, (2, 3), vfs=4)])  # NICs beside GPUs 2, 3
    near = dgx_like("near")
    cluster = ClusterState([state("far", far), state("near", near)])
    cluster.assume(Allocation("far", "x", gpus=(), rdma=()))  # something booked; irrelevant to RDMA
    pod = PodRequest("p", gpu_count=2, rdma=RdmaRequest(2, 100_000))
    placed = schedule_one(pod, cluster, make_policy("bestfit"), random.Random(1))
    alloc = placed.allocation  # type: ignore[union-attr]
    gpus = {g.id for g in alloc.gpus}
    pfs = cluster.node(alloc.node).nics.pfs
    for vf in alloc.rdma:
        assert pfs[vf.pf].gpus & gpus, f"{vf} is not beside {gpus} on {alloc.node}"
    assert len({vf.id for vf in alloc.rdma}) == 2 and all(vf.min_mbps == 100_000 for vf in alloc.rdma)


def test_books_hold_vfs_and_bandwidth() -> None:
    cluster = ClusterState([state("n", dgx_like(vfs=2))])
    first = Allocation("n", "a", rdma=(VfGrant("mlx5_0-vf0", "mlx5_0", 150_000),))
    cluster.assume(first)
    assert cluster.rdma_free_vfs[0] == 7
    assert cluster.nodes[0].nics.pfs["mlx5_0"].reserved_mbps == 150_000
    with pytest.raises(AllocationConflict, match="held by another pod"):
        cluster.assume(Allocation("n", "b", rdma=(VfGrant("mlx5_0-vf0", "mlx5_0", 0),)))
    with pytest.raises(AllocationConflict, match="PF mlx5_0 has 50000 Mbit/s left, not 60000"):
        cluster.assume(Allocation("n", "b", rdma=(VfGrant("mlx5_0-vf1", "mlx5_0", 60_000),)))
    with pytest.raises(AllocationConflict, match="granted twice"):
        cluster.assume(Allocation("n", "b", rdma=(VfGrant("mlx5_1-vf1", "mlx5_1"),) * 2))
    with pytest.raises(AllocationConflict, match="no usable RDMA VF mlx5_9-vf0"):
        cluster.assume(Allocation("n", "b", rdma=(VfGrant("mlx5_9-vf0", "mlx5_9"),)))
    assert cluster.rdma_free_vfs[0] == 7  # refused decisions book nothing
    # a bound pod is a fact: booked whatever is left, with the problems named
    problems = cluster.book(Allocation("n", "c", rdma=(VfGrant("mlx5_0-vf0", "mlx5_0", 100_000),)))
    assert problems == ["RDMA VF mlx5_0-vf0 is booked beyond its capacity"]
    cluster.forget("c")
    cluster.forget("a")
    assert cluster.rdma_free_vfs[0] == 8
    assert cluster.nodes[0].nics.pfs["mlx5_0"].reserved_mbps == 0
    assert not cluster.nodes[0].nics.pfs["mlx5_0"].held


def test_allocation_dict_round_trip_carries_vfs() -> None:
    alloc = Allocation("n", "u", rdma=(VfGrant("v0", "p", 25_000, 50_000), VfGrant("v1", "p", 25_000)))
    doc = alloc.to_dict()
    assert doc["rdma"] == [
        {"id": "v0", "pf": "p", "minMbps": 25_000, "maxMbps": 50_000},
        {"id": "v1", "pf": "p", "minMbps": 25_000},
    ]
    assert Allocation.from_dict(doc) == alloc
    assert "rdma" not in Allocation("n", "u").to_dict()


def test_randomized_no_pf_over_reserved_and_no_vf_twice() -> None:
    rng = random.Random(25)
    policy = make_policy("bestfit")
    for trial in range(12):
        nodes = []
        for k in range(rng.randint(1, 4)):
            gpus = [rng.choice([0, 1]) for _ in range(rng.choice([0, 2, 4, 8]))]
            pfs = [
                Pf(
                    f"mlx5_{j}",
                    rng.choice([25, 100, 200, 400]),
                    rng.choice([-1, 0, 1]),
                    tuple(g for g in range(len(gpus)) if rng.random() < 0.3),
                    rng.randint(0, 6),
                )
                for j in range(rng.randint(0, 4))
            ]
            nodes.append(state(f"n{k}", rdma_inventory(f"n{k}", gpus, pfs)))
        cluster = ClusterState(nodes)
        live: list[str] = []
        for step in range(80):
            if live and rng.random() < 0.35:
                cluster.forget(live.pop(rng.randrange(len(live))))
            else:
                low = rng.choice([0, 0, 10_000, 25_000, 50_000, 100_000, 200_000])
                pod = PodRequest(
                    f"p{trial}-{step}",
                    gpu_count=rng.choice([0, 0, 1, 2]),
                    rdma=RdmaRequest(rng.randint(0, 4), low, rng.choice([0, low * 2])),
                )
                placed = schedule_one(pod, cluster, policy, rng)
                if hasattr(placed, "allocation"):
                    alloc = placed.allocation
                    assert len(alloc.rdma) == pod.rdma.count
                    cluster.assume(alloc)  # raises if it does not fit the books
                    live.append(pod.uid)
            for node in cluster.nodes:
                held: dict[str, str] = {}
                reserved: dict[str, int] = {}
                for uid, alloc in node.allocations.items():
                    for vf in alloc.rdma:
                        assert vf.id not in held, f"VF {vf.id} given to {held.get(vf.id)} and {uid}"
                        held[vf.id] = uid
                        assert node.nics.pf_of[vf.id] == vf.pf
                        reserved[vf.pf] = reserved.get(vf.pf, 0) + vf.min_mbps
                for pf in node.nics.pfs.values():
                    assert reserved.get(pf.id, 0) == pf.reserved_mbps <= pf.rate_mbps
                assert cluster.rdma_free_vfs[cluster.index[node.name]] == node.nics.free_vfs()


def test_gpus_follow_the_nics_when_the_topology_choice_leaves_them_far() -> None:
    from scheduler.core import allocate

    inv = rdma_inventory("n", [0, 0, 1, 1], [Pf("mlx5_0", 400, 1, (2, 3), vfs=4)])
    node = state("n", inv)
    plain = allocate(PodRequest("p", gpu_count=2), node)
    assert plain is not None and [g.index for g in plain.gpus] == [0, 1]  # without RDMA: lowest first
    alloc = allocate(PodRequest("q", gpu_count=2, rdma=RdmaRequest(2, 100_000)), node)
    assert alloc is not None and sorted(g.index for g in alloc.gpus) == [2, 3]
    assert [v.pf for v in alloc.rdma] == ["mlx5_0", "mlx5_0"]
    node.gpus[3].free_milli = 0  # GPU 3 taken: one GPU beside the NIC is still nearer than none
    alloc = allocate(PodRequest("r", gpu_count=2, rdma=RdmaRequest(1)), node)
    assert alloc is not None and 2 in {g.index for g in alloc.gpus}


# --- node choice: NIC nearness ----------------------------------------------------------------


def bound(name: str, cluster: ClusterState, *pods: PodRequest) -> Policy:
    """Policy ``name`` prepared for ``cluster`` and a workload of ``pods`` (as the fronts do)."""
    policy = make_policy(name)
    policy.bind(cluster, list(pods), random.Random(0))
    return policy


def twins(far_pf: Pf) -> ClusterState:
    """Two nodes alike but for where their PF sits: on ``near`` beside both GPUs (NUMA 0), on ``far``
    as ``far_pf`` says."""
    near = rdma_inventory("near", [0, 0], [Pf("mlx5_0", 200, 0, (0, 1), vfs=4)])
    far = rdma_inventory("far", [0, 0], [far_pf])
    return ClusterState([state("far", far), state("near", near)])


@pytest.mark.parametrize(
    "far_pf",
    [Pf("mlx5_0", 200, 1, (), vfs=4), Pf("mlx5_0", 200, 0, (), vfs=4)],
    ids=["other-numa", "same-numa-other-switch"],
)
@pytest.mark.parametrize("policy", ["topology", "bestfit", "fgd"])
def test_the_node_whose_vfs_sit_beside_the_gpus_it_would_give_wins(far_pf: Pf, policy: str) -> None:
    """Every other score ties: the ``topology`` policy (the live scheduler's and the extender's)
    prefers the node whose VFs are on the pod's GPUs' PCIe switch (then NUMA node); the simulator's
    baselines do not weigh it and leave it to the tie order."""
    cluster = twins(far_pf)
    pod = PodRequest("p", cpu_milli=1000, gpu_count=1, rdma=RdmaRequest(1, 25_000))
    two = replace(pod, gpu_count=2)
    scoring = bound(policy, cluster, pod, two)
    chosen = {schedule_one(pod, cluster, scoring, random.Random(seed)).node for seed in range(16)}  # type: ignore[union-attr]
    assert chosen == ({"near"} if policy == "topology" else {"near", "far"})
    if policy == "topology":
        assert {schedule_one(two, cluster, scoring, random.Random(s)).node for s in range(8)} == {"near"}  # type: ignore[union-attr]


def test_nearness_counts_the_gpus_the_node_would_give_not_its_nics_alone() -> None:
    """Both nodes have a PF beside GPUs 0 and 1; on ``busy`` those GPUs are taken, so its VFs would
    sit far from the GPUs (2, 3) the pod gets there: ``idle`` wins though ``busy`` packs better."""

    def four(name: str) -> NodeState:
        inv = rdma_inventory(name, [0, 0, 1, 1], [Pf("mlx5_0", 200, 0, (0, 1), vfs=4)])
        return state(name, inv)

    cluster = ClusterState([four("busy"), four("idle")])
    cluster.assume(Allocation("busy", "x", gpus=tuple(
        GpuGrant(i, gpu_id("busy", i), 1000, 81920) for i in (0, 1)
    )))  # fmt: skip
    pod = PodRequest("p", gpu_count=2, rdma=RdmaRequest(1))
    assert schedule_one(pod, cluster, bound("bestfit", cluster, pod), random.Random(0)).node == "busy"  # type: ignore[union-attr]
    topology = bound("topology", cluster, pod)
    assert {schedule_one(pod, cluster, topology, random.Random(s)).node for s in range(8)} == {"idle"}  # type: ignore[union-attr]
    # a pod asking no GPU: its VFs sit equally far everywhere, nearness does not count
    no_gpu = PodRequest("q", rdma=RdmaRequest(1))
    for plugin, _ in topology.plugins:
        if plugin.name == "nic-nearness":
            assert plugin.score(no_gpu, cluster, np.arange(2)).tolist() == [0, 0]
            assert plugin.score(pod, cluster, np.arange(2)).tolist() == [0, 100]
            break
    else:
        raise AssertionError("the topology policy has no nic-nearness score")
