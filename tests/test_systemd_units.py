"""The systemd units pass ``systemd-analyze verify`` in a throwaway root, warnings counted too.

``verify`` exits 0 on many problems (an unknown key, a bad value) and only prints them, so the
test fails on any output. The root holds the host's own units (containerd.service, targets), the
shipped unit and drop-in, and stand-in executables for the ExecStart paths.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.common import require_executable

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "systemd" / "kubegpu-crishim.service"
DROP_IN = REPO / "systemd" / "kubelet.service.d" / "20-kubegpu-crishim.conf"
HOST_UNITS = Path("/lib/systemd/system")


def make_root(tmp_path: Path, unit_text: str) -> Path:
    root = tmp_path / "root"
    if not (HOST_UNITS / "containerd.service").exists():
        pytest.fail("containerd.service not installed on this host (apt-get install containerd)")
    shutil.copytree(HOST_UNITS, root / "lib/systemd/system", symlinks=True)
    system = root / "etc/systemd/system"
    (system / "kubelet.service.d").mkdir(parents=True)
    (system / UNIT.name).write_text(unit_text)
    shutil.copy(DROP_IN, system / "kubelet.service.d" / DROP_IN.name)
    (system / "kubelet.service").write_text(
        "[Unit]\nDescription=kubelet\n[Service]\nExecStart=/usr/bin/kubelet\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )
    for binary in ("usr/local/bin/kubegpu", "usr/bin/kubelet"):
        path = root / binary
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return root


def verify(root: Path) -> subprocess.CompletedProcess[str]:
    analyze = require_executable("systemd-analyze")
    return subprocess.run(
        [
            analyze,
            "verify",
            "--man=no",
            f"--root={root}",
            f"/etc/systemd/system/{UNIT.name}",
            "/etc/systemd/system/kubelet.service",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_units_verify_cleanly(tmp_path: Path) -> None:
    result = verify(make_root(tmp_path, UNIT.read_text()))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr


def test_verify_would_catch_a_broken_unit(tmp_path: Path) -> None:
    """Guard against a test that cannot fail: a bad Type= is reported."""
    broken = UNIT.read_text().replace("Type=notify", "Type=notifyy")
    result = verify(make_root(tmp_path, broken))
    assert "Failed to parse service type" in result.stderr


def test_unit_contract() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string(UNIT.read_text())
    assert unit["Service"]["Type"] == "notify"
    assert unit["Service"]["Restart"] == "always"
    assert "containerd.service" in unit["Unit"]["After"]
    assert "containerd.service" in unit["Unit"]["Requires"]
    exec_start = unit["Service"]["ExecStart"]
    assert "--listen unix:///run/kubegpu/crishim.sock" in exec_start
    assert "--runtime-endpoint unix:///run/containerd/containerd.sock" in exec_start


def test_kubelet_drop_in_points_at_the_shim() -> None:
    text = DROP_IN.read_text()
    assert "--container-runtime-endpoint=unix:///run/kubegpu/crishim.sock" in text
    assert "--image-service-endpoint=unix:///run/kubegpu/crishim.sock" in text
    assert "$KUBEGPU_KUBELET_ARGS" in text
    assert "Requires=kubegpu-crishim.service" in text
