"""The NVIDIA plugin against a fake NVML built from the shipped topology fixtures."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from devices import nvidia, nvidia_check
from devices.model import DeviceKind, PCIeRelation, pair
from devices.nvidia import (
    GpuInfo,
    NvidiaPlugin,
    NvidiaUnavailable,
    NvLink,
    cpu_list,
    nvlink_counts,
    pcie_relation_from_nvml,
)
from devices.plugin import ContainerEdits, DeviceNode
from devices.sim import TOPOLOGY_DIR

# NVML return codes the fake raises
UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND, LIBRARY_NOT_FOUND, GPU_IS_LOST = 1, 2, 3, 6, 12, 15
_MESSAGES = {
    UNINITIALIZED: "Uninitialized",
    INVALID_ARGUMENT: "Invalid Argument",
    NOT_SUPPORTED: "Not Supported",
    NOT_FOUND: "Not Found",
    LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    GPU_IS_LOST: "GPU is lost",
}
_TO_NVML = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


def fixture(name: str) -> dict[str, Any]:
    return json.loads((TOPOLOGY_DIR / f"{name}.json").read_text())


class FakeNvml:
    """Implements the NVML calls the plugin uses, for the GPUs of a topology fixture.

    ``switch``: NVLinks go to NVSwitches (NVSwitch machines) instead of GPU to GPU.
    """

    NVMLError = FakeNVMLError
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(
        self,
        doc: dict[str, Any],
        switch: bool = False,
        init_error: int | None = None,
        lost: tuple[int, ...] = (),
        numa_supported: bool = True,
        remote_types: bool = True,
        memory_affinity: bool = True,
    ) -> None:
        self.doc = doc
        self.memory_affinity = memory_affinity
        self.init_error = init_error
        self.lost = set(lost)
        self.numa_supported = numa_supported
        self.refs = 0
        self.calls: list[str] = []
        n = len(doc["gpus"])
        self.uuids = [f"GPU-{i:08x}-1111-2222-3333-{i:012x}" for i in range(n)]
        self.bus_ids = [f"00000000:{0x18 + 0x10 * i:02X}:00.0" for i in range(n)]
        self.links: list[list[tuple[str, int]]] = [[] for _ in range(n)]
        for i in range(n):
            for j in range(n):
                count = doc["nvlink"][i][j]
                if switch and i != j and count:
                    self.links[i] = [(f"00000000:{0xC0 + k:02X}:00.0", 2) for k in range(count)]
                    break
                if not switch:
                    self.links[i] += [(self.bus_ids[j], 0)] * count
        if not remote_types:  # as in modules too old to have the call
            self.nvmlDeviceGetNvLinkRemoteDeviceType = None

    def _check(self, name: str) -> None:
        self.calls.append(name)
        if self.refs <= 0:
            raise FakeNVMLError(UNINITIALIZED)

    def _handle(self, handle: SimpleNamespace) -> int:
        if handle.index in self.lost:
            raise FakeNVMLError(GPU_IS_LOST)
        return handle.index

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)
        self.refs += 1

    def nvmlShutdown(self) -> None:
        self._check("shutdown")
        self.refs -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._check("count")
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimpleNamespace:
        self._check("handle")
        if not 0 <= index < len(self.uuids):
            raise FakeNVMLError(INVALID_ARGUMENT)
        return SimpleNamespace(index=index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> SimpleNamespace:
        self._check("handle_by_uuid")
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        if uuid not in self.uuids:
            raise FakeNVMLError(NOT_FOUND)
        index = self.uuids.index(uuid)
        if index in self.lost:
            raise FakeNVMLError(GPU_IS_LOST)
        return SimpleNamespace(index=index)

    def nvmlDeviceGetUUID(self, handle: SimpleNamespace) -> bytes:
        self._check("uuid")
        return self.uuids[self._handle(handle)].encode()  # old modules return bytes

    def nvmlDeviceGetName(self, handle: SimpleNamespace) -> str:
        self._check("name")
        return self.doc["gpus"][self._handle(handle)]["model"]

    def nvmlDeviceGetMemoryInfo(self, handle: SimpleNamespace) -> SimpleNamespace:
        self._check("memory")
        mib = self.doc["gpus"][self._handle(handle)]["memoryMiB"]
        return SimpleNamespace(total=mib * 1024 * 1024, free=0, used=0)

    def nvmlDeviceGetMinorNumber(self, handle: SimpleNamespace) -> int:
        self._check("minor")
        return self._handle(handle)

    def nvmlDeviceGetPciInfo(self, handle: SimpleNamespace) -> SimpleNamespace:
        self._check("pci")
        return SimpleNamespace(busId=self.bus_ids[self._handle(handle)].encode())

    def nvmlDeviceGetNumaNodeId(self, handle: SimpleNamespace) -> int:
        self._check("numa")
        if not self.numa_supported:
            raise FakeNVMLError(NOT_SUPPORTED)
        return self.doc["gpus"][self._handle(handle)]["numa"]

    def nvmlDeviceGetMemoryAffinity(self, handle: SimpleNamespace, words: int, scope: int) -> list[int]:
        self._check("memory_affinity")
        if not self.memory_affinity or scope != 0:
            raise FakeNVMLError(NOT_SUPPORTED)
        numa = self.doc["gpus"][self._handle(handle)]["numa"]
        return [(1 << numa) if w == numa // 64 else 0 for w in range(words)]

    def nvmlDeviceGetCpuAffinity(self, handle: SimpleNamespace, words: int) -> list[int]:
        self._check("affinity")
        numa = self.doc["gpus"][self._handle(handle)]["numa"]
        return [0xFFFF << (16 * (numa % 4))] + [0] * (words - 1)

    def nvmlDeviceGetNvLinkState(self, handle: SimpleNamespace, link: int) -> int:
        self._check("nvlink_state")
        links = self.links[self._handle(handle)]
        if not links:
            raise FakeNVMLError(NOT_SUPPORTED)
        if link >= len(links):
            raise FakeNVMLError(INVALID_ARGUMENT)
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle: SimpleNamespace, link: int) -> SimpleNamespace:
        self._check("nvlink_remote")
        return SimpleNamespace(busId=self.links[self._handle(handle)][link][0].encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: SimpleNamespace, link: int) -> int:
        self._check("nvlink_type")
        return self.links[self._handle(handle)][link][1]

    def nvmlDeviceGetTopologyCommonAncestor(self, a: SimpleNamespace, b: SimpleNamespace) -> int:
        self._check("ancestor")
        return _TO_NVML[self.doc["pcie"][self._handle(a)][self._handle(b)]]


SWITCHED = {"dgx-a100", "hgx-h100"}
FIXTURES = ["dgx1-v100", "dgx-a100", "hgx-h100", "pcie-4gpu", "rtx8000-4gpu"]


def make(name: str, **kwargs: Any) -> tuple[FakeNvml, NvidiaPlugin]:
    fake = FakeNvml(fixture(name), switch=name in SWITCHED, **kwargs)
    return fake, NvidiaPlugin(nvml=fake, exists=lambda path: path != "/dev/nvidia-uvm-tools", cpu_count=64)


@pytest.mark.parametrize("name", FIXTURES)
def test_inventory_matches_fixture(name: str) -> None:
    fake, plugin = make(name)
    inventory = plugin.discover()
    doc = fixture(name)
    gpus = inventory.by_kind(DeviceKind.GPU)
    assert [g.id for g in gpus] == fake.uuids
    for gpu, want in zip(gpus, doc["gpus"], strict=True):
        assert gpu.index == want["index"]
        assert gpu.model == want["model"]
        assert gpu.memory_mib == want["memoryMiB"]
        assert gpu.numa_node == want["numa"]
        assert gpu.healthy
        assert gpu.pci_bus_id == fake.bus_ids[gpu.index].lower()[4:]  # 0000:18:00.0
        assert gpu.device_nodes == (f"/dev/nvidia{gpu.index}",)
        assert gpu.attributes["minor"] == str(gpu.index)
    assert fake.refs == 0, "every nvmlInit has its nvmlShutdown"
    assert plugin.last_errors == []


@pytest.mark.parametrize("name", FIXTURES)
def test_topology_matches_fixture(name: str) -> None:
    fake, plugin = make(name)
    topology = plugin.discover().topology
    doc, ids = fixture(name), fake.uuids
    pairs = [(i, j) for i in range(len(ids)) for j in range(i + 1, len(ids))]
    want_nvlinks = {pair(ids[i], ids[j]): doc["nvlink"][i][j] for i, j in pairs}
    want_pcie = {pair(ids[i], ids[j]): PCIeRelation[doc["pcie"][i][j]] for i, j in pairs}
    assert {k: topology.nvlink_count(*k) for k in want_nvlinks} == want_nvlinks
    assert {k: v for k, v in want_nvlinks.items() if v} == dict(topology.nvlinks)
    assert dict(topology.pcie) == want_pcie


def test_dgx1_nvlink_shape() -> None:
    fake, plugin = make("dgx1-v100")
    topology = plugin.discover().topology
    g = fake.uuids
    assert topology.nvlink_count(g[0], g[3]) == 2
    assert topology.nvlink_count(g[0], g[1]) == 1
    assert topology.nvlink_count(g[0], g[5]) == 0
    assert topology.pcie_relation(g[0], g[1]) is PCIeRelation.PIX
    assert topology.pcie_relation(g[0], g[4]) is PCIeRelation.SYS


def test_switch_links_without_remote_type_call() -> None:
    """Old NVML modules cannot say a link's remote type: unknown bus ids count as switches."""
    fake, plugin = make("hgx-h100", remote_types=False)
    topology = plugin.discover().topology
    assert set(topology.nvlinks.values()) == {18}
    assert len(topology.nvlinks) == 8 * 7 // 2
    assert "nvlink_type" not in fake.calls


