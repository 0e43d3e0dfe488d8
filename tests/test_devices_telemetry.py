"""Live GPU telemetry: the metrics file, the moving average, the sim and NVIDIA plugins' readings,
and the node agent's DCGM-named /metrics (parsed with prometheus_client's own parser), down to a
real shim process in front of containerd."""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from crishim.cri import api_pb2
from crishim.gpumetrics import GpuMetricsCollector, GpuTelemetrySampler, holders_by_device
from crishim.ledger import Holding
from devices.model import DeviceKind
from devices.nvidia import NvidiaPlugin
from devices.plugin import PluginError
from devices.sim import SimPlugin
from devices.telemetry import GpuTelemetry, Smoother, TelemetryError, parse_metrics_file
from kubegpu.devenv.containerd import Containerd
from kubegpu.devenv.cri import CriClient
from kubegpu.devenv.shimproc import ShimProcess, sim_node_args
from tests.fixtures.keys import write_node_keys
from tests.support.waiting import wait_for
from tests.test_crishim_rewrite import NODE, Node, gpu
from tests.test_devices_nvidia import GPU_IS_LOST, NOT_SUPPORTED, FakeNvml, FakeNVMLError, fixture

GPUS = [("GPU-a", 0, 16384), ("GPU-b", 1, 16384)]

# -- the metrics file ---------------------------------------------------------------------------


def test_a_metrics_file_names_gpus_by_id_or_index_and_the_rest_are_idle() -> None:
    text = json.dumps({"GPU-a": {"utilization": 90, "memoryUsedMiB": 1000.5, "temperatureC": 71,
                                 "powerW": 250.5, "eccErrors": 2, "xid": 79}})
    readings = parse_metrics_file(text, GPUS)
    assert readings["GPU-a"] == GpuTelemetry(90.0, 1000.5, 16384, 71.0, 250.5, 2, 79)
    assert readings["GPU-b"] == GpuTelemetry(0.0, 0.0, 16384)
    assert readings["GPU-b"].temperature_c is None  # not reported is None, never a made-up 0
    by_index = parse_metrics_file(json.dumps({"gpu1": {"utilization": 5, "lost": True}}), GPUS)
    assert by_index["GPU-b"].utilization == 5 and by_index["GPU-b"].lost
    assert parse_metrics_file("", GPUS) == parse_metrics_file("{}", GPUS)
    assert readings["GPU-a"].memory_free_mib == 16384 - 1000.5


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("[]", "JSON object"),
        ("{", "not JSON"),
        ('{"GPU-z": {}}', "'GPU-z' is not a GPU of this node"),
        ('{"GPU-a": {}, "gpu0": {}}', "GPU GPU-a is named twice"),
        ('{"GPU-a": 5}', "must be an object"),
        ('{"GPU-a": {"utilisation": 5}}', "unknown field(s) utilisation"),
        ('{"GPU-a": {"utilization": 101}}', "utilization=101 is outside 0..100"),
        ('{"GPU-a": {"utilization": true}}', "finite number"),
        ('{"GPU-a": {"utilization": NaN}}', "finite number"),
        ('{"GPU-a": {"utilization": "5"}}', "finite number"),
        ('{"GPU-a": {"memoryUsedMiB": 16385}}', "outside 0..16384"),
        ('{"GPU-a": {"temperatureC": -60}}', "outside -50..150"),
        ('{"GPU-a": {"eccErrors": -1}}', "whole number >= 0"),
        ('{"GPU-a": {"xid": 1.5}}', "whole number >= 0"),
        ('{"GPU-a": {"lost": "yes"}}', "true or false"),
    ],
)
def test_a_malformed_metrics_file_is_an_error_naming_the_file_and_entry(doc: str, says: str) -> None:
    with pytest.raises(TelemetryError) as error:
        parse_metrics_file(doc, GPUS, "/x/metrics.json")
    assert str(error.value).startswith("/x/metrics.json: ") and says in str(error.value)


