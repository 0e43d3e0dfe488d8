"""What the live scheduler hands the core's preemption: the nodes where evicting pods might help,
as ``NodeOffer``s built from its cluster view and the pods it knows, and its PDBs as ``Budget``s.

Pure functions over the cache's JSON and the core's ``ClusterState``; the scheduler does the I/O
(evictions through the Eviction API, the ``status.nominatedNodeName`` patch). A node is offered
unless every eviction would be in vain there: its cordon, the pod's node selector, node affinity or
taints rule it out, its required pod affinity or a spread constraint's missing label does
(kube-scheduler's UnschedulableAndUnresolvable), or no pod there has a lower priority. Pods this
replica is binding and pods nominated to a node with a priority at least the preemptor's are never
victims.

For kube-scheduler's preempt verb (``extender_victims``) the candidates and their victims are
kube-scheduler's, chosen by counting GPUs as a number; kubegpu only keeps or narrows each node's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np

from scheduler.core.constraints import priority_of
from scheduler.core.filters import (
    DEFAULT_FILTERS,
    NodeSelectorFilter,
    NodeUnschedulableFilter,
    PlacementFilter,
    TaintFilter,
    apply_filters,
)
from scheduler.core.placement import UNRESOLVABLE, PodPlacement
from scheduler.core.preempt import Budget, GpuSlot, NodeOffer, RunningPod, select_victims
from scheduler.core.request import PodRequest
from scheduler.core.selectors import SelectorError, parse_label_selector
from scheduler.core.state import Allocation, ClusterState, NodeState
from scheduler.live.translate import parse_time

NEVER_A_VICTIM = 1 << 40  # above any pod priority (int32)
UNRESOLVABLE_FILTERS = (NodeUnschedulableFilter, NodeSelectorFilter, TaintFilter)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def running_pod(alloc: Allocation, pod: Mapping[str, Any] | None, protected: bool = False) -> RunningPod:
    """A booked pod as preemption sees it (``protected``: never a victim)."""
    meta = _meta(pod) if pod is not None else {}
    labels = meta.get("labels")
    status = pod.get("status") if pod is not None else None
    started = parse_time(status.get("startTime")) if isinstance(status, Mapping) else None
    namespace, _, name = alloc.pod_name.partition("/")
    return RunningPod(
        uid=alloc.pod_uid,
        name=alloc.pod_name,
        namespace=str(meta.get("namespace") or namespace or "default"),
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {},
        priority=NEVER_A_VICTIM if protected or pod is None else priority_of(pod),
        start_time=started.timestamp() if started is not None else float("inf"),
        cpu_milli=alloc.cpu_milli,
        memory_mib=alloc.memory_mib,
        gpus={g.id: (g.milli, g.memory_mib) for g in alloc.gpus},
        charged_gpus=alloc.charged_gpus,
        resources={**dict(alloc.resources), "memory": alloc.memory_bytes()},
        host_ports=alloc.host_ports,
        rdma=alloc.rdma,
        terminating=bool(meta.get("deletionTimestamp")),
    )


def node_offer(
    node: NodeState, pods: Mapping[str, Mapping[str, Any]], protected: Collection[str]
) -> NodeOffer:
    """``node`` with every pod booked on it (``pods``: the pods' JSON by uid)."""
    return NodeOffer(
        name=node.name,
        cpu_milli=node.cpu_capacity,
        memory_mib=node.memory_capacity,
        gpus=tuple(GpuSlot(g.id, g.model, g.memory_mib, g.healthy, g.share_enforced) for g in node.gpus),
        pods=tuple(
            running_pod(alloc, pods.get(uid), uid in protected)
            for uid, alloc in sorted(node.allocations.items())
        ),
        links=node.links(),
        max_pods=node.max_pods,
        gpu_resource=node.gpu_resource,
        allocatable=node.allocatable,
        nics=node.nics,
    )


def candidate_nodes(
    request: PodRequest,
    cluster: ClusterState,
    priority: int,
    pods: Mapping[str, Mapping[str, Any]],
    protected: Collection[str] = (),
) -> list[int]:
    """Indices of the nodes where evicting lower-priority pods might let ``request`` fit."""
    _kept, rejected = apply_filters(request, cluster, DEFAULT_FILTERS, cluster.all_indices, collect=True)
    hopeless: set[int] = set()
    for plugin, idx in rejected:
        if isinstance(plugin, UNRESOLVABLE_FILTERS):
            hopeless.update(idx.tolist())
        elif isinstance(plugin, PlacementFilter) and cluster.placement is not None:
            codes = plugin.codes(request, cluster, idx)
            hopeless.update(i for i, c in zip(idx.tolist(), codes.tolist(), strict=True) if c in UNRESOLVABLE)

    def evictable(uid: str) -> bool:
        pod = pods.get(uid)
        return pod is not None and uid not in protected and priority_of(pod) < priority

    return [
        i
        for i in range(len(cluster))
        if i not in hopeless and any(evictable(uid) for uid in cluster.nodes[i].allocations)
    ]


def other_rules(
    placement: PodPlacement | None, cluster: ClusterState
) -> Callable[[str], Callable[[frozenset[str]], bool] | None]:
    """Per node name: the placement rules' test with some pods evicted (None: nothing to test)."""
    view = cluster.placement
    if placement is None or view is None or not view.filters_apply(placement, node_affinity=False):
        return lambda node: None

    def for_node(node: str) -> Callable[[frozenset[str]], bool] | None:
        row = np.array([cluster.index[node]])

        def fits(gone: frozenset[str]) -> bool:
            return int(view.filter(placement, row, exclude=gone, node_affinity=False)[0]) == 0

        return fits

    return for_node


def budget(pdb: Mapping[str, Any]) -> Budget | None:
    """A PodDisruptionBudget (policy/v1 JSON) as preemption weighs it; None if unreadable."""
    meta, spec, status = _meta(pdb), pdb.get("spec"), pdb.get("status")
    spec = spec if isinstance(spec, Mapping) else {}
    status = status if isinstance(status, Mapping) else {}
    try:
        selector = parse_label_selector(spec.get("selector"), "spec.selector")
    except SelectorError:
        return None
    allowed = status.get("disruptionsAllowed")
    disrupted = status.get("disruptedPods")
    return Budget(
        namespace=str(meta.get("namespace") or "default"),
        selector=selector,
        disruptions_allowed=allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0,
        disrupted_pods=frozenset(disrupted) if isinstance(disrupted, Mapping) else frozenset(),
        name=str(meta.get("name", "")),
    )


def extender_victims(
    request: PodRequest,
    priority: int,
    node: NodeState,
    pods: Mapping[str, Mapping[str, Any]],
    proposed: Collection[str],
    budgets: list[Budget],
    fits_other: Callable[[frozenset[str]], bool] | None = None,
) -> tuple[tuple[str, ...], int | None] | None:
    """Which of the victims kube-scheduler proposes on ``node`` kubegpu's device view needs.

    Only the ``proposed`` pods may go (the others are protected), and the pod must fit by the
    core's rules (GPUs by id: healthy, of an allowed model, a valid topology set or room for the
    share; CPU, memory, the pod count, the GPU count, RDMA VFs and bandwidth, the other placement
    rules). Returns None
    when even all of them do not free what the pod needs (the node is dropped); else the victims'
    UIDs with their PDB violations: the cheapest sufficient subset by the core's order (fewest
    violations, lowest highest priority, fewest victims), plus the proposed pods kubegpu does not
    see on the node (it cannot judge them). When the pod fits in kubegpu's view without evicting
    anyone (kube-scheduler's own rules want the room), or every proposed pod is needed, the
    proposal is kept whole and the count is None: kube-scheduler's own stands.
    """
    proposed = list(dict.fromkeys(proposed))
    known = set(node.allocations)
    offer = node_offer(node, pods, known - set(proposed))
    victims = select_victims(request, priority, offer, budgets, pdb_hard=False, fits_other=fits_other)
    if victims is None:
        return None
    chosen = [p.uid for p in victims.pods] + [u for u in proposed if u not in known]
    if not victims.pods or len(chosen) == len(proposed):
        return tuple(proposed), None
    return tuple(chosen), victims.pdb_violations
