"""The scoring plugins of the published baselines and FGD, and the policy registry.

The baselines follow the FGD paper's simulator (hkust-adsl/kubernetes-scheduler-simulator) so that
its published numbers can be reproduced: integer scores 0..100 as kube-scheduler computes them (ties
between nodes then broken at random), the normalisers ``max_cpu`` / ``max_gpu_milli`` of the
largest node (128 CPUs and 8 GPUs on openb), and best-fit GPU choice for shares unless the plugin
has its own (FGD). ``POLICIES`` maps each policy name to a factory; ``make_policy`` builds one.
"""

from __future__ import annotations

import bisect
import functools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.core.allocate import allocate
from scheduler.core.frag import FragModel, after_share, after_whole, typical_pods
from scheduler.core.rdma import vf_distance
from scheduler.core.request import MILLI, PodRequest, Wish
from scheduler.core.scoring import Policy, ScorePlugin
from scheduler.core.state import ClusterState
from scheduler.core.topology import LinkMatrix, best_gpu_set, greedy_gpu_set
from scheduler.core.utilization import LiveUtilizationScore, UtilizationScore

MAX_NODE_SCORE = 100
ONE_BY_ONE = 32  # caches kept per node version: up to this many changed nodes are worked out one by one
FEW_HOSTS = 32  # WholeNodeReserve.scarce_breaks: up to this many hosts of a shape among the nodes, in Python


class _Normalised(ScorePlugin):
    """Plugins that normalise by the largest node's CPU and GPU capacity."""

    max_cpu: float = 128_000.0
    max_gpu_milli: float = 8_000.0

    def bind(self, cluster: ClusterState, workload: Sequence[PodRequest], rng: random.Random) -> None:
        if len(cluster):
            self.max_cpu = float(max(int(cluster.cpu_capacity.max()), 1))
            self.max_gpu_milli = float(max(int(cluster.gpu_count.max()) * MILLI, MILLI))


class RandomScore(ScorePlugin):
    """One feasible node, drawn uniformly at random, scores 100; the others 0.

    A share goes to a GPU drawn at random among those it fits (the simulator's ``-gpusel random``).
    """

    name = "random"

    def __init__(self) -> None:
        self.rng = random.Random()

    def bind(self, cluster: ClusterState, workload: Sequence[PodRequest], rng: random.Random) -> None:
        self.rng = rng

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        scores = np.zeros(len(idx))
        scores[self.rng.randrange(len(idx))] = MAX_NODE_SCORE
        return scores

    def share_gpu(self, pod: PodRequest, cluster: ClusterState, i: int) -> int | None:
        fits = [g.index for g in cluster.nodes[i].gpus if g.fits_share(pod)]
        return self.rng.choice(fits) if fits else None


class DotProductScore(_Normalised):
    """Tetris: prefer the node whose free (CPU, GPU) vector is least aligned with the request.

    ``100 * (1 - (free . request) / 2)``, both vectors divided by the largest node's capacity.
    """

    name = "dotprod"

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        node_cpu = cluster.cpu_free[idx] / self.max_cpu
        node_gpu = cluster.gpu_free_total[idx] / self.max_gpu_milli
        dot = node_cpu * (pod.cpu_milli / self.max_cpu) + node_gpu * (
            pod.total_gpu_milli / self.max_gpu_milli
        )
        return np.floor(MAX_NODE_SCORE * (1 - dot / 2))


class BestFitScore(_Normalised):
    """Best fit: the node with the least CPU and GPU left after placing the pod (weights 0.5, 0.5)."""

    name = "bestfit"

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        left = (cluster.cpu_free[idx] - pod.cpu_milli) / self.max_cpu * 0.5
        left = left + (cluster.gpu_free_total[idx] - pod.total_gpu_milli) / self.max_gpu_milli * 0.5
        return np.floor((1.0 - left) * MAX_NODE_SCORE)


class SpreadScore(_Normalised):
    """Spread (kube-scheduler's LeastAllocated): the node with the most CPU and GPU left after
    placing the pod, so load and failure domains are spread across nodes (weights 0.5, 0.5)."""

    name = "spread"

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        left = (cluster.cpu_free[idx] - pod.cpu_milli) / self.max_cpu * 0.5
        left = left + (cluster.gpu_free_total[idx] - pod.total_gpu_milli) / self.max_gpu_milli * 0.5
        return np.floor(left * MAX_NODE_SCORE)


