"""The core's NodeResourcesFit beyond CPU and GPUs, and NodePorts (issue 20, items 1, 3, 4).

The rules are kube-scheduler v1.37's (noderesources/fit.go ``fitsRequest``, nodeports and the
scheduler framework's ``HostPortInfo``): every requested resource must fit the node's allocatable
less what its pods request, a resource the node does not list counting 0 and a zero request being
ignored; a host port collides with the same protocol and port on the same IP, ``0.0.0.0`` colliding
with every IP. The reasons are worded as kube-scheduler's.
"""

from __future__ import annotations

import random

import pytest

from scheduler.core.allocate import allocate
from scheduler.core.filters import failed_nodes, run_filters, unschedulable_message
from scheduler.core.policies import make_policy
from scheduler.core.preempt import NodeOffer, RunningPod, select_victims
from scheduler.core.request import HostPort, PodRequest
from scheduler.core.schedule import Placement, Unschedulable, schedule_one
from scheduler.core.state import Allocation, AllocationConflict, ClusterState, GpuState, NodeState

MiB = 1 << 20


def node(name: str, allocatable: dict[str, int] | None = None, gpus: int = 0) -> NodeState:
    return NodeState(
        name, 8000, 32768, [GpuState(i, f"{name}-g{i}") for i in range(gpus)], allocatable=allocatable
    )


def pod(
    name: str, resources: dict[str, int] | None = None, ports: tuple[HostPort, ...] = (), **kw
) -> PodRequest:
    return PodRequest(name, cpu_milli=100, resources=tuple((resources or {}).items()), host_ports=ports, **kw)


def place(p: PodRequest, cluster: ClusterState) -> str:
    """The node ``p`` lands on (booked), or the unschedulable message."""
    cluster.set_tie_order(range(len(cluster)))  # equal scores: the first node
    result = schedule_one(p, cluster, make_policy("bestfit"), random.Random(0))
    if isinstance(result, Placement):
        cluster.assume(result.allocation)
        return result.allocation.node
    assert isinstance(result, Unschedulable)
    return result.message()


# --- item 1: every requested resource ----------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["example.com/foo", "kubegpu.io/rdma", "ephemeral-storage", "hugepages-2Mi", "hugepages-1Gi"]
)
def test_a_resource_the_node_does_not_list_counts_zero(name: str) -> None:
    cluster = ClusterState([node("a"), node("b", {name: 0})])
    message = place(pod("p", {name: 1}), cluster)
    assert message == f"0/2 nodes are available: 2 Insufficient {name}."


def test_a_resource_is_used_up_by_the_pods_placed_there() -> None:
    cluster = ClusterState([node("a", {"example.com/foo": 3}), node("b")])
    assert place(pod("p1", {"example.com/foo": 2}), cluster) == "a"
    assert place(pod("p2", {"example.com/foo": 1}), cluster) == "a"
    assert place(pod("p3", {"example.com/foo": 1}), cluster) == (
        "0/2 nodes are available: 2 Insufficient example.com/foo."
    )
    cluster.forget("p1")
    assert place(pod("p3", {"example.com/foo": 1}), cluster) == "a"


def test_every_shortage_is_a_reason_and_nodes_are_counted_per_reason() -> None:
    cluster = ClusterState(
        [
            node("a", {"example.com/foo": 1, "ephemeral-storage": 10}),
            node("b", {"example.com/foo": 0, "ephemeral-storage": 100}),
            node("c", {"example.com/foo": 5, "ephemeral-storage": 100}),
        ]
    )
    cluster.assume(Allocation("c", "holder", resources=(("example.com/foo", 5),)))
    p = pod("p", {"example.com/foo": 1, "ephemeral-storage": 50})
    idx, why = run_filters(p, cluster)
    assert not len(idx)
    assert unschedulable_message(3, why) == (
        "0/3 nodes are available: 2 Insufficient example.com/foo, 1 Insufficient ephemeral-storage."
    )
    assert failed_nodes(p, cluster)["a"] == "Insufficient ephemeral-storage"
    assert failed_nodes(p, cluster)["b"] == "Insufficient example.com/foo"


