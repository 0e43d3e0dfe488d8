"""The placement rules of scheduling decisions over one cluster view: node affinity, inter-pod
affinity and topology spread as kube-scheduler's filter and score plugins apply them.

A ``PlacementView`` holds what those rules look at besides a node's resources: every node's
labels and taints (the cluster's nodes first, in the cluster's order, then any other nodes whose
pods still count for pod affinity and spreading), the placed pods (``PodIndex``) and the
namespaces' labels. The filter and score plugins of the core call it with the incoming pod's
``PodPlacement``; pods without such rules, in a cluster where no placed pod has required
anti-affinity, cost one attribute test (``filters_apply`` / ``scores_apply`` are False).

Filter codes (``filter``) are the first rule a node fails in kube-scheduler's plugin order
(NodeAffinity, then PodTopologySpread, then InterPodAffinity); ``REASONS`` gives their
messages and ``UNRESOLVABLE`` those that evicting pods cannot cure (preemption skips such nodes).
Scores (``scores``) are kube-scheduler's default weights: 2 x NodeAffinity + 2 x InterPodAffinity
+ 2 x PodTopologySpread, each normalised to 0..100 over the feasible nodes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from scheduler.core.affinity import (
    FAIL_AFFINITY,
    FAIL_ANTI_AFFINITY,
    FAIL_EXISTING_ANTI_AFFINITY,
    INTERPOD_REASONS,
    NO_POD_AFFINITY,
    NODE_AFFINITY_REASON,
    NodeAffinity,
    NodeDomains,
    PodFacts,
    PodIndex,
    interpod_filter,
    interpod_scores,
    node_affinity_scores,
)
from scheduler.core.constraints import NO_RULES, PlacementRules, placement_rules, pod_facts
from scheduler.core.request import Taint, TaintEffect, Toleration
from scheduler.core.spread import (
    FAIL_MISSING_LABEL,
    FAIL_SKEW,
    SPREAD_REASONS,
    spread_filter,
    spread_scores,
)

PASS = 0
NODE_AFFINITY = 1
SPREAD_MISSING_LABEL, SPREAD_SKEW = 2, 3
AFFINITY, ANTI_AFFINITY, EXISTING_ANTI_AFFINITY = 4, 5, 6
REASONS = {
    NODE_AFFINITY: NODE_AFFINITY_REASON,
    SPREAD_MISSING_LABEL: SPREAD_REASONS[FAIL_MISSING_LABEL],
    SPREAD_SKEW: SPREAD_REASONS[FAIL_SKEW],
    AFFINITY: INTERPOD_REASONS[FAIL_AFFINITY],
    ANTI_AFFINITY: INTERPOD_REASONS[FAIL_ANTI_AFFINITY],
    EXISTING_ANTI_AFFINITY: INTERPOD_REASONS[FAIL_EXISTING_ANTI_AFFINITY],
}
# kube-scheduler answers these UnschedulableAndUnresolvable: no eviction makes the node fit
UNRESOLVABLE = frozenset({NODE_AFFINITY, SPREAD_MISSING_LABEL, AFFINITY})
_SPREAD_CODES = {FAIL_MISSING_LABEL: SPREAD_MISSING_LABEL, FAIL_SKEW: SPREAD_SKEW}
_INTERPOD_CODES = {
    FAIL_AFFINITY: AFFINITY,
    FAIL_ANTI_AFFINITY: ANTI_AFFINITY,
    FAIL_EXISTING_ANTI_AFFINITY: EXISTING_ANTI_AFFINITY,
}
WEIGHT = 2  # kube-scheduler's default weight of each of the three score plugins
METADATA_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class PodPlacement:
    """What the placement rules need of the pod being scheduled: its facts (uid, namespace,
    labels, pod affinity terms, as placed pods' rules and its own see them), its rules (node
    affinity, spread, priority) and tolerations. ``placement_of`` builds one from the Pod's JSON."""

    facts: PodFacts
    rules: PlacementRules = NO_RULES
    tolerations: tuple[Toleration, ...] = ()

    @property
    def node_affinity(self) -> NodeAffinity:
        return self.rules.node_affinity


