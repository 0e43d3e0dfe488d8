"""What the policies may know: the workload's shape distribution, never the arrivals to come.

The openb target (docs/simulator.md) forbids a policy reading the trace's future. The simulator hands
``Policy.bind`` the trace itself (not the seed's inflated arrival order), and the policies must read
only its distribution: the same decisions for the trace shuffled, or with every pod repeated.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from scheduler.core import Placement, PodRequest, make_policy, schedule_one
from scheduler.core.policies import FGDScore
from scheduler.core.scoring import Policy
from scheduler.sim import protocol
from scheduler.sim.protocol import arrival_order, run_once
from scheduler.sim.trace import DEFAULT_NODES, DEFAULT_PODS, build_cluster, load_nodes, load_pods

POLICIES = ("fgd", "fgd-align", "fgd-reserve", "topology")


def decisions(
    policy_name: str,
    workload: Sequence[PodRequest],
    seed: int = 42,
    pods: Sequence[PodRequest] | None = None,
) -> list[tuple[str, tuple]]:
    """``policy_name``'s decisions bound to ``workload``, for the arrivals of ``pods`` (default: the
    sample's) in the seed's order."""
    nodes = load_nodes(DEFAULT_NODES)
    pods = load_pods(DEFAULT_PODS) if pods is None else pods
    cluster = build_cluster(nodes)
    cluster.set_tie_order(random.Random(seed).sample(range(len(cluster)), len(cluster)))
    rng = random.Random(seed)
    policy = make_policy(policy_name)
    policy.bind(cluster, workload, rng)
    out: list[tuple[str, tuple]] = []
    for pod in arrival_order(pods, seed, cluster.total_gpus() * 1000, 1.3):
        policy.observe(pod)  # as the simulator does: the pod has arrived
        result = schedule_one(pod, cluster, policy, rng, explain=False)
        if isinstance(result, Placement):
            cluster.assume(result.allocation)
            out.append((result.node, tuple(g.index for g in result.allocation.gpus)))
        else:
            out.append(("-", ()))
    return out


@pytest.mark.parametrize("policy", POLICIES)
def test_decisions_depend_on_the_workload_distribution_only(policy: str) -> None:
    pods = load_pods(DEFAULT_PODS)
    assert any(p.gpu_count == 8 for p in pods)  # the sample has whole-node pods: the reserve is at work
    base = decisions(policy, pods)
    shuffled = pods[:]
    random.Random(5).shuffle(shuffled)
    assert decisions(policy, shuffled) == base
    assert decisions(policy, [p for p in pods for _ in range(3)]) == base


def cpu_heavy(pods: Sequence[PodRequest]) -> list[PodRequest]:
    """The pods, then CPU-only pods of 32 CPUs asking twice their CPU again: in all CPU runs out far ahead
    of GPUs (fgd-reserve's fine bands open), though not in the first part of the list."""
    extra = [PodRequest(f"cpu-{k}", cpu_milli=32_000, memory_mib=4096) for k in range(185)]
    return [*pods, *extra]


def test_the_demand_gates_read_the_workload_distribution_only() -> None:
    """On a CPU-heavy workload, where the demand gates act (FGD's fine bands open at bind from the
    workload's CPU-to-GPU ratio, the exact alignment's CPU-bound test holds), the decisions are the same
    for the workload shuffled or repeated: the gates read its ratio, never its order or its counts. (The
    sample alone never opens the fine bands, so the test above does not reach them.)"""
    policy = "fgd-reserve"
    pods = cpu_heavy(load_pods(DEFAULT_PODS))
    policy_object = make_policy(policy)
    fgd = next(p for p, _ in policy_object.plugins if isinstance(p, FGDScore))
    policy_object.bind(build_cluster(load_nodes(DEFAULT_NODES)), pods, random.Random(1))
    assert fgd.fine is not None and fgd.step == fgd.fine.step  # the gate is open at bind
    base = decisions(policy, pods, pods=pods)
    shuffled = pods[:]
    random.Random(5).shuffle(shuffled)
    assert decisions(policy, shuffled, pods=pods) == base
    assert decisions(policy, [p for p in pods for _ in range(3)], pods=pods) == base


def test_the_simulator_binds_the_trace_not_the_arrivals(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Sequence[PodRequest]] = []
    original = Policy.bind

    def recording(self: Policy, cluster, workload, rng=None) -> None:  # type: ignore[no-untyped-def]
        seen.append(workload)
        original(self, cluster, workload, rng)

    monkeypatch.setattr(Policy, "bind", recording)
    pods = load_pods(DEFAULT_PODS)
    run_once(load_nodes(DEFAULT_NODES), pods, "fgd-reserve", 42)
    assert len(seen) == 1 and seen[0] is pods
    assert protocol.INFLATION > 1  # the arrivals (with clones) are more than the trace handed over


def test_the_simulator_tells_the_policy_each_arrival_before_trying_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Policies that adapt to the arrivals (the adaptive whole-node reserve) see each pod once, as it
    arrives, before it is tried; never one that has not arrived yet."""
    events: list[tuple[str, str]] = []
    observe, score, best_scores = Policy.observe, Policy.score, Policy.best_scores

    def observing(self: Policy, pod: PodRequest) -> None:
        events.append(("arrive", pod.uid))
        observe(self, pod)

    def scoring(self: Policy, pod, cluster, idx):  # type: ignore[no-untyped-def]
        events.append(("try", pod.uid))
        return score(self, pod, cluster, idx)

    def best_scoring(self: Policy, pod, cluster, idx):  # type: ignore[no-untyped-def]
        events.append(("try", pod.uid))  # schedule_one's way in (it may not call score at all)
        return best_scores(self, pod, cluster, idx)

    monkeypatch.setattr(Policy, "observe", observing)
    monkeypatch.setattr(Policy, "score", scoring)
    monkeypatch.setattr(Policy, "best_scores", best_scoring)
    nodes, pods = load_nodes(DEFAULT_NODES), load_pods(DEFAULT_PODS)
    run = run_once(nodes, pods, "fgd-reserve", 42)
    order = arrival_order(pods, 42, run.capacity_milli, protocol.INFLATION)
    assert [uid for kind, uid in events if kind == "arrive"] == [p.uid for p in order]
    arrived: set[str] = set()
    for kind, uid in events:
        if kind == "arrive":
            arrived.add(uid)
        else:
            assert uid in arrived
    assert sum(kind == "try" for kind, _ in events) > len(order) // 2


def test_runs_are_identical_across_processes_with_different_string_hashing() -> None:
    """Nothing a decision depends on iterates a set of strings (GPU models, node names) in hash order:
    two processes with different PYTHONHASHSEED give the same JSON, but for the wall time."""
    import json
    import os
    import subprocess
    import sys

    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-m", "scheduler.sim.cli", "--seeds", "42-43", "--json", "--policy", "topology"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        doc = json.loads(done.stdout)
        doc.pop("seconds")
        outputs.append(doc)
    assert outputs[0] == outputs[1]