def test_inventory_round_trips_through_public() -> None:
    _, plugin = make("dgx-a100")
    inventory = plugin.discover()
    back = type(inventory).from_public(json.loads(json.dumps(inventory.public())))
    assert back.public() == inventory.public()
    assert back.topology == inventory.topology


def test_edits() -> None:
    fake, plugin = make("dgx1-v100")
    gpus = plugin.discover().by_kind(DeviceKind.GPU)
    edits = plugin.container_edits([gpus[3], gpus[1]])
    assert edits.device_nodes == (
        DeviceNode("/dev/nvidia3", "/dev/nvidia3", "rwm"),
        DeviceNode("/dev/nvidia1", "/dev/nvidia1", "rwm"),
        DeviceNode("/dev/nvidiactl", "/dev/nvidiactl", "rwm"),
        DeviceNode("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rwm"),  # uvm-tools is absent on this "host"
    )
    assert edits.env == {"NVIDIA_VISIBLE_DEVICES": f"{fake.uuids[3]},{fake.uuids[1]}"}
    assert "CUDA_VISIBLE_DEVICES" not in edits.env
    assert edits.mounts == () and edits.cdi_devices == ()
    assert plugin.container_edits([]) == ContainerEdits()


def test_edits_cdi_and_shares() -> None:
    fake = FakeNvml(fixture("pcie-4gpu"))
    plugin = NvidiaPlugin(nvml=fake, exists=lambda path: True, cdi=True)
    gpu = plugin.discover().by_kind(DeviceKind.GPU)[2]
    edits = plugin.container_edits([gpu], {gpu.id: SimpleNamespace(milli=250, memory_mib=4096)})
    assert edits.cdi_devices == (f"nvidia.com/gpu={gpu.id}",)
    assert edits.env["KUBEGPU_GPU_SHARES"] == f"{gpu.id}:250:4096"
    assert [d.host_path for d in edits.device_nodes] == [
        "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"
    ]


