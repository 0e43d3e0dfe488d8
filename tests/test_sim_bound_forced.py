"""The LP bound's forced pods (``forced_pods``): the pods every policy places because a host of theirs
is still empty enough when they arrive. Every policy does place them (checked on the built-in openb
sample and on small random clusters where CPU, memory and shares close nodes early), and forcing them
tightens the bound where the LP would otherwise leave out an early, badly packing pod."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from scheduler.core import ClusterState, PodRequest
from scheduler.core.filters import run_filters
from scheduler.core.request import MILLI
from scheduler.core.state import Allocation, GpuGrant
from scheduler.sim.bound import (
    Closers,
    allocation_bound,
    closure_parts,
    forced_pods,
    protocol_bounds,
    split_certificate,
)
from scheduler.sim.protocol import arrivals, run_once
from scheduler.sim.trace import DEFAULT_NODES, DEFAULT_PODS, NodeSpec, TraceError, load_nodes, load_pods


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


# ../shared beside the checkout, or OPENB_TRACES (as bench/simulate_openb.py)
OPENB = Path(
    os.environ.get("OPENB_TRACES")
    or Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
)
SUBSET = 6  # every SUBSET-th node and pod of an openb trace


@pytest.mark.parametrize("trace", ["default", "cpu050", "multigpu20", "gpushare40"])
def test_fgd_fgd_reserve_and_bestfit_place_the_forced_pods_of_openb_subsets(trace: str) -> None:
    """The forced pods of a sixth of each shared openb trace (nodes and pods) are placed by the
    policies the bound is compared with, in two seeds; the rule forces past the half-way point of the
    arrivals there, where counting every earlier pod against each host kind stopped before it."""
    if not (OPENB / "openb_node_list_gpu_node.csv").exists():
        pytest.skip(f"the openb traces are not at {OPENB}")
    nodes = load_nodes(OPENB / "openb_node_list_gpu_node.csv")[::SUBSET]
    pods = load_pods(OPENB / f"openb_pod_list_{trace}.csv")[::SUBSET]
    capacity = sum(n.gpus for n in nodes) * MILLI
    for seed in (42, 43):
        order, _ = arrivals(pods, seed, capacity, 1.3)
        must = forced_pods(nodes, order)
        arrived = np.cumsum([p.total_gpu_milli for p in order])
        assert arrived[must[-1]] > capacity // 2
        for policy in ("fgd", "fgd-reserve", "bestfit"):
            placed = placed_uids(nodes, pods, policy, seed)
            assert [order[i].name for i in must if order[i].uid not in placed] == [], (policy, seed)


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


def test_earlier_pods_are_split_among_the_host_kinds() -> None:
    """Two nodes of one GPU, of two models: one earlier 1-GPU pod can fill either, not both, so the
    second is placed by every policy. Counted against each kind alone (the earlier pod fills it), it
    would not be forced; split between the kinds, it is."""
    nodes = [NodeSpec("a", 8000, 8000, 1, "A"), NodeSpec("b", 8000, 8000, 1, "B")]
    assert forced_pods(nodes, [whole("w1", 1), whole("w2", 1)]) == [0, 1]
    assert forced_pods(nodes, [whole("w1", 1), whole("w2", 1), whole("w3", 1)]) == [0, 1]
    # three kinds, two earlier pods that each fit all: the third pod is placed, the fourth need not be
    nodes.append(NodeSpec("c", 8000, 8000, 1, "C"))
    order = [whole(f"w{i}", 1) for i in range(4)]
    assert forced_pods(nodes, order) == [0, 1, 2]


def test_a_share_closes_one_gpu_at_most() -> None:
    """A 500-milli share on a node of two GPUs leaves the other GPU free for an 810-milli share: the
    share closes at most one of the node's GPUs however far its milli exceeds the 191 that closes one
    for 810 milli (counting its milli against the node's 2 x 191 would call the node closed)."""
    nodes = [NodeSpec("n", 8000, 8000, 2, "G")]
    order = [share("s", 500), share("p", 810), share("q", 810)]
    assert forced_pods(nodes, order) == [0, 1]
    parts = closure_parts(share("p", 810), [NodeSpec("", 8000, 8000, 2, "G")], Closers.of(order, nodes))
    # rounded to the milli unit (GCD of 500 and 810: 10), 191 becomes 200: half a node per share
    assert parts[:, 0].tolist() == pytest.approx([0.5, 0.5, 0.5])


def test_a_certificate_is_checked_with_its_weights() -> None:
    """Two kinds of one node each, closers that fit one of them: a fractional split closes both only
    when enough of them arrived."""
    parts = np.array([[1.0, 0.0], [0.0, 0.5]])
    nodes = np.array([1.0, 1.0])
    y = split_certificate(parts, np.array([1, 1]), nodes)  # kind 1 needs two of closer 1
    assert y is not None
    assert np.array([1, 1]) @ (parts * y).max(axis=1) < nodes @ y
    assert split_certificate(parts, np.array([1, 2]), nodes) is None


# A brute force of every work-conserving online placement on tiny clusters: a node's state is its CPU
# and memory used and its GPUs' milli used (sorted); each pod goes, in arrival order, to any node and
# GPU(s) that fit it, or is refused only where none does.
NodeState = tuple[int, int, tuple[int, ...]]


def _options(node: NodeSpec, state: NodeState, pod: PodRequest) -> list[NodeState]:
    cpu, memory, gpus = state
    if (pod.cpu_milli and cpu + pod.cpu_milli > node.cpu_milli) or memory + pod.memory_mib > node.memory_mib:
        return []
    after = (cpu + pod.cpu_milli, memory + pod.memory_mib)
    if not pod.gpu_count:
        return [(*after, gpus)]
    if pod.gpu_models and node.model not in pod.gpu_models:
        return []
    if not pod.is_share:
        free = [j for j, used in enumerate(gpus) if used == 0]
        if len(free) < pod.gpu_count:
            return []
        rest = list(gpus)
        for j in free[: pod.gpu_count]:
            rest[j] = MILLI
        return [(*after, tuple(sorted(rest)))]
    milli = pod.gpu_milli or MILLI  # a share by GPU memory alone takes the whole GPU (nodes know no memory)
    out = []
    for used in sorted(set(gpus)):
        if used + milli <= MILLI:
            rest = list(gpus)
            rest[rest.index(used)] = used + milli
            out.append((*after, tuple(sorted(rest))))
    return out


def always_placed(nodes: list[NodeSpec], order: list[PodRequest]) -> set[int]:
    """The positions placed in every work-conserving online placement of ``order`` on ``nodes``."""
    refused: set[int] = set()
    seen: set[tuple[int, tuple[NodeState, ...]]] = set()

    def walk(pos: int, states: tuple[NodeState, ...]) -> None:
        if pos == len(order) or (pos, states) in seen:
            return
        seen.add((pos, states))
        moves = [
            states[:i] + (after,) + states[i + 1 :]
            for i, node in enumerate(nodes)
            for after in _options(node, states[i], order[pos])
        ]
        if not moves:
            refused.add(pos)
            walk(pos + 1, states)
        for nxt in set(moves):
            walk(pos + 1, nxt)

    walk(0, tuple((0, 0, (0,) * n.gpus) for n in nodes))
    return set(range(len(order))) - refused


def sorted_pod(
    sort: str,
    i: int,
    cpu: int,
    memory: int,
    models: frozenset[str],
    milli: int = 0,
    count: int = 1,
    by_memory: int = 0,
) -> PodRequest:
    """Pod ``i`` of one sort for the random clusters: ``c`` CPU only, ``s`` a share of ``milli`` (or of
    ``by_memory`` MiB of GPU memory), ``w`` ``count`` whole GPUs."""
    name = f"{sort}{i}"
    if sort == "c":
        return PodRequest(name, uid=name, cpu_milli=cpu, memory_mib=memory)
    if sort == "s":
        return PodRequest(
            name,
            uid=name,
            cpu_milli=cpu,
            memory_mib=memory,
            gpu_count=1,
            gpu_milli=milli,
            gpu_memory_mib=by_memory,
            gpu_models=models,
        )
    return PodRequest(name, uid=name, cpu_milli=cpu, memory_mib=memory, gpu_count=count, gpu_models=models)


def tiny_cluster(rng: random.Random) -> tuple[list[NodeSpec], list[PodRequest]]:
    """Two to four small nodes of up to three kinds and up to seven pods of every sort."""
    kinds = [(rng.choice([4000, 8000]), rng.choice([4000, 8000]), rng.choice([1, 2, 4]), m) for m in "ABC"]
    nodes = [NodeSpec(f"n{i}", *rng.choice(kinds)) for i in range(rng.randint(2, 4))]
    pods = []
    for i in range(rng.randint(2, 7)):
        cpu, memory = rng.choice([0, 1000, 2500, 4000]), rng.choice([0, 1000, 3000, 5000])
        kind = rng.random()
        models = frozenset(rng.sample("ABC", rng.randint(1, 2))) if rng.random() < 0.3 else frozenset()
        if kind < 0.15:
            pods.append(sorted_pod("c", i, cpu or 500, memory, models))
        elif kind < 0.55:
            pods.append(sorted_pod("s", i, cpu, memory, models, milli=rng.choice([200, 300, 500, 700, 810])))
        else:
            pods.append(sorted_pod("w", i, cpu, memory, models, count=rng.choice([1, 1, 2, 4])))
    return nodes, pods


def forced_against_brute_force(
    make: Callable[[random.Random], tuple[list[NodeSpec], list[PodRequest]]], rng: random.Random, cases: int
) -> tuple[int, int]:
    """For ``cases`` clusters from ``make``: every pod the rule forces is placed by every work-conserving
    placement (``always_placed``); returns how many pods it forced and how many GPU pods are always
    placed, over all cases."""
    forced_total = placed_total = 0
    for case in range(cases):
        nodes, order = make(rng)
        must = set(forced_pods(nodes, order))
        placed = always_placed(nodes, order)
        assert must <= placed, (case, nodes, order, must - placed)
        forced_total += len(must)
        placed_total += sum(1 for i in placed if order[i].total_gpu_milli)
    return forced_total, placed_total


def test_forced_pods_are_placed_by_every_online_placement_of_tiny_clusters() -> None:
    """Soundness against brute force: a pod called forced is placed in every work-conserving online
    placement (every choice of node and GPU for every earlier pod). The rule also forces most of
    what is always placed on these clusters (it is not vacuous)."""
    forced_total, placed_total = forced_against_brute_force(tiny_cluster, random.Random(2626), 400)
    assert forced_total >= 0.9 * placed_total  # 921 of 969 when written


@pytest.mark.parametrize("resource", ["cpu_milli", "memory_mib"])
def test_a_negative_request_forces_nothing(tmp_path: Path, resource: str) -> None:
    """A pod with a negative CPU or memory request (the trace loader refuses one since 2026-11-29, but
    a PodRequest can still be made so, and the simulator books it: the node's free amount grows). A
    later pod larger than the node then fits it, although it cannot run on the node empty, so it closes
    a host the rule counts it off: here the whole GPU of the only node, and the third pod is refused
    although the rule called it forced."""
    nodes = [NodeSpec("n", 4000, 4000, 1, "A")]
    big = {"cpu_milli": 8000, "memory_mib": 8000}[resource]
    rows = {"cpu_milli": ("-4000,0", f"{big},0"), "memory_mib": ("0,-4000", f"0,{big}")}[resource]
    trace = tmp_path / "pods.csv"
    trace.write_text(
        f"name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,{rows[0]},0,0\nb,{rows[1]},1,1000\np,100,100,1,1000\n"
    )
    with pytest.raises(TraceError, match=f"column {resource}: below 0"):
        load_pods(trace)
    negative, larger = {"cpu_milli": (-4000, 0), "memory_mib": (0, -4000)}[resource], {resource: big}
    order = [
        PodRequest("a", cpu_milli=negative[0], memory_mib=negative[1]),
        PodRequest("b", gpu_count=1, gpu_milli=1000, **larger),
        PodRequest("p", cpu_milli=100, memory_mib=100, gpu_count=1, gpu_milli=1000),
    ]
    cluster = ClusterState(n.state() for n in nodes)
    refused = []
    for pod in order:  # the only placement there is: every pod on the only node, if it fits
        idx, _ = run_filters(pod, cluster, explain=False)
        if not len(idx):
            refused.append(pod.name)
            continue
        gpus = (GpuGrant(0, "n-gpu0"),) if pod.gpu_count else ()
        cluster.assume(
            Allocation("n", pod.uid, cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib, gpus=gpus)
        )
    assert refused == ["p"]
    assert 2 not in forced_pods(nodes, order)


def test_a_pod_asking_memory_in_bytes_closes_a_host_beyond_its_mib() -> None:
    """A pod whose ``resources`` name memory (bytes) is checked by that alone, not by its MiB figure,
    which still counts against the node's MiB: one asking 8000 MiB (and 1 MiB in bytes) runs on a node
    of 4000 MiB and leaves no memory for a later pod. Counting it off that node (it asks more MiB than
    the node has) would call the later pod forced; a later pod of the same shape without the bytes
    must not hide it either."""
    nodes = [NodeSpec("n", 4000, 4000, 1, "A")]
    exact = PodRequest("a", uid="a", cpu_milli=100, memory_mib=8000, resources=(("memory", 1 << 20),))
    plain = PodRequest("b", uid="b", cpu_milli=100, memory_mib=8000)
    p = PodRequest("p", uid="p", cpu_milli=100, memory_mib=100, gpu_count=1)
    cluster = ClusterState(n.state() for n in nodes)
    assert len(run_filters(exact, cluster, explain=False)[0]) == 1
    cluster.assume(Allocation("n", "a", cpu_milli=100, memory_mib=8000, resources=exact.resources))
    assert len(run_filters(p, cluster, explain=False)[0]) == 0
    assert forced_pods(nodes, [exact, p]) == []
    assert forced_pods(nodes, [plain, exact, p]) == []
    assert forced_pods(nodes, [plain, p]) == [1]  # without the bytes it cannot run there: p is placed


def edge_cluster(rng: random.Random) -> tuple[list[NodeSpec], list[PodRequest]]:
    """One to four nodes among GPU nodes without a model, CPU-only nodes and small ones; pods at the
    edges: no CPU or memory, larger than every node, CPU and memory one off a node's or its half (no
    common divisor to round the thresholds to), shares of 1 and 999 milli and by GPU memory alone,
    model lists naming the empty model, three whole GPUs."""
    kinds = [(1000, 1000, 1, ""), (1000, 1000, 2, "A"), (3000, 3000, 0, ""), (500, 4000, 3, "B")]
    nodes = [NodeSpec(f"n{i}", *rng.choice(kinds)) for i in range(rng.randint(1, 4))]
    pods = []
    for i in range(rng.randint(2, 8)):
        cpu = rng.choice([0, 0, 1, 400, 499, 501, 600, 999, 1000, 1001, 2000, 5000])
        memory = rng.choice([0, 1, 500, 999, 1000, 3999, 4001])
        models = (
            frozenset(rng.sample(["A", "B", ""], rng.randint(1, 2))) if rng.random() < 0.3 else frozenset()
        )
        kind = rng.random()
        if kind < 0.3:
            pods.append(sorted_pod("c", i, cpu, memory, frozenset()))
        elif kind < 0.6:
            milli, by_memory = rng.choice([(1, 0), (500, 0), (999, 0), (0, 2000)])
            pods.append(sorted_pod("s", i, cpu, memory, models, milli=milli, by_memory=by_memory))
        else:
            pods.append(sorted_pod("w", i, cpu, memory, models, count=rng.choice([1, 2, 3])))
    return nodes, pods


def test_forced_pods_are_placed_by_every_online_placement_at_the_edges() -> None:
    """The brute force of every work-conserving placement on clusters and pods at the edges
    (``edge_cluster``): what the rule forces is always placed, and it forces most of it."""
    forced_total, placed_total = forced_against_brute_force(edge_cluster, random.Random(3), 400)
    assert forced_total >= 0.9 * placed_total
