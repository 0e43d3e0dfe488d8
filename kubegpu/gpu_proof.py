"""``python -m kubegpu.gpu_proof``: prove the NVIDIA plugin and MPS share enforcement on a real GPU.

One run, every step bounded in time and independent of the others' failures:

1. ``inventory``: ``python -m devices.nvidia_check`` and ``python -m kubegpu devices --plugin
   nvidia --json`` (and the table), compared field by field with ``nvidia-smi -q`` (UUID, name,
   memory, PCI bus id, minor number) and ``nvidia-smi topo -m`` (GPU-to-GPU links, CPU and NUMA
   affinity);
2. ``live-metrics``: the plugin's ``sample()`` (utilisation, memory in use) every half second
   while a PyTorch bf16 matrix product runs in another process;
3. ``mps``: where ``nvidia-cuda-mps-control`` exists, ``crishim.mps.MpsSupervisor`` starts the
   GPU's daemon exactly as the node agent does (private ``/dev/shm``); PyTorch processes run as
   MPS clients with the edits the shim gives a container (``crishim.mps.client_edits``), their
   mounts applied in a private mount namespace as the container runtime would: with a 4 GiB
   pinned limit 8 GiB must fail and 2 GiB succeed, without a limit 8 GiB must succeed; then the
   supervisor stops the daemon and nothing of it may remain. The GPU's compute mode is left as it
   is (the lending rules forbid changing it), so EXCLUSIVE_PROCESS is not exercised here;
4. ``xid`` (only when named in ``--steps``: it makes the GPU fault): the plugin's telemetry reads
   no XID, a child process launches a kernel that writes to an address no allocation covers (an
   MMU fault, an application XID), the telemetry must then read that XID through NVML's event
   API, the same code the kernel log shows, and the GPU must still allocate 1 GiB.

It prints each step as it goes and a summary at the end, and with ``--out DIR`` (default: $OUT
when set) writes ``gpu_proof.txt`` (everything printed) and ``gpu_proof.json`` (the details).
Exit status: 0 when no step failed, 1 otherwise. It imports only the standard library and the
project's gRPC-free modules; the PyTorch work runs in child processes
(``python -m kubegpu.gpu_proof worker ...``), so this process never opens a CUDA context.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devices.affinity import normalize_pci_address

PASS, FAIL, SKIP, ERROR = "PASS", "FAIL", "SKIP", "ERROR"
GIB = 1024**3
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
MPS_SEARCH = ("/usr/local/nvidia/bin", "/usr/bin", "/usr/local/cuda/bin", "/usr/sbin")


# --- pure: nvidia-smi parsing and the comparison ---------------------------------------------


def parse_smi_q(text: str) -> dict[str, Any]:
    """``nvidia-smi -q`` as ``{"attached": N, "driver": "...", "gpus": [{path: value}]}``.

    Each GPU block starts at a line ``GPU <bus id>``; inside it, ``Key : value`` lines are keyed by
    their section path (``FB Memory Usage/Total``), sections being the lines without a value.
    """
    result: dict[str, Any] = {"attached": None, "driver": "", "cuda": "", "gpus": []}
    gpu: dict[str, str] | None = None
    stack: list[tuple[int, str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("="):
            continue
        match = re.fullmatch(r"GPU\s+([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+)", raw.rstrip())
        if match:
            gpu = {"Bus Id": match.group(1)}
            result["gpus"].append(gpu)
            stack = []
            continue
        indent = len(raw) - len(raw.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if not sep:  # a section: the lines below it, indented, belong to it
            stack.append((indent, key))
            continue
        if gpu is None:
            if key == "Attached GPUs":
                result["attached"] = int(value) if value.isdigit() else value
            elif key in ("Driver Version", "CUDA Version"):
                result[key.split()[0].lower()] = value
            continue
        gpu.setdefault("/".join([name for _, name in stack] + [key]), value)
        if not value:
            stack.append((indent, key))
    return result


def parse_topo_m(text: str) -> dict[str, dict[str, str]]:
    """``nvidia-smi topo -m`` as ``{"GPU0": {"GPU1": "NV18", "CPU Affinity": "0-15", ...}}``
    (GPU rows only; cells split on tabs, padding dropped)."""
    text = ANSI_ESCAPE.sub("", text)  # nvidia-smi underlines the header row on a terminal or not
    lines = [line for line in text.splitlines() if line.strip()]
    header: list[str] = []
    rows: dict[str, dict[str, str]] = {}
    for line in lines:
        if line.strip().startswith("Legend"):
            break
        cells = [c.strip() for c in re.split(r"\t+", line) if c.strip()]
        if not header:
            if cells and cells[0].startswith("GPU"):
                header = cells
            continue
        if cells and re.fullmatch(r"GPU\d+", cells[0]):
            rows[cells[0]] = dict(zip(header, cells[1:], strict=False))
    return rows


def _numa_text(numa: int) -> str:
    return "N/A" if numa < 0 else str(numa)


def compare_inventory(
    inventory: Mapping[str, Any], smi: Mapping[str, Any], topo: Mapping[str, Mapping[str, str]]
) -> tuple[list[str], list[str]]:
    """(checks that agreed, mismatches) between the plugin's published inventory and nvidia-smi."""
    agreed: list[str] = []
    wrong: list[str] = []

    def check(what: str, ours: Any, theirs: Any) -> None:
        (agreed if ours == theirs else wrong).append(f"{what}: plugin {ours!r}, nvidia-smi {theirs!r}")

    gpus = sorted(
        (d for d in inventory.get("devices", []) if d.get("kind") == "gpu"), key=lambda d: d["index"]
    )
    by_uuid = {g.get("GPU UUID", ""): g for g in smi.get("gpus", [])}
    check("GPU count", len(gpus), smi.get("attached"))
    for device in gpus:
        name = f"GPU{device['index']}"
        theirs = by_uuid.get(device["id"])
        if theirs is None:
            wrong.append(f"{name}: UUID {device['id']} is not in nvidia-smi -q")
            continue
        agreed.append(f"{name}: UUID {device['id']}")
        check(f"{name} name", device.get("model"), theirs.get("Product Name"))
        total = re.match(r"(\d+)", theirs.get("FB Memory Usage/Total", ""))
        check(f"{name} memory MiB", device.get("memoryMiB"), int(total.group(1)) if total else None)
        bus = theirs.get("PCI/Bus Id") or theirs.get("Bus Id", "")
        check(f"{name} PCI bus id", device.get("pci"), normalize_pci_address(bus) if bus else "")
        minor = theirs.get("Minor Number", "")
        check(
            f"{name} minor", (device.get("attributes") or {}).get("minor"), minor if minor.isdigit() else None
        )
        row = topo.get(name)
        if row is None:
            wrong.append(f"{name}: no row in nvidia-smi topo -m")
            continue
        affinity = (device.get("attributes") or {}).get("cpuAffinity", "")
        check(f"{name} CPU affinity", affinity or "N/A", row.get("CPU Affinity", "N/A"))
        check(
            f"{name} NUMA affinity", _numa_text(int(device.get("numa", -1))), row.get("NUMA Affinity", "N/A")
        )
    links = {(a, b): f"NV{n}" for a, b, n in inventory.get("topology", {}).get("nvlink", [])}
    pcie = {(a, b): rel for a, b, rel in inventory.get("topology", {}).get("pcie", [])}
    for a in gpus:
        for b in gpus:
            if a["index"] >= b["index"]:
                continue
            key = (min(a["id"], b["id"]), max(a["id"], b["id"]))
            ours = links.get(key) or pcie.get(key, "?")
            theirs = topo.get(f"GPU{a['index']}", {}).get(f"GPU{b['index']}")
            check(f"GPU{a['index']}-GPU{b['index']} link", ours, theirs)
    return agreed, wrong