def test_an_oversized_metrics_file_is_refused() -> None:
    with pytest.raises(TelemetryError, match="bytes"):
        parse_metrics_file(" " * ((1 << 20) + 1), GPUS)


# -- the moving average -------------------------------------------------------------------------


def test_the_moving_average_blends_gauges_and_keeps_counters_as_read() -> None:
    smoother = Smoother(alpha=0.5)
    first = smoother.update({"g": GpuTelemetry(100.0, 1000.0, 4000, 80.0, None, 1, 0)})
    assert first["g"].utilization == 100.0  # the first reading is the average
    second = smoother.update({"g": GpuTelemetry(0.0, 0.0, 4000, 60.0, 300.0, 3, 43)})
    assert (second["g"].utilization, second["g"].memory_used_mib) == (50.0, 500.0)
    assert second["g"].temperature_c == 70.0
    assert second["g"].power_w == 300.0  # no earlier power reading: the new one as it is
    assert (second["g"].ecc_uncorrected, second["g"].xid) == (3, 43)
    third = smoother.update({"g": GpuTelemetry(0.0, 0.0, 4000, lost=True)})
    assert third["g"].lost and third["g"].utilization == 0.0
    back = smoother.update({"g": GpuTelemetry(40.0, 0.0, 4000)})
    assert back["g"].utilization == 40.0  # a lost GPU starts its average afresh
    assert smoother.update({}) == {}  # a GPU no plugin could read is dropped
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ValueError):
            Smoother(bad)


# -- plugins ------------------------------------------------------------------------------------


def sim(tmp_path: Path) -> SimPlugin:
    return SimPlugin("dgx1-v100", "node-t", state_dir=tmp_path, create_nodes=False)


def test_the_sim_plugin_reads_its_metrics_file(tmp_path: Path) -> None:
    plugin = sim(tmp_path)
    gpus = plugin.discover().by_kind(DeviceKind.GPU)
    idle = plugin.telemetry()
    assert set(idle) == {g.id for g in gpus} and all(t.utilization == 0 for t in idle.values())
    (tmp_path / "metrics.json").write_text(json.dumps({"gpu3": {"utilization": 77}}))
    assert plugin.telemetry()[gpus[3].id].utilization == 77
    (tmp_path / "metrics.json").write_text('{"gpu3": {"utilization": 700}}')
    with pytest.raises(PluginError, match=r"sim: .*metrics.json: gpu3.utilization=700"):
        plugin.telemetry()
    (tmp_path / "metrics.json").write_bytes(b"\xff\xfe")
    with pytest.raises(PluginError, match="metrics.json"):
        plugin.telemetry()
    (tmp_path / "metrics.json").unlink()
    (tmp_path / "metrics.json").mkdir()
    with pytest.raises(PluginError, match="metrics.json"):
        plugin.telemetry()


class TelemetryNvml(FakeNvml):
    """The fake NVML with the live readings; ``unsupported`` calls answer Not Supported."""

    def __init__(self, *args: Any, unsupported: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unsupported = set(unsupported)
        self.lost_after_uuid: set[int] = set()

    def _live(self, name: str, handle: SimpleNamespace) -> int:
        self._check(name)
        index = self._handle(handle)
        if index in self.lost_after_uuid:
            raise FakeNVMLError(GPU_IS_LOST)
        if name in self.unsupported:
            raise FakeNVMLError(NOT_SUPPORTED)
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: SimpleNamespace) -> SimpleNamespace:
        return SimpleNamespace(gpu=10 * self._live("utilization", handle) + 5, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: SimpleNamespace) -> SimpleNamespace:
        index = self._live("memory", handle)
        mib = self.doc["gpus"][index]["memoryMiB"]
        return SimpleNamespace(total=mib * 1024 * 1024, used=(512 + index) * 1024 * 1024, free=0)

    def nvmlDeviceGetTemperature(self, handle: SimpleNamespace, sensor: int) -> int:
        assert sensor == 0
        return 40 + self._live("temperature", handle)

    def nvmlDeviceGetPowerUsage(self, handle: SimpleNamespace) -> int:
        return 150_000 + 1000 * self._live("power", handle)  # milliwatts

    def nvmlDeviceGetTotalEccErrors(self, handle: SimpleNamespace, kind: int, counter: int) -> int:
        assert (kind, counter) == (1, 0)  # uncorrected, volatile
        return self._live("ecc", handle)


