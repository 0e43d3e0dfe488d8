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
from scheduler.core.besteffort import gpuallocator_gpu_set
from scheduler.core.topology import LinkMatrix, best_gpu_set, greedy_gpu_set, load_machine, pair_score

DGX1 = Path(__file__).resolve().parent.parent / "scheduler" / "data" / "topologies" / "dgx1-v100.json"
# go-gpuallocator's besteffort link scores
PCIE = {"PIX": 50, "PXB": 40, "PHB": 30, "NODE": 20, "SYS": 10}


SHIPPED = Path(__file__).resolve().parent.parent / "devices" / "topologies"


def shipped_links(machine: str) -> LinkMatrix:
    inventory = load_machine(SHIPPED / f"{machine}.json", prefix=f"{machine}-gpu")
    return NodeState.from_inventory(machine, 1, 1, inventory).links()


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


def reference_cross() -> list[list[bool]]:
    doc = json.loads(DGX1.read_text())
    n = len(doc["gpus"])
    return [[doc["pcie"][i][j] == "SYS" for j in range(n)] for i in range(n)]


def reference_partitions(gpus: tuple[int, ...], size: int) -> list[list[tuple[int, ...]]]:
    """Every split of ``gpus`` into sets of ``size`` plus one remainder set, by plain enumeration."""
    if len(gpus) <= size:
        return [[gpus]] if gpus else [[]]
    out = []
    rem = len(gpus) % size
    if rem:  # choose the remainder first, then split the rest exactly
        for r in itertools.combinations(gpus, rem):
            rest = tuple(g for g in gpus if g not in r)
            out += [[r, *p] for p in reference_partitions(rest, size)]
        return out
    first = gpus[0]
    for others in itertools.combinations(gpus[1:], size - 1):
        group = (first, *others)
        rest = tuple(g for g in gpus if g not in group)
        out += [[group, *p] for p in reference_partitions(rest, size)]
    return out


def reference_choice(free: list[int], k: int) -> tuple[int, ...]:
    """The documented look-ahead ranking, by brute force over explicit partitions (no DP, no memo)."""
    scores, cross = reference_pair_scores(), reference_cross()

    def value(group: tuple[int, ...]) -> tuple[int, int]:  # (link score, -spans sockets)
        pairs = list(itertools.combinations(group, 2))
        return sum(scores[a][b] for a, b in pairs), -int(any(cross[a][b] for a, b in pairs))

    def best_split(rest: tuple[int, ...], size: int) -> tuple[int, int]:
        if size <= 1 or not rest:
            return (0, 0)
        splits = reference_partitions(rest, size)
        return max(tuple(map(sum, zip(*(value(g) for g in p), strict=True))) for p in splits)

    best, best_rank = None, None
    for cand in itertools.combinations(sorted(free), k):
        rest = tuple(g for g in sorted(free) if g not in cand)
        own = value(cand)
        same = best_split(rest, k)
        ahead = [best_split(rest, s) for s in (2, 4)]
        rank = (
            (own[0] + same[0], own[1] + same[1]),
            own,
            (sum(a[0] for a in ahead), sum(a[1] for a in ahead)),
        )
        if best_rank is None or rank > best_rank:
            best, best_rank = cand, rank
    assert best is not None
    return best


def test_greedy_matches_the_exhaustive_optimum_for_every_free_set_and_size() -> None:
    """All 2^8 free sets x sizes 1..8: the myopic choice has the best achievable link score."""
    node = dgx1_node()
    links = node.links()
    scores = reference_pair_scores()
    checked = 0
    for mask in range(1 << 8):
        free = [i for i in range(8) if mask >> i & 1]
        for k in range(1, 9):
            got = greedy_gpu_set(links, free, k)
            if k > len(free):
                assert got is None
                continue
            assert got is not None and len(set(got)) == k and set(got) <= set(free)
            score = sum(scores[a][b] for a, b in itertools.combinations(got, 2))
            assert score == exhaustive_optimum(scores, free, k), (free, k, got)
            checked += 1
    assert checked == 8 * 2**7  # sum over the free sets of their size


