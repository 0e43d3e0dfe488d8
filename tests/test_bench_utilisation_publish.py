"""bench/utilisation_publish.py runs end to end (tiny sizes) against a real apiserver and prints the
documented JSON object (docs/utilisation.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kubegpu.devenv.controlplane import BinariesMissing, find_binaries
from tests.fixtures.common import missing_component

pytestmark = pytest.mark.apiserver
BENCH = Path(__file__).resolve().parents[1] / "bench" / "utilisation_publish.py"


def test_utilisation_publish_prints_the_documented_json() -> None:
    try:
        find_binaries()
    except BinariesMissing as exc:
        missing_component(str(exc))
    args = [
        "--json",
        "--nodes",
        "6",
        "--minutes",
        "3",
        "--sched-nodes",
        "8",
        "--pods",
        "30",
        "--repeats",
        "1",
    ]
    result = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = result.stdout.strip().splitlines()
    doc = json.loads(line)
    assert {
        "pods_per_second_with",
        "pods_per_second_without",
        "ratio",
        "writes_per_second_1000_nodes",
    } <= set(doc)
    publish = doc["publish"]
    assert publish["nodes"] == 6 and publish["objects"] == 6 and publish["errors"] == 0
    # 3 measured minutes of 6 nodes: at least the refresh bound's writes, at most one per interval each
    measured = sum(publish["writes_by_reason"].values())
    assert 6 * 180 / 300 - 6 <= measured <= 6 * 180 / 30
    assert publish["writes_per_second"] == round(measured / 180, 2)
    assert doc["writes_per_second_1000_nodes"] == publish["writes_per_second_per_1000_nodes"]
    assert publish["writes_total_with_warmup"] >= 6 + measured  # the creates of the warm-up too
    sched = doc["scheduler"]
    assert sched["pods"] == 30 and sched["with"]["placed"] > 0 and sched["without"]["placed"] > 0
    assert doc["ratio"] == round(doc["pods_per_second_with"] / doc["pods_per_second_without"], 3)
