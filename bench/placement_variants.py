"""The variants of ``fgd-reserve`` measured for issue 26, by name, run through bench/simulate_openb.py.

    OPENB_TRACES=../shared/traces/openb .venv/bin/python bench/placement_variants.py \\
        --mixes tuning --jobs 2 --policies fgd,fgd-reserve-13,adaptive,fgd-reserve

Every argument is bench/simulate_openb.py's; the names below are added to its policies (docs/performance.md
says which data chose what). The variants are ``scheduler.core.policies.fgd_reserve`` with other
parameters, or its tie-breaker with the alignment always exact (``exact-align``). Variants named before
the reserve's second change (2026-11-28 night) keep the reserve's rule of then (``BEFORE``); every variant
is one of the default before the model guard and the balance by need were ported into it (2026-11-29,
``reserve-v2``, ``V2``), or (the late-phase ones) of the default with them but with the alignment exact while
CPU binds whatever arrived (``GUARDED``, ``guard-v3``); ``guard1ns-need1`` is that default built from this
file's own classes, ``spec-banded`` the first port of ``restricted_banded`` (banded for the rest of the run)
and ``banded-until07`` the default of now (banded until 0.7 of the capacity arrived, since 2026-11-29).
"""

from __future__ import annotations

import bisect
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from scheduler.core import policies as P  # noqa: E402
from scheduler.core.request import MILLI, PodRequest  # noqa: E402
from scheduler.core.scoring import Policy  # noqa: E402
from scheduler.core.state import ClusterState  # noqa: E402
from tests.support.benchscript import bench_module  # noqa: E402

# the reserve's rule before the second change of issue 26 (2026-11-28 night): horizon 1, no prior weight,
# a pod of as many whole GPUs as a shape breaks none of it (and no horizon of its own while CPU binds)
BEFORE = {"horizon": 1.0, "prior_weight": 0.0, "by_need": False, "cpu_horizon": None}


# the default before the model guard and the model balance by need were ported into it (2026-11-29,
# ``reserve-v2``): every variant here is one of that default (or of an older one, ``BEFORE``), so what they
# measured stays what they run
V2 = {"guard_fill": None, "need_horizon": None, "restricted_banded": False, "fine": None}


def reserve_v2(**parts: Any) -> Policy:
    """``scheduler.core.policies.fgd_reserve(**parts)`` without the model guard and with the model balance
    by free share (``V2``): the default before 2026-11-29's port, with ``parts`` changed."""
    return P.fgd_reserve(**{**V2, **parts})


def before_gate(**parts: Any) -> Policy:
    """``scheduler.core.policies.fgd_reserve(**parts)`` without FGD's fine bands by the demand gate
    (``fine=None``): the default before 2026-11-29's gate, which the variants after ``GUARDED`` change."""
    return P.fgd_reserve(**{"fine": None, **parts})


def default_parts(**parts: Any) -> tuple[Policy, P.ReserveThenAlign, P.FGDScore]:
    """``reserve_v2(**parts)`` with its tie-breaker and its FGD plugin, for a variant to change."""
    policy = reserve_v2(**parts)
    tie = policy.tie_break
    assert isinstance(tie, P.ReserveThenAlign)
    fgd = next(plugin for plugin, _ in policy.plugins if isinstance(plugin, P.FGDScore))
    return policy, tie, fgd


def exact_align() -> Policy:
    """fgd-reserve (the reserve's rule before 2026-11-28 night) with the alignment never banded (as with CPU
    the scarcer resource, always)."""
    policy = reserve_v2(**BEFORE)
    assert isinstance(policy.tie_break, P.ReserveThenAlign)
    policy.tie_break.step = 0.0
    return policy


def topology_over(**parts: Any) -> Callable[[], Policy]:
    """The live default ``topology`` (its topology and NIC nearness scores) over ``fgd_reserve(**parts)``
    instead of its fixed base: the adaptive parts of issue 26 tried under random ties (``--ties random``)."""

    def make() -> Policy:
        base = reserve_v2(**parts)
        plugins = ((P.TopologyScore(), 1000.0), (P.NicNearnessScore(), 1000.0), *base.plugins)
        return Policy("topology", plugins, "topology over a variant of fgd-reserve", tie_break=base.tie_break)

    return make


def reserve(horizon: float = 1.0, prior_weight: float = 0.0, by_need: bool = False) -> Callable[[], Policy]:
    """fgd-reserve with these parameters of its whole-node reserve (``WholeNodeReserve``) and no horizon
    of its own while CPU binds (the rule before 2026-11-29)."""
    return lambda: reserve_v2(horizon=horizon, prior_weight=prior_weight, by_need=by_need, cpu_horizon=None)


def cpu_horizon(factor: float | None) -> Callable[[], Policy]:
    """The default with the reserve's horizon ``factor`` while CPU binds (``RESERVE_CPU_HORIZON``)."""
    return lambda: reserve_v2(cpu_horizon=factor)


