"""Read a pod's placement rules from its API JSON: node affinity, pod (anti-)affinity, topology
spread constraints, priority and preemption policy.

Pure functions over the Pod's JSON dict (no Kubernetes client). ``placement_rules`` is for the pod
being scheduled: what cannot be read raises ``SpecError`` naming the field (the live scheduler
turns it into a FailedScheduling Event), except that a required node affinity term that does not
parse only matches no node, as in kube-scheduler. ``pod_facts`` is for pods already placed: their
terms that do not parse are dropped, never an error (kube-scheduler ignores them too).

Defaults are the API's: the namespaces of a pod affinity term are the pod's own unless it lists
some or has a ``namespaceSelector``; ``matchLabelKeys`` / ``mismatchLabelKeys`` add ``key In
(value)`` / ``key NotIn (value)`` for the pod's own label values; a spread constraint has
``minDomains`` 1, ``nodeAffinityPolicy: Honor`` and ``nodeTaintsPolicy: Ignore``; priority is
``spec.priority`` (set by the API server from ``priorityClassName``), 0 when absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.core.affinity import (
    NO_NODE_AFFINITY,
    NO_POD_AFFINITY,
    NodeAffinity,
    PodAffinity,
    PodAffinityTerm,
    PodFacts,
    WeightedPodAffinityTerm,
)
from scheduler.core.preempt import PREEMPT_LOWER, PREEMPT_NEVER
from scheduler.core.selectors import (
    NOTHING,
    NodeSelector,
    NodeSelectorTerm,
    SelectorError,
    parse_label_selector,
    parse_node_selector_term,
    valid_label_key,
)
from scheduler.core.spread import SpreadConstraint

INT32_MAX = (1 << 31) - 1
DO_NOT_SCHEDULE, SCHEDULE_ANYWAY = "DoNotSchedule", "ScheduleAnyway"
HONOR, IGNORE = "Honor", "Ignore"


RULE_FIELDS = ("nodeSelector", "affinity", "topologySpreadConstraints", "priority", "preemptionPolicy")


class SpecError(ValueError):
    """A placement rule of the pod cannot be read; the message names the field."""


@dataclass(frozen=True)
class PlacementRules:
    """Everything about where a pod may go besides its resources."""

    node_affinity: NodeAffinity = NO_NODE_AFFINITY
    pod_affinity: PodAffinity = NO_POD_AFFINITY
    spread: tuple[SpreadConstraint, ...] = ()
    priority: int = 0
    preemption_policy: str = PREEMPT_LOWER

    @property
    def uses_pods(self) -> bool:
        """The pod's own rules look at other pods (pod affinity or spread constraints)."""
        return self.pod_affinity.any or bool(self.spread)


NO_RULES = PlacementRules()


def _obj(raw: Any, where: str) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where} must be an object")
    return raw


