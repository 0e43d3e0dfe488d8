"""``kubegpu extender``: the scheduling core behind kube-scheduler's HTTP extender protocol.

kube-scheduler keeps deciding which node; kubegpu, as its extender, says which nodes can take
the pod's devices (filter, with each failed node's reason), how well (prioritize) and binds the
pod on the node kube-scheduler picked with the exact devices and the signed allocation (bind),
so the node needs nothing new. The decisions use a ``Scheduler``'s own watched cache, filters,
policy and Binding code (scheduler/live/scheduler.py), with its scheduling loop off: one account
of devices whether pods are bound by the live scheduler or by the extender.

- **filter**: a pod that asks for no managed device (no whole GPU, no share, no RDMA interface)
  passes every node (kube-scheduler checks the rest). Otherwise each named node is checked by the
  core's filters, the room of pods nominated to a node (of no lower priority) counted as theirs;
  a node kubegpu does not know or cannot use fails with why (``FailedNodes``). A
  pod whose kubegpu request is invalid fails every node as unresolvable with the reason.
- **choose** (a filter verb: ``filterVerb: choose``): filter narrowed to kubegpu's own choice.
  A pod that asks for devices and fits gets exactly one node, the one kubegpu's scheduler would
  pick among the named nodes (the core's ``schedule_one``: filters, policy, tie-break; as the
  scheduler decides, the policy re-planned for a new kind of pod and the room of nominated pods of
  no lower priority kept for them); with one
  feasible node kube-scheduler skips scoring and prioritize and binds there, so the pod lands where
  kubegpu's own scheduler would put it and each pod costs one round trip fewer. A pod that fits
  nowhere, asks for no device or is invalid gets ``filter``'s answer (every reason). A gang
  member gets its node in its group's whole plan, or every node failed with why the group waits
  (``_choose_in_group``; docs/extender.md, "Choosing or scoring").
- **prioritize**: the active policy's scores over the nodes that pass (re-planned for a new kind
  of pod and with nominated pods' room kept, as in choose), scaled to 0..10; nodes scoring 0 are
  left out of the answer (kube-scheduler counts them as 0).
- **bind**: the pod is placed on the given node only (re-checked: the node kube-scheduler picks
  need not be kubegpu's favourite, and things change between filter and bind), its devices
  booked under the scheduler's lock (concurrent binds never share a device), then the one signed
  Binding is posted. A refusal is the answer's ``Error``; kube-scheduler retries the pod.
- **preempt**: of the candidate nodes and victims kube-scheduler proposes (it counts GPUs as a
  number), a node stays only where evicting its proposed victims frees devices the pod can use
  (``scheduler.live.preemption.extender_victims``), with the victims kubegpu needs of those; a pod
  that asks for no managed device keeps every proposal.

Requests are bounded (``MAX_BODY_BYTES``, a read timeout); malformed ones get 400 with the reason,
never a crash. ``/healthz``, ``/readyz`` (caches synced and, with leader election, leading, or a
standby that knows the leader) and ``/metrics`` (per-verb latency histograms) are served on the
same port. With leader election a standby relays each verb request to the leader
(scheduler/live/relay.py). docs/extender.md.
"""

from __future__ import annotations

import logging
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram

from kubegpu.httphead import LeanHead
from kubegpu.httpserve import bound_server
from kubegpu.logs import log_event
from scheduler.core.filters import DEFAULT_FILTERS, apply_filters, filter_nodes
from scheduler.core.gang import GroupPlacement, GroupRequest, OnlyNodes, group_preemption, schedule_group
from scheduler.core.request import PodRequest
from scheduler.core.schedule import Placement, schedule_one
from scheduler.core.state import AllocationConflict, ClusterState
from scheduler.live.cache import pod_key
from scheduler.live.extenderapi import (
    BindArgs,
    ExtenderRequestError,
    FilterArgs,
    PreemptArgs,
    Proposal,
    bind_args,
    filter_args,
    filter_result,
    preempt_args,
    preempt_result,
    scaled_scores,
)
from scheduler.live.groupplans import GroupPlans
from scheduler.live.podgroups import GroupError, GroupRef, GroupSpec, group_ref
from scheduler.live.podspec import PodSpecError
from scheduler.live.preemption import extender_victims, other_rules
from scheduler.live.relay import RELAYED_HEADER, Relay, verb_of
from scheduler.live.scheduler import Scheduler, _facts, _priority