def test_lookahead_matches_the_brute_force_ranking_for_every_free_set_and_size() -> None:
    """All 2^8 free sets x sizes 1..8: best_gpu_set is the documented ranking's first set, computed
    here by enumerating partitions (the code under test uses bitmask dynamic programming)."""
    links = dgx1_node().links()
    scores = reference_pair_scores()
    for mask in range(1 << 8):
        free = [i for i in range(8) if mask >> i & 1]
        for k in range(1, len(free) + 1):
            got = best_gpu_set(links, free, k)
            assert got == reference_choice(free, k), (free, k)
            # never worse than go-gpuallocator's own criterion: the best partition score of the free set
            total = sum(scores[a][b] for a, b in itertools.combinations(got, 2))
            rest = tuple(g for g in free if g not in got)
            split = max(
                sum(sum(scores[a][b] for a, b in itertools.combinations(g, 2)) for g in p)
                for p in reference_partitions(rest, k)
            ) if k > 1 and rest else 0
            best = max(
                sum(sum(scores[a][b] for a, b in itertools.combinations(g, 2)) for g in p)
                for p in reference_partitions(tuple(free), k)
            ) if k > 1 else 0
            assert total + split == best, (free, k, got)


def test_known_answers() -> None:
    links = dgx1_node().links()
    assert best_gpu_set(links, range(8), 4) == (0, 1, 2, 3)  # ties go to the lowest indices
    assert best_gpu_set(links, [0, 1, 3], 2) == (0, 3)  # two NVLinks beat one
    assert best_gpu_set(links, range(8), 8) == tuple(range(8))
    # the cases: {4,5} leaves {0,2} (one NVLink) rather than taking {0,4} and leaving {2,5}
    assert best_gpu_set(links, [0, 2, 4, 5], 2) == (4, 5)
    assert greedy_gpu_set(links, [0, 2, 4, 5], 2) == (0, 4)
    free, got = set(range(8)), []
    for _ in range(4):
        pair_ = best_gpu_set(links, free, 2)
        assert pair_ is not None
        got.append(pair_)
        free -= set(pair_)
    assert got == [(0, 3), (1, 2), (4, 7), (5, 6)]  # four same-socket pairs, none across the sockets


@pytest.mark.parametrize("choose", [best_gpu_set, greedy_gpu_set])
def test_equal_candidates_go_to_the_lowest_indices(choose) -> None:
    """An idle machine is symmetric: every size must come from the lowest indices (not, e.g., 4..7)."""
    for machine in ("dgx1-v100", "hgx-h100", "dgx-a100"):
        links = shipped_links(machine)
        assert choose(links, range(8), 4) == (0, 1, 2, 3), machine
        assert choose(links, range(8), 1) == (0,), machine
    hgx = shipped_links("hgx-h100")
    assert choose(hgx, range(8), 2) == (0, 1)
    assert choose(hgx, [1, 2, 5, 6], 2) == (1, 2)


def test_must_include() -> None:
    links = dgx1_node().links()
    assert best_gpu_set(links, range(8), 2, must=[4]) == (4, 7)
    assert best_gpu_set(links, range(8), 4, must=[4]) == (4, 5, 6, 7)
    assert best_gpu_set(links, range(8), 4, must=[0, 2, 4, 6]) == (0, 2, 4, 6)
    assert best_gpu_set(links, range(1, 8), 4, must=[0]) is None  # a required GPU that is not free
    assert best_gpu_set(links, range(8), 2, must=[1, 2, 3]) is None  # more required than asked for
    assert greedy_gpu_set(links, range(8), 2, must=[5]) == (5, 6)
    need = TopologyWish(nvlink=Wish.REQUIRE)
    assert best_gpu_set(links, range(8), 2, need, must=[0]) == (0, 3)
    assert best_gpu_set(links, [0, 5, 6], 2, need, must=[0]) is None  # 0 has no NVLink to 5 or 6
    flat = LinkMatrix([f"g{i}" for i in range(4)], [-1] * 4, Topology())
    assert best_gpu_set(flat, range(4), 2, must=[3]) == (0, 3)
    assert best_gpu_set(flat, range(4), 0) == ()


