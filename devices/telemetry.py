"""Live GPU telemetry: what a GPU is doing now, as opposed to what it is allocated to.

``GpuTelemetry`` is one reading of one GPU (utilisation, memory in use, temperature, power, error
counters, lost), the same fields from every plugin that has them: the NVIDIA plugin reads NVML,
the simulated plugin a metrics file (``parse_metrics_file``) so tests and demos can make a GPU
hot. A field a device cannot report is None, never a made-up zero. ``Smoother`` keeps an
exponential moving average per GPU of the gauges (utilisation, memory, temperature, power); the
counters and ``lost`` are always the latest reading.

The metrics file (the sim plugin's ``<state dir>/metrics.json``) is a JSON object keyed by GPU id
(or ``gpuN``, the GPU's index), each an object of any of: ``utilization`` (percent, 0..100),
``memoryUsedMiB`` (0..the GPU's memory), ``temperatureC`` (-50..150), ``powerW`` (0..5000),
``eccErrors`` and ``xid`` (whole numbers >= 0), ``lost`` (true/false). GPUs it does not name read
as idle: 0 % and no memory in use. A key given twice (a GPU, or a field of one) is an error.
Anything else is a ``TelemetryError`` naming the file and the entry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

# XIDs that NVIDIA's Kubernetes device plugin treats as application errors, the GPU staying healthy
# (13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive
# cleanup, 68 video processor exception, 109 context switch timeout); any other XID is a GPU fault.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


class TelemetryError(ValueError):
    """A telemetry source says something no GPU could; the message names where and what."""


@dataclass(frozen=True)
class GpuTelemetry:
    """One reading of one GPU."""

    utilization: float  # percent of the sample period a kernel ran (NVML's utilization.gpu)
    memory_used_mib: float
    memory_total_mib: int
    temperature_c: float | None = None
    power_w: float | None = None
    ecc_uncorrected: int | None = None  # uncorrectable ECC errors since the driver loaded
    xid: int | None = None  # the last XID error code seen (0: none)
    lost: bool = False  # the driver lost the GPU: nothing else it says counts

    @property
    def memory_free_mib(self) -> float:
        return max(0.0, self.memory_total_mib - self.memory_used_mib)


# field -> (name in the metrics file, low, high); None high: the GPU's memory
_GAUGES: dict[str, tuple[str, float, float | None]] = {
    "utilization": ("utilization", 0, 100),
    "memory_used_mib": ("memoryUsedMiB", 0, None),
    "temperature_c": ("temperatureC", -50, 150),
    "power_w": ("powerW", 0, 5000),
}
_COUNTERS = {"ecc_uncorrected": "eccErrors", "xid": "xid"}
_KNOWN = {name for name, _, _ in _GAUGES.values()} | set(_COUNTERS.values()) | {"lost"}
MAX_METRICS_BYTES = 1 << 20


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TelemetryError(f"{where} must be a finite number, got {value!r}"[:200])
    return float(value)


def _entry(raw: Any, where: str, memory_total_mib: int) -> GpuTelemetry:
    if not isinstance(raw, Mapping):
        raise TelemetryError(f"{where} must be an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise TelemetryError(f"{where}: unknown field(s) {', '.join(map(str, unknown))[:120]}")
    values: dict[str, Any] = {"utilization": 0.0, "memory_used_mib": 0.0}
    for field_name, (key, low, high) in _GAUGES.items():
        if key not in raw:
            continue
        value = _number(raw[key], f"{where}.{key}")
        top = memory_total_mib if high is None else high
        if not low <= value <= top:
            raise TelemetryError(f"{where}.{key}={value:g} is outside {low:g}..{top:g}")
        values[field_name] = value
    for field_name, key in _COUNTERS.items():
        if key not in raw:
            continue
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TelemetryError(f"{where}.{key} must be a whole number >= 0, got {value!r}"[:200])
        values[field_name] = value
    if "lost" in raw:
        if not isinstance(raw["lost"], bool):
            raise TelemetryError(f"{where}.lost must be true or false, got {raw['lost']!r}"[:200])
        values["lost"] = raw["lost"]
    return GpuTelemetry(memory_total_mib=memory_total_mib, **values)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are unique (JSON itself would keep the last of a repeated key)."""
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            raise TelemetryError(f"{key[:80]!r} is named twice")
        doc[key] = value
    return doc


def parse_metrics_file(
    text: str, gpus: Sequence[tuple[str, int, int]], source: str = "metrics file"
) -> dict[str, GpuTelemetry]:
    """GPU id -> reading, from a metrics file's text; ``gpus`` are (id, index, memory MiB).

    Raises TelemetryError naming ``source`` for anything malformed or naming no listed GPU.
    """
    if len(text) > MAX_METRICS_BYTES:
        raise TelemetryError(f"{source}: {len(text)} bytes (at most {MAX_METRICS_BYTES})")
    try:
        doc = json.loads(text, object_pairs_hook=_unique_keys) if text.strip() else {}
    except TelemetryError as error:
        raise TelemetryError(f"{source}: {error}") from None
    except ValueError as error:
        raise TelemetryError(f"{source}: not JSON: {error}") from None
    if not isinstance(doc, dict):
        raise TelemetryError(f"{source}: must be a JSON object keyed by GPU id")
    by_key = {gid: (gid, memory) for gid, _, memory in gpus}
    by_key.update({f"gpu{index}": (gid, memory) for gid, index, memory in gpus})
    readings = {gid: GpuTelemetry(0.0, 0.0, memory) for gid, _, memory in gpus}
    named: set[str] = set()
    for key, raw in doc.items():
        found = by_key.get(key)
        if found is None:
            raise TelemetryError(f"{source}: {str(key)[:80]!r} is not a GPU of this node")
        gid, memory = found
        if gid in named:
            raise TelemetryError(f"{source}: GPU {gid} is named twice")
        named.add(gid)
        readings[gid] = _entry(raw, f"{source}: {key}", memory)
    return readings


class Smoother:
    """Exponential moving average per GPU of the gauges; counters and ``lost`` as last read.

    ``alpha`` is the weight of the newest reading (1: no smoothing). A GPU missing from a round
    is dropped (its plugin could not read it); a lost GPU restarts its average when it returns.
    """

    def __init__(self, alpha: float = 0.3) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.current: dict[str, GpuTelemetry] = {}

    def update(self, readings: Mapping[str, GpuTelemetry]) -> dict[str, GpuTelemetry]:
        a = self.alpha
        fresh: dict[str, GpuTelemetry] = {}
        for gid, new in readings.items():
            old = self.current.get(gid)
            if old is None or old.lost or new.lost:
                fresh[gid] = new
                continue

            def blend(before: float | None, now: float | None) -> float | None:
                if before is None or now is None:
                    return now
                return a * now + (1 - a) * before

            fresh[gid] = replace(
                new,
                utilization=a * new.utilization + (1 - a) * old.utilization,
                memory_used_mib=a * new.memory_used_mib + (1 - a) * old.memory_used_mib,
                temperature_c=blend(old.temperature_c, new.temperature_c),
                power_w=blend(old.power_w, new.power_w),
            )
        self.current = fresh
        return fresh
