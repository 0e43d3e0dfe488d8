"""The NVIDIA plugin's part in enforced shares and the GPU proof: compute mode and live samples."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from devices.nvidia import (
    NVML_COMPUTEMODE_DEFAULT,
    NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
    GpuSample,
    NvidiaPlugin,
)
from devices.plugin import PluginError
from tests.test_devices_nvidia import FakeNvml, FakeNVMLError, fixture

NO_PERMISSION = 4


class LiveNvml(FakeNvml):
    """The fake NVML with utilisation, memory in use and compute mode."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.modes = [NVML_COMPUTEMODE_DEFAULT] * len(self.uuids)
        self.refuse_mode = False

    def nvmlDeviceGetUtilizationRates(self, handle: SimpleNamespace) -> SimpleNamespace:
        self._check("utilization")
        index = self._handle(handle)
        return SimpleNamespace(gpu=10 * index + 7, memory=index + 1)

    def nvmlDeviceGetMemoryInfo(self, handle: SimpleNamespace) -> SimpleNamespace:
        self._check("memory")
        index = self._handle(handle)
        mib = self.doc["gpus"][index]["memoryMiB"]
        return SimpleNamespace(total=mib * 1024 * 1024, used=(100 + index) * 1024 * 1024, free=0)

    def nvmlDeviceSetComputeMode(self, handle: SimpleNamespace, mode: int) -> None:
        self._check("set_compute_mode")
        if self.refuse_mode:
            raise FakeNVMLError(NO_PERMISSION)
        self.modes[self._handle(handle)] = mode


def plugin(**kwargs: Any) -> tuple[LiveNvml, NvidiaPlugin]:
    fake = LiveNvml(fixture("pcie-4gpu"), **kwargs)
    return fake, NvidiaPlugin(nvml=fake, exists=lambda path: True, cpu_count=64)


def test_sample_reads_utilisation_and_memory() -> None:
    fake, nvidia = plugin()
    samples = nvidia.sample()
    assert list(samples) == fake.uuids
    total = fixture("pcie-4gpu")["gpus"][2]["memoryMiB"]
    assert samples[fake.uuids[2]] == GpuSample(27, 3, 102, total)
    assert samples[fake.uuids[0]].public() == {
        "gpuPercent": 7,
        "memoryPercent": 1,
        "memoryUsedMiB": 100,
        "memoryTotalMiB": 23034,
    }
    assert fake.refs == 0  # every NVML session was closed


def test_sample_leaves_out_a_lost_gpu() -> None:
    fake, nvidia = plugin(lost=(1,))
    assert list(nvidia.sample()) == [fake.uuids[0], fake.uuids[2], fake.uuids[3]]


def test_exclusive_compute_mode_and_back() -> None:
    fake, nvidia = plugin()
    nvidia.set_exclusive_compute(fake.uuids[3], True)
    assert fake.modes == [0, 0, 0, NVML_COMPUTEMODE_EXCLUSIVE_PROCESS]
    nvidia.set_exclusive_compute(fake.uuids[3], False)
    assert fake.modes == [0, 0, 0, 0]
    assert fake.refs == 0


def test_compute_mode_refusal_names_the_gpu() -> None:
    fake, nvidia = plugin()
    fake.refuse_mode = True
    with pytest.raises(PluginError, match=f"GPU {fake.uuids[0]}: cannot set compute mode EXCLUSIVE_PROCESS"):
        nvidia.set_exclusive_compute(fake.uuids[0], True)
    with pytest.raises(PluginError, match="GPU GPU-nope"):
        nvidia.set_exclusive_compute("GPU-nope", False)
    fake2, lost = plugin(lost=(0,))
    with pytest.raises(PluginError, match="cannot set compute mode"):
        lost.set_exclusive_compute(fake2.uuids[0], True)
