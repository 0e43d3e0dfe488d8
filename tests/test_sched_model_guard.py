"""The default's model guard (``ModelGuard``) and model balance by need (``ModelNeed``), ported from
bench/placement_variants.py's ``guard1ns-need1`` (issue 26, 2026-11-29); the live ``topology`` keeps
neither."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler.core import policies as P
from scheduler.core.request import PodRequest
from scheduler.core.schedule import Placement, schedule_one
from scheduler.core.state import Allocation, ClusterState, GpuGrant
from scheduler.sim.trace import NodeSpec, build_cluster

A = frozenset({"A"})


def pod(
    name: str, gpus: int = 1, milli: int = 1000, models: frozenset[str] = frozenset(), cpu: int = 1000
) -> PodRequest:
    return PodRequest(
        name, cpu_milli=cpu, memory_mib=1024, gpu_count=gpus, gpu_milli=milli, gpu_models=models
    )


def cluster() -> ClusterState:
    """Two nodes of a scarce model (A, 2 GPUs each) and eight of a common one (B, 8 GPUs each)."""
    nodes = [NodeSpec(f"a{i}", 32_000, 256_000, 2, "A") for i in range(2)]
    nodes += [NodeSpec(f"b{i}", 96_000, 768_000, 8, "B") for i in range(8)]
    return build_cluster(nodes)


def by_model(guard: P.ModelGuard, state: ClusterState, one: PodRequest) -> dict[str, float]:
    idx = np.arange(len(state))
    scores = guard.score(one, state, idx)
    return {state.nodes[i].name[0]: float(scores[i]) for i in idx.tolist()}


def test_a_scarce_model_is_guarded_once_its_free_gpus_are_below_its_expected_restricted_demand() -> None:
    state = cluster()  # 68 GPUs: A 4, B 64
    guard = P.ModelGuard(fill=1.0, warm_up=0.0)
    guard.bind(state, [pod("w")], random.Random(1))
    free_pod = pod("f")
    assert guard.bounds() == (-1.0, 0.0)
    assert guard.applies(free_pod) is False  # no restricted pod in the workload nor arrived yet
    for k in range(4):  # 8 GPUs arrived, 2 of them restricted to A: A's rate is 0.25
        guard.observe(pod(f"r{k}", models=A) if k < 2 else pod(f"u{k}", gpus=2))
    guard.observe(pod("u5", gpus=2))
    guard.observe(pod("cpu-only", gpus=0))  # pods without GPUs count for nothing
    # 60 GPUs still to arrive until the capacity: A is expected to get 0.25 x 60 = 15 > its 4 free
    assert guard.applies(free_pod)
    assert by_model(guard, state, free_pod) == {"a": -1.0, "b": 0.0}
    # restricted pods, shares and pods without GPUs are never kept away
    for other in (pod("r", models=A), pod("s", milli=500), pod("c", gpus=0)):
        assert not guard.applies(other)
        assert by_model(guard, state, other) == {"a": 0.0, "b": 0.0}
    # once the arrivals reach the capacity (fill 1.0) nothing is still to come: no model is guarded
    for k in range(30):  # 68 GPUs arrived
        guard.observe(pod(f"late{k}", gpus=2))
    assert by_model(guard, state, free_pod) == {"a": 0.0, "b": 0.0}
    assert not guard.applies(free_pod)  # whatever the cluster: the policy leaves it out


def test_a_model_with_enough_free_gpus_is_not_guarded() -> None:
    state = cluster()
    guard = P.ModelGuard(fill=1.0, warm_up=0.0)
    guard.bind(state, [pod("w")], random.Random(1))
    for k in range(20):  # 1 GPU of 20 restricted to B: 0.05 x 48 still to come = 2.4, below B's 64
        guard.observe(pod(f"r{k}", models=frozenset({"B"})) if k == 0 else pod(f"u{k}"))
    assert guard.applies(pod("f"))
    assert by_model(guard, state, pod("f")) == {"a": 0.0, "b": 0.0}


def test_before_warm_up_the_workload_gives_the_rate_and_after_it_the_arrivals() -> None:
    state = cluster()
    guard = P.ModelGuard(fill=1.0, warm_up=0.1)
    guard.bind(state, [pod("w0", models=A)] + [pod(f"w{k}") for k in range(1, 4)], random.Random(1))
    free_pod = pod("f")
    assert guard.applies(free_pod)  # before the warm-up the workload's rate (A: 1/4 of 68 GPUs > 4)
    assert by_model(guard, state, free_pod) == {"a": -1.0, "b": 0.0}
    for k in range(4):  # 8 GPUs arrived, none restricted: past the warm-up every rate is 0
        guard.observe(pod(f"u{k}", gpus=2))
    assert not guard.applies(free_pod) and by_model(guard, state, free_pod) == {"a": 0.0, "b": 0.0}
    guard.observe(pod("r", gpus=2, models=A))
    assert guard.applies(free_pod) and by_model(guard, state, free_pod) == {"a": -1.0, "b": 0.0}


def test_the_guard_counts_the_free_gpus_as_they_change() -> None:
    """The free GPU milli per model is followed as the cluster changes (``ModelFree``): a model is
    guarded once it drops below the demand."""
    state = cluster()
    guard = P.ModelGuard(fill=1.0, warm_up=0.0)
    guard.bind(state, [pod("w")], random.Random(1))
    for k in range(17):  # 1 of 17 GPUs arrived restricted to A: 1/17 x 51 to come = 3 < A's 4 free
        guard.observe(pod(f"r{k}", models=A) if k == 0 else pod(f"u{k}"))
    assert by_model(guard, state, pod("f")) == {"a": 0.0, "b": 0.0}
    take_a(state, 1000)  # 3000 milli of A free: not below the 3000 expected
    assert by_model(guard, state, pod("f")) == {"a": 0.0, "b": 0.0}
    take_a(state, 500)  # 2500 free: below
    assert by_model(guard, state, pod("f")) == {"a": -1.0, "b": 0.0}


def test_model_need_bands_a_model_by_its_free_share_over_its_need() -> None:
    state = cluster()  # A: 4 GPUs (4000 milli) of 68
    need = P.ModelNeed(0.2, 1.0)
    need.bind(state)
    free_pod = pod("f")
    assert need.bands(free_pod, state, np.arange(len(state))) is None  # no restricted pod yet
    for k in range(68):  # A's need: 1/68 of the GPUs arrived x 68000 / 4000 = 0.25 of its GPUs
        need.observe(pod(f"r{k}", models=A) if k == 0 else pod(f"u{k}"))
    assert need.bands(pod("r", models=A), state, np.arange(2)) is None  # restricted pods: no balance
    assert need.bands(pod("c", gpus=0), state, np.arange(2)) is None
    # A wholly free covers its need: as good as B (1 / 0.2 = 5)
    assert need.model_bands(state).tolist() == [5.0, 5.0]
    # A's free share 0.1 (400 milli of 4000 free) over a need of 0.25: 0.4 -> band 2
    take_a(state, 3600)
    assert need.model_bands(state).tolist() == [2.0, 5.0]
    # the balance by free share (ModelBalance) gives A floor(0.1 / 0.2) = 0 there
    plain = P.ModelBalance(0.2)
    plain.bind(state)
    plain.observe(pod("r", models=A))
    assert plain.model_bands(state).tolist() == [0.0, 5.0]


def take_a(state: ClusterState, milli: int) -> None:
    """Book ``milli`` more of A's GPU milli, GPU by GPU from node a0's first."""
    for node in state.nodes[:2]:
        for g in node.gpus:
            part = min(milli, g.free_milli)
            if part > 0:
                uid = f"t{state.generation}"
                state.book(Allocation(node.name, uid, gpus=(GpuGrant(g.index, g.id, part),)))
                milli -= part


def free_pods_on_a_scarce_model(**parts: object) -> list[str]:
    """The nodes 1-GPU pods free to use any model get from ``fgd_reserve(**parts)`` once a pod restricted
    to A arrived: A's 1-GPU 4-CPU nodes are FGD's best (they fill up exactly), B's 6-CPU 8-GPU nodes
    strand GPUs (2 CPUs left for 7 GPUs)."""
    nodes = [NodeSpec(f"a{i}", 4_000, 256_000, 1, "A") for i in range(3)]
    nodes += [NodeSpec(f"b{i}", 6_000, 512_000, 8, "B") for i in range(4)]
    state = build_cluster(nodes)
    state.set_tie_order(list(range(len(state))))
    workload = [pod(f"w{k}", models=A, cpu=4000) for k in range(2)] + [
        pod(f"u{k}", cpu=4000) for k in range(6)
    ]
    policy = P.fgd_reserve(**parts)  # type: ignore[arg-type]
    policy.bind(state, workload, random.Random(0))
    out = []
    for one in (pod("r0", models=A, cpu=4000), pod("f0", cpu=4000), pod("f1", cpu=4000)):
        policy.observe(one)
        placed = schedule_one(one, state, policy, random.Random(0))
        assert isinstance(placed, Placement)
        state.book(placed.allocation)
        out.append(placed.node)
    return out


def test_the_default_keeps_free_pods_off_a_model_its_restricted_pods_need() -> None:
    """The guard, not FGD nor the tie-break, keeps them off A: without it they take A's last GPUs."""
    assert free_pods_on_a_scarce_model() == ["a0", "b0", "b1"]
    assert free_pods_on_a_scarce_model(guard_fill=None) == ["a0", "a1", "a2"]
    assert free_pods_on_a_scarce_model(guard_fill=None, need_horizon=None) == ["a0", "a1", "a2"]


