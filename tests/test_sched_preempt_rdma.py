"""Preemption weighs RDMA interfaces: evicting lower-priority pods that hold VFs or reserve bandwidth
on a PF makes room, the cheapest such victims are chosen (as for GPUs), and a node where even every
lower-priority pod gone frees too little is never nominated (scheduler/core/preempt.py)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import pytest

from scheduler.core import PodRequest
from scheduler.core.preempt import GpuSlot, NodeOffer, RunningPod, Victims, choose, cost_key, select_victims
from scheduler.core.rdma import RdmaRequest, VfGrant, nic_state
from tests.support.rdmainv import Pf, gpu_id, rdma_inventory


def offer(name: str, pods: Sequence[RunningPod], pfs: Sequence[Pf], gpus: int = 0) -> NodeOffer:
    """A node of ``gpus`` GPUs and these PFs, with every pod's VFs booked on its NICs."""
    inventory = rdma_inventory(name, [0] * gpus, pfs)
    nics = nic_state(inventory)
    for pod in pods:
        nics.apply(pod.rdma, 1)
    slots = tuple(GpuSlot(gpu_id(name, i), "A100", 81920) for i in range(gpus))
    return NodeOffer(name, 64_000, 512_000, slots, tuple(pods), nics=nics)


def holder(
    uid: str,
    vfs: Sequence[str],
    mbps: int = 0,
    priority: int = 1,
    gpus: Sequence[str] = (),
    start: float = 1.0,
) -> RunningPod:
    """A pod holding these VFs (``<pf>-vf<k>``), each reserving ``mbps``, and these GPU ids."""
    grants = tuple(VfGrant(vf, vf.rsplit("-vf", 1)[0], mbps) for vf in vfs)
    return RunningPod(
        uid,
        f"default/{uid}",
        priority=priority,
        start_time=start,
        gpus={g: (1000, 81920) for g in gpus},
        rdma=grants,
    )


def uids(victims: Victims | None) -> set[str]:
    assert victims is not None
    return {p.uid for p in victims.pods}


def wants(count: int, mbps: int = 0, gpus: int = 0) -> PodRequest:
    return PodRequest("p", uid="p", gpu_count=gpus, rdma=RdmaRequest(count, mbps))


def test_evicting_the_holder_of_a_vf_frees_it_the_lowest_priority_first() -> None:
    node = offer("n", [holder("a", ["mlx5_0-vf0"], priority=1), holder("b", ["mlx5_0-vf1"], priority=2)],
                 [Pf("mlx5_0", 400, 0, vfs=2)])  # fmt: skip
    assert uids(select_victims(wants(1), 5, node)) == {"a"}
    assert uids(select_victims(wants(2), 5, node)) == {"a", "b"}
    assert select_victims(wants(3), 5, node) is None  # the node has two VFs in all
    assert select_victims(wants(1), 2, node) is not None and uids(select_victims(wants(1), 2, node)) == {"a"}
    assert select_victims(wants(1), 1, node) is None  # only strictly lower priorities go


def test_reserved_bandwidth_is_freed_by_the_fewest_then_the_lowest_victims() -> None:
    pf = [Pf("mlx5_0", 100, 0, vfs=4)]  # 100 Gbit/s, all reserved: 50 + 30 + 20
    big = holder("big", ["mlx5_0-vf0"], 50_000, priority=1, start=1.0)
    small = [
        holder("s1", ["mlx5_0-vf1"], 30_000, priority=1, start=3.0),
        holder("s2", ["mlx5_0-vf2"], 20_000, priority=1, start=2.0),
    ]
    node = offer("n", [big, *small], pf)
    assert node.nics.shortage(RdmaRequest(1, 50_000))  # one VF is free, but not the bandwidth
    assert uids(select_victims(wants(1, 50_000), 5, node)) == {"big"}  # one victim, not two
    assert uids(select_victims(wants(1, 30_000), 5, node)) == {"s1"}  # one victim, the newest
    # a more important big pod: two pods of the lowest priority go instead
    node = offer("n", [holder("big", ["mlx5_0-vf0"], 50_000, priority=3), *small], pf)
    assert uids(select_victims(wants(1, 50_000), 5, node)) == {"s1", "s2"}
    assert uids(select_victims(wants(1, 50_000), 2, node)) == {"s1", "s2"}
    assert select_victims(wants(1, 60_000), 2, node) is None  # below priority 2 only 50 Gbit/s can go
    assert select_victims(wants(1, 101_000), 9, node) is None  # beyond the line rate


