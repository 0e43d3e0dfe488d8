"""The live scheduler: watch Nodes and Pods, decide with the shared core, bind with the allocation.

Threads: one reflector per resource feeds the cache; one scheduling thread pops pods and decides
(the core is single-threaded by design); a pool of binders POSTs Bindings and reads pods back.
One condition lock guards the cache, the queue and the core's ClusterState.

- **Cache** (``cache.Cache``): Node facts, bound pods (whoever bound them: they are facts), the
  pods pending for this scheduler and the assumptions (pods being bound). Its module docstring
  has the rules that keep a device from being handed out twice.
- **Queue** (``queue.SchedulingQueue``): kube-scheduler's order (priority, then creation time),
  per-pod exponential backoff, unschedulable pods parked until the cluster changes. The
  scheduling thread sleeps until the next pod is ready or something changes; it never polls.
- **Bind.** One POST to ``pods/<name>/binding`` whose metadata carries the signed annotation:
  the pod is never bound without its allocation nor annotated without being bound. Its outcome
  decides the assumption: success keeps it until the pod is seen bound; a 404 (pod gone) or
  another 4xx (not stored) releases it; anything that may have been stored (5xx, 409, timeout,
  lost connection) keeps it and the pod is read back after a backoff to learn what happened.
- **Node Events.** A node whose agent published something refused (scheduler/live/nodecheck.py)
  gets a rate-limited Warning Event, and a Normal one once it is valid again
  (scheduler/live/nodeevents.py); the leader checks every ``STALENESS_CHECK_SECONDS``.
- **Leadership.** With leader election, a new leader waits ``bindTimeoutSeconds`` (the longest a
  former leader's Binding can be in flight) and lists the pods again before it decides anything,
  so no Binding of a former leader lands unseen.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from kubegpu import allocation as contract
from kubegpu import livemetrics
from kubegpu.allocation import KeyRing
from kubegpu.kube import BindingCoreV1Api
from kubegpu.logs import log_event
from scheduler.core.affinity import PodFacts
from scheduler.core.allocate import allocate
from scheduler.core.constraints import priority_of
from scheduler.core.filters import unschedulable_message
from scheduler.core.gang import (
    GroupPlacement,
    GroupRequest,
    GroupUnschedulable,
    GroupVictims,
    capacity_gap,
    fits_alone,
    group_preemption,
    never_fits,
    resource_gap,
    schedule_group,
)
from scheduler.core.policies import make_policy
from scheduler.core.preempt import PREEMPT_LOWER, PREEMPT_NEVER, Budget, RunningPod, Victims, choose, eligible
from scheduler.core.request import PodRequest
from scheduler.core.schedule import Placement, schedule_one
from scheduler.core.state import Allocation, AllocationConflict, ClusterState
from scheduler.live.cache import (
    Cache,
    NodeFacts,
    PodChange,
    is_pending_for,
    pod_key,
)
from scheduler.live.config import SchedulerConfig
from scheduler.live.events import (
    BINDING,
    PREEMPTING,
    SCHEDULING,
    event_body,
    namespace_of,
    object_ref,
    reporting_instance,
    scheduled_message,
)
from scheduler.live.gangs import GroupBook, GroupProgress, rfc3339
from scheduler.live.metrics import KUBE_RESULT, SchedulerMetrics
from scheduler.live.nodeevents import NodeEvents, poster
from scheduler.live.podgroups import (
    KUBE_API,
    KUBE_VERSION,
    PLUGINS_API,
    PLUGINS_VERSION,
    PLURAL,
    GroupError,
    GroupRef,
    GroupSpec,
    initially_scheduled_condition,
    member_counts,
    min_resources_wanted,
    plugins_status,
    status_patch,
)
from scheduler.live.podspec import PodSpecError, pod_request
from scheduler.live.preemption import budget, candidate_nodes, node_offer, other_rules, running_pod
from scheduler.live.queue import SchedulingQueue
from scheduler.live.reflector import Reflector
from scheduler.live.translate import allocation_contract, parse_time

log = logging.getLogger("kubegpu.scheduler")
EVENT_REPEAT_SECONDS = 30.0
STALENESS_CHECK_SECONDS = 5.0
SUCCEEDED_READ_SECONDS = 30.0  # a stored Binding not seen on the watch by then is read back


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def merge_reasons(reasons: Mapping[str, int], excluded: Mapping[str, str]) -> tuple[int, dict[str, int]]:
    """Node counts per reason, including the nodes kubegpu cannot use at all."""
    merged = dict(reasons)
    for reason in excluded.values():
        merged[reason] = merged.get(reason, 0) + 1
    return len(excluded), merged


def _relevant(pod: Mapping[str, Any] | None) -> tuple:
    """What of a pending pod can change whether it fits (not its status)."""
    if pod is None:
        return ()
    meta = _meta(pod)
    return (pod.get("spec"), meta.get("labels"), meta.get("annotations"))


def _queue_key(pod: Mapping[str, Any]) -> tuple[int, str, str]:
    """(priority, creation time, namespace/name): the queue's order."""
    priority = (pod.get("spec") or {}).get("priority")
    created = _meta(pod).get("creationTimestamp") or ""
    return (priority if isinstance(priority, int) else 0), str(created), pod_key(pod)


