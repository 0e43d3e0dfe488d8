"""bench/sweep_issue26.py's summary: margins to FGD paired by seed and the mean curve's worst point."""

from __future__ import annotations

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
