"""The NodeGpuMetric contract: a node's live GPU readings as its agent writes and the scheduler reads them.

One cluster-scoped object per node (``kubegpu.io/v1alpha1``, kind ``NodeGpuMetric``, named after the
node; the CRD is ``deploy/crds/kubegpu.io_nodegpumetrics.yaml``; docs/utilisation.md is the
contract). ``status.updateTime`` is when the readings were sampled; ``status.gpus`` lists each GPU
by inventory ``id`` and ``index`` with its moving-average ``utilization`` (%) and ``memoryUsedMiB``,
``memoryTotalMiB``, and where read ``temperatureC``, ``powerW``, ``eccUncorrected``, ``xid`` and
``lost``. ``spec`` says how the agent publishes (``reportIntervalSeconds``, ``refreshSeconds``).

``document`` builds the object the agent writes; ``parse`` reads one back for the scheduler and
raises ``ValueError`` naming the field for anything a GPU could not report (the CRD's schema
already refuses most of it; a reader never trusts that).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

GROUP = "kubegpu.io"
VERSION = "v1alpha1"
PLURAL = "nodegpumetrics"
KIND = "NodeGpuMetric"
API_VERSION = f"{GROUP}/{VERSION}"
MAX_GPUS = 128
MAX_ID_CHARS = 128
MAX_INDEX = 4095
MAX_MEMORY_MIB = 16 * 1024 * 1024  # 16 TiB per GPU, as nodecheck's limit
# eccUncorrected and xid: any whole number the API stores (the CRD's int64); a tighter cap would
# make a report with a larger one unreadable, and its faulted GPU unknown (in placement)
MAX_COUNTER = (1 << 63) - 1
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
# updateTime outside these is no node's clock: unreadable (a time near year 9999 would overflow
# the reader's arithmetic, as adding the staleness bound)
EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(9000, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class GpuReport:
    """One GPU as published (None: not read)."""

    id: str
    index: int
    utilization: float | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    ecc_uncorrected: int | None = None
    xid: int | None = None
    lost: bool = False

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"id": self.id, "index": self.index}
        for key, value in (
            ("utilization", self.utilization),
            ("memoryUsedMiB", self.memory_used_mib),
            ("memoryTotalMiB", self.memory_total_mib),
            ("temperatureC", self.temperature_c),
            ("powerW", self.power_w),
            ("eccUncorrected", self.ecc_uncorrected),
            ("xid", self.xid),
        ):
            if value is not None:
                doc[key] = value
        if self.lost:
            doc["lost"] = True
        return doc


@dataclass(frozen=True)
class NodeReport:
    """A parsed NodeGpuMetric: the node, when its readings were sampled, each GPU by id."""

    node: str
    update_time: dt.datetime
    gpus: Mapping[str, GpuReport]


def stamp(when: dt.datetime) -> str:
    """RFC 3339 UTC, to the second (as the heartbeat annotation)."""
    return when.astimezone(dt.UTC).strftime(TIME_FORMAT)


def document(
    node: str,
    gpus: Sequence[GpuReport],
    update_time: dt.datetime,
    interval: float,
    refresh: float,
    owner_uid: str | None = None,
) -> dict[str, Any]:
    """The NodeGpuMetric object for ``node`` (owned by its Node when ``owner_uid`` is known, so it
    goes when the Node goes)."""
    metadata: dict[str, Any] = {"name": node}
    if owner_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": owner_uid}]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {"reportIntervalSeconds": interval, "refreshSeconds": refresh},
        "status": {"updateTime": stamp(update_time), "gpus": [g.to_dict() for g in gpus]},
    }


def _number(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where} is not a number ({str(value)[:40]!r})")
    if not low <= value <= high:
        raise ValueError(f"{where}={value:g} is outside {low:g}..{high:g}")
    return float(value)


def _whole(value: Any, where: str, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise ValueError(f"{where} must be a whole number 0..{high} ({str(value)[:40]!r})")
    return value


# each optional reading: its key in the object, its GpuReport field and how it is read (the range kept)
_READINGS: tuple[tuple[str, str, Any], ...] = (
    ("utilization", "utilization", lambda v, w: _number(v, w, 0, 100)),
    ("memoryUsedMiB", "memory_used_mib", lambda v, w: _whole(v, w, MAX_MEMORY_MIB)),
    ("memoryTotalMiB", "memory_total_mib", lambda v, w: _whole(v, w, MAX_MEMORY_MIB)),
    ("temperatureC", "temperature_c", lambda v, w: _number(v, w, -273, 1000)),
    ("powerW", "power_w", lambda v, w: _number(v, w, 0, 100_000)),
    ("eccUncorrected", "ecc_uncorrected", lambda v, w: _whole(v, w, MAX_COUNTER)),
    ("xid", "xid", lambda v, w: _whole(v, w, MAX_COUNTER)),
)


def publishable(report: GpuReport) -> GpuReport:
    """The report with every reading ``parse`` would refuse (an NVML glitch: 10^6 W, 5,000 C, NaN)
    left out as not read, so one bad gauge never makes the node's whole report unreadable."""
    kept: dict[str, Any] = {}
    for key, name, read in _READINGS:
        value = getattr(report, name)
        if value is None:
            continue
        try:
            read(value, key)
        except ValueError:
            kept[name] = None
    return replace(report, **kept) if kept else report


def _gpu(raw: Any, where: str) -> GpuReport:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} is not an object")
    ident = raw.get("id")
    if not isinstance(ident, str) or not ident or len(ident) > MAX_ID_CHARS or not ident.isprintable():
        raise ValueError(f"{where}.id is not a device id")
    optional: dict[str, Any] = {}
    for key, name, read in _READINGS:
        if raw.get(key) is not None:
            optional[name] = read(raw[key], f"{where}.{key}")
    lost = raw.get("lost", False)
    if not isinstance(lost, bool):
        raise ValueError(f"{where}.lost is not true or false")
    return GpuReport(ident, _whole(raw.get("index"), f"{where}.index", MAX_INDEX), lost=lost, **optional)


def parse(obj: Mapping[str, Any]) -> NodeReport:
    """A NodeGpuMetric object as read from the API; ValueError names what no node could report."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ValueError("metadata.name is missing")
    status = obj.get("status")
    if not isinstance(status, Mapping):
        raise ValueError("status is missing")
    raw_time = status.get("updateTime")
    try:
        when = dt.datetime.fromisoformat(raw_time) if isinstance(raw_time, str) else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise ValueError(f"status.updateTime is not an RFC 3339 time ({str(raw_time)[:40]!r})")
    try:
        when = when.astimezone(dt.UTC)
    except OverflowError:  # a time at year 1 or 9999 whose offset moves it off the calendar
        when = None
    if when is None or not EARLIEST <= when < LATEST:
        raise ValueError(
            f"status.updateTime is outside {EARLIEST.year}..{LATEST.year - 1} ({str(raw_time)[:40]!r})"
        )
    raw_gpus = status.get("gpus", [])
    if not isinstance(raw_gpus, list) or len(raw_gpus) > MAX_GPUS:
        raise ValueError(f"status.gpus must be a list of at most {MAX_GPUS}")
    gpus: dict[str, GpuReport] = {}
    for k, raw in enumerate(raw_gpus):
        gpu = _gpu(raw, f"status.gpus[{k}]")
        if gpu.id in gpus:
            raise ValueError(f"status.gpus[{k}]: GPU {gpu.id} is listed twice")
        gpus[gpu.id] = gpu
    return NodeReport(name, when, gpus)
