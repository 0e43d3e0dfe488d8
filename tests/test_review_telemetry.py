"""Hostile review of live GPU telemetry (devices/telemetry.py, the plugins' telemetry(),
crishim/gpumetrics.py): each test reproduces a defect found by feeding it what a node can hold."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from crishim.gpumetrics import GpuMetricsCollector, GpuTelemetrySampler
from devices.model import DeviceKind
from devices.nvidia import NvidiaPlugin
from devices.sim import SimPlugin
from devices.telemetry import GpuTelemetry, TelemetryError, parse_metrics_file
from tests.test_devices_nvidia import GPU_IS_LOST, FakeNVMLError, fixture
from tests.test_devices_telemetry import TelemetryNvml

GPUS = [("GPU-a", 0, 16384), ("GPU-b", 1, 16384)]


def test_a_label_value_that_is_not_utf8_does_not_take_down_metrics(tmp_path: Path) -> None:
    """A topology file's JSON may spell a lone surrogate (``"\\ud800"``); the model name then
    cannot be encoded and every scrape of /metrics failed with UnicodeEncodeError."""
    gpu = {"index": 0, "model": "Tesla \ud800 V100", "memoryMiB": 16384}
    doc = {"gpus": [gpu], "nvlink": [[0]], "pcie": [["X"]]}
    topology = tmp_path / "topo.json"
    topology.write_text(json.dumps(doc))  # json.dumps writes the escape \ud800
    plugin = SimPlugin(str(topology), "node-t", state_dir=tmp_path / "sim", create_nodes=False)
    gpus = plugin.discover().by_kind(DeviceKind.GPU)
    sampler = GpuTelemetrySampler("node-t", [plugin], lambda: gpus, lambda: [], interval=1)
    asyncio.run(sampler.sample_once())
    registry = CollectorRegistry()
    registry.register(GpuMetricsCollector(sampler))
    text = generate_latest(registry).decode()
    util = {f.name: f for f in text_string_to_metric_families(text)}["DCGM_FI_DEV_GPU_UTIL"]
    assert [s.labels["UUID"] for s in util.samples] == [gpus[0].id]
    assert util.samples[0].labels["modelName"].startswith("Tesla ")


def test_a_gpu_named_twice_by_the_same_key_is_an_error_like_by_id_and_index() -> None:
    """JSON lets a key repeat; the parser silently kept the last, while naming a GPU by id and by
    index is refused as "named twice"."""
    with pytest.raises(TelemetryError, match="twice"):
        parse_metrics_file('{"gpu0": {"utilization": 10}, "gpu0": {"utilization": 90}}', GPUS)
    with pytest.raises(TelemetryError, match="twice"):
        parse_metrics_file('{"gpu0": {"utilization": 10, "utilization": 90}}', GPUS)


class HandleLostNvml(TelemetryNvml):
    """A GPU that fell off the bus: NVML cannot even give its handle ("Unable to determine the
    device handle for GPU ...: GPU is lost", as nvidia-smi prints it)."""

    def nvmlDeviceGetHandleByIndex(self, index: int):  # type: ignore[no-untyped-def]
        if index in self.lost:
            self._check("handle")
            raise FakeNVMLError(GPU_IS_LOST)
        return super().nvmlDeviceGetHandleByIndex(index)


def test_a_gpu_lost_before_nvml_gives_its_handle_reads_as_lost_not_as_gone() -> None:
    fake = HandleLostNvml(fixture("pcie-4gpu"))
    plugin = NvidiaPlugin(nvml=fake)
    plugin.discover()
    fake.lost = {1}
    readings = plugin.telemetry()
    assert readings[fake.uuids[1]].lost  # kubegpu_gpu_lost 1, not a GPU silently missing
    assert not readings[fake.uuids[0]].lost


class Stuck:
    """A plugin whose telemetry never returns until released (a hung driver call)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def telemetry(self) -> dict[str, GpuTelemetry]:
        self.calls += 1
        self.release.wait(30)
        return {}


def test_a_plugin_that_hangs_is_reported_and_not_called_again_while_stuck() -> None:
    """The sampler awaited the plugin's read with no bound: one hung NVML call stopped telemetry
    for good, with no log line and the last round served as if current."""
    stuck = Stuck()
    sampler = GpuTelemetrySampler("node-t", [stuck], lambda: [], lambda: [], interval=0.1, read_timeout=0.2)

    async def scenario() -> None:
        await asyncio.wait_for(sampler.sample_once(), 10)
        assert "did not answer" in sampler.last_error
        await asyncio.wait_for(sampler.sample_once(), 10)
        assert stuck.calls == 1  # the stuck read is waited on, not joined by another thread
        stuck.release.set()
        for _ in range(100):
            await sampler.sample_once()
            if not sampler.last_error:
                break
            await asyncio.sleep(0.05)
        assert sampler.last_error == ""

    try:
        asyncio.run(scenario())
    finally:
        stuck.release.set()
