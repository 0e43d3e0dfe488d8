"""The live scheduler's cache: what every node has and holds, as the API and our own binds say.

It keeps the Node facts, the pods (bound ones, whoever bound them, and the pods pending for this
scheduler), and the *assumptions*: pods this replica decided and is binding. From those it builds
the core's ``ClusterState``, the view every decision is made on. It does no I/O and takes no
locks; the scheduler calls it under its lock with the events it receives.

The rules that keep a device from ever being handed out twice:

- **Bound pods are facts.** A pod the API shows bound holds, on its node, its CPU, memory, a pod
  slot, its GPU count (what the kubelet charges) and the devices its verified allocation names,
  whatever the node has left: ``ClusterState.book`` never refuses a fact, and free CPU may go
  negative, as in kube-scheduler's NodeInfo. Pods bound by other schedulers count too.
- **Devices are booked by id.** A GPU that vanishes from the inventory keeps no index for anyone
  to reuse; when it comes back, the pods that hold it book it again.
- **An assumption is released only on evidence.** A Binding that may have been committed (a 5xx,
  a timeout, a lost connection, a 409) keeps its devices booked until the pod is seen bound (its
  annotation then replaces the assumption), seen gone, or read back unbound (``confirmed``).
  Only an answer that proves the Binding was not stored (another 4xx, or a request that never
  left) releases it at once (``release``).
- **The API's word wins.** A pod seen bound replaces any assumption about it, whichever replica
  bound it. A relist drops the assumptions of pods that are gone and books the bound ones.
- **A pod never unbinds.** A stale event showing a pod unbound after it was seen bound is ignored.
- **A bad object costs only itself.** A node whose inventory cannot be read is excluded with its
  reason; a pod whose allocation does not verify holds its CPU and memory but no devices.

It also keeps each node's live GPU readings (its ``NodeGpuMetric``, docs/utilisation.md) and gives
the view what of them is trusted now (``scheduler.live.utilisation``): readings older than
``metrics_stale_after`` seconds are dropped to unknown when they age (``expire_metrics``, checked on
every ``view``), with a ``node.metrics_ignored`` log line saying why; a GPU the readings take out
of placement is logged (``gpu.out_of_placement``, ``gpu.back_in_placement``).
"""

from __future__ import annotations

import datetime as dt
import enum
import heapq
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from devices.model import DeviceKind
from kubegpu import allocation as contract
from kubegpu import livemetrics
from kubegpu.logs import log_event
from scheduler.core.affinity import PodFacts
from scheduler.core.constraints import pod_facts
from scheduler.core.state import Allocation, ClusterState, NodeState
from scheduler.live.podspec import status_key
from scheduler.live.translate import (
    NodeFacts,
    fact_allocation,
    node_facts,
    node_state,
    pod_usage,
    verified_allocation,
)
from scheduler.live.utilisation import distrust, live_readings, unfit_gpus, unfit_reason

log = logging.getLogger("kubegpu.scheduler.cache")
TERMINAL = ("Succeeded", "Failed")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _health_only(report: livemetrics.NodeReport) -> livemetrics.NodeReport:
    """What of ``report`` outlives an unreadable successor: its GPUs' health fields, for those it
    said unfit (an old word that a GPU is broken holds until a readable report says otherwise)."""
    gpus = {
        gid: livemetrics.GpuReport(g.id, g.index, ecc_uncorrected=g.ecc_uncorrected, xid=g.xid, lost=g.lost)
        for gid, g in report.gpus.items()
        if unfit_reason(g)
    }
    return replace(report, gpus=gpus)


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def is_bound(pod: Mapping[str, Any]) -> bool:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    return bool(spec.get("nodeName")) and status.get("phase") not in TERMINAL


