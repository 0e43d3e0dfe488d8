"""What the mutation run of ``scheduler/core/rdma.py`` showed untested (docs/testing.md, "RDMA"): the
bounds of a request and of the bandwidth notation, its messages, ``format_mbps`` at 1 Gbps, a grant
read without its bandwidth, the books' checks past an unknown VF, a node's line rate at its bounds,
a VF that names a VF as its parent, GPUs listed beside a VF, and the choice of PFs by tier and size."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from devices.model import Device, DeviceKind, NodeInventory, PCIeRelation, Topology, pair
from scheduler.core import (
    AllocationConflict,
    ClusterState,
    NodeState,
    PodRequest,
    allocate,
    failed_nodes,
    run_filters,
)
from scheduler.core.filters import filter_nodes
from scheduler.core.rdma import (
    MAX_MBPS,
    NO_BANDWIDTH,
    NO_FREE_VFS,
    NO_RDMA,
    NicState,
    PfState,
    RdmaRequest,
    VfGrant,
    choose_vfs,
    format_mbps,
    nic_state,
    parse_bandwidth,
    rate_mbps,
    vf_distance,
)
from scheduler.core.request import HostPort, TopologyWish, Wish, resource_tuple
from scheduler.core.state import Allocation, LiveGpu
from tests.support.rdmainv import Pf, gpu_id, rdma_inventory

# --- a request and the bandwidth notation -----------------------------------------------------


def test_a_request_may_ask_for_the_largest_bandwidth_and_a_minimum_equal_to_its_maximum() -> None:
    assert RdmaRequest(1, MAX_MBPS, MAX_MBPS).max_mbps == MAX_MBPS
    assert RdmaRequest(1, 0, MAX_MBPS).max_mbps == MAX_MBPS
    assert RdmaRequest(1, 25_000, 25_000).min_mbps == 25_000
    with pytest.raises(ValueError, match="outside"):
        RdmaRequest(1, 0, MAX_MBPS + 1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("000000001Gbps", (1_000, 0)),  # leading zeros do not count as digits
        ("10000000Mbps", (MAX_MBPS, 0)),  # eight digits, the largest figure allowed
        ("25Gbps-50.5Gbps", (25_000, 50_500)),  # the maximum's decimals
        ("100Mbps-800Mbps", (100, 800)),  # the maximum's unit
        ("1Gbps-10000Gbps", (1_000, MAX_MBPS)),  # a maximum at the bound
    ],
)
def test_bandwidth_notation_at_its_edges(text: str, expected: tuple[int, int]) -> None:
    assert parse_bandwidth(text) == expected


def test_bandwidth_messages_name_the_text_and_the_notation() -> None:
    with pytest.raises(ValueError) as caught:
        parse_bandwidth("x" * 100)
    assert str(caught.value) == repr("x" * 64) + (
        " is not a bandwidth such as 25Gbps, 500Mbps or 25Gbps-50Gbps"
        " (units Gbps or Mbps, decimal digits 0-9)"
    )
    with pytest.raises(ValueError, match=r"'1\.5Mbps': Mbit/s are whole numbers"):
        parse_bandwidth("1.5Mbps")
    with pytest.raises(ValueError, match=r"'1Gbps-1\.5Mbps': Mbit/s are whole numbers"):
        parse_bandwidth("1Gbps-1.5Mbps")
    with pytest.raises(ValueError, match="maximum must be above 0"):
        parse_bandwidth("0Gbps-0Gbps")
    with pytest.raises(ValueError, match="above 10000 Gbps"):
        parse_bandwidth("1Gbps-10000.001Gbps")


def test_format_mbps_writes_whole_gigabits_as_gbps() -> None:
    assert format_mbps(1000) == "1Gbps"
    assert format_mbps(1001) == "1.001Gbps"
    assert format_mbps(999) == "999Mbps"
    assert format_mbps(0) == "0Gbps"


def test_a_grant_read_without_its_bandwidth_reserves_none() -> None:
    assert VfGrant.from_dict({"id": "v", "pf": "p"}) == VfGrant("v", "p", 0, 0)


# --- a node's books ---------------------------------------------------------------------------


def two_pfs() -> NicState:
    return NicState(
        [
            PfState("p0", 100_000, 0, vfs=("p0-v0", "p0-v1", "p0-v2")),
            PfState("p1", 100_000, 1, vfs=("p1-v0",)),
        ]
    )


def test_an_empty_request_has_no_shortage() -> None:
    assert NicState().shortage(NO_RDMA) == ""
    assert two_pfs().shortage(NO_RDMA) == ""


def test_problems_are_all_found_past_an_unknown_vf_and_sum_per_pf() -> None:
    nics = two_pfs()
    nics.apply([VfGrant("p0-v0", "p0", 0)], 1)
    found = nics.problems([VfGrant("gone", "p0"), VfGrant("p0-v0", "p0")])
    assert found == ["no usable RDMA VF gone", "RDMA VF p0-v0 is held by another pod"]
    # each fits alone, the two together are past the line rate
    found = nics.problems([VfGrant("p0-v1", "p0", 60_000), VfGrant("p0-v2", "p0", 60_000)])
    assert found == ["PF p0 has 100000 Mbit/s left, not 120000"]
    nics.apply([VfGrant("p0-v1", "p0", 100_000)], 1)
    assert nics.problems([VfGrant("p0-v2", "p0", 1)]) == ["PF p0 has 0 Mbit/s left, not 1"]


def test_books_go_on_past_an_unknown_vf_and_count_a_vf_held_twice() -> None:
    nics = two_pfs()
    nics.apply([VfGrant("gone", "p0"), VfGrant("p1-v0", "p1", 10_000)], 1)
    assert nics.pfs["p1"].held == {"p1-v0": 1} and nics.pfs["p1"].reserved_mbps == 10_000
    nics.apply([VfGrant("p1-v0", "p1", 10_000)], 1)
    assert nics.pfs["p1"].held == {"p1-v0": 2}
    assert nics.overbooked([VfGrant("gone", "p0"), VfGrant("p1-v0", "p1")]) == ["p1-v0"]
    nics.apply([VfGrant("p1-v0", "p1", 10_000)], -1)
    assert nics.pfs["p1"].held == {"p1-v0": 1}
    nics.apply([VfGrant("p0-v2", "p0")], -1)  # releasing what no pod holds changes nothing
    assert nics.pfs["p0"].held == {}


# --- a node's PFs from its inventory ----------------------------------------------------------


def rdma(name: str, index: int, **attributes: str) -> Device:
    return Device(name, DeviceKind.RDMA, index, "CX", attributes=attributes)


@pytest.mark.parametrize(
    ("rate", "mbps"),
    [("fast", 0), ("0.5", 500), ("10000", MAX_MBPS), ("10000.5", 0), ("20000", 0), ("-1", 0)],
)
def test_line_rate_bounds(rate: str, mbps: int) -> None:
    assert rate_mbps(rdma("p", 0, rateGbps=rate)) == mbps


def test_a_vf_never_parents_vfs() -> None:
    pf = rdma("p", 0, rateGbps="100")
    vf = rdma("p-v0", 1, function="vf", parentDevice="p", rateGbps="100")
    nested = rdma("p-v0-v0", 2, function="vf", parentDevice="p-v0")
    nics = nic_state(NodeInventory((pf, vf, nested)))
    assert sorted(nics.pfs) == ["p"] and set(nics.pf_of) == {"p-v0"}


def test_a_pf_that_offers_nothing_does_not_hide_the_next() -> None:
    unrated = rdma("a", 0)
    a_vf = rdma("a-v0", 1, function="vf", parentDevice="a")
    rated = rdma("b", 2, rateGbps="100")
    b_vf = rdma("b-v0", 3, function="vf", parentDevice="b")
    assert sorted(nic_state(NodeInventory((unrated, a_vf, rated, b_vf))).pfs) == ["b"]


def test_gpus_listed_beside_a_vf_are_beside_its_pf() -> None:
    devices = (
        Device("GPU-0", DeviceKind.GPU, 0, "A100", 81920, 0),
        rdma("p", 0, rateGbps="100"),
        rdma("p-v0", 1, function="vf", parentDevice="p"),
    )
    nics = nic_state(NodeInventory(devices, Topology(nic_gpus={"p-v0": ("GPU-0",)})))
    assert nics.pfs["p"].gpus == {"GPU-0"}


# --- choosing VFs -----------------------------------------------------------------------------


def test_a_pf_on_the_gpus_switch_beats_a_tighter_one_on_their_numa_node() -> None:
    nics = NicState(
        [
            PfState("near", 200_000, 0, frozenset({"GPU-0"}), ("near-v0",)),
            PfState("numa", 50_000, 0, frozenset(), ("numa-v0",)),
        ]
    )
    got = choose_vfs(RdmaRequest(1, 10_000), nics, ["GPU-0"], {0})
    assert got is not None and got[0].pf == "near"


def test_numa_node_0_is_a_numa_node() -> None:
    nics = NicState(
        [
            PfState("numa0", 200_000, 0, vfs=("a-v0",)),
            PfState("far", 50_000, 1, vfs=("b-v0",)),
        ]
    )
    got = choose_vfs(RdmaRequest(1, 10_000), nics, ["GPU-0"], {0})
    assert got is not None and got[0].pf == "numa0"


def test_the_pf_that_takes_the_most_goes_first_when_none_takes_all() -> None:
    nics = NicState(
        [
            PfState("big", 100_000, vfs=("big-v0", "big-v1", "big-v2")),
            PfState("mid", 40_000, vfs=("mid-v0", "mid-v1")),
            PfState("one", 90_000, vfs=("one-v0",)),
        ]
    )
    got = choose_vfs(RdmaRequest(4, 0, 5_000), nics)
    assert got is not None
    assert [(g.pf, g.max_mbps) for g in got] == [("big", 5_000)] * 3 + [("mid", 5_000)]


def test_vf_distance_counts_each_vf_by_its_pfs_tier() -> None:
    nics = NicState(
        [
            PfState("near", 100_000, 0, frozenset({"GPU-0"}), ("near-v0",)),
            PfState("numa", 100_000, 0, vfs=("numa-v0",)),
            PfState("far", 100_000, 1, vfs=("far-v0", "far-v1")),
        ]
    )
    vfs = [VfGrant("near-v0", "near"), VfGrant("numa-v0", "numa"), VfGrant("far-v0", "far")]
    assert [vf_distance([v], nics, ["GPU-0"], {0}) for v in vfs] == [0, 1, 2]
    assert vf_distance([*vfs, VfGrant("far-v1", "far")], nics, ["GPU-0"], {0}) == 5


# --- the filter and the books of a node -------------------------------------------------------


def rdma_node(name: str, pfs: list[Pf], gpus: int = 2, **kw: object) -> NodeState:
    return NodeState.from_inventory(name, 64_000, 512_000, rdma_inventory(name, [0] * gpus, pfs), **kw)  # type: ignore[arg-type]


def test_failed_nodes_say_which_rdma_resource_is_short() -> None:
    cluster = ClusterState(
        [
            rdma_node("bandwidth", [Pf("p", 100, 0, (0,), vfs=2)]),  # exactly the VFs, too little bandwidth
            rdma_node("vfs", [Pf("p", 400, 0, (0,), vfs=1)]),
            rdma_node("fits", [Pf("p", 400, 0, (0,), vfs=2)]),
        ]
    )
    pod = PodRequest("p", gpu_count=1, rdma=RdmaRequest(2, 100_000))
    assert failed_nodes(pod, cluster) == {"bandwidth": NO_BANDWIDTH, "vfs": NO_FREE_VFS}
    short = ClusterState(
        [rdma_node("bandwidth", [Pf("p", 100, 0, (0,), vfs=2)]), rdma_node("vfs", [Pf("p", 400)])]
    )
    short.assume(Allocation("vfs", "x", rdma=tuple(VfGrant(f"p-vf{k}", "p") for k in range(3))))  # 1 VF left
    _idx, why = run_filters(pod, short)  # the reasons are counted when no node passes
    assert dict(why) == {NO_BANDWIDTH: 1, NO_FREE_VFS: 1}
    kept, reasons = filter_nodes(pod, cluster, among=[])
    assert kept.tolist() == [] and reasons == {}
    kept, reasons = filter_nodes(pod, cluster, among=[2, 0])
    assert kept.tolist() == [2] and reasons == {"bandwidth": NO_BANDWIDTH}


def test_a_conflict_names_every_short_resource() -> None:
    node = rdma_node("n", [], allocatable={"example.com/a": 1, "example.com/b": 1})
    alloc = Allocation("n", "u", resources=(("example.com/a", 2), ("example.com/b", 2)))
    with pytest.raises(AllocationConflict, match=r"^pod u: not enough example.com/a, example.com/b on n$"):
        node.check(alloc)


# --- GPUs chosen with their interfaces (allocate) ---------------------------------------------


def linked_node(
    gpu_numas: list[int],
    pfs: list[Pf],
    pix: list[tuple[int, ...]] = (),  # type: ignore[assignment]
    nvlinks: list[tuple[int, int]] = (),  # type: ignore[assignment]
    taken: tuple[int, ...] = (),
    models: list[str] | None = None,
) -> NodeState:
    """A node whose GPUs are PIX-linked within ``pix`` groups, NODE on one NUMA node, SYS across,
    NVLinked per ``nvlinks``; ``taken`` GPUs are fully booked."""
    inv = rdma_inventory("n", gpu_numas, pfs)
    ids = [gpu_id("n", i) for i in range(len(gpu_numas))]
    pcie = {}
    for a in range(len(ids)):
        for b in range(a + 1, len(ids)):
            if any(a in group and b in group for group in pix):
                pcie[pair(ids[a], ids[b])] = PCIeRelation.PIX
            else:
                same = gpu_numas[a] == gpu_numas[b]
                pcie[pair(ids[a], ids[b])] = PCIeRelation.NODE if same else PCIeRelation.SYS
    devices = tuple(
        replace(d, model=models[d.index]) if models and d.kind == DeviceKind.GPU else d for d in inv.devices
    )
    links = {pair(ids[a], ids[b]): 4 for a, b in nvlinks}
    topology = Topology(nvlinks=links, pcie=pcie, nic_gpus=inv.topology.nic_gpus)
    node = NodeState.from_inventory("n", 64_000, 512_000, NodeInventory(devices, topology))
    for i in taken:
        node.gpus[i].free_milli = 0
    return node


def placed(node: NodeState, pod: PodRequest) -> tuple[list[int], list[str]]:
    alloc = allocate(pod, node)
    assert alloc is not None
    return sorted(g.index for g in alloc.gpus), [v.pf for v in alloc.rdma]


def test_a_set_anchored_beside_each_pf_can_bring_every_interface_beside_a_gpu() -> None:
    """GPU 1 is taken; the PIX pair {2, 3} sits beside B only, so A's interface would cross the
    switch: {0, 2} (one GPU beside each PF, each interface beside a GPU) is nearer."""
    node = linked_node([0] * 6, [Pf("A", 100, 0, (0, 1), vfs=1), Pf("B", 100, 0, (2, 3), vfs=1)],
                       pix=[(0, 1), (2, 3), (4, 5)], taken=(1,))  # fmt: skip
    assert placed(node, PodRequest("p", gpu_count=2)) == ([2, 3], [])
    assert placed(node, PodRequest("p", gpu_count=2, rdma=RdmaRequest(2))) == ([0, 2], ["A", "B"])


def test_every_gpu_beside_the_interface_beats_one_gpu_beside_it() -> None:
    """The PF sits beside GPUs 1 and 2: the pair {0, 1} has its interface beside GPU 1 but GPU 0 away
    from it; {1, 2} has both beside it."""
    node = linked_node([0] * 4, [Pf("A", 100, 0, (1, 2), vfs=1)], pix=[(0, 1), (2, 3)])
    assert placed(node, PodRequest("p", gpu_count=2)) == ([0, 1], [])
    assert placed(node, PodRequest("p", gpu_count=2, rdma=RdmaRequest(1))) == ([1, 2], ["A"])


def test_a_gpu_on_the_interfaces_numa_node_beats_one_across_the_sockets() -> None:
    """The NVLinked pair {1, 3} has GPU 3 on the other socket from the PF (beside GPU 1, NUMA 0);
    {0, 1} keeps both GPUs on the PF's NUMA node."""
    node = linked_node([0, 0, 0, 1, 1], [Pf("A", 100, 0, (1,), vfs=1)], nvlinks=[(1, 3)])
    assert placed(node, PodRequest("p", gpu_count=2)) == ([1, 3], [])
    assert placed(node, PodRequest("p", gpu_count=2, rdma=RdmaRequest(1))) == ([0, 1], ["A"])