# --- PyTorch workers (child processes) ---------------------------------------------------------


def _result(doc: Mapping[str, Any]) -> None:
    print("RESULT " + json.dumps(doc), flush=True)


def worker_matmul(seconds: float, size: int) -> None:
    """bf16 matrix products for ``seconds``; prints the achieved TFLOP/s."""
    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    print("running", flush=True)
    start, count = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        count += 10
    elapsed = time.monotonic() - start
    _result(
        {
            "products": count,
            "seconds": round(elapsed, 2),
            "tflops": round(2 * size**3 * count / elapsed / 1e12, 1),
            "device": torch.cuda.get_device_name(0),
        }
    )


def worker_alloc(gib: float, hold: float) -> None:
    """Allocate and touch ``gib`` GiB on the GPU; prints ok or oom and what the process sees."""
    import torch

    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    doc: dict[str, Any] = {
        "gib": gib,
        "device": props.name,
        "multiprocessors": props.multi_processor_count,
        "memInfoFreeMiB": free // 2**20,
        "memInfoTotalMiB": total // 2**20,
        "env": {k: v for k, v in os.environ.items() if k.startswith("CUDA_MPS_")},
    }
    try:
        block = torch.empty(int(gib * GIB), dtype=torch.uint8, device="cuda")
        block.fill_(1)
        torch.cuda.synchronize()
        doc["outcome"] = "ok"
        if hold:
            print("holding", flush=True)
            time.sleep(hold)
        del block
    except Exception as exc:  # noqa: BLE001 - the outcome is the point
        message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        doc["outcome"] = "oom" if "out of memory" in message.lower() else "error"
        doc["error"] = f"{type(exc).__name__}: {message}"
    _result(doc)


