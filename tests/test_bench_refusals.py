"""bench/refusals.py and the protocol's ``on_try`` hook it replays through, on the bundled sample."""

from __future__ import annotations

from scheduler.sim.protocol import run_once
from scheduler.sim.trace import DEFAULT_NODES, DEFAULT_PODS, load_nodes, load_pods
from tests.support.benchscript import bench_module


def test_on_try_sees_every_pod_once_with_its_outcome() -> None:
    nodes, pods = load_nodes(DEFAULT_NODES), load_pods(DEFAULT_PODS)
    seen: list[tuple[str, bool, float]] = []
    run = run_once(
        nodes, pods, "fgd", 42, on_try=lambda p, got, _c, a: seen.append((p.uid, got is not None, a))
    )
    plain = run_once(nodes, pods, "fgd", 42)
    assert len(seen) == run.pods and sum(ok for _, ok, _ in seen) == run.placed
    assert (run.placed, run.curve) == (plain.placed, plain.curve)  # the hook changes nothing
    arrived = [a for _, _, a in seen]
    assert arrived == sorted(arrived) and 129.0 < arrived[-1] <= 131.0


def test_refusals_count_what_the_run_refuses_and_snapshot_the_models() -> None:
    refusals = bench_module("refusals.py", "refusals_bench")
    nodes, pods = load_nodes(DEFAULT_NODES), load_pods(DEFAULT_PODS)
    out = refusals.replay(nodes, pods, "fgd", 42, upto=200.0, snapshots=[50.0, 100.0])
    run = run_once(nodes, pods, "fgd", 42)
    assert out["refused"] == run.pods - run.placed == len(out["refusals"])
    assert set(out["snapshots"]) == {"50", "100"}
    for models in out["snapshots"].values():
        assert models and all(0.0 <= v["gpu_free"] <= 1.0 for v in models.values())
    tallied = sum(k[1] for kinds in out["placed_by_first_snapshot"].values() for k in kinds.values())
    assert 0 < tallied  # GPUs placed by 50% arrived