def test_required_gpu_topology_and_allowed_models_hold_against_the_interfaces() -> None:
    nvlinked = linked_node([0] * 4, [Pf("A", 100, 0, (2, 3), vfs=2)], nvlinks=[(0, 1)])
    required = TopologyWish(nvlink=Wish.REQUIRE)
    pod = PodRequest("p", gpu_count=2, topology=required, rdma=RdmaRequest(1))
    assert placed(nvlinked, pod) == ([0, 1], ["A"])
    assert placed(nvlinked, replace(pod, topology=TopologyWish())) == ([2, 3], ["A"])
    models = linked_node([0] * 4, [Pf("A", 100, 0, (2, 3), vfs=2)], models=["A100", "A100", "H100", "H100"])
    pod = PodRequest("p", gpu_count=2, gpu_models=frozenset({"A100"}), rdma=RdmaRequest(1))
    assert placed(models, pod) == ([0, 1], ["A"])


def test_a_pf_on_the_gpus_numa_node_0_is_nearer_than_a_tighter_one_elsewhere() -> None:
    node = linked_node([0, 1], [Pf("P1", 200, 0, vfs=1), Pf("P2", 50, 1, vfs=1)])
    assert placed(node, PodRequest("p", gpu_count=1, rdma=RdmaRequest(1, 10_000))) == ([0], ["P1"])


