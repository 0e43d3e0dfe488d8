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

Gang workloads (``trace.Gang``): a group is one unit of steps 1 and 2 (shuffled, cloned and cut
whole; its members arrive one after another, or with ``gang_arrival="spread"`` each at a random
slot among the slots of all gang members). With ``gang_mode="gang"`` a group is tried once, with
``schedule_group``, at the arrival of its last member: the minimum and the extras that fit, or
nothing. With ``gang_mode="none"`` its members are tried one by one as any pod. ``GangStats``
counts the groups, the GPUs their partly placed members hold idle, and how long groups wait.
A trace without gangs runs exactly as before.

Live utilisation (``trace.NodeSpec.utilization``, the node list's ``gpu_util`` column): with
``readings`` the nodes' values are given to the cluster as live readings before the first pod
(``ClusterState.set_live``: the ``utilization`` policy and ``utilization_weight`` x the live term
score by them; unknown counts as 100 % busy, as in the live scheduler); without, they are ignored.
Either way ``HotStats`` says how much of what was placed went to nodes busier than
``hot_threshold`` percent by the column.

RDMA (``PodRequest.rdma``, ``NodeState.nics``; the trace's ``rdma_*`` columns): the core's RDMA filter
and VF choice apply as in the live scheduler. When some pod asks for RDMA interfaces, ``RdmaStats``
counts the arrived RDMA pods, those placed, and those tried one by one that failed for RDMA alone (some
node passes every other filter): for lack of VFs or of PF bandwidth.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from scheduler.core.filters import DEFAULT_FILTERS, run_filters
from scheduler.core.gang import GroupPlacement, GroupRequest, facts_of, schedule_group
from scheduler.core.policies import make_policy
from scheduler.core.rdma import NO_BANDWIDTH, NicState
from scheduler.core.request import MILLI, PodRequest
from scheduler.core.schedule import Placement, schedule_one
from scheduler.core.scoring import Policy
from scheduler.core.state import ClusterState, NodeState
from scheduler.core.topology import greedy_gpu_set
from scheduler.sim.trace import Gang, NodeSpec, build_cluster

INFLATION = 1.3
MAX_INFLATION = 10.0  # arrivals beyond 10x the GPU capacity say nothing more and only cost memory
CURVE_MAX = 130
GANG_MODES = ("gang", "none")  # a group whole or not at all; or its members one by one, as any pod
GANG_ARRIVALS = ("together", "spread")  # a group's members one after another; or each at a random slot
PERCENTILES = (50, 90, 99)
_SPREAD_SALT = 0x6A6E67  # the stream that spreads gang members, apart from the shuffle's


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
    gangs: GangStats | None = None  # None: the workload has no gangs
    hot: HotStats | None = None  # None: no node has a utilisation value
    rdma: RdmaStats | None = None  # None: no pod asks for RDMA interfaces

    def at(self, x: int) -> float:
        return self.curve.get(x, float("nan"))

    @property
    def alloc_pct_at_100(self) -> float:
        return self.at(100)

    @property
    def alloc_pct_at_130(self) -> float:
        return self.at(130)


def nearest_rank(values: Sequence[int], pct: float) -> int | None:
    """The ``pct``-th percentile by the nearest-rank method (a value of ``values``); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


@dataclass(frozen=True)
class GangStats:
    """What became of a run's pod groups (or of several runs', ``merge``).

    A group is *whole* once at least its minimum of members is placed, *partial* when some but fewer
    are, *unplaced* when none is. ``idle_milli_events`` sums over the arrival events the GPU milli
    held, after the event, by placed members of groups not (yet) whole: GPUs a gang job holds but
    cannot use (the trace has no durations, so the arrival event is the unit of time). ``waits``: per
    group that became whole, the arrival events from its first member's arrival to that event.
    """

    mode: str
    arrival: str
    groups: int = 0
    whole: int = 0
    partial: int = 0
    unplaced: int = 0
    idle_milli_events: int = 0
    idle_milli_end: int = 0  # held by the members of the groups left partial
    events: int = 0
    capacity_milli: int = 0  # per run
    waits: tuple[int, ...] = ()

    @staticmethod
    def merge(stats: Sequence[GangStats]) -> GangStats:
        """Several runs' stats as one: counts, GPU-events and events summed, waits pooled."""
        summed = ("groups", "whole", "partial", "unplaced", "idle_milli_events", "idle_milli_end", "events")
        return replace(
            stats[0],
            waits=tuple(w for s in stats for w in s.waits),
            **{name: sum(getattr(s, name) for s in stats) for name in summed},
        )

    def percentiles(self) -> dict[str, int | None]:
        """p50, p90, p99 of ``waits`` (nearest rank; None without a whole group)."""
        return {f"p{p}": nearest_rank(self.waits, p) for p in PERCENTILES}

    def summary(self) -> dict[str, object]:
        """The JSON form (GPU amounts in GPUs, i.e. milli / 1000)."""
        idle_pct = self.idle_milli_events / (self.events * self.capacity_milli) * 100 if self.events else 0.0
        return {
            "mode": self.mode,
            "arrival": self.arrival,
            "groups": self.groups,
            "whole": self.whole,
            "partial": self.partial,
            "unplaced": self.unplaced,
            "idle_gpu_events": round(self.idle_milli_events / MILLI, 3),
            "idle_gpus_at_end": round(self.idle_milli_end / MILLI, 3),
            "idle_pct_mean": round(idle_pct, 4),
            "time_to_place_events": {**self.percentiles(), "groups": len(self.waits)},
        }


class GangTracker:
    """Follows a run's group instances event by event (pure bookkeeping; decides nothing)."""

    def __init__(self, groups: Sequence[Gang]) -> None:
        self.groups = groups
        self.of = {uid: i for i, g in enumerate(groups) for uid in g.members}
        self.first = [-1] * len(groups)
        self.waiting: list[list[PodRequest]] = [[] for _ in groups]
        self.arrived = [0] * len(groups)
        self.placed = [0] * len(groups)
        self.held = [0] * len(groups)
        self.whole_at = [-1] * len(groups)
        self.idle = 0  # GPU milli held now by placed members of groups not whole
        self.idle_sum = 0
        self.events = 0

    def arrive(self, group: int, event: int) -> bool:
        """A member of ``group`` arrives at ``event``; True when it is the group's last."""
        if self.first[group] < 0:
            self.first[group] = event
        self.arrived[group] += 1
        return self.arrived[group] == len(self.groups[group].members)

    def place(self, group: int, event: int, gpu_milli: int) -> None:
        """A member of ``group`` was placed at ``event``, holding ``gpu_milli``."""
        self.placed[group] += 1
        self.held[group] += gpu_milli
        if self.whole_at[group] >= 0:
            return
        self.idle += gpu_milli
        if self.placed[group] >= self.groups[group].min_member:
            self.whole_at[group] = event
            self.idle -= self.held[group]

    def tick(self) -> None:
        """The end of an arrival event: what partial groups hold now counts once more."""
        self.idle_sum += self.idle
        self.events += 1

    def stats(self, mode: str, arrival: str, capacity_milli: int) -> GangStats:
        whole = sum(1 for w in self.whole_at if w >= 0)
        unplaced = sum(1 for p in self.placed if p == 0)
        return GangStats(
            mode=mode,
            arrival=arrival,
            groups=len(self.groups),
            whole=whole,
            partial=len(self.groups) - whole - unplaced,
            unplaced=unplaced,
            idle_milli_events=self.idle_sum,
            idle_milli_end=self.idle,
            events=self.events,
            capacity_milli=capacity_milli,
            waits=tuple(w - f for w, f in zip(self.whole_at, self.first, strict=True) if w >= 0),
        )


HOT_THRESHOLD = 80.0  # a node busier than this (percent, by the trace's column) is hot


@dataclass(frozen=True)
class HotStats:
    """How much of the GPU placed in a run went to hot nodes (busier than ``threshold`` percent by the
    node list's utilisation column; a node without a value is not hot). The trace has no durations
    (nothing departs), so the arrival event is the unit of time: ``milli_events`` sums, after every
    event, the GPU milli placed so far, ``hot_milli_events`` the part of it on hot nodes."""

    threshold: float
    hot_nodes: int
    hot_gpus: int
    gpus: int
    placed_milli: int = 0
    hot_placed_milli: int = 0
    milli_events: int = 0
    hot_milli_events: int = 0

    @staticmethod
    def merge(stats: Sequence[HotStats]) -> HotStats:
        """Several runs' figures summed (the cluster's from the first)."""
        first = stats[0]
        return replace(
            first,
            placed_milli=sum(h.placed_milli for h in stats),
            hot_placed_milli=sum(h.hot_placed_milli for h in stats),
            milli_events=sum(h.milli_events for h in stats),
            hot_milli_events=sum(h.hot_milli_events for h in stats),
        )

    @property
    def hot_placed_pct(self) -> float:
        """Percent of the GPU placed (at the end) that is on hot nodes (0 when nothing was placed)."""
        return 100.0 * self.hot_placed_milli / self.placed_milli if self.placed_milli else 0.0

    @property
    def hot_gpu_time_pct(self) -> float:
        """Percent of the GPU x events placed that is on hot nodes (the GPU-hours' analogue)."""
        return 100.0 * self.hot_milli_events / self.milli_events if self.milli_events else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "hot_placed_pct": round(self.hot_placed_pct, 2),
            "hot_gpu_time_pct": round(self.hot_gpu_time_pct, 2),
            "placed_gpus": round(self.placed_milli / MILLI, 3),
            "hot_placed_gpus": round(self.hot_placed_milli / MILLI, 3),
        }