def test_edits_for_device_without_minor_asks_nvml() -> None:
    """An allocation names GPUs by UUID only: the plugin finds the minor through NVML."""
    from devices.model import Device

    fake, plugin = make("pcie-4gpu")
    edits = plugin.container_edits([Device(id=fake.uuids[2], kind=DeviceKind.GPU, index=2, model="")])
    assert edits.device_nodes[0].host_path == "/dev/nvidia2"
    assert fake.refs == 0


def test_init_failure_is_a_clear_error() -> None:
    _, plugin = make("pcie-4gpu", init_error=LIBRARY_NOT_FOUND)
    with pytest.raises(NvidiaUnavailable, match=r"^NVML not available: NVML Shared Library Not Found$"):
        plugin.discover()


def test_missing_module_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    with pytest.raises(NvidiaUnavailable, match="NVML not available: cannot import pynvml"):
        NvidiaPlugin().discover()


def test_lost_gpu_is_unhealthy() -> None:
    fake, plugin = make("dgx1-v100")
    plugin.discover()
    assert all(plugin.health().values())
    fake.lost.add(5)
    health = plugin.health()
    assert health[fake.uuids[5]] is False
    assert [u for u, ok in health.items() if not ok] == [fake.uuids[5]]
    assert fake.refs == 0