log = logging.getLogger("kubegpu.extender")
MAX_BODY_BYTES = 16 << 20  # a Pod plus 5,000 node names is far less
READ_TIMEOUT_SECONDS = 10.0
NOT_KUBEGPU = "node not usable by kubegpu"
NOT_CHOSEN = "node(s) not the one kube-scheduler chose"
NOT_CANDIDATE = "node(s) not among kube-scheduler's candidates"


class Extender:
    """The extender's verbs on a ``Scheduler``'s cache (see the module docstring)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.plans = GroupPlans()  # each gang's last plan, for its next members' choose
        registry = scheduler.metrics.registry
        self.latency = Histogram(
            "kubegpu_extender_request_duration_seconds",
            "Extender request latency by verb",
            ["verb"],
            registry=registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.requests = Counter(
            "kubegpu_extender_requests_total",
            "Extender requests by verb and HTTP status",
            ["verb", "code"],
            registry=registry,
        )

    # --- verbs ------------------------------------------------------------------------------------

    def filter(self, args: FilterArgs) -> dict[str, Any]:
        sched = self.scheduler
        with sched.cond:
            cluster = sched._view()
            request = sched._request(args.uid, args.pod)
            if isinstance(request, PodSpecError):
                why = f"invalid kubegpu request: {request}"
                return filter_result(args, [], {}, dict.fromkeys(args.node_names, why))
            if not _wants_devices(request):
                return filter_result(args, list(args.node_names), {}, {})
            index, nodes = cluster.index, cluster.nodes
            known, all_known = _indices(index, args.node_names)
            failed: dict[str, str] = {}
            if not all_known:
                excluded = sched.cache.excluded
                failed = {n: excluded.get(n, NOT_KUBEGPU) for n in args.node_names if n not in index}
            # the room of pods nominated to a node (of no lower priority) is theirs, as kube-scheduler's
            # own filters count them placed: for the devices it cannot count, that is ours to do
            with sched.nominated_room_kept(args.uid, request, cluster):
                among = np.asarray(known, dtype=np.int64)
                kept, reasons = filter_nodes(request, cluster, DEFAULT_FILTERS, among)
            failed.update(reasons)
            passed = [nodes[i].name for i in kept.tolist()]  # in the order sent: the filters keep it
        return filter_result(args, passed, failed, {})

    def choose(self, args: FilterArgs) -> dict[str, Any]:
        """``filter`` narrowed to the one node kubegpu would pick among the named ones (see the
        module docstring); ``filter``'s answer, with every reason, when there is no such node."""
        sched = self.scheduler
        with sched.cond:
            cluster = sched._view()
            request = sched._request(args.uid, args.pod)
            if not isinstance(request, PodSpecError) and _wants_devices(request):
                known, _ = _indices(cluster.index, args.node_names)
                if known:
                    self._plan_for(args.uid, request, cluster)
                    only = np.zeros(len(cluster), dtype=bool)
                    only[known] = True
                    ref = _group_of(args.pod)  # the pod sent: kubegpu's watch may not have it yet
                    spec = sched.groups.specs.get(ref) if isinstance(ref, GroupRef) else None
                    waits = _group_wait(ref, spec) if ref is not None else ""
                    if waits:  # as kubegpu's scheduler: no member is placed alone meanwhile
                        return filter_result(args, [], dict.fromkeys(args.node_names, waits), {})
                    if isinstance(ref, GroupRef) and isinstance(spec, GroupSpec) and spec.gang:
                        return self._choose_in_group(args, request, ref, spec, cluster, only)
                    filters = (OnlyNodes(only, NOT_CANDIDATE), *DEFAULT_FILTERS)
                    # the room of pods nominated to a node (of no lower priority) is theirs
                    with sched.nominated_room_kept(args.uid, request, cluster):
                        result = schedule_one(
                            request, cluster, sched.policy, sched.rng, filters=filters, explain=False
                        )
                    if isinstance(result, Placement):
                        return filter_result(args, [result.node], {}, {})
        return self.filter(args)

    def _plan_for(self, uid: str, request: PodRequest, cluster: ClusterState) -> None:
        """Re-plan the policy for a kind of pod it has not planned for, as the scheduler does
        before it decides (only for a pod of its workload: another would re-plan every call)."""
        sched = self.scheduler
        if uid in sched.cache.pods and request.shape() not in sched._planned_shapes:
            sched._bind_policy(cluster)

    def _choose_in_group(
        self,
        args: FilterArgs,
        request: PodRequest,
        ref: GroupRef,
        spec: GroupSpec,
        cluster: ClusterState,
        only: np.ndarray,
    ) -> dict[str, Any]:
        """A gang member's node as kubegpu's scheduler plans its group whole (the core's
        ``schedule_group``: this member among the candidates, the others wherever kubegpu's
        filters let them, as kube-scheduler sends each member its own candidates; the fewest
        nodes, one domain, members already placed counted), or every candidate failed with why
        the group does not fit whole now: its members are not placed one by one where the group
        cannot follow. The plan is kept for the next members while it holds (``GroupPlans``)."""
        sched = self.scheduler
        group = self._group_request(ref, spec, request, cluster)
        uids = frozenset(m.uid for m in group.members)
        key = (uids, group.min_member, group.domain_key)
        if not sched.nominated:  # nominated pods' room is reserved while planning: not kept
            i = self.plans.recall(ref, key, cluster, args.uid)
            # among its candidates, and it fits there now (another pod may have come since)
            if i is not None and only[i]:
                fits, _ = apply_filters(request, cluster, DEFAULT_FILTERS, np.array([i]), collect=False)
                if len(fits):
                    return filter_result(args, [cluster.nodes[i].name], {}, {})
        filters = (CandidatesOf(args.uid, only, NOT_CANDIDATE), *DEFAULT_FILTERS)
        with sched.nominated_room_kept(args.uid, request, cluster, uids):
            # ties broken alike in every member's call: members kube-scheduler asks about before
            # the earlier ones bind are told the nodes of one plan, not of plans swapped by ties
            ties = random.Random(str(ref))
            result = schedule_group(group, cluster, sched.policy, ties, filters=filters)
        if isinstance(result, GroupPlacement) and not sched.nominated:
            planned = {p.allocation.pod_uid: cluster.index[p.node] for p in result.placements}
            self.plans.remember(ref, key, cluster, planned)
        else:
            self.plans.forget(ref)
        if isinstance(result, GroupPlacement):
            for placement in result.placements:
                if placement.allocation.pod_uid == args.uid:
                    return filter_result(args, [placement.node], {}, {})
            why = f"pod group {ref} is placed without this member now; it waits for room"
        else:
            why = result.message()
        return filter_result(args, [], dict.fromkeys(args.node_names, why), {})

    def _group_request(
        self, ref: GroupRef, spec: GroupSpec, request: PodRequest, cluster: ClusterState
    ) -> GroupRequest:
        """The group to plan: the members a plan counts, those placed and those waiting for a
        scheduler, with a valid request (an invalid member is told so by its own filter call),
        and the pod asked about. Waiting for any scheduler: the cache keeps only the pending pods
        of its own ``schedulerName`` (``kubegpu`` where ``extenderAddress`` serves kube-scheduler
        too), and kube-scheduler may serve several profiles through the extender; the group book
        keeps every member as last seen (``Scheduler.group_member_requests``)."""
        sched = self.scheduler
        found = sched.group_member_requests(ref, cluster, any_scheduler=True)
        members = [member for _, _, member, _ in found if isinstance(member, PodRequest)]
        if request.uid not in {m.uid for m in members}:
            members.append(request)
        domain = spec.domain_key or sched.config.gang_domain_label
        return GroupRequest(str(ref), spec.min_member, tuple(members), domain)

    def prioritize(self, args: FilterArgs) -> list[dict[str, Any]]:
        """The nodes that score above 0 (``scaled_scores``), each once. kube-scheduler counts a
        node it does not find in the answer as 0, so the others are left out: the answer, and
        kube-scheduler's decoding of it, is a few entries instead of one per node."""
        sched = self.scheduler
        with sched.cond:
            cluster = sched._view()
            request = sched._request(args.uid, args.pod)
            if isinstance(request, PodSpecError) or not _wants_devices(request):
                return []
            index, nodes = cluster.index, cluster.nodes
            known = np.unique(np.asarray(_indices(index, args.node_names)[0], dtype=np.int64))
            self._plan_for(args.uid, request, cluster)
            # as filter and choose: the room of pods nominated to a node is theirs
            with sched.nominated_room_kept(args.uid, request, cluster):
                idx, _ = apply_filters(request, cluster, DEFAULT_FILTERS, known, collect=False)
                scores = sched.policy.score(request, cluster, idx) if len(idx) else np.zeros(0)
            scaled = scaled_scores(scores)
            return [
                {"Host": nodes[i].name, "Score": score}
                for i, score in zip(idx.tolist(), scaled, strict=True)
                if score
            ]

    def bind(self, args: BindArgs) -> dict[str, str]:
        sched = self.scheduler
        with sched.cond:
            pod = sched.cache.pods.get(args.uid)
        if pod is None:  # pending for a scheduler whose pods the cache does not keep: read it
            pod = self._read_pod(args)
        with sched.cond:
            meta = (pod or {}).get("metadata") or {}
            if pod is None or (meta.get("name"), meta.get("namespace")) != (args.name, args.namespace):
                return {"Error": f"pod {args.namespace}/{args.name} ({args.uid}) is not known yet; retry"}
            if (pod.get("spec") or {}).get("nodeName"):
                return {"Error": f"pod {args.namespace}/{args.name} is bound already"}
            if args.uid in sched.cache.assumed:
                return {"Error": f"pod {args.namespace}/{args.name} is being bound already"}
            cluster = sched._view()
            request = sched._request(args.uid, pod)
            if isinstance(request, PodSpecError):
                return {"Error": f"invalid kubegpu request: {request}"}
            i = cluster.index.get(args.node)
            if i is None:
                why = sched.cache.excluded.get(args.node, NOT_KUBEGPU)
                return {"Error": f"node {args.node}: {why}"}
            only = np.zeros(len(cluster), dtype=bool)
            only[i] = True
            # the chosen node first: the core's filters then check that node alone, not all of them
            filters = (OnlyNodes(only, NOT_CHOSEN), *DEFAULT_FILTERS)
            result = schedule_one(request, cluster, sched.policy, sched.rng, filters=filters)
            if not isinstance(result, Placement):
                return {"Error": f"node {args.node} cannot take the pod now: {result.message()}"}
            try:
                sched.cache.assume(args.uid, result.allocation, sched.clock(), _facts(request))
            except AllocationConflict as error:
                return {"Error": f"node {args.node}: {error}"}
            sched.queue.hold(args.uid)
        outcome = sched._bind(pod, result.allocation)
        if outcome != "ok":
            return {"Error": f"binding pod {args.namespace}/{args.name} to {args.node} failed: {outcome}"}
        return {"Error": ""}

    def preempt(self, args: PreemptArgs) -> dict[str, Any]:
        """Keep the proposed nodes whose victims free what the pod needs, each with the victims
        kubegpu needs of those (never an empty list, never a pod kube-scheduler did not propose)."""
        sched = self.scheduler
        with sched.cond:
            cluster = sched._view()
            request = sched._request(args.uid, args.pod)
            if isinstance(request, PodSpecError):
                kept: dict[str, Proposal] = {}  # its filter failed every node: nothing to free
            elif not _wants_devices(request):
                kept = {node: p for node, p in args.proposals.items() if p.uids}
            elif not self._group_may_preempt(args.pod, request, cluster, args.proposals):
                kept = {}
            else:
                priority = _priority(request)
                budgets = list(sched.budgets.values())
                rules = other_rules(request.placement, cluster)
                kept = {}
                for node, proposal in args.proposals.items():
                    i = cluster.index.get(node)
                    if i is None or not proposal.uids:
                        continue
                    node_state, pods = cluster.nodes[i], sched.cache.pods
                    found = extender_victims(
                        request, priority, node_state, pods, proposal.uids, budgets, rules(node)
                    )
                    if found is not None:
                        uids, violations = found
                        count = proposal.pdb_violations if violations is None else violations
                        kept[node] = Proposal(uids, count)
        narrowed = {
            node: len(args.proposals[node].uids) - len(p.uids)
            for node, p in kept.items()
            if p.uids != args.proposals[node].uids
        }
        log_event(
            log,
            "extender.preempt",
            pod=pod_key(args.pod),
            proposed=len(args.proposals),
            kept=sorted(kept),
            narrowed=narrowed or None,
        )
        return preempt_result(kept)

    def _group_may_preempt(
        self,
        pod: Mapping[str, Any],
        request: PodRequest,
        cluster: ClusterState,
        proposals: Mapping[str, Proposal],
    ) -> bool:
        """False for a member of a pod group that waits (its PodGroup not seen or invalid) or
        whose minimum does not fit whole now and would not even with every proposed victim gone:
        kubegpu's scheduler evicts no one for such a group (``group_preemption``), and
        kube-scheduler asks for the member alone. A group that fits in kubegpu's view already
        is left to the member's own check, as a single pod (kube-scheduler wants the room for
        its own rules)."""
        sched = self.scheduler
        ref = _group_of(pod)
        if ref is None:
            return True
        spec = sched.groups.specs.get(ref) if isinstance(ref, GroupRef) else None
        if _group_wait(ref, spec):
            return False
        if not isinstance(ref, GroupRef) or not isinstance(spec, GroupSpec) or not spec.gang:
            return True
        group = self._group_request(ref, spec, request, cluster)
        if isinstance(schedule_group(group, cluster, sched.policy, sched.rng), GroupPlacement):
            return True
        victims = list(dict.fromkeys(v for p in proposals.values() for v in p.uids if v in cluster.where))
        return group_preemption(group, cluster, sched.policy, sched.rng, victims) is not None

    def _read_pod(self, args: BindArgs) -> dict[str, Any] | None:
        """The pod from the API (None: gone, or not the pod of that UID)."""
        try:
            response = self.scheduler.core.read_namespaced_pod(
                args.name, args.namespace, _preload_content=False, _request_timeout=READ_TIMEOUT_SECONDS
            )
            try:
                pod = orjson.loads(response.data)
            finally:
                response.release_conn()
        except Exception as error:
            where = f"{args.namespace}/{args.name}"
            log_event(log, "extender.read_failed", logging.WARNING, pod=where, error=str(error)[:200])
            return None
        return pod if (pod.get("metadata") or {}).get("uid") == args.uid else None

    # --- HTTP -------------------------------------------------------------------------------------

    def handle(self, verb: str, body: bytes) -> tuple[int, Any]:
        """Answer one verb's request body: (HTTP status, JSON document)."""
        started = time.perf_counter()
        code = 200
        try:
            doc = orjson.loads(body)  # its errors are ValueErrors, as json's
            if verb == "filter":
                answer: Any = self.filter(filter_args(doc))
            elif verb == "choose":
                answer = self.choose(filter_args(doc))
            elif verb == "prioritize":
                answer = self.prioritize(filter_args(doc))
            elif verb == "bind":
                answer = self.bind(bind_args(doc))
            elif verb == "preempt":
                answer = self.preempt(preempt_args(doc))
            else:
                code, answer = 404, {"Error": f"unknown verb {verb[:50]!r}"}
        except (ValueError, ExtenderRequestError) as error:  # json's errors are ValueErrors too
            code, answer = 400, {"Error": f"bad {verb} request: {str(error)[:300]}"}
        except Exception as error:  # a bug: answered, logged, never a crash
            reason = f"{type(error).__name__}: {error}"[:300]
            log_event(log, "extender.failed", logging.ERROR, verb=verb, error=reason)
            code, answer = 500, {"Error": f"{type(error).__name__}: {str(error)[:300]}"}
        self.latency.labels(verb).observe(time.perf_counter() - started)
        self.requests.labels(verb, str(code)).inc()
        return code, answer