def placement_of(pod: Mapping[str, Any], tolerations: tuple[Toleration, ...] = ()) -> PodPlacement:
    """The placement of a Pod (API JSON) being scheduled; raise ``SpecError`` for bad rules."""
    rules = placement_rules(pod)
    facts = pod_facts(pod)
    if rules.pod_affinity.any or facts.affinity.any:  # the strictly parsed terms are the pod's own
        affinity = rules.pod_affinity if rules.pod_affinity.any else NO_POD_AFFINITY
        facts = replace(facts, affinity=affinity)
    return PodPlacement(facts, rules, tolerations)


def untolerated(taints: Sequence[Taint], tolerations: Sequence[Toleration]) -> bool:
    """A NoSchedule or NoExecute taint none of ``tolerations`` tolerates."""
    return any(
        t.effect != TaintEffect.PREFER_NO_SCHEDULE and not any(tol.tolerates(t) for tol in tolerations)
        for t in taints
    )


class PlacementView:
    """Nodes' labels and taints, placed pods and namespaces' labels (see the module docstring).

    Rows ``0 .. n_cluster - 1`` are the cluster's nodes in its order; later rows are other nodes
    (kubegpu does not place pods there, but their pods count for affinity and spreading).
    """

    def __init__(
        self,
        names: Sequence[str],
        labels: Sequence[Mapping[str, str]],
        taints: Sequence[Sequence[Taint]] | None = None,
        n_cluster: int | None = None,
        namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.domains = NodeDomains(names, labels)
        self.row = {name: i for i, name in enumerate(names)}
        self.taints = [tuple(t) for t in taints] if taints is not None else [() for _ in names]
        if len(self.taints) != len(names):
            raise ValueError("one taint list per node")
        self.n_cluster = len(names) if n_cluster is None else n_cluster
        self.index = PodIndex(len(names))
        # the caller's mapping, kept by reference: it may update it as namespaces change
        self.namespace_labels: Mapping[str, Mapping[str, str]] = (
            namespace_labels if namespace_labels is not None else {}
        )
        self._ns_labels = _NamespaceLabels(self.namespace_labels)
        self._affinity_masks: dict[NodeAffinity, np.ndarray] = {}
        self._taint_masks: dict[tuple[Toleration, ...], np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.domains)

    # -- pods and namespaces --------------------------------------------------------------------

    def place(self, pod: PodFacts, node: str) -> bool:
        """Record a placed pod (False when the node is unknown: it then counts nowhere)."""
        row = self.row.get(node)
        if row is None:
            return False
        self.index.add(pod, row)
        return True

    def remove(self, uid: str) -> None:
        self.index.remove(uid)

    def ns_labels(self) -> Mapping[str, Mapping[str, str]]:
        return self._ns_labels

    # -- masks over all rows (memoised: node labels and taints do not change within a view) -----

    def node_affinity_mask(self, affinity: NodeAffinity) -> np.ndarray:
        """Per row: the node satisfies ``nodeSelector`` and required node affinity."""
        mask = self._affinity_masks.get(affinity)
        if mask is None:
            names, labels = self.domains.names, self.domains.labels
            if affinity.has_required:
                mask = np.fromiter(
                    (affinity.matches(n, ls) for n, ls in zip(names, labels, strict=True)),
                    dtype=bool,
                    count=len(names),
                )
            else:
                mask = np.ones(len(names), dtype=bool)
            self._affinity_masks[affinity] = mask
        return mask

    def taints_mask(self, tolerations: tuple[Toleration, ...]) -> np.ndarray:
        """Per row: the pod tolerates every NoSchedule / NoExecute taint of the node."""
        mask = self._taint_masks.get(tolerations)
        if mask is None:
            mask = np.fromiter(
                (not untolerated(t, tolerations) for t in self.taints), dtype=bool, count=len(self.taints)
            )
            self._taint_masks[tolerations] = mask
        return mask

    # -- filter ---------------------------------------------------------------------------------

    def filters_apply(self, pod: PodPlacement, node_affinity: bool = True) -> bool:
        """Whether ``filter`` can reject anything (``node_affinity``: counting node affinity)."""
        rules = pod.rules
        if rules is NO_RULES and not pod.facts.affinity.any:  # the common case, decided at once
            return bool(self.index.with_required_anti)
        return (
            (node_affinity and rules.node_affinity.has_required)
            or any(c.hard for c in rules.spread)
            or pod.facts.affinity.has_required
            or bool(self.index.with_required_anti)
        )

    def filter(
        self, pod: PodPlacement, idx: np.ndarray, exclude: Collection[str] = (), node_affinity: bool = True
    ) -> np.ndarray:
        """Per node of ``idx`` (cluster rows): ``PASS`` or the first rule failed (``REASONS``);
        without ``node_affinity`` the nodes are known to satisfy the pod's node affinity."""
        out = np.zeros(len(idx), dtype=np.int8)
        rules, facts = pod.rules, pod.facts
        affinity_ok = self.node_affinity_mask(rules.node_affinity)
        if node_affinity and rules.node_affinity.has_required:
            out[~affinity_ok[idx]] = NODE_AFFINITY
        left = np.flatnonzero(out == PASS)
        if any(c.hard for c in rules.spread) and len(left):
            codes = spread_filter(
                facts.namespace,
                facts.labels,
                rules.spread,
                self.index,
                self.domains,
                idx[left],
                affinity_ok,
                self.taints_mask(pod.tolerations),
                exclude,
                facts.uid,
            )
            for code, mine in _SPREAD_CODES.items():
                out[left[codes == code]] = mine
            left = left[codes == 0]
        if (facts.affinity.has_required or self.index.with_required_anti) and len(left):
            codes = interpod_filter(facts, self.index, self.domains, self.ns_labels(), idx[left], exclude)
            for code, mine in _INTERPOD_CODES.items():
                out[left[codes == code]] = mine
        return out

    # -- score ----------------------------------------------------------------------------------

    def scores_apply(self, pod: PodPlacement) -> bool:
        rules = pod.rules
        if rules is NO_RULES and not pod.facts.affinity.any:
            return bool(self.index.with_affinity)
        return (
            bool(rules.node_affinity.preferred)
            or any(not c.hard for c in rules.spread)
            or bool(pod.facts.affinity.preferred or pod.facts.affinity.preferred_anti)
            or bool(self.index.with_affinity)
        )

    def scores(self, pod: PodPlacement, idx: np.ndarray, exclude: Collection[str] = ()) -> np.ndarray:
        """``2 * (NodeAffinity + InterPodAffinity + PodTopologySpread)`` for the feasible ``idx``."""
        rules, facts = pod.rules, pod.facts
        total = np.zeros(len(idx))
        if rules.node_affinity.preferred:
            total += node_affinity_scores(rules.node_affinity, self.domains.names, self.domains.labels, idx)
        if any(not c.hard for c in rules.spread):
            total += spread_scores(
                facts.namespace,
                rules.spread,
                self.index,
                self.domains,
                idx,
                self.node_affinity_mask(rules.node_affinity),
                self.taints_mask(pod.tolerations),
                exclude,
                facts.uid,
            )
        if facts.affinity.preferred or facts.affinity.preferred_anti or self.index.with_affinity:
            total += interpod_scores(facts, self.index, self.domains, self.ns_labels(), idx, exclude=exclude)
        return WEIGHT * total


class _NamespaceLabels(Mapping[str, Mapping[str, str]]):
    """Namespaces' labels; a namespace not (yet) known has at least the label every namespace
    carries, ``kubernetes.io/metadata.name``."""

    def __init__(self, known: Mapping[str, Mapping[str, str]]) -> None:
        self.known = known

    def __getitem__(self, namespace: str) -> Mapping[str, str]:
        found = self.known.get(namespace)
        return found if found is not None else {METADATA_NAME_LABEL: namespace}

    get = __getitem__  # type: ignore[assignment]  # every namespace has labels: no default needed

    def __iter__(self):
        return iter(self.known)

    def __len__(self) -> int:
        return len(self.known)