def test_the_default_has_the_guard_and_the_balance_by_need_and_topology_neither() -> None:
    policy = P.make_policy("fgd-reserve")
    kinds = [(type(plugin), weight) for plugin, weight in policy.plugins]
    assert kinds == [(P.ShareCompletionScore, 1000.0), (P.ModelGuard, P.GUARD_WEIGHT), (P.FGDScore, 1.0)]
    assert P.GUARD_WEIGHT == 100.0 and P.GUARD_FILL == 1.0 and P.NEED_HORIZON == 1.0
    guard = policy.plugins[1][0]
    assert isinstance(guard, P.ModelGuard) and guard.fill == 1.0 and guard.warm_up == P.GUARD_WARM_UP
    tie = policy.tie_break
    assert isinstance(tie, P.ReserveThenAlign)
    assert isinstance(tie.balance, P.ModelNeed) and tie.balance.horizon == 1.0 and tie.balance.band == 0.2
    old = P.fgd_reserve(guard_fill=None, need_horizon=None)
    assert not any(isinstance(plugin, P.ModelGuard) for plugin, _ in old.plugins)
    assert isinstance(old.tie_break, P.ReserveThenAlign) and type(old.tie_break.balance) is P.ModelBalance
    live = P.make_policy("topology")
    assert not any(isinstance(plugin, P.ModelGuard) for plugin, _ in live.plugins)
    assert isinstance(live.tie_break, P.ReserveThenAlign) and live.tie_break.balance is None


