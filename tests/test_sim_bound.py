"""The LP upper bound on GPU allocation (``kubegpu simulate --bound``): exact on hand-made cases, never
below what a policy reaches, and still valid when column generation is stopped early."""

from __future__ import annotations

import json

import pytest

from scheduler.core import PodRequest
from scheduler.sim import cli
from scheduler.sim.bound import allocation_bound, arrived_by, protocol_bounds, shapes_of
from scheduler.sim.protocol import arrival_order, run_once
from scheduler.sim.trace import DEFAULT_NODES, DEFAULT_PODS, NodeSpec, load_nodes, load_pods


def share(name: str, milli: int, cpu: int = 1000, memory: int = 100) -> PodRequest:
    return PodRequest(name, cpu_milli=cpu, memory_mib=memory, gpu_count=1, gpu_milli=milli)


def whole(name: str, gpus: int, cpu: int = 1000, memory: int = 100) -> PodRequest:
    return PodRequest(name, cpu_milli=cpu, memory_mib=memory, gpu_count=gpus)


def test_shares_are_packed_per_gpu() -> None:
    """One GPU, shares of 810, 810 and 160: at most 810 + 160 fit one GPU (not 810 + 810 pooled)."""
    nodes = [NodeSpec("n", 8000, 8000, 1, "G")]
    result = allocation_bound(nodes, [share("a", 810), share("b", 810), share("c", 160)])
    assert result.converged
    assert result.bound_milli == pytest.approx(970, abs=1e-6)


def test_large_pods_do_not_share_a_node() -> None:
    """Two nodes of 4 CPUs and 2 GPUs; three 1-GPU pods of 3 CPUs: one per node, so two GPUs."""
    nodes = [NodeSpec(f"n{i}", 4000, 8000, 2, "G") for i in range(2)]
    pods = [whole(f"p{i}", 1, cpu=3000) for i in range(3)]
    assert allocation_bound(nodes, pods).bound_milli == pytest.approx(2000, abs=1e-6)


def test_gpu_counts_models_and_cpu_only_pods() -> None:
    nodes = [NodeSpec("big", 64_000, 64_000, 8, "A"), NodeSpec("small", 64_000, 64_000, 2, "B")]
    pods = [
        whole("eight", 8),  # only the 8-GPU node
        whole("four", 4),  # needs a node of >= 4 GPUs: none left once "eight" is there
        PodRequest("onlyA", cpu_milli=1000, gpu_count=1, gpu_milli=500, gpu_models=frozenset({"A"})),
        PodRequest("cpu", cpu_milli=60_000),  # places no GPU: left out
    ]
    assert sorted(s.gpus or s.milli for s in shapes_of(pods)) == [4, 8, 500]
    result = allocation_bound(nodes, pods)
    # 8 GPUs of A hold at most 8000 milli whatever the mix; B (2 GPUs) takes neither the 4-GPU pod
    # nor the A-only share
    assert result.bound_milli == pytest.approx(8000, abs=1e-6)
    assert result.capacity_milli == 10_000 and result.arrived_milli == 12_500


def test_arrived_by_matches_the_curve_buckets() -> None:
    pods = [whole(f"p{i}", 1) for i in range(10)]
    # capacity 4 GPUs: each pod is 25%; events at 25, 50, ..., 250%; those rounding to <= 100: 4 pods
    assert len(arrived_by(pods, 4000, 100)) == 4
    assert len(arrived_by(pods, 4000, 130)) == 5


def test_arrived_by_includes_the_event_past_the_point_that_the_curve_averages() -> None:
    """Capacity 100 GPUs; 99 one-GPU pods (events at 1..99%) then a 2-GPU pod (101%): no event rounds
    to 100, so the curve's value at 100 averages the events at 99 and 101%, and the bound there must
    count the 2-GPU pod too (it did not, and came out below what a policy reached on a small trace)."""
    pods = [whole(f"p{i:03}", 1) for i in range(99)] + [whole("two", 2), whole("more", 1)]
    assert arrived_by(pods, 100_000, 100) == pods[:100]
    assert arrived_by(pods, 100_000, 99) == pods[:99]  # an event rounds to 99: the curve uses it alone
    assert len(arrived_by(pods, 100_000, 50)) == 50
    assert arrived_by([], 100_000, 100) == []