def test_a_bound_pod_at_exactly_the_line_rate_is_booked_without_problems() -> None:
    cluster = ClusterState([rdma_node("n", [Pf("p", 100, 0, (0,), vfs=2)])])
    exact = Allocation("n", "a", rdma=(VfGrant("p-vf0", "p", 60_000), VfGrant("p-vf1", "p", 40_000)))
    assert cluster.book(exact) == []
    assert cluster.book(Allocation("n", "b", rdma=(VfGrant("p-vf9", "p"),))) == [
        "RDMA VF p-vf9 is not listed by node n"
    ]
    assert cluster.book(Allocation("n", "c", rdma=(VfGrant("p-vf1", "p", 1),))) == [
        "RDMA VF p-vf1 is booked beyond its capacity"
    ]


@pytest.mark.parametrize(
    ("numas", "pix", "nvlinks", "pfs", "taken", "pod", "expected"),
    [
        pytest.param(  # a tie keeps the first set (the topology's), not {0, 1} on the PFs' NUMA node
            [0, 0, 0, 1, 1, 1], [], [(3, 4), (4, 5)],
            [Pf("P0", 100, 0, (), vfs=1), Pf("P1", 400, 0, (3,), vfs=1)], (), (2, 2, 100_000),
            ([3, 4], ["P1", "P0"]), id="ties-keep-the-first",
        ),
        pytest.param(  # GPUs 0 and 2 are equally near: the first of least distance wins
            [0, 0, 0, 0], [(0, 1), (2, 3)], [],
            [Pf("P0", 200, -1, (0, 2), vfs=1), Pf("P1", 200, -1, (), vfs=1), Pf("P2", 400, 0, (), vfs=3)],
            (), (1, 2, 0), ([0], ["P0", "P2"]), id="first-of-least",
        ),
        pytest.param(  # the search goes on past an improvement that leaves some distance
            [0, 0, 0, 1, 1, 1], [(0, 1), (2, 3), (4, 5)], [(0, 1)],
            [Pf("P0", 200, -1, (), vfs=1), Pf("P1", 200, 0, (5,), vfs=3), Pf("P2", 200, 1, (0, 2), vfs=1)],
            (0, 3), (1, 3, 50_000), ([5], ["P1", "P1", "P1"]), id="past-a-partial-improvement",
        ),
        pytest.param(  # an improvement to (1, 0) does not end the search
            [0, 0, 0, 0, 0], [], [(3, 4)],
            [Pf("P0", 400, -1, (1, 4), vfs=2), Pf("P1", 400, 0, (), vfs=1), Pf("P2", 200, 0, (4,), vfs=3)],
            (3,), (1, 3, 100_000), ([4], ["P0", "P0", "P2"]), id="past-1-0",
        ),
        pytest.param(  # an improvement to (0, 1) does not end the search
            [0] * 7, [(0, 1), (2, 3), (4, 5), (6,)], [],
            [Pf("P0", 200, -1, (1, 5), vfs=1), Pf("P1", 400, 0, (4, 6), vfs=3),
             Pf("P2", 200, -1, (3, 6), vfs=2)],
            (2,), (2, 2, 0), ([3, 6], ["P2", "P2"]), id="past-0-1",
        ),
    ],
)  # fmt: skip
def test_the_joint_search_keeps_the_first_nearest_set(
    numas: list[int],
    pix: list[tuple[int, ...]],
    nvlinks: list[tuple[int, int]],
    pfs: list[Pf],
    taken: tuple[int, ...],
    pod: tuple[int, int, int],
    expected: tuple[list[int], list[str]],
) -> None:
    """Nodes found by comparing ``allocate`` with each surviving mutant of ``_nearer_to_nics`` and
    ``_joint_cost`` on random nodes (docs/testing.md): where the search's order and stops decide."""
    node = linked_node(numas, pfs, pix=pix, nvlinks=nvlinks, taken=taken)
    gpus, count, mbps = pod
    assert placed(node, PodRequest("p", gpu_count=gpus, rdma=RdmaRequest(count, mbps))) == expected


