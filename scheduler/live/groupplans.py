"""The extender's last plan of each gang, so its members' ``choose`` calls do not plan it anew.

kube-scheduler asks about a gang's members one at a time (``choose``, scheduler/live/extender.py),
and each answer comes from a plan of the whole group (``schedule_group``). Planning costs about as
much as the group's members times the nodes, so planning again for every member costs a gang of
N members N plans where kubegpu's own scheduler makes one. A plan is kept per group and answers
the next member while it still holds: the same cluster object, the same members and minimum, and
since it was made no change to the cluster but its own members placed on the nodes it gave them
(the cluster's change log, ``ClusterState.changed_since``, names the nodes changed; each must be a
node of the plan holding exactly the pods it held then and the members placed there since). The
caller still checks that the member fits its node now and that the node is among the member's
candidates; anything else is planned again. Answering every member from one plan is what
kubegpu's own scheduler does (it binds the plan's members together); a plan made anew after some
members are placed could differ (the planner is greedy, then searches within a budget).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.state import ClusterState

MAX_GROUPS = 256  # plans kept at most (the oldest dropped first)


@dataclass(frozen=True)
class _Plan:
    cluster: ClusterState
    key: tuple  # the group's members (uids) and its minimum and domain, as planned
    generation: int  # the cluster's generation just after the plan
    nodes: dict[str, int]  # member uid -> the node index the plan gave it
    pods_on: dict[int, frozenset[str]]  # per node the plan gave a member, the pods on it then


class GroupPlans:
    """The last plan of each group (see the module docstring)."""

    def __init__(self) -> None:
        self._plans: dict[object, _Plan] = {}

    def remember(self, ref: object, key: tuple, cluster: ClusterState, nodes: dict[str, int]) -> None:
        """Keep ``nodes`` (member uid -> node index) as ``ref``'s plan for ``key``, made on
        ``cluster`` as it is now."""
        self._plans.pop(ref, None)
        if len(self._plans) >= MAX_GROUPS:
            self._plans.pop(next(iter(self._plans)))
        pods_on = {i: frozenset(cluster.nodes[i].allocations) for i in set(nodes.values())}
        self._plans[ref] = _Plan(cluster, key, cluster.generation, dict(nodes), pods_on)

    def forget(self, ref: object) -> None:
        self._plans.pop(ref, None)

    def recall(self, ref: object, key: tuple, cluster: ClusterState, uid: str) -> int | None:
        """The node index ``ref``'s kept plan gave member ``uid``, if the plan still holds for
        ``key`` on ``cluster`` (else None, and the plan is dropped)."""
        plan = self._plans.get(ref)
        if plan is None:
            return None
        if plan.cluster is not cluster or plan.key != key or not self._holds(plan, cluster):
            del self._plans[ref]
            return None
        return plan.nodes.get(uid)

    @staticmethod
    def _holds(plan: _Plan, cluster: ClusterState) -> bool:
        """Whether every change since the plan is one of its members placed where it planned
        them: the nodes changed are nodes of the plan, and each holds the pods it held then and
        the members placed on it since, no other; no member is placed elsewhere."""
        rows = cluster.changed_since(plan.generation)
        if rows is None:
            return False
        if not rows:
            return True
        where = cluster.where
        if any(uid in where and where[uid] != i for uid, i in plan.nodes.items()):
            return False
        for row in set(rows):
            before = plan.pods_on.get(row)
            if before is None:
                return False
            placed = {uid for uid, i in plan.nodes.items() if i == row and uid in where}
            if set(cluster.nodes[row].allocations) != before | placed:
                return False
        return True