ODD_NODES = [
    NodeSpec("t4", 8000, 16_000, 2, "T4"),
    NodeSpec("cpu", 4000, 8000, 0, ""),
    NodeSpec("v100", 96_000, 400_000, 8, "V100M16"),
]
ODD_PODS = [
    share("half", 500),
    whole("sixteen", 16),  # never fits
    PodRequest("free-cpu", cpu_milli=0, memory_mib=0, gpu_count=1),
    PodRequest("cpu-only", cpu_milli=500, memory_mib=100),
    PodRequest(
        "no-such-model",
        cpu_milli=1000,
        memory_mib=100,
        gpu_count=1,
        gpu_milli=300,
        gpu_models=frozenset({"A100"}),
    ),
    share("too-much-cpu", 200, cpu=200_000),
    PodRequest("eight", cpu_milli=1000, memory_mib=100, gpu_count=8, gpu_models=frozenset({"V100M16"})),
    PodRequest(
        "big-share",
        cpu_milli=100,
        memory_mib=10,
        gpu_count=1,
        gpu_milli=810,
        gpu_models=frozenset({"T4", "V100M16"}),
    ),
]


@pytest.mark.parametrize("policy", ["fgd-reserve", "bestfit", "random"])
def test_bound_holds_on_a_small_odd_trace(policy: str) -> None:
    """Few, large pods (the curve's points fall back to the events within one point), pods that never
    fit, a node without GPUs: at every point where the run has a value the bound is at least that
    value, and it is left out exactly where the run has none."""
    for seed in range(42, 52):
        run = run_once(ODD_NODES, ODD_PODS, policy, seed)
        bounds = protocol_bounds(ODD_NODES, ODD_PODS, seed, 1.3)
        for x in (100, 130):
            if run.curve.get(x) is None:
                assert x not in bounds, (seed, x)
            else:
                assert run.at(x) <= bounds[x].bound_pct + 1e-9, (policy, seed, x)


def sample() -> tuple[list[NodeSpec], list[PodRequest]]:
    return load_nodes(DEFAULT_NODES), load_pods(DEFAULT_PODS)


@pytest.mark.parametrize("policy", ["fgd", "bestfit", "random", "fgd-align", "fgd-reserve"])
def test_bound_is_never_below_a_policy(policy: str) -> None:
    """On the built-in openb sample, for two seeds: every policy's allocation at 100% and 130% arrived
    is at most the bound computed from the same arrivals."""
    nodes, pods = sample()
    for seed in (42, 43):
        run = run_once(nodes, pods, policy, seed)
        bounds = protocol_bounds(nodes, pods, seed, 1.3)
        assert set(bounds) == {100, 130}
        assert bounds[100].bound_milli <= bounds[130].bound_milli + 1e-6
        for x, bound in bounds.items():
            assert run.at(x) <= bound.bound_pct + 1e-9, (policy, seed, x)
            assert bound.bound_pct <= 100.0 + 1e-9


def test_stopped_early_the_bound_stays_valid() -> None:
    """The Farley bound after one round is above the converged LP optimum (never below it)."""
    nodes, pods = sample()
    capacity = sum(n.gpus for n in nodes) * 1000
    arrived = arrived_by(arrival_order(pods, 42, capacity), capacity, 100)
    full = allocation_bound(nodes, arrived)
    early = allocation_bound(nodes, arrived, max_iterations=1)
    assert full.converged and not early.converged
    assert early.bound_milli >= full.bound_milli - 1e-6
    assert full.lp_milli == pytest.approx(full.bound_milli, rel=1e-6)


def test_cli_bound_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--seed", "42", "--policy", "fgd", "--bound", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    run = doc["runs"][0]
    assert run["alloc_pct_at_130"] <= run["bound_alloc_pct_at_130"] <= 100
    assert doc["bound_alloc_pct_at_100"] == run["bound_alloc_pct_at_100"]
    assert doc["bound_alloc_pct_at_130"] == run["bound_alloc_pct_at_130"]
    assert cli.main(["--seed", "42", "--policy", "fgd", "--bound"]) == 0
    text = capsys.readouterr().out
    assert "upper bound on the allocation" in text and "@130: bound" in text


def test_cli_without_bound_has_no_bound_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--seed", "42", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "bound_alloc_pct_at_100" not in doc and "bound_alloc_pct_at_130" not in doc["runs"][0]


def test_cli_bound_without_the_130_point(capsys: pytest.CaptureFixture[str]) -> None:
    """Inflation to 100% never reaches 130% arrived: that bound is null, the other one is there."""
    assert cli.main(["--seed", "42", "--bound", "--json", "--inflation", "1.0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["bound_alloc_pct_at_130"] is None and 0 < doc["bound_alloc_pct_at_100"] <= 100
    assert "bound_alloc_pct_at_130" not in doc["runs"][0]


def test_no_pod_fitting_any_node_bounds_at_zero() -> None:
    """A GPU pod no node can take (another model) is all that arrived: the bound is 0, not a solver
    error (found by tests/test_sim_bound_forced.py's random clusters)."""
    nodes = [NodeSpec("n", 8000, 16_000, 2, "A")]
    pods = [PodRequest("b", cpu_milli=1000, gpu_count=2, gpu_models=frozenset({"B"})), whole("big", 4)]
    result = allocation_bound(nodes, pods)
    assert result.bound_milli == 0.0 and result.converged
