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
  the pods that arrived before it cannot have closed all its possible hosts (the nodes that could
  take it empty): each earlier pod sits on one node, so it closes at most a bounded part of one node
  (``closure_parts``), and the parts, split in any way among the host kinds, must not cover every
  kind's nodes (a small LP, ``split_certificate``, finds weights that prove it). The LP places at
  least that many pods of each shape. Without it the LP at 130% arrived may leave out even the early
  pods of a badly packing shape, which no policy can (docs/simulator.md).

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

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

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


def _runs_on(node: NodeSpec, pod: PodRequest) -> bool:
    """Whether ``pod`` may run on ``node`` when it is empty, as a pod that may close it: as
    ``_can_host``, but a pod asking memory in bytes (``PodRequest.exact_memory``) is not held to its MiB
    figure (the simulator checks the bytes alone, and the MiB still count against the node's)."""
    return _can_host(node, replace(pod, memory_mib=0) if pod.exact_memory else pod)


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


ShapeKey = tuple[int, int, int, int, bool, frozenset[str], bool]
PROOF_MARGIN = 1e-9  # relative: a certificate must beat the nodes to close by this much (float sums)
LP_MARGIN = 1e-6  # the split LP must come out below 1 by this much for its weights to be tried


def _shape_key(pod: PodRequest) -> ShapeKey:
    """What decides how much ``pod`` takes of a node and where it may run (CPU, memory, GPUs, models,
    and whether its memory is checked in bytes instead of MiB: ``_runs_on``)."""
    return (
        pod.cpu_milli,
        pod.memory_mib,
        pod.gpu_count,
        pod.gpu_milli,
        pod.is_share,
        pod.gpu_models,
        pod.exact_memory,
    )


def _gpu_milli_per_gpu(pod: PodRequest) -> int:
    """The milli ``pod`` takes of each GPU it touches: its share, 1000 for whole GPUs, and 1000 for a
    share asked by GPU memory alone (the simulator's nodes do not know GPU memory, so it takes the
    whole GPU: ``GpuState.share_for``)."""
    if not pod.gpu_count:
        return 0
    return pod.gpu_milli if pod.is_share and pod.gpu_milli else MILLI


