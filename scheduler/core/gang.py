"""Gang scheduling: place a pod group's members all together, or none of them.

``schedule_group`` plans a ``GroupRequest`` on a ``ClusterState`` with the one-pod decision of
``schedule.schedule_one``, assuming each member's allocation before choosing the next, so the
members never count the same device twice. If fewer than ``min_member`` members can be placed,
the plan is ``GroupUnschedulable`` and names the member that did not fit and why. Members beyond
the minimum (an elastic job's extras) are placed when they fit and otherwise left waiting; they
never hold back the minimum. The planner changes nothing: every assumption is undone before it
returns, and the caller assumes the returned allocations in their order (the same state the plan
was made on), each with its member's pod facts (``facts_of``) as the planner did: members with pod
(anti-)affinity or spreading towards each other see the members planned before them.

Where a group goes, in order of preference:
1. the fewest nodes: a member goes to a node the group already uses when one fits it; when that
   greedy pass (largest member first, each to the policy's choice) fails, or uses more nodes than
   the free whole GPUs, GPU milli and CPU say could suffice, a depth-first search with
   backtracking (nodes the group uses first, then the nodes with most free GPUs, at most
   ``SEARCH_BUDGET`` placements tried among the group's nodes and the ``SEARCH_POOL`` with most
   free GPUs that its members can use) looks for a plan on fewer nodes, for groups whose every
   member is required;
2. one topology domain (the nodes sharing a value of ``domain_key``, e.g. the zone, a rack or an
   NVLink/NVSwitch domain label): the group is planned inside each of the largest domains (by
   free GPUs, at most ``MAX_DOMAINS`` tried) and the plan placing the most members wins, then
   the one keeping the group (its members placed already too) in the fewest domains, then the
   one on the fewest nodes (counting its members' placed already), ties to the larger domain;
   only when no single domain holds the minimum is it planned over all nodes;
3. inside a node, the policy's own topology-aware choice of devices, as for any pod.

Members are planned largest first (most GPUs, then most CPU), so a group's big pods are not
left without a node by its small ones; ties keep the given order.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from scheduler.core.affinity import PodFacts
from scheduler.core.filters import DEFAULT_FILTERS, FilterPlugin, apply_filters
from scheduler.core.request import PodRequest
from scheduler.core.schedule import Placement, Unschedulable, place_on, schedule_one
from scheduler.core.scoring import Policy
from scheduler.core.state import Allocation, AllocationConflict, ClusterState

MAX_DOMAINS = 8  # domains a group is tried in before it is planned over the whole cluster
SEARCH_BUDGET = 100  # placements the fewest-nodes search may try per plan (then it keeps its best)
FRESH_TRIES = 4  # nodes the group does not use yet that the search tries per member
SEARCH_POOL = 64  # the search considers the group's nodes and this many with the most free GPUs
SEARCH_KINDS = 8  # kinds of member (models, selector, tolerations) whose usable nodes rank that pool
OUTSIDE_GROUP_NODES = "node(s) not used by the pod's group"
OUTSIDE_DOMAIN = "node(s) outside the group's topology domain"


@dataclass(frozen=True)
class GroupRequest:
    """A pod group's pending members and how many of them must run together."""

    name: str
    min_member: int
    members: tuple[PodRequest, ...]
    domain_key: str | None = "topology.kubernetes.io/zone"

    def __post_init__(self) -> None:
        if self.min_member < 1:
            raise ValueError(f"group {self.name}: min_member must be at least 1, got {self.min_member}")
        uids = [m.uid for m in self.members]
        if len(set(uids)) != len(uids):
            raise ValueError(f"group {self.name}: a member is listed twice")


@dataclass(frozen=True)
class GroupPlacement:
    """Where the placed members go (at least ``min_member``), and the members left waiting."""

    placements: tuple[Placement, ...]
    waiting: tuple[str, ...]  # uids of members beyond the minimum that did not fit now
    domain: str | None = None  # the domain value the group was kept in, if one

    @property
    def nodes(self) -> tuple[str, ...]:
        """The distinct nodes used, in first-use order."""
        return tuple(dict.fromkeys(p.node for p in self.placements))