class CpuStep(P.ReserveThenAlign):
    """``ReserveThenAlign`` whose alignment is in bands of ``cpu_step`` (not exact) while CPU binds."""

    def __init__(self, cpu_step: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cpu_step = cpu_step
        self.base_step = self.step
        self.cpu_bound_exact = False  # the step is set per pod below instead

    def _set(self) -> None:
        self.step = self.cpu_step if self.cpu_bound() else self.base_step

    def _terms(
        self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray
    ) -> tuple[float, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        self._set()
        return super()._terms(pod, cluster, idx)

    def pick_tied(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> int | None:
        self._set()
        return super().pick_tied(pod, cluster, idx)


def cpu_step(step: float) -> Callable[[], Policy]:
    """The default with the alignment in bands of ``step`` while CPU binds (exact: 0)."""

    def make() -> Policy:
        policy, tie, _ = default_parts(cpu_horizon=None)
        policy.tie_break = CpuStep(
            step,
            step=tie.step,
            waste_band=tie.waste_band,
            balance=P.BALANCE_BAND,
            cpu_bound_exact=True,
            reserve=tie.reserve,
        )
        return policy

    return make


def cpu_fgd_step(step: int) -> Callable[[], Policy]:
    """The default with FGD in bands of ``step`` points (not 3) while CPU binds."""

    def make() -> Policy:
        policy, tie, fgd = default_parts()
        base, observe = fgd.step, tie.observe

        def observe_then_step(pod: PodRequest) -> None:
            observe(pod)
            want = step if tie.cpu_bound() else base
            if fgd.step != want:  # FGD's per-shape scores and memo hold banded scores: start afresh
                fgd.step, fgd._cache, fgd._memo = want, {}, {}

        tie.observe = observe_then_step  # type: ignore[method-assign]
        return policy

    return make


class CpuFloorReserve(P.WholeNodeReserve):
    """``WholeNodeReserve`` that, while its tie-breaker says CPU binds, also keeps at least ``share`` of
    the nodes with as many GPUs as each shape (a floor in hosts, not a multiple of the need)."""

    def __init__(self, share: float, tie: P.ReserveThenAlign, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.share, self.tie = share, tie
        self.floor: list[int] = []

    def bind(self, cluster: ClusterState, workload: Any) -> None:
        super().bind(cluster, workload)
        big = [int(np.count_nonzero(cluster.gpu_count >= gpus)) for gpus, _, _ in self.shapes]
        self.floor = [math.ceil(self.share * n) for n in big]

    def _scarce(self, table: Any, pod: PodRequest, horizon: float | None = None) -> list[int]:
        out = super()._scarce(table, pod, horizon)
        if not self.tie.cpu_bound():
            return out
        counts, floor = table.counts, self.floor
        extra = [k for k in self._may_break(pod) if k not in out and 0 < counts[k] <= floor[k]]
        return sorted(out + extra) if extra else out


def cpu_floor(share: float) -> Callable[[], Policy]:
    """The default whose reserve keeps at least ``share`` of the big nodes' hosts while CPU binds."""

    def make() -> Policy:
        policy, tie, _ = default_parts()
        own = tie.reserve
        tie.reserve = CpuFloorReserve(
            share,
            tie,
            keep=own.fixed,
            adaptive=own.adaptive,
            horizon=own.horizon,
            prior_weight=own.prior_weight,
            by_need=own.by_need,
        )
        return policy

    return make


class ModelSlack(P.ModelNeed):
    """``ModelBalance`` by slack: a model's free GPUs less the restricted demand it is expected to get
    from the free capacity left (its restricted pods' share of the GPU milli arrived so far times the
    cluster's free milli), over its capacity, plus 1 (so never below 0), in bands. The arrivals are
    tallied as the core's ``ModelNeed`` tallies them (``asked``, ``total``); its need is not used."""

    def __init__(self, band: float) -> None:
        super().__init__(band, horizon=1.0)

    def bands(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray | None:
        if pod.gpu_models or not pod.gpu_count or not self.any_restricted:
            return None
        free = np.bincount(self.codes, weights=cluster.gpu_free_total.astype(float), minlength=len(self.sets))
        expected = np.asarray(self.asked) / max(self.total, 1.0) * float(free.sum())
        slack = np.divide(free - expected, self.capacity, out=np.ones_like(free), where=self.capacity > 0)
        return np.floor((np.clip(slack, -1.0, 1.0) + 1.0)[self.codes[idx]] / self.band)


def _fgd_step_always(step: int) -> Policy:
    """The default with FGD in bands of ``step`` points from the start."""
    return reserve_v2(fgd_step=step)


def model_slack(band: float) -> Callable[[], Policy]:
    """The default with the model balance by slack (``ModelSlack``), bands of ``band``."""

    def make() -> Policy:
        policy, tie, _ = default_parts()
        tie.balance = ModelSlack(band)
        return policy

    return make


# the model balance by need, as the default has it since its port (identical decisions: the bench's own
# copy, which the variants were measured with, computed the same floats; tests/test_bench_guard_placements.py)
ModelNeed = P.ModelNeed


def model_need(band: float, horizon: float) -> Callable[[], Policy]:
    """The default with the model balance by need (``ModelNeed``), bands of ``band``."""

    def make() -> Policy:
        policy, tie, _ = default_parts()
        tie.balance = ModelNeed(band, horizon)
        return policy

    return make


class ModelGuard(P.ModelGuard):
    """The core's ``ModelGuard`` (its ``_split`` of a restricted pod's GPU milli over its model sets) with
    research options, as measured for issue 26. A score above FGD's bands: -1 on the nodes of a GPU model
    whose free GPU milli is below the demand its restricted pods are expected to bring until the cluster's
    GPUs have arrived ``fill`` times over, 0 elsewhere, for pods free to use any model (and, with
    ``cpu_only``, pods asking no GPU); 0 for restricted pods. The expected demand of a model is its
    restricted pods' share of the GPU milli arrived so far (after ``warm_up`` of the capacity has arrived;
    before, the workload's share, as the reserve's prior) times the GPU milli still to arrive (``fill`` x
    capacity less what arrived, at least 0). Reads the arrivals seen so far, the workload given at bind
    and the cluster's state only."""

    name = "model-guard"

    def __init__(
        self,
        fill: float = 1.0,
        cpu_only: bool = False,
        warm_up: float = 0.02,
        shares: bool = True,
        scale: float = 1.0,
        stop: float | None = None,
        hosts: int = 0,
        prior_hosts: bool = False,
    ) -> None:
        super().__init__(fill, warm_up)
        self.cpu_only = cpu_only
        # hosts > 0: also -1, for any pod that is not one of them, on the idle nodes of a model that some
        # arrived pod restricted to it asked G >= 2 whole GPUs of, while the model has at most ``hosts``
        # idle nodes of G or more GPUs (its last hosts for such pods)
        self.hosts, self.prior_hosts = hosts, prior_hosts  # prior_hosts: the workload's sizes from bind
        self.host_sizes: dict[int, set[int]] = {}
        # shares: whether it applies to shares; scale: times the expected demand; stop: off once this
        # share of the capacity has arrived (None: never before fill)
        self.shares, self.scale, self.stop = shares, scale, stop

    def bind(self, cluster: ClusterState, workload: Any, rng: Any) -> None:
        super().bind(cluster, workload, rng)
        self.host_sizes = {}
        if self.hosts and self.prior_hosts:  # the workload's sizes, as a prior
            for pod in workload:
                self._note_host_size(pod)

    def observe(self, pod: PodRequest) -> None:
        super().observe(pod)
        if self.hosts:
            self._note_host_size(pod)

    def _note_host_size(self, pod: PodRequest) -> None:
        """A pod restricted to GPU models asking G >= 2 whole GPUs: G is a size whose last hosts each of
        its models keeps (``hosts``)."""
        if not (pod.gpu_models and pod.gpu_count and pod.whole_gpus >= 2):
            return
        for code, models in enumerate(self.sets):
            if models & pod.gpu_models:
                self.host_sizes.setdefault(code, set()).add(pod.whole_gpus)

    def applies(self, pod: PodRequest) -> bool:
        """False where ``score`` is 0 everywhere whatever the cluster: no hosts kept and the guard not for
        this pod (``_guards``), or no model can be guarded now: past the warm-up with no restricted pod
        arrived (every rate 0), or nothing left to arrive (``_left`` 0: no free milli, never below 0,
        is below 0)."""
        if self.host_sizes:
            return True
        if not self._guards(pod):
            return False
        if not self.any_asked and self.total >= self.warm_up * self.capacity:
            return False
        return self._left() > 0.0

    def guarded(self, cluster: ClusterState) -> np.ndarray:
        """Per model set: whether its free GPU milli is below its expected restricted demand."""
        return np.array(self._guarded(cluster), dtype=bool)

    def _guarded(self, cluster: ClusterState) -> list[bool]:
        """``guarded`` one model set at a time in Python floats: the free GPU milli kept from the
        cluster's changes (``P.ModelFree``, exact sums) below the rate times what is left to arrive (the
        same operations as the vector form, so the same comparisons)."""
        if self.total >= self.warm_up * self.capacity:
            rates, per = self.asked, self.total
        else:
            rates, per = self.prior, self.prior_total
        left = self._left()
        free = self.free.of(cluster)
        if not per:  # nothing arrived with warm_up 0: numpy's 0/0 (nan, never above) as the vector form did
            return (np.array(free, dtype=float) < np.array(rates) / per * left).tolist()
        return [have < rate / per * left for have, rate in zip(free, rates, strict=True)]

    def _left(self) -> float:
        """The GPU milli still to arrive that the expected demand is taken over (0 once stopped)."""
        if self.stop is not None and self.total >= self.stop * self.capacity:
            return 0.0
        return max(self.fill * self.capacity - self.total, 0.0) * self.scale

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        if not self._guards(pod) or not self.any_asked and self.total >= self.warm_up * self.capacity:
            out = np.zeros(len(idx))
        else:  # -1.0 on guarded models, -0.0 elsewhere, as -(guarded as floats) on the nodes
            per_model = np.array([-1.0 if hit else -0.0 for hit in self._guarded(cluster)])
            out = per_model.take(self.codes.take(idx))
        if self.host_sizes:
            out = np.minimum(out, -self.last_hosts(pod, cluster, idx))
        return out

    def _guards(self, pod: PodRequest) -> bool:
        """Whether the free-GPU guard applies to the pod (``applies`` without the hosts' part)."""
        if pod.gpu_models or (pod.is_share and not self.shares):
            return False
        return (bool(pod.gpu_count) or self.cpu_only) and (self.any_asked or self.any_prior)

    def last_hosts(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        """1 on the nodes of ``idx`` that are the last ``hosts`` idle hosts of a model for its restricted
        pods of G whole GPUs (the pod being none of them), else 0."""
        out = np.zeros(len(idx))
        count = cluster.gpu_count
        idle = (cluster.gpu_full_free == count) & (count > 0)
        for code, sizes in self.host_sizes.items():
            mine = bool(pod.gpu_models & self.sets[code])
            for size in sizes:
                if mine and pod.whole_gpus >= size:
                    continue
                hosts = idle & (self.codes == code) & (count >= size)
                if 0 < int(np.count_nonzero(hosts)) <= self.hosts:
                    out = np.maximum(out, hosts[idx].astype(float))
        return out


def model_guard(
    fill: float = 1.0,
    cpu_only: bool = False,
    weight: float = 100.0,
    guard: dict | None = None,
    need: tuple[float, float] | None = None,
    **parts: Any,
) -> Callable[[], Policy]:
    """The default with ``ModelGuard`` between share completion and FGD (weight ``weight``: above FGD's
    bands, below completion)."""

    def make() -> Policy:
        policy, _, _ = default_parts(**parts)
        first, *rest = policy.plugins
        policy.plugins = (first, (ModelGuard(fill, cpu_only, **(guard or {})), weight), *rest)
        if need is not None:  # and the model balance by need (ModelNeed) in the tie-break
            tie = policy.tie_break
            assert isinstance(tie, P.ReserveThenAlign)
            tie.balance = ModelNeed(*need)
        return policy

    return make


VARIANTS: dict[str, Callable[[], Policy]] = {
    # the default before the model guard and the balance by need (2026-11-29): reserve's second rule, FGD
    # in bands of 3, the model balance by free share; guard1ns-need1 below is the default since
    "reserve-v2": reserve_v2,
    # the default of issue 13: 3 hosts kept, no model balance, alignment always in bands of 0.2
    "fgd-reserve-13": lambda: reserve_v2(
        keep=3, adaptive=False, balance=0.0, cpu_bound_exact=False, by_need=False
    ),
    "adaptive-nofloor": lambda: reserve_v2(
        keep=0, adaptive=True, balance=0.0, cpu_bound_exact=False, **BEFORE
    ),
    "adaptive": lambda: reserve_v2(keep=3, adaptive=True, balance=0.0, cpu_bound_exact=False, **BEFORE),
    "balance01": lambda: reserve_v2(balance=0.1, cpu_bound_exact=False, **BEFORE),
    "balance02": lambda: reserve_v2(balance=0.2, cpu_bound_exact=False, **BEFORE),
    "exact-align": exact_align,
    # the default from 2026-11-27 to the second change (2026-11-28 night); the reserve's parts tried then
    "fgd-reserve-26a": reserve(),
    "need": reserve(by_need=True),
    "horizon15": reserve(horizon=1.5),
    "horizon2": reserve(horizon=2.0),
    "horizon3": reserve(horizon=3.0),
    "prior10": reserve(prior_weight=0.1),
    "prior30": reserve(prior_weight=0.3),
    "need-horizon2": reserve(horizon=2.0, by_need=True),
    "need-h2-prior10": reserve(horizon=2.0, prior_weight=0.1, by_need=True),
    "need-h2-prior30": reserve(horizon=2.0, prior_weight=0.3, by_need=True),  # the default 2026-11-28/29
    # the reserve's horizon while CPU binds (t-cpu3, seeds 42-51): 10 was the default for an hour on
    # 2026-11-29, then dropped (below FGD at 130% on h2-cpu4-mg20; docs/performance.md)
    "cpuh3": cpu_horizon(3.0),
    "cpuh4": cpu_horizon(4.0),
    "cpuh6": cpu_horizon(6.0),
    "cpuh8": cpu_horizon(8.0),
    "cpuh10": cpu_horizon(10.0),
    "cpuh16": cpu_horizon(16.0),
    # ... and below the default's own while CPU binds (t-cpu4-gs40: CPU runs out first; kept hosts hold CPU)
    "cpuh05": cpu_horizon(0.5),
    "cpuh1": cpu_horizon(1.0),
    # the alignment in bands while CPU binds instead of exact, no CPU horizon (t-cpu3; none taken)
    # a floor of hosts kept while CPU binds, as a share of the big nodes (t-cpu3 and h2-cpu4-mg20)
    "cpufloor05": cpu_floor(0.05),
    "cpufloor10": cpu_floor(0.10),
    "cpufloor15": cpu_floor(0.15),
    "cpufloor30": cpu_floor(0.30),
    "cpufloor50": cpu_floor(0.50),
    # the model balance by slack (GPU-spec-heavy tuning mixes)
    "slack02": model_slack(0.2),
    "nobalance": lambda: reserve_v2(balance=0.0),
    # the model balance by need (branch spec26's rule, tried there on FGD bands of 8; here on 3)
    "need1": model_need(0.2, 1.0),
    "need2": model_need(0.2, 2.0),
    "fgd1": lambda: _fgd_step_always(1),
    "fgd3": lambda: _fgd_step_always(3),  # the default before 2026-11-29 (FGD_STEP 3)
    "fgd5": lambda: _fgd_step_always(5),
    "fgd6": lambda: _fgd_step_always(6),
    "fgd8": lambda: _fgd_step_always(8),
    "fgd10": lambda: _fgd_step_always(10),
    "fgd12": lambda: _fgd_step_always(12),
    # bands of 8 only once a pod restricted to GPU models has arrived (the default at d4853a9, dropped)
    "fgd8spec": lambda: reserve_v2(fgd_spec_step=8),
    "slack01": model_slack(0.1),
    "slack005": model_slack(0.05),
    # FGD in finer bands while CPU binds (t-cpu3; not taken: deeper dips)
    "cpufgd1": cpu_fgd_step(1),
    "cpufgd2": cpu_fgd_step(2),
    "cpustep01": cpu_step(0.01),
    "cpustep002": cpu_step(0.002),
    "cpustep005": cpu_step(0.05),
    # the live default with the parts of fgd-reserve it leaves out (keep=None: hosts in proportion)
    "topo-adaptive": topology_over(keep=None, adaptive=True, balance=0.2, cpu_bound_exact=True, **BEFORE),
    "topo-balance": topology_over(
        keep=None, adaptive=False, balance=0.2, cpu_bound_exact=False, by_need=False
    ),
    "topo-adaptive-only": topology_over(
        keep=None, adaptive=True, balance=0.0, cpu_bound_exact=False, **BEFORE
    ),
    # the live default with the second rule's by_need (non-adaptive, so it applies there too)
    "topo-need": topology_over(keep=None, adaptive=False, balance=0.0, cpu_bound_exact=False, by_need=True),
    # the model guard above FGD (the early GPU-spec dip of t-spec30-cpu050; docs/performance.md)
    "guard1": model_guard(1.0),
    "guard13": model_guard(1.3),
    "guard1cpu": model_guard(1.0, cpu_only=True),
    "guard08": model_guard(0.8),
    "guard115": model_guard(1.15),
    "guard1w6": model_guard(1.0, weight=6.0),
    "guard1w15": model_guard(1.0, weight=15.0),
    "guard1ns": model_guard(1.0, guard={"shares": False}),
    "guard13ns": model_guard(1.3, guard={"shares": False}),
    "guard1ns-s15": model_guard(1.0, guard={"shares": False, "scale": 1.5}),
    "guard1ns-need1": model_guard(1.0, guard={"shares": False}, need=(0.2, 1.0)),
    "guard1ns-need2": model_guard(1.0, guard={"shares": False}, need=(0.2, 2.0)),
    # and the last idle hosts of a model kept for its restricted multi-GPU pods
    "guard1ns-need1-h1": model_guard(1.0, guard={"shares": False, "hosts": 1}, need=(0.2, 1.0)),
    "guard1ns-need1-h2": model_guard(1.0, guard={"shares": False, "hosts": 2}, need=(0.2, 1.0)),
    "guard1ns-need1-ph1": model_guard(
        1.0, guard={"shares": False, "hosts": 1, "prior_hosts": True}, need=(0.2, 1.0)
    ),
    "guard1ns-need1-ph2": model_guard(
        1.0, guard={"shares": False, "hosts": 2, "prior_hosts": True}, need=(0.2, 1.0)
    ),
    "guard1s05": model_guard(1.0, guard={"scale": 0.5}),
    "guard1stop9": model_guard(1.0, guard={"stop": 0.9}),
    "guard1stop7": model_guard(1.0, guard={"stop": 0.7}),
    "topo-cpu": topology_over(keep=None, adaptive=False, balance=0.0, cpu_bound_exact=True, by_need=False),
}


# --- issue 26, multi-GPU- and whole-node-heavy mixes (branch multi26, 2026-11-29): share remainders ---
# Rules that adapt to the share sizes seen so far (docs/performance.md "Share remainders on the multi-GPU-
# and whole-node-heavy mixes"). Each reads the arrivals through ``observe`` and the workload's shape
# distribution at ``bind`` only as the prior the default's remainder table already uses.
SEEN_MIN_SHARE = 0.01  # a share size counts once it is this share of the share pods arrived
SEEN_WARM_UP = 50  # share pods arrived before the arrivals replace the prior


def seen_sizes(counts: dict[int, int], min_share: float = SEEN_MIN_SHARE) -> tuple[int, ...]:
    """The share sizes (milli) that are at least ``min_share`` of the share pods counted, ascending."""
    total = sum(counts.values())
    return tuple(sorted(m for m, k in counts.items() if total and k / total >= min_share))


def waste_table_of(sizes: tuple[int, ...]) -> np.ndarray:
    """``share_waste_table`` for the share sizes ``sizes``: per free milli r, what of r no sum fills."""
    best = [0] * (P.MILLI + 1)
    for r in range(1, P.MILLI + 1):
        best[r] = max([best[r - m] + m for m in sizes if m <= r], default=0)
    return np.array([r - best[r] for r in range(P.MILLI + 1)], dtype=np.int64)


class ShareSizes:
    """The share sizes seen so far: counts per milli of the plain share pods arrived, and the common ones
    (``seen_sizes``) once ``SEEN_WARM_UP`` have arrived (None before)."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.arrived = 0

    def observe(self, pod: PodRequest) -> bool:
        """Count ``pod``; True when the common sizes may have changed."""
        if not (pod.is_share and 0 < pod.gpu_milli < P.MILLI):
            return False
        self.counts[pod.gpu_milli] = self.counts.get(pod.gpu_milli, 0) + 1
        self.arrived += 1
        return self.arrived >= SEEN_WARM_UP

    def common(self) -> tuple[int, ...] | None:
        return seen_sizes(self.counts) if self.arrived >= SEEN_WARM_UP else None


class SeenWaste(P.ReserveThenAlign):
    """``ReserveThenAlign`` whose table of unfillable remainders is that of the share sizes seen so far
    (the workload's before ``SEEN_WARM_UP`` share pods have arrived)."""

    def bind(self, cluster: ClusterState, workload: Any, rng: Any) -> None:
        super().bind(cluster, workload, rng)
        self.sizes = ShareSizes()
        self.common: tuple[int, ...] | None = None

    def observe(self, pod: PodRequest) -> None:
        super().observe(pod)
        if self.sizes.observe(pod):
            common = self.sizes.common()
            if common != self.common:
                self.common = common
                self.waste = waste_table_of(common or ())


class WasteGpuFGD(P.FGDScore):
    """FGD whose share goes, among the GPUs of the chosen node that reach its best band, to the one left
    with the least unfillable remainder (the tie-breaker's table, ``owner.waste``), then the least left,
    then the lowest index (FGD: the lowest index). Plain shares only; the others as FGD."""

    def __init__(self, owner: P.ReserveThenAlign, **kw: Any) -> None:
        super().__init__(**kw)
        self.owner = owner
        self._table: np.ndarray | None = None

    def node_score(self, pod: PodRequest, cluster: ClusterState, i: int) -> tuple[float, int]:
        score, j = super().node_score(pod, cluster, i)
        if j < 0 or not P.plain_share(pod, cluster):
            return score, j
        if self._table is not self.owner.waste:  # the choices kept per shape used another table
            self._table = self.owner.waste
            self._cache = {}
        models, free, cpu = self._node_models[i], cluster.gpu_key[i], int(cluster.cpu_free[i])
        cuts = self.model.cpu_sorted
        before, after = bisect.bisect_right(cuts, cpu), bisect.bisect_right(cuts, cpu - pod.cpu_milli)
        key = (pod.gpu_milli, pod.gpu_count, models, free, before, after, None)
        hit = self._memo.get(key)
        values = hit[1] if hit is not None else self._evaluate(pod, models, free, before, after)[1]
        waste, milli = self._table, pod.gpu_milli
        row = cluster.gpu_rows[i]
        best = min(
            (int(waste[min(v - milli, P.MILLI)]), v - milli, k) for k, v in enumerate(row) if v in values
        )
        return score, best[2]


class SeenCompletion(P.ShareCompletionScore):
    """``ShareCompletionScore`` whose threshold is the smallest common share size seen so far (a GPU left
    with less than it is complete: only rare shares fill it), at least ``floor`` (the default's 110) and
    at most ``cap``; ``floor`` before ``SEEN_WARM_UP`` share pods have arrived."""

    def __init__(self, floor: int = P.COMPLETE_BELOW, cap: int = 300) -> None:
        super().__init__(floor)
        self.floor, self.cap = floor, cap
        self.sizes = ShareSizes()

    def _set_below(self, below: int) -> None:
        if below == self.below:
            return
        self.below = below
        left = np.arange(P.MILLI + 2, dtype=np.int64)
        self.by_left = np.where(left < below, 1.0 + (below - left) / below, 0.0)
        self._scores = self.by_left.tolist()
        self._kept = P.GpuStateValues()

    def bind(self, cluster: ClusterState, workload: Any, rng: Any) -> None:
        super().bind(cluster, workload, rng)
        self.sizes = ShareSizes()
        self._set_below(self.floor)

    def observe(self, pod: PodRequest) -> None:
        if self.sizes.observe(pod):
            common = self.sizes.common() or ()
            self._set_below(min(max(common[0] if common else self.floor, self.floor), self.cap))


def share_rule(
    seen_waste: bool, waste_gpu: bool, seen_complete: bool, cap: int = 300
) -> Callable[[], Policy]:
    """The default with: the remainder table of the sizes seen (``SeenWaste``), FGD's share GPU by that
    table (``WasteGpuFGD``), the completion threshold of the sizes seen (``SeenCompletion``)."""

    def make() -> Policy:
        policy, tie, fgd = default_parts()
        if seen_waste:
            new = SeenWaste.__new__(SeenWaste)
            new.__dict__.update(tie.__dict__)
            tie = new
        plugins = []
        for plugin, weight in policy.plugins:
            if isinstance(plugin, P.FGDScore) and waste_gpu:
                plugin = WasteGpuFGD(tie, step=fgd.step, whole_node_typical=False, spec_step=fgd.spec_step)
            elif isinstance(plugin, P.ShareCompletionScore) and seen_complete:
                plugin = SeenCompletion(cap=cap)
            plugins.append((plugin, weight))
        return Policy(policy.name, tuple(plugins), policy.description, tie_break=tie)

    return make


class RateHorizon(P.ReserveThenAlign):
    """``ReserveThenAlign`` whose reserve keeps the expected need over the arrivals still to come before
    the cluster is full, not over its free GPU milli: the horizon divided by the share of the GPU milli
    arrived over the last ``window`` of the cluster's capacity that was placed (clipped to ``lowest``..1;
    1 while the cluster takes every pod, so the same as the default until it fills). Reads the arrivals
    (``observe``) and the cluster's free GPU milli only."""

    def __init__(self, *args: Any, window: float = 0.05, lowest: float = 0.25, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.window, self.lowest = window, lowest

    def bind(self, cluster: ClusterState, workload: Any, rng: Any) -> None:
        super().bind(cluster, workload, rng)
        self.samples: list[tuple[int, int]] = [(0, 0)]  # (GPU milli arrived, GPU milli placed)
        self.cluster = cluster
        self.ratio = 1.0

    def observe(self, pod: PodRequest) -> None:
        super().observe(pod)
        if not pod.total_gpu_milli:
            return
        cluster = self.cluster
        placed = int(cluster.total_gpus() * P.MILLI - int(cluster.gpu_free_total.sum()))
        arrived = self.asked[1]
        samples = self.samples
        samples.append((arrived, placed))
        span = self.window * self.capacity[1]
        while len(samples) > 2 and arrived - samples[1][0] >= span:
            samples.pop(0)
        old_arrived, old_placed = samples[0]
        if arrived - old_arrived >= span:
            self.ratio = min(1.0, max(self.lowest, (placed - old_placed) / (arrived - old_arrived)))

    def _step_and_horizon(self) -> tuple[float, float | None]:
        step, horizon = super()._step_and_horizon()
        if self.ratio >= 1.0:
            return step, horizon
        return step, (horizon if horizon is not None else self.reserve.horizon) / self.ratio


def rate_horizon(window: float = 0.05, lowest: float = 0.25) -> Callable[[], Policy]:
    """The default whose reserve's horizon grows as the cluster refuses arrivals (``RateHorizon``)."""

    def make() -> Policy:
        policy, tie, _ = default_parts()
        new = RateHorizon.__new__(RateHorizon)
        new.__dict__.update(tie.__dict__)
        new.window, new.lowest = window, lowest
        return Policy(policy.name, policy.plugins, policy.description, tie_break=new)

    return make


class SoftReserve(P.WholeNodeReserve):
    """``WholeNodeReserve`` whose penalty also counts, below the scarce shapes, whether the pod would
    break a host of any shape it may break at all (``2 x scarce + any``): among FGD's tied nodes a pod
    goes where it leaves every whole-node host whole, before the hosts get scarce. The state only.
    ``gpu_only``: pods without GPUs get no soft digit (CPU-only pods may take the big hosts' CPU);
    ``rare``: only the shapes that fewer than this share of the nodes with as many GPUs can host at all
    (by capacity: on openb the 120-CPU 8-GPU shapes, 39 of 617 nodes) get it (None: every shape)."""

    gpu_only = False
    rare: float | None = None
    soft: set[int] | None = None  # bind: the shapes with a soft digit (None: all)

    def bind(self, cluster: ClusterState, workload: Any) -> None:
        super().bind(cluster, workload)
        self.soft = None
        if self.rare is not None:
            self.soft = set()
            for k, (gpus, cpu, memory) in enumerate(self.shapes):
                with_gpus = cluster.gpu_count >= gpus
                able = with_gpus & (cluster.cpu_capacity >= cpu) & (cluster.mem_capacity >= memory)
                if np.count_nonzero(able) < self.rare * max(int(np.count_nonzero(with_gpus)), 1):
                    self.soft.add(k)

    def scarce_breaks(
        self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray, horizon: float | None = None
    ) -> np.ndarray | None:
        base = super().scarce_breaks(pod, cluster, idx, horizon)
        may = self._may_break(pod)
        if self.soft is not None:
            may = [k for k in may if k in self.soft]
        if not may or not len(idx) or (self.gpu_only and not pod.total_gpu_milli):
            return base
        limits = self._limits[may]  # [shapes, 3, 1]
        gpus, cpu, memory = limits[:, 0], limits[:, 1], limits[:, 2]
        free_gpus, free_cpu, free_mem = (
            cluster.gpu_full_free[idx],
            cluster.cpu_free[idx],
            cluster.mem_free[idx],
        )
        whole = 0 if pod.is_share else pod.gpu_count
        now = (free_gpus >= gpus) & (free_cpu >= cpu) & (free_mem >= memory)
        after = (
            (free_gpus - whole >= gpus)
            & (free_cpu - pod.cpu_milli >= cpu)
            & (free_mem - pod.memory_mib >= memory)
        )
        breaks = (now & ~after).any(axis=0)
        if not breaks.any():
            return base
        return breaks.astype(np.int64) + (0 if base is None else 2 * np.asarray(base, dtype=np.int64))


class SoftReserveAlign(P.ReserveThenAlign):
    """``ReserveThenAlign`` over a ``SoftReserve``: the penalty digit spans ``2 x shapes + 1``."""

    def penalty_top(self) -> int:
        return 2 * len(self.reserve.shapes) + 1


def soft_reserve(gpu_only: bool = False, rare: float | None = None) -> Policy:
    """The default with the reserve's soft digit (``SoftReserve``)."""
    policy, tie, _ = default_parts()
    old = tie.reserve
    soft = SoftReserve(old.fixed, old.adaptive, old.horizon, old.prior_weight, old.by_need)
    soft.gpu_only, soft.rare = gpu_only, rare
    new = SoftReserveAlign.__new__(SoftReserveAlign)
    new.__dict__.update(tie.__dict__)
    new.reserve = soft
    return Policy(policy.name, policy.plugins, policy.description, tie_break=new)


VARIANTS.update(
    {
        "seenwaste": share_rule(True, False, False),
        "wastegpu": share_rule(False, True, False),
        "seenwaste-gpu": share_rule(True, True, False),
        "seencomplete": share_rule(False, False, True),
        "seencomplete200": share_rule(False, False, True, cap=200),
        "seenall": share_rule(True, True, True),
        "ratehorizon": rate_horizon(),
        "ratehorizon10": rate_horizon(0.10),
        "softkeep": soft_reserve,
        "softkeep-gpu": lambda: soft_reserve(gpu_only=True),
        "softrare": lambda: soft_reserve(rare=0.10),
        "softrare-gpu": lambda: soft_reserve(gpu_only=True, rare=0.10),
    }
)


# The default of 2026-11-29 morning (the model guard and the balance by need, the alignment exact while CPU
# binds whatever arrived): the variants below were measured against it, before restricted_banded was ported
# into the default (spec-banded below, 2026-11-29 session 10:10)
GUARDED = {"restricted_banded": False, "fine": None}


# --- issue 26, the late phase (2026-11-29 session 10:10): once the arrivals have asked for the cluster's
# GPUs `late` times over (the GPU milli arrived, counted by observe), the default turns into fgd-align's
# rules: the alignment exact and/or FGD in bands of 1 point. fgd-align is ahead of the default at 130% on
# the GPU-spec mixes while behind it at 100%.


class LateAlign(P.ReserveThenAlign):
    """``ReserveThenAlign`` whose alignment is exact once the GPU milli arrived reaches ``late`` x the
    cluster's GPU capacity."""

    late = 1.0

    def _step_and_horizon(self) -> tuple[float, float | None]:
        step, horizon = super()._step_and_horizon()
        if self.asked[1] >= self.late * self.capacity[1]:
            return 0.0, horizon
        return step, horizon


class LateFGD(P.FGDScore):
    """``FGDScore`` in bands of 1 point once the GPU milli arrived reaches ``late`` x the cluster's GPU
    capacity (``set_step``: its scores and memo start afresh then, as with ``spec_step``); with
    ``unless_restricted``, not once a pod restricted to GPU models has arrived (the spec rules keep their
    bands)."""

    late = 1.0
    unless_restricted = False

    def bind(self, cluster: ClusterState, workload: Any, rng: Any) -> None:
        super().bind(cluster, workload, rng)
        self.capacity_milli = float(cluster.total_gpus() * MILLI)
        self.arrived = 0.0
        self.restricted = False

    def observe(self, pod: PodRequest) -> None:
        super().observe(pod)
        self.arrived += pod.total_gpu_milli
        if pod.gpu_models and pod.gpu_count:
            self.restricted = True
        if self.unless_restricted and self.restricted:
            return
        if self.step != 1 and self.arrived >= self.late * self.capacity_milli:
            self.set_step(1)


def recast_tie_break(policy: Policy, cls: type[P.ReserveThenAlign], **attrs: Any) -> Policy:
    """``policy`` with its ``ReserveThenAlign`` tie-breaker turned into ``cls`` (a subclass adding no
    state of its own but ``attrs``), its parameters and state kept."""
    tie = policy.tie_break
    assert isinstance(tie, P.ReserveThenAlign)
    tie.__class__ = cls
    for name, value in attrs.items():
        setattr(tie, name, value)
    return policy


def late_rules(align: bool, fgd: bool, late: float = 1.0) -> Callable[[], Policy]:
    """The default (``fgd_reserve()``, with the guard and the balance by need) with fgd-align's exact
    alignment (``align``) and/or FGD in bands of 1 (``fgd``) once ``late`` x the GPU capacity arrived."""

    def make() -> Policy:
        policy = P.fgd_reserve(**GUARDED)
        if fgd:
            old = next(plugin for plugin, _ in policy.plugins if isinstance(plugin, P.FGDScore))
            new_fgd = LateFGD(
                step=old.step, whole_node_typical=old.whole_node_typical, spec_step=old.spec_step
            )
            new_fgd.late = late
            policy.plugins = tuple((new_fgd if p is old else p, w) for p, w in policy.plugins)
        return recast_tie_break(policy, LateAlign, late=late) if align else policy

    return make


VARIANTS.update(
    {
        "late-align": late_rules(True, False),
        "late-fgd1": late_rules(False, True),
        "late-both": late_rules(True, True),
        "late-both09": late_rules(True, True, 0.9),
        "late-align09": late_rules(True, False, 0.9),
    }
)


# --- issue 26, the CPU-heavy GPU-spec dip (2026-11-29 session 10:10; tuning mix t-spec25-cpu3-mg20):
# the small models' nodes run out of CPU (CPU-only pods, free 1-GPU pods of ~10 CPUs) before their GPUs,
# and ModelGuard counts GPUs only. CpuGuard also guards a model whose free CPU is below the CPU its
# restricted pods are expected to bring over the same horizon (their CPU per GPU milli arrived so far,
# times the GPU milli still to arrive), and (``cpu_only``) keeps CPU-only pods off such models.


class CpuGuard(P.ModelGuard):
    """``ModelGuard`` that also guards a model short of CPU for its restricted pods (see above)."""

    def __init__(self, fill: float = 1.0, warm_up: float = 0.02, cpu_only: bool = False) -> None:
        super().__init__(fill, warm_up)
        self.cpu_only = cpu_only

    def bind(self, cluster: ClusterState, workload: Any, rng: Any) -> None:
        super().bind(cluster, workload, rng)
        self.cluster_cpu = cluster.cpu_capacity
        self.cpu_asked = [0.0] * len(self.sets)
        self.cpu_prior = [0.0] * len(self.sets)
        for pod in workload:
            if pod.gpu_models and pod.gpu_count:
                self._split_cpu(pod, self.cpu_prior)

    def _split_cpu(self, pod: PodRequest, into: list[float]) -> None:
        match = [code for code, models in enumerate(self.sets) if models & pod.gpu_models]
        for code in match:
            into[code] += pod.cpu_milli / len(match)

    def observe(self, pod: PodRequest) -> None:
        super().observe(pod)
        if pod.gpu_count and pod.gpu_models:
            self._split_cpu(pod, self.cpu_asked)

    def _guards(self, pod: PodRequest) -> bool:
        if self.cpu_only and not pod.gpu_count and pod.cpu_milli:
            return self.any_asked or self.any_prior
        return super()._guards(pod)

    def guarded(self, cluster: ClusterState) -> list[bool]:
        gpu_short = super().guarded(cluster)
        if self._warm():
            rates, per = self.cpu_asked, self.total
        else:
            rates, per = self.cpu_prior, self.prior_total
        if not per:
            return gpu_short
        left = self._left()
        free_cpu = np.bincount(self.codes, weights=cluster.cpu_free, minlength=len(self.sets)).tolist()
        cpu_short = [have < rate / per * left for have, rate in zip(free_cpu, rates, strict=True)]
        self._cpu_short = cpu_short
        return [a or b for a, b in zip(gpu_short, cpu_short, strict=True)]

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        if not self._guards(pod) or not self.any_asked and self._warm():
            return np.zeros(len(idx))
        flags = self.guarded(cluster)
        if not pod.gpu_count:  # CPU-only pods: only the models short of CPU
            flags = self._cpu_short
        per_model = np.array([-1.0 if hit else -0.0 for hit in flags])
        return per_model.take(self.codes.take(idx))


def cpu_guard(cpu_only: bool) -> Callable[[], Policy]:
    """The default (``fgd_reserve()``) with ``CpuGuard`` in place of its ``ModelGuard``."""

    def make() -> Policy:
        policy = P.fgd_reserve(**GUARDED)
        policy.plugins = tuple(
            (CpuGuard(p.fill, p.warm_up, cpu_only), w) if isinstance(p, P.ModelGuard) else (p, w)
            for p, w in policy.plugins
        )
        return policy

    return make


VARIANTS.update({"cpuguard": cpu_guard(False), "cpuguard-cpu": cpu_guard(True)})


def whole_typical(**parts: Any) -> Callable[[], Policy]:
    """The default (``fgd_reserve(**parts)``) with whole-node pods among FGD's typical pods (as FGD has
    them)."""

    def make() -> Policy:
        policy = P.fgd_reserve(**{**GUARDED, **parts})
        for plugin, _ in policy.plugins:
            if isinstance(plugin, P.FGDScore):
                plugin.whole_node_typical = True
        return policy

    return make


VARIANTS.update(
    {
        "whole-typical": whole_typical(),
        "wt-fgd1": whole_typical(fgd_step=1),
        "wt-noexact": whole_typical(cpu_bound_exact=False),
        "noexact": lambda: P.fgd_reserve(**GUARDED, cpu_bound_exact=False),
        "d-fgd1": lambda: P.fgd_reserve(**GUARDED, fgd_step=1),
    }
)


class SpecBanded(P.ReserveThenAlign):
    """``ReserveThenAlign`` whose alignment stays in bands (never exact while CPU binds) once a pod
    restricted to GPU models (with GPUs) has arrived: exact alignment sends the pods of many CPUs per GPU
    to the small models' nodes (G3: 16 CPUs a GPU), which their restricted pods and the 120-CPU 8-GPU
    pods need."""

    restricted_seen = False

    def bind(self, cluster: ClusterState, workload: Any, rng: Any) -> None:
        super().bind(cluster, workload, rng)
        self.restricted_seen = False

    def observe(self, pod: PodRequest) -> None:
        super().observe(pod)
        if pod.gpu_models and pod.gpu_count:
            self.restricted_seen = True

    def _step_and_horizon(self) -> tuple[float, float | None]:
        if self.restricted_seen and self.cpu_bound_exact:
            self.cpu_bound_exact = False
            try:
                return super()._step_and_horizon()
            finally:
                self.cpu_bound_exact = True
        return super()._step_and_horizon()


def spec_banded(typical: bool = False) -> Callable[[], Policy]:
    """The default with ``SpecBanded`` as its tie-breaker (``typical``: and whole-node pods among FGD's
    typical pods once a restricted pod arrived... not gated: always, as ``whole-typical``)."""

    def make() -> Policy:
        policy = whole_typical()() if typical else P.fgd_reserve(**GUARDED)
        return recast_tie_break(policy, SpecBanded, restricted_seen=False)

    return make


VARIANTS.update(
    {
        # the default before restricted_banded (2026-11-29 morning: the guard and the balance by need)
        "guard-v3": lambda: P.fgd_reserve(**GUARDED),
        # the first port of restricted_banded (banded for the rest of the run: fgd_reserve(banded_until=None))
        # from SpecBanded; the default since bands only until 0.7 of the capacity (banded-until07)
        "spec-banded": spec_banded(),
        "wt-spec-banded": spec_banded(True),
    }
)


# --- issue 26, the live default with the model guard and the balance by need (2026-11-29) ---
# ``topology_policy``'s own arguments to ``fgd_reserve`` (every adaptive part of issue 26 off, the hosts
# kept in proportion); ``topo-base`` is ``topology`` rebuilt from them (the same placements), the others
# add the default's model guard (``GUARD_FILL``) and its model balance by need (``NEED_HORIZON``).
TOPOLOGY = {
    "keep": None,
    "adaptive": False,
    "balance": 0.0,
    "cpu_bound_exact": False,
    "horizon": 1.0,
    "prior_weight": 0.0,
    "by_need": False,
    "cpu_horizon": None,
    "fgd_step": P.TOPOLOGY_FGD_STEP,
    "fgd_spec_step": None,
    "guard_fill": None,
    "need_horizon": None,
}
TOPO_GUARD = {**TOPOLOGY, "guard_fill": 1.0}
TOPO_GUARD_NEED = {**TOPO_GUARD, "balance": P.BALANCE_BAND, "need_horizon": 1.0}


def unobserved(make: Callable[[], Policy]) -> Callable[[], Policy]:
    """``make``'s policy told of no arrival (``Policy.observe`` does nothing), as the live scheduler
    drives it: it binds the policy to the pods it knows and never calls ``observe``, so the guard's and
    the balance's rates stay the workload's (given at bind) and the guard's horizon never shrinks."""

    def build() -> Policy:
        policy = make()
        policy.observe = lambda pod: None  # type: ignore[method-assign]
        return policy

    return build


VARIANTS.update(
    {
        "topo-base": topology_over(**TOPOLOGY),
        "topo-guard": topology_over(**TOPO_GUARD),
        "topo-guard-need": topology_over(**TOPO_GUARD_NEED),
        # the same as the live scheduler would run them (no arrivals observed)
        "topo-guard-live": unobserved(topology_over(**TOPO_GUARD)),
        "topo-guard-need-live": unobserved(topology_over(**TOPO_GUARD_NEED)),
    }
)


# --- issue 26: restricted_banded only while the restricted pods' horizon lasts (2026-11-29 session 10:10):
# the default's alignment is banded once a restricted pod arrived; here exact again (while CPU binds) once
# the GPU milli arrived reaches ``until`` x the capacity (the model guard's horizon, GUARD_FILL 1).


def banded_until(until: float) -> Callable[[], Policy]:
    """The first port of ``restricted_banded`` exact again once ``until`` x the GPU capacity arrived: the
    core's ``fgd_reserve(banded_until=until)`` (measured first with a subclass of the tie-breaker here,
    the same placements: digests of openb-spec25-cpu3-mg20 and sample-spec50, seeds 42-43);
    ``banded-until07`` is the default since."""
    return lambda: before_gate(banded_until=until)


VARIANTS.update({f"banded-until{int(u * 10):02d}": banded_until(u) for u in (0.4, 0.5, 0.6, 0.7, 0.8, 1.0)})


# --- issue 26: keep the exact alignment, shy of the restricted models instead (2026-11-29 session 10:10).
# The exact alignment while CPU binds sent free pods to the small models' nodes (the dip); banding it
# (the default's rule) costs its CPU packing at 130% on the CPU-heaviest GPU-spec mixes (heldout10). Here
# the alignment stays exact and, in the same window (a restricted pod arrived, CPU binds, under
# ``until`` x the capacity arrived), the model balance puts every model some restricted pod asked for one
# band below the others, so a free pod goes to them only where no other model ties.


class ShyNeed(P.ModelNeed):
    """``ModelNeed`` whose models asked for by restricted pods are one band below the top while ``shy``."""

    shy = False

    def model_bands(self, cluster: ClusterState) -> np.ndarray:
        out = super().model_bands(cluster)
        if self.shy:
            top = math.floor(1.0 / self.band) - 1.0
            out = np.where(self.restricted, np.minimum(out, top), out)
        return out


class ShyTie(P.ReserveThenAlign):
    """The default's tie-breaker with the alignment exact while CPU binds (no ``restricted_banded``) and
    ``ShyNeed`` shy in the default's banding window."""

    until = 0.7

    def _window(self) -> bool:
        return self.restricted_arrived and self.asked[1] < self.until * self.capacity[1] and self.cpu_bound()

    def pick_tied(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> int | None:
        assert isinstance(self.balance, ShyNeed)
        self.balance.shy = self._window()
        return super().pick_tied(pod, cluster, idx)

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        assert isinstance(self.balance, ShyNeed)
        self.balance.shy = self._window()
        return super().score(pod, cluster, idx)


def shy_need(until: float = 0.7, always: bool = False) -> Callable[[], Policy]:
    """The default without ``restricted_banded`` and with ``ShyTie`` (``always``: shy whenever a
    restricted pod arrived, CPU-bound or not, until ``until``)."""

    def make() -> Policy:
        policy = before_gate(restricted_banded=False)
        tie = policy.tie_break
        assert isinstance(tie, P.ReserveThenAlign) and isinstance(tie.balance, P.ModelNeed)
        tie.balance.__class__ = ShyNeed
        recast_tie_break(policy, ShyTie, until=until)
        if always:
            tie._window = lambda: tie.restricted_arrived and tie.asked[1] < until * tie.capacity[1]  # type: ignore[method-assign]
        return policy

    return make


VARIANTS.update({"shy07": shy_need(0.7), "shy07-always": shy_need(0.7, True), "shy10": shy_need(1.0)})


# --- issue 26, the CPU-heavy dip without restricted pods (2026-11-29 session 13:56, branch cpudip; tuning
# mixes t-cpu3 and t-cpu3-mg20): while CPU binds the default's alignment is exact, which fills the CPU of
# the nodes that pods asking many CPUs per GPU (4 GPUs and 60 CPUs, 1 GPU and 24 CPUs, 8 GPUs and 120
# CPUs) need around 75-80% arrived. Each rule below reads the arrivals (observe) and the cluster's state
# only, and acts only while no pod restricted to GPU models has arrived (the default's own rule,
# restricted_banded, decides once one has).


class CpuWindow(P.ReserveThenAlign):
    """The default's tie-breaker whose alignment, while CPU binds and no restricted pod has arrived, is exact
    only while the GPU milli arrived is in ``[exact_from, exact_until)`` x the cluster's GPU capacity (in
    bands of the default's step outside it)."""

    exact_from = 0.0
    exact_until = math.inf

    def _step_and_horizon(self) -> tuple[float, float | None]:
        step, horizon = super()._step_and_horizon()
        if step == 0.0 and self.step and not self.restricted_arrived:
            arrived = self.asked[1] / self.capacity[1]
            if not self.exact_from <= arrived < self.exact_until:
                return self.step, horizon
        return step, horizon


def cpu_window(exact_from: float = 0.0, exact_until: float = math.inf) -> Callable[[], Policy]:
    """The default (``fgd_reserve()``) with ``CpuWindow`` as its tie-breaker."""
    return lambda: recast_tie_break(before_gate(), CpuWindow, exact_from=exact_from, exact_until=exact_until)


VARIANTS.update(
    {
        # banded until this share of the capacity arrived, exact after (banded_until's window from the start)
        "cpuexact-from05": cpu_window(exact_from=0.5),
        "cpuexact-from07": cpu_window(exact_from=0.7),
        # exact until this share of the capacity arrived, banded after (the idle hosts left are kept whole
        # by the node order within a band)
        "cpuexact-until05": cpu_window(exact_until=0.5),
        "cpuexact-until06": cpu_window(exact_until=0.6),
    }
)


class RichReserve(P.WholeNodeReserve):
    """``WholeNodeReserve`` that also keeps room for the CPU-rich GPU shapes, counted in pods: per GPU count G
    below the largest node's, the most CPU any pod of G whole GPUs asks where that is more per GPU than the
    CPU per GPU of the median GPU's node (on openb 12, the G2 nodes': 1 GPU and 24 CPUs, 2 and 30, 4 and 60).
    Such a shape's room is the sum over the nodes of ``min(whole GPUs free // G, CPU free // its CPU)``;
    it is kept at ``ceil(rich_horizon x s x free GPU milli / (G x 1000))`` pods, ``s`` the share of the GPU
    milli arrived so far of the pods that need such room (G or more whole GPUs and as much CPU; the workload's
    share counted as ``prior_weight`` of the capacity, as the reserve's own). While a shape has no more room
    than that, a pod that does not need it counts one more scarce shape on the nodes where it would take
    some of that room (the reserve's penalty digit). ``gate``: a callable; the rich part applies only while it
    says so (the tie-breaker's CPU-bound test and no restricted pod arrived). Adaptive only: the shares are of
    the GPU milli the adaptive reserve counts as arrived (``seen_total``)."""

    rich_horizon = 2.0
    gate: Callable[[], bool] | None = None

    def bind(self, cluster: ClusterState, workload: Any) -> None:
        super().bind(cluster, workload)
        largest = int(cluster.gpu_count.max()) if len(cluster) else 0
        with_gpus = cluster.gpu_count > 0
        gpus = cluster.gpu_count[with_gpus]
        per_gpu = cluster.cpu_capacity[with_gpus] / np.maximum(gpus, 1)
        order = np.argsort(per_gpu, kind="stable")  # the median GPU's node: GPUs summed in CPU-per-GPU order
        at = int(np.searchsorted(np.cumsum(gpus[order]), gpus.sum() / 2)) if len(gpus) else 0
        median = float(per_gpu[order][at]) if len(gpus) else 0.0
        most: dict[int, int] = {}
        for pod in workload:
            g = 0 if pod.is_share else pod.gpu_count
            if 1 <= g < largest and pod.cpu_milli > g * median:
                most[g] = max(most.get(g, 0), pod.cpu_milli)
        self.rich = sorted(most.items())  # (GPUs, CPU milli)
        demand = sum(p.total_gpu_milli for p in workload)
        self.rich_prior = [
            sum(p.total_gpu_milli for p in workload if self._needs_rich(p, shape)) / demand if demand else 0.0
            for shape in self.rich
        ]
        self.rich_seen = [0] * len(self.rich)

    @staticmethod
    def _needs_rich(pod: PodRequest, shape: tuple[int, int]) -> bool:
        return not pod.is_share and pod.gpu_count >= shape[0] and pod.cpu_milli >= shape[1]

    def observe(self, pod: PodRequest) -> None:
        super().observe(pod)
        if not pod.total_gpu_milli:
            return
        for k, shape in enumerate(self.rich):
            if self._needs_rich(pod, shape):
                self.rich_seen[k] += pod.total_gpu_milli

    def _rich_share(self, k: int) -> float:
        """Rich shape ``k``'s share of the GPU milli arrived (the adaptive reserve's ``seen_total``)."""
        return P.arrival_share(self.rich_seen[k], self.seen_total, self.rich_prior[k], self.prior_milli)

    def scarce_breaks(
        self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray, horizon: float | None = None
    ) -> np.ndarray | None:
        base = super().scarce_breaks(pod, cluster, idx, horizon)
        if not self.rich or not len(idx) or (self.gate is not None and not self.gate()):
            return base
        free_milli = float(cluster.gpu_free_total.sum())
        full, cpu_free = cluster.gpu_full_free, cluster.cpu_free
        take = 0 if not pod.total_gpu_milli else (1 if pod.is_share else pod.gpu_count)
        out = base
        for k, (g, c) in enumerate(self.rich):
            if self._needs_rich(pod, (g, c)):
                continue
            keep = math.ceil(self.rich_horizon * self._rich_share(k) * free_milli / (g * MILLI))
            room = np.minimum(full // g, np.maximum(cpu_free, 0) // c)
            if int(room.sum()) > keep:
                continue
            now = room[idx]
            after = np.minimum(
                np.maximum(full[idx] - take, 0) // g, np.maximum(cpu_free[idx] - pod.cpu_milli, 0) // c
            )
            hit = (after < now).astype(np.float64)
            if hit.any():
                out = hit if out is None else out + hit
        return out


class RichAlign(P.ReserveThenAlign):
    """``ReserveThenAlign`` over a ``RichReserve``: the penalty digit spans its whole-node and rich shapes."""

    def penalty_top(self) -> int:
        reserve = self.reserve
        return len(reserve.shapes) + len(getattr(reserve, "rich", ()))


def rich_reserve(horizon: float = 2.0, gated: bool = True) -> Callable[[], Policy]:
    """The default whose reserve also keeps room for the CPU-rich GPU shapes (``RichReserve``, over
    ``horizon``); ``gated``: only while CPU binds and no restricted pod has arrived."""

    def make() -> Policy:
        policy = recast_tie_break(before_gate(), RichAlign)
        tie = policy.tie_break
        assert isinstance(tie, P.ReserveThenAlign)
        old = tie.reserve
        assert old.adaptive  # RichReserve's shares are over the arrivals the adaptive reserve counts
        new = RichReserve(old.fixed, old.adaptive, old.horizon, old.prior_weight, old.by_need)
        new.rich_horizon = horizon
        if gated:
            new.gate = lambda: not tie.restricted_arrived and tie.cpu_bound()
        tie.reserve = new
        return policy

    return make


VARIANTS.update(
    {
        "richres1": rich_reserve(1.0),
        "richres2": rich_reserve(2.0),
        "richres4": rich_reserve(4.0),
        "richres2-always": rich_reserve(2.0, gated=False),
    }
)


class IdleBanded(P.ReserveThenAlign):
    """The default's tie-breaker whose exact alignment (while CPU binds, no restricted pod arrived) is exact
    only among the nodes that are not idle whole-node hosts: a node with as many GPUs as the largest, all
    free, counts its alignment's band (the lower edge of the default's band of ``step``) instead, so it
    takes a pod only where no partly used node is aligned as well as that band. Scored by ``score`` (the
    fused keys hold one alignment per node state and request, not per node kind), then the node order."""

    largest = 0
    # rare: instead of every idle whole-node host, only the nodes that can host (by capacity) a whole-node
    # shape that fewer than this share of the nodes with as many GPUs can (on openb the 120-CPU 8-GPU shapes:
    # the 39 G3 nodes of 617 8-GPU ones), while idle with that CPU free; rare_always: those nodes in any state
    rare: float | None = None
    rare_always = False
    # cpu_only: only for pods asking no GPU; last: the protected nodes' alignment is 0 (behind every other
    # node of the tie) instead of their band's lower edge
    cpu_only = False
    last = False
    idle_from = 0.0  # only once the GPU milli arrived reaches this share of the cluster's GPU capacity
    # idle_keep: only while the idle whole-node hosts are at most ceil(idle_keep x s x free GPU milli /
    # (largest x 1000)), s the share of the GPU milli arrived that whole-node pods asked (the workload's
    # counted as the reserve's prior_weight of the capacity, as the reserve counts it); None: always
    idle_keep: float | None = None

    def bind(self, cluster: ClusterState, workload: Any, rng: Any) -> None:
        super().bind(cluster, workload, rng)
        self.largest = int(cluster.gpu_count.max()) if len(cluster) else 0
        self.rare_nodes: np.ndarray | None = None
        self.rare_cpu = 0
        if self.rare is not None:
            self.rare_nodes = np.zeros(len(cluster), dtype=bool)
            cpus = []
            for gpus, cpu, memory in self.reserve.shapes:
                with_gpus = cluster.gpu_count >= gpus
                able = with_gpus & (cluster.cpu_capacity >= cpu) & (cluster.mem_capacity >= memory)
                if np.count_nonzero(able) < self.rare * max(int(np.count_nonzero(with_gpus)), 1):
                    self.rare_nodes |= able
                    cpus.append(cpu)
            self.rare_cpu = min(cpus, default=0)
        whole = sum(
            p.total_gpu_milli
            for p in workload
            if not p.is_share and self.largest >= 2 and p.gpu_count >= self.largest
        )
        demand = sum(p.total_gpu_milli for p in workload)
        self.whole_prior = whole / demand if demand else 0.0
        self.whole_seen = 0

    def observe(self, pod: PodRequest) -> None:
        super().observe(pod)
        if not pod.is_share and self.largest >= 2 and pod.gpu_count >= self.largest:
            self.whole_seen += pod.total_gpu_milli

    def _idle_needed(self, cluster: ClusterState) -> bool:
        """Whether the idle whole-node hosts are down to ``idle_keep``'s count (always without it)."""
        if self.idle_keep is None:
            return True
        # the GPU milli arrived: the tie-breaker's own count (asked[1])
        share = P.arrival_share(self.whole_seen, self.asked[1], self.whole_prior, self.reserve.prior_milli)
        keep = math.ceil(
            self.idle_keep * share * float(cluster.gpu_free_total.sum()) / (self.largest * MILLI)
        )
        count = cluster.gpu_count
        idle = int(np.count_nonzero((cluster.gpu_full_free == count) & (count >= self.largest)))
        return idle <= keep

    def _idle_mode(self, step: float) -> bool:
        late = self.asked[1] >= self.idle_from * self.capacity[1]
        return step == 0.0 and bool(self.step) and not self.restricted_arrived and late

    def _protected(self, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        """Which nodes of ``idx`` get their band instead of the exact alignment."""
        count = cluster.gpu_count[idx]
        idle = (cluster.gpu_full_free[idx] == count) & (count >= self.largest)
        if self.rare_nodes is None:
            return idle
        rare = self.rare_nodes[idx]
        if self.rare_always:
            return rare
        return rare & idle & (cluster.cpu_free[idx] >= self.rare_cpu)

    def pick_tied(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> int | None:
        if self._idle_mode(self._step()) and not (self.cpu_only and pod.total_gpu_milli):
            return None  # score, then the node order
        return super().pick_tied(pod, cluster, idx)

    def aligned(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray, step: float) -> np.ndarray:
        exact = super().aligned(pod, cluster, idx, step)
        if not self._idle_mode(step) or (self.cpu_only and pod.total_gpu_milli):
            return exact
        protected = self._protected(cluster, idx)
        if not protected.any() or not self._idle_needed(cluster):
            return exact
        if self.last:
            return np.where(protected, 0.0, exact)
        edge = super().aligned(pod, cluster, idx, self.step) * self.step
        return np.where(protected, edge, exact)


def idle_banded(
    rare: float | None = None,
    always: bool = False,
    cpu_only: bool = False,
    last: bool = False,
    idle_from: float = 0.0,
    idle_keep: float | None = None,
) -> Callable[[], Policy]:
    """The default with ``IdleBanded`` as its tie-breaker (``rare``, ``cpu_only``, ``last``, ``idle_from``:
    its own; ``always``: its ``rare_always``)."""
    return lambda: recast_tie_break(
        before_gate(),
        IdleBanded,
        rare=rare,
        rare_always=always,
        cpu_only=cpu_only,
        last=last,
        idle_from=idle_from,
        idle_keep=idle_keep,
    )


VARIANTS.update(
    {
        "idleband": idle_banded(),
        # only the idle hosts of the rare whole-node shapes (G3 on openb), or those nodes in any state
        "rareidleband": idle_banded(0.10),
        "rareband": idle_banded(0.10, always=True),
        # only CPU-only pods kept off the idle whole-node hosts: to their band's edge, or behind every node
        "idleband-cpu": idle_banded(cpu_only=True),
        "idlelast-cpu": idle_banded(cpu_only=True, last=True),
        # the idle whole-node hosts at their band's edge only once this share of the capacity arrived
        "idleband-from05": idle_banded(idle_from=0.5),
        "idleband-from06": idle_banded(idle_from=0.6),
        # ... only while the idle whole-node hosts are down to idle_keep x the whole-node pods' expected need
        "idlekeep4": idle_banded(idle_keep=4.0),
        "idlekeep8": idle_banded(idle_keep=8.0),
        "idlekeep16": idle_banded(idle_keep=16.0),
    }
)


class LateHorizon(P.ReserveThenAlign):
    """The default's tie-breaker whose reserve keeps ``late_horizon`` times the expected need (not its own
    horizon) while CPU binds, no restricted pod has arrived and the GPU milli arrived is at least
    ``late_from`` x the capacity: more whole-node hosts only for the last arrivals before the cluster fills
    (the t-cpu3 dip is whole-node pods refused at 76-82% arrived, the hosts gone since 74%)."""

    late_horizon = 3.0
    late_from = 0.6

    def _step_and_horizon(self) -> tuple[float, float | None]:
        step, horizon = super()._step_and_horizon()
        late = self.asked[1] >= self.late_from * self.capacity[1]
        if horizon is None and late and not self.restricted_arrived and self.cpu_bound():
            return step, self.late_horizon
        return step, horizon


def late_horizon(horizon: float, late_from: float) -> Callable[[], Policy]:
    """The default with ``LateHorizon`` as its tie-breaker."""
    return lambda: recast_tie_break(before_gate(), LateHorizon, late_horizon=horizon, late_from=late_from)


VARIANTS.update(
    {
        "latekeep3-060": late_horizon(3.0, 0.6),
        "latekeep4-065": late_horizon(4.0, 0.65),
        "latekeep6-065": late_horizon(6.0, 0.65),
    }
)


class HardKeep(P.ScorePlugin):
    """The reserve's penalty above FGD's bands (a score like the model guard's, weight 100): -1 on the nodes
    where the pod would break a scarce whole-node host (the tie-breaker's ``WholeNodeReserve.scarce_breaks``,
    its own horizon), while CPU binds, no restricted pod has arrived and the GPU milli arrived is at least
    ``late_from`` x the capacity; 0 elsewhere. The default's reserve reorders FGD's ties only, and late in a
    CPU-bound run the hosts go by FGD's own preference."""

    name = "hard-keep"

    def __init__(self, tie: P.ReserveThenAlign, late_from: float = 0.0) -> None:
        self.tie, self.late_from = tie, late_from

    def bounds(self) -> tuple[float, float]:
        return (-1.0, 0.0)

    def applies(self, pod: PodRequest) -> bool:
        tie = self.tie
        late = tie.asked[1] >= self.late_from * tie.capacity[1]
        return late and not tie.restricted_arrived and tie.cpu_bound()

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        if not self.applies(pod):
            return np.zeros(len(idx))
        penalty = self.tie.reserve.scarce_breaks(pod, cluster, idx)
        return np.zeros(len(idx)) if penalty is None else -(penalty > 0).astype(np.float64)


def hard_keep(late_from: float = 0.0) -> Callable[[], Policy]:
    """The default with ``HardKeep`` between share completion and FGD (weight 100, as the model guard)."""

    def make() -> Policy:
        policy = before_gate()
        tie = policy.tie_break
        assert isinstance(tie, P.ReserveThenAlign)
        first, *rest = policy.plugins
        policy.plugins = (first, (HardKeep(tie, late_from), P.GUARD_WEIGHT), *rest)
        return policy

    return make


VARIANTS.update(
    {
        "hardkeep": hard_keep(),
        "hardkeep-060": hard_keep(0.6),
        "hardkeep-070": hard_keep(0.7),
        "hardkeep-074": hard_keep(0.74),
    }
)


def fgd_fine_late(fine_from: float) -> Callable[[], Policy]:
    """The default (``default_parts``) with its FGD plugin in bands of 1 once ``fine_from`` of the GPU
    capacity has arrived, unless a restricted pod came before (``LateFGD``). On the most CPU-heavy tuning
    mix (t-cpu4-gs40) bands of 1 from the start gave +1.16 at 130% but a deeper dip near 65%; this tries
    them only after the dips' range."""

    def make() -> Policy:
        policy, _, fgd = default_parts()
        fgd.__class__ = LateFGD
        assert isinstance(fgd, LateFGD)
        fgd.late, fgd.unless_restricted = fine_from, True
        return policy

    return make


VARIANTS.update({"fine-late085": fgd_fine_late(0.85), "fine-late100": fgd_fine_late(1.0)})


# --- issue 26, FGD's fine bands gated by what has arrived (branch fine26, 2026-11-29 17:55 UTC): `fgd1`'s
# gain on t-cpu4-gs40 comes from its early placements and it costs on t-cpu3-mg20, so these decide from the
# arrivals so far (the workload's before the tie-breaker's warm-up, as ``cpu_bound``) whether FGD scores in
# bands of 1 or of the default's 3. The thresholds are midpoints between the tuning mixes' ranges over
# seeds 42-51 at 5-40% of the GPU capacity arrived (docs/performance.md "FGD's fine bands by an online
# gate"): the CPU-to-GPU demand ratio (CPU asked over the cluster's CPU, over GPU milli asked over its GPU
# milli) is 1.22-1.62 on t-cpu4-gs40 and at most 1.29 on every other tuning mix and shared trace (t-cpu3
# 1.07-1.28, t-cpu3-mg20 1.01-1.29 at 2%; after the warm-up, from 10%, 1.36-1.49 against at most 1.24);
# multi-GPU pods' share of the GPU milli arrived is 0.02-0.11 on t-cpu3 (0.04-0.13 on t-cpu4-gs40) at
# 10-40% and 0.16-0.28 on t-cpu3-mg20; sharing pods' share 0.27-0.31 on t-cpu3, 0.21-0.26 on t-cpu3-mg20,
# 0.37-0.42 on t-cpu4-gs40. fine-ratio13-cu07 is the one that kept every seed above FGD where it acts.


class GatedFGD(P.FGDScore):
    """``FGDScore`` in bands of ``fine_step`` while ``gate`` holds for the arrivals so far, else in its own:
    the core's fine bands (``FineBands``, ``DemandTally``: the workload's demand until ``WARM_UP`` of the
    cluster's GPU or CPU has been asked, ``until_cpu``) with ``gate`` for their ratio test. ``gate`` reads
    ``ratio`` (the CPU share of capacity asked over the GPU share asked), ``multi`` (pods of 2 or more whole
    GPUs' share of the GPU milli asked) and ``share`` (sharing pods' share of it). With
    ``unless_restricted``: its own bands for good once a pod restricted to GPU models has arrived;
    ``until``: its own bands once this share of the GPU capacity has been asked."""

    WARM_UP = P.ReserveThenAlign.WARM_UP
    gate: Callable[[float, float, float], bool] = staticmethod(lambda ratio, multi, share: False)
    unless_restricted = True
    until = math.inf

    @staticmethod
    def kinds(pods: Any) -> list[int]:
        """GPU milli of multi-GPU pods and of sharing pods among ``pods``."""
        out = [0, 0]
        for pod in pods:
            GatedFGD.add_kind(out, pod)
        return out

    @staticmethod
    def add_kind(into: list[int], pod: PodRequest) -> None:
        if pod.is_share:
            into[1] += pod.total_gpu_milli
        elif pod.gpu_count >= 2:
            into[0] += pod.total_gpu_milli

    def bind(self, cluster: ClusterState, workload: Any, rng: Any) -> None:
        self.prior_kinds, self.seen_kinds = self.kinds(workload), [0, 0]  # read by bind's _wanted_step
        super().bind(cluster, workload, rng)

    def observe(self, pod: PodRequest) -> None:
        self.add_kind(self.seen_kinds, pod)
        super().observe(pod)

    def _wanted_step(self, demand: P.DemandTally, fine: P.FineBands) -> int:
        asked, capacity = demand.asked, demand.capacity
        late = asked[1] >= self.until * capacity[1] or asked[0] >= fine.until_cpu * capacity[0]
        if (self.unless_restricted and demand.restricted_arrived) or late:
            return self.base_step
        gpu = demand.demand()[1]
        multi, share = self.seen_kinds if demand.warm() else self.prior_kinds
        fine_now = self.gate(demand.cpu_over_gpu(), multi / gpu if gpu else 0.0, share / gpu if gpu else 0.0)
        return fine.step if fine_now else self.base_step


def gated_fgd(
    gate: Callable[[float, float, float], bool],
    unless_restricted: bool = True,
    fine_step: int = 1,
    until: float = math.inf,
    until_cpu: float = math.inf,
) -> Callable[[], Policy]:
    """The default before the gate (``before_gate``) with FGD in bands of ``fine_step`` while ``gate``
    (ratio, multi-GPU share, sharing share) holds, until ``until`` of the GPU capacity or ``until_cpu`` of
    the CPU capacity has been asked (``GatedFGD``)."""

    def make() -> Policy:
        policy = before_gate()
        fgd = next(plugin for plugin, _ in policy.plugins if isinstance(plugin, P.FGDScore))
        fgd.__class__ = GatedFGD
        assert isinstance(fgd, GatedFGD)
        fgd.gate, fgd.unless_restricted, fgd.until = gate, unless_restricted, until  # type: ignore[method-assign]
        # the core's fine bands, their ratio test replaced by ``gate`` (GatedFGD._wanted_step): no ratio
        fgd.fine = P.FineBands(step=fine_step, ratio=math.nan, until_cpu=until_cpu, warm_up=GatedFGD.WARM_UP)
        fgd._demand = P.DemandTally(GatedFGD.WARM_UP)
        return policy

    return make


VARIANTS.update(
    {
        # the default itself with FGD in bands of 1 always (fgd1 is reserve-v2's: no guard, balance by
        # free share)
        "dfgd1": lambda: before_gate(fgd_step=1),
        # the default before fine-ratio13-cu07 was ported into it (2026-11-29): FGD in bands of 3 always
        "nofine": before_gate,
        # bands of 1 while CPU is asked at more than 1.3 times GPUs' share of capacity
        "fine-ratio13": gated_fgd(lambda ratio, multi, share: ratio > 1.3),
        "fine-ratio13-r": gated_fgd(lambda ratio, multi, share: ratio > 1.3, unless_restricted=False),
        # ... while CPU binds and multi-GPU pods are under 0.13 of the GPU milli arrived
        "fine-multi13": gated_fgd(lambda ratio, multi, share: ratio > 1.0 and multi < 0.13),
        # ... while CPU binds and sharing pods are over 0.34 of the GPU milli arrived
        "fine-share34": gated_fgd(lambda ratio, multi, share: ratio > 1.0 and share > 0.34),
        # fine-ratio13 with bands of 2, or only until 0.5 / 0.6 of the GPU capacity arrived (its dip on
        # t-cpu4-gs40 is at 64%)
        "fine2-ratio13": gated_fgd(lambda ratio, multi, share: ratio > 1.3, fine_step=2),
        "fine-ratio13-u04": gated_fgd(lambda ratio, multi, share: ratio > 1.3, until=0.4),
        "fine-ratio13-u05": gated_fgd(lambda ratio, multi, share: ratio > 1.3, until=0.5),
        "fine-ratio13-u06": gated_fgd(lambda ratio, multi, share: ratio > 1.3, until=0.6),
        # ... until 0.6 / 0.7 / 0.8 of the CPU capacity has been asked (the dips of t-cpu4-gs40 and the
        # probe mixes of bench/probe26_mixes.json come at 0.89-0.95 of it)
        "fine-ratio13-cu06": gated_fgd(lambda ratio, multi, share: ratio > 1.3, until_cpu=0.6),
        "fine-ratio13-cu07": gated_fgd(lambda ratio, multi, share: ratio > 1.3, until_cpu=0.7),
        "fine-ratio13-cu08": gated_fgd(lambda ratio, multi, share: ratio > 1.3, until_cpu=0.8),
    }
)


def main(argv: list[str] | None = None) -> int:
    P.POLICIES.update(VARIANTS)  # worker processes are forked and inherit them
    bench = bench_module("simulate_openb.py", "simulate_openb_variants")
    bench.POLICIES.update(VARIANTS)
    return int(bench.main(argv))


if __name__ == "__main__":
    sys.exit(main())