NON_RDMA_FILTERS = tuple(f for f in DEFAULT_FILTERS if f.name != "rdma")


@dataclass(frozen=True)
class RdmaStats:
    """What became of a run's RDMA pods (or of several runs', ``merge``): ``pods`` arrived asking for
    interfaces, ``placed``, and of those tried one by one and not placed, ``failed_vfs`` /
    ``failed_bandwidth`` the ones some node would have taken but for their RDMA request (no such node had
    the free VFs; or one had the VFs but its PFs lacked the bandwidth). ``peak_pf_load_pct``: the
    highest share of a PF's line rate reserved at the end of the run (never above 100)."""

    pods: int = 0
    placed: int = 0
    failed_vfs: int = 0
    failed_bandwidth: int = 0
    interfaces_placed: int = 0
    peak_pf_load_pct: float = 0.0

    @staticmethod
    def merge(stats: Sequence[RdmaStats]) -> RdmaStats:
        """Several runs' counts summed; the highest peak."""
        summed = ("pods", "placed", "failed_vfs", "failed_bandwidth", "interfaces_placed")
        return RdmaStats(
            **{name: sum(getattr(s, name) for s in stats) for name in summed},
            peak_pf_load_pct=max(s.peak_pf_load_pct for s in stats),
        )

    def summary(self) -> dict[str, Any]:
        return {
            "pods": self.pods,
            "placed": self.placed,
            "failed_vfs": self.failed_vfs,
            "failed_bandwidth": self.failed_bandwidth,
            "failed_other": self.pods - self.placed - self.failed_vfs - self.failed_bandwidth,
            "interfaces_placed": self.interfaces_placed,
            "peak_pf_load_pct": round(self.peak_pf_load_pct, 2),
        }


