"""XID critical errors from NVML's event API, for the NVIDIA plugin's telemetry.

NVML reports XIDs (the driver's error codes for a GPU) only as events: an event set
(``nvmlEventSetCreate``) on which each GPU is registered for ``nvmlEventTypeXidCriticalError``
(``nvmlDeviceRegisterEvents``), read with ``nvmlEventSetWait``. ``XidWatch.read`` does that once
per telemetry round: it creates the set on first use, registers every GPU it has not seen, then
drains what is queued with a 0 ms wait, so a round never blocks (``NVML_ERROR_TIMEOUT`` means the
queue is empty). The set lives across rounds (XIDs between two rounds are queued, not lost), so the
watch holds one NVML reference (``nvmlInit``) from the set's creation until ``close``.

Per GPU, ``read`` gives the last XID seen since the watch started (0: none), or None where it
cannot be read: NVML or the pynvml module has no event API, or the GPU cannot register
(``NVML_ERROR_NOT_SUPPORTED``, common on vGPU and some consumer GPUs). An XID is kept (as NVIDIA's
Kubernetes device plugin keeps a GPU unhealthy after one) until the node agent restarts, except
that a later GPU fault replaces it; an application XID (``telemetry.APPLICATION_XIDS``) never
replaces a GPU fault, so a fault cannot be hidden by a later page fault of a program.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from devices.telemetry import APPLICATION_XIDS

log = logging.getLogger(__name__)

# NVML ABI constants (nvml.h)
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
MAX_EVENTS_PER_READ = 256  # a storm of events is drained over several rounds, never in a loop without end


def _code(error: Exception) -> Any:
    return getattr(error, "value", None)


def kept(stored: int, new: int) -> int:
    """The XID to keep when ``new`` arrives after ``stored``: the latest, unless that would replace a
    GPU fault with an application error."""
    if stored and stored not in APPLICATION_XIDS and new in APPLICATION_XIDS:
        return stored
    return new


class XidWatch:
    """One node's XID event set (module docstring). Not thread-safe: one telemetry round at a time."""

    def __init__(self) -> None:
        self._set: Any = None
        self._held = False  # the NVML reference kept for the set
        self._disabled = ""  # why XIDs cannot be read on this node ('' while they can)
        self.last: dict[str, int | None] = {}  # GPU UUID -> last XID (0 none), None: cannot register
        self._wait_error: Any = None  # the last wait error logged (logged once per kind)

    @property
    def disabled(self) -> str:
        return self._disabled

    def read(self, nvml: Any, handles: Mapping[str, Any]) -> dict[str, int | None]:
        """Per GPU UUID in ``handles`` (its NVML handle, from the caller's session): the last XID
        seen, 0 for none, None where XIDs cannot be read. Never blocks; NVML errors are logged."""
        if not self._disabled and self._set is None:
            self._open(nvml)
        if self._disabled:
            return dict.fromkeys(handles)
        for uuid, handle in handles.items():
            if uuid not in self.last:
                self._register(nvml, uuid, handle)
        self._drain(nvml)
        return {uuid: self.last.get(uuid) for uuid in handles}

    def _open(self, nvml: Any) -> None:
        create = getattr(nvml, "nvmlEventSetCreate", None)
        register = getattr(nvml, "nvmlDeviceRegisterEvents", None)
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or getattr(nvml, "nvmlEventSetWait", None)
        if create is None or register is None or wait is None:
            self._disable("the pynvml module has no event API (nvmlEventSetCreate, nvmlEventSetWait)")
            return
        try:
            nvml.nvmlInit()  # held: the set must outlive the caller's session
        except Exception as error:  # noqa: BLE001 - the caller's session just initialised NVML
            self._disable(f"nvmlInit: {error}")
            return
        self._held = True
        try:
            self._set = create()
        except nvml.NVMLError as error:
            why = "not supported" if _code(error) == NVML_ERROR_NOT_SUPPORTED else str(error)
            self._disable(f"nvmlEventSetCreate: {why}")
            self._release(nvml)

    def _register(self, nvml: Any, uuid: str, handle: Any) -> None:
        try:
            nvml.nvmlDeviceRegisterEvents(handle, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, self._set)
        except nvml.NVMLError as error:
            why = "not supported" if _code(error) == NVML_ERROR_NOT_SUPPORTED else str(error)
            log.warning("nvidia: GPU %s: XID events cannot be registered (%s): XIDs not read", uuid, why)
            self.last[uuid] = None
            return
        self.last[uuid] = 0

    def _drain(self, nvml: Any) -> None:
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                event = wait(self._set, 0)
            except nvml.NVMLError as error:
                code = _code(error)
                if code != NVML_ERROR_TIMEOUT and code != self._wait_error:
                    log.warning("nvidia: reading XID events: %s", error)
                self._wait_error = None if code == NVML_ERROR_TIMEOUT else code
                return
            if not int(event.eventType) & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                continue
            try:
                raw = nvml.nvmlDeviceGetUUID(event.device)
            except nvml.NVMLError as error:
                log.warning("nvidia: XID %d on a GPU NVML cannot name: %s", int(event.eventData), error)
                continue
            uuid = raw.decode() if isinstance(raw, bytes) else str(raw)
            code = int(event.eventData)
            before = self.last.get(uuid) or 0
            self.last[uuid] = kept(before, code)
            log.warning("nvidia: GPU %s: XID %d", uuid, code)

    def _disable(self, why: str) -> None:
        self._disabled = why
        log.warning("nvidia: XID errors are not read: %s", why)

    def _release(self, nvml: Any) -> None:
        if self._held:
            self._held = False
            try:
                nvml.nvmlShutdown()
            except Exception as error:  # noqa: BLE001 - releasing must not raise
                log.debug("nvmlShutdown: %s", error)

    def close(self, nvml: Any) -> None:
        """Free the event set and the NVML reference it held; a later ``read`` starts again."""
        if self._set is not None:
            free = getattr(nvml, "nvmlEventSetFree", None)
            try:
                if free is not None:
                    free(self._set)
            except nvml.NVMLError as error:
                log.debug("nvmlEventSetFree: %s", error)
            self._set = None
        self._release(nvml)
        self.last.clear()