def test_a_zero_request_is_ignored_and_a_pod_asking_nothing_fits_an_overcommitted_node() -> None:
    cluster = ClusterState([node("a", {"example.com/foo": 1})])
    cluster.book(Allocation("a", "over", resources=(("example.com/foo", 3),)))  # a fact: over-booked
    assert pod("zero", {"example.com/foo": 0}).resources == ()
    assert place(pod("zero", {"example.com/foo": 0}), cluster) == "a"
    assert "Insufficient example.com/foo" in place(pod("one", {"example.com/foo": 1}), cluster)


def test_exact_memory_replaces_the_mib_check() -> None:
    """Memory in bytes: a node of 1000 MiB + 1 byte cannot take 1001 MiB (rounding the node up to
    1001 MiB did), and two pods of 1.5 GB fit 3 GB exactly (rounding both up to MiB does not)."""
    small = NodeState("small", 8000, 1001, allocatable={"memory": 1000 * MiB + 1})
    cluster = ClusterState([small])
    asked = PodRequest("p", memory_mib=1001, resources=(("memory", 1001 * MiB),))
    assert place(asked, cluster) == "0/1 nodes are available: 1 Insufficient memory."
    exact = NodeState("exact", 8000, 3_000_000_000 // MiB, allocatable={"memory": 3_000_000_000})
    cluster = ClusterState([exact])
    for i in range(2):
        half = PodRequest(
            f"h{i}", memory_mib=-(-1_500_000_000 // MiB), resources=(("memory", 1_500_000_000),)
        )
        assert place(half, cluster) == "exact"
    last = PodRequest("last", resources=(("memory", 1),))
    assert place(last, cluster) == "0/1 nodes are available: 1 Insufficient memory."


def test_check_refuses_what_the_filter_refuses() -> None:
    n = node("a", {"example.com/foo": 1})
    n.check(Allocation("a", "ok", resources=(("example.com/foo", 1),)))
    with pytest.raises(AllocationConflict, match="example.com/foo"):
        n.check(Allocation("a", "no", resources=(("example.com/foo", 2),)))
    n.apply(Allocation("a", "port", host_ports=(HostPort.of(80),)), 1)
    with pytest.raises(AllocationConflict, match="host ports"):
        n.check(Allocation("a", "again", host_ports=(HostPort.of(80, "TCP", "10.0.0.1"),)))


def test_allocations_carry_resources_and_ports_and_round_trip() -> None:
    cluster = ClusterState([node("a", {"example.com/foo": 2}, gpus=1)])
    p = pod("p", {"example.com/foo": 2}, (HostPort.of(8080),), gpu_count=1)
    alloc = allocate(p, cluster.nodes[0])
    assert alloc is not None
    assert alloc.resources == (("example.com/foo", 2),) and alloc.host_ports == (
        HostPort("TCP", "0.0.0.0", 8080),
    )
    assert Allocation.from_dict(alloc.to_dict()) == alloc
    plain = allocate(PodRequest("q", cpu_milli=1), cluster.nodes[0])
    assert plain is not None and "resources" not in plain.to_dict() and "hostPorts" not in plain.to_dict()


# --- item 3: host ports ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("used", "wanted", "conflict"),
    [
        (HostPort.of(80), HostPort.of(80), True),
        (HostPort.of(80), HostPort.of(81), False),
        (HostPort.of(80), HostPort.of(80, "UDP"), False),
        (HostPort.of(80, "TCP", "10.0.0.1"), HostPort.of(80, "TCP", "10.0.0.2"), False),
        (HostPort.of(80, "TCP", "10.0.0.1"), HostPort.of(80, "TCP", "10.0.0.1"), True),
        (HostPort.of(80, "TCP", "10.0.0.1"), HostPort.of(80), True),  # 0.0.0.0 wants every IP
        (HostPort.of(80), HostPort.of(80, "TCP", "10.0.0.1"), True),  # 0.0.0.0 holds every IP
        (HostPort.of(80, "", ""), HostPort.of(80, "TCP", "0.0.0.0"), True),  # defaults sanitised
        (HostPort.of(53, "SCTP"), HostPort.of(53, "UDP"), False),
    ],
)
def test_host_port_conflicts_as_kube_scheduler(used: HostPort, wanted: HostPort, conflict: bool) -> None:
    cluster = ClusterState([node("a")])
    cluster.book(Allocation("a", "holder", host_ports=(used,)))
    result = place(pod("p", ports=(wanted,)), cluster)
    if conflict:
        assert (
            result == "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports."
        )
    else:
        assert result == "a"


def test_a_port_is_free_again_once_its_pod_is_gone_and_other_nodes_take_the_pod() -> None:
    cluster = ClusterState([node("a"), node("b")])
    web = (HostPort.of(443),)
    assert place(pod("w1", ports=web), cluster) == "a"
    assert place(pod("w2", ports=web), cluster) == "b"
    assert "2 node(s) didn't have free ports" in place(pod("w3", ports=web), cluster)
    cluster.forget("w1")
    assert place(pod("w3", ports=web), cluster) == "a"


def test_ports_are_checked_before_resources_as_kube_scheduler_orders_its_filters() -> None:
    cluster = ClusterState([node("a", {"example.com/foo": 0})])
    cluster.book(Allocation("a", "holder", host_ports=(HostPort.of(80),)))
    message = place(pod("p", {"example.com/foo": 1}, (HostPort.of(80),)), cluster)
    assert message == "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports."


# --- preemption -------------------------------------------------------------------------------------


def offer(pods: tuple[RunningPod, ...], allocatable: dict[str, int] | None = None) -> NodeOffer:
    return NodeOffer("n", 8000, 32768, pods=pods, allocatable=allocatable or {})


def test_preemption_never_picks_a_node_without_the_resource() -> None:
    low = RunningPod("low", priority=0, cpu_milli=8000)
    p = pod("p", {"example.com/foo": 1})
    assert select_victims(p, 10, offer((low,))) is None
    victims = select_victims(p, 10, offer((low,), {"example.com/foo": 1}))
    assert victims is not None and [v.uid for v in victims.pods] == ["low"]  # for its CPU


def test_preemption_evicts_the_holders_of_the_resource_or_the_port() -> None:
    holder = RunningPod("holder", priority=0, resources={"example.com/foo": 1})
    other = RunningPod("other", priority=0, cpu_milli=100)
    victims = select_victims(
        pod("p", {"example.com/foo": 1}), 10, offer((other, holder), {"example.com/foo": 1})
    )
    assert victims is not None and [v.uid for v in victims.pods] == ["holder"]
    bound = RunningPod("bound", priority=0, host_ports=(HostPort.of(80, "TCP", "10.0.0.1"),))
    victims = select_victims(pod("p", ports=(HostPort.of(80),)), 10, offer((other, bound)))
    assert victims is not None and [v.uid for v in victims.pods] == ["bound"]
    important = RunningPod("important", priority=100, host_ports=(HostPort.of(80),))
    assert select_victims(pod("p", ports=(HostPort.of(80),)), 10, offer((important,))) is None


def test_a_node_given_memory_in_mib_has_that_many_bytes_and_mib_pods_count_in_bytes() -> None:
    """A node built without exact memory (the simulator's, a benchmark's) offers ``memory_mib`` MiB
    to a pod asking in bytes, less what pods booked in MiB hold."""
    cluster = ClusterState([NodeState("n", 8000, 1024)])
    cluster.assume(Allocation("n", "mib", memory_mib=512))
    too_much = PodRequest("big", memory_mib=513, resources=(("memory", 512 * MiB + 1),))
    assert place(too_much, cluster) == "0/1 nodes are available: 1 Insufficient memory."
    assert place(PodRequest("fits", memory_mib=512, resources=(("memory", 512 * MiB),)), cluster) == "n"
