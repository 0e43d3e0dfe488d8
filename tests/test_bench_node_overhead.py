"""bench/node_overhead.py runs end to end (tiny sizes) and prints the documented JSON object; its
``"nri"`` object is built from the NRI path's figures as documented."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kubegpu.devenv.containerd import containerd2_bin_dir
from kubegpu.devenv.controlplane import BinariesMissing
from kubegpu.localcluster.cluster import find_cluster_binaries
from tests.fixtures.common import missing_component
from tests.fixtures.localcluster import _require_node_tools
from tests.support.benchscript import bench_module

pytestmark = [pytest.mark.apiserver, pytest.mark.containerd, pytest.mark.node]
BENCH = Path(__file__).resolve().parents[1] / "bench" / "node_overhead.py"
NRI_KEYS = {"pods", "p50_s", "p99_s", "pod_start_ratio_p50", "pod_start_ratio_p99", "paired_difference_p50_s",
            "steady_pods", "agent_cpu_percent_of_core", "kubelet_cpu_percent_of_core"}


def load_bench() -> ModuleType:
    return bench_module(BENCH.name, "node_overhead_bench")


def run_bench(*args: str) -> dict:
    result = subprocess.run([sys.executable, str(BENCH), "--json", *args],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = result.stdout.strip().splitlines()
    return json.loads(line)


def test_node_overhead_prints_the_documented_json() -> None:
    try:
        find_cluster_binaries()
    except BinariesMissing as exc:
        missing_component(str(exc))
    _require_node_tools()
    doc = run_bench("--pods", "3", "--steady-pods", "4", "--steady-seconds", "3")
    start, steady = doc["pod_start"], doc["steady_state"]
    assert {"pods", "direct_p50_s", "shim_p50_s", "direct_p99_s", "shim_p99_s", "ratio_p50"} <= set(start)
    assert start["pods"] == 3 and start["direct_p50_s"] > 0 and start["shim_p50_s"] > 0
    assert start["ratio_p50"] == round(start["shim_p50_s"] / start["direct_p50_s"], 3)
    assert {"pods", "seconds", "cri_calls_per_second", "shim_cpu_percent_of_core"} <= set(steady)
    assert steady["pods"] == 4 and steady["shim_cpu_percent_of_core"] >= 0
    assert steady["cri_calls_per_second"]  # kubelet kept calling through the shim
    assert doc["peer"] is None and doc["nri"] is None


def test_node_overhead_measures_the_nri_front_beside_the_others() -> None:
    try:
        find_cluster_binaries()
    except BinariesMissing as exc:
        missing_component(str(exc))
    if containerd2_bin_dir() is None:
        missing_component("containerd 2.x is not built: run `bash tests/containerd/build.sh`")
    _require_node_tools()
    doc = run_bench("--containerd", "2", "--nri", "--pods", "2", "--steady-pods", "3",
                    "--steady-seconds", "2")
    nri = doc["nri"]
    assert set(nri) == NRI_KEYS
    assert nri["pods"] == doc["pod_start"]["pods"] == 2 and nri["steady_pods"] == 3
    assert nri["p50_s"] > 0 and nri["agent_cpu_percent_of_core"] >= 0
    assert nri["pod_start_ratio_p50"] == round(nri["p50_s"] / doc["pod_start"]["direct_p50_s"], 3)
    assert doc["containerd"].startswith("containerd-v2")


def test_nri_object_is_the_ratio_to_direct_and_the_agents_cpu() -> None:
    bench = load_bench()
    nri = [0.30, 0.10, 0.20, 0.50]
    direct = [0.20, 0.10, 0.25, 0.45]
    steady = {"seconds": 120.0, "kubelet_cpu_percent_of_core": 9.5, "proxy_cpu_percent_of_core": 0.12}
    doc = bench.nri_result(nri, direct, steady, 110)
    assert set(doc) == NRI_KEYS
    assert doc["pods"] == 4 and doc["steady_pods"] == 110
    assert doc["p50_s"] == 0.25 and doc["p99_s"] == 0.5  # medians 0.25 and 0.225; p99 0.5 and 0.45
    assert doc["pod_start_ratio_p50"] == round(0.25 / 0.225, 3) == 1.111
    assert doc["pod_start_ratio_p99"] == round(0.5 / 0.45, 3)
    assert doc["paired_difference_p50_s"] == 0.025  # median of +0.10, 0, -0.05, +0.05
    assert doc["agent_cpu_percent_of_core"] == 0.12 and doc["kubelet_cpu_percent_of_core"] == 9.5
    assert json.loads(json.dumps(doc)) == doc
    row = {"pod_start": {"direct_p50_s": 0.225, "direct_p99_s": 0.45, "shim_p50_s": 0.3, "shim_p99_s": 0.5,
                         "ratio_p50": 1.333, "paired_difference_p50_s": 0.05},
           "steady_state": {"pods": 110, "shim_cpu_percent_of_core": 1.1, "cri_calls_per_second": {},
                            "cri_calls_per_second_total": 0.0},
           "peer": None, "nri": doc}
    (line,) = [line for line in bench.table(row).splitlines() if line.startswith("kubegpu NRI agent")]
    assert line.split()[3:] == ["0.250", "0.500", "1.111", "+0.025", "0.12"]


def test_node_overhead_refuses_nri_without_containerd_2() -> None:
    result = subprocess.run([sys.executable, str(BENCH), "--nri"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--nri needs --containerd 2" in result.stderr


def test_node_overhead_refuses_a_peer_that_is_not_executable(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(BENCH), "--peer-binary", str(tmp_path / "nope")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "is not an executable file" in result.stderr
