"""bench/node_placement.py: the JSON it prints is exactly the specified shape, every policy gives valid
sets on every shipped machine, and bad arguments are refused with exit status 2."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.benchscript import bench_module

ROOT = Path(__file__).resolve().parent.parent


def load_bench() -> ModuleType:
    return bench_module("node_placement.py", "node_placement_bench")


def test_json_shape_and_every_machine(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench()
    assert bench.main(["--json", "--seeds", "1", "--arrivals", "150", "--horizon", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"results"}
    keys = {
        "topology",
        "policy",
        "mean_link_score",
        "all_nvlink_share",
        "cross_socket_share",
        "refused_with_free",
        "mean_choice_ms",
    }
    shipped = sorted(p.stem for p in (ROOT / "devices" / "topologies").glob("*.json"))
    seen = {(r["topology"], r["policy"]) for r in doc["results"]}
    assert seen == {(t, p) for t in shipped for p in ("greedy", "gpuallocator", "kubegpu", "optimum")}
    for r in doc["results"]:
        assert set(r) == keys
        assert 0 <= r["all_nvlink_share"] <= 1 and 0 <= r["cross_socket_share"] <= 1
        assert isinstance(r["refused_with_free"], int) and r["refused_with_free"] >= 0
        assert r["mean_link_score"] > 0 and r["mean_choice_ms"] >= 0


def test_streams_are_seeded_and_respect_the_machine() -> None:
    bench = load_bench()
    links = bench.make_links(ROOT / "devices" / "topologies" / "pcie-4gpu.json")
    a, b = bench.stream(links, 3, 300), bench.stream(links, 3, 300)
    assert a == b and a != bench.stream(links, 4, 300)
    assert {p.size for p in a} <= {1, 2, 4}  # no 8-GPU pods for a 4-GPU machine
    assert not any(p.wish.any() for p in a)  # no NVLink at all: nobody asks for it


def test_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench()
    assert bench.main(["--policies", "nope"]) == 2
    assert bench.main(["--topologies", "nope"]) == 2
    assert bench.main(["--arrivals", "0"]) == 2
    assert "node_placement:" in capsys.readouterr().err


def test_cold_mode_times_every_policy_but_the_oracle(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench()
    assert bench.main(["--cold", "--json", "--topologies", "dgx1-v100,pcie-4gpu"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"cold"}
    seen = {(r["topology"], r["policy"]) for r in doc["cold"]}
    assert seen == {(t, p) for t in ("dgx1-v100", "pcie-4gpu") for p in ("greedy", "gpuallocator", "kubegpu")}
    for r in doc["cold"]:
        timings = {"first_ms", "first_max_ms", "new_state_ms", "new_state_max_ms"}
        assert set(r) == {"topology", "policy"} | timings
        assert 0 <= r["first_ms"] <= r["first_max_ms"] and 0 <= r["new_state_ms"] <= r["new_state_max_ms"]