def test_interfaces_needing_two_pfs_free_room_on_both() -> None:
    pfs = [Pf("mlx5_0", 100, 0, vfs=2), Pf("mlx5_1", 100, 1, vfs=1)]
    pods = [
        holder("a", ["mlx5_0-vf0"], 60_000, priority=1),
        holder("b", ["mlx5_1-vf0"], 60_000, priority=2),
        holder("c", ["mlx5_0-vf1"], 10_000, priority=3),
    ]
    node = offer("n", pods, pfs)
    # one 50G slot on each PF (a and b), rather than both on mlx5_0 (a and the more important c)
    assert uids(select_victims(wants(2, 50_000), 5, node)) == {"a", "b"}
    assert uids(select_victims(wants(2, 50_000), 3, node)) == {"a", "b"}
    assert uids(select_victims(wants(1, 50_000), 5, node)) == {"a"}
    node = offer("n", [*pods[:2], holder("c", ["mlx5_0-vf1"], 10_000, priority=1)], pfs)
    assert uids(select_victims(wants(2, 50_000), 5, node)) == {"a", "c"}  # both on mlx5_0: lower


def test_gpus_and_vfs_are_freed_together() -> None:
    pf = [Pf("mlx5_0", 400, 0, vfs=1)]
    gpu = gpu_id("n", 0)
    apart = offer("n", [holder("g", [], gpus=[gpu]), holder("v", ["mlx5_0-vf0"])], pf, gpus=1)
    assert uids(select_victims(wants(1, gpus=1), 5, apart)) == {"g", "v"}
    assert uids(select_victims(wants(0, gpus=1), 5, apart)) == {"g"}  # no RDMA asked: the VF stays
    together = offer("n", [holder("gv", ["mlx5_0-vf0"], gpus=[gpu]), holder("x", [], priority=0)], pf, gpus=1)
    assert uids(select_victims(wants(1, gpus=1), 5, together)) == {"gv"}


def test_a_node_where_evicting_cannot_free_the_vfs_is_never_nominated() -> None:
    pf = [Pf("mlx5_0", 400, 0, vfs=1)]
    gpu = gpu_id("x", 0)
    # on x the GPU could be freed, but a more important pod keeps the only VF: nothing in vain
    x = offer("x", [holder("x-gpu", [], gpus=[gpu], priority=1), holder("x-vf", ["mlx5_0-vf0"], priority=9)],
              pf, gpus=1)  # fmt: skip
    assert select_victims(wants(1, gpus=1), 5, x) is None
    # y has no NIC at all
    y = offer("y", [holder("y-gpu", [], gpus=[gpu_id("y", 0)], priority=0)], [], gpus=1)
    assert select_victims(wants(1, gpus=1), 5, y) is None
    z = offer("z", [holder("z-all", ["mlx5_0-vf0"], gpus=[gpu_id("z", 0)], priority=3)], pf, gpus=1)
    best = choose(wants(1, gpus=1), 5, [x, y, z])
    assert best is not None and best.node == "z" and uids(best) == {"z-all"}
    assert choose(wants(1, gpus=1), 5, [x, y]) is None