class Scheduler:
    """One scheduler replica (see module docstring).

    ``clock`` (monotonic seconds) times backoff, read-backs and event de-duplication; ``submit``
    runs binder work (default: a thread pool of ``bindWorkers``); ``core`` replaces the
    ``CoreV1Api`` made from ``api``, ``events`` the ``EventsV1Api`` (Events are events.k8s.io/v1,
    as kube-scheduler's: scheduler/live/events.py). Tests replace them.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        api: k8s.ApiClient,
        keys: KeyRing,
        metrics: SchedulerMetrics | None = None,
        seed: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        submit: Callable[..., Any] | None = None,
        core: Any = None,
        policy_api: Any = None,
        custom_api: Any = None,
        events: Any = None,
    ) -> None:
        self.config = config
        self.core = core if core is not None else BindingCoreV1Api(api)
        self.events_api = events if events is not None else k8s.EventsV1Api(api)
        self.reporting_instance = reporting_instance(config.scheduler_name, config.identity)
        self.policy_api = policy_api if policy_api is not None else k8s.PolicyV1Api(api)
        self.custom_api = custom_api if custom_api is not None else k8s.CustomObjectsApi(api)
        self.keys = keys
        self.metrics = metrics or SchedulerMetrics()
        self.policy = make_policy(config.policy, utilization_weight=config.utilization_weight)
        self.rng = random.Random(seed)
        self.clock = clock
        self.cond = threading.Condition()
        self.stop_event = threading.Event()
        self.leading = threading.Event()
        self.cache = Cache(
            config.scheduler_name,
            keys.keys,
            config.gpu_resource,
            config.heartbeat_stale_seconds,
            metrics_stale_after=config.utilization_stale_seconds,
        )
        self.queue = SchedulingQueue(config.backoff_initial_seconds, config.backoff_max_seconds, clock)
        self._last_event: dict[tuple[str, str], float] = {}
        self._popped_at = 0.0  # perf_counter when the scheduling thread took its current pod
        self._binders = ThreadPoolExecutor(max_workers=config.bind_workers, thread_name_prefix="bind")
        self._submit = submit or self._binders.submit
        self.node_events = NodeEvents(
            poster(
                self.events_api, lambda *a: self._submit(*a), config.scheduler_name, self.reporting_instance
            ),
            clock,
        )
        self._nodes_changed = True  # since the node events last looked
        self.node_reflector = Reflector(
            "nodes", self.core.list_node, _Handler(self.replace_nodes, self.apply_node)
        )
        self.pod_reflector = Reflector(
            "pods", self.core.list_pod_for_all_namespaces, _Handler(self.replace_pods, self.apply_pod)
        )
        self.namespace_reflector = Reflector(
            "namespaces",
            lambda **kw: self.core.list_namespace(**kw),
            _Handler(self.replace_namespaces, self.apply_namespace),
        )
        self.budget_reflector = Reflector(
            "poddisruptionbudgets",
            lambda **kw: self.policy_api.list_pod_disruption_budget_for_all_namespaces(**kw),
            _Handler(self.replace_budgets, self.apply_budget),
        )
        self.group_reflectors = tuple(
            Reflector(
                f"{PLURAL}.{group}",
                _custom_lister(self.custom_api, group, version),
                _Handler(
                    lambda items, g=group: self.replace_groups(g, items),
                    lambda kind, obj, g=group: self.apply_group(g, kind, obj),
                ),
                optional=True,
            )
            for group, version in ((PLUGINS_API, PLUGINS_VERSION), (KUBE_API, KUBE_VERSION))
        )
        self.metrics_reflector = Reflector(  # the nodes' live GPU readings (docs/utilisation.md)
            livemetrics.PLURAL,
            lambda **kw: self.custom_api.list_cluster_custom_object(
                livemetrics.GROUP, livemetrics.VERSION, livemetrics.PLURAL, **kw
            ),
            _Handler(self.replace_gpu_metrics, self.apply_gpu_metrics),
            optional=True,
        )
        self.groups = GroupBook()
        self._blocking: GroupRef | None = None  # a group pods queued behind it must not starve
        self._group_deadlines: dict[GroupRef, float] = {}  # a waiting group is tried again then
        self._never_fits: set[GroupRef] = set()  # groups waiting for the nodes to change
        self._node_epoch = 0  # counts node changes (what fits_alone verdicts depend on)
        self._alone: dict[GroupRef, tuple[tuple, bool]] = {}  # group -> (what it depended on, fits_alone)
        self.budgets: dict[str, Budget] = {}  # namespace/name -> PodDisruptionBudget
        self.nominated: dict[str, str] = {}  # pending pod uid -> node its preemption freed room on
        self._pod_rules_waiting: set[str] = set()  # parked pods whose rules look at other pods
        self.elector: Any = None  # LeaderElector when leader election is on
        self._requests: dict[str, tuple[str, PodRequest | PodSpecError]] = {}
        self._planned_shapes: set[tuple] = set()
        self._pod_lists = 0  # full pod lists applied so far
        self._fence: tuple[float, int | None] | None = None  # (wait until, pod lists needed)
        self._watchers: list[threading.Thread] = []

    # compatibility views of the cache (benchmarks and tests read them)
    @property
    def pods(self) -> dict[str, dict[str, Any]]:
        return self.cache.pods

    @property
    def facts(self) -> dict[str, NodeFacts]:
        return self.cache.facts

    @property
    def assumed(self) -> dict[str, Allocation]:
        return {uid: a.alloc for uid, a in self.cache.assumed.items()}

    @property
    def cluster(self) -> ClusterState | None:
        return self.cache.cluster

    # --- lifecycle ------------------------------------------------------------------------------

    def reflectors(self) -> tuple[Reflector, ...]:
        return (
            self.node_reflector,
            self.pod_reflector,
            self.namespace_reflector,
            self.budget_reflector,
            *self.group_reflectors,
            self.metrics_reflector,
        )

    def start_watching(self) -> None:
        for reflector in self.reflectors():
            self._watchers.append(
                threading.Thread(
                    target=reflector.run, args=(self.stop_event,), name=f"watch-{reflector.name}", daemon=True
                )
            )
        self._watchers.append(threading.Thread(target=self._watch_staleness, name="staleness", daemon=True))
        for thread in self._watchers:
            thread.start()

    def watch_threads(self) -> list[threading.Thread]:
        """The reflector and staleness threads start_watching started (stop() ends them)."""
        return list(self._watchers)

    def start_leading(
        self, api: k8s.ApiClient, annotations: Mapping[str, str] | None = None
    ) -> threading.Thread | None:
        """Lead at once, or run the Lease election; a replica that loses the lease stops.
        ``annotations`` go on the Lease while this replica holds it (where its extender listens)."""
        election = self.config.leader_election
        if not election.enabled:
            self.leading.set()
            self.metrics.leader.set(1)
            return None
        from scheduler.live.leader import LeaderElector

        self.elector = LeaderElector(
            k8s.CoordinationV1Api(api),
            election.namespace,
            election.lease_name,
            self.config.identity,
            lease_seconds=election.lease_seconds,
            renew_deadline=election.renew_deadline_seconds,
            retry_period=election.retry_period_seconds,
            annotations=annotations,
        )

        def started() -> None:
            log_event(log, "leader.acquired", identity=self.config.identity, lease=election.lease_name)
            self.metrics.leader.set(1)
            self.became_leader()

        def stopped() -> None:
            clean = self.stop_event.is_set()
            log_event(
                log,
                "leader.released" if clean else "leader.lost",
                logging.INFO if clean else logging.WARNING,
                identity=self.config.identity,
                lease=election.lease_name,
            )
            self.metrics.leader.set(0)
            self.leading.clear()
            self.stop_event.set()  # like kube-scheduler: a replica that lost the lease stops
            with self.cond:
                self.cond.notify_all()

        thread = threading.Thread(
            target=self.elector.run,
            args=(started, stopped, self.stop_event),
            name="leader-election",
            daemon=True,
        )
        thread.start()
        return thread

    def became_leader(self) -> None:
        """Start leading after the fence: wait out a former leader's Bindings, then list pods."""
        with self.cond:
            self._fence = (self.clock() + self.config.bind_timeout_seconds, None)
            self.groups.dirty.update(self.groups.specs)  # what changed while following was not written
            self.leading.set()
            self.cond.notify_all()

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for reflector in self.reflectors():
            if not reflector.synced.wait(max(0.0, deadline - time.monotonic())):
                return False
        return True

    def run(self) -> None:
        """Schedule while leading, until stop()."""
        while not self.stop_event.is_set():
            if not self.leading.wait(0.5):
                continue
            self.schedule_next(timeout=0.5)

    def stop(self, join_seconds: float = 10.0) -> None:
        """Stop scheduling and watching: the watches in flight are broken off and their threads
        joined (for up to ``join_seconds`` in all), so none outlives the scheduler."""
        self.stop_event.set()
        with self.cond:
            self.cond.notify_all()
        for reflector in self.reflectors():
            reflector.abort()
        self._binders.shutdown(wait=True, cancel_futures=True)
        deadline = time.monotonic() + join_seconds
        for thread in self._watchers:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    # --- cache updates (reflector threads) --------------------------------------------------------

    def replace_nodes(self, items: list[dict[str, Any]]) -> None:
        with self.cond:
            self.cache.replace_nodes(items)
            self._nodes_changed = True
            self._nodes_changed_for_groups()
            self._changed()

    def apply_node(self, event_type: str, node: dict[str, Any]) -> None:
        with self.cond:
            if self.cache.apply_node(event_type, node):
                self._nodes_changed = True
                self._nodes_changed_for_groups()
                self._changed()

    def replace_gpu_metrics(self, items: list[dict[str, Any]]) -> None:
        with self.cond:
            if self.cache.replace_metrics(items):
                self._changed()

    def apply_gpu_metrics(self, event_type: str, obj: dict[str, Any]) -> None:
        with self.cond:
            if self.cache.apply_metrics(event_type, obj):
                self._changed()

    def replace_pods(self, items: list[dict[str, Any]]) -> None:
        with self.cond:
            previous = dict(self.cache.pods)
            self.cache.replace_pods(items)
            pending = {
                uid
                for uid, pod in self.cache.pods.items()
                if uid not in self.cache.assumed and is_pending_for(pod, self.config.scheduler_name)
            }
            for uid in self.queue.uids():
                if uid not in pending and uid not in self.cache.assumed:
                    self.queue.remove(uid)
            self._pod_rules_waiting &= pending
            for uid in pending:
                self.queue.add(uid, *_queue_key(self.cache.pods[uid]))
            listed = {str(_meta(pod).get("uid", "")): pod for pod in items}
            listed.pop("", None)
            self.groups.replace_pods({uid: self.cache.pods.get(uid, pod) for uid, pod in listed.items()})
            nominated, self.nominated = self.nominated, {}
            for uid in pending:
                if uid in nominated:
                    self.nominated[uid] = nominated[uid]
                self._note_nomination(uid, self.cache.pods[uid], previous.get(uid))
            self._pod_lists += 1
            self._changed()

    def apply_pod(self, event_type: str, pod: dict[str, Any]) -> None:
        uid = str(_meta(pod).get("uid", ""))
        with self.cond:
            old = self.cache.pods.get(uid)
            before = _relevant(old)
            ours = uid in self.cache.assumed
            change = self.cache.apply_pod(event_type, pod)
            current = self.cache.pods.get(uid)
            self._note_nomination(uid, current, old)
            if event_type == "DELETED":
                self.groups.drop_pod(uid)
            elif uid:
                # the cache's view when it keeps one (it may know better); finished, gated or
                # another scheduler's pods as they are: their group's status counts them too. A
                # new member, queued below, decides its whole group when popped: waking the
                # others too cost O(members) per member added
                self.groups.set_pod(uid, current if current is not None else pod)
            if change == PodChange.GONE:
                self.queue.remove(uid)
                self._pod_rules_waiting.discard(uid)
                self._changed()
            elif change == PodChange.BOUND:
                self.queue.remove(uid)
                self._pod_rules_waiting.discard(uid)
                ref = self.groups.of.get(uid)
                if not ours and isinstance(ref, GroupRef):
                    self._wake_group(ref)  # bound by another scheduler: it counts towards the minimum
                if self._pod_rules_waiting:  # a placed pod's labels may satisfy a waiting pod's rules
                    self._changed()
            elif change == PodChange.PENDING and uid not in self.cache.assumed:
                if uid not in self.queue or before != _relevant(pod):
                    self.queue.update(uid, *_queue_key(pod))
                    self.cond.notify_all()

    def replace_groups(self, api: str, items: list[dict[str, Any]]) -> None:
        with self.cond:
            self.groups.replace_groups(api, items)
            self._changed()

    def apply_group(self, api: str, event_type: str, obj: dict[str, Any]) -> None:
        with self.cond:
            if event_type == "DELETED":
                ref = self.groups.delete_group(api, obj)
                self._group_deadlines.pop(ref, None)
                self._alone.pop(ref, None)
                if self._blocking == ref:
                    self._blocking = None
                self._changed()  # what its members were held back by may go now
            else:
                self._wake_group(self.groups.put_group(api, obj))

    def _wake_group(self, ref: GroupRef) -> None:
        """The group's parked members may be tried again (after their backoff)."""
        for uid in self.groups.members.get(ref, ()):
            pod = self.cache.pods.get(uid)
            if pod is not None and self.queue.where(uid) == "parked":
                self.queue.update(uid, *_queue_key(pod))
        self.cond.notify_all()

    def replace_namespaces(self, items: list[dict[str, Any]]) -> None:
        with self.cond:
            self.cache.replace_namespaces(items)
            self._changed()

    def apply_namespace(self, event_type: str, namespace: dict[str, Any]) -> None:
        with self.cond:
            if self.cache.apply_namespace(event_type, namespace):
                self._changed()  # a namespace selector of a pod affinity term may match now

    def replace_budgets(self, items: list[dict[str, Any]]) -> None:
        with self.cond:
            self.budgets = {}
            for item in items:
                self._put_budget("ADDED", item)
            self._changed()

    def apply_budget(self, event_type: str, pdb: dict[str, Any]) -> None:
        with self.cond:
            self._put_budget(event_type, pdb)
            self._changed()  # a budget that allows more disruptions may let a preemption happen

    def _put_budget(self, event_type: str, pdb: Mapping[str, Any]) -> None:
        key = pod_key(pdb)
        parsed = budget(pdb) if event_type != "DELETED" else None
        if parsed is None:
            self.budgets.pop(key, None)
        else:
            self.budgets[key] = parsed

    def _note_nomination(
        self, uid: str, pod: Mapping[str, Any] | None, old: Mapping[str, Any] | None = None
    ) -> None:
        """Keep ``nominated`` in step with the pods' ``status.nominatedNodeName``. As in
        kube-scheduler, a pending pod seen without one, when it had none before either, keeps the
        node this replica nominated it to: the patch that sets it may simply not have landed yet
        (another status update, or a list, came first)."""
        if pod is None or not is_pending_for(pod, self.config.scheduler_name):
            self.nominated.pop(uid, None)
            return
        node = _nominated_node(pod)
        if node:
            self.nominated[uid] = node
        elif old is None or _nominated_node(old):
            self.nominated.pop(uid, None)  # cleared in the API (or never seen): none

    def _changed(self) -> None:
        """Something freed or added room: parked pods may fit now."""
        self.queue.move_all()
        self.cond.notify_all()

    def _watch_staleness(self) -> None:
        while not self.stop_event.wait(STALENESS_CHECK_SECONDS):
            with self.cond:
                if self.cache.expire_metrics():
                    self._changed()
                if self.cache.exclusions_flipped():
                    self._nodes_changed = True
                    self._nodes_changed_for_groups()
                    self._changed()
                self.post_node_events()
                self.write_group_statuses()

    def post_node_events(self) -> None:
        """While leading: Events on nodes whose publication turned invalid or valid (rate-limited)."""
        if not self.leading.is_set() or not (self._nodes_changed or self.node_events.pending):
            return
        self.node_events.update(self.cache.facts, self.cache.now(), self._nodes_changed)
        self._nodes_changed = False

    # --- the core's view ----------------------------------------------------------------------------

    def _bind_policy(self, cluster: ClusterState) -> None:
        """Give the policy the cluster and the workload it should plan for."""
        workload = self._workload()
        self.policy.bind(cluster, workload, self.rng)
        self._planned_shapes = {request.shape() for request in workload}

    def _request(self, uid: str, pod: dict[str, Any]) -> PodRequest | PodSpecError:
        """The pod's scheduling request (or why it is invalid), parsed once per resourceVersion."""
        version = _meta(pod).get("resourceVersion", "")
        cached = self._requests.get(uid)
        if cached is None or cached[0] != version:
            try:
                cached = (version, pod_request(pod, self.config.gpu_resource))
            except PodSpecError as error:
                cached = (version, error)
            # a shape the API would not serve
            except (AttributeError, TypeError, ValueError, ArithmeticError) as error:
                cached = (version, PodSpecError(f"pod spec unreadable: {str(error)[:200]}"))
            self._requests[uid] = cached
        return cached[1]

    def _workload(self) -> list[PodRequest]:
        """The pods the cluster runs and waits for: what fragmentation-aware scores plan for.

        FGD judges a placement against the typical pods of the workload; live, that is the pods we
        know.
        """
        requests = [self._request(uid, pod) for uid, pod in self.cache.pods.items()]
        for uid in set(self._requests) - set(self.cache.pods):
            del self._requests[uid]
        return [r for r in requests if isinstance(r, PodRequest)]

    def _view(self) -> ClusterState:
        rebuilds = self.cache.rebuilds
        cluster = self.cache.view()
        if self.cache.rebuilds != rebuilds:
            self._bind_policy(cluster)
            self.metrics.nodes.labels("usable").set(len(cluster))
            self.metrics.nodes.labels("excluded").set(len(self.cache.excluded))
        return cluster

    # --- scheduling ----------------------------------------------------------------------------------

    def _fence_passed(self) -> bool:
        """False while a new leader must still wait or list (then the caller waits and retries)."""
        if self._fence is None:
            return True
        until, lists_needed = self._fence
        if self.clock() < until:
            return False
        if lists_needed is None:
            self._fence = (until, self._pod_lists + 1)
            try:
                self.cond.release()  # the list takes its time; the handler takes the lock itself
                try:
                    self.pod_reflector.list_once()
                finally:
                    self.cond.acquire()
            except Exception as error:  # try again after a backoff
                log_event(log, "leader.relist_failed", logging.WARNING, error=str(error)[:300])
                self._fence = (self.clock() + self.config.backoff_initial_seconds, None)
                return False
        if self._pod_lists >= (self._fence[1] or 0):
            self._fence = None
            log_event(log, "leader.fenced", identity=self.config.identity)
            return True
        return False

    def _wait_seconds(self, timeout: float) -> float:
        now = self.clock()
        wait = timeout
        ready = self.queue.wait_seconds()
        if ready is not None:
            wait = min(wait, ready)
        read_at = self.cache.next_read_at()
        if read_at is not None:
            wait = min(wait, max(0.0, read_at - now))
        if self._fence is not None:
            wait = min(wait, max(0.01, self._fence[0] - now))
        if self._group_deadlines:
            wait = min(wait, max(0.0, min(self._group_deadlines.values()) - now))
        return max(0.0, wait)

    def schedule_next(self, timeout: float) -> bool:
        """Decide one pod if one is ready within ``timeout``; True if one was handled."""
        with self.cond:
            if not self.leading.is_set():
                return False
            if not self._fence_passed():
                self.cond.wait(self._wait_seconds(timeout))
                return False
            self._start_reads()
            self._wake_timed_out_groups()
            uid = self.queue.pop()
            if uid is None:
                self._set_queue_metrics()
                wait = self._wait_seconds(timeout)
                if wait > 0:
                    self.cond.wait(wait)
                return False
            self._popped_at = time.perf_counter()
            pod = self.cache.pods.get(uid)
            if uid in self.cache.assumed:
                self.queue.hold(uid)
                return True
            if pod is None or not is_pending_for(pod, self.config.scheduler_name):
                self.queue.remove(uid)
                return True
            try:
                ref = self.groups.of.get(uid)
                if ref is not None:
                    self._decide_member(uid, pod, ref, self._view())
                elif not self._held_back(uid, pod):
                    self._decide(uid, pod, self._view())
            except Exception as error:  # a bug or an input nobody foresaw: costs only this pod
                self._decide_failed(uid, pod, error)
            self._set_queue_metrics()
            return True

    def tend(self, timeout: float) -> None:
        """What ``schedule_next`` does besides deciding pods, for a replica that decides none
        itself (the extender): pass a new leader's fence, read back Bindings of unknown outcome,
        then wait up to ``timeout`` for the next of those to be due.

        It waits by the clock (and for leadership or stop), not on ``cond``: ``cond`` is notified
        at every pod event and every Binding for the scheduling loop, which such a replica does
        not run, and each notification woke this thread for nothing (twice a pod, each a thread
        switch taking the GIL and the lock from the extender's verbs)."""
        wait: float | None = None
        with self.cond:
            if self.leading.is_set():
                if self._fence_passed():
                    self._start_reads()
                wait = timeout
                read_at = self.cache.next_read_at()
                if read_at is not None:
                    wait = min(wait, max(0.0, read_at - self.clock()))
                if self._fence is not None:
                    wait = min(wait, max(0.01, self._fence[0] - self.clock()))
        if wait is None:
            self.leading.wait(timeout)  # returns as soon as this replica leads
        else:
            self.stop_event.wait(wait)

    @property
    def fenced(self) -> bool:
        """A new leader still waiting out a former leader's Bindings (decides nothing yet)."""
        return self._fence is not None

    def _decide_failed(self, uid: str, pod: dict[str, Any], error: Exception) -> None:
        """Deciding the pod raised: log it, tell the pod, park it until the cluster changes
        (with its backoff), and keep scheduling the others."""
        self._count_attempt("error")
        log_event(
            log,
            "pod.decide_failed",
            logging.ERROR,
            pod=pod_key(pod),
            error=f"{type(error).__name__}: {str(error)[:300]}",
        )
        if uid not in self.cache.assumed:
            self.queue.park(uid)
        reason = f"{type(error).__name__}: {str(error)[:200]}"
        self._emit_failed(pod, f"kubegpu could not decide this pod: {reason}", "SchedulerError")

    def _count_attempt(self, result: str) -> None:
        """The scheduling thread's attempt ended with ``result`` (kubegpu's: scheduled, unschedulable,
        invalid, error): kubegpu's count, and kube-scheduler's but for a placed pod, whose attempt
        ends with its Binding (``_bind``)."""
        self.metrics.attempts.labels(result).inc()
        if result != "scheduled":
            seconds = time.perf_counter() - self._popped_at
            self.metrics.attempt(self.config.scheduler_name, KUBE_RESULT[result], seconds)

    def _attempt(self, uid: str) -> Attempt:
        """The scheduling thread's attempt for pod ``uid`` (under the lock)."""
        return Attempt(self._popped_at, self.queue.attempts(uid) + 1)

    def _set_queue_metrics(self) -> None:
        self.metrics.queues(self.queue.counts)
        self.metrics.assumed.set(len(self.cache.assumed))

    def _decide(self, uid: str, pod: dict[str, Any], cluster: ClusterState) -> None:
        started = time.perf_counter()
        request = self._request(uid, pod)
        if isinstance(request, PodSpecError):
            self._count_attempt("invalid")
            self.queue.park(uid, until_pod_changes=True)
            self._emit_failed(pod, f"invalid kubegpu request: {request}")
            return
        if request.shape() not in self._planned_shapes:
            self._bind_policy(cluster)  # a kind of pod the policy has not planned for: re-plan
        with self.nominated_room_kept(uid, request, cluster):
            result = schedule_one(request, cluster, self.policy, self.rng)
            preempted = None if isinstance(result, Placement) else self._preempt(uid, pod, request, cluster)
        self.metrics.decided(time.perf_counter() - started)
        if not isinstance(result, Placement):
            self._count_attempt("unschedulable")
            self.queue.park(uid)
            placement = request.placement
            if placement is not None and placement.rules.uses_pods:
                self._pod_rules_waiting.add(uid)
            excluded_count, reasons = merge_reasons(result.reasons, self.cache.excluded)
            message = unschedulable_message(result.total_nodes + excluded_count, reasons)
            if preempted is not None:
                message += f" Preempting {len(preempted.pods)} pod(s) on node {preempted.node}."
            self._emit_failed(pod, message)
            return
        self._pod_rules_waiting.discard(uid)
        try:
            self.cache.assume(uid, result.allocation, self.clock(), _facts(request))
        except AllocationConflict as error:  # a core bug: never bind what cannot be booked
            self._count_attempt("error")
            log_event(
                log, "pod.assume_failed", logging.ERROR, pod=pod_key(pod), node=result.node, reason=str(error)
            )
            self.queue.requeue(uid, *_queue_key(pod))
            return
        self._count_attempt("scheduled")
        self.queue.hold(uid)  # keeps its attempts: a Binding that fails backs off from there
        self._submit(self._bind, pod, result.allocation, self._attempt(uid))

    # --- pod groups (docs/gang.md) -----------------------------------------------------------------

    def _decide_member(
        self, uid: str, pod: dict[str, Any], ref: GroupRef | GroupError, cluster: ClusterState
    ) -> None:
        """A pod that joins a group: wait for the group to exist and be valid, then decide the
        whole group (or, under Kubernetes' ``basic`` policy, the pod alone)."""
        if isinstance(ref, GroupError):
            self._count_attempt("invalid")
            self.queue.park(uid, until_pod_changes=True)
            self._emit_failed(pod, f"invalid kubegpu request: {ref}")
            return
        spec = self.groups.specs.get(ref)
        if not isinstance(spec, GroupSpec):
            self._count_attempt("unschedulable")
            self.queue.park(uid)  # woken when the PodGroup appears or changes
            if spec is None and any(r.forbidden for r in self.group_reflectors if r.name == ref.kind):
                self._emit_failed(
                    pod,
                    f"cannot see pod group {ref}: the scheduler is forbidden to list {ref.kind} "
                    "(403; its RBAC lacks the rule, docs/gang.md)",
                )
            elif spec is None:
                self._emit_failed(pod, f"waiting for pod group {ref} ({ref.kind}) to exist")
            else:
                self._emit_failed(pod, f"pod group {ref} ({ref.kind}) is invalid: {spec}")
            return
        if not spec.gang:
            if not self._held_back(uid, pod):
                self._decide(uid, pod, cluster)
            return
        if ref != self._blocking and self._held_back(uid, pod, ref):
            return  # another group's GPU pods wait behind the starving one as single pods do
        self._decide_group(ref, spec, uid, cluster)

    def group_member_requests(
        self, ref: GroupRef, cluster: ClusterState, any_scheduler: bool = False
    ) -> Iterator[tuple[str, Mapping[str, Any], PodRequest | PodSpecError, bool]]:
        """The group's members a plan counts, in uid order: (uid, pod, its request or why it is
        invalid, whether it waits); placed ones and those waiting, no other. Waiting: for this
        scheduler, or with ``any_scheduler`` for the scheduler its pod names (the pod then also
        from the group book, which keeps every member as last seen, where the cache does not).
        No side effects (the extender's choose plans from it too)."""
        for uid in sorted(self.groups.members.get(ref, ())):
            pod = self.cache.pods.get(uid)
            if pod is None and any_scheduler:
                pod = self.groups.pods.get(uid)
            if pod is None:
                continue
            name = self.config.scheduler_name
            if any_scheduler:
                name = str((pod.get("spec") or {}).get("schedulerName"))
            waiting = uid not in self.cache.assumed and is_pending_for(pod, name)
            if not waiting and uid not in cluster.where:
                continue  # finished, deleting, gated, another scheduler's, or on a node kubegpu skips
            yield uid, pod, self._request(uid, pod), waiting

    def _group_members(
        self, ref: GroupRef, cluster: ClusterState
    ) -> tuple[list[PodRequest], list[str], int]:
        """The group's members the plan counts (placed ones and those waiting for this
        scheduler), the uids of those waiting, and how many are placed. A waiting member whose
        request is invalid is parked with its Event and left out."""
        requests: list[PodRequest] = []
        pending: list[str] = []
        placed = 0
        for uid, pod, request, waiting in self.group_member_requests(ref, cluster):
            if isinstance(request, PodSpecError):
                if waiting:
                    self.queue.park(uid, until_pod_changes=True)
                    self._emit_failed(pod, f"invalid kubegpu request: {request}")
                continue
            requests.append(request)
            if waiting:
                pending.append(uid)
            else:
                placed += 1
        return requests, pending, placed

    def _decide_group(self, ref: GroupRef, spec: GroupSpec, popped: str, cluster: ClusterState) -> None:
        """Plan the group whole (scheduler/core/gang.py); assume and bind every placed member, or
        none. Members not placed wait parked; the group's clock runs until its minimum is placed."""
        started = time.perf_counter()
        now = self.clock()
        progress = self.groups.trying(ref, now, dt.datetime.now(dt.UTC))
        if progress.placed:  # placed before, short of its minimum again (a Binding not stored)
            progress.placed, progress.first_try, progress.timed_out = False, now, False
        known = len(self.groups.members.get(ref, ()))
        if known >= spec.min_member:
            progress.short_since = None
        elif progress.short_since is None:
            progress.short_since = now
        if (
            known < spec.min_member
            and (now - progress.told_at < EVENT_REPEAT_SECONDS or self._members_arriving(progress, now))
            and isinstance(self._request(popped, self.cache.pods[popped]), PodRequest)
        ):
            # fewer pods than its minimum exist: the popped member waits, in O(1); the whole group
            # is looked at (and told) at most every EVENT_REPEAT_SECONDS while its members arrive,
            # and not at all within gangMemberGraceSeconds of its first being short
            message = f"pod group {ref} has {known} of its {spec.min_member} minimum members; waiting "
            message += "for the others"
            self._group_failed(ref, spec, [popped], 0, message, known, now, popped)
            return
        requests, pending, placed = self._group_members(ref, cluster)
        if not pending:
            return
        wanted = min_resources_wanted(spec, self.config.gpu_resource)
        gap = resource_gap(cluster, wanted, self.groups.members.get(ref, ())) if wanted else {}
        if gap:
            never = capacity_gap(cluster, wanted)
            if never:
                lacking = ", ".join(f"{name} {amount}" for name, amount in never.items())
                self._group_never_fits(ref, spec, pending, f"pod group {ref} can never fit this cluster: "
                                       f"the cluster lacks its minResources (short by {lacking}) even "
                                       "with nothing running; waiting for its nodes to change")
                return
            lacking = ", ".join(f"{name} {amount}" for name, amount in gap.items())
            self._group_failed(ref, spec, pending, placed, f"pod group {ref}: the cluster lacks its "
                               f"minResources (short by {lacking})", len(requests), now, popped)
            return
        by_uid = {r.uid: r for r in requests}
        lead = by_uid.get(popped) or by_uid[pending[0]]
        group = GroupRequest(
            str(ref), spec.min_member, tuple(requests), spec.domain_key or self.config.gang_domain_label
        )
        with self.nominated_room_kept(popped, lead, cluster, frozenset(by_uid)):
            result = schedule_group(group, cluster, self.policy, self.rng)
            preempted = None
            if isinstance(result, GroupUnschedulable) and len(requests) >= spec.min_member:
                preempted = self._preempt_for_group(ref, group, pending, cluster)
        self.metrics.decided(time.perf_counter() - started)
        if isinstance(result, GroupUnschedulable):
            message = result.message()
            impossible = never_fits(group, cluster) if len(requests) >= spec.min_member else ""
            if impossible:
                self._group_never_fits(ref, spec, pending, f"pod group {ref} can never fit this cluster: "
                                       f"{impossible}; waiting for its nodes to change")
                return
            if preempted is not None:
                nodes = sorted({p.node for p in preempted.plan.placements})
                message += f" Preempting {len(preempted.victims)} pod(s) on node(s) {', '.join(nodes)}."
            could_fit = True  # the starvation guard holds pods back only for a group that could fit
            waited = now - self.groups.progress[ref].first_try
            if (
                self._blocking in (None, ref)
                and waited >= self.config.gang_starvation_seconds
                and len(requests) >= spec.min_member
            ):
                # it depends on the nodes and the members only: worked out once per both
                key = (self._node_epoch, spec.min_member, group.domain_key, tuple(sorted(by_uid)))
                cached = self._alone.get(ref)
                if cached is None or cached[0] != key:
                    cached = self._alone[ref] = (key, fits_alone(group, cluster, self.policy, self.rng))
                could_fit = cached[1]
            self._group_failed(ref, spec, pending, placed, message, len(requests), now, popped, could_fit)
            return
        self._place_group(ref, result, by_uid, pending)

    def _preempt_for_group(
        self, ref: GroupRef, group: GroupRequest, pending: list[str], cluster: ClusterState
    ) -> GroupVictims | None:
        """If evicting lower-priority pods lets the group's minimum fit whole, evict just those
        (through the Eviction API) and nominate each planned member's node; never for a group
        that would still not fit. Not again while an earlier preemption's victims terminate on a
        node its members are nominated to (kube-scheduler's rule for a pod); otherwise its
        members' nominations that no plan backs any more are cleared, as kube-scheduler clears a
        preemptor's that finds nothing: they would keep their room from lower-priority pods for
        good, and an eviction that was refused would never be tried again."""
        waiting = [m for m in group.members if m.uid in set(pending)]
        priority = min(_priority(m) for m in waiting)
        on_nominated = []
        for node in {self.nominated[m.uid] for m in waiting if m.uid in self.nominated}:
            if node in cluster.index:
                allocations = cluster.nodes[cluster.index[node]].allocations
                on_nominated += [running_pod(a, self.cache.pods.get(u)) for u, a in allocations.items()]
        if not eligible(PREEMPT_LOWER, on_nominated, priority)[0]:
            return None  # room is being freed for it already
        chosen = self._group_victims(ref, group, pending, cluster)
        planned = set() if chosen is None else {p.allocation.pod_uid for p in chosen.plan.placements}
        for member in waiting:
            if member.uid in self.nominated and member.uid not in planned:
                del self.nominated[member.uid]
                pod = self.cache.pods[member.uid]
                if _nominated_node(pod):
                    self._submit(self._nominate, pod, None)
        return chosen

    def _group_victims(
        self, ref: GroupRef, group: GroupRequest, pending: list[str], cluster: ClusterState
    ) -> GroupVictims | None:
        """The preemption itself (``_preempt_for_group``): choose, evict and nominate."""
        waiting = [m for m in group.members if m.uid in set(pending)]
        if any(m.placement is not None and m.placement.rules.preemption_policy == PREEMPT_NEVER
               for m in waiting):
            return None
        priority = min(_priority(m) for m in waiting)
        members = {m.uid for m in group.members}
        protected = set(self.cache.assumed) | {u for u in self.nominated if u in cluster.where} | members
        exhausted = [b for b in self.budgets.values() if b.disruptions_allowed <= 0]
        ranked = []
        for uid in cluster.where:
            pod = self.cache.pods.get(uid)
            if uid in protected or pod is None or _meta(pod).get("deletionTimestamp"):
                continue
            victim_priority = _pod_priority(pod)
            if victim_priority >= priority:
                continue
            alloc = cluster.nodes[cluster.where[uid]].allocations[uid]
            guarded = any(b.covers(running_pod(alloc, pod)) for b in exhausted)
            ranked.append((not guarded, -victim_priority, uid))  # keep guarded, then important, first
        if not ranked:
            return None
        chosen = group_preemption(group, cluster, self.policy, self.rng, [uid for *_, uid in sorted(ranked)])
        if chosen is None:
            return None
        lead = self.cache.pods[pending[0]]
        log_event(
            log,
            "group.preempting",
            group=str(ref),
            api=ref.api,
            victims=[pod_key(self.cache.pods[v]) for v in chosen.victims],
            nodes=sorted({p.node for p in chosen.plan.placements}),
        )
        self.metrics.preemptions.inc()
        for victim in chosen.victims:
            victim_pod = self.cache.pods[victim]
            node = cluster.nodes[cluster.where[victim]].name
            self._submit(self._evict, victim_pod, lead, node)
        for placement in chosen.plan.placements:
            uid = placement.allocation.pod_uid
            self.nominated[uid] = placement.node
            self._submit(self._nominate, self.cache.pods[uid], placement.node)
        return chosen

    def _place_group(
        self, ref: GroupRef, result: GroupPlacement, by_uid: Mapping[str, PodRequest], pending: list[str]
    ) -> None:
        assumed: list[Allocation] = []
        try:
            for placement in result.placements:
                alloc = placement.allocation
                self.cache.assume(alloc.pod_uid, alloc, self.clock(), _facts(by_uid[alloc.pod_uid]))
                assumed.append(alloc)
        except AllocationConflict as error:  # a core bug: never bind part of what was planned
            for alloc in assumed:
                self.cache.release(alloc.pod_uid)
            self._count_attempt("error")
            log_event(
                log, "group.assume_failed", logging.ERROR, group=str(ref), api=ref.api, reason=str(error)
            )
            for uid in pending:
                self.queue.requeue(uid, *_queue_key(self.cache.pods[uid]))
            return
        for uid in result.waiting:
            self.queue.park(uid)  # extras beyond the minimum: placed when room appears
        for alloc in assumed:
            self._count_attempt("scheduled")
            self.queue.hold(alloc.pod_uid)
            self._submit(self._bind, self.cache.pods[alloc.pod_uid], alloc, self._attempt(alloc.pod_uid))
        progress = self.groups.progress[ref]
        progress.placed, progress.message, progress.timed_out = True, "", False
        self._group_deadlines.pop(ref, None)
        self.groups.dirty.add(ref)
        if self._blocking == ref:
            self._blocking = None
            self._changed()
        log_event(
            log,
            "group.placed",
            group=str(ref),
            api=ref.api,
            pods=[a.pod_name for a in assumed],
            nodes=list(result.nodes),
            domain=result.domain or "",
            waiting=len(result.waiting),
        )

    def _group_failed(
        self,
        ref: GroupRef,
        spec: GroupSpec,
        pending: list[str],
        placed: int,
        message: str,
        members: int,
        now: float,
        popped: str = "",
        could_fit: bool = True,
    ) -> None:
        """The group's minimum does not fit now: park its waiting members, tell them (and the
        PodGroup) why; past its timeout, report that once; past the starvation bound, hold back
        the pods queued behind it. Every member (and the PodGroup) is told at most every
        EVENT_REPEAT_SECONDS, in between only the ``popped`` one, and the group is tried again
        then to tell the rest: a group of N members that arrive one by one, each deciding the
        group with a new count, posted N^2/2 Events."""
        self._count_attempt("unschedulable")
        progress = self.groups.progress[ref]
        if 0 < placed < spec.min_member:
            message += f" ({placed} of its {spec.min_member} minimum members are placed already)"
        for uid in pending:
            self.queue.park(uid)
        waited = now - progress.first_try
        timed_out = progress.timed_out
        message = self._timeout_message(ref, spec, message, now)
        if message != progress.message:
            progress.message = message
            self.groups.dirty.add(ref)
        told = pending
        arriving = members < spec.min_member and self._members_arriving(progress, now)
        if arriving and progress.timed_out == timed_out:
            # its members are still arriving: nobody is told (kube-scheduler's GangScheduling
            # gates them silently at PreEnqueue); tried again when the grace is over, to tell them
            told = []
            assert progress.short_since is not None
            again = progress.short_since + self.config.gang_member_grace_seconds
            self._group_deadlines[ref] = min(self._group_deadlines.get(ref, again), again)
        elif now - progress.told_at < EVENT_REPEAT_SECONDS and progress.timed_out == timed_out:
            told = [popped] if popped in pending else []
            again = progress.told_at + EVENT_REPEAT_SECONDS
            self._group_deadlines[ref] = min(self._group_deadlines.get(ref, again), again)
        else:
            progress.told_at = now
            if message != progress.told:
                progress.told = message
                self._submit(self._post_group_event, ref, spec.uid, "Unschedulable", message, "Warning")
        for uid in told:
            self._emit_failed(self.cache.pods[uid], message)
        if (members < spec.min_member or not could_fit) and self._blocking == ref:
            self._blocking = None  # short of members, or would not fit even alone: not GPUs it waits for
            self._changed()
        if (
            waited >= self.config.gang_starvation_seconds
            and members >= spec.min_member
            and could_fit
            and self._blocking is None
        ):
            self._blocking = ref
            log_event(log, "group.holding_back", group=str(ref), api=ref.api, waited_seconds=round(waited))

    def _members_arriving(self, progress: GroupProgress, now: float) -> bool:
        """The group has been short of members for less than gangMemberGraceSeconds: the rest
        are taken to be on their way (a Job's controller creating its pods), and its waiting
        members get no Event yet."""
        since = progress.short_since  # compared as the deadline is set, so waking at it ends the grace
        return since is not None and now < since + self.config.gang_member_grace_seconds

    def _timeout_message(self, ref: GroupRef, spec: GroupSpec, message: str, now: float) -> str:
        """Before its timeout: wake the group then, to report it. Past it, the first time: report
        the timeout (Event on the PodGroup, log line) and return the message that says it."""
        progress = self.groups.progress[ref]
        waited = now - progress.first_try
        timeout = spec.timeout_seconds or self.config.gang_timeout_seconds
        if waited < timeout:
            self._group_deadlines[ref] = progress.first_try + timeout  # to report it then
        elif not progress.timed_out:
            progress.timed_out = True
            message = f"pod group {ref} timed out after {waited:.0f}s, retrying with backoff: {message}"
            log_event(log, "group.timed_out", logging.WARNING, group=str(ref), api=ref.api, reason=message)
            self._submit(self._post_group_event, ref, spec.uid, "Timeout", message, "Warning")
        return message

    def _group_never_fits(self, ref: GroupRef, spec: GroupSpec, pending: list[str], message: str) -> None:
        """The group cannot fit the cluster's nodes even empty: its members wait, parked until a
        node changes (or they or the PodGroup do), instead of retrying at every pod's change. Its
        timeout is reported as any other group's."""
        self._count_attempt("unschedulable")
        progress = self.groups.progress[ref]
        message = self._timeout_message(ref, spec, message, self.clock())
        for uid in pending:
            self.queue.park(uid, until_pod_changes=True)
            self._emit_failed(self.cache.pods[uid], message)
        self._never_fits.add(ref)
        if self._blocking == ref:  # nothing it could wait for: the pods held back behind it go on
            self._blocking = None
            self._changed()
        if message != progress.message:
            progress.message = message
            self.groups.dirty.add(ref)
            self._submit(self._post_group_event, ref, spec.uid, "Unschedulable", message, "Warning")

    def _nodes_changed_for_groups(self) -> None:
        """Nodes changed: groups that could never fit the old ones are tried again."""
        refs, self._never_fits = self._never_fits, set()
        self._node_epoch += 1
        for ref in refs:
            self._wake_group(ref)

    def _wake_timed_out_groups(self) -> None:
        """Groups still waiting when their timeout comes are tried once more, which reports them
        (nothing else may change in the cluster to wake them)."""
        now = self.clock()
        for ref, deadline in list(self._group_deadlines.items()):
            if deadline <= now:
                del self._group_deadlines[ref]
                self._wake_group(ref)

    def _waiting_members(self, ref: GroupRef) -> list[tuple[str, dict[str, Any]]]:
        """The group's members waiting for this scheduler (uid, pod)."""
        members = [(u, self.cache.pods.get(u)) for u in self.groups.members.get(ref, ())]
        return [
            (u, p)
            for u, p in members
            if p is not None and u not in self.cache.assumed and is_pending_for(p, self.config.scheduler_name)
        ]

    def _held_back(self, uid: str, pod: dict[str, Any], group: GroupRef | None = None) -> bool:
        """While a group waits past ``gangStarvationSeconds``, GPU pods of no higher priority
        queued behind it are parked instead of taking the GPUs it waits for (docs/gang.md).
        ``group``: the popped pod decides this other gang whole, so the gang's waiting members
        are judged together (any asking for GPUs, at their highest priority)."""
        ref = self._blocking
        if ref is None:
            return False
        waiting = [p for _, p in self._waiting_members(ref)]
        if not isinstance(self.groups.specs.get(ref), GroupSpec) or not waiting:
            self._blocking = None
            return False
        behind = [(uid, pod)] if group is None else self._waiting_members(group)
        requests = [self._request(u, p) for u, p in behind]
        if not any(isinstance(r, PodRequest) and (r.whole_gpus or r.total_gpu_milli) for r in requests):
            return False
        if max(_pod_priority(p) for _, p in behind) > max(_pod_priority(p) for p in waiting):
            return False
        self.queue.park(uid)
        self._emit_failed(
            pod,
            f"waiting behind pod group {ref}, which has waited longer than gangStarvationSeconds "
            f"({self.config.gang_starvation_seconds:g}s) for GPUs",
        )
        return True

    def write_group_statuses(self) -> None:
        """While leading: write the status of the PodGroups whose members or progress changed
        (scheduler-plugins' counts and phase; Kubernetes' PodGroupInitiallyScheduled condition)."""
        if not self.leading.is_set():
            self.groups.dirty.clear()
            return
        now = rfc3339(dt.datetime.now(dt.UTC))
        for ref in sorted(self.groups.dirty):
            spec = self.groups.specs.get(ref)
            if not isinstance(spec, GroupSpec):
                continue
            uids = sorted(self.groups.members.get(ref, ()))
            pods = [self.groups.pods[u] for u in uids if u in self.groups.pods]
            if pods and not any(_scheduler_name(p) == self.config.scheduler_name for p in pods):
                continue  # another scheduler's group (scheduler-plugins, kube-scheduler): theirs to write
            progress = self.groups.progress.get(ref)
            patch: dict[str, Any] | None
            if ref.api == PLUGINS_API:
                start = progress.start_time if progress is not None else None
                patch = status_patch(spec.status, plugins_status(spec, pods, start))
            elif not spec.gang:
                patch = None
            else:
                # bound by a former leader (that died before writing it) counts as placed too
                placed = progress is not None and progress.placed
                scheduled = placed or member_counts(pods).scheduled >= spec.min_member
                reason = "Scheduled" if scheduled else "Unschedulable"
                text = "the group's minimum is placed" if scheduled else progress.message if progress else ""
                conditions = spec.status.get("conditions")
                condition = None
                if scheduled or progress is not None:
                    condition = initially_scheduled_condition(conditions, scheduled, reason, text, now, None)
                patch = None
                if condition is not None:
                    others = [
                        c
                        for c in (conditions if isinstance(conditions, list) else [])
                        if isinstance(c, Mapping) and c.get("type") != condition["type"]
                    ]
                    patch = {"status": {"conditions": [*others, condition]}}
            if patch is not None:
                self._submit(self._patch_group_status, ref, patch)
        self.groups.dirty.clear()

    def _patch_group_status(self, ref: GroupRef, patch: dict[str, Any]) -> None:
        version = PLUGINS_VERSION if ref.api == PLUGINS_API else KUBE_VERSION
        try:
            drain(
                self.custom_api.patch_namespaced_custom_object_status(
                    ref.api, version, ref.namespace, PLURAL, ref.name, patch, _preload_content=False
                )
            )
        except Exception as error:  # written again at the group's next change
            log_event(
                log,
                "group.status_failed",
                logging.WARNING,
                group=str(ref),
                api=ref.api,
                error=str(error)[:200],
            )
            return
        log_event(log, "group.status", group=str(ref), api=ref.api, status=patch["status"])

    def _post_group_event(self, ref: GroupRef, uid: str, reason: str, message: str, kind: str) -> None:
        """An Event on the PodGroup object (best effort)."""
        version = PLUGINS_VERSION if ref.api == PLUGINS_API else KUBE_VERSION
        regarding = {
            "apiVersion": f"{ref.api}/{version}",
            "kind": "PodGroup",
            "name": ref.name,
            "namespace": ref.namespace,
            "uid": uid,
        }
        try:
            self._create_event(regarding, reason, message, kind, SCHEDULING)
        except Exception as error:
            log_event(log, "event.failed", logging.WARNING, group=str(ref), error=str(error)[:200])

    # --- nominated pods and preemption ------------------------------------------------------------

    @contextlib.contextmanager
    def nominated_room_kept(
        self, uid: str, request: PodRequest, cluster: ClusterState, group: frozenset[str] = frozenset()
    ) -> Iterator[None]:
        """While inside, the room of pods nominated to a node (of no lower priority) is booked for
        them (``_reserve_nominated``); forgotten again on leaving, whatever happened inside."""
        reserved = self._reserve_nominated(uid, request, cluster, group)
        try:
            yield
        finally:
            for other in reserved:
                cluster.forget(other)

    def _reserve_nominated(
        self, uid: str, request: PodRequest, cluster: ClusterState, group: frozenset[str] = frozenset()
    ) -> list[str]:
        """Book, for this decision only, the room of pods nominated to a node whose priority is at
        least this pod's (kube-scheduler counts them as placed): what a preemption freed goes to
        its preemptor. ``group``: the deciding pod's fellow members, whose room is their own.
        Returns the uids booked (the caller forgets them)."""
        if not self.nominated:
            return []
        priority = _priority(request)
        booked = []
        for other, node in sorted(self.nominated.items()):
            pod = self.cache.pods.get(other)
            i = cluster.index.get(node)
            if other == uid or other in group or pod is None or i is None or other in cluster.where:
                continue
            if other in self.cache.assumed:
                continue  # being bound where it was placed (its node may take no pods now)
            wanted = self._request(other, pod)
            if not isinstance(wanted, PodRequest) or _priority(wanted) < priority:
                continue
            alloc = allocate(wanted, cluster.nodes[i])
            if alloc is None:
                continue  # its room is not free yet (victims still terminating): nothing to hold
            try:
                cluster.assume(alloc, _facts(wanted))
            except AllocationConflict:
                continue
            booked.append(other)
        return booked

    def _preempt(
        self, uid: str, pod: dict[str, Any], request: PodRequest, cluster: ClusterState
    ) -> Victims | None:
        """If evicting lower-priority pods lets the pod fit, evict them (through the Eviction API,
        which honours PodDisruptionBudgets), nominate the node and return the victims."""
        self.metrics.preemption_attempts.inc()
        placement = request.placement
        priority = _priority(request)
        policy = placement.rules.preemption_policy if placement is not None else PREEMPT_LOWER
        nominated = self.nominated.get(uid)
        on_nominated: list[RunningPod] = []
        if nominated is not None and nominated in cluster.index:
            node = cluster.nodes[cluster.index[nominated]]
            on_nominated = [running_pod(a, self.cache.pods.get(u)) for u, a in node.allocations.items()]
        ok, why = eligible(policy, on_nominated, priority)
        if not ok:
            log_event(log, "pod.preemption_skipped", pod=pod_key(pod), reason=why)
            return None
        protected = set(self.cache.assumed) | {u for u in self.nominated if u in cluster.where}
        nodes = candidate_nodes(request, cluster, priority, self.cache.pods, protected)
        if not nodes:
            return None
        offers = [node_offer(cluster.nodes[i], self.cache.pods, protected) for i in nodes]
        best = choose(
            request, priority, offers, list(self.budgets.values()), fits_other=other_rules(placement, cluster)
        )
        if best is None:
            return None
        log_event(
            log,
            "pod.preempting",
            pod=pod_key(pod),
            node=best.node,
            victims=[p.name for p in best.pods],
            pdb_violations=best.pdb_violations,
        )
        self.metrics.preemptions.inc()
        self.metrics.preemption_victims.observe(len(best.pods))
        for victim in best.pods:
            victim_pod = self.cache.pods.get(victim.uid)
            if victim_pod is not None and not _meta(victim_pod).get("deletionTimestamp"):
                self._submit(self._evict, victim_pod, pod, best.node)
        lower = [
            other
            for other, node in self.nominated.items()
            if node == best.node and other != uid and _pod_priority(self.cache.pods.get(other)) < priority
        ]
        for other in lower:  # kube-scheduler: they may no longer fit there; let them look elsewhere
            del self.nominated[other]
            self._submit(self._nominate, self.cache.pods[other], None)
        self.nominated[uid] = best.node
        self._submit(self._nominate, pod, best.node)
        return best

    def _evict(self, victim: dict[str, Any], preemptor: dict[str, Any], node: str) -> None:
        meta = _meta(victim)
        if self.elector is not None and not self.elector.is_leader:
            # lost the lease since deciding: the new leader decides again whether to preempt
            log_event(log, "pod.eviction_skipped", pod=pod_key(victim), node=node, reason="not the leader")
            return
        name, namespace = meta.get("name", ""), meta.get("namespace", "")
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": meta.get("uid")}},
        }
        try:
            drain(self.core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False))
        except ApiException as error:
            outcome = "gone" if error.status in (404, 409) else str(error.status)
            self.metrics.evictions.labels(outcome).inc()
            log_event(
                log,
                "pod.eviction_failed" if outcome != "gone" else "pod.eviction_gone",
                logging.WARNING if outcome != "gone" else logging.INFO,
                pod=pod_key(victim),
                node=node,
                preemptor=pod_key(preemptor),
                status=outcome,
                reason=str(error.reason or "")[:200],
            )
            return
        except Exception as error:
            self.metrics.evictions.labels("error").inc()
            log_event(
                log, "pod.eviction_failed", logging.WARNING, pod=pod_key(victim), error=str(error)[:300]
            )
            return
        self.metrics.evictions.labels("ok").inc()
        log_event(log, "pod.evicted", pod=pod_key(victim), node=node, preemptor=pod_key(preemptor))
        self._post_event(
            victim,
            "Preempted",
            f"Preempted by pod {_meta(preemptor).get('uid', '')} on node {node}",
            "Normal",
            PREEMPTING,
        )

    def _nominate(self, pod: dict[str, Any], node: str | None) -> None:
        """Set (or clear, ``node`` None) the pod's ``status.nominatedNodeName``."""
        meta = _meta(pod)
        try:
            drain(
                self.core.patch_namespaced_pod_status(
                    meta.get("name"),
                    meta.get("namespace"),
                    {"status": {"nominatedNodeName": node}},
                    _preload_content=False,
                )
            )
        except Exception as error:  # the local nomination holds the room meanwhile; a retry sets it
            log_event(log, "pod.nomination_failed", logging.WARNING, pod=pod_key(pod), error=str(error)[:200])

    # --- binding (binder threads) -----------------------------------------------------------------

    def _bind(self, pod: dict[str, Any], alloc: Allocation, attempt: Attempt | None = None) -> str:
        """Bind the pod (``_send_binding``) and return the outcome. ``attempt``: this scheduler's
        attempt that placed the pod: the Binding ends it, counted as kube-scheduler counts it, and
        a stored one gets kube-scheduler's ``Scheduled`` Event, posted by another binder job so
        that it delays no Binding. None for the extender's bind: kube-scheduler, which asked,
        does both itself."""
        outcome = self._send_binding(pod, alloc)
        if attempt is None or outcome == "not-leader":  # not-leader: never sent, the new leader decides
            return outcome
        seconds = time.perf_counter() - attempt.popped_at
        if outcome != "ok":
            self.metrics.attempt(self.config.scheduler_name, "error", seconds)
            return outcome
        self.metrics.attempt(self.config.scheduler_name, "scheduled", seconds)
        self.metrics.pod_attempts.observe(attempt.number)
        self._submit(self._post_scheduled, pod, alloc.node)
        return outcome

    def _send_binding(self, pod: dict[str, Any], alloc: Allocation) -> str:
        """POST the pod's Binding with its signed allocation; the outcome: ``ok``, or what the
        Binding met (``not-leader``, ``error``, an HTTP status), already handled here."""
        meta = _meta(pod)
        uid, name, namespace = meta.get("uid", ""), meta.get("name", ""), meta.get("namespace", "")
        binding: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": alloc.node},
        }
        devices = list(alloc.device_ids())
        if self.elector is not None and not self.elector.is_leader:
            # Lost the lease since deciding: never sent; the new leader decides this pod.
            self._bind_outcome(pod, alloc, "not-leader", release=True, retry=False)
            return "not-leader"
        annotation: str | None = None
        signed = None
        try:
            if alloc.gpus or alloc.rdma:
                key = self.keys.signing_key(self.config.signing_key_id)
                if key is None:
                    raise RuntimeError(
                        f"private signing key {self.config.signing_key_id!r} not in {self.config.keys_dir}"
                    )
                signed = allocation_contract(alloc)
                annotation = contract.sign(signed, self.config.signing_key_id, key)
                binding["metadata"]["annotations"] = {contract.ANNOTATION: annotation}
        except Exception as error:  # never sent: release and retry later
            self._bind_outcome(pod, alloc, "error", release=True, retry=True, error=error)
            return "error"
        with self.cond:
            self.cache.sending(uid, annotation, signed)
        try:
            drain(
                self.core.create_namespaced_pod_binding(
                    name,
                    namespace,
                    binding,
                    _preload_content=False,
                    _request_timeout=self.config.bind_timeout_seconds,
                )
            )
        except ApiException as error:
            status = error.status
            result = str(status or "error")
            if status == 404:  # the pod is gone: nothing was stored
                self._bind_outcome(pod, alloc, "404", release=True, retry=False, error=error)
            elif status and 400 <= status < 500 and status != 409:  # refused before anything was stored
                self._bind_outcome(pod, alloc, result, release=True, retry=True, error=error)
            else:  # 409 (bound already, or another pod of that name), 5xx: maybe stored
                self._bind_outcome(pod, alloc, result, release=False, retry=False, error=error)
            return result
        except Exception as error:  # timeouts, lost connections, anything: maybe stored
            self._bind_outcome(pod, alloc, "error", release=False, retry=False, error=error)
            return "error"
        with self.cond:
            self.cache.bind_succeeded(uid, self.clock(), SUCCEEDED_READ_SECONDS)
            self.cond.notify_all()
        self.metrics.binds.labels("ok").inc()
        created = parse_time(meta.get("creationTimestamp"))
        if created is not None:
            self.metrics.e2e.observe(max(0.0, (dt.datetime.now(dt.UTC) - created).total_seconds()))
        log_event(log, "pod.bound", pod=f"{namespace}/{name}", pod_uid=uid, node=alloc.node, devices=devices)
        return "ok"

    def _bind_outcome(
        self,
        pod: dict[str, Any],
        alloc: Allocation,
        result: str,
        *,
        release: bool,
        retry: bool,
        error: BaseException | None = None,
    ) -> None:
        """A Binding that did not plainly succeed: release its booking (it was certainly not stored)
        or keep it and read the pod back later (it may have been)."""
        uid = str(_meta(pod).get("uid", ""))
        self.metrics.binds.labels(result).inc()
        log_event(
            log,
            "pod.bind_failed",
            logging.WARNING,
            pod=pod_key(pod),
            node=alloc.node,
            devices=list(alloc.device_ids()),
            status=result,
            outcome="not stored" if release else "unknown: reading the pod back",
            error=f"{type(error).__name__}: {str(error)[:300]}" if error is not None else "",
        )
        with self.cond:
            if release:
                if self.cache.release(uid) is not None:
                    if retry and uid in self.cache.pods:
                        self.queue.requeue(uid, *_queue_key(pod))
                        self._keep_member_room(uid, alloc.node)
                    self._changed()
            else:
                delay = self.queue.backoff_seconds(self.queue.attempts(uid) + 1)
                self.cache.bind_uncertain(uid, self.clock(), delay)
            self.cond.notify_all()

    def _keep_member_room(self, uid: str, node: str) -> None:
        """A gang member whose Binding was not stored while the rest of its group may be bound:
        nominate it (in this replica) to the node it was placed on, so that pods of no higher
        priority do not take its room before it is tried again, leaving the group short."""
        ref = self.groups.of.get(uid)
        spec = self.groups.specs.get(ref) if isinstance(ref, GroupRef) else None
        if isinstance(spec, GroupSpec) and spec.gang:
            self.nominated[uid] = node

    def _start_reads(self) -> None:
        """Read back the pods whose Binding's outcome is still unknown (under the lock)."""
        for uid in self.cache.due_reads(self.clock()):
            assumed = self.cache.assumed[uid]
            namespace, _, name = assumed.alloc.pod_name.partition("/")
            self._submit(self._read_back, uid, namespace, name)

    def _read_back(self, uid: str, namespace: str, name: str) -> None:
        pod: dict[str, Any] | None = None
        try:
            response = self.core.read_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=self.config.bind_timeout_seconds
            )
            try:
                pod = json.loads(response.data)
            finally:
                response.release_conn()
        except ApiException as error:
            if error.status != 404:
                self._read_failed(uid, error)
                return
        except Exception as error:
            self._read_failed(uid, error)
            return
        with self.cond:
            assumed = self.cache.assumed.get(uid)
            outcome = self.cache.read_back(uid, pod)
            self.metrics.read_backs.labels(outcome).inc()
            log_event(log, "pod.read_back", pod=f"{namespace}/{name}", pod_uid=uid, outcome=outcome)
            if outcome == "unbound" and pod is not None:
                self.queue.requeue(uid, *_queue_key(pod))
                if assumed is not None:
                    self._keep_member_room(uid, assumed.alloc.node)
                self._changed()
            elif outcome == "gone":
                self.queue.remove(uid)
                self._changed()
            elif outcome == "bound":
                self.queue.remove(uid)
            self.cond.notify_all()

    def _read_failed(self, uid: str, error: BaseException) -> None:
        self.metrics.read_backs.labels("error").inc()
        log_event(log, "pod.read_back_failed", logging.WARNING, pod_uid=uid, error=str(error)[:300])
        with self.cond:
            assumed = self.cache.assumed.get(uid)
            if assumed is not None:
                self.cache.read_failed(uid, self.clock(), self.queue.backoff_seconds(assumed.reads + 2))
            self.cond.notify_all()

    # --- events ---------------------------------------------------------------------------------------

    def _emit_failed(self, pod: dict[str, Any], message: str, reason: str = "Unschedulable") -> None:
        """Tell the pod why it was not placed: a ``FailedScheduling`` Event and the condition
        ``PodScheduled=False`` with ``reason`` (``Unschedulable``, or ``SchedulerError`` when
        deciding failed), as kube-scheduler does; the same message at most every
        EVENT_REPEAT_SECONDS."""
        key = (_meta(pod).get("uid", ""), message)
        now = self.clock()
        if now - self._last_event.get(key, -EVENT_REPEAT_SECONDS) < EVENT_REPEAT_SECONDS:
            return
        self._last_event[key] = now
        if len(self._last_event) > 10000:
            self._last_event.clear()
        log_event(log, "pod.unschedulable", pod=pod_key(pod), reason=message)
        self._submit(self._post_failed, pod, message, reason)

    def _create_event(
        self,
        regarding: Mapping[str, Any],
        reason: str,
        message: str,
        kind: str,
        action: str,
        now: dt.datetime | None = None,
    ) -> None:
        """Create an events.k8s.io/v1 Event about ``regarding`` reported as kube-scheduler reports
        its own: this scheduler's name as the controller, ``<name>-<identity>`` as the instance, no
        related object (kube-scheduler v1.37.2's ``Preempted`` names none either). Raises what the
        API raised."""
        controller, instance = self.config.scheduler_name, self.reporting_instance
        event = event_body(regarding, reason, message, kind, action, controller, instance, now=now)
        drain(self.events_api.create_namespaced_event(namespace_of(regarding), event, _preload_content=False))

    def _post_event(self, pod: Mapping[str, Any], reason: str, message: str, kind: str, action: str) -> None:
        """Post an Event about ``pod`` (best effort)."""
        try:
            self._create_event(object_ref(pod), reason, message, kind, action)
        except Exception as error:
            log_event(log, "event.failed", logging.WARNING, pod=pod_key(pod), error=str(error)[:200])

    def _post_scheduled(self, pod: Mapping[str, Any], node: str) -> None:
        """kube-scheduler's ``Scheduled`` Event of a pod whose Binding was stored."""
        meta = _meta(pod)
        message = scheduled_message(str(meta.get("namespace", "")), str(meta.get("name", "")), node)
        self._post_event(pod, "Scheduled", message, "Normal", BINDING)

    def _post_failed(self, pod: dict[str, Any], message: str, reason: str = "Unschedulable") -> None:
        meta = _meta(pod)
        when = dt.datetime.now(dt.UTC)  # the condition's and the Event's time
        condition = {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": rfc3339(when),
                    }
                ]
            }
        }
        generation = meta.get("generation")
        if isinstance(generation, int) and not isinstance(generation, bool):
            # the pod generation the condition was decided on, as kube-scheduler v1.37 writes it
            condition["status"]["conditions"][0]["observedGeneration"] = generation
        try:
            self._create_event(object_ref(pod), "FailedScheduling", message, "Warning", SCHEDULING, when)
            drain(
                self.core.patch_namespaced_pod_status(
                    meta.get("name"), meta.get("namespace"), condition, _preload_content=False
                )
            )
        except Exception as error:  # an Event is best effort; never let it escape into a future
            log_event(log, "event.failed", logging.WARNING, pod=pod_key(pod), error=str(error)[:200])


