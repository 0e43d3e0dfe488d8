"""A pretend two-GPU machine for dry runs of ``kubegpu.gpu_proof`` (its plumbing, not the GPU).

``write_fake_gpu(directory)`` writes, for one consistent HGX-like machine (two H100s joined by
18 NVLinks, one per NUMA node):

- ``pynvml.py``: the NVML calls the NVIDIA plugin makes;
- ``bin/nvidia-smi``: ``-q``, ``topo -m`` and the plain table, in the driver's formats;
- ``torch/``: just enough of PyTorch for the proof's workers. Matrix products mark the GPU busy
  (``$FAKE_GPU_STATE/busy``, which the fake NVML reports as 97 % utilisation). Allocations obey
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` only when the client reaches an MPS daemon (a pid file in
  ``$CUDA_MPS_PIPE_DIRECTORY``), and then register a server with the daemon (a line on its FIFO;
  the daemon lists it in ``standin-servers`` there, which the stand-in control's
  ``get_server_list`` prints).

Put ``directory`` first on PYTHONPATH and ``directory/bin`` first on PATH.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

GPUS = [
    {
        "uuid": "GPU-1b2c3d4e-0000-1111-2222-333344445555",
        "bus": "00000000:18:00.0",
        "numa": 0,
        "cpus": "0-15",
        "mask": 0xFFFF,
    },
    {
        "uuid": "GPU-9f8e7d6c-0000-1111-2222-333344445555",
        "bus": "00000000:9A:00.0",
        "numa": 1,
        "cpus": "16-31",
        "mask": 0xFFFF0000,
    },
]
NAME = "NVIDIA H100 80GB HBM3"
TOTAL_MIB = 81559

PYNVML = '''
"""Fake NVML (tests/support/fake_gpu.py)."""
import os
from types import SimpleNamespace

GPUS = %(gpus)r
NAME = %(name)r
TOTAL = %(total)d * 1024 * 1024
NVML_NVLINK_MAX_LINKS = 18


class NVMLError(Exception):
    pass


_refs = 0


def nvmlInit():
    global _refs
    _refs += 1


def nvmlShutdown():
    global _refs
    _refs -= 1


def _busy():
    return os.path.exists(os.path.join(os.environ.get("FAKE_GPU_STATE", "/nonexistent"), "busy"))


def nvmlDeviceGetCount():
    return len(GPUS)


def nvmlDeviceGetHandleByIndex(i):
    if not 0 <= i < len(GPUS):
        raise NVMLError("Invalid Argument")
    return SimpleNamespace(i=i)


def nvmlDeviceGetHandleByUUID(uuid):
    for i, g in enumerate(GPUS):
        if g["uuid"] == uuid:
            return SimpleNamespace(i=i)
    raise NVMLError("Not Found")


def nvmlDeviceGetUUID(h):
    return GPUS[h.i]["uuid"]


def nvmlDeviceGetName(h):
    return NAME


def nvmlDeviceGetMemoryInfo(h):
    used = (2049 if _busy() and h.i == 0 else 1) * 1024 * 1024
    return SimpleNamespace(total=TOTAL, used=used, free=TOTAL - used)


def nvmlDeviceGetMinorNumber(h):
    return h.i


def nvmlDeviceGetPciInfo(h):
    return SimpleNamespace(busId=GPUS[h.i]["bus"].encode())


def nvmlDeviceGetNumaNodeId(h):
    return GPUS[h.i]["numa"]


def nvmlDeviceGetCpuAffinity(h, words):
    return [GPUS[h.i]["mask"]] + [0] * (words - 1)


def nvmlDeviceGetNvLinkState(h, link):
    if link >= 18:
        raise NVMLError("Invalid Argument")
    return 1


def nvmlDeviceGetNvLinkRemotePciInfo_v2(h, link):
    return SimpleNamespace(busId=GPUS[1 - h.i]["bus"].encode())


def nvmlDeviceGetNvLinkRemoteDeviceType(h, link):
    return 0


def nvmlDeviceGetTopologyCommonAncestor(a, b):
    return 50


def nvmlDeviceGetUtilizationRates(h):
    busy = _busy() and h.i == 0
    return SimpleNamespace(gpu=97 if busy else 0, memory=41 if busy else 0)
'''

NVIDIA_SMI = r'''
import os, sys

GPUS = %(gpus)r
NAME = %(name)r
TOTAL = %(total)d
args = sys.argv[1:]
if args == ["-q"]:
    print()
    print("==============NVSMI LOG==============")
    print()
    print("Timestamp                                 : Wed Nov 26 12:00:00 2026")
    print("Driver Version                            : 580.159.04")
    print("CUDA Version                              : 13.0")
    print()
    print("Attached GPUs                             : %%d" %% len(GPUS))
    for i, g in enumerate(GPUS):
        print("GPU " + g["bus"])
        print("    Product Name                          : " + NAME)
        print("    Product Brand                         : NVIDIA")
        print("    Persistence Mode                      : Enabled")
        print("    Minor Number                          : %%d" %% i)
        print("    GPU UUID                              : " + g["uuid"])
        print("    PCI")
        print("        Bus                               : 0x" + g["bus"].split(":")[1])
        print("        Bus Id                            : " + g["bus"])
        print("        GPU Link Info")
        print("            PCIe Generation")
        print("                Max                       : 5")
        print("    FB Memory Usage")
        print("        Total                             : %%d MiB" %% TOTAL)
        print("        Reserved                          : 573 MiB")
        print("        Used                              : 1 MiB")
        print("    BAR1 Memory Usage")
        print("        Total                             : 131072 MiB")
        print("    Compute Mode                          : Default")
        print()
elif args == ["topo", "-m"]:
    n = len(GPUS)
    print("\t" + "\t".join("GPU%%d" %% i for i in range(n)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID")
    for i, g in enumerate(GPUS):
        cells = [" X " if j == i else "NV18" for j in range(n)]
        print("GPU%%d\t" %% i + "\t".join(cells) + "\t%%s\t%%d\t\tN/A" %% (g["cpus"], g["numa"]))
    print()
    print("Legend:")
    print()
    print("  X    = Self")
    print("  NV#  = Connection traversing a bonded set of # NVLinks")
elif not args:
    print("| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |")
    for i, g in enumerate(GPUS):
        print("|   %%d  %%s  %%s |" %% (i, NAME, g["bus"]))
else:
    sys.stderr.write("fake nvidia-smi: unsupported %%r\n" %% args)
    sys.exit(2)
'''

TORCH = '''
"""Fake PyTorch (tests/support/fake_gpu.py): just what kubegpu.gpu_proof's workers use."""
import os
import time
from types import SimpleNamespace

