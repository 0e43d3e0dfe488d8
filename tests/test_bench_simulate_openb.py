"""bench/simulate_openb.py refuses bad arguments with one stderr line and exit status 2, before it
looks for the openb trace (so this runs without ../shared)."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.support.benchscript import bench_module


def load_bench() -> ModuleType:
    return bench_module("simulate_openb.py", "simulate_openb_bench")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "x"], "bad --seeds"),
        (["--seeds", "9-1"], "bad --seeds"),
        (["--policies", "nope"], "nope"),
        (["--traces", "default,nope"], "nope"),
        (["--jobs", "0"], "counts"),
    ],
)
def test_bad_arguments(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench()
    assert bench.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("simulate_openb:") and message in err[0]


def test_the_curve_table_points_are_the_issue_range() -> None:
    bench = load_bench()
    assert bench.CURVE_POINTS[0] == 10 and bench.CURVE_POINTS[-1] == 130
    assert list(bench.CURVE_POINTS) == sorted(set(bench.CURVE_POINTS))


def test_the_mix_bound_table_gives_each_policy_its_gap_at_130(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench()

    class Run:
        def __init__(self, at_130: float) -> None:
            self.alloc_pct_at_130 = at_130

    results = {("m", "fgd"): [Run(95.0), Run(96.0)], ("m", "ours"): [Run(96.0), Run(97.0)]}
    bounds = {"m": [{100: 96.0, 130: 98.0}, {100: 97.0, 130: 99.0}]}
    bench.mix_bounds_table(results, bounds, ["m"], ["fgd", "ours"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "| mix | bound @100 | bound @130 | fgd gap @130 | ours gap @130 |"
    assert lines[2] == "| m | 96.50 | 98.50 | 3.00 | 2.00 |"
