"""The FGD paper's experiment protocol (see ../shared/traces/openb/README.md).

1. Pods sorted by name, then shuffled with the seed; then inflated: pods drawn at random (with
   replacement, same seed) from the trace are appended as clones until the next clone would take
   the arrived GPU request past ``inflation`` x cluster GPU capacity (130%). A trace already above
   the target is cut down by dropping random pods instead.
2. Each pod is tried once, in order; an unschedulable pod is dropped but counts as arrived. Equal
   node scores go to the first node in a seeded random node order (``ties="node-order"``): the
   FGD simulator's kube-scheduler fork breaks ties by node name and prefixes every node name with a
   random permutation index per seed. ``ties="random"`` is stock kube-scheduler (uniform choice).
3. After every pod: arrived = GPU milli requested so far, allocated = GPU milli placed so far, both
   in percent of the cluster's GPU capacity. Every placed pod of two or more whole GPUs on a node with
   link information (``scheduler.sim.machines``) adds to the link quality (``LinkStats``).
4. The curve at x% is the mean allocation over the events whose arrived percent rounds to x (if
   there are none, those rounding to x-1..x+1); the headline points are x = 100 and x = 130.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from scheduler.core.policies import make_policy
from scheduler.core.request import MILLI, PodRequest
from scheduler.core.schedule import Placement, schedule_one
from scheduler.core.state import NodeState
from scheduler.core.topology import greedy_gpu_set
from scheduler.sim.trace import NodeSpec, build_cluster

INFLATION = 1.3
MAX_INFLATION = 10.0  # arrivals beyond 10x the GPU capacity say nothing more and only cost memory
CURVE_MAX = 130


@dataclass
class LinkStats:
    """Link quality of the multi-GPU pods placed in a run (only those on nodes with link information).

    ``score`` sums each pod's link score (go-gpuallocator's pair scores over its set), ``relative`` the
    score divided by the best set of that size on the idle node (1.0: as good as on an empty node);
    ``nvlink`` counts sets whose every pair has NVLink, ``cross`` sets with a pair across the sockets.
    """

    pods: int = 0
    score: float = 0.0
    relative: float = 0.0
    nvlink: int = 0
    cross: int = 0
    unknown: int = 0  # multi-GPU pods placed on nodes without link information

    def add(self, node: NodeState, gpus: Sequence[int], ideal: dict[tuple[int, int], int]) -> None:
        links = node.links()
        if links.flat:
            self.unknown += 1
            return
        key = (id(links), len(gpus))
        if key not in ideal:
            ideal[key] = links.set_score(greedy_gpu_set(links, range(links.n), len(gpus)) or ())
        score = links.set_score(gpus)
        pairs = [(a, b) for a in gpus for b in gpus if a < b]
        self.pods += 1
        self.score += score
        self.relative += score / ideal[key] if ideal[key] else 1.0
        self.nvlink += all(links.nvlink[a][b] for a, b in pairs)
        self.cross += any(links.cross[a][b] for a, b in pairs)

    def summary(self) -> dict[str, float]:
        n = max(self.pods, 1)
        return {
            "multi_gpu_pods": self.pods,
            "mean_link_score": round(self.score / n, 2),
            "relative_link_score": round(self.relative / n, 4),
            "all_nvlink_share": round(self.nvlink / n, 4),
            "cross_socket_share": round(self.cross / n, 4),
            "multi_gpu_pods_without_links": self.unknown,
        }


@dataclass(frozen=True)
class RunResult:
    """One seeded run of one policy."""

    policy: str
    seed: int
    curve: dict[int, float]  # arrived % -> mean allocated % (of cluster GPU capacity)
    pods: int  # arrived pods (after inflation)
    placed: int
    arrived_milli: int
    allocated_milli: int
    capacity_milli: int
    seconds: float
    links: LinkStats = field(default_factory=LinkStats)

    def at(self, x: int) -> float:
        return self.curve.get(x, float("nan"))

    @property
    def alloc_pct_at_100(self) -> float:
        return self.at(100)

    @property
    def alloc_pct_at_130(self) -> float:
        return self.at(130)


def arrival_order(
    pods: Sequence[PodRequest], seed: int, capacity_milli: int, inflation: float = INFLATION
) -> list[PodRequest]:
    """The pods in arrival order for one seed: shuffled, then inflated (or cut) to the target.

    ``inflation`` 0 is the trace once, shuffled, neither inflated nor cut. ``ValueError`` for an
    inflation that is not a number in [0, ``MAX_INFLATION``] (NaN or infinity would never reach the
    target).
    """
    if not 0 <= inflation <= MAX_INFLATION:
        raise ValueError(f"inflation must be in [0, {MAX_INFLATION:g}], not {inflation!r}")
    rng = random.Random(seed)
    base = sorted(pods, key=lambda p: p.name)
    order = list(base)
    rng.shuffle(order)
    target = inflation * capacity_milli
    total = sum(p.total_gpu_milli for p in order)
    if inflation == 0 or not any(p.total_gpu_milli for p in base):
        return order  # nothing to inflate by (a CPU-only trace would never reach the target)
    if total > target:
        while total > target and order:
            total -= order.pop(rng.randrange(len(order))).total_gpu_milli
        return order
    clone = 0
    while True:
        pod = base[rng.randrange(len(base))]
        if total + pod.total_gpu_milli > target:
            return order
        order.append(replace(pod, name=f"{pod.name}-clone-{clone}", uid=f"{pod.uid}-clone-{clone}"))
        total += pod.total_gpu_milli
        clone += 1


def arrived_percent(arrived: np.ndarray, capacity_milli: int) -> np.ndarray:
    """Each event's arrived GPU request in percent of the capacity, rounded (the curve's x)."""
    return np.round(arrived / capacity_milli * 100).astype(np.int64)


def curve_events(x: np.ndarray, pct: int) -> np.ndarray:
    """The events whose allocation the curve averages at ``pct``: those whose ``x`` is ``pct``, or if
    there are none, those within one point of it (the paper's analysis scripts)."""
    sel = x == pct
    if not sel.any():
        sel = (x >= pct - 1) & (x <= pct + 1)
    return sel


def allocation_curve(arrived: np.ndarray, allocated: np.ndarray, capacity_milli: int) -> dict[int, float]:
    """Arrived % (rounded) -> mean allocated %, per the protocol's bucketing."""
    x = arrived_percent(arrived, capacity_milli)
    y = np.round(allocated / capacity_milli * 100, 2)
    curve: dict[int, float] = {}
    for pct in range(0, CURVE_MAX + 1):
        sel = curve_events(x, pct)
        if sel.any():
            curve[pct] = round(float(y[sel].mean()), 2)
    return curve


def run_once(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodRequest],
    policy_name: str,
    seed: int,
    inflation: float = INFLATION,
    ties: str = "node-order",
) -> RunResult:
    """One run of the protocol: a fresh cluster, the seed's arrival order, one try per pod."""
    start = time.perf_counter()
    cluster = build_cluster(nodes)
    if ties == "node-order":
        cluster.set_tie_order(random.Random(seed + 1_000_003).sample(range(len(cluster)), len(cluster)))
    elif ties != "random":
        raise ValueError(f"ties must be 'node-order' or 'random', not {ties!r}")
    capacity = cluster.total_gpus() * MILLI
    rng = random.Random(seed ^ 0x5EED5EED)  # the policy's randomness: a stream apart from the arrivals
    policy = make_policy(policy_name)
    policy.bind(cluster, pods, rng)  # typical pods etc. come from the original (not inflated) trace
    order = arrival_order(pods, seed, capacity, inflation)
    arrived = np.zeros(len(order), dtype=np.int64)
    allocated = np.zeros(len(order), dtype=np.int64)
    arr = used = placed = 0
    links = LinkStats()
    ideal: dict[tuple[int, int], int] = {}
    for k, pod in enumerate(order):
        arr += pod.total_gpu_milli
        result = schedule_one(pod, cluster, policy, rng, explain=False)
        if isinstance(result, Placement):
            cluster.assume(result.allocation)
            used += result.allocation.gpu_milli
            placed += 1
            if pod.whole_gpus >= 2:
                node = cluster.nodes[cluster.index[result.node]]
                links.add(node, [g.index for g in result.allocation.gpus], ideal)
        arrived[k] = arr
        allocated[k] = used
    return RunResult(
        policy=policy_name,
        seed=seed,
        curve=allocation_curve(arrived, allocated, capacity),
        pods=len(order),
        placed=placed,
        arrived_milli=arr,
        allocated_milli=used,
        capacity_milli=capacity,
        seconds=time.perf_counter() - start,
        links=links,
    )