def _list(raw: Any, where: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise SpecError(f"{where} must be a list")
    return raw


def _int(raw: Any, where: str, low: int, high: int, default: int | None = None) -> int:
    if raw is None and default is not None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        raise SpecError(f"{where} must be an integer in {low}..{high}, got {raw!r}")
    return raw


def _weight(raw: Any, where: str) -> int:
    return _int(raw, f"{where}.weight", 1, 100)


# -- node affinity ------------------------------------------------------------------------------


def parse_node_affinity(spec: Mapping[str, Any]) -> NodeAffinity:
    """``spec.nodeSelector`` and ``spec.affinity.nodeAffinity``."""
    selector = _obj(spec.get("nodeSelector"), "spec.nodeSelector")
    for key, value in selector.items():
        if not isinstance(value, str):
            raise SpecError(f"spec.nodeSelector[{key}] must be a string")
    where = "spec.affinity.nodeAffinity"
    raw = _obj(_obj(spec.get("affinity"), "spec.affinity").get("nodeAffinity"), where)
    required: NodeSelector | None = None
    req = raw.get("requiredDuringSchedulingIgnoredDuringExecution")
    if req is not None:
        rwhere = f"{where}.requiredDuringSchedulingIgnoredDuringExecution"
        terms = _list(_obj(req, rwhere).get("nodeSelectorTerms"), f"{rwhere}.nodeSelectorTerms")
        required = NodeSelector(
            tuple(
                parse_node_selector_term(t, f"{rwhere}.nodeSelectorTerms[{i}]", lazy=True)
                for i, t in enumerate(terms)
            )
        )
    preferred: list[tuple[int, NodeSelectorTerm]] = []
    pwhere = f"{where}.preferredDuringSchedulingIgnoredDuringExecution"
    for i, item in enumerate(_list(raw.get("preferredDuringSchedulingIgnoredDuringExecution"), pwhere)):
        item = _obj(item, f"{pwhere}[{i}]")
        weight = _weight(item.get("weight"), f"{pwhere}[{i}]")
        try:
            term = parse_node_selector_term(item.get("preference"), f"{pwhere}[{i}].preference")
        except SelectorError as error:
            raise SpecError(str(error)) from None
        if not term.empty:
            preferred.append((weight, term))
    return NodeAffinity(tuple(sorted(selector.items())), required, tuple(preferred))


# -- pod affinity -------------------------------------------------------------------------------


def parse_pod_affinity_term(
    raw: Any, where: str, namespace: str, labels: Mapping[str, str]
) -> PodAffinityTerm:
    """A ``v1.PodAffinityTerm`` of a pod in ``namespace`` with ``labels``."""
    term = _obj(raw, where)
    key = term.get("topologyKey")
    if not isinstance(key, str) or not valid_label_key(key):
        raise SpecError(f"{where}.topologyKey must be a label key, got {key!r}")
    try:
        selector = parse_label_selector(term.get("labelSelector"), f"{where}.labelSelector")
        ns_raw = term.get("namespaceSelector")
        ns_selector = (
            NOTHING if ns_raw is None else parse_label_selector(ns_raw, f"{where}.namespaceSelector")
        )
    except SelectorError as error:
        raise SpecError(str(error)) from None
    names = _list(term.get("namespaces"), f"{where}.namespaces")
    if not all(isinstance(n, str) for n in names):
        raise SpecError(f"{where}.namespaces must be a list of strings")
    namespaces = frozenset(names) if names or ns_raw is not None else frozenset({namespace})
    for field, negate in (("matchLabelKeys", False), ("mismatchLabelKeys", True)):
        keys = _list(term.get(field), f"{where}.{field}")
        if not all(isinstance(k, str) for k in keys):
            raise SpecError(f"{where}.{field} must be a list of strings")
        selector = selector.merged(labels, keys, negate=negate)
    return PodAffinityTerm(selector, key, namespaces, ns_selector)


def _terms(raw: Mapping[str, Any], where: str, namespace: str, labels: Mapping[str, str]):
    if not raw:
        return (), ()
    req_where = f"{where}.requiredDuringSchedulingIgnoredDuringExecution"
    required = tuple(
        parse_pod_affinity_term(t, f"{req_where}[{i}]", namespace, labels)
        for i, t in enumerate(_list(raw.get("requiredDuringSchedulingIgnoredDuringExecution"), req_where))
    )
    pref_where = f"{where}.preferredDuringSchedulingIgnoredDuringExecution"
    preferred = []
    for i, item in enumerate(_list(raw.get("preferredDuringSchedulingIgnoredDuringExecution"), pref_where)):
        item = _obj(item, f"{pref_where}[{i}]")
        weight = _weight(item.get("weight"), f"{pref_where}[{i}]")
        term = parse_pod_affinity_term(
            item.get("podAffinityTerm"), f"{pref_where}[{i}].podAffinityTerm", namespace, labels
        )
        preferred.append(WeightedPodAffinityTerm(weight, term))
    return required, tuple(preferred)


def parse_pod_affinity(spec: Mapping[str, Any], namespace: str, labels: Mapping[str, str]) -> PodAffinity:
    """``spec.affinity.podAffinity`` and ``podAntiAffinity``."""
    affinity = _obj(spec.get("affinity"), "spec.affinity")
    if affinity.get("podAffinity") is None and affinity.get("podAntiAffinity") is None:
        return NO_POD_AFFINITY
    where, anti_where = "spec.affinity.podAffinity", "spec.affinity.podAntiAffinity"
    required, preferred = _terms(_obj(affinity.get("podAffinity"), where), where, namespace, labels)
    anti = _obj(affinity.get("podAntiAffinity"), anti_where)
    required_anti, preferred_anti = _terms(anti, anti_where, namespace, labels)
    return PodAffinity(required, required_anti, preferred, preferred_anti)


# -- topology spread ----------------------------------------------------------------------------


def parse_spread(spec: Mapping[str, Any], labels: Mapping[str, str]) -> tuple[SpreadConstraint, ...]:
    """``spec.topologySpreadConstraints``."""
    out = []
    base = "spec.topologySpreadConstraints"
    for i, item in enumerate(_list(spec.get("topologySpreadConstraints"), base)):
        where = f"{base}[{i}]"
        c = _obj(item, where)
        key = c.get("topologyKey")
        if not isinstance(key, str) or not valid_label_key(key):
            raise SpecError(f"{where}.topologyKey must be a label key, got {key!r}")
        when = c.get("whenUnsatisfiable")
        if when not in (DO_NOT_SCHEDULE, SCHEDULE_ANYWAY):
            raise SpecError(f"{where}.whenUnsatisfiable must be {DO_NOT_SCHEDULE} or {SCHEDULE_ANYWAY}")
        max_skew = _int(c.get("maxSkew"), f"{where}.maxSkew", 1, INT32_MAX)
        min_domains = _int(c.get("minDomains"), f"{where}.minDomains", 1, INT32_MAX, default=1)
        if c.get("minDomains") is not None and when != DO_NOT_SCHEDULE:
            raise SpecError(f"{where}.minDomains may only be set with whenUnsatisfiable: {DO_NOT_SCHEDULE}")
        policies = []
        for field, default in (("nodeAffinityPolicy", HONOR), ("nodeTaintsPolicy", IGNORE)):
            value = c.get(field) or default
            if value not in (HONOR, IGNORE):
                raise SpecError(f"{where}.{field} must be {HONOR} or {IGNORE}, got {value!r}")
            policies.append(value == HONOR)
        try:
            selector = parse_label_selector(c.get("labelSelector"), f"{where}.labelSelector")
        except SelectorError as error:
            raise SpecError(str(error)) from None
        keys = _list(c.get("matchLabelKeys"), f"{where}.matchLabelKeys")
        if not all(isinstance(k, str) for k in keys):
            raise SpecError(f"{where}.matchLabelKeys must be a list of strings")
        selector = selector.merged(labels, keys)
        out.append(
            SpreadConstraint(
                max_skew, key, selector, when == DO_NOT_SCHEDULE, min_domains, policies[0], policies[1]
            )
        )
    return tuple(out)


# -- the whole pod ------------------------------------------------------------------------------


def _meta(pod: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any], str, dict[str, str]]:
    meta = _obj(pod.get("metadata"), "metadata")
    spec = _obj(pod.get("spec"), "spec")
    namespace = meta.get("namespace") or "default"
    labels = _obj(meta.get("labels"), "metadata.labels")
    return meta, spec, str(namespace), {str(k): str(v) for k, v in labels.items()}


