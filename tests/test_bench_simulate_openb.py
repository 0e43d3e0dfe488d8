"""bench/simulate_openb.py refuses bad arguments with one stderr line and exit status 2, before it
looks for the openb trace (so this runs without ../shared)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_bench():
    path = ROOT / "bench" / "simulate_openb.py"
    spec = importlib.util.spec_from_file_location("simulate_openb_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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
