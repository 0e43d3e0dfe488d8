"""``kubegpu devices``: the subcommand on its own parser (``register``) and its output."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from devices.cli import format_table, main, register
from devices.model import NodeInventory
from devices.sim import TOPOLOGY_DIR, SimPlugin
from tests.test_devices_rdma import build_machine


def test_register_adds_devices_subcommand() -> None:
    parser = argparse.ArgumentParser(prog="kubegpu")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["devices", "--plugin", "sim", "--topology", "dgx1-v100", "--node-name", "n1", "--state-dir", "/x"]
    )
    assert args.plugin == ["sim"] and callable(args.run)


def test_sim_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["devices", "--plugin", "sim", "--topology", str(TOPOLOGY_DIR / "dgx1-v100.json"),
            "--node-name", "n1", "--state-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Tesla V100-SXM2-16GB" in out
    assert "GPU0  X     NV1   NV1   NV2   NV2   SYS   SYS   SYS" in out
    assert (tmp_path / "dev/kubegpu-sim/gpu7").exists()


def test_sim_json_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["devices", "--plugin", "sim", "--topology", "hgx-h100", "--node-name", "n1",
            "--state-dir", str(tmp_path), "--json"]
    assert main(argv) == 0
    published = json.loads(capsys.readouterr().out)
    want = SimPlugin("hgx-h100", "n1", tmp_path).discover().public()
    assert published == json.loads(json.dumps(want))
    assert NodeInventory.from_public(published).public() == published


def test_rdma_table_shows_nothing_for_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build_machine(tmp_path)
    assert main(["devices", "--plugin", "rdma", "--sysfs-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["ID", "KIND", "IDX", "MODEL", "MEM_MIB", "NUMA", "PCI", "HEALTHY"]
    assert out[2].split() == ["mlx5_1", "rdma", "1", "MT4123", "-", "0", "0000:04:00.1", "NO"]


def test_plugin_failures_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--plugin", "sim", "--node-name", "n1"]) == 2
    assert "option 'topology'" in capsys.readouterr().err
    assert main(["devices", "--plugin", "sim", "--node-name", "n1", "--topology", "nope"]) == 2
    assert "topology file nope not found" in capsys.readouterr().err


def test_format_table_marks_nic_affinity(tmp_path: Path) -> None:
    text = format_table(SimPlugin("dgx-a100", "n1", tmp_path, create_nodes=False).discover())
    assert "mlx5_3 near GPU3" in text
    assert text.splitlines()[1].endswith("yes")


# What a GPU machine lent for the proof has: the standard library and pynvml, not the packages the
# rest of kubegpu needs. `kubegpu devices` is run there (docs/devices.md, "Proof on a real GPU"); an
# import of cryptography by `kubegpu keys`' registration once made it fail on such a machine.
BLOCK_PACKAGES = """
import importlib.abc, sys
BLOCKED = {"cryptography", "grpc", "google", "yaml", "numpy", "uvloop", "prometheus_client", "pyroute2"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
        return None
sys.meta_path.insert(0, Block())
from kubegpu.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_devices_runs_with_the_standard_library_only(tmp_path: Path) -> None:
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_PACKAGES, "devices", "--plugin", "sim", "--topology", "pcie-4gpu",
         "--state-dir", str(tmp_path / "sim"), "--json"],
        capture_output=True, text=True, cwd=repo, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(json.loads(done.stdout)["devices"]) == 4
