"""bench/variant_runs.py: the cache, the names a set stands for, and a row's margins to the reference."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.benchscript import bench_module
from tests.test_bench_sweep_issue26 import run


def test_a_row_pairs_runs_by_seed_and_finds_the_curves_worst_point() -> None:
    runner = bench_module("variant_runs.py", "variant_runs_bench")
    ref = [run("m", "fgd", 1, 95.0), run("m", "fgd", 2, 96.0)]
    ours = [run("m", "x", 1, 94.0), run("m", "x", 2, 95.8)]
    out = runner.row(ours, ref)
    assert (out["at_100"], out["at_130"]) == (94.9, 94.9)
    assert round(out["margin_130"], 6) == -0.6 and round(out["min_margin_130"], 6) == -1.0
    assert out["seeds_at_or_below"] == (2, 2)
    worst, margin = out["curve_worst"]
    assert worst == 96 and round(margin, 6) == -0.6  # both curves flat from 96% on, 94.9 against 95.5
    assert out["curve_points_below"] == 131 - 95  # 95..130 (at 95 seed 1's 94 against 95)


def test_names_expand_sets_and_shared_and_the_cache_reads_back(tmp_path: Path) -> None:
    runner = bench_module("variant_runs.py", "variant_runs_bench")
    names = runner.names_of("shared,t-cpu3,heldout5")
    assert names[:4] == list(runner.openb.TRACES) and names[4] == "t-cpu3"
    assert names[5:] == [m.name for m in runner.load_mixes(runner.openb.MIXES)["heldout5"]]
    cache = tmp_path / "c.jsonl"
    assert runner.load_cache(cache) == {}
    cache.write_text(json.dumps(run("m", "x", 3, 90.0)) + "\n\n")
    assert set(runner.load_cache(cache)) == {("m", "x", 3)}


def test_random_ties_label_the_runs_apart() -> None:
    """``--ties random`` runs keep their own cache keys (``LABEL@random``), the reference's too; under
    the node order the labels are the policies' (or ``NAME=LABEL``'s)."""
    runner = bench_module("variant_runs.py", "variant_runs_bench")
    assert runner.labelled("fgd,topology=topo", "node-order") == [("fgd", "fgd"), ("topology", "topo")]
    assert runner.labelled("fgd,topology=topo", "random") == [
        ("fgd", "fgd@random"),
        ("topology", "topo@random"),
    ]