# A kernel that writes to device address 16, which no allocation covers: the GPU raises an MMU
# fault, the driver reports an XID (an application XID: only the faulting context dies) and the
# launch's synchronize returns CUDA_ERROR_ILLEGAL_ADDRESS. PTX, JIT-compiled by the driver, so
# nothing but libcuda is needed.
FAULT_PTX = b"""
.version 7.0
.target sm_80
.address_size 64
.visible .entry kubegpu_fault()
{
  .reg .b64 %rd<2>;
  .reg .b32 %r<2>;
  mov.u64 %rd1, 16;
  mov.u32 %r1, 1;
  st.global.u32 [%rd1], %r1;
  ret;
}
"""
CUDA_ERROR_ILLEGAL_ADDRESS = 700


def worker_fault() -> None:
    """Launch FAULT_PTX on GPU 0 through the CUDA driver API; prints each call's result code."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    doc: dict[str, Any] = {}
    device, context = ctypes.c_int(), ctypes.c_void_p()
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    doc["cuInit"] = cuda.cuInit(0)
    doc["cuDeviceGet"] = cuda.cuDeviceGet(ctypes.byref(device), 0)
    doc["cuDevicePrimaryCtxRetain"] = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
    doc["cuCtxSetCurrent"] = cuda.cuCtxSetCurrent(context)
    doc["cuModuleLoadData"] = cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(FAULT_PTX))
    doc["cuModuleGetFunction"] = cuda.cuModuleGetFunction(ctypes.byref(function), module, b"kubegpu_fault")
    if any(doc.values()):
        _result(doc)
        return
    launch = cuda.cuLaunchKernel
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    doc["cuLaunchKernel"] = launch(function, 1, 1, 1, 1, 1, 1, 0, None, None, None)
    doc["cuCtxSynchronize"] = cuda.cuCtxSynchronize()
    _result(doc)


# --- running things ------------------------------------------------------------------------------


@dataclass
class Ran:
    argv: list[str]
    rc: int | None  # None: timed out or could not start
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    note: str = ""

    def result(self) -> dict[str, Any] | None:
        for line in reversed(self.stdout.splitlines()):
            if line.startswith("RESULT "):
                try:
                    return json.loads(line[len("RESULT ") :])
                except ValueError:
                    return None
        return None

    def brief(self) -> str:
        status = "timed out" if self.rc is None else f"rc={self.rc}"
        note = f" ({self.note})" if self.note else ""
        return f"{' '.join(self.argv)[:160]} -> {status} in {self.seconds:.1f}s{note}"


def run(
    argv: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    on_line: Callable[[str, subprocess.Popen[str]], None] | None = None,
) -> Ran:
    """Run a command with a hard timeout (its whole process group is killed); never raises."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    except OSError as exc:
        return Ran(list(argv), None, "", str(exc), 0.0, "could not start")
    out: list[str] = []
    err: list[str] = []

    def pump_out() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if on_line is not None:
                try:
                    on_line(line.rstrip("\n"), proc)
                except Exception as exc:  # noqa: BLE001 - a callback must not hang the pump
                    err.append(f"[on_line failed: {exc}]\n")

    def pump_err() -> None:
        assert proc.stderr is not None
        err.extend(proc.stderr)

    threads = [threading.Thread(target=pump_out, daemon=True), threading.Thread(target=pump_err, daemon=True)]
    for thread in threads:
        thread.start()
    if input is not None and proc.stdin is not None:
        try:
            proc.stdin.write(input)
            proc.stdin.close()
        except OSError:
            pass
    try:
        rc: int | None = proc.wait(timeout=max(0.1, timeout))
        note = ""
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        rc, note = None, f"killed after {timeout:.0f}s"
    for thread in threads:
        thread.join(timeout=5)
    return Ran(list(argv), rc, "".join(out), "".join(err), time.monotonic() - start, note)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    for sig in (15, 9):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            return
        try:
            proc.wait(timeout=3)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass
class Step:
    name: str
    status: str = SKIP
    summary: str = ""
    details: dict[str, Any] = field(default_factory=dict)


