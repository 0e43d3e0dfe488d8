"""Topology-aware whole-GPU choice: the DGX-1 brute force, known answers, and topology wishes."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from devices.model import PCIeRelation, Topology, pair
from scheduler.core import (
    MILLI,
    Allocation,
    ClusterState,
    GpuGrant,
    GpuState,
    NodeState,
    PodRequest,
    TopologyWish,
    Wish,
    make_policy,
    run_filters,
    schedule_one,
)
from scheduler.core.allocate import allocate
from scheduler.core.topology import LinkMatrix, best_gpu_set, load_machine, pair_score

DGX1 = Path(__file__).resolve().parent.parent / "scheduler" / "data" / "topologies" / "dgx1-v100.json"
# go-gpuallocator's besteffort link scores
PCIE = {"PIX": 50, "PXB": 40, "PHB": 30, "NODE": 20, "SYS": 10}


def dgx1_node(name: str = "dgx") -> NodeState:
    inventory = load_machine(DGX1, prefix=f"{name}-gpu")
    return NodeState.from_inventory(name, 80_000, 512_000, inventory)


def reference_pair_scores() -> list[list[int]]:
    """Pair scores straight from the JSON matrices (independent of the code under test)."""
    doc = json.loads(DGX1.read_text())
    n = len(doc["gpus"])
    return [
        [0 if i == j else 100 * doc["nvlink"][i][j] + PCIE[doc["pcie"][i][j]] for j in range(n)]
        for i in range(n)
    ]


def exhaustive_optimum(scores: list[list[int]], free: list[int], k: int) -> int:
    return max(
        sum(scores[a][b] for a, b in itertools.combinations(s, 2)) for s in itertools.combinations(free, k)
    )


def test_loader_reads_links_and_numa() -> None:
    node = dgx1_node()
    assert [g.numa for g in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    top = node.topology
    assert top.nvlink_count("dgx-gpu0", "dgx-gpu3") == 2
    assert top.nvlink_count("dgx-gpu0", "dgx-gpu5") == 0
    assert top.pcie_relation("dgx-gpu0", "dgx-gpu1") is PCIeRelation.PIX
    assert top.pcie_relation("dgx-gpu0", "dgx-gpu4") is PCIeRelation.SYS
    assert pair_score(top, "dgx-gpu0", "dgx-gpu3") == 230


def test_matches_the_exhaustive_optimum_for_every_free_set_and_size() -> None:
    """All 2^8 free sets x sizes 1..8: the chosen set has the best achievable link score."""
    node = dgx1_node()
    links = node.links()
    scores = reference_pair_scores()
    checked = 0
    for mask in range(1 << 8):
        free = [i for i in range(8) if mask >> i & 1]
        for k in range(1, 9):
            got = best_gpu_set(links, free, k)
            if k > len(free):
                assert got is None
                continue
            assert got is not None and len(set(got)) == k and set(got) <= set(free)
            score = sum(scores[a][b] for a, b in itertools.combinations(got, 2))
            assert score == exhaustive_optimum(scores, free, k), (free, k, got)
            checked += 1
    assert checked == 8 * 2**7  # sum over the free sets of their size


def test_known_answers() -> None:
    links = dgx1_node().links()
    assert set(best_gpu_set(links, range(8), 4)) in ({0, 1, 2, 3}, {4, 5, 6, 7})
    assert best_gpu_set(links, [0, 1, 3], 2) == (0, 3)  # two NVLinks beat one
    assert set(best_gpu_set(links, range(8), 8)) == set(range(8))


def test_equal_scores_leave_the_best_connected_gpus_free() -> None:
    """One GPU from an idle DGX-1: every single GPU scores 0, so take the one whose loss cuts least."""
    links = dgx1_node().links()
    (chosen,) = best_gpu_set(links, range(8), 1)
    scores = reference_pair_scores()
    cut = {g: sum(scores[g][h] for h in range(8) if h != g) for g in range(8)}
    assert cut[chosen] == min(cut.values())


def test_allocation_uses_topology_and_books_whole_gpus() -> None:
    node = dgx1_node()
    cluster = ClusterState([node])
    alloc = allocate(PodRequest("train", cpu_milli=1000, gpu_count=4), node)
    assert alloc is not None
    assert {g.index for g in alloc.gpus} in ({0, 1, 2, 3}, {4, 5, 6, 7})
    assert all(g.milli == MILLI and g.memory_mib == 16384 for g in alloc.gpus)
    cluster.assume(alloc)
    assert cluster.gpu_full_free[0] == 4


def rtx_like() -> NodeState:
    """4 GPUs on one host bridge, NVLink bridges on (0,3) and (1,2) only."""
    ids = [f"r-gpu{i}" for i in range(4)]
    pcie = {pair(a, b): PCIeRelation.PHB for a, b in itertools.combinations(ids, 2)}
    topo = Topology(nvlinks={pair(ids[0], ids[3]): 2, pair(ids[1], ids[2]): 2}, pcie=pcie)
    gpus = [GpuState(i, ids[i], "RTX8000", 49152, numa=0 if i < 2 else 1) for i in range(4)]
    return NodeState("r", 32_000, 128_000, gpus, topology=topo)


def test_require_nvlink_restricts_and_prefer_ranks() -> None:
    links = rtx_like().links()
    need = TopologyWish(nvlink=Wish.REQUIRE)
    assert best_gpu_set(links, [0, 1, 3], 2, need) == (0, 3)
    assert best_gpu_set(links, [0, 1], 2, need) is None
    assert best_gpu_set(links, [0, 1, 2, 3], 4, need) is None
    # PREFER same NUMA outranks NVLink score: {0,1} (numa 0, no NVLink) beats {0,3}
    prefer_numa = TopologyWish(same_numa=Wish.PREFER)
    assert best_gpu_set(links, [0, 1, 3], 2, prefer_numa) == (0, 1)
    assert best_gpu_set(links, [0, 1, 3], 2) == (0, 3)


def test_topology_filter_reason() -> None:
    node = rtx_like()
    cluster = ClusterState([node])
    pod = PodRequest("p", gpu_count=2, topology=TopologyWish(nvlink=Wish.REQUIRE))
    cluster.assume(Allocation("r", "hold-0", gpus=(GpuGrant(0, "r-gpu0"),), gpu_tag="1-gpu"))
    idx, why = run_filters(pod, cluster)
    assert list(idx) == [0]  # GPUs 1 and 2 are an NVLink pair
    cluster.assume(Allocation("r", "hold-1", gpus=(GpuGrant(1, "r-gpu1"),), gpu_tag="1-gpu"))
    idx, why = run_filters(pod, cluster)
    assert len(idx) == 0 and why == {"no NVLink-connected set of 2 GPUs": 1}


@pytest.mark.parametrize("k", [2, 3])
def test_flat_nodes_take_lowest_indices(k: int) -> None:
    links = LinkMatrix([f"g{i}" for i in range(4)], [-1] * 4, Topology())
    assert best_gpu_set(links, [3, 1, 2, 0], k) == tuple(range(k))


def test_identical_machines_share_one_link_matrix() -> None:
    a, b = dgx1_node("a"), dgx1_node("b")
    assert a.links() is b.links()
    assert rtx_like().links() is not a.links()


def test_topology_policy_prefers_the_node_with_the_better_connected_set() -> None:
    """An idle DGX-1 gives a 4-GPU pod a whole NVLink quad; one with GPUs 1 and 5 taken cannot."""
    idle, used = dgx1_node("idle"), dgx1_node("used")
    cluster = ClusterState([used, idle])
    cluster.assume(Allocation("used", "hold", gpus=(GpuGrant(1, "used-gpu1"), GpuGrant(5, "used-gpu5"))))
    policy = make_policy("topology")
    policy.bind(cluster, [], random.Random(0))
    pod = PodRequest("train", cpu_milli=1000, gpu_count=4)
    scores = policy.plugins[0][0].score(pod, cluster, cluster.all_indices)
    assert scores[1] == 100 and scores[0] < 100
    placed = schedule_one(pod, cluster, policy, random.Random(0))
    assert placed.node == "idle"
    assert {g.index for g in placed.allocation.gpus} in ({0, 1, 2, 3}, {4, 5, 6, 7})
    single = schedule_one(PodRequest("one", gpu_count=1), cluster, policy, random.Random(0))
    assert single.allocation.gpus  # pods of fewer than 2 GPUs: fgd-align decides
