"""Preemption at its edges: the exact search up to EXACT_EXTRAS candidates against the greedy
beyond, the greedy's give-back order, shares stacked on one GPU, memory boundaries, model
restrictions, PDBs by default, and a node where nothing needs evicting."""

from __future__ import annotations

import math

from scheduler.core import PodRequest
from scheduler.core.preempt import (
    EXACT_EXTRAS,
    Budget,
    GpuSlot,
    NodeOffer,
    RunningPod,
    Victims,
    choose,
    pick_candidate,
    select_victims,
)
from scheduler.core.selectors import parse_label_selector


def cpu_node(pods: list[RunningPod], cpu: int, **kw) -> NodeOffer:
    return NodeOffer("n", cpu, 64_000, (), tuple(pods), **kw)


def uids(victims: Victims | None) -> set[str]:
    assert victims is not None
    return {p.uid for p in victims.pods}


def test_up_to_exact_extras_candidates_the_cheapest_set_is_found() -> None:
    """Exactly EXACT_EXTRAS pods could free CPU: every subset is tried. 1000 m must be freed; one
    pod of 1000 m (c, oldest) costs less (one victim) than a and b (600 m each, newest), which is
    what the least-important-first greedy would take."""
    assert EXACT_EXTRAS == 8
    pods = [
        RunningPod("a", priority=1, start_time=30.0, cpu_milli=600),
        RunningPod("b", priority=1, start_time=20.0, cpu_milli=600),
        RunningPod("c", priority=1, start_time=10.0, cpu_milli=1000),
    ]
    pods += [RunningPod(f"f{k}", priority=1, start_time=float(k), cpu_milli=1) for k in range(5)]
    used = sum(p.cpu_milli for p in pods)
    offer = cpu_node(pods, cpu=4000)
    pod = PodRequest("t", cpu_milli=4000 - used + 1000)
    assert uids(select_victims(pod, 10, offer)) == {"c"}


def test_beyond_exact_extras_the_greedy_gives_back_the_most_important_first() -> None:
    """Nine candidates: the greedy. 1000 m to free; least important first it takes a (400), b (500)
    and c (700); giving back the most important first, c stays (900 without it), b goes back
    (1100 without it still fits), a stays: {a, c}. (Giving back the least important first would
    keep {b, c}.) The six fillers are more important and never taken."""
    pods = [
        RunningPod("a", priority=1, cpu_milli=400),
        RunningPod("b", priority=2, cpu_milli=500),
        RunningPod("c", priority=3, cpu_milli=700),
    ]
    pods += [RunningPod(f"f{k}", priority=5, cpu_milli=1) for k in range(6)]
    used = sum(p.cpu_milli for p in pods)
    offer = cpu_node(pods, cpu=8000)
    pod = PodRequest("t", cpu_milli=8000 - used + 1000)
    assert uids(select_victims(pod, 10, offer)) == {"a", "c"}


def test_the_greedy_takes_pdb_protected_pods_last_when_budgets_are_soft() -> None:
    """Without pdb_hard a protected pod may be evicted, but only after every unprotected one."""
    pods = [
        RunningPod("a", namespace="db", labels={"app": "db"}, priority=1, cpu_milli=400),
        RunningPod("b", priority=2, cpu_milli=500),
        RunningPod("c", priority=3, cpu_milli=700),
    ]
    pods += [RunningPod(f"f{k}", priority=5, cpu_milli=1) for k in range(6)]
    used = sum(p.cpu_milli for p in pods)
    budget = Budget("db", parse_label_selector({"matchLabels": {"app": "db"}}), 0)
    offer = cpu_node(pods, cpu=8000)
    pod = PodRequest("t", cpu_milli=8000 - used + 1000)
    victims = select_victims(pod, 10, offer, [budget], pdb_hard=False)
    assert uids(victims) == {"b", "c"} and victims is not None and victims.pdb_violations == 0
    # by default budgets are hard: choose() never takes the protected pod either
    need_a = PodRequest("t", cpu_milli=8000 - used + 1600)  # a, b and c (1600) must all go
    assert select_victims(need_a, 10, offer, [budget]) is None
    assert choose(need_a, 10, [offer], [budget]) is None
    assert uids(choose(need_a, 10, [offer], [budget], pdb_hard=False)) == {"a", "b", "c"}