def test_the_books_add_up_memory_in_bytes_and_a_host_port_held_twice() -> None:
    """Bound pods are booked whatever they overlap: two pods' memory adds up in bytes too, and a host
    port two of them hold stays taken until both are gone."""
    node = rdma_node("n", [])
    port = HostPort("TCP", "0.0.0.0", 8080)
    first = Allocation("n", "a", memory_mib=100, host_ports=(port,))
    second = Allocation("n", "b", memory_mib=50, host_ports=(port,))
    node.apply(first, 1)
    node.apply(second, 1)
    assert node.resource_free("memory") == (512_000 - 150) * 1024 * 1024
    assert node.ports == {port: 2}
    node.apply(first, -1)
    assert node.ports == {port: 1}
    assert node.resource_free("memory") == (512_000 - 50) * 1024 * 1024
    node.apply(Allocation("n", "never-booked"), -1)  # unconditionally: releasing what it never held
    assert sorted(node.allocations) == ["b"]


def test_every_rdma_problem_of_an_allocation_is_named_at_once() -> None:
    node = rdma_node("n", [Pf("p", 100, 0, (0,), vfs=1)])
    alloc = Allocation("n", "u", rdma=(VfGrant("p-vf0", "p", 200_000), VfGrant("gone", "p")))
    with pytest.raises(AllocationConflict) as caught:
        node.check(alloc)
    assert str(caught.value) == (
        "pod u: no usable RDMA VF gone; PF p has 100000 Mbit/s left, not 200000 on n"
    )