def rdma_failure(pod: PodRequest, cluster: ClusterState) -> str:
    """Why an unplaced RDMA pod failed: ``"vfs"`` or ``"bandwidth"`` when some node passes every filter
    but the RDMA one (``"bandwidth"`` when one of them has the free VFs), ``""`` when it fails for
    something else too."""
    idx, _ = run_filters(pod, cluster, NON_RDMA_FILTERS, explain=False)
    if not len(idx):
        return ""
    why = {cluster.nodes[int(i)].nics.shortage(pod.rdma) for i in idx.tolist()}
    return "bandwidth" if NO_BANDWIDTH in why else "vfs"


def peak_pf_load(nics: Sequence[NicState]) -> float:
    """The highest reserved share of a PF's line rate (percent) over these nodes' PFs (0 without)."""
    return max(
        (100.0 * pf.reserved_mbps / pf.rate_mbps for n in nics for pf in n.pfs.values() if pf.rate_mbps),
        default=0.0,
    )


def hot_nodes(nodes: Sequence[NodeSpec], threshold: float) -> set[str]:
    """The names of the nodes busier than ``threshold`` percent by the trace's column."""
    return {n.name for n in nodes if n.utilization is not None and n.utilization > threshold}


Unit = tuple[PodRequest, ...]  # what arrives as one in the shuffle: a pod, or a gang's members


def _units(pods: Sequence[PodRequest], gangs: Sequence[Gang]) -> tuple[list[Unit], dict[int, Gang]]:
    """The pods as units sorted by name (a gang's members in name order, keyed by the first name),
    and which units are gangs (by id of the unit tuple). ``ValueError`` for a member that is not
    among the pods or is in two groups (``trace.load_workload`` never gives such groups)."""
    by_uid = {p.uid: p for p in pods}
    in_gang: set[str] = set()
    for gang in gangs:
        for uid in gang.members:
            if uid not in by_uid or uid in in_gang:
                why = "is not among the pods" if uid not in by_uid else "is in two groups"
                raise ValueError(f"gang {gang.name}: member {uid} {why}")
            in_gang.add(uid)
    units: list[Unit] = [(p,) for p in pods if p.uid not in in_gang]
    which: dict[int, Gang] = {}
    for gang in gangs:
        unit = tuple(sorted((by_uid[uid] for uid in gang.members), key=lambda p: p.name))
        units.append(unit)
        which[id(unit)] = gang
    units.sort(key=lambda u: u[0].name)
    return units, which