from torch import cuda  # noqa: F401

__version__ = "0.0-fake"
version = SimpleNamespace(cuda="13.0")
bfloat16, uint8 = "bfloat16", "uint8"


class _Tensor:
    def __matmul__(self, other):
        state = os.environ.get("FAKE_GPU_STATE")
        if state:
            open(os.path.join(state, "busy"), "w").close()
        time.sleep(0.01)
        return self

    def fill_(self, value):
        return self


def randn(*shape, device=None, dtype=None):
    return _Tensor()


def empty(n, dtype=None, device=None):
    limit = cuda._limit_bytes()
    if limit is not None and n > limit:
        raise cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate %%.2f GiB" %% (n / 2**30))
    return _Tensor()
'''

TORCH_CUDA = '''
import os
from types import SimpleNamespace

TOTAL = %(total)d * 1024 * 1024


class OutOfMemoryError(RuntimeError):
    pass


def _pipe():
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if pipe and os.path.exists(os.path.join(pipe, "nvidia-cuda-mps-control.pid")):
        return pipe
    return None


def _register(pipe, server):
    # Through the daemon's FIFO, as a real client reaches its daemon: the pipe directory is
    # read-only in a client's container. The daemon lists the server in standin-servers there.
    import time

    try:
        fd = os.open(os.path.join(pipe, "control"), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return  # no daemon serves the FIFO (a test's bare pid file): nothing to register with
    os.write(fd, b"register_server %%d\\n" %% server)
    os.close(fd)
    listing = os.path.join(pipe, "standin-servers")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if os.path.exists(listing) and str(server) in open(listing).read().split():
            return
        time.sleep(0.02)


def _limit_bytes():
    pipe = _pipe()
    if pipe is None:
        return None  # no MPS daemon reached: an ordinary CUDA process, no limit
    _register(pipe, os.getpid() + 100000)
    raw = os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")
    for part in raw.split(","):
        device, _, value = part.partition("=")
        if device == "0" and value.endswith("M"):
            return int(value[:-1]) * 1024 * 1024
    return None


def is_available():
    return True


def device_count():
    return 1


def get_device_name(i):
    return %(name)r


def get_device_properties(i):
    return SimpleNamespace(name=%(name)r, multi_processor_count=132, total_memory=TOTAL)


def mem_get_info():
    limit = _limit_bytes()
    total = limit if limit is not None else TOTAL
    return total, total


def synchronize():
    pass
'''


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n{text}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def write_fake_gpu(directory: Path) -> Path:
    """Write the fakes under ``directory``; returns ``directory/bin`` (for PATH)."""
    values = {"gpus": GPUS, "name": NAME, "total": TOTAL_MIB}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pynvml.py").write_text(PYNVML % values)
    (directory / "torch").mkdir(exist_ok=True)
    (directory / "torch" / "__init__.py").write_text(TORCH % values)
    (directory / "torch" / "cuda.py").write_text(TORCH_CUDA % values)
    _executable(directory / "bin" / "nvidia-smi", NVIDIA_SMI % values)
    return directory / "bin"