def _custom_lister(api: Any, group: str, version: str) -> Callable[..., Any]:
    """A reflector's list (and watch) call for a custom resource of every namespace."""

    def list_call(**kwargs: Any) -> Any:
        return api.list_cluster_custom_object(group, version, PLURAL, **kwargs)

    return list_call


def _scheduler_name(pod: Mapping[str, Any]) -> Any:
    spec = pod.get("spec")
    return spec.get("schedulerName") if isinstance(spec, Mapping) else None


def _nominated_node(pod: Mapping[str, Any]) -> str:
    status = pod.get("status")
    node = status.get("nominatedNodeName") if isinstance(status, Mapping) else None
    return str(node) if node else ""


def _facts(request: PodRequest) -> PodFacts | None:
    return request.placement.facts if request.placement is not None else None


def _priority(request: PodRequest) -> int:
    return request.placement.rules.priority if request.placement is not None else 0


def _pod_priority(pod: Mapping[str, Any] | None) -> int:
    return priority_of(pod) if pod is not None else 0


def drain(response: Any) -> None:
    """Read an unparsed response and hand its connection back to the pool.

    Unread, the connection is never reused and every call pays a new TLS handshake (3.5 ms of CPU
    per Binding instead of 0.5 ms, measured by bench/scheduler_throughput.py).
    """
    try:
        _ = response.data
    finally:
        response.release_conn()


@dataclass(frozen=True)
class Attempt:
    """A scheduling attempt that placed a pod, as its Binding ends it: when the scheduling thread
    took the pod (``time.perf_counter``) and which attempt of the pod's it is (1 = the first)."""

    popped_at: float
    number: int


@dataclass(frozen=True)
class _Handler:
    """Feeds one reflector into the scheduler's cache methods."""

    replace_items: Callable[[list[dict[str, Any]]], None]
    apply_event: Callable[[str, dict[str, Any]], None]

    def replace(self, items: list[dict[str, Any]], resource_version: str) -> None:
        self.replace_items(items)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self.apply_event(event_type, obj)
