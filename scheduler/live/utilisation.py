"""What the scheduler trusts of a node's published GPU readings (``NodeGpuMetric``, docs/utilisation.md).

Pure functions from a parsed report (``kubegpu.livemetrics.NodeReport``) and the scheduler's clock
to the core's ``LiveGpu`` per GPU:

- **Fresh** (sampled at most ``stale_after`` seconds ago): utilisation and memory in use as
  published.
- **Stale** (older), or **from the future** (more than ``nodecheck.CLOCK_SKEW_SECONDS`` ahead: a
  node clock that far off would never go stale): utilisation and memory are unknown, never
  trusted (the ``utilization`` score counts them as 100 % busy; the memory guard falls back to the
  books).
- **Unfit** (``unfit_reason``): a GPU published lost, with uncorrectable ECC errors, or whose last
  XID is a GPU fault is taken out of placement. This holds for a stale report too: an old word
  that a GPU is broken is not taken back until a report says otherwise (fail closed).

XIDs that NVIDIA's Kubernetes device plugin treats as application errors (the GPU stays healthy:
13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive
cleanup, 68 video processor exception, 109 context switch timeout) leave the GPU in placement.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from devices.telemetry import APPLICATION_XIDS
from kubegpu.livemetrics import GpuReport, NodeReport
from scheduler.core.state import LiveGpu
from scheduler.live.nodecheck import CLOCK_SKEW_SECONDS


def unfit_reason(gpu: GpuReport) -> str:
    """Why the node's report takes this GPU out of placement ('' when it does not)."""
    if gpu.lost:
        return "lost (the driver lost the GPU)"
    if gpu.ecc_uncorrected:
        return f"{gpu.ecc_uncorrected} uncorrectable ECC error(s) since the driver loaded"
    if gpu.xid and gpu.xid not in APPLICATION_XIDS:
        return f"XID {gpu.xid}"
    return ""


def distrust(report: NodeReport, now: dt.datetime, stale_after: float) -> str:
    """Why the report's readings are not trusted now ('' when they are fresh)."""
    age = (now - report.update_time).total_seconds()
    if age < -CLOCK_SKEW_SECONDS:
        return f"sampled {-age:.0f}s in the future of the scheduler's clock"
    if age > stale_after:
        return f"sampled {age:.0f}s ago (stale after {stale_after:g}s)"
    return ""


def live_readings(report: NodeReport, trusted: bool) -> dict[str, LiveGpu]:
    """GPU id -> what the core takes of the report (``trusted``: fresh; else only unfitness)."""
    out: dict[str, LiveGpu] = {}
    for gid, gpu in report.gpus.items():
        unfit = unfit_reason(gpu)
        if trusted:
            out[gid] = LiveGpu(gpu.utilization, gpu.memory_used_mib, unfit)
        else:
            out[gid] = LiveGpu(unfit=unfit)
    return out


def unfit_gpus(readings: Mapping[str, LiveGpu]) -> dict[str, str]:
    """GPU id -> why it is out of placement, for the GPUs that are."""
    return {gid: r.unfit for gid, r in readings.items() if r.unfit}