class GpuPackingScore(ScorePlugin):
    """GPU packing: first partly used GPUs, then free GPUs of used nodes, then idle nodes.

    Shares on a used GPU score ``100 - free%/10`` (at least 50); taking ``n`` free GPUs of a used
    node ``50 - n`` (at least 33); any GPU pod on an idle node ``33 - GPUs`` (at least GPUs).
    CPU-only pods score 0 everywhere.
    """

    name = "gpupacking"

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        if pod.gpu_count == 0:
            return np.zeros(len(idx))
        full = cluster.gpu_full_free[idx]
        idle = np.maximum(MAX_NODE_SCORE // 3 - full, full)
        if pod.is_share:
            rows = cluster.gpu_free[idx]
            if pod.enforced_share:  # only GPUs whose node enforces shares can take it
                rows = np.where(cluster.gpu_enforced[idx], rows, -1)
            chosen = np.where(rows >= pod.gpu_milli, rows, MILLI + 1).min(axis=1)
            on_used = np.maximum(MAX_NODE_SCORE - (chosen * 100 // MILLI) // 10, MAX_NODE_SCORE // 2)
            used = np.where(chosen >= MILLI, max(MAX_NODE_SCORE // 2 - 1, MAX_NODE_SCORE // 3), on_used)
        else:
            used = np.full(len(idx), max(MAX_NODE_SCORE // 2 - pod.gpu_count, MAX_NODE_SCORE // 3))
        return np.where(full == cluster.gpu_count[idx], idle, used).astype(float)


class GpuClusteringScore(_Normalised):
    """GPU clustering: put pods of the same GPU shape (share, 1-GPU, 2-GPU, ...) together.

    Nodes running only this shape score 75..100, nodes running it among others 50..75, idle nodes
    25..50, nodes running only other shapes 0..25; within a band, fuller nodes score higher.
    """

    name = "gpuclustering"

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        if pod.gpu_count == 0:
            return np.zeros(len(idx))
        quarter = MAX_NODE_SCORE // 4
        spec = int(self.max_gpu_milli)
        fill = quarter * (spec - cluster.gpu_free_total[idx]) // spec
        same = cluster.tag_count(pod.gpu_tag)[idx] > 0
        kinds = cluster.tag_kinds[idx]
        band = np.where(
            same, np.where(kinds == 1, 3 * quarter, 2 * quarter), np.where(kinds == 0, quarter, 0)
        )
        return (fill + band).astype(float)


class DemandTally:
    """The CPU and GPU milli asked by the pods arrived so far and by the whole workload (which FGD knows
    too), against the cluster's capacity, for the rules that depend on which resource runs out first; and
    whether a pod restricted to GPU models (asking GPUs) has arrived. Until the arrivals have asked for
    ``warm_up`` of the cluster's CPU or GPUs (a few first pods say little) the workload stands for them."""

    def __init__(self, warm_up: float = 0.1) -> None:
        self.warm_up = warm_up
        self.capacity = (1, 1)  # the cluster's CPU milli and GPU milli
        self.asked = [0, 0]  # CPU milli and GPU milli of the pods arrived so far
        self.prior = (0, 0)  # the same of the workload
        self.restricted_arrived = False

    def bind(self, cluster: ClusterState, workload: Sequence[PodRequest]) -> None:
        self.capacity = (max(int(cluster.cpu_capacity.sum()), 1), max(cluster.total_gpus() * MILLI, 1))
        self.prior = (sum(p.cpu_milli for p in workload), sum(p.total_gpu_milli for p in workload))
        self.asked = [0, 0]
        self.restricted_arrived = False

    def observe(self, pod: PodRequest) -> None:
        self.asked[0] += pod.cpu_milli
        self.asked[1] += pod.total_gpu_milli
        if pod.gpu_models and pod.gpu_count:
            self.restricted_arrived = True

    def warm(self) -> bool:
        """Whether the arrivals have asked for ``warm_up`` of the cluster's CPU or GPUs."""
        return (
            self.asked[0] >= self.warm_up * self.capacity[0]
            or self.asked[1] >= self.warm_up * self.capacity[1]
        )

    def demand(self) -> tuple[int, int]:
        """CPU and GPU milli asked: by the arrivals once warm, else by the workload."""
        return (self.asked[0], self.asked[1]) if self.warm() else self.prior

    def cpu_bound(self) -> bool:
        """Whether the CPU asked is the larger share of capacity (CPU would run out first)."""
        cpu, gpu = self.demand()
        return cpu * self.capacity[1] > gpu * self.capacity[0]

    def cpu_over_gpu(self) -> float:
        """The CPU asked as a share of the cluster's CPU over the GPU asked as a share of its GPUs (inf
        while no GPU was asked)."""
        cpu, gpu = self.demand()
        return (cpu / self.capacity[0]) / (gpu / self.capacity[1]) if gpu else math.inf


@dataclass(frozen=True)
class FineBands:
    """When ``FGDScore`` scores in the finer bands of ``step`` points instead of its own: while the CPU
    asked is more than ``ratio`` times the GPU asked, each as a share of the cluster's capacity
    (``DemandTally.cpu_over_gpu``, the workload's until ``warm_up`` of the cluster has been asked), until
    ``until_cpu`` of the cluster's CPU has been asked, and never once a pod restricted to GPU models has
    arrived. Where CPU runs out long before GPUs, FGD's fine bands place better early; elsewhere they
    deepen the dips (docs/performance.md "FGD's fine bands by an online gate")."""

    step: int = 1
    ratio: float = 1.3
    until_cpu: float = 0.7
    warm_up: float = 0.1


class FGDScore(ScorePlugin):
    """Fragmentation gradient descent: the placement that increases fragmentation least.

    Node score ``int(100 * sigmoid((frag_before - frag_after) / 1000))`` as in the FGD simulator
    (``exact=True``: the raw decrease, no sigmoid and no rounding; ``step``: that score divided by
    ``step``, rounded down, so placements within a band of ``step`` points tie); a share goes to the GPU with
    the best score (the lowest index among equals). Scores are memoised per request shape and node
    version, so only nodes that changed since the last pod of the same shape are re-evaluated.
    """

    name = "fgd"
    MAX_SHAPES = 256  # request shapes with per-node score arrays (oldest dropped first)
    MAX_MEMO = 500_000  # memoised evaluations (cleared when full)

    def __init__(
        self,
        exact: bool = False,
        coverage: float = 0.95,
        step: int = 1,
        whole_node_typical: bool = True,
        spec_step: int | None = None,
        fine: FineBands | None = None,
    ) -> None:
        self.exact = exact
        self.coverage = coverage
        self.step = step  # > 1: scores in bands of ``step`` points (more placements count as equal)
        self.base_step = step  # bind: the bands before any restricted pod
        # once a pod restricted to GPU models has arrived (observe): bands of this many points (None: step)
        self.spec_step = spec_step
        # FGD in bands of fine.step while CPU runs out far ahead of GPUs (None: never); its arrivals so far
        self.fine = fine
        self._demand = DemandTally(fine.warm_up) if fine is not None else None
        # False: pods asking for as many whole GPUs as the largest node has are left out of the
        # typical pods (fgd-reserve keeps hosts for them with WholeNodeReserve instead)
        self.whole_node_typical = whole_node_typical
        self.model = FragModel([])
        self._cache: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._node_models: list[frozenset[str]] = []
        self._memo: dict[tuple, tuple[float, frozenset[int]]] = {}

    def bind(self, cluster: ClusterState, workload: Sequence[PodRequest], rng: random.Random) -> None:
        typical = workload
        if not self.whole_node_typical:
            largest = int(cluster.gpu_count.max()) if len(cluster) else 0
            typical = [p for p in workload if largest < 2 or p.is_share or p.gpu_count < largest]
        self.model = FragModel(typical_pods(typical, self.coverage))
        self._cache = {}
        self._memo = {}
        self._node_models = [cluster.model_sets[c] for c in cluster.model_code.tolist()]
        self.step = self.base_step
        if self._demand is not None and self.fine is not None:
            self._demand.bind(cluster, workload)  # every pod's demand, whole-node pods' too
            self.step = self._wanted_step(self._demand, self.fine)

    def observe(self, pod: PodRequest) -> None:
        """With ``spec_step``: the first arrived pod restricted to GPU models (asking GPUs) widens the
        bands to ``spec_step`` for the rest of the run; with ``fine``: the bands for the next pod as
        ``FineBands`` says. The per-shape scores and the memo hold banded scores, so on a change of bands
        they start afresh."""
        if self._demand is not None and self.fine is not None:
            self._demand.observe(pod)
            want = self._wanted_step(self._demand, self.fine)
            if want != self.step:
                self.set_step(want)
            return
        if self.spec_step is None or self.step == self.spec_step or not (pod.gpu_models and pod.gpu_count):
            return
        self.set_step(self.spec_step)

    def _wanted_step(self, demand: DemandTally, fine: FineBands) -> int:
        """The bands for the next pod, by ``fine`` over ``demand`` (the arrivals so far): its step while its
        gate holds, else ``spec_step`` once a restricted pod has arrived (if set), else the base step."""
        if demand.restricted_arrived:
            return self.spec_step if self.spec_step is not None else self.base_step
        if demand.asked[0] < fine.until_cpu * demand.capacity[0] and demand.cpu_over_gpu() > fine.ratio:
            return fine.step
        return self.base_step

    def set_step(self, step: int) -> None:
        """Score in bands of ``step`` points from the next pod on; the per-shape scores and the memo hold
        scores in the old bands, so they start afresh."""
        self.step = step
        self._cache = {}
        self._memo = {}

    def bounds(self) -> tuple[float, float] | None:
        """``to_score``'s range: 0 .. 100 // step, or 100 // step .. 0 for a step below 0 (None when
        ``exact``: the raw decrease)."""
        if self.exact:
            return None
        edge = float(MAX_NODE_SCORE // self.step)
        return (min(0.0, edge), max(0.0, edge))

    def to_score(self, decrease: float) -> float:
        if self.exact:
            return decrease
        return float(int(MAX_NODE_SCORE / (1.0 + math.exp(-decrease / 1000.0))) // self.step)

    def node_score(self, pod: PodRequest, cluster: ClusterState, i: int) -> tuple[float, int]:
        """(score, GPU index for a share or -1) of placing ``pod`` on node ``i``.

        The result depends only on the node's models, sorted free milli and which typical pods' CPU
        fits before and after, so it is memoised on that key across nodes.
        """
        models = self._node_models[i]
        memory = cluster.any_gpu_memory and bool(cluster.gpu_memory_known[i])
        if pod.is_share and (pod.gpu_milli == 0 or (pod.gpu_models and len(models) > 1)):
            return self._share_general(pod, cluster, i)
        candidates: frozenset[int] | None = None  # free values of the GPUs the share fits (None: all)
        restricted = memory or pod.enforced_share  # not every GPU with room can take it
        if pod.is_share and restricted:
            candidates = frozenset(g.free_milli for g in cluster.nodes[i].gpus if g.fits_share(pod))
        free = cluster.gpu_key[i]
        cpu = int(cluster.cpu_free[i])
        cuts = self.model.cpu_sorted
        key = (
            pod.gpu_milli if pod.gpu_count else 0,
            pod.gpu_count,
            models,
            free,
            bisect.bisect_right(cuts, cpu),
            bisect.bisect_right(cuts, cpu - pod.cpu_milli),
            candidates,
        )
        hit = self._memo.get(key)
        if hit is None:
            if len(self._memo) >= self.MAX_MEMO:
                self._memo.clear()
            hit = self._memo[key] = self._evaluate(pod, models, free, key[4], key[5], candidates)
        score, best_values = hit
        if not pod.is_share:
            return score, -1
        if restricted:
            gpus = cluster.nodes[i].gpus
            return score, next(g.index for g in gpus if g.free_milli in best_values and g.fits_share(pod))
        row = cluster.gpu_rows[i]
        return score, next(j for j, v in enumerate(row) if v in best_values)

    def _evaluate(
        self,
        pod: PodRequest,
        models: frozenset[str],
        free: tuple[int, ...],
        before_at: int,
        after_at: int,
        candidates: frozenset[int] | None = None,
    ) -> tuple[float, frozenset[int]]:
        """Score and (for a share) the free values of the GPUs that achieve it."""
        frag = self.model.frag_at
        before = frag(models, free, before_at)
        if not pod.is_share:
            after = after_whole(free, pod.gpu_count) if pod.gpu_count else free
            return self.to_score(before - frag(models, after, after_at)), frozenset()
        best, values = -math.inf, set()
        for value in set(free) if candidates is None else candidates:
            if value < pod.gpu_milli:
                continue
            s = self.to_score(before - frag(models, after_share(free, value, pod.gpu_milli), after_at))
            if s > best:
                best, values = s, {value}
            elif s == best:
                values.add(value)
        return best, frozenset(values)

    def _share_general(self, pod: PodRequest, cluster: ClusterState, i: int) -> tuple[float, int]:
        """Shares asked by memory only, or model-restricted on mixed nodes: per GPU, no memo."""
        models = self._node_models[i]
        free = cluster.gpu_key[i]
        cpu = int(cluster.cpu_free[i])
        before = self.model.frag(models, free, cpu)
        best, best_j = -math.inf, -1
        for gpu in cluster.nodes[i].gpus:
            if not gpu.fits_share(pod):
                continue
            after = after_share(free, gpu.free_milli, gpu.share_for(pod)[0])
            s = self.to_score(before - self.model.frag(models, after, cpu - pod.cpu_milli))
            if s > best:
                best, best_j = s, gpu.index
        return best, best_j

    def _entry(self, pod: PodRequest, cluster: ClusterState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-node (score, version seen, share GPU) arrays of the pod's request shape."""
        key = (
            pod.cpu_milli,
            pod.gpu_count,
            pod.gpu_milli,
            pod.gpu_memory_mib,
            pod.gpu_models,
            pod.enforced_share,
        )
        entry = self._cache.get(key)
        if entry is None:
            if len(self._cache) >= self.MAX_SHAPES:
                del self._cache[next(iter(self._cache))]
            n = len(cluster)
            entry = (np.zeros(n), np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64))
            self._cache[key] = entry
        return entry

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        scores, seen, choice = self._entry(pod, cluster)
        version = cluster.version
        for i in idx[seen[idx] != version[idx]].tolist():
            scores[i], choice[i] = self.node_score(pod, cluster, i)
            seen[i] = version[i]
        return scores[idx]

    def share_gpu(self, pod: PodRequest, cluster: ClusterState, i: int) -> int | None:
        if not pod.is_share:
            return None
        scores, seen, choice = self._entry(pod, cluster)
        if seen[i] != cluster.version[i]:
            scores[i], choice[i] = self.node_score(pod, cluster, i)
            seen[i] = cluster.version[i]
        return int(choice[i]) if choice[i] >= 0 else None


class AlignmentScore(ScorePlugin):
    """Tetris-style alignment: cosine between the request and the node's free (CPU, GPU) vectors.

    Both vectors are in fractions of the node's own capacity, so a CPU-heavy pod prefers nodes
    whose free CPU is large relative to their free GPU (CPU-rich nodes, or nodes whose GPUs are
    used up) and leaves the CPU of GPU-dense nodes to the GPU pods that need it. 0..1, higher is
    better; 0 for a pod that asks for neither. The value depends only on the request and on the
    node's state (CPU capacity, GPU count, free CPU, free GPU milli): every node carries the id of its
    state (``_NodeStates``, refreshed from the cluster's log of changes), and each request (and band
    step) keeps its value per state id (``_BandTable``), worked out the first time a node in that state
    is asked about; a pod then costs a few gathers over the nodes asked about.
    """

    name = "alignment"
    MAX_SHAPES = 256  # requests (and steps) whose tables are kept (the oldest dropped first)
    MAX_STATES = 1 << 16  # node states numbered before the numbering (and every table) starts afresh
    MAX_DECIMALS = 9  # pick_tied: the rounded cosine times 10**decimals fits the int keys

    def __init__(self, decimals: int = 6, step: float = 0.0) -> None:
        self.decimals = decimals
        self.step = step  # > 0: the cosine in bands of ``step`` (nodes in one band tie)
        self._cpu_inv = np.zeros(0)
        self._gpu_inv = np.zeros(0)
        self._states: _NodeStates | None = None
        self._order: tuple[np.ndarray, np.ndarray] | None = None  # (tie_rank, len - 1 - tie_rank)

    def bind(self, cluster: ClusterState, workload: Sequence[PodRequest], rng: random.Random) -> None:
        self._cpu_inv = 1.0 / np.maximum(cluster.cpu_capacity, 1)
        self._gpu_inv = 1.0 / np.maximum(cluster.gpu_count * MILLI, 1)
        self._states = None
        self._order = None

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        return self.aligned(pod, cluster, idx, self.step)

    def pick_tied(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> int | None:
        keys = self.aligned_keys(pod, cluster, idx, self.step)
        return None if keys is None else int(keys[0].argmax())

    def aligned(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray, step: float) -> np.ndarray:
        """The cosine on the nodes of ``idx`` (rounded to ``decimals``), in bands of ``step`` when it
        is above 0."""
        table, ids, _ = self._lookup(pod, cluster, idx, step)
        return table.floats.take(ids)

    def aligned_keys(
        self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray, step: float
    ) -> tuple[np.ndarray, int, int] | None:
        """``aligned`` and the cluster's node order as one int key per node of ``idx``: higher where
        ``aligned`` is higher, then where ``tie_rank`` is lower (so the first largest key is the node
        ``schedule.pick`` takes among the best ``aligned``), with a lower bound of ``aligned`` there
        (as an int: the band, or the rounded cosine times ``10**decimals``; the least worked out for
        this request on any node) and the bound of the keys' span (every key is below it and above minus
        it). None without a node order (ties at random), or when the keys would not fit an int64 (a step
        so small that the bands pass ``BAND_LIMIT``)."""
        rank = cluster.tie_rank
        if rank is None or self.decimals > self.MAX_DECIMALS:
            return None
        table, _, ints = self._lookup(pod, cluster, idx, step)
        order = self._order
        if order is None or order[0] is not rank:
            order = self._order = (rank, len(rank) - 1 - rank)
        n = len(rank)
        span = (max(table.high, -table.low) + 1) * n
        if span >= 1 << 62:  # bands of a step near 0: the keys would pass what an int64 holds
            return None
        return ints * n + order[1].take(idx), table.low, span

    def _lookup(
        self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray, step: float
    ) -> tuple[_BandTable, np.ndarray, np.ndarray]:
        """The request's table (worked out for every node of ``idx``), the nodes' state ids and their
        ints."""
        states = self._node_states(cluster)
        key = (pod.cpu_milli, pod.total_gpu_milli, step)
        table = states.tables.get(key)
        if table is None:
            if len(states.tables) >= self.MAX_SHAPES:
                del states.tables[next(iter(states.tables))]
            table = states.tables[key] = _BandTable(len(states.states))
        elif len(table.ints) < len(states.states):
            table.grow(len(states.states))
        ids = states.ids.take(idx)
        ints = table.ints.take(ids)
        if len(ids) and _least(ints) == _UNKNOWN:  # some states not worked out yet for this request
            sides, cpu, gpu, decimals = states.sides, key[0], key[1], self.decimals
            floats, known, low, high = table.floats, table.ints, table.low, table.high
            for sid in set(ids[ints == _UNKNOWN].tolist()):
                value, whole = aligned_band(sides[sid], cpu, gpu, step, decimals)
                floats[sid] = value
                known[sid] = whole
                low, high = min(low, whole), max(high, whole)
            table.low, table.high = low, high
            ints = known.take(ids)
        return table, ids, ints

    def _node_states(self, cluster: ClusterState) -> _NodeStates:
        """The node states of ``cluster``, refreshed (numbered afresh, every table dropped, for another
        cluster or past ``MAX_STATES``). A cluster of another size than the one bound takes this class's
        own arrays afresh (``AlignmentScore.bind`` only: a subclass's ``bind`` would drop what it derived
        from the workload, half way through a decision)."""
        if len(self._cpu_inv) != len(cluster):
            AlignmentScore.bind(self, cluster, (), random.Random())
        states = self._states
        if states is None or states.cluster is not cluster or len(states.states) > self.MAX_STATES:
            states = self._states = _NodeStates(cluster)
        else:
            states.refresh()
        return states

    def band_of(self, state: tuple[int, int, int, int], cpu: int, gpu: int, step: float) -> tuple[float, int]:
        """``aligned`` of one node state (CPU capacity, GPU count, free CPU, free GPU milli) for a request
        of ``cpu`` CPU milli and ``gpu`` GPU milli (``aligned_band``)."""
        return aligned_band(node_side(state), cpu, gpu, step, self.decimals)

    def free_vectors(self, cluster: ClusterState, rows: slice | np.ndarray) -> np.ndarray:
        """``[3, rows]``: these nodes' free CPU and free GPU as fractions of their capacity, and the
        squared length of that vector (the vector form of ``band_of``'s node side)."""
        cpu = cluster.cpu_free[rows] * self._cpu_inv[rows]
        gpu = cluster.gpu_free_total[rows] * self._gpu_inv[rows]
        return np.stack((cpu, gpu, cpu * cpu + gpu * gpu))

    def free_vector_at(self, cluster: ClusterState, i: int) -> tuple[float, float, float]:
        """``free_vectors`` of node ``i`` alone, in Python: the same float operations in the same
        order, so the same values to the last bit."""
        cpu = cluster.cpu_free.item(i) * self._cpu_inv.item(i)
        gpu = cluster.gpu_free_total.item(i) * self._gpu_inv.item(i)
        return cpu, gpu, cpu * cpu + gpu * gpu


_UNKNOWN = np.iinfo(np.int64).min  # _BandTable.ints of a state not worked out yet
BAND_LIMIT = 1 << 62  # aligned_band: an int at least this far from 0 is this (a step near 0, many decimals)
_least = np.minimum.reduce  # ndarray.min without its Python wrapper
_largest = np.maximum.reduce  # ndarray.max without its Python wrapper


def node_side(state: tuple[int, int, int, int]) -> tuple[float, float, float, float, float]:
    """What ``aligned_band`` needs of a node state (CPU capacity, GPU count, free CPU, free GPU milli):
    the inverses of its CPU and GPU capacity, its free CPU and GPU as fractions of them and the squared
    length of that vector (``AlignmentScore.free_vector_at``'s float operations, in its order)."""
    cpu_capacity, gpus, cpu_free, gpu_free = state
    cpu_inv = 1.0 / max(cpu_capacity, 1)
    gpu_inv = 1.0 / max(gpus * MILLI, 1)
    have_cpu = cpu_free * cpu_inv
    have_gpu = gpu_free * gpu_inv
    return cpu_inv, gpu_inv, have_cpu, have_gpu, have_cpu * have_cpu + have_gpu * have_gpu


def aligned_band(
    side: tuple[float, float, float, float, float], cpu: int, gpu: int, step: float, decimals: int
) -> tuple[float, int]:
    """``AlignmentScore.aligned`` of a node (``node_side``) for a request of ``cpu`` CPU milli and ``gpu``
    GPU milli, in Python with the float operations of the vector code in the same order (the same value
    to the last bit), and as an int of the same order: the band, or (``step`` 0) the rounded cosine
    times ``10**decimals`` (``round_like_numpy``, inline for ``decimals`` >= 0). An int at least
    ``BAND_LIMIT`` from 0 (a step near 0, or many decimals) is that limit and orders nothing
    (``aligned_keys`` then declines)."""
    cpu_inv, gpu_inv, have_cpu, have_gpu, have_length = side
    want_cpu = cpu * cpu_inv
    want_gpu = gpu * gpu_inv
    norm = math.sqrt(have_length * (want_cpu * want_cpu + want_gpu * want_gpu))
    cosine = (have_cpu * want_cpu + have_gpu * want_gpu) / norm if norm > 0 else 0.0
    if 0 <= decimals <= 308:  # 10**decimals a finite float
        scale = _power_of_ten(decimals)
        scaled = cosine * scale
        whole = round(scaled)
        rounded = math.copysign(whole, scaled) / scale
    else:
        rounded, whole = round_like_numpy(cosine, decimals)
    if step <= 0:  # beyond BAND_LIMIT (18 decimals and more): the int at the limit
        return rounded, whole if -BAND_LIMIT < whole < BAND_LIMIT else int(math.copysign(BAND_LIMIT, whole))
    ratio = rounded / step
    if not -BAND_LIMIT < ratio < BAND_LIMIT:  # a step near 0: the float as np.floor's, the int at the limit
        return float(np.floor(ratio)), int(math.copysign(BAND_LIMIT, ratio))
    band = math.floor(ratio)
    return (math.copysign(0.0, ratio) if band == 0 else float(band)), band  # np.floor keeps -0.0


@functools.cache
def _power_of_ten(decimals: int) -> float:
    """``10.0 ** decimals`` as numpy's ``round`` works it out (repeated multiplication by 10)."""
    out = 1.0
    for _ in range(decimals):
        out *= 10.0
    return out


def round_like_numpy(x: float, decimals: int) -> tuple[float, int]:
    """``np.round(x, decimals)`` to the last bit, and the integer it is that many tenths of (``decimals``
    >= 0) or that many tens, hundreds... of (below 0): numpy multiplies by ``10**decimals``, rounds to
    the nearest integer (half to even, keeping the sign of a zero) and divides back; for ``decimals``
    below 0 it divides by ``10**-decimals``, rounds and multiplies back (past 308 decimals the power is
    infinite and every value NaN; the integer is then 0)."""
    scale = _power_of_ten(abs(decimals))
    scaled = x / scale if decimals < 0 else x * scale
    if not math.isfinite(scaled):  # 309 decimals and more: numpy's inf / inf and 0 * inf, NaN
        return (scaled * scale if decimals < 0 else scaled / scale), 0
    whole = round(scaled)
    rounded = math.copysign(float(whole), scaled)
    return (rounded * scale if decimals < 0 else rounded / scale), whole


class _NodeStates:
    """Per node of one cluster, the id of its state (``ids``): its CPU capacity, GPU count, free CPU and
    free milli per GPU (``ClusterState.gpu_key``, whose sum is its free GPU milli), numbered in the
    order first seen (``states``, and ``sides``: each state's ``node_side``), refreshed from the
    cluster's log of changes. What the tables keep per state id depends on these alone: the alignment
    of the requests asked about (``tables``, ``_BandTable``) and ``ReserveThenAlign``'s keys (``keys``,
    ``_KeyTable``: the alignment and the share remainder)."""

    __slots__ = (
        "capacity",
        "cluster",
        "generation",
        "gpus",
        "ids",
        "index",
        "keys",
        "sides",
        "states",
        "tables",
    )

    def __init__(self, cluster: ClusterState) -> None:
        self.cluster = cluster
        self.generation = cluster.generation
        self.index: dict[tuple[int, int, int, tuple[int, ...]], int] = {}
        self.states: list[tuple[int, int, int, tuple[int, ...]]] = []
        self.sides: list[tuple[float, float, float, float, float]] = []
        self.tables: dict[tuple[int, int, float], _BandTable] = {}
        self.keys: dict[tuple[int, int, float, int], _KeyTable] = {}
        self.capacity: list[int] = cluster.cpu_capacity.tolist()  # per node (fixed)
        self.gpus: list[int] = cluster.gpu_count.tolist()  # per node (fixed)
        rows = zip(self.capacity, self.gpus, cluster.cpu_free.tolist(), cluster.gpu_key, strict=True)
        self.ids = np.array([self._id(state) for state in rows], dtype=np.int64)

    def _id(self, state: tuple[int, int, int, tuple[int, ...]]) -> int:
        sid = self.index.get(state)
        return self.new_id(state) if sid is None else sid

    def new_id(self, state: tuple[int, int, int, tuple[int, ...]]) -> int:
        """Number a state not seen before."""
        sid = self.index[state] = len(self.states)
        self.states.append(state)
        capacity, gpus, cpu, free = state
        self.sides.append(node_side((capacity, gpus, cpu, sum(free))))
        return sid

    def refresh(self) -> None:
        """Take the state of every node changed since the last refresh (a node changed twice is looked
        at twice; all nodes when the log no longer reaches back)."""
        cluster = self.cluster
        if self.generation == cluster.generation:
            return
        rows = cluster.changed_since(self.generation)
        self.generation = cluster.generation
        if rows is None:
            rows = range(len(cluster))
        capacity, gpus, cpu, free = self.capacity, self.gpus, cluster.cpu_free, cluster.gpu_key
        ids, index, new = self.ids, self.index, self.new_id
        for i in rows:
            state = (capacity[i], gpus[i], cpu.item(i), free[i])
            sid = index.get(state)
            ids[i] = new(state) if sid is None else sid


class _BandTable:
    """One request's (and step's) ``aligned`` per node state id: ``floats`` (NaN where not worked out
    yet) and ``ints`` (the same order as an int, ``_UNKNOWN`` where not worked out yet); ``low`` and
    ``high``: the least and the largest int put (0 before any)."""

    __slots__ = ("floats", "high", "ints", "low")

    def __init__(self, n: int) -> None:
        n = 2 * n + 4096  # room for the states to come
        self.floats = np.full(n, np.nan)
        self.ints = np.full(n, _UNKNOWN, dtype=np.int64)
        self.low = self.high = 0

    def grow(self, n: int) -> None:
        more = max(n, 2 * len(self.ints)) - len(self.ints)
        self.floats = np.concatenate((self.floats, np.full(more, np.nan)))
        self.ints = np.concatenate((self.ints, np.full(more, _UNKNOWN, dtype=np.int64)))


def fgd_align() -> Policy:
    """Our policy: FGD first, Tetris alignment among the placements FGD scores equal.

    FGD's integer score (100 steps of a sigmoid of the fragmentation decrease) says which
    placements fragment equally; the FGD simulator then takes the first such node in a fixed node
    order. We take the best-aligned one instead (then the node order).
    """
    return Policy(
        "fgd-align",
        ((FGDScore(), 1.0),),
        "FGD, ties broken by CPU/GPU alignment of request and free resources (ours)",
        tie_break=AlignmentScore(),
    )


class WholeNodeReserve:
    """Keeps the last nodes able to host each whole-node pod shape of the workload.

    A whole-node shape is a pod asking for as many whole GPUs as the largest node has (8 on openb).
    Such pods are too rare to be among FGD's typical pods, so nothing in FGD stops the last idle
    nodes with enough CPU and memory for them from being broken by small pods, after which they are
    refused while 8 GPUs are free elsewhere in pieces. ``penalty`` counts, per candidate node, the
    whole-node shapes it would stop being able to host although at most ``keep`` nodes still can.

    ``keep``: a fixed number; or None, in proportion: the whole-node pods' share of the workload's GPU
    demand times the number of nodes with that many GPUs, at least ``MIN_KEEP`` (on openb 6% of the
    8-GPU nodes for the default trace, 16% for multigpu20). ``adaptive``: instead, per shape, the
    hosts the whole-node pods still to come are expected to need: the share of the GPU demand seen so
    far that came from pods needing such a host (``observe``: every arrival, placed or not; before
    the first, the workload's share) times the cluster's free GPU milli, in nodes' worth of the
    shape's GPUs, times ``horizon``, rounded up. ``prior_weight``: the workload's share counts as
    that share of the cluster's GPU capacity arrived (0: only before the first arrival), so a shape
    not seen yet among the first arrivals is not taken for one that never comes. The shapes and
    shares come from the expected workload (its shape distribution, as FGD's typical pods) and the
    arrivals so far, never from pods still to come.

    ``by_need``: a whole-node pod may break a scarce shape it does not need itself (one of more CPU or
    memory than it asks: an 8-GPU pod of 64 CPUs on the last nodes with 120 free); without, a pod of
    as many whole GPUs as a shape breaks none of it.
    """

    MIN_KEEP = 2

    def __init__(
        self,
        keep: int | None = None,
        adaptive: bool = False,
        horizon: float = 1.0,
        prior_weight: float = 0.0,
        by_need: bool = False,
    ) -> None:
        self.fixed = keep
        self.adaptive = adaptive
        self.horizon = horizon  # adaptive: the expected need times this
        self.prior_weight = prior_weight  # adaptive: the workload's share as this share of capacity arrived
        self.prior_milli = 0.0  # adaptive: prior_weight x the cluster's GPU milli (bind)
        self.by_need = by_need
        self.keep = keep if keep is not None else self.MIN_KEEP
        self.shapes: list[tuple[int, int, int]] = []  # (GPUs, CPU milli, memory MiB)
        self.prior: list[float] = []  # adaptive: per shape, the workload's share of demand needing a host
        self.seen: list[int] = []  # adaptive: per shape, GPU milli arrived of pods needing such a host
        self.seen_total = 0  # adaptive: GPU milli arrived
        self._limits = np.zeros((0, 3, 1), dtype=np.int64)  # per shape: GPUs, CPU milli, memory MiB
        self._table: _HostTable | None = None
        self._fewest = 0  # hosts_at: the fewest GPUs a shape takes
        self._none: tuple[bool, ...] = ()  # hosts_at: a node that hosts no shape
        self._breakable: dict[tuple[bool, int, int, int], list[int]] = {}  # _scarce: per pod kind

    def bind(self, cluster: ClusterState, workload: Sequence[PodRequest]) -> None:
        largest = int(cluster.gpu_count.max()) if len(cluster) else 0
        whole = [p for p in workload if largest >= 2 and not p.is_share and p.gpu_count >= largest]
        self.shapes = sorted({(p.gpu_count, p.cpu_milli, p.memory_mib) for p in whole})
        demand = sum(p.total_gpu_milli for p in workload)
        if self.fixed is None and not self.adaptive:
            hosts = int(np.count_nonzero(cluster.gpu_count >= largest)) if largest >= 2 else 0
            share = sum(p.total_gpu_milli for p in whole) / demand if demand else 0.0
            self.keep = max(self.MIN_KEEP, math.ceil(hosts * share))
        self.prior = [
            sum(p.total_gpu_milli for p in whole if self._needs(p, shape)) / demand if demand else 0.0
            for shape in self.shapes
        ]
        self.seen = [0] * len(self.shapes)
        self.seen_total = 0
        self.prior_milli = self.prior_weight * float(cluster.total_gpus() * MILLI)
        self._limits = np.array(self.shapes, dtype=np.int64).reshape(len(self.shapes), 3, 1)
        self._fewest = min((g for g, _, _ in self.shapes), default=0)
        self._none = (False,) * len(self.shapes)
        self._table = None
        self._breakable = {}

    @staticmethod
    def _needs(pod: PodRequest, shape: tuple[int, int, int]) -> bool:
        """Whether ``pod`` can only run on a node that is also a host of ``shape``."""
        gpus, cpu, memory = shape
        big = pod.cpu_milli >= cpu and pod.memory_mib >= memory
        return big and not pod.is_share and pod.gpu_count >= gpus

    def observe(self, pod: PodRequest) -> None:
        """Count an arrival (adaptive mode)."""
        if not self.adaptive or not pod.total_gpu_milli:
            return
        self.seen_total += pod.total_gpu_milli
        if not pod.is_share and self.shapes and pod.gpu_count >= self.shapes[0][0]:
            for k, shape in enumerate(self.shapes):
                if self._needs(pod, shape):
                    self.seen[k] += pod.total_gpu_milli

    def keep_for(self, k: int, free_milli: int) -> int:
        """How many hosts of shape ``k`` to keep, with ``free_milli`` GPU milli free in the cluster."""
        if not self.adaptive:
            return self.keep
        return max(
            self.keep, math.ceil(self.horizon * self._share(k) * free_milli / (self.shapes[k][0] * MILLI))
        )

    def _share(self, k: int) -> float:
        """Shape ``k``'s share of the GPU demand arrived so far (``arrival_share``)."""
        return arrival_share(self.seen[k], self.seen_total, self.prior[k], self.prior_milli)

    def hosts(self, cluster: ClusterState, rows: slice | np.ndarray) -> np.ndarray:
        """``[shapes, rows]``: which of these nodes can host each whole-node shape now."""
        gpus, cpu, memory = self._limits[:, 0], self._limits[:, 1], self._limits[:, 2]
        return (
            (cluster.gpu_full_free[rows] >= gpus)
            & (cluster.cpu_free[rows] >= cpu)
            & (cluster.mem_free[rows] >= memory)
        )

    def hosts_at(self, cluster: ClusterState, i: int) -> tuple[bool, ...]:
        """``hosts`` of node ``i`` alone, per shape (Python, for a few nodes)."""
        gpus = cluster.gpu_full_free.item(i)
        if gpus < self._fewest:  # too few free GPUs for any shape (the usual case)
            return self._none
        cpu, memory = cluster.cpu_free.item(i), cluster.mem_free.item(i)
        return tuple([gpus >= g and cpu >= c and memory >= m for g, c, m in self.shapes])

    def penalty(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        """Per node of ``idx``, how many scarce whole-node shapes placing ``pod`` there would break."""
        out = self.scarce_breaks(pod, cluster, idx)
        return np.zeros(len(idx)) if out is None else out

    def _scarce(self, table: _HostTable, pod: PodRequest, horizon: float | None = None) -> list[int]:
        """The shapes ``pod`` may break: those of more whole GPUs than it asks (with ``by_need``: those
        it does not need, ``_needs``) with hosts left, but at most ``keep_for`` of them. ``keep_for`` is
        inline, as the same float expression (``_share`` too); ``count <= ceil(x)`` is ``count - 1 < x``
        for an int ``count``; it is at least ``keep``: only an adaptive keep can be above. ``horizon``:
        this one instead of the reserve's own.
        """
        keep, counts = self.keep, table.counts
        if not self.adaptive:
            return [k for k in self._may_break(pod) if 0 < counts[k] <= keep]
        out: list[int] = []
        free, shapes = table.free_milli, self.shapes
        if horizon is None:
            horizon = self.horizon
        seen, prior, weight, total = self.seen, self.prior, self.prior_milli, self.seen_total
        for k in self._may_break(pod):
            count = counts[k]
            if not count:
                continue
            if count > keep:
                if weight:
                    share = (seen[k] + prior[k] * weight) / (total + weight)
                else:
                    share = seen[k] / total if total else prior[k]
                if not count - 1 < horizon * share * free / (shapes[k][0] * MILLI):
                    continue
            out.append(k)
        return out

    def _may_break(self, pod: PodRequest) -> list[int]:
        """The shapes a pod of this kind may break at all, worked out once per kind (whole GPUs, and
        with ``by_need`` its CPU and memory): a pod of as many whole GPUs as a shape breaks none of it,
        with ``by_need`` none it needs."""
        whole = 0 if pod.is_share else pod.gpu_count
        need = self.by_need and whole > 0
        key = (need, whole, pod.cpu_milli, pod.memory_mib) if need else (False, whole, 0, 0)
        out = self._breakable.get(key)
        if out is None:
            if need:
                out = [k for k, shape in enumerate(self.shapes) if not self._needs(pod, shape)]
            else:
                out = [k for k, shape in enumerate(self.shapes) if whole < shape[0]]
            self._breakable[key] = out
        return out

    def scarce_breaks(
        self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray, horizon: float | None = None
    ) -> np.ndarray | None:
        """``penalty``, or None where it is 0 on every node of ``idx``; ``horizon``: this one instead of
        the reserve's own (the tie-breaker's while CPU binds).

        The hosts of each shape are kept per node version (``_HostTable``), so a pod costs a look at
        the counts, and at the few hosts of a shape that is down to its last ``keep_for`` ones.
        """
        if not self.shapes:
            return None
        table = self._table
        if table is None or table.cluster is not cluster:
            table = self._table = _HostTable(self, cluster)
        else:
            table.refresh(self)
        scarce = self._scarce(table, pod, horizon)
        if not scarce:
            return None
        take = 1 if pod.is_share else pod.gpu_count
        if len(scarce) == 1:  # the usual case: one row
            rows, where = None, table.hosts[scarce[0]].take(idx).nonzero()[0]
        else:
            rows, where = table.hosts[scarce].take(idx, axis=1).nonzero()
        if not where.size:
            return None
        shape_of = self.shapes
        if where.size <= FEW_HOSTS:  # the few scarce hosts among idx, in Python
            out: np.ndarray | None = None
            cpu_after, memory_after = pod.cpu_milli, pod.memory_mib
            full, cpu_free, memory_free = cluster.gpu_full_free, cluster.cpu_free, cluster.mem_free
            ks = [scarce[0]] * len(where) if rows is None else [scarce[r] for r in rows.tolist()]
            for k, p in zip(ks, where.tolist(), strict=True):
                gpus, cpu, memory = shape_of[k]
                i = idx.item(p)
                if not (
                    full.item(i) - take >= gpus
                    and cpu_free.item(i) - cpu_after >= cpu
                    and memory_free.item(i) - memory_after >= memory
                ):
                    if out is None:
                        out = np.zeros(len(idx))
                    out[p] += 1
            return out
        nodes = idx[where]
        if rows is None:  # one shape: its limits as scalars
            gpus, cpu, memory = self.shapes[scarce[0]]
        else:  # per (shape, node) pair
            limits = self._limits[:, :, 0][np.asarray(scarce)[rows]]
            gpus, cpu, memory = limits[:, 0], limits[:, 1], limits[:, 2]
        after = (
            (cluster.gpu_full_free[nodes] - take >= gpus)
            & (cluster.cpu_free[nodes] - pod.cpu_milli >= cpu)
            & (cluster.mem_free[nodes] - pod.memory_mib >= memory)
        )
        broken = where[~after]
        if not broken.size:
            return None
        return np.bincount(broken, minlength=len(idx)).astype(np.float64)


def arrival_share(seen: float, total: float, prior: float, weight: float) -> float:
    """A kind of pod's share of the GPU milli arrived so far: ``seen`` of ``total`` arrived, with the
    workload's share ``prior`` counted as ``weight`` GPU milli arrived (``weight`` 0: the workload's share
    alone before the first arrival, then the arrivals')."""
    if weight:
        return (seen + prior * weight) / (total + weight)
    return seen / total if total else prior


class _HostTable:
    """``WholeNodeReserve``'s hosts per shape and node (``hosts``, ``[shapes, N]``) and their counts,
    for one cluster: worked out for every node at first, then only for the nodes that changed since
    (a node's free GPUs, CPU and memory change only with it), one by one when they are few."""

    __slots__ = ("cluster", "counts", "flags", "free", "free_milli", "generation", "hosts")

    def __init__(self, reserve: WholeNodeReserve, cluster: ClusterState) -> None:
        self.cluster = cluster
        self.generation = cluster.generation
        self.hosts = reserve.hosts(cluster, slice(None))
        self.counts: list[int] = self.hosts.sum(axis=1).tolist()
        self.flags: list[tuple[bool, ...]] = [tuple(f) for f in self.hosts.T.tolist()]  # per node
        self.free: list[int] = cluster.gpu_free_total.tolist()  # per node, as last seen
        self.free_milli = sum(self.free)  # the cluster's free GPU milli (gpu_free_total summed)

    def refresh(self, reserve: WholeNodeReserve) -> None:
        """Take the nodes changed since the last refresh (each change once: taking a node again changes
        nothing)."""
        cluster = self.cluster
        if self.generation == cluster.generation:
            return
        rows = cluster.changed_since(self.generation)
        self.generation = cluster.generation
        if rows is None or len(rows) > ONE_BY_ONE:
            at = slice(None) if rows is None else np.array(rows)
            self.hosts[:, at] = reserve.hosts(cluster, at)
            self.counts = self.hosts.sum(axis=1).tolist()
            self.flags = [tuple(f) for f in self.hosts.T.tolist()]
            self.free = cluster.gpu_free_total.tolist()
            self.free_milli = sum(self.free)
            return
        for i in rows:
            free = cluster.gpu_free_total.item(i)
            self.free_milli += free - self.free[i]
            self.free[i] = free
            now = reserve.hosts_at(cluster, i)
            if now != self.flags[i]:
                self.take_flags(i, now)

    def take_flags(self, i: int, now: tuple[bool, ...]) -> None:
        """Node ``i`` hosts the shapes flagged in ``now`` (per shape): its flags, hosts and counts."""
        was = self.flags[i]
        self.flags[i] = now
        self.hosts[:, i] = now
        for k, (a, b) in enumerate(zip(now, was, strict=True)):
            self.counts[k] += a - b


def share_waste_table(workload: Sequence[PodRequest], min_share: float = 0.01) -> np.ndarray:
    """Per free milli r (0..1000): what of r no combination of the workload's share sizes can fill.

    The sizes are those of at least ``min_share`` of the share pods (a function of the shape
    distribution only); ``r - (largest sum of such sizes, each any number of times, <= r)``.
    """
    counts: dict[int, int] = {}
    for p in workload:
        if p.is_share and 0 < p.gpu_milli < MILLI:
            counts[p.gpu_milli] = counts.get(p.gpu_milli, 0) + 1
    total = sum(counts.values())
    sizes = [m for m, k in counts.items() if total and k / total >= min_share]
    best = [0] * (MILLI + 1)
    for r in range(1, MILLI + 1):
        best[r] = max([best[r - m] + m for m in sizes if m <= r], default=0)
    return np.array([r - best[r] for r in range(MILLI + 1)], dtype=np.int64)


def plain_share(pod: PodRequest, cluster: ClusterState) -> bool:
    """Whether ``pod`` is a share given in milli that fits every GPU with that much free: no memory,
    model or enforcement condition, and no GPU of the cluster with its memory known (what
    ``ClusterState.share_view`` then works out depends on a node's free milli per GPU alone)."""
    return bool(pod.is_share and pod.gpu_milli) and not (
        pod.gpu_models or pod.enforced_share or cluster.any_gpu_memory
    )


def share_summary(
    free: Sequence[int], milli: int, table: Sequence[int | float] | None, none: int | float
) -> int | float:
    """For a plain share of ``milli`` on a node whose GPUs have ``free`` milli free: the least
    remainder it would leave on a GPU (capped at ``MILLI``; ``ShareSlots.least_left``), or with a
    ``table`` the least ``table[remainder]`` (``ShareSlots.least_mapped``); ``none`` where no GPU fits."""
    if table is None:
        return min((min(f - milli, MILLI) for f in free if f >= milli), default=none)
    return min((table[min(f - milli, MILLI)] for f in free if f >= milli), default=none)


class GpuStateValues:
    """Values that depend on a node's free milli per GPU alone (``ClusterState.gpu_key``), kept per
    distinct free tuple (a GPU state) and per request key: every node carries the id of its GPU state,
    refreshed from the cluster's log of changes, and each key's table holds the value per state id,
    worked out (``compute``) the first time a node in that state is asked about. Values must be >= 0
    (-1 marks a state not worked out yet)."""

    MAX_STATES = 1 << 16  # GPU states numbered before the numbering (and every table) starts afresh
    MAX_KEYS = 256  # tables kept (the oldest dropped first)

    def __init__(self) -> None:
        self.cluster: ClusterState | None = None
        self.generation = 0
        self.ids = np.zeros(0, dtype=np.int64)
        self.index: dict[tuple[int, ...], int] = {}
        self.states: list[tuple[int, ...]] = []
        self.tables: dict[tuple, np.ndarray] = {}

    def _reset(self, cluster: ClusterState) -> None:
        self.cluster = cluster
        self.generation = cluster.generation
        self.index = {}
        self.states = []
        self.tables = {}
        self.ids = np.array([self._id(free) for free in cluster.gpu_key], dtype=np.int64)

    def _id(self, free: tuple[int, ...]) -> int:
        sid = self.index.get(free)
        if sid is None:
            sid = self.index[free] = len(self.states)
            self.states.append(free)
        return sid

    def values(
        self,
        cluster: ClusterState,
        key: tuple,
        idx: np.ndarray,
        compute: Callable[[tuple[int, ...]], int | float],
        dtype: type,
    ) -> np.ndarray:
        """``compute(free)`` of every node of ``idx`` (``free``: its ``gpu_key``), as ``dtype``;
        ``key`` names ``compute`` (one table per key)."""
        if self.cluster is not cluster or len(self.states) > self.MAX_STATES:
            self._reset(cluster)
        elif self.generation != cluster.generation:
            rows = cluster.changed_since(self.generation)
            self.generation = cluster.generation
            ids, gpu_key, index, new = self.ids, cluster.gpu_key, self.index, self._id
            for i in range(len(cluster)) if rows is None else rows:
                sid = index.get(gpu_key[i])
                ids[i] = new(gpu_key[i]) if sid is None else sid
        table = self.tables.get(key)
        if table is None or len(table) < len(self.states):
            if table is None and len(self.tables) >= self.MAX_KEYS:
                del self.tables[next(iter(self.tables))]
            grown = np.full(2 * len(self.states) + 1024, -1, dtype=dtype)
            if table is not None:
                grown[: len(table)] = table
            table = self.tables[key] = grown
        ids = self.ids.take(idx)
        out = table.take(ids)
        if len(out) and _least(out) < 0:
            states = self.states
            for sid in set(ids[out < 0].tolist()):
                table[sid] = compute(states[sid])
            out = table.take(ids)
        return out


class ShareCompletionScore(ScorePlugin):
    """Shares: the nodes where the share leaves a GPU with less than ``below`` milli free (which no
    common share fills) score ``1 + (below - left) / below``, the others 0; the share takes that GPU.

    Weighted above FGD in ``fgd-reserve``, it completes GPUs that FGD would leave with a remainder
    (e.g. a 160-milli pod beside an 810-milli one, an 810 on a GPU holding a small share). 0 for
    every pod that is not a share given in milli.
    """

    name = "share-completion"

    def __init__(self, below: int = 110) -> None:
        self.below = below
        # the score of each least remainder 0..MILLI + 1 (the share view's range; MILLI + 1: no fit);
        # ``below`` is fixed once built
        left = np.arange(MILLI + 2, dtype=np.int64)
        self.by_left = np.where(left < below, 1.0 + (below - left) / below, 0.0)
        self._scores = self.by_left.tolist()
        self._kept = GpuStateValues()  # plain shares: the score per GPU state

    def bind(self, cluster: ClusterState, workload: Sequence[PodRequest], rng: random.Random) -> None:
        self._kept = GpuStateValues()

    def applies(self, pod: PodRequest) -> bool:
        return pod.is_share and pod.gpu_milli != 0

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        if not pod.is_share or pod.gpu_milli == 0:
            return np.zeros(len(idx))
        if plain_share(pod, cluster):  # by_left of share_view's least_left, per GPU state
            milli, scores = pod.gpu_milli, self._scores
            return self._kept.values(
                cluster,
                (milli,),
                idx,
                lambda free: scores[share_summary(free, milli, None, MILLI + 1)],
                float,
            )
        return self.by_left.take(cluster.share_view(pod).least_left.take(idx))

    def share_gpu(self, pod: PodRequest, cluster: ClusterState, i: int) -> int | None:
        if not pod.is_share or pod.gpu_milli == 0:
            return None
        if plain_share(pod, cluster):  # the same from the node's free milli per GPU (gpu_rows)
            milli, least, chosen = pod.gpu_milli, self.below, None
            for j, free in enumerate(cluster.gpu_rows[i]):
                if free >= milli and free - milli < least:
                    least, chosen = free - milli, j
            return chosen
        best: tuple[int, int] | None = None
        for g in cluster.nodes[i].gpus:
            if g.fits_share(pod):
                left = g.free_milli - g.share_for(pod)[0]
                if left < self.below and (best is None or left < best[0]):
                    best = (left, g.index)
        return best[1] if best else None  # None: FGD chooses


class ModelFree:
    """Per node model set (``ClusterState.model_code``), the free GPU milli of its nodes
    (``gpu_free_total`` summed, as ints), for the cluster last asked about: worked out for every node
    at first (and for another cluster), then from the cluster's log of changes (``changed_since``), one
    node at a time when they are few (``ONE_BY_ONE``), so a look costs the nodes changed since the last.
    The sums are exact: as floats they are ``np.bincount(codes, weights=gpu_free_total.astype(float))``."""

    __slots__ = ("cluster", "codes", "generation", "seen", "totals")

    def __init__(self, codes: np.ndarray, size: int) -> None:
        self.codes = codes
        self.cluster: ClusterState | None = None
        self.generation = 0
        self.seen: list[int] = []  # per node, its free GPU milli as last seen
        self.totals = [0] * size

    def of(self, cluster: ClusterState) -> list[int]:
        """The free GPU milli per model set of ``cluster`` now (the list is this tracker's own: read it,
        do not keep it)."""
        if self.cluster is cluster and self.generation == cluster.generation:
            return self.totals
        rows = cluster.changed_since(self.generation) if self.cluster is cluster else None
        self.generation = cluster.generation
        if rows is None or len(rows) > ONE_BY_ONE:
            self.cluster = cluster
            self.seen = cluster.gpu_free_total.tolist()
            totals = [0] * len(self.totals)
            for code, free in zip(self.codes.tolist(), self.seen, strict=True):
                totals[code] += free
            self.totals = totals
            return totals
        totals, seen, codes, free_of = self.totals, self.seen, self.codes, cluster.gpu_free_total
        for i in rows:
            free = free_of.item(i)
            totals[codes.item(i)] += free - seen[i]
            seen[i] = free
        return totals


class ModelBalance:
    """Keeps GPU models free for the pods that can only use them, once such pods have arrived.

    ``observe`` marks the models (node model sets) some arrived pod restricted itself to
    (``gpu_spec``); for a pod free to use any model, ``bands`` gives each node the free share of its
    model's GPUs in the cluster (1 for models no arrived pod was restricted to) in bands of ``band``:
    higher is better, so such pods fill the models the restricted pods need last, and no model runs out
    early while others have room. None (no effect) before any restricted pod, for a restricted pod and
    for a pod without GPUs. Reads the arrivals so far and the cluster's state only.

    The bands are worked out per model set (``model_bands``, from ``ModelFree``'s sums) and then
    gathered for the nodes asked about: the same floats as the per-node numpy expression.
    """

    def __init__(self, band: float) -> None:
        if not (band > 0 and math.isfinite(1.0 / band)):
            # a whole free share over the band must be a float: its bands are floored to ints
            raise ValueError(f"model balance band {band!r}: must be above 0 and 1/band finite")
        self.band = band
        self.codes = np.zeros(0, dtype=np.int64)
        self.capacity = np.zeros(0)
        self.restricted = np.zeros(0, dtype=bool)
        self.any_restricted = False  # restricted.any()
        self.sets: list[frozenset[str]] = []
        self.free = ModelFree(self.codes, 0)
        self._matches: dict[frozenset[str], list[int]] = {}  # matching: per gpu_models, the codes

    def bind(self, cluster: ClusterState) -> None:
        self.codes = cluster.model_code
        self.sets = list(cluster.model_sets)
        weights = cluster.gpu_count * float(MILLI)
        self.capacity = np.bincount(self.codes, weights=weights, minlength=len(self.sets))
        self.restricted = np.zeros(len(self.sets), dtype=bool)
        self.any_restricted = False  # restricted.any()
        self.free = ModelFree(self.codes, len(self.sets))
        self._matches = {}

    def matching(self, models: frozenset[str]) -> list[int]:
        """The model set codes that share a model with ``models`` (a pod's ``gpu_models``), in order."""
        out = self._matches.get(models)
        if out is None:
            out = self._matches[models] = [code for code, ours in enumerate(self.sets) if ours & models]
        return out

    def observe(self, pod: PodRequest) -> None:
        if pod.gpu_models and pod.gpu_count:
            for code in self.matching(pod.gpu_models):
                self.restricted[code] = True
                self.any_restricted = True

    def bands(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray | None:
        if pod.gpu_models or not pod.gpu_count or not self.any_restricted:
            return None
        return self.model_bands(cluster).take(self.codes.take(idx))

    def model_bands(self, cluster: ClusterState) -> np.ndarray:
        """``bands`` per model set: the free share of a restricted model's GPUs (1 for the others and
        for a model without GPUs) over ``band``, rounded down, as floats."""
        band, out = self.band, []
        for free, capacity, restricted in zip(
            self.free.of(cluster), self.capacity.tolist(), self.restricted.tolist(), strict=True
        ):
            share = free / capacity if restricted and capacity > 0 else 1.0
            out.append(math.floor(share / band))
        return np.array(out, dtype=np.float64)


class ModelNeed(ModelBalance):
    """``ModelBalance`` by need (issue 26, bench variant ``guard1ns-need1``): a model is protected only as
    far as its restricted pods need it. Its band is its free share of GPUs over its need (the GPU milli
    arrived restricted to it, as a share of all GPU milli arrived, times the cluster's GPU capacity over
    the model's, times ``horizon``), capped at 1, in bands of ``band``; a model whose free share covers its
    need is as good as a model no arrived pod was restricted to (1). Reads the arrivals so far
    (``observe``) and the cluster's state only.

    Worked out per model set in Python floats (``model_bands``): the same floats as the per-node numpy
    expression ``np.floor(min(share / need, 1) / band)``."""

    def __init__(self, band: float, horizon: float) -> None:
        super().__init__(band)
        self.horizon = horizon
        self.asked: list[float] = []  # per model set: the GPU milli arrived restricted to it
        self.total = 0.0  # the GPU milli arrived
        self.capacity_sum = 0.0  # the cluster's GPU milli

    def bind(self, cluster: ClusterState) -> None:
        super().bind(cluster)
        self.asked = [0.0] * len(self.sets)
        self.total = 0.0
        self.capacity_sum = float(self.capacity.sum())

    def observe(self, pod: PodRequest) -> None:
        super().observe(pod)
        if not pod.gpu_count:
            return
        self.total += pod.total_gpu_milli
        if pod.gpu_models:
            for code in self.matching(pod.gpu_models):
                self.asked[code] += pod.total_gpu_milli

    def model_bands(self, cluster: ClusterState) -> np.ndarray:
        """``bands`` per model set: a restricted model's free share over its need, at most 1 (1 for the
        others and where the need is 0), over ``band``, rounded down, as floats."""
        per = max(self.total, 1.0)
        scale, band, out = self.capacity_sum, self.band, []
        for free, capacity, asked, restricted in zip(
            self.free.of(cluster), self.capacity.tolist(), self.asked, self.restricted.tolist(), strict=True
        ):
            ratio = 1.0
            if restricted:
                share = free / capacity if capacity > 0 else 1.0
                need = asked / per * scale * self.horizon
                need = need / capacity if capacity > 0 else 0.0
                ratio = min(share / need if need > 0 else 1.0, 1.0)
            out.append(math.floor(ratio / band))
        return np.array(out, dtype=np.float64)


class ModelGuard(ScorePlugin):
    """A score above FGD's bands (issue 26, bench variant ``guard1ns-need1``): -1 on the nodes of a GPU
    model whose free GPU milli is below the demand its restricted pods are expected to bring until the
    cluster's GPUs have arrived ``fill`` times over, 0 elsewhere, for pods with whole GPUs free to use any
    model; 0 (``applies`` False) for restricted pods, shares and pods without GPUs. Shares are not
    guarded: kept off the small models they left remainders there that the restricted pods could not
    use (docs/performance.md "The early GPU-spec dip").

    A model's expected demand is its restricted pods' share of the GPU milli arrived so far (once
    ``warm_up`` of the capacity has arrived; before, the workload's share, as the reserve's prior), a pod
    restricted to several models counting for each in equal parts, times the GPU milli still to arrive
    (``fill`` x capacity less what arrived, at least 0). Without restricted pods (none arrived past the
    warm-up, none in the workload before it) it does not apply. Reads the arrivals seen so far
    (``observe``), the workload's shape distribution given at ``bind`` and the cluster's state only;
    the free GPU milli per model set comes from ``ModelFree`` (exact int sums)."""

    name = "model-guard"

    def __init__(self, fill: float = 1.0, warm_up: float = 0.02) -> None:
        self.fill, self.warm_up = fill, warm_up
        self.codes = np.zeros(0, dtype=np.int64)
        self.sets: list[frozenset[str]] = []
        self.asked: list[float] = []  # per model set: restricted GPU milli arrived
        self.prior: list[float] = []  # ... and in the workload
        self.total = 0.0  # the GPU milli arrived
        self.prior_total = 1.0  # the workload's GPU milli (at least 1)
        self.capacity = 1.0  # the cluster's GPU milli
        self.any_asked = self.any_prior = False  # any(asked), any(prior)
        self.free = ModelFree(self.codes, 0)
        self._matches: dict[frozenset[str], list[int]] = {}  # per gpu_models, the model set codes

    def _split(self, pod: PodRequest, into: list[float] | np.ndarray) -> None:
        """Add a restricted pod's GPU milli to ``into``, in equal parts over the model sets it may use."""
        match = self._matches.get(pod.gpu_models)
        if match is None:
            match = self._matches[pod.gpu_models] = [
                code for code, models in enumerate(self.sets) if models & pod.gpu_models
            ]
        for code in match:
            into[code] += pod.total_gpu_milli / len(match)

    def bind(self, cluster: ClusterState, workload: Sequence[PodRequest], rng: random.Random) -> None:
        self.codes = cluster.model_code
        self.sets = list(cluster.model_sets)
        self._matches = {}
        self.free = ModelFree(self.codes, len(self.sets))
        self.asked = [0.0] * len(self.sets)
        self.prior = [0.0] * len(self.sets)
        self.total = 0.0
        self.capacity = float(cluster.total_gpus() * MILLI)
        self.prior_total = max(float(sum(p.total_gpu_milli for p in workload)), 1.0)
        for pod in workload:
            if pod.gpu_models and pod.gpu_count:
                self._split(pod, self.prior)
        self.any_asked, self.any_prior = False, any(self.prior)

    def observe(self, pod: PodRequest) -> None:
        if not pod.gpu_count:
            return
        self.total += pod.total_gpu_milli
        if pod.gpu_models:
            self._split(pod, self.asked)
            self.any_asked = any(self.asked)

    def bounds(self) -> tuple[float, float]:
        return (-1.0, 0.0)

    def _guards(self, pod: PodRequest) -> bool:
        """Whether the pod is one the guard keeps away (whole GPUs, free to use any model) while some
        restricted pod arrived or is in the workload."""
        if pod.gpu_models or pod.is_share or not pod.gpu_count:
            return False
        return self.any_asked or self.any_prior

    def _warm(self) -> bool:
        """Whether the arrivals (not the workload) give the rates: ``warm_up`` of the capacity arrived."""
        return self.total >= self.warm_up * self.capacity

    def applies(self, pod: PodRequest) -> bool:
        """False where ``score`` is 0 everywhere whatever the cluster: the guard is not for this pod
        (``_guards``), or no model can be guarded now: past the warm-up with no restricted pod arrived
        (every rate 0), or nothing left to arrive (``_left`` 0)."""
        if not self._guards(pod) or not self.any_asked and self._warm():
            return False
        return self._left() > 0.0

    def _left(self) -> float:
        """The GPU milli still to arrive that the expected demand is taken over."""
        return max(self.fill * self.capacity - self.total, 0.0)

    def guarded(self, cluster: ClusterState) -> list[bool]:
        """Per model set: whether its free GPU milli is below its expected restricted demand."""
        if self._warm():
            rates, per = self.asked, self.total
        else:
            rates, per = self.prior, self.prior_total
        free = self.free.of(cluster)
        if not per:  # nothing arrived (no GPUs, or warm_up 0): every rate is 0/0, no model is guarded
            return [False] * len(free)
        left = self._left()
        return [have < rate / per * left for have, rate in zip(free, rates, strict=True)]

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        if not self._guards(pod) or not self.any_asked and self._warm():
            return np.zeros(len(idx))
        per_model = np.array([-1.0 if hit else -0.0 for hit in self.guarded(cluster)])
        return per_model.take(self.codes.take(idx))


class ReserveThenAlign(AlignmentScore):
    """Tie-breaker: first (``balance`` > 0) the model balance (``ModelBalance``, bands of ``balance``; with
    ``need_horizon``, by need: ``ModelNeed``), then the nodes that keep the last whole-node hosts
    (``WholeNodeReserve``), then (``waste_band`` > 0, shares only) the least unfillable remainder
    (``share_waste_table``) a GPU would keep, in bands of ``waste_band`` milli, then the request/free
    alignment in bands of ``step`` (within a band the node order decides). ``cpu_bound_exact``: while the CPU
    asked by the pods arrived so far (before the first, the workload) is a larger share of the cluster's CPU
    than their GPU of its GPUs (CPU would run out first), the alignment is not banded (exact to 6 decimals).
    ``cpu_horizon``: while so (whatever ``cpu_bound_exact``), the reserve keeps ``cpu_horizon`` times the
    expected need instead of its own ``horizon`` (None: its own always). ``restricted_banded``: once a pod
    restricted to GPU models (asking GPUs) has arrived, the alignment stays in bands even while CPU binds
    (exact alignment sends pods of many CPUs a GPU to the small models' nodes, whose CPU and idle 8-GPU
    hosts the restricted pods and the 120-CPU whole-node pods need: docs/performance.md "The CPU-heavy
    GPU-spec dip"); ``banded_until``: ... only until the GPU milli arrived reaches this share of the
    cluster's GPU capacity, exact again after (None: for the rest of the run)."""

    name = "reserve-align"
    WARM_UP = 0.1  # cpu_bound: arrivals decide once they asked for this share of the cluster
    # _remainder's memo: (free milli per GPU, share milli) pairs kept before it starts afresh
    MAX_REMAINDERS = 1 << 16

    def __init__(
        self,
        step: float = 0.2,
        keep: int | None = None,
        waste_band: int = 0,
        adaptive: bool = False,
        balance: float = 0.0,
        cpu_bound_exact: bool = False,
        reserve: WholeNodeReserve | None = None,
        cpu_horizon: float | None = None,
        need_horizon: float | None = None,
        restricted_banded: bool = False,
        banded_until: float | None = None,
    ) -> None:
        super().__init__(step=step)
        self.reserve = reserve if reserve is not None else WholeNodeReserve(keep, adaptive)
        self.waste_band = waste_band
        self.waste = np.zeros(MILLI + 1, dtype=np.int64)
        self._waste: tuple[np.ndarray, list[int]] = (self.waste, self.waste.tolist())  # and as a list
        self._wasted = GpuStateValues()  # plain shares: the least waste per GPU state
        # _remainder's memo: the remainders table it was worked out with, (free, share milli) -> value
        self._remainders_of: tuple[list[int] | None, dict[tuple[tuple[int, ...], int], int]] = (None, {})
        self.balance: ModelBalance | None = None
        if balance > 0:
            self.balance = ModelBalance(balance) if need_horizon is None else ModelNeed(balance, need_horizon)
        self.cpu_bound_exact = cpu_bound_exact
        self.cpu_horizon = cpu_horizon
        self.restricted_banded = restricted_banded
        self.banded_until = banded_until
        self.demand = DemandTally(self.WARM_UP)  # what was asked, and whether a restricted pod arrived

    def bind(self, cluster: ClusterState, workload: Sequence[PodRequest], rng: random.Random) -> None:
        super().bind(cluster, workload, rng)
        self.reserve.bind(cluster, workload)
        if self.waste_band:
            self.waste = share_waste_table(workload)
        self._waste = (self.waste, self.waste.tolist())
        self._wasted = GpuStateValues()
        if self.balance is not None:
            self.balance.bind(cluster)
        self.demand.bind(cluster, workload)

    def observe(self, pod: PodRequest) -> None:
        self.reserve.observe(pod)
        if self.balance is not None:
            self.balance.observe(pod)
        self.demand.observe(pod)

    # read-only views of ``demand`` for the variants in bench/placement_variants.py (the per-pod code here
    # reads ``demand`` itself)
    @property
    def capacity(self) -> tuple[int, int]:
        """The cluster's CPU milli and GPU milli."""
        return self.demand.capacity

    @property
    def asked(self) -> list[int]:
        """CPU milli and GPU milli of the pods arrived so far."""
        return self.demand.asked

    @property
    def restricted_arrived(self) -> bool:
        """Whether a pod restricted to GPU models (asking GPUs) has arrived."""
        return self.demand.restricted_arrived

    def cpu_bound(self) -> bool:
        """Whether the CPU asked is the larger share of capacity: by the arrivals so far once they asked
        for ``WARM_UP`` of the cluster's GPUs or CPUs (a few first pods say little), else the workload."""
        return self.demand.cpu_bound()

    def _terms(
        self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray
    ) -> tuple[float, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """The alignment's step for this pod, and the share remainders, the reserve's penalty and the
        model balance on the nodes of ``idx`` (None: 0 everywhere, or not asked)."""
        step, horizon = self._step_and_horizon()
        waste = self._remainders(pod, cluster, idx)
        penalty = self.reserve.scarce_breaks(pod, cluster, idx, horizon)  # None: 0 everywhere
        balance = self.balance.bands(pod, cluster, idx) if self.balance is not None else None
        return step, waste, penalty, balance

    def _step(self) -> float:
        """The alignment's step for the next pod: 0 (exact) while CPU-bound with ``cpu_bound_exact`` (and,
        with ``restricted_banded``, no restricted pod arrived yet or ``banded_until`` of the GPU capacity
        arrived)."""
        return self._step_and_horizon()[0]

    def _step_and_horizon(self) -> tuple[float, float | None]:
        """The alignment's step for the next pod (``_step``) and the reserve's horizon (None: its own):
        ``cpu_horizon`` while CPU-bound."""
        demand = self.demand
        banded = self.restricted_banded and demand.restricted_arrived  # exact no more ...
        if banded and self.banded_until is not None:  # ... until this share of the capacity arrived
            banded = demand.asked[1] < self.banded_until * demand.capacity[1]
        exact, horizon = self.cpu_bound_exact and self.step and not banded, self.cpu_horizon
        if not (exact or horizon) or not self.cpu_bound():
            return self.step, None
        return (0.0 if exact else self.step), horizon

    def _waste_list(self) -> list[int]:
        """``waste`` as a list (made afresh when ``waste`` is another table, as ``least_mapped`` would
        read it; the remainders kept per GPU state then start afresh)."""
        if self._waste[0] is not self.waste:
            self._waste = (self.waste, self.waste.tolist())
            self._wasted = GpuStateValues()
        return self._waste[1]

    def _remainders(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray | None:
        """The share's least unfillable remainder (``waste``) on the nodes of ``idx``; None for a pod
        that is no share given in milli, or without ``waste_band``."""
        if not (self.waste_band and pod.is_share and pod.gpu_milli):
            return None
        if plain_share(pod, cluster):  # share_view's least_mapped, per GPU state
            milli, table = pod.gpu_milli, self._waste_list()
            return self._wasted.values(
                cluster,
                (milli,),
                idx,
                lambda free: share_summary(free, milli, table, MILLI + 1),
                np.int64,
            )
        return cluster.share_view(pod).least_mapped(self.waste, MILLI + 1).take(idx)

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        step, waste, penalty, balance = self._terms(pod, cluster, idx)
        bands = self.aligned(pod, cluster, idx, step)  # the cosine, or 0 .. 1 / step
        if waste is None and penalty is None and balance is None:
            return bands  # what the terms below would add is 0 everywhere
        top = 1.0 + np.max(bands, initial=0.0)
        if waste is not None:
            levels = MILLI // self.waste_band + 2
            bands = bands - top * (waste // self.waste_band)
            top *= levels
        out = bands if penalty is None else bands - top * penalty
        if balance is None:
            return out
        return out + (2.0 * np.max(np.abs(out), initial=0.0) + 10.0) * balance

    def pick_tied(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> int | None:
        """``score``'s best node, then the node order, as one int key per node: the model balance, the
        penalty, the share remainder's band, the alignment (``aligned_keys``) and the node order, each a
        digit of its own. The same node as ``score`` then ``schedule.pick``: ``score`` adds the terms
        with weights that make them lexicographic (each weight is above the span of what it outweighs)
        as long as no band is below 0 (free CPU below 0, booked facts only); then it is not offered
        (None). For a pod that is no share or a plain one (``plain_share``), the remainder's band and
        the alignment come as one int per node state (``_fused_keys``), the model balance's bands as one
        more digit above those keys (``_balance_above``)."""
        if cluster.tie_rank is None:
            return None
        states = self._follow(cluster)  # node states and the reserve's hosts in one pass over the changes
        step, horizon = self._step_and_horizon()
        penalty = self.reserve.scarce_breaks(pod, cluster, idx, horizon)  # None: 0 everywhere
        balance = self.balance.bands(pod, cluster, idx) if self.balance is not None else None
        keys = self._fused_keys(pod, cluster, idx, step, penalty, states)
        n = len(cluster.tie_rank)
        if keys is not None and (balance is None or self._balance_above(keys, balance, n)):
            return int(keys.argmax())
        return self._pick_by_digits(
            pod, cluster, idx, step, self._remainders(pod, cluster, idx), penalty, balance
        )

    def penalty_top(self) -> int:
        """The largest penalty the reserve gives a node (``scarce_breaks``: one per scarce shape); the
        digits above the penalty are weighed by it."""
        return len(self.reserve.shapes)

    def _balance_above(self, keys: np.ndarray, balance: np.ndarray, n: int) -> bool:
        """Add the model balance's bands (ints >= 0) to ``_fused_keys``' ``keys`` as the digit above
        them all, in place: each band weighs ``(penalty_top + 2) x (n << KEY_PENALTY)``, more than the span
        of the keys (``_fused_keys``: they lie in ``(-(penalty_top + 1), 1) x (n << KEY_PENALTY)``). False
        (``keys`` untouched) where a band is below 0 or the sums could pass an int64."""
        if not len(balance):
            return False
        low, top = int(_least(balance)), int(_largest(balance))
        weight = (self.penalty_top() + 2) * (n << KEY_PENALTY)
        if low < 0 or (top + 1) * weight >= 1 << 62:
            return False
        keys += weight * balance.astype(np.int64)
        return True

    def _pick_by_digits(
        self,
        pod: PodRequest,
        cluster: ClusterState,
        idx: np.ndarray,
        step: float,
        waste: np.ndarray | None,
        penalty: np.ndarray | None,
        balance: np.ndarray | None,
    ) -> int | None:
        """``pick_tied`` from the terms (``_terms``): ``aligned_keys``, then each term above it as a digit
        worth twice the span of the keys below it."""
        found = self.aligned_keys(pod, cluster, idx, step)
        if found is None:
            return None
        keys, low, span = found
        if waste is None and penalty is None and balance is None:
            return int(keys.argmax())
        if low < 0:
            return None
        # each digit is worth twice the span of the keys below it: keys lie in (-span, span)
        digits = []  # (values, their largest, sign)
        if waste is not None:
            digits.append((waste // self.waste_band, (MILLI + 1) // self.waste_band, -1))
        if penalty is not None:
            digits.append((penalty.astype(np.int64), self.penalty_top(), -1))
        if balance is not None:
            if int(balance.min()) < 0:
                return None
            digits.append((balance.astype(np.int64), int(balance.max()), 1))
        bound = span
        for _, top, _ in digits:
            bound *= 2 * top + 1
        if bound >= 1 << 62:
            return None
        for values, top, sign in digits:
            keys += (sign * 2 * span) * values
            span *= 2 * top + 1
        return int(keys.argmax())

    def _follow(self, cluster: ClusterState) -> _NodeStates | None:
        """Refresh the node states (``_node_states``) and the reserve's host table (``_HostTable``) of
        ``cluster`` in one pass over its log of changes, when both follow it from the same generation
        and the changes are few (``ONE_BY_ONE``): the node states, up to date. Else None: each
        refreshes itself when asked."""
        states, table = self._states, self.reserve._table
        if states is None or table is None or states.generation != table.generation:
            return None
        if (
            states.cluster is not cluster
            or table.cluster is not cluster
            or len(self._cpu_inv) != len(cluster)
        ):
            return None
        if len(states.states) > self.MAX_STATES:  # _node_states numbers them afresh
            return None
        if states.generation == cluster.generation:
            return states
        rows = cluster.changed_since(states.generation)
        if rows is None or len(rows) > ONE_BY_ONE:
            return None
        states.generation = table.generation = cluster.generation
        capacity, gpus, cpu, free_key = states.capacity, states.gpus, cluster.cpu_free, cluster.gpu_key
        gpu_free, ids, index, new_id = cluster.gpu_free_total, states.ids, states.index, states.new_id
        reserve, flags, seen = self.reserve, table.flags, table.free
        for i in rows:
            state = (capacity[i], gpus[i], cpu.item(i), free_key[i])  # _NodeStates.refresh
            sid = index.get(state)
            ids[i] = new_id(state) if sid is None else sid
            free = gpu_free.item(i)  # _HostTable.refresh
            table.free_milli += free - seen[i]
            seen[i] = free
            now = reserve.hosts_at(cluster, i)
            if now != flags[i]:
                table.take_flags(i, now)
        return states

    def _fused_keys(
        self,
        pod: PodRequest,
        cluster: ClusterState,
        idx: np.ndarray,
        step: float,
        penalty: np.ndarray | None,
        states: _NodeStates | None = None,
    ) -> np.ndarray | None:
        """``pick_tied``'s keys without a model balance, from one int per node state and request
        (``_KeyTable``): the share remainder's band (plain shares with ``waste_band``) above the
        alignment's int (``aligned_band``: the band, or the cosine in millionths), times the node count;
        the node order added below it and the penalty above it. None where that does not hold the
        order: a share that is not plain, many decimals, a node of ``idx`` whose alignment int is
        below 0 or not below ``KEY_ALIGN`` (free CPU below 0, a step near 0) or whose remainder band is
        not below ``KEY_REMAINDER``, keys that could pass an int64; the caller then takes the digits
        one by one (``_pick_by_digits``). ``states``: the node states, when the caller has them up to
        date (``_follow``)."""
        rank = cluster.tie_rank
        if rank is None or self.decimals > self.MAX_DECIMALS:
            return None
        n = len(rank)
        if (self.penalty_top() + 2) * (n << KEY_PENALTY) >= 1 << 62:
            return None
        milli = 0  # the share whose remainders count (0: none)
        if self.waste_band and pod.is_share and pod.gpu_milli:
            if not plain_share(pod, cluster):
                return None
            milli = pod.gpu_milli
        if states is None or states is not self._states:
            states = self._node_states(cluster)
        key = (pod.cpu_milli, pod.total_gpu_milli, step, milli)
        table = states.keys.get(key)
        remainders = self._waste_list() if milli else None
        if table is None or table.remainders is not remainders:
            if table is None and len(states.keys) >= self.MAX_SHAPES:
                del states.keys[next(iter(states.keys))]
            table = states.keys[key] = _KeyTable(len(states.states), remainders)
        elif len(table.keys) < len(states.states):
            table.grow(len(states.states))
        ids = states.ids.take(idx)
        keys = table.keys.take(ids)
        low = _least(keys) if len(keys) else 0
        if low <= _KEY_UNKNOWN:  # some state not worked out yet for this request, or one that fits no key
            if low == _KEY_BELOW or not self._work_out(
                table, states, key, ids.compress(keys == _KEY_UNKNOWN)
            ):
                return None
            keys = table.keys.take(ids)
        order = self._order
        if order is None or order[0] is not rank:
            order = self._order = (rank, n - 1 - rank)
        keys += order[1].take(idx)
        if penalty is not None:
            keys -= (n << KEY_PENALTY) * penalty.astype(np.int64)
        return keys

    def _work_out(
        self, table: _KeyTable, states: _NodeStates, key: tuple[int, int, float, int], ids: np.ndarray
    ) -> bool:
        """Put ``_fused_keys``' int of the states ``ids`` of the request ``key`` (CPU, GPU milli, step,
        share milli) into ``table``: False when one of them fits no key (``_KEY_BELOW``)."""
        cpu, gpu, step, milli = key
        stored, sides, decimals, n = table.keys, states.sides, self.decimals, len(states.ids)
        remainders, band, fits = table.remainders, self.waste_band, True
        for sid in set(ids.tolist()):
            whole = aligned_band(sides[sid], cpu, gpu, step, decimals)[1]
            left = (
                0 if remainders is None else self._remainder(states.states[sid][3], milli, remainders) // band
            )
            if 0 <= whole < KEY_ALIGN and 0 <= left < KEY_REMAINDER:  # the remainder's band above it
                stored[sid] = (whole - (left << KEY_ALIGN_BITS)) * n
            else:
                stored[sid] = _KEY_BELOW
                fits = False
        return fits

    def _remainder(self, free: tuple[int, ...], milli: int, remainders: list[int]) -> int:
        """``share_summary`` of the free milli per GPU ``free`` for a share of ``milli`` with the table
        ``remainders``, memoised per (free, milli) (the memo starts afresh with another table or when
        full)."""
        memo = self._remainders_of
        if memo[0] is not remainders or len(memo[1]) >= self.MAX_REMAINDERS:
            memo = self._remainders_of = (remainders, {})
        value = memo[1].get((free, milli))
        if value is None:
            value = memo[1][free, milli] = share_summary(free, milli, remainders, MILLI + 1)
        return value


# _fused_keys' digits: the alignment's int in 0 .. 2**24 (bands, or the cosine in millionths), the
# remainder's band in 0 .. 2**10 above it, the penalty weighing 2**36 x the node count above both
KEY_ALIGN_BITS = 24
KEY_ALIGN = 1 << KEY_ALIGN_BITS
KEY_REMAINDER = 1 << 10
KEY_PENALTY = 36
_KEY_BELOW = _UNKNOWN  # _KeyTable.keys of a state that fits no key (its alignment int or remainder band)
_KEY_UNKNOWN = _UNKNOWN + 1  # _KeyTable.keys of a state not worked out yet


class _KeyTable:
    """``ReserveThenAlign._fused_keys``' int per node state id for one request (CPU, GPU milli, step and
    the share milli whose remainders count): ``(alignment int - remainder band * KEY_ALIGN) x nodes``,
    ``_KEY_UNKNOWN`` where not worked out yet, ``_KEY_BELOW`` where the alignment int or the remainder
    band does not fit; kept with
    the node states (``_NodeStates.keys``), so dropped with them. ``remainders``: the table of
    unfillable remainders it was worked out with (None: no share)."""

    __slots__ = ("keys", "remainders")

    def __init__(self, n: int, remainders: list[int] | None) -> None:
        self.keys = np.full(2 * n + 4096, _KEY_UNKNOWN, dtype=np.int64)  # room for the states to come
        self.remainders = remainders

    def grow(self, n: int) -> None:
        more = max(n, 2 * len(self.keys)) - len(self.keys)
        self.keys = np.concatenate((self.keys, np.full(more, _KEY_UNKNOWN, dtype=np.int64)))


FGD_STEP = 3  # fgd-reserve: FGD's score in bands of this many points
# fgd-reserve: ... and of this many once a pod restricted to GPU models has arrived (None: FGD_STEP always).
# 8 removed the dips of the GPU-spec-heavy tuning mixes but put a held-out one below FGD at 130% on every
# seed (h3-spec25-cpu050), so it is off; docs/performance.md "FGD in bands of 8"
FGD_SPEC_STEP: int | None = None
TOPOLOGY_FGD_STEP = 3  # topology (the live default): FGD's bands, as measured under random ties
ALIGN_STEP = 0.2  # fgd-reserve: alignment (cosine) bands
RESERVE_KEEP = 3  # fgd-reserve: whole-node hosts kept per shape (None: in proportion, WholeNodeReserve)
COMPLETE_BELOW = 110  # fgd-reserve: a share leaving a GPU less than this free completes it (first)
WASTE_BAND = 10  # fgd-reserve: unfillable share remainders in bands of this many milli (tie-break)
BALANCE_BAND = 0.2  # fgd-reserve: model balance (free share of a model's GPUs) in bands of this
RESERVE_HORIZON = 2.0  # fgd-reserve: the adaptive reserve keeps this many times the expected need
RESERVE_PRIOR = 0.3  # fgd-reserve: the workload's shape shares count as this share of capacity arrived
# fgd-reserve: the reserve's horizon while CPU binds (None: its own). 10 removed the t-cpu3 dip (tuning) but
# put the default below FGD at 130% on h2-cpu4-mg20 (a CPU-heavy multigpu20 mix), so it is off
RESERVE_CPU_HORIZON: float | None = None
# fgd-reserve: the model guard (ModelGuard) above FGD's bands, kept off the models whose free GPUs are
# below the demand their restricted pods are expected to bring until the GPUs have arrived GUARD_FILL
# times (None: no guard), weighted GUARD_WEIGHT (above FGD's bands, below share completion); and the
# model balance by need (ModelNeed) over NEED_HORIZON (None: the balance by free share, ModelBalance).
# Chosen on the tuning set (t-spec30-cpu050: the early GPU-spec dip), validated on heldout6; the default
# since 2026-11-29 (docs/performance.md "guard1ns-need1 ported into the default")
GUARD_FILL: float | None = 1.0
GUARD_WEIGHT = 100.0
GUARD_WARM_UP = 0.02  # the guard's rates from the arrivals once this share of the GPU capacity arrived
NEED_HORIZON: float | None = 1.0
# fgd-reserve: the alignment is exact while CPU binds only until a pod restricted to GPU models arrives
# (ReserveThenAlign restricted_banded), and again once RESTRICTED_BANDED_UNTIL of the GPU capacity has
# arrived (banded_until; None: banded for the rest of the run). Chosen on the tuning set (t-spec25-cpu3-mg20,
# t-spec30-cpu2-gs40: the CPU-heavy GPU-spec dip, around 35% arrived), the default since 2026-11-29
# (docs/performance.md "The CPU-heavy GPU-spec dip")
RESTRICTED_BANDED = True
RESTRICTED_BANDED_UNTIL: float | None = 0.7
# fgd-reserve: FGD in bands of 1 while the CPU asked is over 1.3 times the GPU asked (each a share of
# capacity) until 0.7 of the CPU capacity has been asked, never once a restricted pod arrived (None: FGD_STEP
# always). The ratio splits the tuning mixes' ranges from 10% arrived (t-cpu4-gs40 1.36-1.49, every other
# tuning mix and shared trace at most 1.24); 0.7 chosen on t-cpu4-gs40 and the probe mixes of
# bench/probe26_mixes.json (0.6 and 0.8 each put a probe seed at or below FGD); validated on heldout12;
# the default since 2026-11-29 (docs/performance.md "FGD's fine bands by an online gate")
FINE_BANDS: FineBands | None = FineBands(step=1, ratio=1.3, until_cpu=0.7, warm_up=ReserveThenAlign.WARM_UP)


def fgd_reserve(
    keep: int | None = RESERVE_KEEP,
    adaptive: bool = True,
    balance: float = BALANCE_BAND,
    cpu_bound_exact: bool = True,
    horizon: float = RESERVE_HORIZON,
    prior_weight: float = RESERVE_PRIOR,
    by_need: bool = True,
    cpu_horizon: float | None = RESERVE_CPU_HORIZON,
    fgd_step: int = FGD_STEP,
    fgd_spec_step: int | None = FGD_SPEC_STEP,
    guard_fill: float | None = GUARD_FILL,
    need_horizon: float | None = NEED_HORIZON,
    restricted_banded: bool = RESTRICTED_BANDED,
    banded_until: float | None = RESTRICTED_BANDED_UNTIL,
    fine: FineBands | None = FINE_BANDS,
) -> Policy:
    """Our default: a share first where it completes a GPU (``ShareCompletionScore``), then pods with
    whole GPUs free to use any model kept off the GPU models their restricted pods are expected to need
    (``ModelGuard``), then FGD in bands; ties to the models least short of their restricted pods' need
    (``ModelNeed``), then to the nodes that keep whole-node hosts, then (shares) the least unfillable
    remainder, then alignment bands (exact while CPU is the scarcer resource, but not from the first pod
    restricted to GPU models until 70% of the GPU capacity has arrived).

    Whole-node pods are left out of FGD's typical pods: the reserve keeps hosts for them, so FGD need
    not hold idle nodes back for them. ``keep``: whole-node hosts kept per shape at least
    (``RESERVE_KEEP``, 3, suits the simulator's node order; None, in proportion to their demand, suits
    random ties as the live scheduler's ``topology`` breaks them); ``adaptive``: more while the
    whole-node pods seen so far need more of the free GPUs (``WholeNodeReserve``); ``balance``: the
    model balance's band (0: off); ``cpu_bound_exact``: see ``ReserveThenAlign``; ``horizon``,
    ``prior_weight``, ``by_need``: see ``WholeNodeReserve`` (1.0, 0.0, False: the rule before
    2026-11-28 night); ``cpu_horizon``: see ``ReserveThenAlign`` (None, ``RESERVE_CPU_HORIZON``: off);
    ``fgd_step``: FGD's bands in points (``FGD_STEP``); ``fgd_spec_step``: its bands once a pod
    restricted to GPU models has arrived (``FGD_SPEC_STEP``; None: ``fgd_step`` always);
    ``guard_fill``: the model guard's horizon in cluster capacities (``GUARD_FILL``; None: no guard);
    ``need_horizon``: the model balance by need's horizon (``NEED_HORIZON``; None: by free share,
    ``ModelBalance``, the rule before 2026-11-29); ``restricted_banded``: see ``ReserveThenAlign``
    (``RESTRICTED_BANDED``; False: exact while CPU binds whatever arrived, the rule before 2026-11-29's
    second change); ``banded_until``: see ``ReserveThenAlign`` (``RESTRICTED_BANDED_UNTIL``; None: banded
    for the rest of the run, the rule of 2026-11-29's first port, bench/placement_variants.py
    ``spec-banded``); ``fine``: when FGD scores in finer bands (``FineBands``; ``FINE_BANDS``; None: in
    ``fgd_step`` always, the rule before 2026-11-29's gate, bench/placement_variants.py's ``nofine``).
    ``guard_fill=None, need_horizon=None, restricted_banded=False`` is the default of
    before the guard (bench/placement_variants.py ``reserve-v2``). docs/simulator.md explains each part.
    """
    guard = () if guard_fill is None else ((ModelGuard(guard_fill, GUARD_WARM_UP), GUARD_WEIGHT),)
    return Policy(
        "fgd-reserve",
        (
            (ShareCompletionScore(COMPLETE_BELOW), 1000.0),
            *guard,
            (FGDScore(step=fgd_step, whole_node_typical=False, spec_step=fgd_spec_step, fine=fine), 1.0),
        ),
        "shares complete GPUs first; "
        + ("GPU models kept for their restricted pods; " if guard else "")
        + "FGD in bands; ties balance restricted GPU models, keep the last hosts"
        " of whole-node pods, then the least unfillable share remainder, then CPU/GPU alignment (ours)",
        tie_break=ReserveThenAlign(
            ALIGN_STEP,
            waste_band=WASTE_BAND,
            balance=balance,
            cpu_bound_exact=cpu_bound_exact,
            reserve=WholeNodeReserve(keep, adaptive, horizon, prior_weight, by_need),
            cpu_horizon=cpu_horizon,
            need_horizon=need_horizon,
            restricted_banded=restricted_banded,
            banded_until=banded_until,
        ),
    )


class TopologyScore(ScorePlugin):
    """How well connected the GPUs a multi-GPU pod would get on each node are.

    For a pod of ``k >= 2`` whole GPUs: ``100 x (PREFER wishes the best free set meets / PREFER
    wishes)`` plus ``int(100 x link score of that set / link score of the best k GPUs of the idle
    machine)``; a machine without link information counts as perfectly connected. 0 for every other
    pod. Memoised per request shape and node version like FGD (the set search itself per free set on
    the machine's shared ``LinkMatrix``).
    """

    name = "topology"

    def __init__(self) -> None:
        self._cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._ideal: dict[int, tuple[LinkMatrix, dict[int, int]]] = {}  # id(links) -> (links, k -> score)

    def bind(self, cluster: ClusterState, workload: Sequence[PodRequest], rng: random.Random) -> None:
        self._cache = {}
        self._ideal = {}

    def node_score(self, pod: PodRequest, cluster: ClusterState, i: int) -> float:
        node = cluster.nodes[i]
        links = node.links()
        k = pod.whole_gpus
        chosen = best_gpu_set(links, node.free_gpu_indices(pod), k, pod.topology)
        if chosen is None:
            return 0.0
        score = 0.0
        prefer = links.prefer_count(pod.topology)
        if prefer:
            score += MAX_NODE_SCORE * links.satisfies(chosen, pod.topology, Wish.PREFER) / prefer
        if links.flat:
            return score + MAX_NODE_SCORE
        ideal = self._ideal_score(links, k)
        return score + (
            float(int(MAX_NODE_SCORE * links.set_score(chosen) / ideal)) if ideal else MAX_NODE_SCORE
        )

    def _ideal_score(self, links: LinkMatrix, k: int) -> int:
        """Link score of the best-connected k GPUs of the idle machine (the myopic optimum: the look-ahead
        may give a pod less for the sake of the GPUs left; the reference is kept, so ids stay unique)."""
        _, by_k = self._ideal.setdefault(id(links), (links, {}))
        if k not in by_k:
            best = greedy_gpu_set(links, range(links.n), k)
            by_k[k] = links.set_score(best) if best else 0
        return by_k[k]

    def applies(self, pod: PodRequest) -> bool:
        return pod.whole_gpus >= 2

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        if pod.whole_gpus < 2:
            return np.zeros(len(idx))
        key = (pod.whole_gpus, pod.gpu_models, pod.topology)
        return memoised_scores(self._cache, key, pod, cluster, idx, self.node_score)


def memoised_scores(
    cache: dict[tuple, tuple[np.ndarray, np.ndarray]],
    key: tuple,
    pod: PodRequest,
    cluster: ClusterState,
    idx: np.ndarray,
    node_score: Callable[[PodRequest, ClusterState, int], float],
) -> np.ndarray:
    """``node_score`` of each node of ``idx``, computed again only for nodes whose version changed
    since it was last computed for ``key`` (pods alike in what the score reads share an entry)."""
    entry = cache.get(key)
    if entry is None or len(entry[0]) != len(cluster):
        entry = cache[key] = (np.zeros(len(cluster)), np.full(len(cluster), -1, dtype=np.int64))
    scores, seen = entry
    version = cluster.version
    for i in idx[seen[idx] != version[idx]].tolist():
        scores[i] = node_score(pod, cluster, i)
        seen[i] = version[i]
    return scores[idx]


class NicNearnessScore(ScorePlugin):
    """How near the RDMA interfaces a pod would get on each node sit to the GPUs it would get there.

    For a pod of whole GPUs asking for RDMA interfaces: ``int(100 x (1 - distance / (2 x
    interfaces)))``, the distance being ``rdma.vf_distance`` of the allocation the node would give
    it (``allocate``: its GPUs and the VFs chosen beside them): per interface 0 on the PCIe switch of
    one of its GPUs, 1 on their NUMA node, 2 elsewhere. So 100 where every VF sits on its GPUs'
    switch, 0 where all sit on another socket. 0 for every other pod (without GPUs every VF is as
    far; a share's GPU is the policy's pick on the chosen node). Memoised per GPU count, models,
    topology wish and RDMA request, and node version.
    """

    name = "nic-nearness"

    def __init__(self) -> None:
        self._cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def bind(self, cluster: ClusterState, workload: Sequence[PodRequest], rng: random.Random) -> None:
        self._cache = {}

    @staticmethod
    def node_score(pod: PodRequest, cluster: ClusterState, i: int) -> float:
        node = cluster.nodes[i]
        alloc = allocate(pod, node)
        if alloc is None:  # the filters passed it; nothing to prefer
            return 0.0
        gpus = [node.gpus[g.index] for g in alloc.gpus]
        distance = vf_distance(
            alloc.rdma, node.nics, [g.id for g in gpus], {g.numa for g in gpus if g.numa >= 0}
        )
        return float(int(MAX_NODE_SCORE * (1 - distance / (2 * pod.rdma.count))))

    def applies(self, pod: PodRequest) -> bool:
        return bool(pod.rdma) and bool(pod.whole_gpus)

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        if not pod.rdma or not pod.whole_gpus:
            return np.zeros(len(idx))
        key = (pod.whole_gpus, pod.gpu_models, pod.topology, pod.rdma)
        return memoised_scores(self._cache, key, pod, cluster, idx, self.node_score)


def topology_policy() -> Policy:
    """For the live scheduler: multi-GPU pods to the node where their GPUs connect best and pods with
    RDMA interfaces where those sit nearest their GPUs, then ``DEFAULT_POLICY`` (fgd-reserve).

    The topology score (0..200) and the NIC nearness (0..100) are weighted 1000 each against FGD's
    bands so the order is lexicographic (they add up, a point of one weighing as a point of the
    other); for pods of fewer than two whole GPUs and no RDMA interfaces both are 0 everywhere and
    the policy is ``fgd-reserve`` with the whole-node reserve in proportion (``keep=None``), which
    holds up when ties are broken at random.
    """
    # ties at random in the live scheduler: hosts kept in proportion; the adaptive parts of fgd-reserve
    # (issue 26: the adaptive reserve, the model balance, the model guard) were measured with the
    # simulator's node order only, so topology stays as it was (FGD's fine bands too: the live scheduler
    # never calls observe, so their gate would read the pods known at bind for as long as the binding)
    base = fgd_reserve(
        keep=None,
        adaptive=False,
        balance=0.0,
        cpu_bound_exact=False,
        horizon=1.0,
        prior_weight=0.0,
        by_need=False,
        cpu_horizon=None,
        fgd_step=TOPOLOGY_FGD_STEP,
        fgd_spec_step=None,
        guard_fill=None,
        need_horizon=None,
        fine=None,
    )
    return Policy(
        "topology",
        ((TopologyScore(), 1000.0), (NicNearnessScore(), 1000.0), *base.plugins),
        "multi-GPU pods where their GPUs connect best, RDMA interfaces nearest their GPUs, then fgd-reserve",
        tie_break=base.tie_break,
    )


def _single(name: str, factory: Callable[[], ScorePlugin], description: str) -> Callable[[], Policy]:
    return lambda: Policy(name, ((factory(), 1.0),), description)


def utilization_policy() -> Policy:
    """Nodes (and a share's GPU) by static score, live utilisation and allocation after the pod
    (``utilization.UtilizationScore``; docs/utilisation.md); ties at random."""
    return Policy(
        "utilization",
        ((UtilizationScore(), 1.0),),
        "static node score, live GPU utilisation and allocation after placement (docs/utilisation.md)",
    )


def with_live_utilization(policy: Policy, weight: float) -> Policy:
    """``policy`` plus ``weight`` x the live utilisation term (``LiveUtilizationScore``, 0..100 per
    node); the same policy when ``weight`` is 0. Its tie-breaker and share GPU choice stay."""
    if not weight:
        return policy
    return Policy(
        policy.name,
        (*policy.plugins, (LiveUtilizationScore(), float(weight))),
        f"{policy.description}; plus {weight:g} x live GPU utilisation",
        tie_break=policy.tie_break,
    )


POLICIES: dict[str, Callable[[], Policy]] = {
    "random": _single("random", RandomScore, "a feasible node at random"),
    "dotprod": _single("dotprod", DotProductScore, "Tetris dot product of free and requested (CPU, GPU)"),
    "gpupacking": _single("gpupacking", GpuPackingScore, "used GPUs first, then used nodes, then idle nodes"),
    "gpuclustering": _single("gpuclustering", GpuClusteringScore, "pods of the same GPU shape together"),
    "bestfit": _single("bestfit", BestFitScore, "least CPU and GPU left after placement"),
    "binpack": _single("binpack", BestFitScore, "bin-pack: the same as bestfit, by its usual name"),
    "spread": _single("spread", SpreadScore, "most CPU and GPU left after placement (least allocated)"),
    "fgd": _single("fgd", FGDScore, "fragmentation gradient descent (Weng et al., ATC'23)"),
    "fgd-align": fgd_align,
    "fgd-reserve": fgd_reserve,
    "topology": topology_policy,
    "utilization": utilization_policy,
}

DEFAULT_POLICY = "fgd-reserve"


def policy_names() -> list[str]:
    return list(POLICIES)


def make_policy(name: str, utilization_weight: float = 0.0) -> Policy:
    """A fresh policy by name (``KeyError`` names the known ones), plus ``utilization_weight`` x the
    live utilisation term (``with_live_utilization``)."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None
    return with_live_utilization(factory(), utilization_weight)