class Proof:
    """The run: a deadline, a log of everything printed, and the steps' outcomes."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.deadline = self.started + args.budget
        self.lines: list[str] = []
        self.steps: list[Step] = []
        self.python = args.python or sys.executable
        self.env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        self.env["PYTHONPATH"] = root + (
            os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else ""
        )
        self.env["PYTHONUNBUFFERED"] = "1"
        self.inventory: dict[str, Any] | None = None

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def left(self, reserve: float = 0.0) -> float:
        return self.deadline - time.monotonic() - reserve

    def run(self, argv: Sequence[str], timeout: float, **kwargs: Any) -> Ran:
        budget = min(timeout, max(1.0, self.left(reserve=self.args.reserve)))
        ran = run(argv, budget, env=kwargs.pop("env", self.env), **kwargs)
        self.say(f"$ {ran.brief()}")
        return ran

    def show(self, title: str, text: str, limit: int = 12000) -> None:
        text = text.rstrip()
        if len(text) > limit:
            text = text[:limit] + f"\n... ({len(text) - limit} more characters)"
        self.say(f"--- {title} ---")
        for line in text.splitlines() or ["(empty)"]:
            self.say("  " + line)

    def step(self, name: str, body: Callable[[Step], None], needs: float = 20.0) -> Step:
        step = Step(name)
        self.steps.append(step)
        self.say("")
        self.say(f"=== {name} " + "=" * max(0, 70 - len(name)))
        if self.left(reserve=self.args.reserve) < needs:
            step.status, step.summary = SKIP, f"out of time ({self.left():.0f}s left)"
        else:
            try:
                body(step)
            except Exception as exc:  # noqa: BLE001 - one step's failure must not stop the others
                step.status = ERROR
                step.summary = f"{type(exc).__name__}: {exc}"[:400]
                self.show("traceback", traceback.format_exc())
        self.say(f"=== {name}: {step.status} {step.summary}")
        return step


# --- the steps -------------------------------------------------------------------------------------


def step_environment(proof: Proof, step: Step) -> None:
    smi = shutil.which(proof.args.nvidia_smi) or proof.args.nvidia_smi
    details: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "nvidia_smi": smi,
    }
    ran = proof.run([smi], 30)
    proof.show("nvidia-smi", ran.stdout or ran.stderr)
    torch = proof.run(
        [
            proof.python,
            "-c",
            "import torch; print(torch.__version__, torch.version.cuda, "
            "torch.cuda.is_available(), torch.cuda.device_count())",
        ],
        90,
    )
    details["torch"] = (torch.stdout or torch.stderr).strip()[-300:]
    pynvml = proof.run([proof.python, "-c", "import pynvml; print(pynvml.__file__)"], 30)
    details["pynvml"] = (pynvml.stdout or pynvml.stderr).strip()[-300:]
    details["mps_control"] = find_mps_control(proof.args.mps_control)
    for key, value in details.items():
        proof.say(f"{key}: {value}")
    step.details = details
    ok = ran.rc == 0 and torch.rc == 0 and pynvml.rc == 0
    step.status = PASS if ok else FAIL
    step.summary = f"torch {details['torch']}; MPS control: {details['mps_control'] or 'absent'}"


def step_inventory(proof: Proof, step: Step) -> None:
    check = proof.run([proof.python, "-m", "devices.nvidia_check"], 120)
    proof.show("python -m devices.nvidia_check (stdout)", check.stdout)
    proof.show("python -m devices.nvidia_check (stderr)", check.stderr)
    cli_json = proof.run([proof.python, "-m", "kubegpu", "devices", "--plugin", "nvidia", "--json"], 120)
    proof.show("kubegpu devices --plugin nvidia --json", cli_json.stdout or cli_json.stderr)
    table = proof.run([proof.python, "-m", "kubegpu", "devices", "--plugin", "nvidia"], 120)
    proof.show("kubegpu devices --plugin nvidia", table.stdout or table.stderr)
    smi = shutil.which(proof.args.nvidia_smi) or proof.args.nvidia_smi
    query = proof.run([smi, "-q"], 60)
    proof.show("nvidia-smi -q", query.stdout or query.stderr, limit=20000)
    topo = proof.run([smi, "topo", "-m"], 60)
    proof.show("nvidia-smi topo -m", topo.stdout or topo.stderr)
    details: dict[str, Any] = {"nvidia_check_rc": check.rc, "devices_rc": cli_json.rc}
    inventory = None
    try:
        inventory = json.loads(cli_json.stdout)
        proof.inventory = inventory
    except ValueError:
        details["devices_error"] = (cli_json.stderr or cli_json.stdout)[-500:]
    try:
        details["nvidia_check"] = json.loads(check.stdout)
    except ValueError:
        pass
    smi_doc = parse_smi_q(query.stdout) if query.rc == 0 else {}
    topo_doc = parse_topo_m(topo.stdout) if topo.rc == 0 else {}
    details.update(smi=smi_doc, topo=topo_doc)
    if inventory is None or not smi_doc or not topo_doc:
        step.status = FAIL
        step.summary = (
            f"nvidia_check rc={check.rc}, devices rc={cli_json.rc}, "
            f"nvidia-smi -q rc={query.rc}, topo -m rc={topo.rc}"
        )
        step.details = details
        return
    agreed, wrong = compare_inventory(inventory, smi_doc, topo_doc)
    details.update(agreed=agreed, mismatches=wrong)
    proof.say("compared with nvidia-smi:")
    for line in agreed:
        proof.say(f"  same      {line}")
    for line in wrong:
        proof.say(f"  DIFFERENT {line}")
    step.details = details
    ok = check.rc == 0 and cli_json.rc == 0 and not wrong
    step.status = PASS if ok else FAIL
    step.summary = (
        f"nvidia_check rc={check.rc}; {len(agreed)} fields agree with nvidia-smi, "
        f"{len(wrong)} differ" + (f" ({wrong[0]})" if wrong else "")
    )


def step_live_metrics(proof: Proof, step: Step) -> None:
    from devices.nvidia import NvidiaPlugin

    plugin = NvidiaPlugin()
    idle = {k: v.public() for k, v in plugin.sample().items()}
    proof.say(f"idle sample: {json.dumps(idle)}")
    samples: list[dict[str, Any]] = []
    running = threading.Event()
    done = threading.Event()
    start = time.monotonic()

    def sampler() -> None:
        while not done.is_set():
            try:
                for uuid, sample in plugin.sample().items():
                    samples.append(
                        {
                            "t": round(time.monotonic() - start, 2),
                            "gpu": uuid,
                            "running": running.is_set(),
                            **sample.public(),
                        }
                    )
            except Exception as exc:  # noqa: BLE001 - recorded, sampling goes on
                samples.append({"t": round(time.monotonic() - start, 2), "error": str(exc)})
            done.wait(0.5)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()

    def on_line(line: str, _proc: subprocess.Popen[str]) -> None:
        if line.strip() == "running":
            running.set()

    seconds = proof.args.matmul_seconds
    ran = proof.run(
        [proof.python, "-m", "kubegpu.gpu_proof", "worker", "matmul", "--seconds", str(seconds)],
        seconds + 90,
        on_line=on_line,
    )
    done.set()
    thread.join(timeout=10)
    result = ran.result()
    proof.show("matmul worker", ran.stdout + ran.stderr[-2000:])
    busy = [s for s in samples if s.get("running") and "gpuPercent" in s]
    for s in samples[:: max(1, len(samples) // 40)]:
        proof.say(f"  t={s['t']:6.2f}s " + " ".join(f"{k}={v}" for k, v in s.items() if k not in ("t",)))
    peak_util = max((s["gpuPercent"] for s in busy), default=0)
    base_mem = max((v["memoryUsedMiB"] for v in idle.values()), default=0)
    peak_mem = max((s["memoryUsedMiB"] for s in busy), default=0)
    step.details = {
        "idle": idle,
        "samples": samples,
        "worker": result,
        "peak_gpu_percent": peak_util,
        "idle_memory_used_mib": base_mem,
        "peak_memory_used_mib": peak_mem,
    }
    ok = ran.rc == 0 and result is not None and peak_util >= 50 and peak_mem >= base_mem + 256
    step.status = PASS if ok else FAIL
    tflops = result.get("tflops") if result else None
    step.summary = (
        f"{len(busy)} samples while the product ran ({tflops} TFLOP/s): utilisation peak "
        f"{peak_util}%, memory used {base_mem} -> {peak_mem} MiB"
    )


XID_LINE = re.compile(r"Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")


def step_xid(proof: Proof, step: Step) -> None:
    """XIDs through NVML's event API as the node agent reads them: none before, the one a faulting
    kernel raises after (the same code the kernel log shows), and the GPU still usable."""
    from devices.nvidia import NvidiaPlugin
    from devices.telemetry import APPLICATION_XIDS

    plugin = NvidiaPlugin()
    before = {uuid: reading.xid for uuid, reading in plugin.telemetry().items()}
    proof.say(f"XIDs before the fault: {before} (disabled: {plugin._xids.disabled!r})")
    ran = proof.run([proof.python, "-m", "kubegpu.gpu_proof", "worker", "fault"], 120)
    proof.show("fault worker", ran.stdout + ran.stderr[-2000:])
    result = ran.result() or {}
    after: dict[str, int | None] = {}
    waited = 0.0
    while waited < 15.0:
        after = {uuid: reading.xid for uuid, reading in plugin.telemetry().items()}
        if any(after.values()):
            break
        time.sleep(0.5)
        waited += 0.5
    proof.say(f"XIDs after the fault (read {waited:.1f}s after the worker ended): {after}")
    kernel = proof.run(["dmesg"], 20)
    logged = [int(m.group(2)) for m in XID_LINE.finditer(kernel.stdout)]
    proof.show(
        "kernel log, Xid lines",
        "\n".join(line for line in kernel.stdout.splitlines() if "Xid" in line)[-4000:] or "(none)",
    )
    usable = proof.run([proof.python, "-m", "kubegpu.gpu_proof", "worker", "alloc", "--gib", "1"], 120)
    alloc = usable.result() or {}
    seen = sorted({x for x in after.values() if x})
    step.details = {
        "before": before,
        "worker": result,
        "after": after,
        "kernel_log_xids": logged[-10:],
        "alloc_after": alloc,
        "disabled": plugin._xids.disabled,
    }
    faulted = result.get("cuCtxSynchronize") == CUDA_ERROR_ILLEGAL_ADDRESS
    ok = (
        bool(before)
        and all(x == 0 for x in before.values())
        and faulted
        and len(seen) == 1
        and (not logged or seen[0] == logged[-1])
        and alloc.get("outcome") == "ok"
    )
    step.status = PASS if ok else FAIL
    kind = "application" if seen and seen[0] in APPLICATION_XIDS else "GPU fault"
    step.summary = (
        f"before {sorted(set(before.values()), key=str)}; fault worker synchronize="
        f"{result.get('cuCtxSynchronize')}; after {seen or 'none'} ({kind}); kernel log "
        f"{logged[-1] if logged else 'none/unreadable'}; 1 GiB afterwards: {alloc.get('outcome')}"
    )


def find_mps_control(given: str | None) -> str | None:
    if given:
        return shutil.which(given)
    found = shutil.which("nvidia-cuda-mps-control")
    if found:
        return found
    for directory in MPS_SEARCH:
        candidate = Path(directory) / "nvidia-cuda-mps-control"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def client_command(edits: Any, argv: Sequence[str], contained: bool) -> tuple[list[str], list[Path]]:
    """How a client runs: as the container runtime would place it (its mounts at their container
    paths, in a private mount namespace) or, without that, as a host process. Returns the command
    and the mount points it creates on the host (removed afterwards)."""
    if not contained:
        return list(argv), []
    created: list[Path] = []
    script = []
    for mount in edits.mounts:
        target = Path(mount.container_path)
        if not target.exists():
            created.append(target)
        script.append(f"mkdir -p '{target}' && mount --bind '{mount.host_path}' '{target}'")
        if mount.readonly:
            script.append(f"mount -o remount,bind,ro '{target}'")
    shell = " && ".join(script + ['exec "$@"'])
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        shell,
        "kubegpu-client",
        *argv,
    ], created


def step_mps(proof: Proof, step: Step) -> None:
    control = find_mps_control(proof.args.mps_control)
    if control is None:
        step.status, step.summary = SKIP, "nvidia-cuda-mps-control is not on this machine"
        return
    gpus = [d for d in (proof.inventory or {}).get("devices", []) if d.get("kind") == "gpu"]
    if not gpus:
        from devices.nvidia import NvidiaPlugin

        gpus = [d.public() for d in NvidiaPlugin().discover().devices]
    gpu = gpus[0]["id"]
    os.environ["PATH"] = str(Path(control).parent) + os.pathsep + os.environ.get("PATH", "")
    proof.env["PATH"] = os.environ["PATH"]
    root = Path(proof.args.state_dir) / "mps"
    attempts: list[dict[str, Any]] = []
    modes = [True, False] if os.geteuid() == 0 and shutil.which("unshare") else [False]
    for contained in modes:
        attempt = mps_attempt(proof, control, root, gpu, contained)
        attempts.append(attempt)
        if attempt["verdict"] == PASS or proof.left(reserve=proof.args.reserve) < 60:
            break
    step.details = {"gpu": gpu, "control": control, "attempts": attempts}
    best = next((a for a in attempts if a["verdict"] == PASS), attempts[-1])
    step.status = best["verdict"]
    step.summary = best["summary"]


def mps_attempt(proof: Proof, control: str, root: Path, gpu: str, contained: bool) -> dict[str, Any]:
    """Start the daemon, run the three clients, stop the daemon; the outcome and what was seen."""
    from crishim.mps import MEMORY_ENV, DaemonError, MpsSupervisor, client_edits, mps_processes

    how = (
        "container-like clients (private mount namespace, daemon with private /dev/shm)"
        if contained
        else "host-process clients (daemon on the host's /dev/shm)"
    )
    proof.say(f"--- MPS with {how} ---")
    attempt: dict[str, Any] = {"contained": contained, "verdict": FAIL, "summary": ""}
    supervisor = MpsSupervisor(
        control, root, private_shm=contained, compute_mode=None, start_timeout=30.0, stop_timeout=20.0
    )
    supervisor.stop_all()  # whatever an earlier run of this proof left
    try:
        dirs = supervisor.ensure(gpu)
    except DaemonError as exc:
        attempt["summary"] = f"daemon did not start: {exc}"
        proof.say(attempt["summary"])
        return attempt
    pid = supervisor.pid(gpu)
    proof.say(f"daemon for {gpu} running, pid {pid}, pipe {dirs.pipe}")
    attempt["daemon_pid"] = pid
    runs: dict[str, Any] = {}
    try:
        try:
            attempt["server_list_before"] = supervisor.command(gpu, "get_server_list", 20).strip()
        except DaemonError as exc:
            attempt["server_list_before"] = f"error: {exc}"
        limited = client_edits(dirs, 500, 4096)
        unlimited_env = {
            k: v
            for k, v in client_edits(dirs, 1000, 0).env.items()
            if k not in ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",)
        }
        cases = [
            ("limited-8GiB", limited, dict(limited.env), 8.0, 0.0),
            ("limited-2GiB", limited, dict(limited.env), 2.0, 0.0),
            ("unlimited-8GiB", limited, unlimited_env, 8.0, 8.0),
        ]
        # Should the documented "<index>=<N>M" form not limit, "<index>=<N>G" tells a format problem
        # from an MPS one (run only then).
        cases.append(("limited-8GiB-as-4G", limited, {**limited.env, MEMORY_ENV: "0=4G"}, 8.0, 0.0))
        hung = False
        for name, edits, env, gib, hold in cases:
            if name == "limited-8GiB-as-4G" and runs.get("limited-8GiB", {}).get("outcome") != "ok":
                continue
            if proof.left(reserve=proof.args.reserve) < 40 or hung:
                runs[name] = {"outcome": "skipped: " + ("an earlier client hung" if hung else "out of time")}
                continue
            client_env = {
                k: v
                for k, v in proof.env.items()
                if not k.startswith("CUDA_MPS_") and k != "CUDA_VISIBLE_DEVICES"
            }
            client_env.update(env)
            argv = [
                proof.python,
                "-m",
                "kubegpu.gpu_proof",
                "worker",
                "alloc",
                "--gib",
                str(gib),
                "--hold",
                str(hold),
            ]
            command, created = client_command(edits, argv, contained)
            snapshot: dict[str, str] = {}

            def on_line(line: str, _proc: subprocess.Popen[str], snapshot: dict[str, str] = snapshot) -> None:
                if line.strip() == "holding":
                    smi = shutil.which(proof.args.nvidia_smi) or proof.args.nvidia_smi
                    seen = run([smi], 20)
                    snapshot["nvidia-smi"] = seen.stdout or seen.stderr
                    try:
                        snapshot["server_list"] = supervisor.command(gpu, "get_server_list", 20).strip()
                    except DaemonError as exc:
                        snapshot["server_list"] = f"error: {exc}"

            ran = proof.run(command, proof.args.client_timeout, env=client_env, on_line=on_line)
            hung = ran.rc is None
            for path in created:
                try:
                    path.rmdir()
                except OSError:
                    pass
            result = ran.result() or {"outcome": "no result", "rc": ran.rc, "stderr": ran.stderr[-1500:]}
            result["rc"] = ran.rc
            if snapshot:
                result["while_holding"] = snapshot
                proof.show(
                    "nvidia-smi while the unlimited client holds 8 GiB", snapshot.get("nvidia-smi", "")
                )
                proof.say(f"get_server_list while it holds: {snapshot.get('server_list')}")
            runs[name] = result
            proof.say(f"{name}: {json.dumps({k: v for k, v in result.items() if k != 'while_holding'})}")
            if result.get("outcome") in ("no result", "error"):
                proof.show(f"{name} stderr", ran.stderr[-3000:])
        for log_name in ("control.log", "server.log"):
            path = dirs.log / log_name
            if path.exists():
                text = path.read_text(errors="replace")
                attempt[log_name] = text[-6000:]
                proof.show(f"MPS {log_name} (tail)", text[-3000:])
    finally:
        stopped_pid = supervisor.pid(gpu)
        supervisor.stop(gpu)
        left = mps_processes(dirs.pipe)
        attempt["stopped"] = {
            "pid_before": stopped_pid,
            "daemon_gone": supervisor.pid(gpu) is None,
            "mps_processes_left": left,
            "dirs_removed": not dirs.root.exists(),
        }
        proof.say(f"stopped: {json.dumps(attempt['stopped'])}")
    attempt["runs"] = runs
    outcomes = {
        name: runs.get(name, {}).get("outcome") for name in ("limited-8GiB", "limited-2GiB", "unlimited-8GiB")
    }
    server_list = runs.get("unlimited-8GiB", {}).get("while_holding", {}).get("server_list", "")
    server_seen = bool(re.search(r"\d", server_list)) and not server_list.startswith("error")
    logged_clients = (
        "client" in attempt.get("control.log", "").lower()
        or "client" in attempt.get("server.log", "").lower()
    )
    stopped = attempt["stopped"]
    clean = stopped["daemon_gone"] and not stopped["mps_processes_left"] and stopped["dirs_removed"]
    enforced = outcomes == {"limited-8GiB": "oom", "limited-2GiB": "ok", "unlimited-8GiB": "ok"}
    attempt["verdict"] = PASS if enforced and (server_seen or logged_clients) and clean else FAIL
    sms = {n: runs.get(n, {}).get("multiprocessors") for n in ("limited-2GiB", "unlimited-8GiB")}
    attempt["summary"] = (
        f"{how}: 4 GiB-limited client allocating 8 GiB -> {outcomes['limited-8GiB']}, 2 GiB -> "
        f"{outcomes['limited-2GiB']}; unlimited client 8 GiB -> {outcomes['unlimited-8GiB']}; "
        f"multiprocessors seen at 50% / unlimited: {sms['limited-2GiB']} / {sms['unlimited-8GiB']}; "
        f"MPS server seen: {server_seen}, clients in MPS logs: {logged_clients}; "
        f"daemon stopped cleanly: {clean}"
    )
    if "limited-8GiB-as-4G" in runs:
        attempt["summary"] += f"; with 0=4G: {runs['limited-8GiB-as-4G'].get('outcome')}"
    return attempt


# --- main ------------------------------------------------------------------------------------------


def summary(proof: Proof) -> str:
    width = max(len(s.name) for s in proof.steps) if proof.steps else 10
    lines = ["", "=" * 78, f"GPU proof summary ({time.monotonic() - proof.started:.0f}s)", "=" * 78]
    lines += [f"{s.name.ljust(width)}  {s.status:5}  {s.summary}" for s in proof.steps]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kubegpu.gpu_proof", description=(__doc__ or "").split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command")
    worker = sub.add_parser("worker", help="(internal) the PyTorch part, in a child process")
    worker.add_argument("kind", choices=["matmul", "alloc", "fault"])
    worker.add_argument("--seconds", type=float, default=20.0)
    worker.add_argument("--size", type=int, default=8192)
    worker.add_argument("--gib", type=float, default=8.0)
    worker.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--out", default=os.environ.get("OUT"), help="write gpu_proof.txt and .json here")
    parser.add_argument(
        "--budget", type=float, default=330.0, help="seconds for the whole run (default %(default)s)"
    )
    parser.add_argument(
        "--reserve", type=float, default=25.0, help="seconds kept for cleanup and the summary"
    )
    parser.add_argument("--state-dir", default="/tmp/kubegpu-gpu-proof", help="the MPS daemon's directories")
    parser.add_argument(
        "--mps-control", default=None, help="nvidia-cuda-mps-control (default: PATH, driver dirs)"
    )
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    parser.add_argument("--python", default=None, help="the Python with torch (default: this one)")
    parser.add_argument("--matmul-seconds", type=float, default=20.0)
    parser.add_argument("--client-timeout", type=float, default=90.0, help="seconds for one MPS client")
    parser.add_argument(
        "--steps", default="environment,inventory,live-metrics,mps", help="also: xid (makes a GPU fault)"
    )
    args = parser.parse_args(argv)
    if args.command == "worker":
        if args.kind == "matmul":
            worker_matmul(args.seconds, args.size)
        elif args.kind == "fault":
            worker_fault()
        else:
            worker_alloc(args.gib, args.hold)
        return 0
    proof = Proof(args)
    proof.say(
        f"kubegpu GPU proof: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, budget {args.budget:.0f}s"
    )
    bodies: dict[str, tuple[Callable[[Proof, Step], None], float]] = {
        "environment": (step_environment, 10),
        "inventory": (step_inventory, 20),
        "live-metrics": (step_live_metrics, args.matmul_seconds + 30),
        "mps": (step_mps, 60),
        "xid": (step_xid, 40),
    }
    for name in [s.strip() for s in args.steps.split(",") if s.strip()]:
        if name not in bodies:
            print(f"unknown step {name!r} (known: {', '.join(bodies)})", file=sys.stderr)
            return 2
        body, needs = bodies[name]
        proof.step(name, lambda step, body=body: body(proof, step), needs)
    text = summary(proof)
    proof.say(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_proof.txt").write_text("\n".join(proof.lines) + "\n")
        doc = {
            "steps": [s.__dict__ for s in proof.steps],
            "seconds": round(time.monotonic() - proof.started, 1),
        }
        (out / "gpu_proof.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"wrote {out / 'gpu_proof.txt'} and {out / 'gpu_proof.json'}", flush=True)
    return 1 if any(s.status in (FAIL, ERROR) for s in proof.steps) else 0


if __name__ == "__main__":
    sys.exit(main())