@pytest.mark.parametrize("fill", [0.5, 1.0, 2.0])
def test_the_guard_reads_no_pod_it_has_not_seen(fill: float) -> None:
    """The same workload distribution (the trace repeated) gives the same guard: only shares count."""
    state = cluster()
    workload = [pod("w0", models=A)] + [pod(f"w{k}") for k in range(1, 4)]
    one, three = P.ModelGuard(fill=fill), P.ModelGuard(fill=fill)
    one.bind(state, workload, random.Random(1))
    three.bind(state, workload * 3, random.Random(1))
    assert one.guarded(state) == three.guarded(state) == [True, False]


def test_the_alignment_is_exact_while_cpu_binds_only_until_a_restricted_pod_arrives() -> None:
    """``restricted_banded`` (the default's, ``RESTRICTED_BANDED``): exact alignment (step 0) while the
    arrivals ask for more of the CPU than of the GPUs, until a pod restricted to GPU models and asking
    GPUs arrives; then the bands of ``step`` again, for the rest of the run (a new bind starts afresh).
    A pod naming models without asking GPUs does not count; without ``restricted_banded`` nothing
    changes."""
    state = cluster()
    banded = P.ReserveThenAlign(0.2, cpu_bound_exact=True, restricted_banded=True)
    plain = P.ReserveThenAlign(0.2, cpu_bound_exact=True)
    for tie in (banded, plain):
        tie.bind(state, [pod("w", cpu=1000)], random.Random(1))
        for k in range(40):  # CPU-only arrivals: CPU binds
            tie.observe(pod(f"c{k}", gpus=0, cpu=16_000))
        assert tie.cpu_bound() and tie._step() == 0.0
        tie.observe(pod("cpu-named", gpus=0, cpu=1000, models=A))  # no GPUs: not a restricted pod
        assert tie._step() == 0.0
        tie.observe(pod("r", models=A))
    assert banded._step() == 0.2 and plain._step() == 0.0
    banded.bind(state, [pod("w", cpu=1000)], random.Random(1))
    for k in range(40):
        banded.observe(pod(f"c{k}", gpus=0, cpu=16_000))
    assert banded._step() == 0.0  # afresh after a bind
    default = P.fgd_reserve().tie_break
    assert isinstance(default, P.ReserveThenAlign) and default.restricted_banded
    assert default.restricted_banded is P.RESTRICTED_BANDED
    assert default.banded_until == P.RESTRICTED_BANDED_UNTIL == 0.7


def test_with_banded_until_the_alignment_is_exact_again_once_that_share_of_the_gpus_arrived() -> None:
    """``banded_until``: banded from the first restricted pod only until the GPU milli arrived reaches
    that share of the cluster's GPU capacity (68 GPUs here: 34 GPUs is 0.5), exact again after while CPU
    binds; None: banded for the rest of the run."""
    state = cluster()
    until = P.ReserveThenAlign(0.2, cpu_bound_exact=True, restricted_banded=True, banded_until=0.5)
    ever = P.ReserveThenAlign(0.2, cpu_bound_exact=True, restricted_banded=True)
    for tie in (until, ever):
        tie.bind(state, [pod("w", cpu=1000)], random.Random(1))
        for k in range(40):  # CPU-only arrivals: CPU binds
            tie.observe(pod(f"c{k}", gpus=0, cpu=16_000))
        tie.observe(pod("r", models=A))  # 1 GPU arrived
        assert tie.cpu_bound() and tie._step() == 0.2
        for k in range(32):  # 33 GPUs arrived: below half the capacity
            tie.observe(pod(f"u{k}", cpu=1000))
        for k in range(40):
            tie.observe(pod(f"c2{k}", gpus=0, cpu=16_000))
        assert tie.cpu_bound() and tie._step() == 0.2
        tie.observe(pod("u-last", cpu=1000))  # 34 GPUs: half the capacity
    assert until._step() == 0.0 and ever._step() == 0.2
