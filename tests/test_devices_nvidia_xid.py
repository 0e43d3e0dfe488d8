"""XID critical errors from NVML's event API (devices/nvidia_xid.py) in the NVIDIA plugin's telemetry,
against a fake NVML with an event set: read without ever blocking, kept across rounds, NOT_SUPPORTED
and TIMEOUT handled, and an XID that marks a GPU fault makes the GPU unfit as the scheduler reads it.
Verified against this fake only; a real-GPU check is pending a device session."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from crishim.gpumetrics import GpuTelemetrySampler
from crishim.metricspublisher import report_of
from devices.model import DeviceKind
from devices.nvidia import NvidiaPlugin
from devices.nvidia_xid import MAX_EVENTS_PER_READ, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, XidWatch, kept
from scheduler.live.utilisation import unfit_reason
from tests.test_devices_nvidia import GPU_IS_LOST, NOT_SUPPORTED, FakeNVMLError, fixture
from tests.test_devices_telemetry import TelemetryNvml

TIMEOUT = 10  # NVML_ERROR_TIMEOUT


class EventNvml(TelemetryNvml):
    """The fake NVML with an event set: ``queue`` holds the events NVML would deliver; GPUs in
    ``no_events`` cannot register; ``create_error`` / ``wait_error`` make those calls fail."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue: list[SimpleNamespace] = []
        self.no_events: set[int] = set()
        self.create_error: int | None = None
        self.wait_error: int | None = None
        self.sets: list[object] = []
        self.registered: dict[int, int] = {}
        self.waits: list[int] = []

    def xid(self, index: int, code: int, event_type: int = NVML_EVENT_TYPE_XID_CRITICAL_ERROR) -> None:
        self.queue.append(
            SimpleNamespace(device=SimpleNamespace(index=index), eventType=event_type, eventData=code)
        )

    def nvmlEventSetCreate(self) -> object:
        self._check("event_set_create")
        if self.create_error is not None:
            raise FakeNVMLError(self.create_error)
        event_set = object()
        self.sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: SimpleNamespace, types: int, event_set: object) -> None:
        self._check("register_events")
        assert event_set in self.sets and types == NVML_EVENT_TYPE_XID_CRITICAL_ERROR
        if handle.index in self.no_events:
            raise FakeNVMLError(NOT_SUPPORTED)
        self.registered[handle.index] = types

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        self._check("event_set_wait")
        assert event_set in self.sets
        self.waits.append(timeout_ms)
        if self.wait_error is not None:
            raise FakeNVMLError(self.wait_error)
        while self.queue:
            event = self.queue.pop(0)
            if event.device.index in self.registered:  # NVML delivers registered GPUs' events only
                return event
        raise FakeNVMLError(TIMEOUT)

    def nvmlEventSetFree(self, event_set: object) -> None:
        self.sets.remove(event_set)


def plugin_on(fake: EventNvml) -> NvidiaPlugin:
    return NvidiaPlugin(nvml=fake, exists=lambda path: True, cpu_count=64)


def xids(plugin: NvidiaPlugin) -> list[int | None]:
    readings = plugin.telemetry()
    fake = plugin.nvml
    return [readings[uuid].xid for uuid in fake.uuids]


def test_xids_are_read_from_the_event_set_without_ever_blocking() -> None:
    fake = EventNvml(fixture("pcie-4gpu"))
    fake.no_events.add(3)  # this GPU cannot register (NOT_SUPPORTED): its XIDs are not read
    plugin = plugin_on(fake)
    assert xids(plugin) == [0, 0, 0, None]
    assert len(fake.sets) == 1 and set(fake.registered) == {0, 1, 2}
    fake.xid(2, 79)  # fallen off the bus: a GPU fault
    fake.xid(1, 13)  # graphics engine exception: an application error
    fake.xid(3, 48)  # never delivered: not registered
    assert xids(plugin) == [0, 13, 79, None]
    assert xids(plugin) == [0, 13, 79, None]  # kept across rounds
    fake.xid(2, 31)  # a later page fault does not hide the fault
    fake.xid(1, 48)  # a double-bit ECC error replaces the application error
    assert xids(plugin) == [0, 48, 79, None]
    assert set(fake.waits) == {0} and fake.calls.count("event_set_create") == 1
    assert fake.refs == 1  # the one reference held for the event set; every session closed