def placement_rules(pod: Mapping[str, Any]) -> PlacementRules:
    """The placement rules of the pod being scheduled; raise ``SpecError``."""
    _meta_, spec, namespace, labels = _meta(pod)
    if not any(spec.get(k) is not None for k in RULE_FIELDS):
        return NO_RULES
    priority = _int(spec.get("priority"), "spec.priority", -(1 << 31), INT32_MAX, default=0)
    policy = spec.get("preemptionPolicy") or PREEMPT_LOWER
    if policy not in (PREEMPT_LOWER, PREEMPT_NEVER):
        raise SpecError(f"spec.preemptionPolicy must be {PREEMPT_LOWER} or {PREEMPT_NEVER}, got {policy!r}")
    return PlacementRules(
        parse_node_affinity(spec),
        parse_pod_affinity(spec, namespace, labels),
        parse_spread(spec, labels),
        priority,
        policy,
    )


def pod_facts(pod: Mapping[str, Any]) -> PodFacts:
    """What other pods' rules see of a placed pod; never raises on its spec (bad terms dropped)."""
    try:
        meta, spec, namespace, labels = _meta(pod)
    except SpecError:
        meta, spec, namespace, labels = {}, {}, "default", {}
    affinity_raw = spec.get("affinity") if isinstance(spec.get("affinity"), Mapping) else {}
    uid = str(meta.get("uid") or f"{namespace}/{meta.get('name', '')}")
    terminating = meta.get("deletionTimestamp") is not None
    if not affinity_raw.get("podAffinity") and not affinity_raw.get("podAntiAffinity"):
        return PodFacts(uid, namespace, labels, NO_POD_AFFINITY, terminating)
    parts: dict[str, Any] = {}
    for kind, field in (("pod", "podAffinity"), ("anti", "podAntiAffinity")):
        raw = affinity_raw.get(field)
        try:
            parts[kind] = _terms(_obj(raw, field), field, namespace, labels)
        except SpecError:
            parts[kind] = ((), ())
    affinity = PodAffinity(parts["pod"][0], parts["anti"][0], parts["pod"][1], parts["anti"][1])
    return PodFacts(uid, namespace, labels, affinity if affinity.any else NO_POD_AFFINITY, terminating)


def priority_of(pod: Mapping[str, Any]) -> int:
    """``spec.priority`` of a placed pod (0 when absent or unreadable)."""
    spec = pod.get("spec")
    value = spec.get("priority") if isinstance(spec, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