def arrivals(
    pods: Sequence[PodRequest],
    seed: int,
    capacity_milli: int,
    inflation: float = INFLATION,
    gangs: Sequence[Gang] = (),
    spread: bool = False,
) -> tuple[list[PodRequest], list[Gang]]:
    """The pods in arrival order for one seed, and the group instances in it (a clone of a group is
    a group of clones, named ``NAME-clone-K`` like its members): shuffled, then inflated (or cut) to
    the target, a gang as one unit. With ``spread`` the gang members are then dealt at random over
    the slots the members of all gangs hold (the other pods keep theirs).

    ``inflation`` 0 is the trace once, shuffled, neither inflated nor cut. ``ValueError`` for an
    inflation that is not a number in [0, ``MAX_INFLATION``] (NaN or infinity would never reach the
    target). Without gangs the order is exactly ``arrival_order``'s of before gangs existed.
    """
    if not 0 <= inflation <= MAX_INFLATION:
        raise ValueError(f"inflation must be in [0, {MAX_INFLATION:g}], not {inflation!r}")
    rng = random.Random(seed)
    base, which = _units(pods, gangs)
    chosen: list[tuple[Unit, Gang | None]] = [(u, which.get(id(u))) for u in base]
    order = list(chosen)
    rng.shuffle(order)
    target = inflation * capacity_milli

    def milli(unit: Unit) -> int:
        return sum(p.total_gpu_milli for p in unit)

    total = sum(milli(u) for u, _ in order)
    if inflation == 0 or not any(milli(u) for u in base):
        pass  # nothing to inflate by (a CPU-only trace would never reach the target)
    elif total > target:
        while total > target and order:
            total -= milli(order.pop(rng.randrange(len(order)))[0])
    else:
        clone = 0
        while True:
            unit, gang = chosen[rng.randrange(len(chosen))]
            if total + milli(unit) > target:
                break
            copy = tuple(
                replace(p, name=f"{p.name}-clone-{clone}", uid=f"{p.uid}-clone-{clone}") for p in unit
            )
            if gang is not None:
                gang = Gang(f"{gang.name}-clone-{clone}", gang.min_member, tuple(p.uid for p in copy))
            order.append((copy, gang))
            total += milli(unit)
            clone += 1
    flat = [p for unit, _ in order for p in unit]
    instances = [gang for _, gang in order if gang is not None]
    if spread and instances:
        members = {uid for g in instances for uid in g.members}
        slots = [i for i, p in enumerate(flat) if p.uid in members]
        dealt = [flat[i] for i in slots]
        random.Random(seed ^ _SPREAD_SALT).shuffle(dealt)
        for i, pod in zip(slots, dealt, strict=True):
            flat[i] = pod
    return flat, instances


