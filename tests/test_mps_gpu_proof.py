"""The GPU proof script (``kubegpu.gpu_proof``): its parsing and comparison, and dry runs of the
whole script on a pretend GPU machine (tests/support/fake_gpu.py) with the stand-in MPS control.

The dry runs prove the plumbing (every step bounded, failures isolated, the daemon started through
the supervisor and stopped, files written), not the GPU: that is the script's job on a real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kubegpu.gpu_proof import XID_LINE, compare_inventory, parse_smi_q, parse_topo_m
from tests.fixtures.common import missing_component
from tests.support.fake_gpu import GPUS, write_fake_gpu
from tests.support.mps_standin import events, os_pid_alive, write_standin

REPO = Path(__file__).resolve().parent.parent

SMI_Q = """
==============NVSMI LOG==============

Timestamp                                 : Tue Nov 25 09:14:03 2026
Driver Version                            : 580.159.04
CUDA Version                              : 13.0

Attached GPUs                             : 1
GPU 00000000:4E:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    Product Brand                         : NVIDIA
    Product Architecture                  : Hopper
    Display Mode                          : Disabled
    Persistence Mode                      : Enabled
    MIG Mode
        Current                           : Disabled
        Pending                           : Disabled
    Accounting Mode                       : Disabled
    Minor Number                          : 3
    GPU UUID                              : GPU-5f1e6a0c-7b1d-4a8e-9c0f-2d3e4f5a6b7c
    GPU PDI                               : 0x1234
    PCI
        Bus                               : 0x4E
        Device                            : 0x00
        Domain                            : 0x0000
        Device Id                         : 0x233010DE
        Bus Id                            : 00000000:4E:00.0
        GPU Link Info
            PCIe Generation
                Max                       : 5
                Current                   : 5
            Link Width
                Max                       : 16x
    FB Memory Usage
        Total                             : 81559 MiB
        Reserved                          : 573 MiB
        Used                              : 0 MiB
        Free                              : 80986 MiB
    BAR1 Memory Usage
        Total                             : 131072 MiB
        Used                              : 1 MiB
    Compute Mode                          : Default
    Utilization
        Gpu                               : 0 %
        Memory                            : 0 %
