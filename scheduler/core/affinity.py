"""Node affinity and inter-pod affinity, with kube-scheduler's filter and score semantics.

**Node affinity** (plugin NodeAffinity). A node passes when it has every ``nodeSelector`` label and,
if the pod has required node affinity, matches one of its terms. Its score is the sum of the
weights of the preferred terms it matches, normalised over the feasible nodes to
``100 * score // max`` (all 0 when the best is 0).

**Inter-pod affinity** (plugin InterPodAffinity), over the pods already placed (``PodIndex``) and
the nodes' topology domains (``NodeDomains``: a node's domain for a topology key is its value of
that label). A pair (topology key, value) counts the placed pods in that domain that a term
matches. A node fails, in this order:

1. the pod's required affinity: some term's key is not a label of the node, or no placed pod that
   matches *all* required terms lies in the node's domain of some term. Exception: when no placed
   pod anywhere matches all of them and the pod matches its own terms, any node that has the keys
   passes (the first pod of a group that attracts itself);
2. the pod's required anti-affinity: a placed pod matching a term lies in the node's domain of
   that term's key;
3. placed pods' required anti-affinity (the symmetry rule): a placed pod has a term that matches
   the incoming pod, and the node lies in that pod's domain of the term's key.

A term matches a pod when the pod's namespace is in the term's namespaces (by default the
namespace of the term's own pod) or its namespace's labels match the term's namespace selector,
and the pod's labels match the term's label selector.

The score of a node sums, over the domains it lies in, the weights of: the pod's preferred
affinity terms (+) and anti-affinity terms (-) per placed pod they match; placed pods' required
affinity terms that match the pod (+``hard_weight``, 1 by default) and their preferred affinity
(+) and anti-affinity (-) terms that match it. It is normalised over the feasible nodes to
``int(100 * (s - min) / (max - min))`` (all 0 when equal or when no term matched anything).

Terminating pods count like running ones (they still hold their place). ``exclude`` leaves pods
out (preemption asks how a node looks without its victims); the incoming pod itself never counts,
should the index already hold it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scheduler.core.selectors import NOTHING, LabelSelector, NodeSelector, NodeSelectorTerm, Op

MAX_NODE_SCORE = 100
NODE_AFFINITY_REASON = "node(s) didn't match Pod's node affinity/selector"
AFFINITY_REASON = "node(s) didn't match pod affinity rules"
ANTI_AFFINITY_REASON = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY_REASON = "node(s) didn't satisfy existing pods anti-affinity rules"

PASS, FAIL_AFFINITY, FAIL_ANTI_AFFINITY, FAIL_EXISTING_ANTI_AFFINITY = 0, 1, 2, 3
INTERPOD_REASONS = {
    FAIL_AFFINITY: AFFINITY_REASON,
    FAIL_ANTI_AFFINITY: ANTI_AFFINITY_REASON,
    FAIL_EXISTING_ANTI_AFFINITY: EXISTING_ANTI_AFFINITY_REASON,
}
NO_LABELS: Mapping[str, str] = {}
NO_PODS: Mapping[str, PodFacts] = {}


# -- node affinity ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeAffinity:
    """``nodeSelector``, required node affinity (None: none) and weighted preferred terms."""

    node_selector: tuple[tuple[str, str], ...] = ()
    required: NodeSelector | None = None
    preferred: tuple[tuple[int, NodeSelectorTerm], ...] = ()

    @property
    def has_required(self) -> bool:
        return bool(self.node_selector) or self.required is not None

    def matches(self, node_name: str, labels: Mapping[str, str]) -> bool:
        """The node satisfies ``nodeSelector`` and the required node affinity."""
        for key, value in self.node_selector:
            if labels.get(key) != value:
                return False
        return self.required is None or self.required.matches(node_name, labels)

    def preferred_score(self, node_name: str, labels: Mapping[str, str]) -> int:
        """The sum of the weights of the preferred terms the node matches."""
        return sum(w for w, term in self.preferred if term.matches(node_name, labels))


NO_NODE_AFFINITY = NodeAffinity()


def node_affinity_mask(
    affinity: NodeAffinity, names: Sequence[str], labels: Sequence[Mapping[str, str]], idx: np.ndarray
) -> np.ndarray:
    """Which of the nodes ``idx`` satisfy the pod's node selector and required node affinity."""
    if not affinity.has_required:
        return np.ones(len(idx), dtype=bool)
    return np.fromiter(
        (affinity.matches(names[i], labels[i]) for i in idx.tolist()), dtype=bool, count=len(idx)
    )


