"""Whole-GPU set choice at its edges: what each topology wish counts, machine files with fields
left out, the switch between exhaustive and local search, the local search's growth and swaps,
and the myopic rule's tie-break on links cut."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from devices.model import PCIeRelation, Topology, pair
from scheduler.core import TopologyWish, Wish
from scheduler.core import topology as topo
from scheduler.core.state import NodeState
from scheduler.core.topology import (
    LinkMatrix,
    _local_search,
    best_gpu_set,
    greedy_gpu_set,
    load_machine,
)

DGX1 = Path(__file__).resolve().parent.parent / "scheduler" / "data" / "topologies" / "dgx1-v100.json"


def dgx1_links() -> LinkMatrix:
    return NodeState.from_inventory("dgx", 1, 1, load_machine(DGX1, prefix="dgx-gpu")).links()


def matrix(
    n: int, nvlinks: dict[tuple[int, int], int], pcie: dict[tuple[int, int], str], numa=None
) -> LinkMatrix:
    """A machine of ``n`` GPUs: the given NVLink counts, the given PCIe relations (SYS elsewhere)."""
    ids = [f"g{i}" for i in range(n)]
    relations = {
        pair(ids[i], ids[j]): PCIeRelation.parse(pcie.get((i, j), "SYS"))
        for i, j in itertools.combinations(range(n), 2)
    }
    links = {pair(ids[i], ids[j]): c for (i, j), c in nvlinks.items()}
    return LinkMatrix(ids, list(numa) if numa is not None else [0] * n, Topology(links, relations))


# -- what a wish counts ---------------------------------------------------------------------------


def test_satisfies_counts_each_wish_met_at_its_level() -> None:
    """GPUs 0 and 1 share a PCIe switch and a NUMA node, no NVLink; 0 and 2 have an NVLink only."""
    m = matrix(3, {(0, 2): 1}, {(0, 1): "PIX"}, numa=[0, 0, 1])
    prefer_all = TopologyWish(Wish.PREFER, Wish.PREFER, Wish.PREFER)
    assert m.satisfies((0, 1), prefer_all, Wish.PREFER) == 2  # switch and NUMA
    assert m.satisfies((0, 2), prefer_all, Wish.PREFER) == 1  # NVLink
    assert m.satisfies((1, 2), prefer_all, Wish.PREFER) == 0
    assert m.satisfies((0, 1), prefer_all, Wish.REQUIRE) == 0  # nothing is required
    mixed = TopologyWish(nvlink=Wish.REQUIRE, same_numa=Wish.PREFER, same_pcie_switch=Wish.REQUIRE)
    assert m.satisfies((0, 1), mixed, Wish.REQUIRE) == 1 and m.satisfies((0, 1), mixed, Wish.PREFER) == 1
    assert m.satisfies((0, 2), mixed, Wish.REQUIRE) == 1 and m.satisfies((0, 2), mixed, Wish.PREFER) == 0
    assert m.satisfies((0,), prefer_all, Wish.PREFER) == 3  # one GPU: every pair condition holds
    # preferences rank sets before link scores: (0, 1) meets two, (0, 2) one but scores 110 > 50
    assert best_gpu_set(m, range(3), 2, prefer_all) == (0, 1)
    assert greedy_gpu_set(m, range(3), 2, prefer_all) == (0, 1)
    assert best_gpu_set(m, range(3), 2) == (0, 2)


def test_required_switch_and_numa_on_a_dgx1() -> None:
    links = dgx1_links()
    switch = TopologyWish(same_pcie_switch=Wish.REQUIRE)
    got = best_gpu_set(links, range(8), 2, switch)
    assert got in {(0, 1), (2, 3), (4, 5), (6, 7)}
    assert best_gpu_set(links, [0, 2, 4, 6], 2, switch) is None  # no two behind one switch
    assert best_gpu_set(links, range(8), 3, switch) is None
    numa = TopologyWish(same_numa=Wish.REQUIRE)
    assert best_gpu_set(links, [0, 1, 4, 5, 6], 3, numa) == (4, 5, 6)
    assert greedy_gpu_set(links, [0, 1, 4, 5, 6], 3, numa) == (4, 5, 6)
    assert best_gpu_set(links, [0, 1, 2, 4, 5, 6], 4, numa) is None
    assert greedy_gpu_set(links, [0, 1, 2, 4, 5, 6], 4, numa) is None


# -- machine files --------------------------------------------------------------------------------


def test_machine_files_may_leave_out_model_memory_numa_and_nvlinks() -> None:
    doc = {"gpus": [{"index": 1}, {"index": 0}], "pcie": [["X", "PIX"], ["PIX", "X"]]}
    inventory = load_machine(doc)
    assert [d.id for d in inventory.devices] == ["GPU-0", "GPU-1"]
    assert [(d.model, d.memory_mib, d.numa_node) for d in inventory.devices] == [("", 0, -1)] * 2
    assert inventory.topology.nvlinks == {}
    assert inventory.topology.pcie_relation("GPU-0", "GPU-1") is PCIeRelation.PIX
    full = {
        "gpus": [{"index": 0, "model": "H100", "memoryMiB": 81_559, "numa": 1}, {"index": 1}],
        "nvlink": [[0, 18], [18, 0]],
    }
    inventory = load_machine(full, prefix="n-")
    assert (inventory.devices[0].model, inventory.devices[0].memory_mib, inventory.devices[0].numa_node) == (
        "H100",
        81_559,
        1,
    )
    assert inventory.topology.nvlink_count("n-0", "n-1") == 18 and inventory.topology.pcie == {}


# -- exhaustive or local search -------------------------------------------------------------------


def test_local_search_starts_only_beyond_the_exhaustive_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    links = dgx1_links()
    calls: list[int] = []
    real = topo._local_search

    def spy(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(topo, "_local_search", spy)
    assert math.comb(8, 3) == 56 and math.comb(7, 2) == 21
    monkeypatch.setattr(topo, "EXHAUSTIVE_LIMIT", 56)
    best_gpu_set(links, range(8), 3)
    assert calls == []  # 56 candidates: not more than the limit
    best_gpu_set(links, range(8), 3, must=[0])  # 21 candidates
    assert calls == []
    monkeypatch.setattr(topo, "EXHAUSTIVE_LIMIT", 55)
    links.memo.clear()
    best_gpu_set(links, range(8), 3)
    assert calls == [3]
    monkeypatch.setattr(topo, "EXHAUSTIVE_LIMIT", 20)
    links.memo.clear()
    best_gpu_set(links, range(8), 3, must=[0])
    assert calls == [3, 3]


def test_local_search_grows_greedily_then_swaps_while_the_score_rises() -> None:
    """Pair scores: (1, 2) 150 (an NVLink and a switch), (0, 1) 110 (an NVLink), 10 elsewhere.
    From seed 0 the growth takes 1, a swap then takes 2 for 0; from seed 3 (all partners equal) the
    growth takes the lowest index, 0, and two swaps reach (1, 2): every seed ends at (1, 2)."""
    m = matrix(4, {(0, 1): 1, (1, 2): 1}, {(1, 2): "PIX"})
    assert m.score[1][2] == 150 and m.score[0][1] == 110 and m.score[0][3] == 10
    assert _local_search(m, [0, 1, 2, 3], 2) == [(1, 2)]
    # a required GPU is never swapped out: with 0 required every seed ends at (0, 1)
    assert _local_search(m, [0, 1, 2, 3], 2, [0]) == [(0, 1)]
    # as many required GPUs as asked for: the required set itself
    assert _local_search(m, [0, 1, 2, 3], 2, [0, 3]) == [(0, 3)]


def test_local_search_growth_breaks_ties_to_the_lowest_index() -> None:
    """All pairs alike (no swap can help): each seed takes the lowest free index as partner."""
    m = matrix(4, {}, {(i, j): "PHB" for i, j in itertools.combinations(range(4), 2)})
    assert _local_search(m, [0, 1, 2, 3], 2) == [(0, 1), (0, 2), (0, 3)]


def test_the_myopic_rule_breaks_score_ties_by_the_fewest_links_cut() -> None:
    """(0, 1) and (2, 3) both have an NVLink (110); GPU 1 shares a switch with GPU 4, so taking
    (0, 1) cuts 100 of link score to the GPUs left free, (2, 3) only 60: (2, 3) is chosen although
    (0, 1) comes first."""
    m = matrix(5, {(0, 1): 1, (2, 3): 1}, {(1, 4): "PIX"})
    assert m.score[0][1] == m.score[2][3] == 110
    assert greedy_gpu_set(m, range(5), 2) == (2, 3)


def test_no_set_meeting_a_requirement_is_none_not_an_empty_choice() -> None:
    m = matrix(3, {(0, 2): 1}, {(0, 1): "PIX"})
    need = TopologyWish(nvlink=Wish.REQUIRE, same_pcie_switch=Wish.REQUIRE)
    assert best_gpu_set(m, range(3), 2, need) is None
    assert greedy_gpu_set(m, range(3), 2, need) is None