def slot(i: int, model: str = "A100", memory: int = 40_960) -> GpuSlot:
    return GpuSlot(f"g{i}", model, memory)


def test_shares_stacked_on_one_gpu_add_up() -> None:
    """GPU g0 holds a high-priority share (300) and two low ones (300 each): 100 m free. A 500 m
    share needs both low ones gone (one frees only 400)."""
    pods = [
        RunningPod("high", priority=9, gpus={"g0": (300, 0)}),
        RunningPod("low1", priority=1, gpus={"g0": (300, 0)}),
        RunningPod("low2", priority=1, gpus={"g0": (300, 0)}),
    ]
    offer = NodeOffer("n", 8000, 64_000, (GpuSlot("g0"),), tuple(pods))
    assert uids(select_victims(PodRequest("s", gpu_count=1, gpu_milli=500), 5, offer)) == {"low1", "low2"}
    assert uids(select_victims(PodRequest("s", gpu_count=1, gpu_milli=100), 5, offer)) == set()


def test_shares_by_memory_need_the_gpus_memory() -> None:
    """g0 (40 GiB) holds two low shares of 100 m but 15 GiB each: a 15 GiB share (375 m by
    compute) fits after one leaves, not before (10 GiB free); g0 offers no more memory than it has."""
    pods = [
        RunningPod("m1", priority=1, start_time=1.0, gpus={"g0": (100, 15_360)}),
        RunningPod("m2", priority=1, start_time=2.0, gpus={"g0": (100, 15_360)}),
    ]
    offer = NodeOffer("n", 8000, 64_000, (slot(0),), tuple(pods))
    ask = PodRequest("s", gpu_count=1, gpu_memory_mib=15_360)
    assert uids(select_victims(ask, 5, offer)) == {"m2"}  # the newer of two equals
    assert uids(select_victims(PodRequest("s", gpu_count=1, gpu_memory_mib=10_240), 5, offer)) == set()
    too_big = PodRequest("s", gpu_count=1, gpu_memory_mib=40_961)
    assert select_victims(too_big, 5, offer) is None


def test_memory_that_exactly_fits_is_enough() -> None:
    pods = [RunningPod("m", priority=1, memory_mib=1000), RunningPod("keep", priority=9, memory_mib=3000)]
    offer = NodeOffer("n", 8000, 4000, (), tuple(pods))
    assert uids(select_victims(PodRequest("t", memory_mib=1000), 5, offer)) == {"m"}
    assert select_victims(PodRequest("t", memory_mib=1001), 5, offer) is None


def test_a_pod_restricted_to_a_model_preempts_on_that_model() -> None:
    pods = [
        RunningPod("on-h100", priority=1, gpus={"g0": (1000, 0)}),
        RunningPod("on-a100", priority=1, gpus={"g1": (1000, 0)}),
    ]
    offer = NodeOffer("n", 8000, 64_000, (slot(0, "H100"), slot(1, "A100")), tuple(pods))
    h100 = PodRequest("t", gpu_count=1, gpu_models=frozenset({"H100"}))
    assert uids(select_victims(h100, 5, offer)) == {"on-h100"}


def test_a_pod_that_fits_already_names_the_node() -> None:
    offer = NodeOffer("node-7", 8000, 64_000, (slot(0),), ())
    victims = select_victims(PodRequest("t", gpu_count=1), 5, offer)
    assert victims == Victims("node-7", ())


def test_no_victims_beat_any_victims_even_of_negative_priority() -> None:
    negative = Victims("a", (RunningPod("x", priority=-100, start_time=1.0),))
    assert pick_candidate([negative, Victims("b", ())]).node == "b"
    assert pick_candidate([Victims("b", ()), negative]).node == "b"
    assert negative.cost() > Victims("b", ()).cost()
    assert Victims("b", ()).cost()[1] < -(1 << 31) and Victims("b", ()).cost()[-1] == -math.inf
