"""An upper bound on the GPU allocation any policy could reach, by linear programming (scipy's HiGHS).

Offline and clairvoyant: every pod that has arrived by a point of the protocol is known at once, may
be placed in any order or left out, and the question is how much GPU (milli) the cluster can hold at
most. Integer, that is a multi-dimensional bin-packing problem. Its relaxation solved here keeps what
decides GPU allocation on openb and drops what would make it slow:

- **kept, per node type** (nodes of equal CPU, memory, GPU count and, where some pod restricts models,
  GPU model): the CPU, memory and GPUs of the type's nodes together bound the pods placed on them;
  a k-GPU pod needs a type with at least k GPUs, and at most one pod larger than half a node's CPU
  (or memory) fits per node; model lists are respected;
- **kept, per GPU**: GPU shares are packed onto whole GPUs, no GPU holding more than 1000 milli (the
  LP chooses, per type, how many GPUs carry each *pattern*, a multiset of share sizes that fits one
  GPU). This is the main loss on openb: an 810-milli share leaves 190 milli that only a few pods fit;
- **kept**: no pod shape (CPU, memory, GPU count, milli, models) is used more often than it arrived;
- **dropped**: that a node's CPU and memory bound the pods on *that* node (they are pooled over the
  type's nodes; the two cuts above keep the large pods apart), that a k-GPU pod's GPUs are on one
  node, integrality (fractions of pods and patterns), CPU-only pods (they place no GPU milli, so
  leaving them out can only raise the bound), and most of the rule that every pod that fits must be
  placed;
- **kept of that rule** (``forced_pods``, ``protocol_bounds``): a pod is placed by every policy when
  fewer pods arrived before it that could run on one of its possible hosts (the nodes that could
  take it empty) than it has such hosts: each earlier pod occupies at most one node, so one of them
  is still empty when it arrives. The LP places at least that many pods of each shape. Without it
  the LP at 130% arrived may leave out even the first pods of a badly packing shape, which no policy
  can (docs/simulator.md).

Every placement any policy makes is a feasible solution of this LP, so its optimum is an upper bound
on the allocation at that point; what is dropped is why it can lie above the true offline optimum
(docs/simulator.md discusses how far). Patterns are too many to list, so the LP is solved by column
generation: the LP over known patterns gives dual prices, and per node type an unbounded knapsack
over share sizes (dynamic programming in milli) finds the pattern of the largest reduced value; the
loop ends when none is positive, at the LP optimum. The value reported is the Lagrangian (Farley)
bound ``LP value + sum over types of GPUs x max(0, best reduced pattern value)``, valid at every
iteration, so a run stopped by ``max_iterations`` still reports a bound.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.core.request import MILLI, PodRequest, TopologyWish
from scheduler.sim.trace import Gang, NodeSpec

TOLERANCE = 1e-7  # reduced values (per milli of objective) below this count as zero


@dataclass(frozen=True)
class Shape:
    """A GPU pod shape and how many such pods arrived."""

    cpu: int
    memory: int
    gpus: int  # whole GPUs (0 for a share)
    milli: int  # a share's milli (0 for whole GPUs)
    models: frozenset[str]
    count: int

    @property
    def value(self) -> int:
        """GPU milli the pod places."""
        return self.gpus * MILLI if self.gpus else self.milli


@dataclass(frozen=True)
class NodeType:
    cpu: int
    memory: int
    gpus: int
    model: str
    count: int


@dataclass(frozen=True)
class BoundResult:
    """The bound (GPU milli), the LP's value and how it was reached."""

    bound_milli: float
    lp_milli: float
    arrived_milli: int
    capacity_milli: int
    iterations: int
    patterns: int
    converged: bool
    seconds: float

    @property
    def bound_pct(self) -> float:
        """The bound in percent of the cluster's GPU capacity."""
        return 100.0 * self.bound_milli / self.capacity_milli if self.capacity_milli else 0.0