def test_a_requests_host_ports_are_kept_once_in_order_and_negative_resources_refused() -> None:
    a, b = HostPort("TCP", "0.0.0.0", 80), HostPort("TCP", "0.0.0.0", 443)
    pod = PodRequest("p", host_ports=(b, a, b))
    assert pod.host_ports == (a, b)
    assert pod.shape() == PodRequest("q", host_ports=(a, b)).shape()
    with pytest.raises(ValueError, match="^pod r: negative resource request$"):
        PodRequest("r", resources=(("example.com/foo", -1),))


# --- functions changed between dcecd54 and 4d9596d --------------------------------------------


def test_resource_amounts_are_merged_by_name_from_a_mapping_or_pairs() -> None:
    assert resource_tuple({"b": 1, "a": 2}) == (("a", 2), ("b", 1))
    assert resource_tuple([("a", 1), ("a", 2), ("c", 0)]) == (("a", 3),)


def test_an_allocations_memory_in_bytes() -> None:
    assert Allocation("n", "u", memory_mib=3).memory_bytes() == 3 * 2**20
    exact = Allocation("n", "u", memory_mib=3, resources=(("example.com/a", 1), ("memory", 3_000_000)))
    assert exact.memory_bytes() == 3_000_000


def test_a_pod_with_other_resources_is_still_checked_for_memory() -> None:
    node = rdma_node("n", [], allocatable={"example.com/a": 4})  # 512,000 MiB of memory
    cluster = ClusterState([node])
    pod = PodRequest("p", memory_mib=600_000, resources=(("example.com/a", 1),))
    idx, why = run_filters(pod, cluster)
    assert idx.tolist() == [] and why


