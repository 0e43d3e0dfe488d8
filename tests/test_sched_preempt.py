"""Preemption: eligibility, the cheapest victims whose devices make a valid set, PDBs, node choice."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from scheduler.core import GpuState, PodRequest, TopologyWish, Wish
from scheduler.core.preempt import (
    PREEMPT_LOWER,
    PREEMPT_NEVER,
    PRIORITY_OFFSET,
    Budget,
    GpuSlot,
    NodeOffer,
    RunningPod,
    Victims,
    choose,
    cost_key,
    eligible,
    pdb_violations,
    pick_candidate,
    select_victims,
    share_need,
)
from scheduler.core.selectors import EVERYTHING, NOTHING, parse_label_selector
from scheduler.core.topology import LinkMatrix, best_gpu_set, load_machine

DGX1 = Path(__file__).resolve().parent.parent / "scheduler" / "data" / "topologies" / "dgx1-v100.json"
NVLINK4 = PodRequest("train", uid="train", gpu_count=4, topology=TopologyWish(nvlink=Wish.REQUIRE))


def dgx1(
    pods: list[RunningPod],
    cpu: int = 64_000,
    memory: int = 512_000,
    max_pods: int | None = None,
    gpu_resource: int | None = None,
) -> NodeOffer:
    inventory = load_machine(DGX1, prefix="g")
    gpus = sorted(inventory.devices, key=lambda d: d.index)
    slots = tuple(GpuSlot(d.id, d.model, d.memory_mib) for d in gpus)
    links = LinkMatrix.shared([d.id for d in gpus], [d.numa_node for d in gpus], inventory.topology)
    return NodeOffer("dgx", cpu, memory, slots, tuple(pods), links, max_pods, gpu_resource)


def holding(uid: str, gpus: list[int], priority: int = 0, start: float = 100.0, **kw) -> RunningPod:
    return RunningPod(
        uid,
        f"default/{uid}",
        priority=priority,
        start_time=start,
        gpus={f"g{i}": (1000, 16384) for i in gpus},
        **kw,
    )


def uids(victims: Victims | None) -> set[str]:
    assert victims is not None
    return {p.uid for p in victims.pods}


def freed(offer: NodeOffer, victims: Victims) -> set[int]:
    """GPU indices nobody holds once the victims are gone."""
    gone = {p.uid for p in victims.pods}
    held = {gid for p in offer.pods if p.uid not in gone for gid in p.gpus}
    return {i for i, g in enumerate(offer.gpus) if g.id not in held}


# -- eligibility --------------------------------------------------------------------------------


def test_preemption_policy_never_and_terminating_victims() -> None:
    assert eligible(PREEMPT_LOWER) == (True, "")
    assert eligible(PREEMPT_NEVER) == (False, "not eligible due to preemptionPolicy=Never.")
    leaving = RunningPod("v", priority=1, terminating=True)
    assert eligible(PREEMPT_LOWER, [leaving], priority=5) == (
        False,
        "not eligible due to a terminating pod on the nominated node.",
    )
    # a terminating pod of equal or higher priority is no victim of ours: no reason to wait
    assert eligible(PREEMPT_LOWER, [leaving], priority=1) == (True, "")
    assert eligible(PREEMPT_LOWER, [RunningPod("v", priority=1)], priority=5) == (True, "")


# -- victims of whole-GPU pods ------------------------------------------------------------------


def test_victims_free_a_valid_nvlink_quad_not_just_four_gpus() -> None:
    """Evicting the two priority-1 pods frees GPUs 0, 3, 4, 7: four GPUs, but 0-7 have no NVLink.
    A valid quad needs one priority-1 pod and one priority-2 pod."""
    offer = dgx1(
        [
            holding("a", [0], priority=1),
            holding("b", [4], priority=1),
            holding("c", [1, 2], priority=2),
            holding("d", [5, 6], priority=2),
        ]
    )
    victims = select_victims(NVLINK4, 10, offer)
    assert victims is not None and len(victims.pods) == 2
    assert uids(victims) in ({"a", "c"}, {"b", "d"})
    assert offer.links is not None
    assert best_gpu_set(offer.links, sorted(freed(offer, victims)), 4, NVLINK4.topology) is not None
    assert best_gpu_set(offer.links, [0, 3, 4, 7], 4, NVLINK4.topology) is None  # the naive choice
    assert [p.priority for p in victims.pods] == [2, 1]  # most important first
    assert victims.pdb_violations == 0


def test_fewest_victims_where_kube_reprieve_would_take_four() -> None:
    """The oldest pod holds GPUs 4-7, four newer pods of the same priority one GPU each of 0-3.
    kube-scheduler's reprieve keeps the oldest pod and evicts the four; one victim suffices."""
    pods = [holding("big", [4, 5, 6, 7], priority=1, start=1.0)]
    pods += [holding(f"s{i}", [i], priority=1, start=50.0 + i) for i in range(4)]
    offer = dgx1(pods)
    assert uids(select_victims(NVLINK4, 10, offer)) == {"big"}