def test_health_without_nvml_marks_everything_unhealthy() -> None:
    fake, plugin = make("pcie-4gpu")
    plugin.discover()
    fake.init_error = 9  # driver not loaded
    assert plugin.health() == dict.fromkeys(fake.uuids, False)


def test_gpu_lost_at_discovery_is_skipped_and_reported() -> None:
    fake, plugin = make("pcie-4gpu", lost=(1,))
    inventory = plugin.discover()
    assert [g.index for g in inventory.devices] == [0, 2, 3]
    assert plugin.last_errors == ["GPU 1: GPU is lost"]


def test_numa_falls_back_to_sysfs(tmp_path: Any) -> None:
    fake = FakeNvml(fixture("dgx1-v100"), numa_supported=False)
    for i, bus in enumerate(fake.bus_ids):
        d = tmp_path / "sys/bus/pci/devices" / bus.lower()[4:]
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{i % 2}\n")
    inventory = NvidiaPlugin(nvml=fake, sysfs_root=str(tmp_path)).discover()
    assert [g.numa_node for g in inventory.devices] == [0, 1, 0, 1, 0, 1, 0, 1]
    # and without sysfs or memory affinity either: unknown
    fake = FakeNvml(fixture("pcie-4gpu"), numa_supported=False, memory_affinity=False)
    inventory = NvidiaPlugin(nvml=fake, sysfs_root=str(tmp_path / "empty")).discover()
    assert {g.numa_node for g in inventory.devices} == {-1}


def test_numa_from_memory_affinity_when_nvml_and_sysfs_say_nothing(tmp_path: Any) -> None:
    """Seen on a real H200 VM: NVML's NUMA id N/A, sysfs numa_node -1, nvidia-smi "NUMA Affinity" 0."""
    doc = fixture("dgx1-v100")
    fake = FakeNvml(doc, numa_supported=False)
    for bus in fake.bus_ids:
        d = tmp_path / "sys/bus/pci/devices" / bus.lower()[4:]
        d.mkdir(parents=True)
        (d / "numa_node").write_text("-1\n")
    inventory = NvidiaPlugin(nvml=fake, sysfs_root=str(tmp_path)).discover()
    assert [g.numa_node for g in inventory.devices] == [g["numa"] for g in doc["gpus"]]
    assert "memory_affinity" in fake.calls


def test_cpu_affinity_attribute() -> None:
    _, plugin = make("dgx1-v100")
    gpus = plugin.discover().devices
    assert gpus[0].attributes["cpuAffinity"] == "0-15"
    assert gpus[4].attributes["cpuAffinity"] == "16-31"


@pytest.mark.parametrize(
    ("words", "want"),
    [([], ""), ([0b1], "0"), ([0b1011], "0-1,3"), ([0, 0xFF], "64-71"), ([1 << 63, 1], "63-64")],
)
def test_cpu_list(words: list[int], want: str) -> None:
    assert cpu_list(words) == want


@pytest.mark.parametrize(
    ("level", "want"),
    [(0, "PIX"), (10, "PIX"), (20, "PXB"), (30, "PHB"), (40, "NODE"), (50, "SYS"), (99, "SYS")],
)
def test_pcie_relation_from_nvml(level: int, want: str) -> None:
    assert pcie_relation_from_nvml(level) is PCIeRelation[want]


