"""bench/bound_headroom.py: the headroom above the reference, the seeds where the target is out of reach,
the runs above the bound, and each workload's seeds."""

from __future__ import annotations

import pytest

from tests.support.benchscript import bench_module


def line(policy: str, seed: int, at_100: float, at_130: float) -> dict:
    return {"name": "m", "policy": policy, "seed": seed, "at_100": at_100, "at_130": at_130}


def test_headroom_counts_the_seeds_where_the_target_is_out_of_reach() -> None:
    bench = bench_module("bound_headroom.py", "bound_headroom_bench")
    bounds = [line("bound", 1, 97.0, 97.4), line("bound", 2, 97.0, 98.0)]
    runs = {
        "fgd": [line("fgd", 1, 96.0, 97.0), line("fgd", 2, 96.0, 97.0)],
        "ours": [line("ours", 1, 96.5, 97.2), line("ours", 2, 96.5, 97.6)],
    }
    h = bench.headroom(bounds, runs, "fgd", 0.5)
    assert round(h["headroom"], 6) == 0.7 and round(h["min_headroom"], 6) == 0.4
    assert h["seeds_out_of_reach"] == 1  # seed 1: 97.4 < 97.0 + 0.5
    assert not h["out_of_reach_in_mean"]  # 97.7 >= 97.0 + 0.5
    assert round(h["gap"]["ours"], 6) == 0.3 and round(h["share"]["ours"], 6) == round(0.4 / 0.7, 6)
    assert h["violations"] == []
    assert round(h["target_share"], 6) == round(0.5 / 0.7, 6) and round(h["headroom_100"], 6) == 1.0
    assert bench.headroom(bounds, runs, "fgd", 0.75)["out_of_reach_in_mean"]


def test_a_run_above_the_bound_is_listed_and_the_rounding_is_not() -> None:
    bench = bench_module("bound_headroom.py", "bound_headroom_bench")
    bounds = [line("bound", 1, 96.004, 97.0)]
    runs = {"fgd": [line("fgd", 1, 96.01, 97.2)]}  # 0.006 over at 100 (rounding), 0.2 over at 130
    assert bench.headroom(bounds, runs, "fgd", 0.5)["violations"] == [("fgd", 1, "at_130", 97.2, 97.0)]
    with pytest.raises(ValueError, match="seeds"):
        bench.headroom(bounds, {"fgd": [line("fgd", 2, 96.0, 97.0)]}, "fgd", 0.5)


def test_each_workload_runs_on_its_own_seeds_unless_told() -> None:
    bench = bench_module("bound_headroom.py", "bound_headroom_bench")
    own = bench.seeds_of(["t-cpu3", "h3-cpu6", "default"], None)
    assert own == {"t-cpu3": [42, 43, 44], "h3-cpu6": list(range(21, 31)), "default": list(range(42, 52))}
    assert bench.seeds_of(["t-cpu3"], [1, 2]) == {"t-cpu3": [1, 2]}
    with pytest.raises(SystemExit, match="nosuch"):
        bench.seeds_of(["nosuch"], None)