def test_lowest_priority_before_fewest() -> None:
    pods = [holding("big", [4, 5, 6, 7], priority=3)]
    pods += [holding(f"s{i}", [i], priority=1) for i in range(4)]
    assert uids(select_victims(NVLINK4, 10, dgx1(pods))) == {"s0", "s1", "s2", "s3"}


def test_equal_and_higher_priority_pods_are_never_victims() -> None:
    pods = [holding("peer", [0, 1, 2, 3], priority=10), holding("boss", [4, 5, 6, 7], priority=20)]
    assert select_victims(NVLINK4, 10, dgx1(pods)) is None
    pods = [holding("peer", [0, 1, 2, 3], priority=10), holding("low", [4, 5], priority=1)]
    pods.append(holding("boss", [6], priority=20))
    assert select_victims(NVLINK4, 10, dgx1(pods)) is None  # freeing 4, 5 leaves no quad
    pods[-1] = holding("low2", [6], priority=1)
    assert uids(select_victims(NVLINK4, 10, dgx1(pods))) == {"low", "low2"}


def test_fits_already_gives_empty_victims() -> None:
    victims = select_victims(NVLINK4, 10, dgx1([holding("x", [0], priority=1)]))
    assert victims is not None and victims.pods == ()


def test_unhealthy_and_wrong_model_gpus_do_not_count() -> None:
    offer = dgx1([holding("a", [0, 1, 2, 3], priority=1), holding("b", [4, 5, 6, 7], priority=2)])
    sick = tuple(GpuSlot(g.id, g.model, g.memory_mib, healthy=(i != 0)) for i, g in enumerate(offer.gpus))
    offer_sick = NodeOffer(offer.name, offer.cpu_milli, offer.memory_mib, sick, offer.pods, offer.links)
    assert uids(select_victims(NVLINK4, 10, offer)) == {"a"}
    assert uids(select_victims(NVLINK4, 10, offer_sick)) == {"b"}
    other_model = PodRequest("t", gpu_count=1, gpu_models=frozenset({"H100"}))
    assert select_victims(other_model, 10, offer) is None


def test_cpu_memory_and_pod_count_add_victims() -> None:
    pods = [
        holding("gpu-low", [0], priority=1, cpu_milli=1000),
        RunningPod("cpu-hog", priority=2, cpu_milli=60_000),
        RunningPod("cpu-small", priority=1, cpu_milli=2000),
    ]
    offer = dgx1(pods, cpu=64_000)
    one_gpu = PodRequest("t", gpu_count=8, cpu_milli=4000)
    # all eight GPUs: gpu-low must go; then 61000 + 4000 > 64000: one more must go, the
    # cheapest that is enough: cpu-small (priority 1) frees 2000 -> 59000 + 4000 fits
    assert uids(select_victims(one_gpu, 10, offer)) == {"gpu-low", "cpu-small"}
    big_cpu = PodRequest("t", gpu_count=8, cpu_milli=10_000)
    assert uids(select_victims(big_cpu, 10, offer)) == {"gpu-low", "cpu-hog"}
    limited = dgx1([RunningPod("p1", priority=1), RunningPod("p2", priority=2)], max_pods=2)
    assert uids(select_victims(PodRequest("t", cpu_milli=1), 10, limited)) == {"p1"}
    assert select_victims(PodRequest("t", cpu_milli=1), 1, limited) is None
    mem = dgx1([RunningPod("m", priority=1, memory_mib=500_000)], memory=512_000)
    assert uids(select_victims(PodRequest("t", memory_mib=20_000), 10, mem)) == {"m"}


