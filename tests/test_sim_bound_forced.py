"""The LP bound's forced pods (``forced_pods``): the pods every policy places because a host of theirs
is still empty enough when they arrive. Every policy does place them (checked on the built-in openb
sample and on small random clusters where CPU, memory and shares close nodes early), and forcing them
tightens the bound where the LP would otherwise leave out an early, badly packing pod."""

from __future__ import annotations

import random

import pytest

from scheduler.core import ClusterState, PodRequest
from scheduler.core.request import MILLI
from scheduler.sim.bound import allocation_bound, forced_pods, protocol_bounds
from scheduler.sim.protocol import arrivals, run_once
from scheduler.sim.trace import DEFAULT_NODES, DEFAULT_PODS, NodeSpec, load_nodes, load_pods


def share(name: str, milli: int, cpu: int = 1000) -> PodRequest:
    return PodRequest(name, uid=name, cpu_milli=cpu, memory_mib=100, gpu_count=1, gpu_milli=milli)


def whole(name: str, gpus: int, cpu: int = 1000) -> PodRequest:
    return PodRequest(name, uid=name, cpu_milli=cpu, memory_mib=100, gpu_count=gpus)


def test_an_early_share_is_forced_and_the_bound_counts_it() -> None:
    """One node of one GPU: a 600-milli share arrives first, then a whole-GPU pod. Left free, the LP
    takes the whole GPU (1000); every policy places the share (the node is empty), after which the
    whole pod fits nowhere: 600."""
    nodes = [NodeSpec("n", 8000, 8000, 1, "G")]
    order = [share("s", 600), whole("w", 1)]
    assert forced_pods(nodes, order) == [0]  # the share touched the only GPU: the whole pod may not fit
    assert allocation_bound(nodes, order).bound_milli == pytest.approx(1000, abs=1e-6)
    tight = allocation_bound(nodes, order, forced=[order[0]])
    assert tight.bound_milli == pytest.approx(600, abs=1e-6)


def test_what_closes_a_host() -> None:
    """Two 1-GPU pods on one node of 8 GPUs and 10 CPUs: a small first pod leaves room, so the second
    is forced; one taking 9.5 CPUs closes the node for a pod asking for one CPU."""
    nodes = [NodeSpec("n", 10_000, 8000, 8, "G")]
    assert forced_pods(nodes, [whole("a", 1), whole("b", 1)]) == [0, 1]
    assert forced_pods(nodes, [whole("a", 1, cpu=9500), whole("b", 1)]) == [0]
    # seven 1-GPU pods cannot touch all 8 GPUs: an eighth is forced, a ninth is not
    order = [whole(f"p{i}", 1) for i in range(9)]
    assert forced_pods(nodes, order) == list(range(8))
    # a pod no node can take is never forced and closes nothing
    assert forced_pods(nodes, [whole("big", 9), whole("a", 1)]) == [1]
    # CPU-only pods are never forced but do close hosts
    assert forced_pods(nodes, [PodRequest("c", uid="c", cpu_milli=9500), whole("a", 1)]) == []


def test_only_pods_restricted_by_their_resources_alone_are_forced() -> None:
    nodes = [NodeSpec("n", 10_000, 8000, 8, "G")]
    picky = PodRequest("s", uid="s", cpu_milli=100, gpu_count=1, node_selector={"zone": "a"})
    assert forced_pods(nodes, [picky, whole("a", 1)]) == [1]


def placed_uids(nodes: list[NodeSpec], pods: list[PodRequest], policy: str, seed: int) -> set[str]:
    seen: set[str] = set()

    def keep(cluster: ClusterState) -> None:
        seen.update(cluster.where)

    run_once(nodes, pods, policy, seed, observe=keep)
    return seen


@pytest.mark.parametrize("policy", ["fgd-reserve", "bestfit", "spread", "random", "fgd"])
def test_every_policy_places_the_forced_pods_of_the_openb_sample(policy: str) -> None:
    nodes, pods = load_nodes(DEFAULT_NODES), load_pods(DEFAULT_PODS)
    capacity = sum(n.gpus for n in nodes) * MILLI
    for seed in (42, 43):
        order, _ = arrivals(pods, seed, capacity, 1.3)
        must = forced_pods(nodes, order)
        assert len(must) > len(nodes)  # more than one pod a node: the shares and small pods count less
        placed = placed_uids(nodes, pods, policy, seed)
        assert [order[i].name for i in must if order[i].uid not in placed] == []


def random_cluster(rng: random.Random) -> tuple[list[NodeSpec], list[PodRequest]]:
    """A few small nodes of two kinds and pods that close them in every way: CPU, memory, whole GPUs,
    shares of any size, CPU-only pods, models."""
    kinds = [(rng.choice([4000, 8000]), rng.choice([4000, 16_000]), rng.choice([1, 2, 4]), m) for m in "AB"]
    nodes = [NodeSpec(f"n{i}", *rng.choice(kinds)) for i in range(rng.randint(1, 5))]
    pods = []
    for i in range(rng.randint(4, 30)):
        cpu, memory = rng.choice([0, 500, 1000, 3000, 7000]), rng.choice([0, 1000, 3000, 9000])
        kind = rng.random()
        if kind < 0.2:
            pods.append(PodRequest(f"c{i}", uid=f"c{i}", cpu_milli=cpu or 100, memory_mib=memory))
        elif kind < 0.6:
            pods.append(
                PodRequest(
                    f"s{i}",
                    uid=f"s{i}",
                    cpu_milli=cpu,
                    memory_mib=memory,
                    gpu_count=1,
                    gpu_milli=rng.choice([100, 250, 500, 810, 990]),
                )
            )
        else:
            models = frozenset(rng.sample("AB", 1)) if rng.random() < 0.2 else frozenset()
            pods.append(
                PodRequest(
                    f"w{i}",
                    uid=f"w{i}",
                    cpu_milli=cpu,
                    memory_mib=memory,
                    gpu_count=rng.choice([1, 1, 2, 4]),
                    gpu_models=models,
                )
            )
    return nodes, pods


@pytest.mark.parametrize("policy", ["bestfit", "spread", "random", "fgd-reserve"])
def test_every_policy_places_the_forced_pods_of_small_random_clusters(policy: str) -> None:
    rng = random.Random(2611)
    for case in range(150):
        nodes, pods = random_cluster(rng)
        capacity = sum(n.gpus for n in nodes) * MILLI
        seed = rng.randrange(1000)
        order, _ = arrivals(pods, seed, capacity, 1.3)
        must = forced_pods(nodes, order)
        placed = placed_uids(nodes, pods, policy, seed)
        missing = [order[i].name for i in must if order[i].uid not in placed]
        assert missing == [], (case, policy, nodes, [p.name for p in order])
        for x, bound in protocol_bounds(nodes, pods, seed, 1.3).items():
            run = run_once(nodes, pods, policy, seed)
            assert run.at(x) <= bound.bound_pct + 0.005, (case, x)  # the curve is rounded to 0.01
