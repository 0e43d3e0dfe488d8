"""bench/placement_variants.py's ``GatedFGD`` (FGD's bands of 1 by an online gate, the ``fine-*``
variants): they run beside the default that ported one of them (``fine-ratio13-cu07``, the default
``fgd-reserve`` since 2026-11-29) and keep placing as they did."""

from __future__ import annotations

import json

import pytest

from scheduler.core import policies as core_policies
from tests.support.benchscript import bench_module
from tests.test_sim_default_placements import GOLDEN, digest, workload

variants = bench_module("placement_variants.py", "placement_variants_gated_fgd")
GATED = sorted(
    name
    for name, make in variants.VARIANTS.items()
    if name.startswith("fine") and any(isinstance(plugin, variants.GatedFGD) for plugin, _ in make().plugins)
)
# fgd-reserve's digest on sample-cpu5 (seed 42, node order) before the gate was ported (commit ce933dc):
# what ``nofine`` must place
BEFORE_GATE = "412:529ed2f122d02d233ad5b6181c6a1d40de0134936672b6ed4341d59294669886"


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, make in variants.VARIANTS.items():
        monkeypatch.setitem(core_policies.POLICIES, name, make)


def test_the_gated_variants_are_there() -> None:
    assert len(GATED) >= 10 and "fine-ratio13-cu07" in GATED


@pytest.mark.parametrize("name", GATED)
def test_each_gated_variant_runs(name: str, registered: None) -> None:
    loaded = workload("sample-cpu5")
    assert loaded is not None
    assert digest(name, *loaded, 42, "node-order").split(":")[0].isdigit()


def test_the_ported_variant_places_as_the_default_and_nofine_as_the_default_before(registered: None) -> None:
    loaded = workload("sample-cpu5")
    assert loaded is not None
    recorded = json.loads(GOLDEN.read_text())["fgd-reserve/sample-cpu5/42/node-order"]
    assert digest("fine-ratio13-cu07", *loaded, 42, "node-order") == recorded
    assert digest("nofine", *loaded, 42, "node-order") == BEFORE_GATE


def test_the_arrival_replay_counts_the_arrivals_in_fine_bands() -> None:
    """bench/arrival_gates.py's replay: on sample-cpu5, where ``fine-ratio13``'s gate opens from the
    workload, every seed's order spends some of its arrivals in bands of 1."""
    gates = bench_module("arrival_gates.py", "arrival_gates_replay")
    from scheduler.sim.protocol import arrivals, build_cluster

    loaded = workload("sample-cpu5")
    assert loaded is not None
    nodes, pods = loaded
    capacity = build_cluster(nodes).total_gpus() * 1000
    orders = [arrivals(pods, seed, capacity)[0] for seed in (42, 43)]
    fired, shares, _ = gates.replay("sample-cpu5", "fine-ratio13", orders, nodes, pods)
    assert fired == 2 and min(shares) > 0, (fired, shares)
