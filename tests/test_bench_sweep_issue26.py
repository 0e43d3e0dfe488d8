"""bench/sweep_issue26.py's summary: margins to FGD paired by seed and the mean curve's worst point."""

from __future__ import annotations

import pytest

from tests.support.benchscript import bench_module


def run(name: str, policy: str, seed: int, at: float) -> dict:
    curve = {str(x): min(x, at) for x in range(0, 131)}
    return {
        "name": name,
        "policy": policy,
        "seed": seed,
        "at_100": min(100, at),
        "at_130": at,
        "curve": curve,
    }


def test_summary_pairs_by_seed_and_finds_the_worst_curve_point() -> None:
    sweep = bench_module("sweep_issue26.py", "sweep_issue26_bench")
    runs = [
        run("m", "fgd", 2, 96.0),
        run("m", "fgd", 1, 95.0),
        run("m", "ours", 1, 94.0),
        run("m", "ours", 2, 95.8),
    ]
    out = sweep.summary(runs)
    assert out["m/fgd"] == {"at_100": 95.5, "at_130": 95.5}
    ours = out["m/ours"]
    assert round(ours["min_margin_130"], 6) == -1.0 and round(ours["min_margin_100"], 6) == -1.0
    worst, margin = ours["curve_min_margin"]
    assert worst == 96 and round(margin, 6) == -0.6  # mean curve 94.9 against 95.5 from 96% on
    assert ours["curve_points_below"] == 131 - 95  # 95..130: 94.5 against 95 at 95%


def test_each_set_runs_on_its_own_seeds() -> None:
    """tuning from 42, heldout from 1 (as before the mixes carried seeds), later sets from their mixes'
    own first seed; an unknown set is refused by name."""
    sweep = bench_module("sweep_issue26.py", "sweep_issue26_bench")
    sets = sweep.load_mixes(sweep.MIXES)
    work = sweep.mix_work(sets, ["tuning", "heldout", "heldout3"], 2, set())
    seeds = {(name, seed) for name, policy, seed in work if policy == "fgd"}
    assert ("t-cpu3", 42) in seeds and ("t-cpu3", 43) in seeds and ("t-cpu3", 44) not in seeds
    assert ("h-mixed", 1) in seeds and ("h-mixed", 2) in seeds
    assert ("h3-cpu6", 21) in seeds and ("h3-cpu6", 22) in seeds and ("h3-cpu6", 23) not in seeds
    assert {p for _, p, _ in work} == set(sweep.POLICIES)
    assert not any(name.startswith("h2-") for name, _, _ in work)
    only = sweep.mix_work(sets, ["heldout2"], 1, {"h2-cpu4-mg20"})
    assert only == [("h2-cpu4-mg20", p, 11) for p in sweep.POLICIES]
    with pytest.raises(SystemExit, match="nosuch"):
        sweep.mix_work(sets, ["nosuch"], 1, set())