def test_nvlink_counts_pure() -> None:
    def gpu(i: int, links: list[NvLink]) -> GpuInfo:
        return GpuInfo(i, f"GPU-{i}", "g", 1, i, f"0000:0{i}:00.0", nvlinks=tuple(links))

    gpus = [
        gpu(0, [NvLink("0000:01:00.0", 0), NvLink("0000:01:00.0", 0), NvLink("0000:ff:00.0", 1)]),
        gpu(1, [NvLink("0000:00:00.0", 0), NvLink("0000:00:00.0", 0)]),
        gpu(2, []),
    ]
    # the NPU link (type 1) connects no GPUs; GPU 2 has no links
    assert nvlink_counts(gpus) == {("GPU-0", "GPU-1"): 2}


def test_module_constants_agree_with_pynvml() -> None:
    """The ABI numbers the plugin hardcodes are the ones nvidia-ml-py has."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        pynvml = pytest.importorskip("pynvml")
    for name in (
        "NVML_TOPOLOGY_INTERNAL", "NVML_TOPOLOGY_SINGLE", "NVML_TOPOLOGY_MULTIPLE",
        "NVML_TOPOLOGY_HOSTBRIDGE", "NVML_TOPOLOGY_NODE", "NVML_TOPOLOGY_SYSTEM",
        "NVML_NVLINK_DEVICE_TYPE_GPU", "NVML_NVLINK_DEVICE_TYPE_IBMNPU", "NVML_NVLINK_DEVICE_TYPE_SWITCH",
    ):
        assert getattr(nvidia, name) == getattr(pynvml, name), name


# --- nvidia_check ------------------------------------------------------------------------------


def _numbers(path: str) -> tuple[int, int] | None:
    """A healthy host's device numbers (uvm gets a dynamic major)."""
    if path.startswith("/dev/nvidia-uvm"):
        return (508, 0 if path == "/dev/nvidia-uvm" else 1)
    return (195, 255) if path == "/dev/nvidiactl" else (195, int(path.removeprefix("/dev/nvidia")))


def test_check_reports_missing_device_nodes() -> None:
    _, plugin = make("pcie-4gpu")
    report, problems = nvidia_check.check(plugin, lambda p: None if p == "/dev/nvidia2" else _numbers(p))
    assert problems == ["device node /dev/nvidia2 is not a character device on this host"]
    assert len(report["inventory"]["devices"]) == 4
    assert report["deviceNodes"][report["inventory"]["devices"][0]["id"]] == ["/dev/nvidia0"]


def test_check_all_good() -> None:
    _, plugin = make("dgx-a100")
    report, problems = nvidia_check.check(plugin, _numbers)
    assert problems == []
    assert all(report["health"].values())


def test_check_device_numbers_and_nvidiactl() -> None:
    problems = nvidia_check.device_node_problems(["/dev/nvidia1", "/dev/nvidia-uvm"], lambda path: (195, 3))
    assert problems == [
        "device node /dev/nvidia1 is 195:3, want 195:1",
        "/dev/nvidiactl is missing on this host",
    ]
    assert nvidia_check.device_node_problems([], lambda path: None) == []
    assert nvidia_check.char_device_numbers("/dev/null") == (1, 3)
    assert nvidia_check.char_device_numbers("/nonexistent") is None


def test_check_main_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeNvml(fixture("pcie-4gpu"))
    assert nvidia_check.main([], nvml=fake) == 1  # /dev/nvidia0 is not on this machine
    out, err = capsys.readouterr()
    assert json.loads(out)["inventory"]["devices"][0]["id"] == fake.uuids[0]
    assert "problem: device node /dev/nvidia0" in err
    assert nvidia_check.main([], nvml=FakeNvml(fixture("pcie-4gpu"), init_error=LIBRARY_NOT_FOUND)) == 2
    assert capsys.readouterr().err.strip() == "NVML not available: NVML Shared Library Not Found"


def test_unexpected_nvml_failure_is_a_plugin_error() -> None:
    from devices.plugin import PluginError

    fake, plugin = make("pcie-4gpu")

    def broken() -> int:
        raise FakeNVMLError(9)

    fake.nvmlDeviceGetCount = broken
    with pytest.raises(PluginError, match="nvidia: NVML call failed: NVML error 9"):
        plugin.discover()
    assert fake.refs == 0