def test_the_nvidia_plugin_reads_nvml_and_leaves_what_a_gpu_cannot_say_as_none() -> None:
    fake = TelemetryNvml(fixture("pcie-4gpu"), unsupported=("ecc",))
    plugin = NvidiaPlugin(nvml=fake, exists=lambda path: True, cpu_count=64)
    readings = plugin.telemetry()
    first = readings[fake.uuids[1]]
    assert (first.utilization, first.memory_used_mib) == (15.0, 513.0)
    assert (first.temperature_c, first.power_w) == (41.0, 151.0)
    assert first.ecc_uncorrected is None and first.xid is None and not first.lost
    fake.lost_after_uuid.add(2)
    fake.lost.add(3)  # its UUID cannot be read either: left out
    readings = plugin.telemetry()
    assert readings[fake.uuids[2]].lost and fake.uuids[3] not in readings
    old = OlderNvml(fixture("pcie-4gpu"))
    reading = NvidiaPlugin(nvml=old, exists=lambda path: True, cpu_count=64).telemetry()[old.uuids[0]]
    assert reading.power_w is None and reading.temperature_c == 40.0


class OlderNvml(TelemetryNvml):
    """A pynvml module without the power call."""

    nvmlDeviceGetPowerUsage = None  # type: ignore[assignment]


# -- the node agent's /metrics ------------------------------------------------------------------


def families(registry: CollectorRegistry) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = generate_latest(registry).decode()
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


def holding(device: str, sandbox: str, container: str, milli: int = 1000) -> Holding:
    return Holding(f"c-{container}", sandbox, f"uid-{sandbox}", container, device, milli)


def test_gpu_metrics_carry_dcgm_names_and_the_holding_pods(tmp_path: Path) -> None:
    plugin = sim(tmp_path)
    gpus = plugin.discover().by_kind(DeviceKind.GPU)
    (tmp_path / "metrics.json").write_text(json.dumps({
        "gpu0": {"utilization": 80, "memoryUsedMiB": 2048, "temperatureC": 65, "powerW": 200},
        "gpu1": {"utilization": 30},
        "gpu2": {"lost": True},
    }))
    holdings = [holding(gpus[0].id, "sb1", "train"), holding(gpus[1].id, "sb1", "train", 500),
                holding(gpus[1].id, "sb2", "infer", 500)]

    async def names(ids: set[str]) -> dict[str, tuple[str, str]]:
        return {i: ("ml", f"pod-{i}") for i in ids if i == "sb1"}  # sb2: the runtime does not say

    sampler = GpuTelemetrySampler("node-t", [plugin], lambda: gpus, lambda: holdings, interval=1)
    sampler.attach(names)
    asyncio.run(sampler.sample_once())
    registry = CollectorRegistry()
    registry.register(GpuMetricsCollector(sampler))
    got = families(registry)
    util = {(s["gpu"], s["pod"], s["container"]): v for s, v in got["DCGM_FI_DEV_GPU_UTIL"]}
    assert util[("0", "pod-sb1", "train")] == 80.0
    assert util[("1", "pod-sb1", "train")] == 30.0 and util[("1", "uid-sb2", "infer")] == 30.0  # shared
    assert util[("3", "", "")] == 0.0  # a free GPU: one series, pod labels empty
    assert ("2", "", "") not in util  # a lost GPU reports only that it is lost
    labels = next(s for s, _ in got["DCGM_FI_DEV_GPU_UTIL"] if s["gpu"] == "0")
    assert labels == {"gpu": "0", "UUID": gpus[0].id, "device": "nvidia0", "modelName": gpus[0].model,
                      "Hostname": "node-t", "namespace": "ml", "pod": "pod-sb1", "container": "train"}
    assert {s["gpu"]: v for s, v in got["kubegpu_gpu_lost"]}["2"] == 1.0
    assert [v for s, v in got["DCGM_FI_DEV_FB_USED"] if s["gpu"] == "0"] == [2048.0]
    assert [v for s, v in got["DCGM_FI_DEV_FB_FREE"] if s["gpu"] == "0"] == [gpus[0].memory_mib - 2048.0]
    assert [s["gpu"] for s, _ in got["DCGM_FI_DEV_GPU_TEMP"]] == ["0"]  # only where reported
    assert [v for _, v in got["DCGM_FI_DEV_POWER_USAGE"]] == [200.0]
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" not in got  # the sim reports none here

    (tmp_path / "metrics.json").write_text("{broken")  # a failing round keeps the last one
    asyncio.run(sampler.sample_once())
    assert "metrics.json" in sampler.last_error
    assert families(registry)["DCGM_FI_DEV_GPU_UTIL"] == got["DCGM_FI_DEV_GPU_UTIL"]