def test_a_node_that_allows_no_pods_is_never_worth_a_preemption() -> None:
    """status.allocatable.pods 0 admits no pod (as the kubelet does), however many are evicted;
    only an unpublished limit (None) is no limit."""
    pods = [holding("low", [0, 1], priority=1)]
    assert select_victims(PodRequest("t", gpu_count=8), 10, dgx1(pods, max_pods=0)) is None
    assert uids(select_victims(PodRequest("t", gpu_count=8), 10, dgx1(pods, max_pods=None))) == {"low"}


def test_a_pod_asking_no_cpu_preempts_on_an_over_committed_node() -> None:
    """As NodeState.check does: CPU and memory are checked only when the pod asks for them, so
    a GPU-only pod on a node whose bound pods over-commit CPU and memory evicts only for GPUs."""
    pods = [
        holding("gpu-low", [0, 1, 2, 3, 4, 5, 6, 7], priority=1),
        RunningPod("hog", priority=2, cpu_milli=80_000, memory_mib=600_000),
    ]
    offer = dgx1(pods, cpu=64_000, memory=512_000)
    assert uids(select_victims(PodRequest("t", gpu_count=1), 10, offer)) == {"gpu-low"}
    # asking CPU, it needs the hog gone too
    assert uids(select_victims(PodRequest("t", gpu_count=1, cpu_milli=1000), 10, offer)) == {"gpu-low", "hog"}


def test_the_kubelets_gpu_count_is_honoured() -> None:
    """A default-scheduler pod is charged 4 of the node's 8 nvidia.com/gpu without holding GPUs
    the scheduler can name; with 4 more held by id, no GPU is left to count even though GPUs 4-7
    are free by id. Evicting either pod frees the count."""
    pods = [holding("known", [0, 1, 2, 3], priority=5), RunningPod("other", priority=1, charged_gpus=4)]
    offer = dgx1(pods, gpu_resource=8)
    two = PodRequest("t", gpu_count=2)
    assert uids(select_victims(two, 10, offer)) == {"other"}
    pods = [holding("known", [0, 1, 2, 3], priority=1), RunningPod("other", priority=5, charged_gpus=4)]
    assert uids(select_victims(two, 10, dgx1(pods, gpu_resource=8))) == {"known"}
    assert uids(select_victims(two, 10, dgx1(pods))) == set()  # no count to honour: GPUs 4-7 are free
    assert uids(select_victims(two, 10, dgx1(pods, gpu_resource=10))) == set()  # 4 + 4 + 2 <= 10
    assert uids(select_victims(two, 10, dgx1(pods, gpu_resource=9))) == {"known"}
    # shares are charged nothing, whole GPUs held by id one each
    assert RunningPod("s", gpus={"g0": (500, 0)}).charge == 0
    assert (
        holding("w", [0, 1]).charge == 2
        and RunningPod("o", charged_gpus=3, gpus={"g0": (1000, 0)}).charge == 3
    )


def test_other_rules_are_asked() -> None:
    pods = [holding("a", [0], priority=1), holding("b", [1], priority=1)]
    offer = dgx1(pods + [holding(f"x{i}", [i], priority=9) for i in range(2, 8)])
    one = PodRequest("t", gpu_count=1)
    assert len(uids(select_victims(one, 10, offer))) == 1
    # only evicting b satisfies the other rules (say, b's anti-affinity keeps the pod away)
    assert uids(select_victims(one, 10, offer, fits_other=lambda gone: "b" in gone)) == {"b"}
    assert select_victims(one, 10, offer, fits_other=lambda gone: False) is None


# -- shares -------------------------------------------------------------------------------------