def _round_up(x: np.ndarray, unit: int) -> np.ndarray:
    """``x`` rounded up to a multiple of ``unit`` (unchanged for a unit of 0)."""
    return -(-x // unit) * unit if unit > 0 else x


@dataclass(frozen=True)
class Closers:
    """The pod shapes of an arrival order as pods that may close nodes: per shape its CPU, memory, GPUs
    touched and milli per touched GPU, on which node kinds it can run, and the units every node's use
    is a multiple of (the GCD over all pods of the CPU, the memory and the milli per GPU)."""

    cpu: np.ndarray  # [shape]
    memory: np.ndarray
    touched: np.ndarray  # GPUs the shape's pod touches (0 CPU-only, 1 a share)
    milli: np.ndarray  # milli per touched GPU
    runs_on: np.ndarray  # [shape, kind]: can an empty node of the kind take it (``_runs_on``)
    cpu_unit: int
    memory_unit: int
    milli_unit: int

    @classmethod
    def of(cls, shapes: Sequence[PodRequest], kinds: Sequence[NodeSpec]) -> Closers:
        milli = [_gpu_milli_per_gpu(p) for p in shapes]
        return cls(
            cpu=np.array([p.cpu_milli for p in shapes], dtype=np.int64),
            memory=np.array([p.memory_mib for p in shapes], dtype=np.int64),
            touched=np.array([0 if not p.gpu_count else 1 if p.is_share else p.gpu_count for p in shapes]),
            milli=np.array(milli, dtype=np.int64),
            runs_on=np.array([[_runs_on(n, p) for n in kinds] for p in shapes], dtype=bool).reshape(
                len(shapes), len(kinds)
            ),
            cpu_unit=math.gcd(*(p.cpu_milli for p in shapes)),
            memory_unit=math.gcd(*(p.memory_mib for p in shapes)),
            milli_unit=math.gcd(*milli),
        )


def closure_parts(pod: PodRequest, kinds: Sequence[NodeSpec], closers: Closers) -> np.ndarray:
    """[closer shape, node kind]: at most how many nodes of the kind one pod of the shape can stop
    fitting ``pod`` (0 where it cannot run there, or where ``pod`` cannot run on an empty one).

    A node of the kind stops fitting ``pod`` only when the pods on it have used at least a threshold of
    one resource: CPU ``node CPU - pod CPU + 1``, memory likewise, and of the GPUs, for ``k`` whole
    GPUs, ``G - k + 1`` GPUs touched, for a share of ``m`` milli, ``1001 - m`` milli on each of its
    ``G`` GPUs. Each threshold is rounded up to the unit the use is a multiple of (``Closers``). A
    closer's part is ``min(1, max(its CPU / the CPU threshold, its memory / the memory threshold, its
    GPU part))``, the GPU part being its GPUs touched over ``G - k + 1`` for whole GPUs, and for a share
    ``touched x min(1, its milli per GPU / (1001 - m) rounded) / G`` (one GPU is closed at most once,
    whatever sits on it). Then the parts of the pods on a closed node sum to at least 1: if none is
    capped, the closing resource's shares alone do (per GPU for a share: each GPU's do, and the node's
    ``G`` GPUs sum to ``G``)."""
    out = np.zeros(closers.runs_on.shape)
    for k, node in enumerate(kinds):
        if not _can_host(node, pod):
            continue
        cpu_t = int(_round_up(np.int64(node.cpu_milli - pod.cpu_milli + 1), closers.cpu_unit))
        memory_t = int(_round_up(np.int64(node.memory_mib - pod.memory_mib + 1), closers.memory_unit))
        if pod.is_share:
            per_gpu = int(_round_up(np.int64(MILLI + 1 - pod.gpu_milli), closers.milli_unit))
            gpu = closers.touched * np.minimum(1.0, closers.milli / per_gpu) / node.gpus
        else:
            gpu = closers.touched / (node.gpus - pod.gpu_count + 1)
        part = np.maximum(np.maximum(closers.cpu / cpu_t, closers.memory / memory_t), gpu)
        out[:, k] = np.where(closers.runs_on[:, k], np.minimum(part, 1.0), 0.0)
    return out


def split_certificate(parts: np.ndarray, counts: np.ndarray, nodes: np.ndarray) -> np.ndarray | None:
    """Weights ``y >= 0`` per node kind proving that ``counts[s]`` pods of each closer shape ``s``
    cannot close every node (``nodes[k]`` of kind ``k``) when a pod of shape ``s`` closes at most
    ``parts[s, k]`` nodes of kind ``k`` and sits on one node: ``sum_s counts[s] x max_k parts[s, k]
    y[k] < sum_k nodes[k] y[k]``. None when the LP finds none (the fractional split closes them all).

    The LP (scipy's HiGHS) is the dual of the split ``x[s, k] >= 0``, ``sum_k x[s, k] <= counts[s]``,
    ``sum_s parts[s, k] x[s, k] >= nodes[k]``: minimise ``sum_s counts[s] z[s]`` over ``z[s] >=
    parts[s, k] y[k]``, ``sum_k nodes[k] y[k] = 1``; weights with a value below 1 are a certificate.
    The caller checks the certificate itself; the LP only proposes it."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    n_kinds = parts.shape[1]
    used = np.flatnonzero((counts > 0) & (parts.max(axis=1, initial=0.0) > 0))
    s_idx, k_idx = np.nonzero(parts[used] > 0)
    n_rows = len(s_idx)
    rows = np.concatenate([np.arange(n_rows), np.arange(n_rows)])
    cols = np.concatenate([k_idx, n_kinds + s_idx])
    vals = np.concatenate([parts[used[s_idx], k_idx], -np.ones(n_rows)])
    a_ub = coo_matrix((vals, (rows, cols)), shape=(n_rows, n_kinds + len(used))).tocsr()
    cost = np.concatenate([np.zeros(n_kinds), counts[used].astype(float)])
    a_eq = np.concatenate([nodes.astype(float), np.zeros(len(used))])[None, :]
    res = linprog(
        cost,
        A_ub=a_ub if n_rows else None,
        b_ub=np.zeros(n_rows) if n_rows else None,
        A_eq=a_eq,
        b_eq=[1.0],
        bounds=(0, None),
        method="highs",
    )
    if res.status != 0 or res.fun >= 1.0 - LP_MARGIN:
        return None
    return np.maximum(np.asarray(res.x[:n_kinds]), 0.0)


def forced_pods(nodes: Sequence[NodeSpec], order: Sequence[PodRequest]) -> list[int]:
    """The positions in ``order`` (arrival order) of the GPU pods that every policy places, if it
    places each pod that fits some node when it arrives (one try per pod, pods never leave).

    Pod ``p`` is refused only if every node that could take it empty (its hosts, of the node kinds
    ``K``: equal CPU, memory, GPUs and model) has stopped fitting it. A host of kind ``k`` stops
    fitting only when the parts (``closure_parts``) of the pods on it sum to at least 1, and each
    earlier pod sits on at most one node, of one kind. So if all hosts were closed, the earlier pods
    on hosts of kind ``k`` (``x[s, k]`` of shape ``s``, at most ``n[s]`` over the kinds) would have
    parts summing to at least the kind's node count ``N[k]``. For any weights ``y >= 0`` per kind,
    summing ``y[k]`` times that over the kinds gives ``sum_k N[k] y[k] <= sum_q max_k parts[q, k]
    y[k]`` over the earlier pods ``q``; weights for which it fails prove ``p`` is placed (every earlier
    pod counted as placed, wherever it may run). Weights on one kind alone are the rule of counting
    every earlier pod against each kind; the best weights come from the split LP
    (``split_certificate``), and the inequality is then checked with the weights directly.

    The sum grows with the earlier pods, so per pod shape the pods are forced up to the first
    position where no weights exist; from one certificate the check runs on along the order as long
    as it holds, and a new LP is solved only where it stops. Only pods that nothing but their
    resources restricts (``_only_resources``) are counted as forced; every pod counts as one that may
    close hosts.

    With a negative CPU or memory request anywhere in ``order`` (the trace loader refuses one, but a
    ``PodRequest`` may be built so; the simulator books it, and the node's free amount grows) nothing is
    forced: a pod larger than a node may then
    run on it, so "where it could run on an empty node" no longer bounds where an earlier pod sits."""
    if any(p.cpu_milli < 0 or p.memory_mib < 0 for p in order):
        return []
    kind_count: Counter[tuple[int, int, int, str]] = Counter(
        (n.cpu_milli, n.memory_mib, n.gpus, n.model) for n in nodes
    )
    kind_keys = list(kind_count)
    count = np.array([kind_count[k] for k in kind_keys], dtype=float)
    kinds = [NodeSpec("", cpu, memory, gpus, model) for cpu, memory, gpus, model in kind_keys]
    firsts: dict[ShapeKey, PodRequest] = {}
    for pod in order:
        firsts.setdefault(_shape_key(pod), pod)
    shapes = list(firsts.values())
    index = {key: i for i, key in enumerate(firsts)}
    sid = np.array([index[_shape_key(p)] for p in order], dtype=np.int64)
    closers = Closers.of(shapes, kinds)
    out: list[int] = []
    for i, shape in enumerate(shapes):
        if not (shape.gpu_count and shape.total_gpu_milli):
            continue
        where = [pos for pos in np.flatnonzero(sid == i).tolist() if _only_resources(order[pos])]
        parts = closure_parts(shape, kinds, closers)
        hosts = np.array([_can_host(n, shape) for n in kinds], dtype=bool)
        if not where or not hosts.any():
            continue
        proven = _forced_prefix(parts[:, hosts], count[hosts], sid, where)
        out += where[:proven]
    return sorted(out)


def _forced_prefix(parts: np.ndarray, nodes: np.ndarray, sid: np.ndarray, where: list[int]) -> int:
    """How many of the positions ``where`` (increasing) are proven forced (see ``forced_pods``)."""
    done = 0
    while done < len(where):
        position = where[done]
        counts = np.bincount(sid[:position], minlength=len(parts))
        y = split_certificate(parts, counts, nodes)
        if y is None:
            break
        per_pod = (parts * y[None, :]).max(axis=1)[sid]
        reach = np.concatenate([[0.0], np.cumsum(per_pod)])  # reach[j]: the first j pods' sum
        limit = float(nodes @ y) * (1.0 - PROOF_MARGIN)
        last = int(np.searchsorted(reach, limit, side="left")) - 1  # the last j with reach[j] < limit
        if last < position:
            break  # the LP's weights do not hold up in the check: stop proving here
        done = int(np.searchsorted(where, last, side="right"))
    return done


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