def test_holders_are_unique_and_sorted_per_device() -> None:
    holdings = [holding("g", "s2", "b"), holding("g", "s1", "a"), holding("g", "s1", "a")]
    assert holders_by_device(holdings, {"s1": ("n", "p1")}) == {"g": (("", "uid-s2", "b"), ("n", "p1", "a"))}


@pytest.mark.containerd
def test_a_running_shim_serves_gpu_metrics_with_the_holding_pod(
    containerd: Containerd, direct: CriClient, tmp_path: Path
) -> None:
    """A real shim with the sim plugin in front of containerd: write the metrics file, create a
    container holding GPU 0 through the shim, and read DCGM_FI_DEV_GPU_UTIL with its pod."""
    state = tmp_path / "sim"
    state.mkdir()
    (state / "metrics.json").write_text(json.dumps({"gpu0": {"utilization": 42}}))
    shim = ShimProcess(
        socket=Path(f"/tmp/kgshim-tm-{uuid.uuid4().hex[:8]}.sock"),
        runtime_endpoint=containerd.endpoint,
        log_path=tmp_path / "crishim.log",
        extra_args=[*sim_node_args(NODE, "dgx1-v100", str(state), str(write_node_keys(tmp_path / "keys"))),
                    "--telemetry-interval", "0.2"],
    ).start()
    node = Node(shim, CriClient(shim.endpoint), direct, state, tmp_path / "logs")
    sandbox = ""
    try:
        uid = str(uuid.uuid4())
        sandbox, config = node.run_pod("telemetry-pod", node.signed(uid, {"app": [gpu(0)]}), uid)
        node.create(sandbox, config, "app")

        def held() -> list[tuple[dict[str, str], float]]:
            with urllib.request.urlopen(f"{shim.metrics_url}/metrics", timeout=10) as response:
                text = response.read().decode()
            util = {f.name: f for f in text_string_to_metric_families(text)}.get("DCGM_FI_DEV_GPU_UTIL")
            return [] if util is None else [(x.labels, x.value) for x in util.samples if x.labels["pod"]]

        wait_for(lambda: bool(held()), 20)
        found = held()
        assert len(found) == 1
        labels, value = found[0]
        assert value == 42.0 and labels["gpu"] == "0" and labels["UUID"] == gpu(0)
        assert (labels["namespace"], labels["pod"], labels["container"]) == (
            config.metadata.namespace, "telemetry-pod", "app")
        assert labels["Hostname"] == NODE
    finally:
        node.client.close()
        shim.stop()
        if sandbox:
            direct.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox))
            direct.runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox))
