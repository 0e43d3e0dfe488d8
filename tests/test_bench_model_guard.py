"""bench/placement_variants.py's ModelGuard: which models it keeps pods free to use any model away from."""

from __future__ import annotations

import random

import numpy as np

from scheduler.core.request import PodRequest
from scheduler.core.state import ClusterState
from scheduler.sim.trace import NodeSpec, build_cluster
from tests.support.benchscript import bench_module

variants = bench_module("placement_variants.py", "placement_variants_guard")


def cluster() -> ClusterState:
    """Two nodes of a scarce model (A, 2 GPUs each) and eight of a common one (B, 8 GPUs each)."""
    nodes = [NodeSpec(f"a{i}", 32_000, 256_000, 2, "A") for i in range(2)]
    nodes += [NodeSpec(f"b{i}", 96_000, 768_000, 8, "B") for i in range(8)]
    return build_cluster(nodes)


def pod(name: str, gpus: int = 1, milli: int = 1000, models: frozenset[str] = frozenset()) -> PodRequest:
    return PodRequest(
        name, cpu_milli=1000, memory_mib=1024, gpu_count=gpus, gpu_milli=milli, gpu_models=models
    )


def by_model(guard: object, state: ClusterState, one: PodRequest) -> dict[str, float]:
    idx = np.arange(len(state))
    scores = guard.score(one, state, idx)  # type: ignore[attr-defined]
    return {state.nodes[i].name[0]: float(scores[i]) for i in idx.tolist()}


def test_a_scarce_model_is_guarded_once_its_free_gpus_are_below_its_expected_restricted_demand() -> None:
    state = cluster()  # 68 GPUs: A 4, B 64
    guard = variants.ModelGuard(fill=1.0, shares=False, warm_up=0.0)
    guard.bind(state, [pod("w")], random.Random(1))
    free_pod = pod("f")
    assert guard.applies(free_pod) is False  # no restricted pod in the workload nor arrived yet
    for k in range(4):  # 8 GPUs arrived, 2 of them restricted to A: A's rate is 0.25
        guard.observe(pod(f"r{k}", models=frozenset({"A"})) if k < 2 else pod(f"u{k}", gpus=2))
    guard.observe(pod("u5", gpus=2))
    # 60 GPUs still to arrive until the capacity: A is expected to get 0.25 x 60 = 15 > its 4 free
    assert guard.applies(free_pod)
    assert by_model(guard, state, free_pod) == {"a": -1.0, "b": 0.0}
    # restricted pods and (shares=False) shares are never kept away
    assert not guard.applies(pod("r", models=frozenset({"A"})))
    assert not guard.applies(pod("s", milli=500))
    assert variants.ModelGuard(shares=True).applies(pod("s", milli=500)) is False  # nothing arrived
    # once the arrivals reach the capacity (fill 1.0) nothing is still to come: no model is guarded
    for k in range(30):  # 68 GPUs arrived
        guard.observe(pod(f"late{k}", gpus=2))
    assert by_model(guard, state, free_pod) == {"a": 0.0, "b": 0.0}
    assert not guard.applies(free_pod)  # whatever the cluster: the policy leaves it out


def test_the_guard_applies_only_while_some_model_may_be_guarded() -> None:
    """``applies`` is False where ``score`` is 0 whatever the cluster: past the warm-up with no
    restricted pod arrived (every rate 0), and once stopped (``stop``)."""
    state = cluster()
    guard = variants.ModelGuard(fill=1.0, warm_up=0.1, stop=0.5)
    guard.bind(state, [pod("w0", models=frozenset({"A"}))] + [pod(f"w{k}") for k in range(1, 4)], None)
    free_pod = pod("f")
    assert guard.applies(free_pod)  # before the warm-up the workload's rate (A: 1/4 of 68 GPUs > 4)
    assert by_model(guard, state, free_pod) == {"a": -1.0, "b": 0.0}
    for k in range(4):  # 8 GPUs arrived, none restricted: past the warm-up every rate is 0
        guard.observe(pod(f"u{k}", gpus=2))
    assert not guard.applies(free_pod) and by_model(guard, state, free_pod) == {"a": 0.0, "b": 0.0}
    guard.observe(pod("r", gpus=2, models=frozenset({"A"})))
    assert guard.applies(free_pod) and by_model(guard, state, free_pod) == {"a": -1.0, "b": 0.0}
    for k in range(12):  # 34 GPUs arrived: half the capacity, stopped
        guard.observe(pod(f"v{k}", gpus=2))
    assert not guard.applies(free_pod) and by_model(guard, state, free_pod) == {"a": 0.0, "b": 0.0}


def test_before_warm_up_the_workload_gives_the_rate() -> None:
    state = cluster()
    guard = variants.ModelGuard(fill=1.0, warm_up=0.5)
    workload = [pod("w0", models=frozenset({"B"}))] + [pod(f"w{k}") for k in range(1, 10)]
    guard.bind(state, workload, random.Random(1))
    # B's share of the workload is 0.1: 0.1 x 68 GPUs to come = 6.8, below B's 64 free; A gets none
    assert by_model(guard, state, pod("f")) == {"a": 0.0, "b": 0.0}
    guard = variants.ModelGuard(fill=1.0, warm_up=0.5, scale=10.0)  # 68 expected of B: above its 64
    guard.bind(state, workload, random.Random(1))
    assert by_model(guard, state, pod("f")) == {"a": 0.0, "b": -1.0}


def test_the_last_idle_hosts_of_a_model_are_kept_for_its_restricted_multi_gpu_pods() -> None:
    nodes = [NodeSpec(f"a{i}", 64_000, 512_000, 8, "A") for i in range(2)]
    nodes += [NodeSpec(f"b{i}", 96_000, 768_000, 8, "B") for i in range(2)]
    state = build_cluster(nodes)
    guard = variants.ModelGuard(shares=False, hosts=2)
    guard.bind(state, [pod("w")], random.Random(1))
    one = pod("f")
    assert not guard.applies(one) and list(guard.score(one, state, np.arange(4))) == [0.0] * 4
    guard.observe(pod("r8", gpus=8, models=frozenset({"A"})))  # an 8-GPU pod restricted to A arrived
    # A has 2 idle 8-GPU nodes, at most hosts=2: a 1-GPU pod (free or restricted to A) is kept off them
    assert list(guard.score(one, state, np.arange(4))) == [-1.0, -1.0, 0.0, 0.0]
    assert list(guard.score(pod("ra", models=frozenset({"A"})), state, np.arange(2))) == [-1.0, -1.0]
    assert list(guard.score(pod("r8b", gpus=8, models=frozenset({"A"})), state, np.arange(2))) == [0.0, 0.0]
    # with the workload as a prior the sizes are known from bind (B's share of it, 1/3, leaves the
    # free-GPU guard off: 1/3 x 32 GPUs to come is below B's 16 free)
    workload = [pod("w8", gpus=8, models=frozenset({"B"})), pod("u1", gpus=8), pod("u2", gpus=8)]
    early = variants.ModelGuard(shares=False, hosts=1, prior_hosts=True)
    early.bind(state, workload, random.Random(1))
    assert list(early.score(one, state, np.arange(4))) == [0.0] * 4  # B has 2 idle hosts, above 1
    guard_b = variants.ModelGuard(shares=False, hosts=2, prior_hosts=True)
    guard_b.bind(state, workload, random.Random(1))
    assert list(guard_b.score(one, state, np.arange(4))) == [0.0, 0.0, -1.0, -1.0]