def share(uid: str, gpu: int, milli: int, priority: int, start: float = 100.0) -> RunningPod:
    return RunningPod(
        uid,
        f"default/{uid}",
        priority=priority,
        start_time=start,
        gpus={f"g{gpu}": (milli, 16384 * milli // 1000)},
    )


def test_share_evicts_the_cheapest_shares_on_one_gpu() -> None:
    pods = [holding(f"w{i}", [i], priority=9) for i in range(2, 8)]
    pods += [share("a", 0, 600, 1), share("b", 0, 300, 1), share("c", 1, 500, 2), share("d", 1, 400, 1)]
    offer = dgx1(pods)
    half = PodRequest("s", gpu_count=1, gpu_milli=500)
    # GPU 0 needs a (600) out; GPU 1 needs c (priority 2) or d (400 -> 500+500 fits? 1000-500=500 ok)
    victims = select_victims(half, 10, offer)
    assert uids(victims) in ({"a"}, {"d"})
    small = PodRequest("s", gpu_count=1, gpu_milli=100)
    assert uids(select_victims(small, 10, offer)) == set()  # 100 milli are free on GPUs 0 and 1
    two = select_victims(PodRequest("s", gpu_count=1, gpu_milli=200), 10, offer)
    assert two is not None and len(two.pods) == 1 and two.pods[0].priority == 1
    big = PodRequest("s", gpu_count=1, gpu_milli=900)
    assert uids(select_victims(big, 10, offer)) == {"a", "b"}


def test_share_by_memory() -> None:
    pods = [holding(f"w{i}", [i], priority=9) for i in range(1, 8)]
    pods.append(share("a", 0, 500, 1))
    by_memory = PodRequest("s", gpu_count=1, gpu_memory_mib=10_000)  # 611 milli of a 16 GiB GPU
    assert uids(select_victims(by_memory, 10, dgx1(pods))) == {"a"}
    fits = PodRequest("s", gpu_count=1, gpu_memory_mib=8000)
    assert uids(select_victims(fits, 10, dgx1(pods))) == set()


def test_enforced_shares_only_on_enforcing_gpus() -> None:
    pods = [holding(f"w{i}", [i], priority=9) for i in range(2, 8)]
    pods += [share("a", 0, 800, 1), share("b", 1, 800, 2)]
    offer = dgx1(pods)
    gpus = tuple(
        GpuSlot(g.id, g.model, g.memory_mib, share_enforced=(i == 1)) for i, g in enumerate(offer.gpus)
    )
    enforcing = NodeOffer(offer.name, offer.cpu_milli, offer.memory_mib, gpus, offer.pods, offer.links)
    plain = PodRequest("s", gpu_count=1, gpu_milli=500)
    enforced = PodRequest("s", gpu_count=1, gpu_milli=500, enforced_share=True)
    assert uids(select_victims(plain, 10, enforcing)) == {"a"}  # the cheaper share, on GPU 0
    assert uids(select_victims(enforced, 10, enforcing)) == {"b"}  # only GPU 1 enforces shares
    assert select_victims(enforced, 10, offer) is None


@pytest.mark.parametrize("memory", [0, 16384, 40960])
@pytest.mark.parametrize(("milli", "mem_ask"), [(300, 0), (0, 5000), (0, 50_000), (250, 4000), (999, 0)])
def test_share_need_is_the_cores_rule(memory: int, milli: int, mem_ask: int) -> None:
    pod = PodRequest("s", gpu_count=1, gpu_milli=milli, gpu_memory_mib=mem_ask)
    assert share_need(pod, GpuSlot("g", "", memory)) == GpuState(0, "g", "", memory).share_for(pod)


# -- PodDisruptionBudgets -----------------------------------------------------------------------


def labelled(uid: str, gpus: list[int], priority: int, app: str) -> RunningPod:
    return RunningPod(
        uid, f"default/{uid}", labels={"app": app}, priority=priority, gpus={f"g{i}": (1000, 0) for i in gpus}
    )


def test_pdb_violations_counting() -> None:
    budget = Budget("default", parse_label_selector({"matchLabels": {"app": "db"}}), 1)
    pods = [labelled("db1", [], 5, "db"), labelled("db2", [], 1, "db"), labelled("web", [], 1, "web")]
    assert pdb_violations(pods, [budget]) == (1, {"db2"})  # the more important db1 uses the budget
    assert pdb_violations(pods[:1], [budget]) == (0, set())
    already = Budget("default", budget.selector, 0, frozenset({"db1"}))
    assert pdb_violations(pods[:1], [already]) == (0, set())  # counted by the API server already
    other_ns = Budget("other", budget.selector, 0)
    assert pdb_violations(pods, [other_ns]) == (0, set())
    everyone = Budget("default", EVERYTHING, 0)  # policy/v1: an empty selector covers the namespace
    assert pdb_violations(pods, [everyone])[0] == 3
    assert pdb_violations(pods, [Budget("default", NOTHING, 0)])[0] == 0


def test_pdb_protected_pods_are_not_evicted() -> None:
    db = parse_label_selector({"matchLabels": {"app": "db"}})
    pods = [labelled("db", [0, 1, 2, 3], 1, "db"), labelled("web", [4, 5, 6, 7], 2, "web")]
    offer = dgx1(pods)
    assert uids(select_victims(NVLINK4, 10, offer)) == {"db"}
    protected = [Budget("default", db, 0)]
    assert uids(select_victims(NVLINK4, 10, offer, protected)) == {"web"}
    soft = select_victims(NVLINK4, 10, offer, protected, pdb_hard=False)
    assert uids(soft) == {"web"} and soft is not None and soft.pdb_violations == 0
    both = [
        Budget("default", db, 0),
        Budget("default", parse_label_selector({"matchLabels": {"app": "web"}}), 0),
    ]
    assert select_victims(NVLINK4, 10, offer, both) is None
    forced = select_victims(NVLINK4, 10, offer, both, pdb_hard=False)
    assert forced is not None and uids(forced) == {"db"} and forced.pdb_violations == 1


def test_a_budget_of_one_allows_one_victim() -> None:
    db = parse_label_selector({"matchLabels": {"app": "db"}})
    pods = [labelled(f"db{i}", [i], 1, "db") for i in range(4)] + [labelled("web", [4, 5, 6, 7], 5, "web")]
    offer = dgx1(pods)
    assert uids(select_victims(NVLINK4, 10, offer)) == {"db0", "db1", "db2", "db3"}
    one = [Budget("default", db, 1)]
    assert uids(select_victims(NVLINK4, 10, offer, one)) == {"web"}
    assert (
        uids(
            select_victims(
                PodRequest("t", gpu_count=1), 10, dgx1(pods[:4] + [labelled("w", [4, 5, 6], 5, "web")]), one
            )
        )
        == set()
    )


# -- choosing the node --------------------------------------------------------------------------


def v(node: str, *pods: tuple[int, float], violations: int = 0) -> Victims:
    return Victims(
        node,
        tuple(RunningPod(f"{node}{i}", priority=p, start_time=t) for i, (p, t) in enumerate(pods)),
        violations,
    )


def test_pick_candidate_follows_kube_schedulers_order() -> None:
    assert pick_candidate([]) is None
    assert pick_candidate([v("a", (1, 0), violations=1), v("b", (9, 0))]).node == "b"  # PDBs first
    assert pick_candidate([v("a", (5, 0)), v("b", (1, 0), (1, 0), (1, 0))]).node == "b"  # highest priority
    assert pick_candidate([v("a", (3, 0), (3, 0)), v("b", (3, 0), (1, 0))]).node == "b"  # sum of priorities
    assert pick_candidate([v("a", (3, 0), (3, 0)), v("b", (3, 0))]).node == "b"  # fewer victims
    assert pick_candidate([v("a", (3, 10), (1, 99)), v("b", (3, 20))]).node == "b"
    assert pick_candidate([v("a", (3, 10)), v("b", (3, 20))]).node == "b"  # started later
    assert pick_candidate([v("a", (3, 10), (3, 50)), v("b", (3, 20), (3, 30))]).node == "b"  # earliest of top
    assert pick_candidate([v("a", (3, 20)), v("b", (3, 20))]).node == "a"  # first given
    # sums are offset so that negative priorities do not favour more victims
    assert pick_candidate([v("a", (-5, 0), (-5, 0)), v("b", (-5, 0))]).node == "b"
    assert cost_key((), 0)[0] == 0 and PRIORITY_OFFSET == 2**31


# -- exhaustive search against brute force ------------------------------------------------------


def fits_after(pod: PodRequest, offer: NodeOffer, gone: set[str]) -> bool:
    """Whether ``pod`` fits ``offer`` once ``gone`` are evicted (written apart from the module)."""
    left = [p for p in offer.pods if p.uid not in gone]
    # CPU counts only when the pod asks for it (as the kubelet and kube-scheduler decide)
    if pod.cpu_milli and sum(p.cpu_milli for p in left) + pod.cpu_milli > offer.cpu_milli:
        return False
    used = {g.id: 0 for g in offer.gpus}
    for p in left:
        for gid, (milli, _memory) in p.gpus.items():
            used[gid] += milli
    if pod.is_share:
        return any(used[g.id] + pod.gpu_milli <= 1000 for g in offer.gpus)
    free = [i for i, g in enumerate(offer.gpus) if used[g.id] == 0]
    assert offer.links is not None
    return best_gpu_set(offer.links, free, pod.whole_gpus, pod.topology) is not None


def brute_force(pod: PodRequest, priority: int, offer: NodeOffer, budgets=(), hard=True) -> tuple | None:
    """The cheapest victim set over every subset of lower-priority pods (small nodes only)."""
    low = [p for p in offer.pods if p.priority < priority]
    best = None
    for r in range(len(low) + 1):
        for combo in itertools.combinations(low, r):
            if not fits_after(pod, offer, {p.uid for p in combo}):
                continue
            violations = pdb_violations(combo, budgets)[0]
            if hard and violations:
                continue
            key = cost_key(combo, violations)
            if best is None or key < best:
                best = key
    return best


def random_node(seed: int, cpu_pressure: bool) -> tuple[NodeOffer, list[Budget]]:
    rng = random.Random(seed)
    gpus = list(range(8))
    rng.shuffle(gpus)
    pods = []
    while gpus and len(pods) < 6:
        take = min(len(gpus), rng.choice([1, 1, 2, 2, 4]))
        held, gpus = gpus[:take], gpus[take:]
        cpu = rng.choice([1000, 8000, 20000]) if cpu_pressure else 0
        pods.append(
            RunningPod(
                f"p{len(pods)}",
                f"default/p{len(pods)}",
                labels={"app": rng.choice(["db", "web"])},
                priority=rng.choice([1, 2, 3, 9]),
                start_time=rng.random(),
                cpu_milli=cpu,
                gpus={f"g{i}": (1000, 0) for i in held},
            )
        )
    if gpus and rng.random() < 0.5:  # shares on one of the GPUs left
        gpu = gpus[0]
        for k in range(rng.randint(1, 3)):
            pods.append(share(f"s{k}", gpu, rng.choice([200, 300, 500]), rng.choice([1, 2, 9])))
    if cpu_pressure:
        for i in range(3):
            pods.append(
                RunningPod(
                    f"c{i}", priority=rng.choice([1, 2, 3, 9]), cpu_milli=rng.choice([4000, 10000, 16000])
                )
            )
    budgets = [Budget("default", parse_label_selector({"matchLabels": {"app": "db"}}), rng.choice([0, 1, 2]))]
    return dgx1(pods, cpu=64_000), budgets


REQUESTS = [
    PodRequest("t", gpu_count=4, topology=TopologyWish(nvlink=Wish.REQUIRE)),
    PodRequest("t", gpu_count=2, cpu_milli=20_000, topology=TopologyWish(nvlink=Wish.REQUIRE)),
    PodRequest("t", gpu_count=3),
    PodRequest("t", gpu_count=1),
    PodRequest("t", cpu_milli=30_000),
    PodRequest("t", gpu_count=1, gpu_milli=500, cpu_milli=10_000),
]


@pytest.mark.parametrize("cpu_pressure", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_optimal_on_random_dgx1_nodes(seed: int, cpu_pressure: bool) -> None:
    """Against every subset of the lower-priority pods: the same cost, PDBs hard or soft."""
    offer, budgets = random_node(seed, cpu_pressure)
    for pod in REQUESTS:
        for hard in (True, False):
            expected = brute_force(pod, 5, offer, budgets, hard)
            got = select_victims(pod, 5, offer, budgets, pdb_hard=hard)
            if expected is None:
                assert got is None
                continue
            assert got is not None and got.cost() == expected, (pod, hard, uids(got))
            assert all(p.priority < 5 for p in got.pods)
            assert fits_after(pod, offer, uids(got))
            assert got.pdb_violations == pdb_violations(got.pods, budgets)[0]


def test_large_nodes_fall_back_to_reprieve() -> None:
    """24 GPUs and 12 asked: C(24, 12) sets are too many to try; kube's reprieve still finds a
    valid, minimal set."""
    n = 24
    slots = tuple(GpuSlot(f"g{i}") for i in range(n))
    pods = tuple(holding(f"p{i}", [i], priority=1 + i % 3, start=float(i)) for i in range(n))
    offer = NodeOffer("big", 64_000, 64_000, slots, pods, None)
    assert math.comb(n, 12) > 20_000
    victims = select_victims(PodRequest("t", gpu_count=12), 10, offer)
    assert victims is not None and len(victims.pods) == 12
    assert sorted(p.priority for p in victims.pods) == [1] * 8 + [2] * 4  # the least important first


def test_choose_across_nodes() -> None:
    cheap = dgx1([holding("low", [0, 1, 2, 3], priority=1), holding("x", [4, 5, 6, 7], priority=20)])
    dear = dgx1([holding("mid", [0, 1, 2, 3], priority=5), holding("y", [4, 5, 6, 7], priority=20)])
    free = dgx1([holding("z", [0, 1, 2, 3], priority=20)])  # fits already: no candidate to preempt on
    offers = [
        NodeOffer("dear", dear.cpu_milli, dear.memory_mib, dear.gpus, dear.pods, dear.links),
        NodeOffer("cheap", cheap.cpu_milli, cheap.memory_mib, cheap.gpus, cheap.pods, cheap.links),
        NodeOffer("free", free.cpu_milli, free.memory_mib, free.gpus, free.pods, free.links),
    ]
    best = choose(NVLINK4, 10, offers)
    assert best is not None and best.node == "cheap" and uids(best) == {"low"}
    asked: list[str] = []

    def other_rules(node: str):
        asked.append(node)
        return (lambda gone: False) if node == "cheap" else None

    best = choose(NVLINK4, 10, offers, fits_other=other_rules)
    assert best is not None and best.node == "dear" and set(asked) == {"dear", "cheap", "free"}
    assert choose(NVLINK4, 1, offers) is None


def test_many_shares_on_one_gpu_take_the_greedy_path() -> None:
    """Eleven shares on GPU 0 (more than every subset is tried for): the least important are
    evicted until the pod fits, then the most important given back while it still fits."""
    pods = [holding(f"w{i}", [i], priority=9) for i in range(1, 8)]
    pods += [share(f"s{k}", 0, 90, priority=1 + k % 3, start=float(k)) for k in range(11)]  # 990 used
    offer = dgx1(pods)
    assert len([p for p in pods if p.uid.startswith("s")]) > 10
    victims = select_victims(PodRequest("t", gpu_count=1, gpu_milli=250), 10, offer)
    assert victims is not None
    # 240 more milli needed than the 10 free: three shares of 90; the lowest priority (1) ones,
    # newest first among equals: s9, s6, s3
    assert uids(victims) == {"s9", "s6", "s3"}
    assert select_victims(PodRequest("t", gpu_count=1, gpu_milli=250), 2, offer) is not None
    assert uids(select_victims(PodRequest("t", gpu_count=1, gpu_milli=250), 2, offer)) == {"s9", "s6", "s3"}
    assert select_victims(PodRequest("t", gpu_count=1, gpu_milli=999), 2, offer) is None  # priority-2+ stay


def test_many_cpu_pods_take_the_greedy_path_for_extras() -> None:
    """Nine CPU pods that could make room (more than every subset is tried for): the least
    important go first and the most important come back while the rest still fits."""
    pods = [RunningPod(f"c{k}", priority=1 + k // 3, start_time=float(k), cpu_milli=7000) for k in range(9)]
    offer = dgx1(pods, cpu=64_000)  # 63,000 used
    victims = select_victims(PodRequest("t", cpu_milli=15_000), 10, offer)
    assert victims is not None
    # 14,000 to free: two pods of priority 1; the newest two of c0..c2
    assert uids(victims) == {"c1", "c2"}
    assert uids(select_victims(PodRequest("t", cpu_milli=22_000), 10, offer)) == {"c0", "c1", "c2"}