def is_pending_for(pod: Mapping[str, Any], scheduler_name: str) -> bool:
    """Waiting for this scheduler: unbound, not finished or deleted, no scheduling gates left."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("schedulingGates"):
        return False
    return (
        spec.get("schedulerName") == scheduler_name
        and not spec.get("nodeName")
        and status.get("phase") not in TERMINAL
        and not _meta(pod).get("deletionTimestamp")
    )


class Binding(enum.StrEnum):
    """Where an assumption's Binding stands."""

    IN_FLIGHT = "in-flight"  # the POST has not answered yet
    SUCCEEDED = "succeeded"  # the POST succeeded; the pod will be seen bound
    UNCERTAIN = "uncertain"  # the POST may or may not have been stored


@dataclass
class Assumed:
    """A pod this replica decided: its allocation is booked until the API says what happened."""

    alloc: Allocation
    binding: Binding
    since: float  # when the binding entered its current state (scheduler clock)
    confirm_at: float = math.inf  # when to read the pod back to learn the outcome
    reads: int = 0  # reads so far
    reading: bool = False  # a read is in flight
    sent: bool = False  # the Binding is on its way (annotation and signed are what it carries)
    annotation: str | None = None  # the allocation annotation the Binding carries (None: none)
    signed: contract.Allocation | None = None


class PodChange(enum.StrEnum):
    """What an observed pod event did to the cache."""

    PENDING = "pending"  # a pod waiting for this scheduler (new or changed)
    BOUND = "bound"  # a pod seen bound for the first time (or its booking changed)
    GONE = "gone"  # a pod that held resources or was waiting is gone
    NONE = "none"  # nothing that matters to scheduling


@dataclass(frozen=True)
class _Fact:
    """A bound pod's booking, memoised on what it depends on: node, annotation, spec, the
    metadata placement rules read and the resources its container statuses report (a resize in
    place; any other status update changes none of them)."""

    node: str
    raw: Any  # the allocation annotation's value
    spec: Any  # the pod's spec, compared by value
    seen: Any  # what placement rules read of the metadata (_seen_by_rules)
    alloc: Allocation
    problem: str
    facts: PodFacts  # what placement rules see of the pod (labels, affinity terms)
    status: Any = ()  # what pod_usage reads of the status (podspec.status_key)

    def same_pod(self, node: str, raw: Any, spec: Any, seen: Any, status: Any) -> bool:
        return (
            node == self.node
            and raw == self.raw
            and seen == self.seen
            and status == self.status
            and (spec is self.spec or spec == self.spec)
        )


def _seen_by_rules(pod: Mapping[str, Any]) -> tuple[Any, Any, bool]:
    """The metadata that ``pod_facts`` reads besides the spec: namespace, labels, terminating."""
    meta = _meta(pod)
    return meta.get("namespace"), meta.get("labels"), meta.get("deletionTimestamp") is not None