def test_lookahead_keeps_nvlink_pairs_for_later_pods() -> None:
    """RTX 8000-like node (NVLink bridges on (0,3) and (1,2)): two 1-GPU pods take a bridged pair,
    so a 2-GPU pod still gets a bridge; the myopic rule on index order breaks both bridges."""
    links = rtx_like().links()
    free = {0, 1, 2, 3}
    for _ in range(2):
        (g,) = best_gpu_set(links, free, 1)
        free.discard(g)
    assert free in ({0, 3}, {1, 2})


def test_local_search_serves_large_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """32 GPUs (four DGX-1 boards joined across the sockets): 4 of 32 is 35,960 candidate sets, more
    than the exhaustive limit, so the greedy + swap search runs; it must still find a whole quad."""
    from scheduler.core import topology

    doc = json.loads(DGX1.read_text())
    n = 32
    ids = [f"big-gpu{i}" for i in range(n)]
    nvlinks, pcie = {}, {}
    for i, j in itertools.combinations(range(n), 2):
        if i // 8 == j // 8:
            count = doc["nvlink"][i % 8][j % 8]
            if count:
                nvlinks[pair(ids[i], ids[j])] = count
            pcie[pair(ids[i], ids[j])] = PCIeRelation.parse(doc["pcie"][i % 8][j % 8])
        else:
            pcie[pair(ids[i], ids[j])] = PCIeRelation.SYS
    links = LinkMatrix(ids, [i // 4 for i in range(n)], Topology(nvlinks, pcie))
    calls = []
    real = topology._local_search

    def spy(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(topology, "_local_search", spy)
    assert best_gpu_set(links, range(n), 4) == (0, 1, 2, 3)
    assert calls == [4]
    busy = {0, 9, 18, 27}  # one GPU taken on each board: no whole quad on 0..3, 8..11, 16..19, 24..27
    got = best_gpu_set(links, [g for g in range(n) if g not in busy], 4)
    assert got == (4, 5, 6, 7)
    assert len(calls) == 2
    # 5 GPUs with GPU 13: 31,465 candidates, still local search; the result is the exhaustive optimum
    got = best_gpu_set(links, range(n), 5, must=[13])
    assert len(calls) == 3 and got is not None and 13 in got
    best = max(links.set_score((13, *c)) for c in itertools.combinations([g for g in range(n) if g != 13], 4))
    assert links.set_score(got) == best


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


def test_a_node_rebuilt_from_the_same_inventory_finds_its_matrix_without_building_one(monkeypatch) -> None:
    """A live cache rebuilds every node after any node change: a node built again from the inventory
    object it was built from gets its matrix back without the pairwise work; an equal inventory parsed
    anew builds one to compare, and still shares the first; other GPU ids build their own lookup."""
    inventory = load_machine(DGX1, prefix="dgx-gpu")
    first = NodeState.from_inventory("dgx", 80_000, 512_000, inventory).links()
    built: list[int] = []
    build = LinkMatrix.__init__

    def counted(self, *args) -> None:
        built.append(1)
        build(self, *args)

    monkeypatch.setattr(LinkMatrix, "__init__", counted)
    assert NodeState.from_inventory("dgx", 80_000, 512_000, inventory).links() is first
    assert built == []
    parsed = load_machine(DGX1, prefix="dgx-gpu")
    assert parsed.topology is not inventory.topology
    assert NodeState.from_inventory("dgx", 80_000, 512_000, parsed).links() is first
    assert len(built) == 1
    assert NodeState.from_inventory("dgx", 80_000, 512_000, parsed).links() is first
    assert len(built) == 1
    other = NodeState.from_inventory("other", 80_000, 512_000, load_machine(DGX1, prefix="other-gpu"))
    assert other.links() is first  # identical links: one matrix (and one memo)
    assert len(built) == 2


def test_the_lookup_by_topology_object_lets_a_dead_inventory_go() -> None:
    """The per-object lookup holds no inventory alive: once a node's inventory is gone (replaced by
    an update), so is its entry, and a new object at the same address cannot find the old matrix."""
    import gc

    from scheduler.core import topology

    inventory = load_machine(DGX1, prefix="dgx-gpu")
    node = NodeState.from_inventory("dgx", 80_000, 512_000, inventory)
    node.links()
    assert len(topology._BY_TOPOLOGY) == 1
    del node, inventory
    gc.collect()
    assert topology._BY_TOPOLOGY == {}


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
    assert single.allocation.gpus  # pods of fewer than 2 GPUs: fgd-reserve decides


def test_topology_score_never_exceeds_its_scale() -> None:
    """The reference is the best-connected set of the idle machine, not the look-ahead's choice (which
    on an idle DGX-1 takes a 230 pair while a 250 pair exists): no node scores above 100 + wishes."""
    from scheduler.core.policies import TopologyScore

    nodes = [dgx1_node(f"d{i}") for i in range(3)]
    cluster = ClusterState(nodes)
    cluster.assume(Allocation("d1", "a", gpus=(GpuGrant(0, "d1-gpu0"), GpuGrant(1, "d1-gpu1"))))
    cluster.assume(Allocation("d2", "b", gpus=tuple(GpuGrant(i, f"d2-gpu{i}") for i in (0, 1, 4, 5))))
    plugin = TopologyScore()
    plugin.bind(cluster, [], random.Random(0))
    got = plugin.score(PodRequest("p", gpu_count=2), cluster, cluster.all_indices).tolist()
    # idle: (0,3) = 230 of 250; d1 ({2..7} free): (2,3) = 250; d2 ({2,3,6,7} free): (2,3) = 250
    assert got == [92.0, 100.0, 100.0]


@pytest.mark.parametrize("choose", [best_gpu_set, greedy_gpu_set, gpuallocator_gpu_set])
def test_odd_requests_get_no_set_or_a_clear_error(choose) -> None:
    """Requests no caller should make still get a defined answer: 0 GPUs the empty set, a negative
    or larger-than-the-machine count none, an index outside the machine a ValueError naming it."""
    links = dgx1_node().links()
    assert choose(links, range(8), 0) == ()
    assert choose(links, range(8), 0, must=[1]) is None
    assert choose(links, range(8), -1) is None
    assert choose(links, range(8), 9) is None
    assert choose(links, range(8), 8) == tuple(range(8))
    assert choose(links, [0, 0, 3], 2) == (0, 3)  # repeated indices count once
    assert choose(links, range(8), 2, must=[0, 0]) == choose(links, range(8), 2, must=[0])
    assert choose(links, range(8), 2, must=[99]) is None  # an absent GPU
    assert choose(links, range(8), 2, must=[-1]) is None
    for stray in ([0, 8], [-1, 0]):
        with pytest.raises(ValueError, match=r"not GPUs of this machine \(0..7\)"):
            choose(links, stray, 2)


@pytest.mark.parametrize("choose", [best_gpu_set, greedy_gpu_set, gpuallocator_gpu_set])
def test_must_include_an_unhealthy_gpu_gets_no_set(choose) -> None:
    """An unhealthy GPU is never free, so a pod that must have it gets nothing on that node."""
    node = dgx1_node()
    node.gpus[4].healthy = False
    free = node.free_gpu_indices()
    assert 4 not in free
    assert choose(node.links(), free, 2, must=[4]) is None
    assert choose(node.links(), free, 2, must=[5]) is not None


def test_choices_do_not_depend_on_the_order_free_gpus_are_given_in() -> None:
    links = dgx1_node().links()
    rng = random.Random(7)
    for _ in range(200):
        free = rng.sample(range(8), rng.randint(1, 8))
        k = rng.randint(1, len(free))
        shuffled = free[:]
        rng.shuffle(shuffled)
        for choose in (best_gpu_set, greedy_gpu_set, gpuallocator_gpu_set):
            assert choose(links, free, k) == choose(links, shuffled, k)