def test_a_nodes_utilisation_is_that_of_its_healthy_gpus() -> None:
    cluster = ClusterState([rdma_node("n", [])])
    ids = [g.id for g in cluster.nodes[0].gpus]
    cluster.set_live("n", {ids[0]: LiveGpu(80.0, 0), ids[1]: LiveGpu(20.0, 0, unfit="XID 79")})
    assert cluster.node_util[0] == 80.0


def test_a_share_fits_in_exactly_the_memory_a_gpu_reports_free() -> None:
    cluster = ClusterState([rdma_node("n", [], gpus=1)])
    gpu = cluster.nodes[0].gpus[0]
    cluster.set_live("n", {gpu.id: LiveGpu(10.0, gpu.memory_mib - 1000)})
    fits = PodRequest("p", gpu_count=1, gpu_milli=100, gpu_memory_mib=1000)
    assert run_filters(fits, cluster)[0].tolist() == [0]
    assert run_filters(replace(fits, gpu_memory_mib=1001), cluster)[0].tolist() == []
    alloc = allocate(fits, cluster.nodes[0])  # the GPU chosen within the node, by the same rule
    assert alloc is not None and [g.id for g in alloc.gpus] == [gpu.id]
    assert allocate(replace(fits, gpu_memory_mib=1001), cluster.nodes[0]) is None


def test_a_cluster_built_from_nodes_keeps_their_live_readings() -> None:
    """Nodes that carry readings (memory in use only, or utilisation only) give a new cluster the
    same live rows as readings set on the cluster itself."""
    for reading in (LiveGpu(None, 1000), LiveGpu(50.0, None)):
        node = rdma_node("n", [], gpus=2)
        node.set_live({node.gpus[0].id: reading})
        built = ClusterState([node])
        fresh = ClusterState([rdma_node("n", [], gpus=2)])
        fresh.set_live("n", {fresh.nodes[0].gpus[0].id: reading})
        assert built.any_live_memory == fresh.any_live_memory
        assert built.node_util[0] == fresh.node_util[0]
        assert np.array_equal(built.gpu_live_free, fresh.gpu_live_free)
        assert np.array_equal(built.gpu_util, fresh.gpu_util, equal_nan=True)
