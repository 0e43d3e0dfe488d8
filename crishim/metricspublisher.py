"""The node agent's side of utilisation-aware placement: publish the GPUs' smoothed readings.

Every ``interval`` seconds (default 30) the publisher compares the sampler's last round (the
moving averages of ``crishim.gpumetrics.GpuTelemetrySampler``) with what it last wrote to the
node's ``NodeGpuMetric`` (``kubegpu.livemetrics``, docs/utilisation.md) and writes only when
``publish_reason`` says so:

- a GPU appeared or went, or its health fields changed (``lost``, ``xid``, ``eccUncorrected``):
  always, so an unfit GPU leaves placement within one interval;
- a GPU's utilisation moved ``utilization_points`` (5) or more from what was written, or its memory
  in use ``memory_percent`` (5) % of its memory or more, and either had moved that far at the
  previous comparison too or moved twice as far now: a job starting or ending is written at once, a
  reading that only wobbles across the threshold is not;
- the last write is ``refresh`` seconds old (300) and the sampler has read since: so the scheduler
  can tell a quiet node from a silent one (its staleness bound must exceed ``refresh``).

A round the sampler could not read is never republished as new: the object's ``updateTime`` is when
the readings were sampled. One write is one merge patch of the object (created, owned by the Node,
the first time or when it is gone). API errors are logged and retried next interval. It runs in its
own thread, like the advertiser: a slow API never delays a CRI call.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.client.rest import ApiException

from crishim.gpumetrics import GpuRow
from crishim.publishloop import PeriodicPublisher
from kubegpu import livemetrics
from kubegpu.livemetrics import GpuReport, publishable
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.crishim.metricspublisher")

MERGE_PATCH = "application/merge-patch+json"
NOT_FOUND = 404
CONFLICT = 409


@dataclass(frozen=True)
class PublishPolicy:
    """When the agent writes (module docstring); every figure > 0 except the thresholds (>= 0)."""

    interval: float = 30.0
    refresh: float = 300.0
    utilization_points: float = 5.0
    memory_percent: float = 5.0


def report_of(row: GpuRow) -> GpuReport:
    """What is published of one GPU's last round: its moving averages (utilisation to 0.1 point,
    memory to the MiB), the counters and ``lost`` as last read; a reading the scheduler would refuse
    is left out (``livemetrics.publishable``)."""
    t = row.average
    return publishable(
        GpuReport(
            id=row.device.id,
            index=row.device.index,
            utilization=None if t.lost else round(t.utilization, 1),
            memory_used_mib=None if t.lost else int(round(t.memory_used_mib)),
            memory_total_mib=t.memory_total_mib or None,
            temperature_c=None if t.temperature_c is None or t.lost else round(t.temperature_c, 1),
            power_w=None if t.power_w is None or t.lost else round(t.power_w, 1),
            ecc_uncorrected=t.ecc_uncorrected,
            xid=t.xid,
            lost=t.lost,
        )
    )


def _health(g: GpuReport) -> tuple[Any, ...]:
    """The health fields, with "not read" and "none" alike (no XID, no ECC error)."""
    return (g.lost, g.xid or 0, g.ecc_uncorrected or 0)


def _moved(now: float | None, written: float | None, before: float | None, threshold: float) -> bool:
    """``now`` moved ``threshold`` or more from ``written`` and stays there: also at the previous
    comparison (``before``), or by twice the threshold now; a reading appearing or going counts."""
    if (now is None) != (written is None):
        return True
    if now is None or written is None:
        return False
    gap = abs(now - written)
    if gap < threshold:
        return False
    return gap >= 2 * threshold or before is None or abs(before - written) >= threshold


def publish_reason(
    written: Mapping[str, GpuReport] | None,
    current: Mapping[str, GpuReport],
    since_write: float,
    policy: PublishPolicy,
    previous: Mapping[str, GpuReport] | None = None,
) -> str:
    """Why ``current`` must be written now ('' when it need not): ``first``, ``gpus``, ``health``,
    ``utilization``, ``memory`` or ``refresh``. ``written``: what the last write said (None: none);
    ``previous``: the readings at the previous comparison (None: a move need not be confirmed);
    ``since_write``: seconds since the last write (only asked when the sampler has read since)."""
    if written is None:
        return "first"
    if set(written) != set(current):
        return "gpus"
    if any(_health(written[gid]) != _health(g) for gid, g in current.items()):
        return "health"
    before = previous or {}
    for gid, g in current.items():
        old, prior = written[gid], before.get(gid)
        if _moved(
            g.utilization, old.utilization, prior.utilization if prior else None, policy.utilization_points
        ):
            return "utilization"
    for gid, g in current.items():
        old, prior = written[gid], before.get(gid)
        total = g.memory_total_mib or old.memory_total_mib or 0
        threshold = policy.memory_percent * max(total, 1) / 100
        used = prior.memory_used_mib if prior else None
        if _moved(g.memory_used_mib, old.memory_used_mib, used, threshold):
            return "memory"
    return "refresh" if since_write >= policy.refresh else ""


class MetricsPublisher(PeriodicPublisher):
    """Keeps one node's NodeGpuMetric current (module docstring).

    ``rows`` gives the sampler's last round and ``sampled_at`` when it was read (None: not yet);
    ``custom_api`` is a ``CustomObjectsApi``, ``core_api`` a ``CoreV1Api`` (to own the object by the
    Node). ``clock`` is monotonic seconds (tests replace it).
    """

    event = "metrics"
    thread_name = "metrics-publisher"
    logger = log

    def __init__(
        self,
        custom_api: Any,
        core_api: Any,
        node_name: str,
        rows: Callable[[], Sequence[GpuRow]],
        sampled_at: Callable[[], dt.datetime | None],
        policy: PublishPolicy | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._custom = custom_api
        self._core = core_api
        self.node_name = node_name
        self._rows = rows
        self._sampled_at = sampled_at
        self.policy = policy or PublishPolicy()
        self._clock = clock or time.monotonic
        self.written: dict[str, GpuReport] | None = None
        self._written_sample: dt.datetime | None = None
        # the round compared last (when sampled, its readings) and the readings of the one before
        self._checked: tuple[dt.datetime | None, dict[str, GpuReport] | None] = (None, None)
        self._previous: dict[str, GpuReport] | None = None
        self._written_at = 0.0
        self.writes = 0  # API writes, for tests and the benchmark
        self._init_loop()

    def sync_once(self) -> str:
        """Write if due; returns why it wrote ('' when it did not). API errors raise."""
        sampled = self._sampled_at()
        if sampled is None or sampled == self._written_sample:
            return ""  # nothing read since the last write: nothing new to say
        rows = self._rows()
        current = {row.device.id: report_of(row) for row in rows}
        since = self._clock() - self._written_at
        if sampled != self._checked[0]:  # a new round: the one compared last is the previous
            self._previous, self._checked = self._checked[1], (sampled, current)
        reason = publish_reason(self.written, current, since, self.policy, self._previous)
        if not reason:
            return ""
        reports = sorted(current.values(), key=lambda g: (g.index, g.id))
        self._write(livemetrics.document(self.node_name, reports, sampled, *self._spec()))
        self.written, self._written_sample, self._written_at = current, sampled, self._clock()
        if reason not in ("utilization", "memory", "refresh"):
            log_event(log, "node.metrics_published", node=self.node_name, reason=reason, gpus=len(reports))
        return reason

    def _spec(self) -> tuple[float, float]:
        return self.policy.interval, self.policy.refresh

    def _write(self, body: dict[str, Any]) -> None:
        group, version, plural = livemetrics.GROUP, livemetrics.VERSION, livemetrics.PLURAL
        try:
            self._custom.patch_cluster_custom_object(
                group, version, plural, self.node_name, body, _content_type=MERGE_PATCH
            )
            self.writes += 1
            return
        except ApiException as error:
            if error.status != NOT_FOUND:
                raise
        owned = livemetrics.document(
            self.node_name, (), dt.datetime.now(dt.UTC), *self._spec(), owner_uid=self._node_uid()
        )
        owned["status"] = body["status"]
        try:
            self._custom.create_cluster_custom_object(group, version, plural, owned)
        except ApiException as error:
            if error.status != CONFLICT:
                raise
            # created meanwhile (a restart racing itself, another writer): what it holds is not
            # what this round says, so write over it now (an error raises: retried next interval)
            self._custom.patch_cluster_custom_object(
                group, version, plural, self.node_name, body, _content_type=MERGE_PATCH
            )
        self.writes += 1

    def interval_seconds(self) -> float:
        return self.policy.interval