def _indices(index: Mapping[str, int], names: Sequence[str]) -> tuple[list[int], bool]:
    """The indices of the named nodes kubegpu knows, in order, and whether it knows them all (the
    usual case: one lookup per name, looped in C)."""
    try:
        return list(map(index.__getitem__, names)), True
    except KeyError:
        return [index[n] for n in names if n in index], False


def _group_of(pod: Mapping[str, Any]) -> GroupRef | GroupError | None:
    """The pod group the pod joins, read from the pod itself (GroupError: it names one wrongly)."""
    try:
        return group_ref(pod)
    except GroupError as error:
        return error


def _group_wait(ref: GroupRef | GroupError, spec: GroupSpec | GroupError | None) -> str:
    """Why a member of ``ref`` waits before any plan, as kubegpu's scheduler says it
    (``Scheduler._decide_member``): its group label is invalid, or its PodGroup is not seen yet or
    is invalid; "" when it does not."""
    if isinstance(ref, GroupError):
        return f"invalid kubegpu request: {ref}"
    if spec is None:
        return f"waiting for pod group {ref} ({ref.kind}) to exist"
    if isinstance(spec, GroupError):
        return f"pod group {ref} ({ref.kind}) is invalid: {spec}"
    return ""


class CandidatesOf(OnlyNodes):
    """kube-scheduler's candidates (``mask``), for the pod it asked about only: a gang's other
    members are planned wherever kubegpu's filters let them (kube-scheduler sends each its own)."""

    def __init__(self, uid: str, mask: np.ndarray, reason: str) -> None:
        super().__init__(mask, reason)
        self.uid = uid

    def applies(self, pod: PodRequest, cluster: ClusterState) -> bool:
        return pod.uid == self.uid