def test_an_event_of_another_type_is_skipped_and_a_storm_is_drained_over_rounds() -> None:
    fake = EventNvml(fixture("pcie-4gpu"))
    plugin = plugin_on(fake)
    plugin.telemetry()
    fake.xid(0, 79, event_type=0x1)  # a single-bit ECC event: not an XID
    for _ in range(MAX_EVENTS_PER_READ + 10):
        fake.xid(1, 13)
    fake.xid(1, 79)
    assert xids(plugin)[:2] == [0, 13]  # at most MAX_EVENTS_PER_READ this round: never an endless loop
    assert xids(plugin)[:2] == [0, 79]


@pytest.mark.parametrize("error", [NOT_SUPPORTED, 999])
def test_an_event_set_nvml_cannot_create_leaves_xids_unread_and_is_not_tried_again(
    error: int, caplog: pytest.LogCaptureFixture
) -> None:
    fake = EventNvml(fixture("pcie-4gpu"))
    fake.create_error = error
    plugin = plugin_on(fake)
    with caplog.at_level(logging.WARNING, logger="devices.nvidia_xid"):
        assert xids(plugin) == [None] * 4
        assert xids(plugin) == [None] * 4
    assert fake.calls.count("event_set_create") == 1 and fake.refs == 0  # the held reference given back
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("nvidia: XID errors are not read: nvmlEventSetCreate")
    reading = plugin.telemetry()[fake.uuids[0]]
    assert reading.utilization == 5.0  # the other readings are unaffected


def test_a_wait_error_other_than_timeout_is_logged_once_and_the_round_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = EventNvml(fixture("pcie-4gpu"))
    plugin = plugin_on(fake)
    plugin.telemetry()
    fake.wait_error = GPU_IS_LOST
    with caplog.at_level(logging.WARNING, logger="devices.nvidia_xid"):
        assert xids(plugin) == [0, 0, 0, 0]
        assert xids(plugin) == [0, 0, 0, 0]
    assert [r.getMessage() for r in caplog.records] == ["nvidia: reading XID events: GPU is lost"]
    fake.wait_error = None
    fake.xid(0, 94)
    assert xids(plugin)[0] == 94


def test_a_module_without_the_event_api_reads_no_xid() -> None:
    fake = TelemetryNvml(fixture("pcie-4gpu"))
    plugin = NvidiaPlugin(nvml=fake, exists=lambda path: True, cpu_count=64)
    assert {r.xid for r in plugin.telemetry().values()} == {None} and fake.refs == 0


def test_close_frees_the_set_and_the_reference() -> None:
    fake = EventNvml(fixture("pcie-4gpu"))
    watch = XidWatch()
    fake.nvmlInit()
    handles = {fake.uuids[i]: SimpleNamespace(index=i) for i in range(2)}
    assert watch.read(fake, handles) == dict.fromkeys(handles, 0)
    fake.nvmlShutdown()
    assert fake.refs == 1 and len(fake.sets) == 1
    watch.close(fake)
    assert fake.refs == 0 and fake.sets == [] and watch.last == {}


def test_which_xid_is_kept() -> None:
    assert kept(0, 13) == 13 and kept(13, 79) == 79 and kept(79, 13) == 79 and kept(79, 48) == 48


def test_an_xid_from_nvml_makes_the_gpu_unfit_as_the_scheduler_reads_it() -> None:
    """Through the node agent's sampler and what its publisher writes, to the scheduler's rule."""
    fake = EventNvml(fixture("pcie-4gpu"), unsupported=("ecc",))  # the fake's ECC counts would say unfit
    plugin = plugin_on(fake)
    gpus = [d for d in plugin.discover().by_kind(DeviceKind.GPU)]
    sampler = GpuTelemetrySampler("node-x", [plugin], lambda: gpus, lambda: [], interval=1)

    def unfit() -> list[str]:
        asyncio.run(sampler.sample_once())
        assert not sampler.last_error, sampler.last_error
        return [unfit_reason(report_of(row)) for row in sorted(sampler.rows, key=lambda r: r.device.index)]

    assert unfit() == ["", "", "", ""]
    fake.xid(1, 13)  # an application error: the GPU stays in placement
    fake.xid(2, 79)
    assert unfit() == ["", "", "XID 79", ""]