def test_many_holders_take_the_greedy_path_and_still_pick_the_least_important() -> None:
    pf = [Pf("mlx5_0", 400, 0, vfs=12)]
    pods = [holder(f"h{k}", [f"mlx5_0-vf{k}"], priority=k) for k in range(12)]  # more than EXACT_EXTRAS
    got = select_victims(wants(3), 20, offer("n", pods, pf))
    assert uids(got) == {"h0", "h1", "h2"}


# -- against brute force over every subset of the lower-priority pods ------------------------------


def fits_after(pod: PodRequest, node: NodeOffer, pfs: Sequence[Pf], gone: set[str]) -> bool:
    """Whether ``pod`` fits once ``gone`` are evicted (written apart from the module)."""
    left = [p for p in node.pods if p.uid not in gone]
    held_gpus = {g for p in left for g in p.gpus}
    if len(node.gpus) - len(held_gpus) < pod.gpu_count:
        return False
    held = {g.id for p in left for g in p.rdma}
    slots = 0
    for pf in pfs:
        free = sum(1 for k in range(pf.vfs) if f"{pf.name}-vf{k}" not in held)
        reserved = sum(g.min_mbps for p in left for g in p.rdma if g.pf == pf.name)
        room = int(pf.rate_gbps * 1000) - reserved
        slots += min(free, room // pod.rdma.min_mbps) if pod.rdma.min_mbps else free
    return slots >= pod.rdma.count


def brute_force(pod: PodRequest, priority: int, node: NodeOffer, pfs: Sequence[Pf]) -> tuple | None:
    low = [p for p in node.pods if p.priority < priority]
    best = None
    for r in range(len(low) + 1):
        for combo in itertools.combinations(low, r):
            if fits_after(pod, node, pfs, {p.uid for p in combo}):
                key = cost_key(combo, 0)
                best = key if best is None or key < best else best
    return best


def random_node(seed: int) -> tuple[NodeOffer, list[Pf]]:
    rng = random.Random(seed)
    pfs = [
        Pf(f"mlx5_{j}", rng.choice([100, 200]), j % 2, vfs=rng.randint(1, 4))
        for j in range(rng.randint(1, 3))
    ]
    vfs = [f"{pf.name}-vf{k}" for pf in pfs for k in range(pf.vfs)]
    rng.shuffle(vfs)
    gpus = [gpu_id("n", i) for i in range(4)]
    rng.shuffle(gpus)
    room = {pf.name: int(pf.rate_gbps * 1000) for pf in pfs}
    pods = []
    for k in range(rng.randint(1, 7)):
        mine: list[str] = []
        mbps = rng.choice([0, 10_000, 25_000, 50_000])
        for _ in range(rng.choice([0, 1, 1, 2])):
            if vfs and room[vfs[-1].rsplit("-vf", 1)[0]] >= mbps:
                vf = vfs.pop()
                room[vf.rsplit("-vf", 1)[0]] -= mbps
                mine.append(vf)
        held = [gpus.pop() for _ in range(min(len(gpus), rng.choice([0, 0, 1, 2])))]
        pods.append(holder(f"p{k}", mine, mbps, rng.choice([1, 2, 3, 9]), held, start=rng.random()))
    return offer("n", pods, pfs, gpus=4), pfs


REQUESTS = [
    wants(1),
    wants(2, 50_000),
    wants(1, 100_000),
    wants(3),
    wants(1, 25_000, gpus=2),
    wants(2, gpus=1),
]


@pytest.mark.parametrize("seed", range(40))
def test_optimal_on_random_nodes_with_nics(seed: int) -> None:
    node, pfs = random_node(seed)
    for pod in REQUESTS:
        expected = brute_force(pod, 5, node, pfs)
        got = select_victims(pod, 5, node)
        if expected is None:
            assert got is None, (pod, uids(got))
            continue
        assert got is not None and got.cost() == expected, (pod, uids(got))
        assert all(p.priority < 5 for p in got.pods)
        assert fits_after(pod, node, pfs, uids(got))
