"""bench/cri_cpu_floor.py runs end to end (tiny sizes), prints its JSON object and leaves nothing."""

from __future__ import annotations

import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.common import require_executable

pytestmark = [pytest.mark.containerd]
BENCH = Path(__file__).resolve().parents[1] / "bench" / "cri_cpu_floor.py"


def test_cri_cpu_floor_measures_the_shim_beside_the_minimal_forwarder() -> None:
    for tool in ("containerd", "ctr", "runc"):
        require_executable(tool)
    before = set(glob.glob("/tmp/kgfloor-*"))
    result = subprocess.run(
        [sys.executable, str(BENCH), "--json", "--rounds", "2", "--seconds", "2", "--containers", "2"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = result.stdout.strip().splitlines()
    doc = json.loads(line)
    assert set(doc["paths"]) == {"shim", "minimal forwarder"}
    for row in doc["paths"].values():
        assert len(row["cpu_ms_per_call_rounds"]) == 2 and row["cpu_ms_per_call_p50"] >= 0
        # from the unrounded median: within the rounding of the printed one
        percent = row["cpu_ms_per_call_p50"] * 15 / 10
        assert row["percent_of_core_at_rate"] == pytest.approx(percent, abs=0.002)
    assert doc["paths"]["minimal forwarder"]["ratio_to_minimal_forwarder"] in (1.0, None)
    assert set(glob.glob("/tmp/kgfloor-*")) == before  # its work directory is gone


def test_cri_cpu_floor_refuses_bad_arguments(tmp_path: Path) -> None:
    for argv, message in (
        (["--peer-binary", str(tmp_path / "nope")], "is not an executable file"),
        (["--rounds", "0"], "must be positive"),
    ):
        result = subprocess.run([sys.executable, str(BENCH), *argv],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and message in result.stderr
