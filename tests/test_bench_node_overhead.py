"""bench/node_overhead.py runs end to end (tiny sizes) and prints the documented JSON object."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kubegpu.devenv.controlplane import BinariesMissing
from kubegpu.localcluster.cluster import find_cluster_binaries
from tests.fixtures.common import missing_component
from tests.fixtures.localcluster import _require_node_tools

pytestmark = [pytest.mark.apiserver, pytest.mark.containerd, pytest.mark.node]
BENCH = Path(__file__).resolve().parents[1] / "bench" / "node_overhead.py"


def test_node_overhead_prints_the_documented_json() -> None:
    try:
        find_cluster_binaries()
    except BinariesMissing as exc:
        missing_component(str(exc))
    _require_node_tools()
    result = subprocess.run(
        [sys.executable, str(BENCH), "--json", "--pods", "3", "--steady-pods", "4", "--steady-seconds", "3"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = result.stdout.strip().splitlines()
    doc = json.loads(line)
    start, steady = doc["pod_start"], doc["steady_state"]
    assert {"pods", "direct_p50_s", "shim_p50_s", "direct_p99_s", "shim_p99_s", "ratio_p50"} <= set(start)
    assert start["pods"] == 3 and start["direct_p50_s"] > 0 and start["shim_p50_s"] > 0
    assert start["ratio_p50"] == round(start["shim_p50_s"] / start["direct_p50_s"], 3)
    assert {"pods", "seconds", "cri_calls_per_second", "shim_cpu_percent_of_core"} <= set(steady)
    assert steady["pods"] == 4 and steady["shim_cpu_percent_of_core"] >= 0
    assert steady["cri_calls_per_second"]  # kubelet kept calling through the shim
    assert doc["peer"] is None


def test_node_overhead_refuses_a_peer_that_is_not_executable(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(BENCH), "--peer-binary", str(tmp_path / "nope")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "is not an executable file" in result.stderr