class Cache:
    """See the module docstring. ``keys()`` gives the allocation keys; ``now()`` the wall time for
    heartbeat staleness."""

    def __init__(
        self,
        scheduler_name: str,
        keys: Callable[[], Mapping[str, contract.VerifyingKey]],
        gpu_resource: str = "nvidia.com/gpu",
        stale_after: float = 120.0,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        metrics_stale_after: float = 600.0,
    ) -> None:
        self.scheduler_name = scheduler_name
        self.keys = keys
        self.gpu_resource = gpu_resource
        self.stale_after = stale_after
        self.now = now
        self.facts: dict[str, NodeFacts] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.assumed: dict[str, Assumed] = {}
        self.cluster: ClusterState | None = None
        self.dirty = True
        self.excluded: dict[str, str] = {}
        self.rebuilds = 0
        self._bound: set[str] = set()  # uids seen bound (a pod never unbinds)
        self._facts_memo: dict[str, _Fact] = {}
        self._verified: dict[str, tuple[str, str, contract.Allocation | None, str]] = {}
        self._reported: dict[str, str] = {}  # uid -> the booking problem last logged
        self._other_devices: dict[str, frozenset[str]] = {}  # node -> its non-GPU device ids
        self._reads: list[tuple[float, str]] = []  # (confirm_at, uid); stale entries skipped
        self.namespaces: dict[str, dict[str, str]] = {}  # namespace -> its labels
        # live GPU readings: node -> its last readable report, and what was last logged of it
        self.metrics_stale_after = metrics_stale_after
        self.metrics: dict[str, livemetrics.NodeReport] = {}
        self._distrust: dict[str, str] = {}  # node -> why its report is not trusted ('' trusted)
        self._unfit: dict[str, dict[str, str]] = {}  # node -> GPU id -> why it is out of placement
        self._metrics_problem: dict[str, str] = {}  # node -> why its object is unreadable
        self._expiry: list[tuple[dt.datetime, str, dt.datetime]] = []  # (stale at, node, updateTime)
        self._static_logged: dict[str, str] = {}  # node -> the static-score problem last logged

    # --- nodes --------------------------------------------------------------------------------

    def replace_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        facts = [node_facts(item, self.gpu_resource) for item in items]
        self.facts = {f.name: f for f in facts if f.name}
        self.dirty = True

    def apply_node(self, event_type: str, node: Mapping[str, Any]) -> bool:
        """Apply a watch event; True if the nodes' usable state changed."""
        name = str(_meta(node).get("name", ""))
        if event_type == "DELETED":
            if self.facts.pop(name, None) is None:
                return False
            self.dirty = True
            return True
        facts = node_facts(node, self.gpu_resource)
        old = self.facts.get(name)
        if old is None or old.signature() != facts.signature():
            self.facts[name] = facts
            self.dirty = True
            return True
        if facts.inventory is not old.inventory:
            # an equal inventory (a heartbeat, a status update): keep the object, so what the view
            # derived from it is found again on the next rebuild (the node's GPU link matrix)
            facts = replace(facts, inventory=old.inventory)
        self.facts[name] = facts
        if old.heartbeat != facts.heartbeat and (name in self.excluded) != bool(self.exclusion(facts)):
            self.dirty = True
            return True
        return False

    def exclusion(self, facts: NodeFacts) -> str:
        """Why kubegpu cannot use this node now ('' if it can)."""
        return facts.schedulable(self.now(), self.stale_after)

    def exclusions_flipped(self) -> bool:
        """True (and marks the view dirty) when a heartbeat went stale or fresh since the view."""
        flipped = any((name in self.excluded) != bool(self.exclusion(f)) for name, f in self.facts.items())
        if flipped:
            self.dirty = True
        return flipped

    # --- live GPU readings (NodeGpuMetric) -----------------------------------------------------

    def replace_metrics(self, items: Iterable[Mapping[str, Any]]) -> bool:
        """A full list of NodeGpuMetric objects; True when something may now fit that did not."""
        relaxed, listed = False, set()
        for item in items:
            listed.add(str(_meta(item).get("name", "")))
            relaxed = self.apply_metrics("ADDED", item) or relaxed
        for gone in [name for name in self.metrics if name not in listed]:
            relaxed = self.apply_metrics("DELETED", {"metadata": {"name": gone}}) or relaxed
        return relaxed

    def apply_metrics(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        """A watch event of a NodeGpuMetric; True when something may now fit that did not (a GPU
        back in placement, memory freed)."""
        name = str(_meta(obj).get("name", ""))
        if not name:
            return False
        if event_type == "DELETED":
            self._metrics_problem.pop(name, None)
            if self.metrics.pop(name, None) is None:
                return False
            return self._apply_live(name)
        try:
            report = livemetrics.parse(obj)
        except ValueError as error:
            problem = str(error)[:200]
            if self._metrics_problem.get(name) != problem:
                log_event(log, "node.metrics_unreadable", logging.WARNING, node=name, reason=problem)
            self._metrics_problem[name] = problem
            had = self.metrics.pop(name, None)
            if had is None:
                return False
            health = _health_only(had)  # readings unknown; a GPU it said unfit stays out
            if health.gpus:
                self.metrics[name] = health
            return self._apply_live(name)
        self._metrics_problem.pop(name, None)
        self.metrics[name] = report
        stale_at = report.update_time + dt.timedelta(seconds=self.metrics_stale_after)
        heapq.heappush(self._expiry, (stale_at, name, report.update_time))
        if len(self._expiry) > 2 * len(self.metrics) + 64:
            self._compact_expiry()
        return self._apply_live(name)

    def _compact_expiry(self) -> None:
        """Drop the expiry entries of superseded reports: they are otherwise dropped only when their
        time comes, a year away for a node whose clock is a year ahead (one entry per write)."""
        live = {
            (name, sampled): stale_at
            for stale_at, name, sampled in self._expiry
            if (held := self.metrics.get(name)) is not None and held.update_time == sampled
        }
        self._expiry = [(stale_at, name, sampled) for (name, sampled), stale_at in live.items()]
        heapq.heapify(self._expiry)

    def expire_metrics(self) -> bool:
        """Drop to unknown the readings that aged past ``metrics_stale_after`` since they were
        applied; True when that may let something fit (the memory guard falls back to the books)."""
        now = self.now()
        relaxed = False
        # strictly after: at the bound itself a report is still fresh (``distrust``), and an entry
        # dropped then would never be looked at again
        while self._expiry and self._expiry[0][0] < now:
            _, name, sampled = heapq.heappop(self._expiry)
            report = self.metrics.get(name)
            if report is not None and report.update_time == sampled:
                relaxed = self._apply_live(name) or relaxed
        return relaxed

    def _apply_live(self, name: str, cluster: ClusterState | None = None) -> bool:
        """Give the view (or ``cluster``, being built) node ``name``'s readings as far as they are
        trusted now, logging what changed; True when something may now fit that did not."""
        report = self.metrics.get(name)
        why = "" if report is None else distrust(report, self.now(), self.metrics_stale_after)
        readings = {} if report is None else live_readings(report, trusted=not why)
        if report is not None and self._distrust.get(name) != why:
            if why:
                log_event(log, "node.metrics_ignored", logging.WARNING, node=name, reason=why)
            elif name in self._distrust:
                log_event(log, "node.metrics_trusted", node=name)
        if report is None:
            self._distrust.pop(name, None)
        else:
            self._distrust[name] = why
        unfit, before = unfit_gpus(readings), self._unfit.get(name, {})
        for gid, reason in unfit.items():
            if before.get(gid) != reason:
                log_event(log, "gpu.out_of_placement", logging.WARNING, node=name, device=gid, reason=reason)
        for gid in before:
            if gid not in unfit:
                log_event(log, "gpu.back_in_placement", node=name, device=gid)
        if unfit:
            self._unfit[name] = unfit
        else:
            self._unfit.pop(name, None)
        if cluster is None:
            if self.dirty or self.cluster is None:
                return True  # the next view is built with them
            cluster = self.cluster
        return cluster.set_live(name, readings)

    # --- namespaces (their labels, for pod affinity's namespace selectors) --------------------

    def replace_namespaces(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.namespaces.clear()
        for item in items:
            self.apply_namespace("ADDED", item)

    def apply_namespace(self, event_type: str, namespace: Mapping[str, Any]) -> bool:
        """Apply a watch event; True if a namespace's labels changed."""
        meta = _meta(namespace)
        name = str(meta.get("name", ""))
        if not name:
            return False
        if event_type == "DELETED":
            return self.namespaces.pop(name, None) is not None
        raw = meta.get("labels")
        labels = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}
        if self.namespaces.get(name) == labels:
            return False
        self.namespaces[name] = labels
        return True

    # --- pods ---------------------------------------------------------------------------------

    def replace_pods(self, items: Iterable[dict[str, Any]]) -> list[str]:
        """A full list: the new truth. Returns the uids whose assumptions it dropped (pod gone)."""
        listed: dict[str, dict[str, Any]] = {}
        for pod in items:
            uid = str(_meta(pod).get("uid", ""))
            if uid:
                listed[uid] = pod
        previous, self.pods = self.pods, {}
        for uid, pod in listed.items():
            if uid in self._bound and not is_bound(pod) and uid in previous:
                # A list older than what a read showed us: a pod never unbinds, keep what we saw.
                if (pod.get("status") or {}).get("phase") not in TERMINAL:
                    self.pods[uid] = previous[uid]
                    continue
            if is_bound(pod):
                self.pods[uid] = pod
                self._bound.add(uid)
                self.assumed.pop(uid, None)
            elif is_pending_for(pod, self.scheduler_name):
                self.pods[uid] = pod
        dropped = [uid for uid in self.assumed if uid not in self.pods]
        for uid in dropped:
            alloc = self.assumed.pop(uid).alloc
            log_event(
                log, "pod.assumption_dropped", pod=alloc.pod_name, node=alloc.node, reason="pod is gone"
            )
        self._bound &= set(self.pods)
        self._forget_memos()
        self.dirty = True
        return dropped

    def apply_pod(self, event_type: str, pod: dict[str, Any]) -> PodChange:
        uid = str(_meta(pod).get("uid", ""))
        if not uid:
            return PodChange.NONE
        if event_type == "DELETED" or (pod.get("status") or {}).get("phase") in TERMINAL:
            return PodChange.GONE if self.drop_pod(uid) else PodChange.NONE
        if is_bound(pod):
            return self.observe_bound(pod)
        if uid in self._bound:
            return PodChange.NONE  # an older event than what we saw: pods never unbind
        if is_pending_for(pod, self.scheduler_name):
            self.pods[uid] = pod
            if uid in self.assumed and not self.dirty and self.cluster is not None:
                # being bound: other pods' rules see its labels as they are now
                self._refresh_facts(self.cluster, uid, pod_facts(pod))
            return PodChange.PENDING
        # Not ours (another scheduler's pending pod), or gated, or being deleted while pending.
        return PodChange.GONE if self.drop_pod(uid) else PodChange.NONE

    def observe_bound(self, pod: dict[str, Any]) -> PodChange:
        """A pod the API shows bound: its annotation replaces any assumption (whoever bound it)."""
        uid = str(_meta(pod).get("uid", ""))
        previous = self.pods.get(uid)
        first = uid not in self._bound
        self.pods[uid] = pod
        self._bound.add(uid)
        assumed = self.assumed.pop(uid, None)
        cluster = self.cluster
        if self.dirty or cluster is None:
            return PodChange.BOUND if first else PodChange.NONE
        booked = cluster.allocation(uid)
        own = self._own_binding(uid, pod, assumed) if assumed is not None else None
        if own is not None and booked is not None:
            # our own Binding, booked as we assumed it; its labels may have changed meanwhile
            self._refresh_facts(cluster, uid, own.facts)
            return PodChange.BOUND
        fact = own or self._fact(uid, pod)
        unchanged = booked is not None and booked == self._gpu_only(fact.alloc)
        if unchanged and assumed is None and previous is not None:
            if self._refresh_facts(cluster, uid, fact.facts):  # new labels, or now terminating
                return PodChange.BOUND
            return PodChange.NONE  # a status update of a pod already booked as it is
        if booked is not None:
            cluster.forget(uid)
        self._book_fact(cluster, uid, pod, fact)
        return PodChange.BOUND

    @staticmethod
    def _refresh_facts(cluster: ClusterState, uid: str, facts: PodFacts) -> bool:
        """Give the placement view what rules now see of a booked pod; True if that changed."""
        view = cluster.placement
        row = view.index.node_of.get(uid) if view is not None else None
        if view is None or row is None or view.index.facts.get(uid) == facts:
            return False
        view.index.add(facts, row)
        return True

    def drop_pod(self, uid: str) -> bool:
        """The pod is gone: release everything it held or was assumed to. True if it was known."""
        known = self.pods.pop(uid, None) is not None
        assumed = self.assumed.pop(uid, None) is not None
        self._bound.discard(uid)
        self._facts_memo.pop(uid, None)
        self._verified.pop(uid, None)
        self._reported.pop(uid, None)
        if not self.dirty and self.cluster is not None:
            if uid in self.cluster.where:
                self.cluster.forget(uid)
            elif self.cluster.placement is not None:
                self.cluster.placement.remove(uid)  # a pod on a node kubegpu does not use
        return known or assumed

    # --- assumptions ---------------------------------------------------------------------------

    def assume(self, uid: str, alloc: Allocation, now: float, facts: PodFacts | None = None) -> None:
        """Book a decision (raises AllocationConflict if it does not fit the current view);
        ``facts``: what placement rules see of the pod (read from the pod when not given)."""
        cluster = self.view()
        cluster.assume(alloc, facts if facts is not None else self._pod_facts(uid))
        self.assumed[uid] = Assumed(alloc, Binding.IN_FLIGHT, now)

    def sending(self, uid: str, annotation: str | None, signed: contract.Allocation | None) -> None:
        """The Binding about to be POSTed carries ``annotation`` (the signed ``signed``): a pod
        seen bound with exactly it is this replica's binding and needs no second verification."""
        assumed = self.assumed.get(uid)
        if assumed is not None:
            assumed.sent, assumed.annotation, assumed.signed = True, annotation, signed

    def bind_succeeded(self, uid: str, now: float, confirm_after: float) -> None:
        """The Binding was stored: keep the booking until the pod is seen bound."""
        assumed = self.assumed.get(uid)
        if assumed is not None:
            assumed.binding, assumed.since = Binding.SUCCEEDED, now
            self._read_at(uid, assumed, now + confirm_after)

    def bind_uncertain(self, uid: str, now: float, confirm_after: float) -> None:
        """The Binding may have been stored: keep the booking, read the pod back later."""
        assumed = self.assumed.get(uid)
        if assumed is not None:
            assumed.binding, assumed.since = Binding.UNCERTAIN, now
            self._read_at(uid, assumed, now + confirm_after)

    def _read_at(self, uid: str, assumed: Assumed, when: float) -> None:
        assumed.confirm_at = when
        heapq.heappush(self._reads, (when, uid))

    def release(self, uid: str) -> Allocation | None:
        """The Binding was certainly not stored (or the pod is gone): free what it booked."""
        assumed = self.assumed.pop(uid, None)
        if assumed is None:
            return None
        cluster = self.cluster
        if not self.dirty and cluster is not None:
            if uid in cluster.where:
                cluster.forget(uid)  # an assumed pod is never also bound: the booking is the assumption
            elif cluster.placement is not None:
                cluster.placement.remove(uid)  # on its way to a node that takes no pods now
        return assumed.alloc

    def due_reads(self, now: float) -> list[str]:
        """Assumptions whose outcome should now be read back from the API (marked as reading)."""
        due = []
        while self._reads and self._reads[0][0] <= now:
            when, uid = heapq.heappop(self._reads)
            assumed = self.assumed.get(uid)
            if assumed is not None and not assumed.reading and assumed.confirm_at == when:
                assumed.reading = True
                due.append(uid)
        return due

    def next_read_at(self) -> float | None:
        while self._reads:
            when, uid = self._reads[0]
            assumed = self.assumed.get(uid)
            if assumed is not None and not assumed.reading and assumed.confirm_at == when:
                return when
            heapq.heappop(self._reads)
        return None

    def read_failed(self, uid: str, now: float, retry_after: float) -> None:
        assumed = self.assumed.get(uid)
        if assumed is not None:
            assumed.reading = False
            assumed.reads += 1
            self._read_at(uid, assumed, now + retry_after)

    def read_back(self, uid: str, pod: dict[str, Any] | None) -> str:
        """The pod as read from the API after its Binding's outcome was unclear.

        Returns what it proved: ``bound`` (the annotation replaces the assumption), ``gone`` (no
        such pod any more), ``unbound`` (the Binding was not stored: released, the pod may be tried
        again) or ``resolved`` (the assumption was settled meanwhile).
        """
        assumed = self.assumed.get(uid)
        if assumed is None:
            return "resolved"
        assumed.reading = False
        if pod is None or str(_meta(pod).get("uid", "")) != uid:
            self.drop_pod(uid)
            return "gone"
        if (pod.get("status") or {}).get("phase") in TERMINAL:
            self.drop_pod(uid)
            return "gone"
        if is_bound(pod):
            self.observe_bound(pod)
            return "bound"
        self.release(uid)
        return "unbound"

    # --- the view ------------------------------------------------------------------------------

    def view(self) -> ClusterState:
        """The core's cluster, rebuilt from the caches when something made it stale."""
        if self.dirty or self.cluster is None:
            self._rebuild()
        if self._expiry:
            self.expire_metrics()
        assert self.cluster is not None
        return self.cluster

    def _rebuild(self) -> None:
        excluded: dict[str, str] = {}
        nodes: list[NodeState] = []
        self._other_devices = {}
        for name, facts in sorted(self.facts.items()):
            reason = self.exclusion(facts)
            if not reason:
                try:
                    nodes.append(node_state(facts))
                except ValueError as error:
                    reason = f"node's device inventory is unusable: {str(error)[:120]}"
            if reason:
                excluded[name] = reason
                if self.excluded.get(name) != reason:
                    log_event(log, "node.excluded", logging.WARNING, node=name, reason=reason)
            elif name in self.excluded:
                log_event(log, "node.usable", node=name)
            if facts.inventory is not None:
                self._other_devices[name] = frozenset(
                    d.id for d in facts.inventory.devices if d.kind != DeviceKind.GPU
                )
            static = facts.static_problem
            if static and self._static_logged.get(name) != static:
                log_event(log, "node.static_score_ignored", logging.WARNING, node=name, reason=static)
            self._static_logged[name] = static
        self.excluded = excluded
        for gone in [name for name in self._static_logged if name not in self.facts]:
            del self._static_logged[gone]
        cluster = ClusterState(nodes)
        for name in self.metrics:
            if name in cluster.index:
                self._apply_live(name, cluster)
        others = [
            (n, self.facts[n].labels, self.facts[n].taints) for n in sorted(excluded) if n in self.facts
        ]
        cluster.enable_placement(others, self.namespaces)
        for uid, pod in self.pods.items():
            if uid in self._bound:
                self._book_fact(cluster, uid, pod, self._fact(uid, pod))
        for uid, assumed in self.assumed.items():
            if assumed.alloc.node not in cluster.index:
                # its node takes no pods now (stale, unreadable, ...): nothing to hold there, but
                # the pod is on its way to it and counts for the rules of pods placed nearby
                facts = self._pod_facts(uid)
                if facts is not None and cluster.placement is not None:
                    cluster.placement.place(facts, assumed.alloc.node)
            elif uid not in cluster.where:
                problems = cluster.book(self._gpu_only(assumed.alloc), self._pod_facts(uid))
                if problems:
                    log_event(
                        log,
                        "pod.assumption_conflict",
                        logging.WARNING,
                        pod=assumed.alloc.pod_name,
                        node=assumed.alloc.node,
                        devices=list(assumed.alloc.device_ids()),
                        reason="; ".join(problems),
                    )
        self.cluster = cluster
        self.dirty = False
        self.rebuilds += 1
        log_event(
            log,
            "cache.rebuilt",
            nodes=len(nodes),
            excluded=len(excluded),
            bound_pods=len(cluster.where) - sum(1 for u in self.assumed if u in cluster.where),
            assumed=len(self.assumed),
        )

    def _pod_facts(self, uid: str) -> PodFacts | None:
        pod = self.pods.get(uid)
        return pod_facts(pod) if pod is not None else None

    def _gpu_only(self, alloc: Allocation) -> Allocation:
        """``alloc`` without the devices its node lists as other than GPUs (NICs)."""
        others = self._other_devices.get(alloc.node)
        if not others or not any(g.id in others for g in alloc.gpus):
            return alloc
        return replace(alloc, gpus=tuple(g for g in alloc.gpus if g.id not in others))

    def _fact(self, uid: str, pod: Mapping[str, Any]) -> _Fact:
        """The booking of a bound pod (memoised per node, annotation, spec, labels; signatures per value)."""
        meta = _meta(pod)
        spec = pod.get("spec") or {}
        node = str(spec.get("nodeName", ""))
        annotations = meta.get("annotations") or {}
        raw = annotations.get(contract.ANNOTATION) if isinstance(annotations, Mapping) else None
        memo = self._facts_memo.get(uid)
        status = status_key(pod)
        if memo is not None and memo.same_pod(node, raw, spec, _seen_by_rules(pod), status):
            return memo
        usage = pod_usage(pod, self.gpu_resource)
        cached = self._verified.get(uid)
        if cached is not None and cached[0] == raw and cached[1] == node:
            signed, problem = cached[2], cached[3]
        else:
            text = raw if isinstance(raw, str) else None
            signed, problem = verified_allocation(text, self.keys(), node, uid)
            if raw is not None and not isinstance(raw, str):
                problem = "allocation ignored: not a string"
            if signed is None and cached is not None and cached[2] is not None and cached[1] == node:
                # The annotation changed after the pod was bound with a valid one: its containers
                # got the devices that one named, so they stay booked.
                signed = cached[2]
                problem = f"annotation changed after binding ({problem or 'removed'}); keeping its devices"
            self._verified[uid] = (raw, node, signed, problem)
        problem = "; ".join(p for p in (usage.problem, problem) if p)
        alloc = fact_allocation(node, uid, pod_key(pod), usage, signed)
        fact = _Fact(node, raw, spec, _seen_by_rules(pod), alloc, problem, pod_facts(pod), status)
        self._facts_memo[uid] = fact
        return fact

    def _own_binding(self, uid: str, pod: Mapping[str, Any], assumed: Assumed) -> _Fact | None:
        """The fact of a pod seen bound by the very Binding this replica sent (same node, same
        annotation): the assumption itself, with no second parse or verification."""
        if not assumed.sent:
            return None
        spec = pod.get("spec") or {}
        node = str(spec.get("nodeName", ""))
        annotations = _meta(pod).get("annotations") or {}
        raw = annotations.get(contract.ANNOTATION) if isinstance(annotations, Mapping) else None
        if node != assumed.alloc.node or raw != assumed.annotation:
            return None
        fact = _Fact(node, raw, spec, _seen_by_rules(pod), assumed.alloc, "", pod_facts(pod), status_key(pod))
        self._facts_memo[uid] = fact
        if assumed.signed is not None:
            self._verified[uid] = (raw, node, assumed.signed, "")
        return fact

    def _book_fact(self, cluster: ClusterState, uid: str, pod: Mapping[str, Any], fact: _Fact) -> None:
        if fact.alloc.node not in cluster.index:
            # on a node kubegpu does not use (now): nothing to hold there, but its labels and
            # affinity terms still count for the placement rules of pods placed nearby
            if cluster.placement is not None:
                cluster.placement.place(fact.facts, fact.alloc.node)
            return
        problems = cluster.book(self._gpu_only(fact.alloc), fact.facts)
        report = "; ".join(p for p in [fact.problem, *problems] if p)
        if report != self._reported.get(uid, ""):
            self._reported[uid] = report
            if report:
                conflict = any("beyond" in p for p in problems)
                log_event(
                    log,
                    "pod.allocation_conflict" if conflict else "pod.allocation_problem",
                    logging.ERROR if conflict else logging.WARNING,
                    pod=pod_key(pod),
                    node=fact.alloc.node,
                    devices=list(fact.alloc.device_ids()),
                    reason=report,
                )

    def _forget_memos(self) -> None:
        for memo in (self._facts_memo, self._verified, self._reported):
            for uid in [u for u in memo if u not in self.pods]:
                del memo[uid]

    # --- checks used by tests and the soak ------------------------------------------------------

    def check_consistency(self) -> list[str]:
        """Internal invariants: every assumption has its pod, every booking a pod or assumption,
        no pod both bound and assumed. Returns the violations (empty when sound)."""
        problems = [f"assumption without a pod: {uid}" for uid in self.assumed if uid not in self.pods]
        problems += [f"bound and assumed: {uid}" for uid in self.assumed if uid in self._bound]
        cluster = self.cluster
        if not self.dirty and cluster is not None:
            for uid in cluster.where:
                if uid not in self.pods and uid not in self.assumed:
                    problems.append(f"booking without a pod: {uid}")
        return problems