@dataclass(frozen=True)
class GroupUnschedulable:
    """The minimum does not fit: how many members did, and why the next one did not."""

    group: str
    min_member: int
    members: int
    placed: int
    blocked: str = ""  # the member that found no node
    reasons: dict[str, int] = field(default_factory=dict)
    total_nodes: int = 0

    def message(self) -> str:
        if self.members < self.min_member:
            return (
                f"pod group {self.group} has {self.members} of its {self.min_member} minimum members; "
                "waiting for the others"
            )
        why = Unschedulable(self.total_nodes, self.reasons).message()
        return (
            f"pod group {self.group}: only {self.placed} of its {self.min_member} minimum members fit "
            f"together; member {self.blocked}: {why}"
        )


class OnlyNodes(FilterPlugin):
    """Keeps the nodes of a mask (the group's nodes, or its domain), with the given reason."""

    def __init__(self, mask: np.ndarray, reason: str) -> None:
        self.mask = mask
        self.name = reason

    def keep(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        return self.mask[idx]

    def count_reasons(self, pod: PodRequest, cluster: ClusterState, rejected: np.ndarray) -> Counter[str]:
        return Counter({self.name: len(rejected)})


def facts_of(member: PodRequest) -> PodFacts | None:
    """What the placement view must record of an assumed member: its labels and pod (anti-)affinity
    terms, so the members after it see it as the pod it is (None: no placement rules)."""
    return member.placement.facts if member.placement is not None else None


def member_order(members: Sequence[PodRequest]) -> list[PodRequest]:
    """Largest first: whole-GPU count (a share counts as less than one GPU), then CPU, then memory."""
    return sorted(
        members, key=lambda m: (-m.whole_gpus, -m.total_gpu_milli, -m.cpu_milli, -m.memory_mib)
    )


def _place_members(
    members: Sequence[PodRequest],
    cluster: ClusterState,
    policy: Policy,
    rng: random.Random,
    filters: Sequence[FilterPlugin],
    within: np.ndarray | None,
    needed: int,
    used_before: np.ndarray,
) -> tuple[list[Placement], list[str], Unschedulable | None, str]:
    """Plan ``members`` in order (assuming each); undoes every assumption before returning.

    Returns (placements, uids left waiting, the first failure, that member's name). A member that
    does not fit waits while the others can still make ``needed``; the plan stops as soon as they
    cannot. The failure is None when at least ``needed`` members were placed.
    """
    placed: list[Placement] = []
    waiting: list[str] = []
    first_failure: tuple[Unschedulable, str] | None = None
    used = used_before.copy()
    base = list(filters) if within is None else [*filters, OnlyNodes(within, OUTSIDE_DOMAIN)]
    try:
        for position, member in enumerate(members):
            result: Placement | Unschedulable | None = None
            if used.any():
                narrowed = [*base, OnlyNodes(used, OUTSIDE_GROUP_NODES)]
                first = schedule_one(member, cluster, policy, rng, filters=narrowed, explain=False)
                result = first if isinstance(first, Placement) else None
            if result is None:
                result = schedule_one(member, cluster, policy, rng, filters=base, explain=True)
            if isinstance(result, Unschedulable):
                if first_failure is None:
                    first_failure = (result, member.name)
                waiting.append(member.uid)
                if len(placed) + len(members) - position - 1 < needed:
                    break  # the others cannot make the minimum any more
                continue
            cluster.assume(result.allocation, facts_of(member))
            used[cluster.index[result.node]] = True
            placed.append(result)
        if len(placed) >= needed or first_failure is None:
            return placed, waiting, None, ""
        return placed, waiting, first_failure[0], first_failure[1]
    finally:
        for placement in placed:
            cluster.forget(placement.allocation.pod_uid)


def _nodes_at_least(members: Sequence[PodRequest], cluster: ClusterState, within: np.ndarray | None,
                    used: np.ndarray) -> int:
    """A lower bound on the nodes a plan of every member uses: the nodes used already, plus the
    fewest others that could hold the rest, by each of free whole GPUs, free GPU milli and free
    CPU, and by how many members each node could take of it (a node with ``f`` free holds at most
    ``f // s`` members when the smallest asking for some asks for ``s``). ``ClusterState.assume``
    refuses any plan beyond these, whatever the filters."""
    count = int(used.sum())
    others = ~used if within is None else within & ~used
    bound = count
    for asked, free in (
        ([m.whole_gpus for m in members], cluster.gpu_full_free),
        ([m.total_gpu_milli for m in members], cluster.gpu_free_total),
        ([m.cpu_milli for m in members], np.maximum(cluster.cpu_free, 0)),  # bound pods over-commit
    ):
        asks = [a for a in asked if a > 0]
        if not asks:
            continue
        for per_node, wanted in ((free, sum(asks)), (free // min(asks), len(asks))):
            left = wanted - int(per_node[used].sum())
            if left <= 0:
                continue
            room = np.sort(per_node[others])[::-1]
            enough = np.flatnonzero(np.cumsum(room) >= left)
            bound = max(bound, count + (int(enough[0]) + 1 if len(enough) else len(room) + 1))
    return max(bound, 1 if members else 0)


def _usable(
    members: Sequence[PodRequest], cluster: ClusterState, filters: Sequence[FilterPlugin], scope: np.ndarray
) -> np.ndarray:
    """Per node of ``scope``: some member passes the filters there now, checked for the smallest
    member of each kind (GPU models, node selector and affinity, tolerations); all True for more
    than SEARCH_KINDS kinds. The search's pool takes these first, before nodes none of the group
    can use (other GPU models, another node pool) however many GPUs they have free."""
    kinds: dict[tuple, PodRequest] = {}
    for member in members:  # largest first: the last of a kind is its smallest
        rules = member.placement.rules.node_affinity if member.placement is not None else None
        selector = tuple(sorted(member.node_selector.items()))
        kinds[(member.gpu_models, selector, member.tolerations, rules)] = member
    if len(kinds) > SEARCH_KINDS:
        return np.ones(len(scope), dtype=bool)
    keep = np.zeros(len(cluster), dtype=bool)
    for member in kinds.values():
        keep[apply_filters(member, cluster, filters, scope, collect=False)[0]] = True
    return keep[scope]


def _search_fewest(
    members: Sequence[PodRequest],
    cluster: ClusterState,
    policy: Policy,
    filters: Sequence[FilterPlugin],
    used_before: np.ndarray,
    beat: int | None,
    floor: int,
    within: np.ndarray | None,
) -> list[Placement] | None:
    """Every member placed on fewer than ``beat`` nodes (None: any plan), by depth-first search
    with backtracking, stopping at a plan on ``floor`` nodes (no plan uses fewer); None if none
    was found within SEARCH_BUDGET placements. A member tries the nodes the group uses (the
    policy's order), then up to FRESH_TRIES others, most free whole GPUs first. The nodes it looks
    at are the group's and SEARCH_POOL others (in ``within``; usable by some member when it
    starts first, ``_usable``, then the most free whole GPUs), so the nodes it tries do not grow
    with the cluster; its time still does (one filter pass per kind of member, and each step's
    lower bound sorts every node's free GPUs: about 22 ms worst case at 5,000 nodes,
    bench/gang_plan.py). A node the group uses outside ``within`` is never tried, as in the greedy
    pass. Undoes every assumption before returning."""
    scope = cluster.all_indices if within is None else np.flatnonzero(within)
    if len(scope) > SEARCH_POOL:  # usable nodes first, then the most free whole GPUs
        usable = _usable(members, cluster, filters, scope)
        scope = scope[np.lexsort((-cluster.gpu_full_free[scope], ~usable))]
    else:
        scope = scope[np.argsort(-cluster.gpu_full_free[scope], kind="stable")]
    ranked = scope[:SEARCH_POOL]
    theirs = used_before if within is None else used_before & within  # never a node outside ``within``
    pool = np.union1d(ranked, np.flatnonzero(theirs))
    best: list[Placement] | None = None
    limit = beat if beat is not None else len(cluster) + 1
    budget = SEARCH_BUDGET
    used = used_before.copy()
    placed: list[Placement] = []

    def walk(k: int) -> bool:  # True: stop (the bound is reached, or the budget spent)
        nonlocal best, limit, budget
        if k == len(members):
            best, limit = list(placed), int(used.sum())
            return limit <= floor
        member = members[k]
        idx, _ = apply_filters(member, cluster, filters, pool, collect=False)
        if not len(idx) or _nodes_at_least(members[k:], cluster, None, used) >= limit:
            return False
        ours = idx[used[idx]]
        others = idx[~used[idx]]
        if len(ours) > 1:
            ours = ours[np.argsort(-policy.score(member, cluster, ours), kind="stable")]
        others = others[np.argsort(-cluster.gpu_full_free[others], kind="stable")][:FRESH_TRIES]
        for i in (*ours.tolist(), *others.tolist()):
            if int(used.sum()) + (0 if used[i] else 1) >= limit:
                continue
            if budget <= 0:
                return True
            budget -= 1
            placement = place_on(member, cluster, policy, i)
            cluster.assume(placement.allocation, facts_of(member))
            was, used[i] = bool(used[i]), True
            placed.append(placement)
            try:
                if walk(k + 1):
                    return True
            finally:
                placed.pop()
                used[i] = was
                cluster.forget(placement.allocation.pod_uid)
        return False

    walk(0)
    return best


def _plan_members(
    members: Sequence[PodRequest],
    cluster: ClusterState,
    policy: Policy,
    rng: random.Random,
    filters: Sequence[FilterPlugin],
    within: np.ndarray | None,
    needed: int,
    used_before: np.ndarray,
) -> tuple[list[Placement], list[str], Unschedulable | None, str]:
    """``_place_members``' greedy pass and, when every member is required and that pass failed or
    used more nodes than could suffice, the fewest-nodes search; the better of the two."""
    placed, waiting, failure, blocked = _place_members(
        members, cluster, policy, rng, filters, within, needed, used_before
    )
    if not members or needed < len(members):
        return placed, waiting, failure, blocked  # elastic extras: the greedy pass only
    used = used_before.copy()
    for placement in placed:
        used[cluster.index[placement.node]] = True
    greedy = None if failure is not None else int(used.sum())
    floor = _nodes_at_least(members, cluster, within, used_before)
    if greedy is not None and greedy <= floor:
        return placed, waiting, failure, blocked
    found = _search_fewest(members, cluster, policy, filters, used_before, greedy, floor, within)
    if found is None:
        return placed, waiting, failure, blocked
    return found, [], None, ""


def _domains(group: GroupRequest, cluster: ClusterState) -> list[tuple[str, np.ndarray]]:
    """The group's candidate domains, largest (free GPU milli) first, at most MAX_DOMAINS."""
    if not group.domain_key:
        return []
    values: dict[str, list[int]] = {}
    for i, node in enumerate(cluster.nodes):
        value = node.labels.get(group.domain_key)
        if value is not None:
            values.setdefault(value, []).append(i)
    if len(values) < 1:
        return []
    ranked = sorted(
        values.items(), key=lambda kv: (-int(cluster.gpu_free_total[kv[1]].sum()), kv[0])
    )[:MAX_DOMAINS]
    out = []
    for value, rows in ranked:
        mask = np.zeros(len(cluster), dtype=bool)
        mask[rows] = True
        out.append((value, mask))
    return out


def schedule_group(
    group: GroupRequest,
    cluster: ClusterState,
    policy: Policy,
    rng: random.Random,
    *,
    filters: Sequence[FilterPlugin] = DEFAULT_FILTERS,
) -> GroupPlacement | GroupUnschedulable:
    """Plan the whole group (see the module docstring); the cluster is left as it was.

    Members the cluster already holds an allocation for (bound, or assumed by an earlier try)
    count towards ``min_member`` and are not planned again; their nodes count as the group's.
    """
    already = [m for m in group.members if m.uid in cluster.where]
    members = member_order([m for m in group.members if m.uid not in cluster.where])
    if len(group.members) < group.min_member:
        return GroupUnschedulable(
            group.name, group.min_member, len(group.members), len(already), total_nodes=len(cluster)
        )
    needed = max(0, group.min_member - len(already))
    used = np.zeros(len(cluster), dtype=bool)
    for member in already:
        used[cluster.where[member.uid]] = True
    best: GroupPlacement | None = None
    best_key = (0, 0, 0)
    floor = max(1, int(used.sum()))  # no plan of every member uses fewer nodes
    key = group.domain_key or ""
    theirs = {cluster.nodes[i].labels.get(key) for i in np.flatnonzero(used)} - {None}

    def plan_key(plan: GroupPlacement) -> tuple[int, int, int]:
        """More members placed first, then fewer domains for the group (a plan in the domain of
        its members placed already keeps it in one), then fewer nodes: those of its members
        placed already and the plan's new ones (keeping to the nodes it uses beats adding one)."""
        new = sum(1 for node in plan.nodes if not used[cluster.index[node]])
        return -len(plan.placements), len(theirs | {plan.domain}), int(used.sum()) + new

    for value, mask in _domains(group, cluster):
        placed, waiting, failure, _ = _plan_members(
            members, cluster, policy, rng, filters, mask, needed, used
        )
        if failure is None:
            plan = GroupPlacement(tuple(placed), tuple(waiting), value)
            if best is None or plan_key(plan) < best_key:
                best, best_key = plan, plan_key(plan)
            if not best.waiting and best_key[2] <= floor:
                break  # no new node: its members' nodes are in this domain (the fewest domains too)
    if best is not None:
        return _extras_elsewhere(best, members, cluster, policy, rng, filters)
    placed, waiting, failure, blocked = _plan_members(
        members, cluster, policy, rng, filters, None, needed, used
    )
    if failure is not None:
        return GroupUnschedulable(
            group.name,
            group.min_member,
            len(group.members),
            len(placed) + len(already),
            blocked,
            dict(failure.reasons),
            failure.total_nodes,
        )
    return GroupPlacement(tuple(placed), tuple(waiting))


def _extras_elsewhere(
    plan: GroupPlacement,
    members: Sequence[PodRequest],
    cluster: ClusterState,
    policy: Policy,
    rng: random.Random,
    filters: Sequence[FilterPlugin],
) -> GroupPlacement:
    """Extras that did not fit inside the chosen domain are tried on the rest of the cluster."""
    if not plan.waiting:
        return plan
    by_uid = {m.uid: m for m in members}
    for placement in plan.placements:
        cluster.assume(placement.allocation, facts_of(by_uid[placement.allocation.pod_uid]))
    try:
        extras = [m for m in members if m.uid in set(plan.waiting)]
        none = np.zeros(len(cluster), dtype=bool)
        more, waiting, _, _ = _place_members(extras, cluster, policy, rng, filters, None, 0, none)
    finally:
        for placement in plan.placements:
            cluster.forget(placement.allocation.pod_uid)
    return GroupPlacement(plan.placements + tuple(more), tuple(waiting), plan.domain)


GPUS = "gpus"  # ``resource_gap``'s name for whole GPUs (the caller maps its GPU resource to it)


def resource_gap(
    cluster: ClusterState, wanted: Mapping[str, int], members: Iterable[str] = ()
) -> dict[str, int]:
    """What of ``wanted`` the cluster's free resources, summed over its nodes, lack (empty: none).

    scheduler-plugins' ``minResources`` check: a group waits until the cluster as a whole has
    room for its minimum, before any member is tried. Names: ``cpu`` (milli), ``memory``
    (bytes), ``pods``, ``GPUS`` (whole GPUs: fully free healthy ones), any other resource by
    its name (what the nodes publish, less its use). What the group's own ``members`` hold
    already (bound or assumed) counts as free for it, as scheduler-plugins counts it.
    """
    members = list(members)
    own = {cluster.where[uid] for uid in members if uid in cluster.where}
    free: dict[str, int] = {}
    for name in wanted:
        if name == "cpu":
            total = int(cluster.cpu_free.sum())
        elif name == "pods":
            total = sum(
                node.max_pods - len(node.allocations) if node.max_pods is not None else 1 << 62
                for node in cluster.nodes
            )
        elif name == GPUS:
            total = int(cluster.gpu_full_free.sum())
        else:
            total = sum(node.resource_free(name) for node in cluster.nodes)  # memory in bytes too
        free[name] = total
    for i in own:
        node = cluster.nodes[i]
        for uid in members:
            alloc = node.allocations.get(uid)
            if alloc is None:
                continue
            held = {
                "cpu": alloc.cpu_milli,
                "memory": alloc.memory_bytes(),
                "pods": 1,
                GPUS: sum(1 for g in alloc.gpus if not g.is_share),
                **dict(alloc.resources),
            }
            for name in free:
                free[name] += held.get(name, 0)
    return {name: amount - free[name] for name, amount in sorted(wanted.items()) if amount > free[name]}


def capacity_gap(cluster: ClusterState, wanted: Mapping[str, int]) -> dict[str, int]:
    """What of ``wanted`` (``resource_gap``'s names and units) the nodes lack even with nothing
    running on them (empty: none): a ``minResources`` the cluster can never give."""
    gap: dict[str, int] = {}
    for name, amount in sorted(wanted.items()):
        if name == "cpu":
            total = int(cluster.cpu_capacity.sum())
        elif name == "pods":
            if any(node.max_pods is None for node in cluster.nodes):
                continue
            total = sum(node.max_pods or 0 for node in cluster.nodes)
        elif name == GPUS:
            total = int(cluster.gpu_count.sum())
        else:
            total = sum(node.allocatable.get(name, 0) for node in cluster.nodes)
        if amount > total:
            gap[name] = amount - total
    return gap


@dataclass(frozen=True)
class GroupVictims:
    """A group's plan once ``victims`` (pod uids) are evicted, and nothing more."""

    plan: GroupPlacement
    victims: tuple[str, ...]


def group_preemption(
    group: GroupRequest,
    cluster: ClusterState,
    policy: Policy,
    rng: random.Random,
    candidates: Sequence[str],
    *,
    filters: Sequence[FilterPlugin] = DEFAULT_FILTERS,
) -> GroupVictims | None:
    """Which of ``candidates`` (placed pods the group may preempt, the ones to keep most first)
    must go for the group's minimum to fit whole; None when it does not fit even with all of
    them gone (then nobody is evicted), or fits without evicting anyone.

    The group is planned with every candidate removed; then, the plan's members booked, each
    candidate in order is put back when it still fits beside them: the victims are the ones that
    do not. The cluster is left as it was.
    """
    removed: list[tuple[Allocation, PodFacts | None]] = []
    facts = cluster.placement.index.facts if cluster.placement is not None else {}
    try:
        for uid in candidates:
            if uid in cluster.where:
                held = facts.get(uid)
                removed.append((cluster.forget(uid), held))
        plan = schedule_group(group, cluster, policy, rng, filters=filters)
        if not isinstance(plan, GroupPlacement):
            return None
        by_uid = {m.uid: m for m in group.members}
        booked: list[str] = []
        victims: list[str] = []
        try:
            for placement in plan.placements:
                cluster.assume(placement.allocation, facts_of(by_uid[placement.allocation.pod_uid]))
                booked.append(placement.allocation.pod_uid)
            for alloc, held in removed:
                try:
                    cluster.assume(alloc, held)
                    booked.append(alloc.pod_uid)
                except AllocationConflict:
                    victims.append(alloc.pod_uid)
        finally:
            for uid in booked:
                cluster.forget(uid)
        return GroupVictims(plan, tuple(victims)) if victims else None
    finally:
        for alloc, held in removed:
            cluster.book(alloc, held)


def fits_alone(
    group: GroupRequest,
    cluster: ClusterState,
    policy: Policy,
    rng: random.Random,
    *,
    filters: Sequence[FilterPlugin] = DEFAULT_FILTERS,
) -> bool:
    """Whether the group's minimum would fit if no pod but its own members ran: what the
    starvation guard may hold other pods back for (a group whose node selector, taints or
    resources no node can meet must not). The cluster is left as it was."""
    own = {m.uid for m in group.members}
    facts = cluster.placement.index.facts if cluster.placement is not None else {}
    removed: list[tuple[Allocation, PodFacts | None]] = []
    try:
        for uid in [u for u in cluster.where if u not in own]:
            held = facts.get(uid)
            removed.append((cluster.forget(uid), held))
        return isinstance(schedule_group(group, cluster, policy, rng, filters=filters), GroupPlacement)
    finally:
        for alloc, held in removed:
            cluster.book(alloc, held)


def never_fits(group: GroupRequest, cluster: ClusterState) -> str:
    """Why the group's minimum could not fit the cluster's GPUs even if nothing else ran ("" when
    it might): fewer than ``min_member`` members ask for no more GPUs than the largest node has,
    or the ``min_member`` smallest of them ask for more than all the nodes have. A bound, not a
    plan: "" does not promise a fit."""
    counts = cluster.gpu_count
    most = int(counts.max()) if len(counts) else 0
    total = int(counts.sum())
    fitting = sorted(m.whole_gpus for m in group.members if m.whole_gpus <= most)
    if len(fitting) < group.min_member:
        return (
            f"{len(group.members) - len(fitting)} of its members ask for more GPUs than any node has "
            f"({most}), and it needs {group.min_member}"
        )
    need = sum(fitting[: group.min_member])
    if need > total:
        return f"its {group.min_member} smallest members ask for {need} GPUs, the nodes have {total}"
    return ""