"""

TOPO_ONE = (
    "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n"
)
TOPO_TWO_NIC = (
    "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV18\tPXB\t0-47,96-143\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\t48-95,144-191\t1\t\tN/A\n"
    "NIC0\tPXB\tSYS\t X \t\t\t\t\n\nLegend:\n\n  X    = Self\n\nNIC Legend:\n\n  NIC0: mlx5_0\n"
)


def test_parse_smi_q_keys_values_by_section() -> None:
    doc = parse_smi_q(SMI_Q)
    assert doc["attached"] == 1 and doc["driver"] == "580.159.04" and doc["cuda"] == "13.0"
    (gpu,) = doc["gpus"]
    assert gpu["Bus Id"] == "00000000:4E:00.0"
    assert gpu["GPU UUID"] == "GPU-5f1e6a0c-7b1d-4a8e-9c0f-2d3e4f5a6b7c"
    assert gpu["Minor Number"] == "3"
    assert gpu["PCI/Bus Id"] == "00000000:4E:00.0"
    assert gpu["PCI/GPU Link Info/PCIe Generation/Max"] == "5"
    assert gpu["PCI/GPU Link Info/Link Width/Max"] == "16x"
    assert gpu["FB Memory Usage/Total"] == "81559 MiB"
    assert gpu["BAR1 Memory Usage/Total"] == "131072 MiB"
    assert gpu["Compute Mode"] == "Default"
    assert gpu["MIG Mode/Current"] == "Disabled"


def test_parse_topo_m_rows() -> None:
    assert parse_topo_m(TOPO_ONE) == {
        "GPU0": {"GPU0": "X", "CPU Affinity": "0-15", "NUMA Affinity": "0", "GPU NUMA ID": "N/A"}
    }
    two = parse_topo_m(TOPO_TWO_NIC)
    assert set(two) == {"GPU0", "GPU1"}
    assert two["GPU0"]["GPU1"] == "NV18" and two["GPU1"]["NIC0"] == "SYS"
    assert two["GPU1"]["CPU Affinity"] == "48-95,144-191" and two["GPU1"]["NUMA Affinity"] == "1"


def test_parse_topo_m_strips_terminal_escapes() -> None:
    """nvidia-smi 580 on a real H200 underlined the header with ANSI escapes (the first proof run
    parsed no rows because of them)."""
    real = (
        "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "GPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n"
    )
    assert parse_topo_m(real) == parse_topo_m(TOPO_ONE)


def inventory_doc(**changes: Any) -> dict[str, Any]:
    device = {
        "id": "GPU-5f1e6a0c-7b1d-4a8e-9c0f-2d3e4f5a6b7c", "kind": "gpu", "index": 0,
        "model": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "numa": 0, "pci": "0000:4e:00.0",
        "healthy": True, "attributes": {"minor": "3", "cpuAffinity": "0-15"},
    }  # fmt: skip
    device.update(changes)
    return {"devices": [device], "topology": {"nvlink": [], "pcie": [], "nicGpus": {}}}


def test_compare_agrees_field_by_field() -> None:
    agreed, wrong = compare_inventory(inventory_doc(), parse_smi_q(SMI_Q), parse_topo_m(TOPO_ONE))
    assert wrong == []
    assert len(agreed) == 8  # count, UUID, name, memory, bus id, minor, CPU and NUMA affinity


def test_compare_names_every_difference() -> None:
    changed = inventory_doc(memoryMiB=80000, pci="0000:4f:00.0", numa=-1, attributes={"minor": "0"})
    _, wrong = compare_inventory(changed, parse_smi_q(SMI_Q), parse_topo_m(TOPO_ONE))
    assert [w.split(":")[0] for w in wrong] == [
        "GPU0 memory MiB", "GPU0 PCI bus id", "GPU0 minor", "GPU0 CPU affinity", "GPU0 NUMA affinity",
    ]  # fmt: skip
    _, missing = compare_inventory(inventory_doc(id="GPU-other"), parse_smi_q(SMI_Q), parse_topo_m(TOPO_ONE))
    assert missing == ["GPU0: UUID GPU-other is not in nvidia-smi -q"]


# --- dry runs ------------------------------------------------------------------------------------


def dry_run(
    tmp_path: Path, *args: str, control: bool = True
) -> tuple[subprocess.CompletedProcess[str], Path]:
    fakes = tmp_path / "fakes"
    bin_dir = write_fake_gpu(fakes)
    standin = write_standin(tmp_path / "mpsbin")
    state = tmp_path / "gpu-state"
    state.mkdir()
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": f"{fakes}{os.pathsep}{REPO}",
        "FAKE_GPU_STATE": str(state),
    }
    env.pop("OUT", None)
    command = [
        sys.executable, "-m", "kubegpu.gpu_proof", "--out", str(out), "--state-dir", str(tmp_path / "proof"),
        "--mps-control", str(standin) if control else str(tmp_path / "absent"),
        "--matmul-seconds", "2", *args,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    return done, out


def statuses(out: Path) -> dict[str, str]:
    doc = json.loads((out / "gpu_proof.json").read_text())
    return {step["name"]: step["status"] for step in doc["steps"]}


def test_dry_run_every_step(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        missing_component("the proof's container-like MPS clients need root (mount namespaces)")
    done, out = dry_run(tmp_path, "--budget", "200")
    assert statuses(out) == {
        "environment": "PASS",
        "inventory": "FAIL",
        "live-metrics": "PASS",
        "mps": "PASS",
    }, done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 1
    doc = {s["name"]: s for s in json.loads((out / "gpu_proof.json").read_text())["steps"]}
    # The inventory agrees with nvidia-smi; it fails only because this machine has no /dev/nvidia*.
    inventory = doc["inventory"]["details"]
    assert inventory["mismatches"] == [] and len(inventory["agreed"]) == 16  # count, 7 per GPU, the link
    assert all("device node" in p or "nvidiactl" in p for p in inventory["nvidia_check"]["problems"])
    metrics = doc["live-metrics"]["details"]
    assert metrics["peak_gpu_percent"] == 97 and metrics["peak_memory_used_mib"] == 2049
    (attempt,) = doc["mps"]["details"]["attempts"]
    assert attempt["contained"] is True
    runs = attempt["runs"]
    assert [runs[n]["outcome"] for n in ("limited-8GiB", "limited-2GiB", "unlimited-8GiB")] == [
        "oom",
        "ok",
        "ok",
    ]
    assert runs["limited-8GiB"]["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    pipe = tmp_path / "proof" / "mps" / str(GPUS[0]["uuid"]) / "pipe"
    assert runs["limited-8GiB"]["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    standin = tmp_path / "mpsbin" / "nvidia-cuda-mps-control"
    (started,) = events(standin, "started")
    assert started["visible"] == GPUS[0]["uuid"]
    assert [c["command"] for c in events(standin, "command")] == [
        "get_server_list",
        "get_server_list",
        "quit",
    ]
    assert not os_pid_alive(int(started["pid"]))  # type: ignore[call-overload]
    assert attempt["stopped"] == {
        "pid_before": started["pid"],
        "daemon_gone": True,
        "mps_processes_left": [],
        "dirs_removed": True,
    }
    text = (out / "gpu_proof.txt").read_text()
    assert "GPU proof summary" in text and "mps           PASS" in text


def test_dry_run_failures_stay_in_their_step(tmp_path: Path) -> None:
    done, out = dry_run(
        tmp_path, "--nvidia-smi", str(tmp_path / "no-nvidia-smi"), "--steps", "environment,inventory,mps",
        control=False,
    )  # fmt: skip
    assert statuses(out) == {"environment": "FAIL", "inventory": "FAIL", "mps": "SKIP"}, done.stdout[-3000:]
    assert "nvidia-cuda-mps-control is not on this machine" in done.stdout


def test_dry_run_out_of_time_skips_the_rest(tmp_path: Path) -> None:
    done, out = dry_run(tmp_path, "--budget", "3", "--reserve", "1")
    assert set(statuses(out).values()) <= {"PASS", "FAIL", "SKIP"}
    assert statuses(out)["mps"] == "SKIP" and "out of time" in done.stdout


def test_xid_step_fails_in_its_step_without_the_event_api_or_libcuda(tmp_path: Path) -> None:
    # The fake NVML has no event API and this machine no libcuda: the step fails, naming both, and
    # the step before it is not affected.
    done, out = dry_run(tmp_path, "--steps", "environment,xid")
    assert statuses(out) == {"environment": "PASS", "xid": "FAIL"}, done.stdout[-3000:]
    doc = {s["name"]: s for s in json.loads((out / "gpu_proof.json").read_text())["steps"]}
    details = doc["xid"]["details"]
    assert "no event API" in details["disabled"]
    assert set(details["before"].values()) == {None} and details["after"] == details["before"]
    assert "cuCtxSynchronize" not in details["worker"]


def test_kernel_log_xid_lines_parse() -> None:
    line = (
        "[ 1234.5678] NVRM: Xid (PCI:0000:00:06): 31, pid=4242, name=python3, Ch 00000008, "
        "intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x0_00000000."
    )
    assert [(m.group(1), int(m.group(2))) for m in XID_LINE.finditer(line)] == [("0000:00:06", 31)]


def test_unknown_step_is_a_usage_error(tmp_path: Path) -> None:
    done, _ = dry_run(tmp_path, "--steps", "inventory,bogus")
    assert done.returncode == 2 and "unknown step 'bogus'" in done.stderr


@pytest.mark.parametrize("outcome", ["oom"])
def test_worker_reports_oom_as_oom(outcome: str, tmp_path: Path) -> None:
    fakes = tmp_path / "fakes"
    write_fake_gpu(fakes)
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "nvidia-cuda-mps-control.pid").write_text("1\n")
    env = {**os.environ, "PYTHONPATH": f"{fakes}{os.pathsep}{REPO}", "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
           "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1024M"}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "kubegpu.gpu_proof", "worker", "alloc", "--gib", "2"],
                          capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result["outcome"] == outcome and "out of memory" in result["error"]
    assert result["memInfoTotalMiB"] == 1024