def shapes_of(pods: Sequence[PodRequest]) -> list[Shape]:
    """The GPU pod shapes of ``pods`` with their counts (CPU-only pods left out)."""
    counts: Counter[tuple[int, int, int, int, frozenset[str]]] = Counter()
    for p in pods:
        if p.gpu_count == 0 or p.total_gpu_milli == 0:
            continue
        if p.is_share:
            counts[(p.cpu_milli, p.memory_mib, 0, p.gpu_milli, p.gpu_models)] += 1
        else:
            counts[(p.cpu_milli, p.memory_mib, p.gpu_count, 0, p.gpu_models)] += 1
    return [Shape(c, m, g, u, models, n) for (c, m, g, u, models), n in sorted(counts.items(), key=str)]


def node_types(nodes: Sequence[NodeSpec], shapes: Sequence[Shape]) -> list[NodeType]:
    """GPU nodes grouped by (CPU, memory, GPUs, model); the model only where some shape restricts it."""
    restricted = any(s.models for s in shapes)
    counts = Counter(
        (n.cpu_milli, n.memory_mib, n.gpus, n.model if restricted else "") for n in nodes if n.gpus > 0
    )
    return [NodeType(c, m, g, model, k) for (c, m, g, model), k in sorted(counts.items())]


def _fits(shape: Shape, t: NodeType) -> bool:
    if shape.cpu > t.cpu or shape.memory > t.memory or max(shape.gpus, 1) > t.gpus:
        return False
    return not shape.models or t.model in shape.models or not t.model


def _best_pattern(sizes: list[int], prices: np.ndarray) -> tuple[float, list[int]]:
    """Unbounded knapsack: share counts per size (fitting 1000 milli) of the largest total price."""
    step = int(np.gcd.reduce(np.array([*sizes, MILLI])))
    cap = MILLI // step
    best = np.zeros(cap + 1)
    pick = np.full(cap + 1, -1, dtype=np.int64)
    for c in range(1, cap + 1):
        best[c] = best[c - 1]
        for k, u in enumerate(sizes):
            w = u // step
            if w <= c and prices[k] > 0 and best[c - w] + prices[k] > best[c] + 1e-12:
                best[c] = best[c - w] + prices[k]
                pick[c] = k
    counts = [0] * len(sizes)
    c = cap
    while c > 0:
        if pick[c] < 0:
            c -= 1
            continue
        counts[pick[c]] += 1
        c -= sizes[pick[c]] // step
    return float(best[cap]), counts