def _wants_devices(request: PodRequest) -> bool:
    """Whether the pod asks for a device kubegpu places: GPUs, a share, RDMA interfaces (VFs)."""
    return bool(request.whole_gpus or request.total_gpu_milli or request.rdma)


class ExtenderServer:
    """The extender's HTTP(S) endpoint: POST /<verb>, GET /healthz, /readyz, /metrics."""

    def __init__(
        self,
        extender: Extender,
        address: str,
        ready: Callable[[], tuple[bool, str]],
        tls: tuple[str, str] | None = None,
        relay: Relay | None = None,
    ) -> None:
        """``ready``: whether this replica answers the verbs itself; when it does not, ``relay``
        (a standby's) sends them to the leader."""
        self._server = bound_server(address, _handler(extender, ready, relay))
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(tls[0], tls[1])
            # the handshake runs in each connection's thread (``Handler.setup``), under the read
            # timeout: in accept() a client that never finished it would stall every other call
            self._server.socket = context.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
        self._thread = threading.Thread(target=self._server.serve_forever, name="extender-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(
    extender: Extender, ready: Callable[[], tuple[bool, str]], relay: Relay | None
) -> type[LeanHead]:
    class Handler(LeanHead):
        # HTTP/1.1 (LeanHead) and keep-alive: kube-scheduler's client reuses its connection for
        # the next verb instead of a new TCP connection (and a new server thread) per call; every
        # answer has a length and leaves in one write (``send_answer``)
        timeout = READ_TIMEOUT_SECONDS

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            return

        def setup(self) -> None:
            super().setup()  # applies the timeout to the connection
            # the standard library's error answers (send_error) are two writes (head, body): on a
            # kept-alive connection Nagle would hold the second until the client's delayed ACK
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.shaken = True
            if isinstance(self.connection, ssl.SSLSocket):
                try:
                    self.connection.do_handshake()
                except (OSError, ValueError) as error:  # ssl.SSLError, a timeout, a reset
                    self.shaken = False
                    peer = self.client_address[0] if self.client_address else ""
                    log_event(log, "extender.tls_failed", logging.WARNING, peer=peer, error=str(error)[:200])

        def handle(self) -> None:
            if self.shaken:
                super().handle()

        def _json(self, status: int, doc: Any) -> None:
            self.send_answer(status, "application/json", orjson.dumps(doc))

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self.send_answer(200, CONTENT_TYPE_LATEST, extender.scheduler.metrics.render())
            elif path == "/healthz":
                self.send_answer(200, "text/plain", b"ok\n")
            elif path == "/readyz":
                ok, detail = ready()
                leader = relay.target() if relay is not None and not ok else None
                if leader is not None:  # a standby: it takes calls and relays them
                    ok, detail = True, f"standby: relaying to {leader}"
                self.send_answer(200 if ok else 503, "text/plain", (detail + "\n").encode())
            else:
                self.send_answer(404, "text/plain", b"not found\n")

        def do_POST(self) -> None:  # noqa: N802
            verb = verb_of(self.path)
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                self.close_connection = True  # the body's end is unknown: the connection cannot go on
                self._json(411 if length is None else 400, {"Error": "a Content-Length is required"})
                return
            if int(length) > MAX_BODY_BYTES:
                self.close_connection = True  # its body is not read
                self._json(413, {"Error": f"request body over {MAX_BODY_BYTES} bytes"})
                return
            try:
                body = self.rfile.read(int(length))
            except (TimeoutError, OSError):
                self.close_connection = True
                return
            if len(body) != int(length):  # the client hung up inside its body: no one to answer
                self.close_connection = True
                return
            ok, detail = ready()
            if not ok:
                leader = None
                if relay is not None and not self.headers.get(RELAYED_HEADER):  # one hop only
                    leader = relay.target()
                if relay is None or leader is None:
                    self._json(503, {"Error": f"not ready: {detail}"})
                    return
                self.send_answer(*relay.relay(leader, self.path, body))
                return
            status, doc = extender.handle(verb, body)
            self._json(status, doc)

    return Handler