def arrival_order(
    pods: Sequence[PodRequest], seed: int, capacity_milli: int, inflation: float = INFLATION
) -> list[PodRequest]:
    """The pods in arrival order for one seed: shuffled, then inflated (or cut) to the target
    (``arrivals`` without gangs)."""
    return arrivals(pods, seed, capacity_milli, inflation)[0]


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
    gangs: Sequence[Gang] = (),
    gang_mode: str = "gang",
    gang_arrival: str = "together",
    utilization_weight: float = 0.0,
    readings: bool = True,
    hot_threshold: float = HOT_THRESHOLD,
    observe: Callable[[ClusterState], None] | None = None,
    on_try: Callable[[PodRequest, Placement | None, ClusterState, float], None] | None = None,
) -> RunResult:
    """One run of the protocol: a fresh cluster, the seed's arrival order, one try per pod (per group
    with ``gang_mode="gang"``; see the module docstring). ``utilization_weight``: the live term added
    to the policy (``make_policy``); ``readings``: give the nodes' utilisation values to the cluster;
    ``observe``: called with the cluster as the run leaves it (for checks of the final state);
    ``on_try``: called after each pod tried on its own (not as a gang member) with the pod, its placement
    (None: refused), the cluster after it and the GPU milli arrived so far in % of the capacity (for
    replays: which pods were refused when, what fills which nodes)."""
    start = time.perf_counter()
    if gang_mode not in GANG_MODES:
        raise ValueError(f"gang_mode must be one of {', '.join(GANG_MODES)}, not {gang_mode!r}")
    if gang_arrival not in GANG_ARRIVALS:
        raise ValueError(f"gang_arrival must be one of {', '.join(GANG_ARRIVALS)}, not {gang_arrival!r}")
    cluster = build_cluster(nodes)
    if ties == "node-order":
        cluster.set_tie_order(random.Random(seed + 1_000_003).sample(range(len(cluster)), len(cluster)))
    elif ties != "random":
        raise ValueError(f"ties must be 'node-order' or 'random', not {ties!r}")
    capacity = cluster.total_gpus() * MILLI
    if readings:
        for spec in nodes:
            if spec.utilization is not None:
                cluster.set_live(spec.name, spec.live())
    hot = hot_nodes(nodes, hot_threshold)
    measured = any(spec.utilization is not None for spec in nodes)
    hot_gpus = sum(spec.gpus for spec in nodes if spec.name in hot)
    used_hot = hot_sum = used_sum = 0
    rng = random.Random(seed ^ 0x5EED5EED)  # the policy's randomness: a stream apart from the arrivals
    policy = make_policy(policy_name, utilization_weight)
    policy.bind(cluster, pods, rng)  # typical pods etc. come from the original (not inflated) trace
    order, groups = arrivals(pods, seed, capacity, inflation, gangs, gang_arrival == "spread")
    tracker = GangTracker(groups)
    arrived = np.zeros(len(order), dtype=np.int64)
    allocated = np.zeros(len(order), dtype=np.int64)
    arr = used = placed = 0
    links = LinkStats()
    ideal: dict[tuple[int, int], int] = {}
    rdma_asked = any(p.rdma for p in pods)
    rdma = {"pods": 0, "placed": 0, "vfs": 0, "bandwidth": 0, "interfaces": 0}

    def book(pod: PodRequest, result: Placement, k: int, group: int | None) -> None:
        nonlocal used, placed, used_hot
        cluster.assume(result.allocation, facts_of(pod))
        used += result.allocation.gpu_milli
        placed += 1
        if result.node in hot:
            used_hot += result.allocation.gpu_milli
        if pod.whole_gpus >= 2:
            node = cluster.nodes[cluster.index[result.node]]
            links.add(node, [g.index for g in result.allocation.gpus], ideal)
        if group is not None:
            tracker.place(group, k, result.allocation.gpu_milli)
        if pod.rdma:
            rdma["placed"] += 1
            rdma["interfaces"] += len(result.allocation.rdma)

    for k, pod in enumerate(order):
        arr += pod.total_gpu_milli
        policy.observe(pod)  # it has arrived: policies that adapt to the arrivals may count it
        group = tracker.of.get(pod.uid)
        rdma["pods"] += bool(pod.rdma)
        if group is not None and gang_mode == "gang":
            tracker.waiting[group].append(pod)
            if tracker.arrive(group, k):
                for member, result in _group_try(groups[group], tracker.waiting[group], cluster, policy, rng):
                    book(member, result, k, group)
        else:
            if group is not None:
                tracker.arrive(group, k)
            result = schedule_one(pod, cluster, policy, rng, explain=False)
            if isinstance(result, Placement):
                book(pod, result, k, group)
            elif pod.rdma:
                why = rdma_failure(pod, cluster)
                if why:
                    rdma[why] += 1
            if on_try is not None:
                on_try(pod, result if isinstance(result, Placement) else None, cluster, 100 * arr / capacity)
        tracker.tick()
        arrived[k] = arr
        allocated[k] = used
        used_sum += used
        hot_sum += used_hot
    if observe is not None:
        observe(cluster)
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
        gangs=tracker.stats(gang_mode, gang_arrival, capacity) if gangs else None,
        hot=HotStats(hot_threshold, len(hot), hot_gpus, capacity // MILLI, used, used_hot, used_sum, hot_sum)
        if measured
        else None,
        rdma=RdmaStats(
            rdma["pods"],
            rdma["placed"],
            rdma["vfs"],
            rdma["bandwidth"],
            rdma["interfaces"],
            peak_pf_load([n.nics for n in cluster.nodes]),
        )
        if rdma_asked
        else None,
    )


def _group_try(
    gang: Gang, members: Sequence[PodRequest], cluster: ClusterState, policy: Policy, rng: random.Random
) -> list[tuple[PodRequest, Placement]]:
    """The group's one try: its members and their placements in the planner's order (empty: none
    fit). The sim's nodes have no topology domain labels, so no domain is asked for."""
    request = GroupRequest(gang.name, gang.min_member, tuple(members), domain_key=None)
    plan = schedule_group(request, cluster, policy, rng)
    if not isinstance(plan, GroupPlacement):
        return []
    by_uid = {m.uid: m for m in members}
    return [(by_uid[p.allocation.pod_uid], p) for p in plan.placements]