def allocation_bound(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodRequest],
    *,
    forced: Sequence[PodRequest] = (),
    max_iterations: int = 200,
) -> BoundResult:
    """Upper bound on the GPU milli placeable from ``pods`` on ``nodes`` (see the module docstring).

    ``forced``: pods of ``pods`` that every policy places (``forced_pods``); the LP places at least as
    many pods of each of their shapes."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    start = time.perf_counter()
    shapes = shapes_of(pods)
    types = node_types(nodes, shapes)
    capacity = sum(max(n.gpus, 0) for n in nodes) * MILLI
    arrived = sum(s.value * s.count for s in shapes)
    sizes = sorted({s.milli for s in shapes if not s.gpus})
    if not shapes or not types:
        return BoundResult(0.0, 0.0, arrived, capacity, 0, 0, True, time.perf_counter() - start)
    # fixed variables: x[j, t] pods of shape j on type t
    xs = [(j, ti) for ti, t in enumerate(types) for j, s in enumerate(shapes) if _fits(s, t)]
    if not xs:  # no pod fits any node: nothing can be placed (and the LP would have no columns)
        return BoundResult(0.0, 0.0, arrived, capacity, 0, 0, True, time.perf_counter() - start)
    # rows: demand per shape | per type: cpu, memory, gpus, big-cpu, big-memory, shares per size
    n_shapes, n_sizes = len(shapes), len(sizes)
    per_type = 5 + n_sizes

    def row(ti: int, k: int) -> int:
        return n_shapes + ti * per_type + k

    floor = _forced_counts(shapes, forced)  # shape index -> pods of it every policy places
    forced_row = {j: n_shapes + len(types) * per_type + k for k, j in enumerate(sorted(floor))}
    n_rows = n_shapes + len(types) * per_type + len(forced_row)
    b = np.zeros(n_rows)
    b[:n_shapes] = [s.count for s in shapes]
    for j, r in forced_row.items():
        b[r] = -float(floor[j])  # -(pods of shape j placed) <= -floor
    for ti, t in enumerate(types):
        b[row(ti, 0)] = t.count * t.cpu
        b[row(ti, 1)] = t.count * t.memory
        b[row(ti, 2)] = t.count * t.gpus
        b[row(ti, 3)] = t.count
        b[row(ti, 4)] = t.count
    size_index = {u: k for k, u in enumerate(sizes)}
    ri: list[int] = []
    ci: list[int] = []
    vals: list[float] = []
    obj: list[float] = []
    for col, (j, ti) in enumerate(xs):
        s, t = shapes[j], types[ti]
        entries = [(j, 1.0), (row(ti, 0), s.cpu), (row(ti, 1), s.memory)]
        if j in forced_row:
            entries.append((forced_row[j], -1.0))
        if s.gpus:
            entries.append((row(ti, 2), float(s.gpus)))
        else:
            entries.append((row(ti, 5 + size_index[s.milli]), 1.0))
        if 2 * s.cpu > t.cpu:
            entries.append((row(ti, 3), 1.0))
        if 2 * s.memory > t.memory:
            entries.append((row(ti, 4), 1.0))
        for r, v in entries:
            ri.append(r)
            ci.append(col)
            vals.append(float(v))
        obj.append(float(s.value))
    patterns: list[tuple[int, list[int]]] = []  # (type, share counts per size): one GPU of that type
    seen: set[tuple[int, tuple[int, ...]]] = set()

    def add_pattern(ti: int, counts: list[int]) -> bool:
        key = (ti, tuple(counts))
        if key in seen or not any(counts):
            return False
        seen.add(key)
        patterns.append((ti, list(counts)))
        return True

    for ti in range(len(types)):  # a start: each size alone, as many as fit one GPU
        for k, u in enumerate(sizes):
            counts = [0] * n_sizes
            counts[k] = MILLI // u
            add_pattern(ti, counts)
    bound = float(min(arrived, capacity))
    lp_value = 0.0
    converged = False
    iterations = 0
    while iterations < max_iterations:
        iterations += 1
        pr: list[int] = list(ri)
        pc: list[int] = list(ci)
        pv: list[float] = list(vals)
        for p, (ti, counts) in enumerate(patterns):
            col = len(xs) + p
            pr.append(row(ti, 2))
            pc.append(col)
            pv.append(1.0)
            for k, n in enumerate(counts):
                if n:
                    pr.append(row(ti, 5 + k))
                    pc.append(col)
                    pv.append(-float(n))
        n_cols = len(xs) + len(patterns)
        a_ub = coo_matrix((pv, (pr, pc)), shape=(n_rows, n_cols)).tocsr()
        c = -np.array(obj + [0.0] * len(patterns))
        res = linprog(c, A_ub=a_ub, b_ub=b, bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"bound LP failed: {res.message}")
        lp_value = -float(res.fun)
        duals = -np.asarray(res.ineqlin.marginals)  # >= 0: the value of one more unit of each row
        gain = 0.0
        added = 0
        for ti, t in enumerate(types):
            gpu_price = duals[row(ti, 2)]
            share_prices = np.array([duals[row(ti, 5 + k)] for k in range(n_sizes)])
            if not n_sizes:
                continue
            value, counts = _best_pattern(sizes, share_prices)
            reduced = value - gpu_price
            if reduced > TOLERANCE * MILLI:
                gain += t.count * t.gpus * reduced
                added += add_pattern(ti, counts)
        bound = min(bound, lp_value + gain)
        if not added:  # no new improving pattern: the LP optimum (up to the solver's tolerance)
            converged = gain <= TOLERANCE * MILLI * sum(t.count * t.gpus for t in types)
            break
    return BoundResult(
        bound_milli=max(min(bound, float(min(arrived, capacity))), 0.0),
        lp_milli=lp_value,
        arrived_milli=arrived,
        capacity_milli=capacity,
        iterations=iterations,
        patterns=len(patterns),
        converged=converged,
        seconds=time.perf_counter() - start,
    )


def _forced_counts(shapes: Sequence[Shape], forced: Sequence[PodRequest]) -> dict[int, int]:
    """Per shape index, how many of ``forced`` have that shape (GPU pods only)."""
    if not forced:
        return {}
    index = {(s.cpu, s.memory, s.gpus, s.milli, s.models): j for j, s in enumerate(shapes)}
    counts: Counter[int] = Counter()
    for shape in shapes_of(forced):
        j = index.get((shape.cpu, shape.memory, shape.gpus, shape.milli, shape.models))
        if j is None:
            raise ValueError(f"a forced pod's shape is not among the pods': {shape}")
        counts[j] = min(shape.count, shapes[j].count)
    return dict(counts)


def _can_host(node: NodeSpec, pod: PodRequest) -> bool:
    """Whether ``node``, empty, could take ``pod`` (CPU, memory, GPUs, models)."""
    if pod.cpu_milli > node.cpu_milli or pod.memory_mib > node.memory_mib:
        return False
    if pod.gpu_count == 0 or pod.total_gpu_milli == 0:
        return True
    if (1 if pod.is_share else pod.gpu_count) > node.gpus:
        return False
    return not pod.gpu_models or node.model in pod.gpu_models


def _only_resources(pod: PodRequest) -> bool:
    """Whether nothing but CPU, memory and GPUs decides where ``pod`` may go (no selector, toleration,
    topology wish, GPU memory, enforced share, other resource, host port, RDMA or placement rule)."""
    return not (
        pod.node_selector
        or pod.tolerations
        or pod.topology != TopologyWish()
        or pod.gpu_memory_mib
        or pod.enforced_share
        or pod.resources
        or pod.host_ports
        or pod.rdma
        or pod.placement is not None
    )


def forced_pods(nodes: Sequence[NodeSpec], order: Sequence[PodRequest]) -> list[int]:
    """The positions in ``order`` (arrival order) of the GPU pods that every policy places, if it
    places each pod that fits some node when it arrives (one try per pod, pods never leave).

    A node stops fitting pod ``p`` only when the pods on it leave too little of one resource: more
    than its CPU less ``p``'s, or memory, or GPUs (for ``k`` whole GPUs: more than ``G - k`` of its
    ``G`` GPUs touched; for a share of ``m`` milli: every GPU more than ``1000 - m`` used, so at least
    ``G x (1001 - m)`` milli in all). So each earlier pod ``q`` that could run on a node of that kind
    closes at most ``min(1, max(cpu_q / (cpu slack + 1), memory_q / (memory slack + 1), its GPUs
    over the GPU threshold))`` of such nodes, as ``q`` sits on one node; while the sum over the
    earlier pods stays below the number of nodes of some kind that could take ``p`` empty, one of
    them still fits ``p``. Only pods that nothing but their resources restricts (``_only_resources``)
    are counted as forced; every pod counts as one that may close hosts."""
    kinds: dict[tuple[int, int, int, str], int] = {}  # (CPU, memory, GPUs, model) -> nodes
    for n in nodes:
        key = (n.cpu_milli, n.memory_mib, n.gpus, n.model)
        kinds[key] = kinds.get(key, 0) + 1
    kind_keys = list(kinds)
    count = np.array([kinds[k] for k in kind_keys], dtype=float)
    kind_nodes = [NodeSpec("", cpu, memory, gpus, model) for cpu, memory, gpus, model in kind_keys]

    def key_of(pod: PodRequest) -> tuple:
        return (
            pod.cpu_milli,
            pod.memory_mib,
            pod.gpu_count,
            pod.total_gpu_milli,
            pod.is_share,
            pod.gpu_models,
        )

    firsts: dict[tuple, PodRequest] = {}
    for pod in order:
        firsts.setdefault(key_of(pod), pod)
    shape_keys = list(firsts)
    shape_index = {k: i for i, k in enumerate(shape_keys)}
    gpu_shape = np.array([bool(p.gpu_count and p.total_gpu_milli) for p in firsts.values()])
    share_shape = np.array([p.is_share for p in firsts.values()])
    # per (pod shape, node kind): can an empty node of the kind take it, and the thresholds
    hosts = np.array([[_can_host(n, p) for n in kind_nodes] for p in firsts.values()], dtype=bool)
    node_cpu = np.array([n.cpu_milli for n in kind_nodes], dtype=float)
    node_memory = np.array([n.memory_mib for n in kind_nodes], dtype=float)
    node_gpus = np.array([n.gpus for n in kind_nodes], dtype=float)
    pod_cpu = np.array([p.cpu_milli for p in firsts.values()], dtype=float)[:, None]
    pod_memory = np.array([p.memory_mib for p in firsts.values()], dtype=float)[:, None]
    pod_gpus = np.array([p.gpu_count for p in firsts.values()], dtype=float)[:, None]
    pod_milli = np.array([p.gpu_milli for p in firsts.values()], dtype=float)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        cpu_room = np.maximum(node_cpu[None, :] - pod_cpu + 1, 1)
        memory_room = np.maximum(node_memory[None, :] - pod_memory + 1, 1)
        # whole GPUs: GPUs touched to close; a share: milli used to close
        gpu_room = np.where(
            share_shape[:, None],
            np.maximum(node_gpus[None, :] * (MILLI + 1 - pod_milli), 1),
            np.maximum(node_gpus[None, :] - pod_gpus + 1, 1),
        )
    closed = np.zeros(hosts.shape)  # per (pod shape, node kind): hosts the arrivals so far may close
    out: list[int] = []
    for position, pod in enumerate(order):
        i = shape_index[key_of(pod)]
        if gpu_shape[i] and _only_resources(pod) and bool(np.any(hosts[i] & (closed[i] < count))):
            out.append(position)
        runs_on = hosts[i]  # the node kinds this pod could sit on
        if not runs_on.any():
            continue  # refused by every policy: it closes nothing
        touched = 0.0 if not pod.total_gpu_milli else (1.0 if pod.is_share else float(pod.gpu_count))
        milli = float(pod.total_gpu_milli)
        gpu_part = np.where(share_shape[:, None], milli / gpu_room, touched / gpu_room)
        part = np.maximum(np.maximum(pod.cpu_milli / cpu_room, pod.memory_mib / memory_room), gpu_part)
        closed += np.where(runs_on[None, :], np.minimum(part, 1.0), 0.0)
    return out


def arrived_by(order: Sequence[PodRequest], capacity_milli: int, point: int) -> list[PodRequest]:
    """The pods of ``order`` up to the last event the curve averages at ``point``
    (``protocol.curve_events``: the events whose arrived percent rounds to ``point``, or within one
    point of it where none does), so that the allocation the curve reports there is at most the
    bound of these pods; where no event is that close, the pods whose event rounds to ``point`` or less.
    """
    from scheduler.sim.protocol import arrived_percent, curve_events

    if not order:
        return []
    x = arrived_percent(np.cumsum([p.total_gpu_milli for p in order]), capacity_milli)
    sel = np.flatnonzero(curve_events(x, point))
    last = int(sel[-1]) if len(sel) else int(np.searchsorted(x, point, side="right")) - 1
    return list(order[: last + 1])


def protocol_bounds(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodRequest],
    seed: int,
    inflation: float,
    points: Sequence[int] = (100, 130),
    gangs: Sequence[Gang] = (),
    spread: bool = False,
) -> dict[int, BoundResult]:
    """The bound at each arrival point of one seed's protocol run (the same arrival order as the run,
    ``gangs`` and ``spread`` as there; the LP ignores that a gang runs whole, which only lowers what a
    policy can place, so it stays an upper bound).

    A point where the run's curve has no value (no event close enough: the inflation stops below
    it, or one large pod jumps over it) is left out, as the run's value there is missing too.
    Without gangs the LP places at least the pods every policy places (``forced_pods``).
    """
    from scheduler.sim.protocol import arrivals, arrived_percent, curve_events

    capacity = sum(max(n.gpus, 0) for n in nodes) * MILLI
    if not capacity:
        return {}
    order, _ = arrivals(pods, seed, capacity, inflation, gangs, spread)
    x = arrived_percent(np.cumsum([p.total_gpu_milli for p in order], dtype=np.int64), capacity)
    out: dict[int, BoundResult] = {}
    # a gang's member may be refused although it fits alone (the gang runs whole or not at all)
    must = forced_pods(nodes, order) if not gangs else []
    for point in points:
        if len(order) and curve_events(x, point).any():
            arrived = arrived_by(order, capacity, point)
            forced = [order[i] for i in must if i < len(arrived)]
            out[point] = allocation_bound(nodes, arrived, forced=forced)
    return out