def default_normalize(raw: np.ndarray) -> np.ndarray:
    """kube-scheduler's ``DefaultNormalizeScore``: ``100 * s // max``, unchanged when max is 0."""
    top = int(raw.max()) if len(raw) else 0
    if top <= 0:
        return raw.astype(np.float64)
    return (MAX_NODE_SCORE * raw.astype(np.int64) // top).astype(np.float64)


def node_affinity_scores(
    affinity: NodeAffinity, names: Sequence[str], labels: Sequence[Mapping[str, str]], idx: np.ndarray
) -> np.ndarray:
    """Normalised preferred-node-affinity scores (0..100) of the feasible nodes ``idx``."""
    if not affinity.preferred:
        return np.zeros(len(idx))
    raw = np.fromiter(
        (affinity.preferred_score(names[i], labels[i]) for i in idx.tolist()), dtype=np.int64, count=len(idx)
    )
    return default_normalize(raw)


# -- pod affinity terms -------------------------------------------------------------------------


@dataclass(frozen=True)
class PodAffinityTerm:
    """Pods selected by ``selector`` in ``namespaces`` or in namespaces ``namespace_selector``
    selects, in the same domain of ``topology_key``."""

    selector: LabelSelector
    topology_key: str
    namespaces: frozenset[str] = frozenset()
    namespace_selector: LabelSelector = NOTHING

    def matches(self, namespace: str, labels: Mapping[str, str], ns_labels: Mapping[str, str] | None) -> bool:
        """Whether the term selects a pod of ``namespace`` with ``labels`` (``ns_labels``: the
        namespace's labels, when known)."""
        if namespace in self.namespaces or self.namespace_selector.matches(ns_labels or NO_LABELS):
            return self.selector.matches(labels)
        return False


@dataclass(frozen=True)
class WeightedPodAffinityTerm:
    weight: int
    term: PodAffinityTerm


@dataclass(frozen=True)
class PodAffinity:
    """A pod's inter-pod affinity and anti-affinity, required and preferred."""

    required: tuple[PodAffinityTerm, ...] = ()
    required_anti: tuple[PodAffinityTerm, ...] = ()
    preferred: tuple[WeightedPodAffinityTerm, ...] = ()
    preferred_anti: tuple[WeightedPodAffinityTerm, ...] = ()

    @property
    def any(self) -> bool:
        return bool(self.required or self.required_anti or self.preferred or self.preferred_anti)

    @property
    def has_required(self) -> bool:
        return bool(self.required or self.required_anti)


NO_POD_AFFINITY = PodAffinity()


@dataclass(frozen=True)
class PodFacts:
    """What the placement rules of other pods see of one pod."""

    uid: str
    namespace: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    affinity: PodAffinity = NO_POD_AFFINITY
    terminating: bool = False


def matches_all(terms: Sequence[PodAffinityTerm], pod: PodFacts, ns_labels: Mapping[str, str] | None) -> bool:
    """True iff there are terms and every one of them matches ``pod``."""
    return bool(terms) and all(t.matches(pod.namespace, pod.labels, ns_labels) for t in terms)


# -- where pods and domains are -----------------------------------------------------------------


class NodeDomains:
    """Every node's labels, and per topology key each node's domain as an integer code (-1 where
    the node lacks the label), so a domain test over all nodes is one array comparison."""

    def __init__(self, names: Sequence[str], labels: Sequence[Mapping[str, str]]) -> None:
        if len(names) != len(labels):
            raise ValueError("one label set per node")
        self.names = list(names)
        self.labels = [dict(ls) for ls in labels]
        self._codes: dict[str, tuple[np.ndarray, dict[str, int]]] = {}

    def __len__(self) -> int:
        return len(self.names)

    def _key(self, key: str) -> tuple[np.ndarray, dict[str, int]]:
        known = self._codes.get(key)
        if known is None:
            values: dict[str, int] = {}
            codes = np.fromiter(
                (values.setdefault(ls[key], len(values)) if key in ls else -1 for ls in self.labels),
                dtype=np.int64,
                count=len(self.labels),
            )
            known = self._codes[key] = (codes, values)
        return known

    def codes(self, key: str) -> np.ndarray:
        """Per node, the code of its value of ``key`` (-1: no such label)."""
        return self._key(key)[0]

    def code(self, key: str, value: str) -> int:
        """The code of domain ``key=value`` (-1 when no node is in it)."""
        return self._key(key)[1].get(value, -1)

    def in_domains(self, key: str, values: Iterable[str], idx: np.ndarray) -> np.ndarray:
        """Which of the nodes ``idx`` lie in one of the domains ``key=value``."""
        wanted = [c for c in (self.code(key, v) for v in values) if c >= 0]
        if not wanted:
            return np.zeros(len(idx), dtype=bool)
        return np.isin(self.codes(key)[idx], wanted)


HARD = None  # the weight key of placed pods' required affinity terms in ``PodIndex.scoring_terms``


class PodIndex:
    """The placed pods by node, by namespace and by label, with their affinity terms gathered.

    ``by_label[(key, value)]`` finds the pods a selector's ``In`` requirement can match without
    looking at the others. ``anti_terms[term][node]`` counts the placed pods on ``node`` having
    required anti-affinity ``term``, and ``scoring_terms[(term, weight)][node]`` those having a
    term that weighs the incoming pod's score (``HARD``: required affinity): replicas share their
    terms, so the symmetric rules cost one match per distinct term, not one per pod.
    """

    def __init__(self, n_nodes: int) -> None:
        self.node_of: dict[str, int] = {}
        self.facts: dict[str, PodFacts] = {}
        self.by_node: list[dict[str, PodFacts]] = [{} for _ in range(n_nodes)]
        self.by_namespace: dict[str, dict[str, PodFacts]] = {}
        self.by_label: dict[tuple[str, str], dict[str, PodFacts]] = {}
        self.with_affinity: dict[str, PodFacts] = {}  # any pod (anti-)affinity term
        self.with_required_anti: dict[str, PodFacts] = {}
        self.anti_terms: dict[PodAffinityTerm, Counter[int]] = {}
        self.scoring_terms: dict[tuple[PodAffinityTerm, int | None], Counter[int]] = {}

    @staticmethod
    def _scoring(affinity: PodAffinity) -> Iterable[tuple[PodAffinityTerm, int | None]]:
        for term in affinity.required:
            yield term, HARD
        for wt in affinity.preferred:
            yield wt.term, wt.weight
        for wt in affinity.preferred_anti:
            yield wt.term, -wt.weight

    @staticmethod
    def _count(table: dict, key: Any, node: int, delta: int) -> None:
        counts = table.get(key)
        if counts is None:
            counts = table[key] = Counter()
        counts[node] += delta
        if counts[node] <= 0:
            del counts[node]
            if not counts:
                del table[key]

    def __len__(self) -> int:
        return len(self.facts)

    def add(self, pod: PodFacts, node: int) -> None:
        """Place ``pod`` on node ``node`` (replacing what was known of it)."""
        self.remove(pod.uid)
        self.node_of[pod.uid] = node
        self.facts[pod.uid] = pod
        self.by_node[node][pod.uid] = pod
        self.by_namespace.setdefault(pod.namespace, {})[pod.uid] = pod
        for label in pod.labels.items():
            self.by_label.setdefault(label, {})[pod.uid] = pod
        if pod.affinity.any:
            self.with_affinity[pod.uid] = pod
            for key in self._scoring(pod.affinity):
                self._count(self.scoring_terms, key, node, 1)
        if pod.affinity.required_anti:
            self.with_required_anti[pod.uid] = pod
            for term in pod.affinity.required_anti:
                self._count(self.anti_terms, term, node, 1)

    def remove(self, uid: str) -> int | None:
        """Forget a pod; its node, or None if it was not placed."""
        node = self.node_of.pop(uid, None)
        if node is None:
            return None
        pod = self.facts.pop(uid)
        del self.by_node[node][uid]
        same_ns = self.by_namespace[pod.namespace]
        del same_ns[uid]
        if not same_ns:
            del self.by_namespace[pod.namespace]
        for label in pod.labels.items():
            same = self.by_label[label]
            del same[uid]
            if not same:
                del self.by_label[label]
        if self.with_affinity.pop(uid, None) is not None:
            for key in self._scoring(pod.affinity):
                self._count(self.scoring_terms, key, node, -1)
        if self.with_required_anti.pop(uid, None) is not None:
            for term in pod.affinity.required_anti:
                self._count(self.anti_terms, term, node, -1)
        return node

    def in_namespace(self, namespace: str) -> Mapping[str, PodFacts]:
        return self.by_namespace.get(namespace, NO_PODS)

    def selectable(self, terms: Iterable[PodAffinityTerm]) -> Mapping[str, PodFacts]:
        """The placed pods any of ``terms`` could select: those of the terms' namespaces, or all
        pods when a term selects namespaces by label."""
        namespaces: set[str] = set()
        for term in terms:
            if not term.namespace_selector.nothing:
                return self.facts
            namespaces |= term.namespaces
        if len(namespaces) == 1:
            return self.in_namespace(next(iter(namespaces)))
        return {uid: pod for ns in sorted(namespaces) for uid, pod in self.in_namespace(ns).items()}

    def candidates(self, selector: LabelSelector, pods: Mapping[str, PodFacts]) -> Mapping[str, PodFacts]:
        """Pods of ``pods`` that ``selector`` may match: through its narrowest ``In`` requirement's
        labels when that is smaller than ``pods`` (the selector must still be checked)."""
        if selector.nothing:
            return NO_PODS
        best: Mapping[str, PodFacts] | None = None
        size = len(pods)
        for req in selector.requirements:
            if req.op is not Op.IN:
                continue
            found = [self.by_label.get((req.key, v), NO_PODS) for v in req.values]
            total = sum(len(f) for f in found)
            if total < size:
                size = total
                best = found[0] if len(found) == 1 else {u: p for f in found for u, p in f.items()}
        return pods if best is None else best

    def term_candidates(self, term: PodAffinityTerm) -> Mapping[str, PodFacts]:
        return self.candidates(term.selector, self.selectable([term]))

    def placed(
        self, pods: Mapping[str, PodFacts], exclude: Collection[str], me: str = ""
    ) -> Iterable[tuple[PodFacts, int]]:
        """(pod, node) for the pods of ``pods`` other than ``me`` and those in ``exclude``."""
        node_of = self.node_of
        for uid, pod in pods.items():
            if uid not in exclude and uid != me:
                yield pod, node_of[uid]


# -- inter-pod affinity: filter -----------------------------------------------------------------


@dataclass
class InterPodCounts:
    """Per (topology key, value): placed pods that match all of the incoming pod's required affinity
    terms, that match its anti-affinity terms, and whose anti-affinity terms match it."""

    affinity: Counter[tuple[str, str]]
    anti: Counter[tuple[str, str]]
    existing_anti: Counter[tuple[str, str]]


def interpod_counts(
    pod: PodFacts,
    index: PodIndex,
    domains: NodeDomains,
    ns_labels: Mapping[str, Mapping[str, str]],
    exclude: Collection[str] = (),
) -> InterPodCounts:
    """kube-scheduler's InterPodAffinity PreFilter state for ``pod``."""
    affinity: Counter[tuple[str, str]] = Counter()
    anti: Counter[tuple[str, str]] = Counter()
    existing: Counter[tuple[str, str]] = Counter()
    labels = domains.labels
    own_ns = ns_labels.get(pod.namespace)
    if exclude or pod.uid in index.node_of:  # pod by pod, leaving some out
        for other, node in index.placed(index.with_required_anti, exclude, pod.uid):
            where = labels[node]
            for term in other.affinity.required_anti:
                if term.topology_key in where and term.matches(pod.namespace, pod.labels, own_ns):
                    existing[(term.topology_key, where[term.topology_key])] += 1
    else:  # per distinct term
        for term, nodes in index.anti_terms.items():
            if term.matches(pod.namespace, pod.labels, own_ns):
                key = term.topology_key
                for node, n in nodes.items():
                    if key in labels[node]:
                        existing[(key, labels[node][key])] += n
    req, req_anti = pod.affinity.required, pod.affinity.required_anti
    if req:
        pool = min((index.term_candidates(t) for t in req), key=len)  # a pod must match them all
        for other, node in index.placed(pool, exclude, pod.uid):
            if matches_all(req, other, ns_labels.get(other.namespace)):
                where = labels[node]
                for term in req:
                    if term.topology_key in where:
                        affinity[(term.topology_key, where[term.topology_key])] += 1
    for term in req_anti:
        for other, node in index.placed(index.term_candidates(term), exclude, pod.uid):
            where = labels[node]
            if term.topology_key in where and term.matches(
                other.namespace, other.labels, ns_labels.get(other.namespace)
            ):
                anti[(term.topology_key, where[term.topology_key])] += 1
    return InterPodCounts(affinity, anti, existing)


def _domains_hit(counts: Counter[tuple[str, str]], key: str) -> list[str]:
    return [value for (k, value), n in counts.items() if k == key and n > 0]


def interpod_filter(
    pod: PodFacts,
    index: PodIndex,
    domains: NodeDomains,
    ns_labels: Mapping[str, Mapping[str, str]],
    idx: np.ndarray,
    exclude: Collection[str] = (),
) -> np.ndarray:
    """Per node of ``idx``: ``PASS`` or the first rule it fails (``FAIL_AFFINITY``,
    ``FAIL_ANTI_AFFINITY``, ``FAIL_EXISTING_ANTI_AFFINITY``; ``INTERPOD_REASONS`` names them)."""
    out = np.zeros(len(idx), dtype=np.int8)
    if not pod.affinity.has_required and not index.with_required_anti:
        return out
    counts = interpod_counts(pod, index, domains, ns_labels, exclude)
    if counts.existing_anti:
        bad = np.zeros(len(idx), dtype=bool)
        for key in {k for k, _ in counts.existing_anti}:
            bad |= domains.in_domains(key, _domains_hit(counts.existing_anti, key), idx)
        out[bad] = FAIL_EXISTING_ANTI_AFFINITY
    if counts.anti:
        bad = np.zeros(len(idx), dtype=bool)
        for key in {t.topology_key for t in pod.affinity.required_anti}:
            bad |= domains.in_domains(key, _domains_hit(counts.anti, key), idx)
        out[bad] = FAIL_ANTI_AFFINITY
    required = pod.affinity.required
    if required:
        has_keys = np.ones(len(idx), dtype=bool)
        pods_exist = np.ones(len(idx), dtype=bool)
        for term in required:
            has_keys &= domains.codes(term.topology_key)[idx] >= 0
            pods_exist &= domains.in_domains(
                term.topology_key, _domains_hit(counts.affinity, term.topology_key), idx
            )
        if not counts.affinity and matches_all(required, pod, ns_labels.get(pod.namespace)):
            ok = has_keys
        else:
            ok = has_keys & pods_exist
        out[~ok] = FAIL_AFFINITY
    return out


# -- inter-pod affinity: score ------------------------------------------------------------------


def interpod_topology_score(
    pod: PodFacts,
    index: PodIndex,
    domains: NodeDomains,
    ns_labels: Mapping[str, Mapping[str, str]],
    hard_weight: int = 1,
    exclude: Collection[str] = (),
) -> dict[tuple[str, str], int] | None:
    """(topology key, value) -> summed weights; None when no term matched anything (kube-scheduler
    then skips the plugin)."""
    own = pod.affinity
    labels = domains.labels
    own_ns = ns_labels.get(pod.namespace)
    score: dict[tuple[str, str], int] = defaultdict(int)
    touched = False

    def add(term: PodAffinityTerm, weight: int, node: int, times: int = 1) -> None:
        nonlocal touched
        where = labels[node]
        if where and term.topology_key in where:
            score[(term.topology_key, where[term.topology_key])] += weight * times
            touched = True

    # the pod's own preferences, per placed pod they match
    for wt, sign in [(wt, 1) for wt in own.preferred] + [(wt, -1) for wt in own.preferred_anti]:
        for other, node in index.placed(index.term_candidates(wt.term), exclude, pod.uid):
            if wt.term.matches(other.namespace, other.labels, ns_labels.get(other.namespace)):
                add(wt.term, sign * wt.weight, node)
    # placed pods' terms about this pod
    if exclude or pod.uid in index.node_of:
        for other, node in index.placed(index.with_affinity, exclude, pod.uid):
            for term, weight in PodIndex._scoring(other.affinity):
                if (weight is not HARD or hard_weight > 0) and term.matches(
                    pod.namespace, pod.labels, own_ns
                ):
                    add(term, hard_weight if weight is HARD else weight, node)
    else:
        for (term, weight), nodes in index.scoring_terms.items():
            if weight is HARD and hard_weight <= 0:
                continue
            if term.matches(pod.namespace, pod.labels, own_ns):
                for node, n in nodes.items():
                    add(term, hard_weight if weight is HARD else weight, node, n)
    return dict(score) if touched else None


def interpod_scores(
    pod: PodFacts,
    index: PodIndex,
    domains: NodeDomains,
    ns_labels: Mapping[str, Mapping[str, str]],
    idx: np.ndarray,
    hard_weight: int = 1,
    exclude: Collection[str] = (),
) -> np.ndarray:
    """Normalised InterPodAffinity scores (0..100) of the feasible nodes ``idx``."""
    if not pod.affinity.preferred and not pod.affinity.preferred_anti and not index.with_affinity:
        return np.zeros(len(idx))
    topo = interpod_topology_score(pod, index, domains, ns_labels, hard_weight, exclude)
    if topo is None:
        return np.zeros(len(idx))
    raw = np.zeros(len(idx), dtype=np.int64)
    for (key, value), weight in topo.items():
        code = domains.code(key, value)
        if weight and code >= 0:
            raw += weight * (domains.codes(key)[idx] == code)
    if not len(raw):
        return np.zeros(0)
    low, high = int(raw.min()), int(raw.max())
    if high - low <= 0:
        return np.zeros(len(idx))
    return np.trunc(float(MAX_NODE_SCORE) * ((raw - low) / float(high - low)))
