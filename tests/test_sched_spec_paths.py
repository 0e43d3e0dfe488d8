"""Placement rules read from a Pod's JSON: every error names the full path of the bad field (the
Event a user reads must point at it), bounds are inclusive, and each kind of rule reaches the
rules (matchLabelKeys taking the pod's own labels wherever a term can carry them)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from scheduler.core.constraints import (
    NO_RULES,
    SpecError,
    parse_pod_affinity,
    placement_rules,
    pod_facts,
)
from scheduler.core.selectors import (
    EVERYTHING,
    LABEL_OPS,
    Op,
    Requirement,
    SelectorError,
    parse_label_selector,
    parse_node_selector_term,
    valid_label_key,
)

REQ = "requiredDuringSchedulingIgnoredDuringExecution"
PREF = "preferredDuringSchedulingIgnoredDuringExecution"
PA, PAA = "spec.affinity.podAffinity", "spec.affinity.podAntiAffinity"
TSC = "spec.topologySpreadConstraints"


def pod(spec: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    metadata = {"name": "p", "namespace": "team", "uid": "u1", "labels": {"app": "web", "rev": "3"}}
    metadata.update(meta)
    return {"metadata": metadata, "spec": {"containers": [{"name": "c"}], **(spec or {})}}


def term(**extra: Any) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone", **extra}


def spread(**kw: Any) -> dict[str, Any]:
    out = {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {}}
    out.update(kw)
    return out


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"affinity": {"podAntiAffinity": 5}}, f"{PAA} must be an object"),
        ({"affinity": {"podAntiAffinity": {REQ: "x"}}}, f"{PAA}.{REQ} must be a list"),
        ({"affinity": {"podAffinity": {REQ: "x"}}}, f"{PA}.{REQ} must be a list"),
        ({"affinity": {"podAffinity": {PREF: 5}}}, f"{PA}.{PREF} must be a list"),
        ({"affinity": {"podAntiAffinity": {PREF: 5}}}, f"{PAA}.{PREF} must be a list"),
        ({"affinity": {"podAffinity": {PREF: [5]}}}, f"{PA}.{PREF}[0] must be an object"),
        (
            {"affinity": {"podAffinity": {PREF: [{"weight": 0, "podAffinityTerm": term()}]}}},
            f"{PA}.{PREF}[0].weight must be an integer in 1..100, got 0",
        ),
        (
            {
                "affinity": {
                    "podAntiAffinity": {PREF: [{"weight": 1, "podAffinityTerm": term(topologyKey="")}]}
                }
            },
            f"{PAA}.{PREF}[0].podAffinityTerm.topologyKey must be a label key",
        ),
        (
            {"affinity": {"podAffinity": {REQ: [term(labelSelector=5)]}}},
            f"{PA}.{REQ}[0].labelSelector must be an object",
        ),
        (
            {"affinity": {"podAffinity": {REQ: [term(matchLabelKeys="rev")]}}},
            f"{PA}.{REQ}[0].matchLabelKeys must be a list",
        ),
        ({"topologySpreadConstraints": 5}, f"{TSC} must be a list"),
        (
            {"topologySpreadConstraints": [spread(labelSelector=5)]},
            f"{TSC}[0].labelSelector must be an object",
        ),
        (
            {"topologySpreadConstraints": [spread(matchLabelKeys=[1])]},
            f"{TSC}[0].matchLabelKeys must be a list of strings",
        ),
        ({"priority": -(1 << 31) - 1}, "spec.priority must be an integer in -2147483648..2147483647"),
        ({"priority": 1 << 31}, "spec.priority must be an integer in -2147483648..2147483647"),
    ],
)
def test_errors_give_the_full_path(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match="^" + re.escape(message)):
        placement_rules(pod(spec))


def test_metadata_and_affinity_that_are_not_objects() -> None:
    with pytest.raises(SpecError, match="^metadata must be an object$"):
        placement_rules({"metadata": "x", "spec": {"priority": 1}})
    with pytest.raises(SpecError, match="^spec.affinity must be an object$"):
        parse_pod_affinity({"affinity": 5}, "team", {})


def test_bounds_are_inclusive() -> None:
    assert placement_rules(pod({"priority": (1 << 31) - 1})).priority == (1 << 31) - 1
    assert placement_rules(pod({"priority": -(1 << 31)})).priority == -(1 << 31)
    assert placement_rules(pod({"nodeSelector": {"a": "b"}})).priority == 0  # absent: 0
    (c,) = placement_rules(pod({"topologySpreadConstraints": [spread(minDomains=1)]})).spread
    assert c.min_domains == 1


def test_a_pod_setting_every_rule_field_keeps_them_all() -> None:
    spec = {
        "nodeSelector": {"disk": "ssd"},
        "affinity": {"podAntiAffinity": {REQ: [term()]}},
        "topologySpreadConstraints": [spread()],
        "priority": 5,
        "preemptionPolicy": "Never",
    }
    rules = placement_rules(pod(spec))
    assert rules is not NO_RULES
    assert rules.node_affinity.node_selector == (("disk", "ssd"),)
    assert len(rules.pod_affinity.required_anti) == 1 and len(rules.spread) == 1
    assert rules.priority == 5 and rules.preemption_policy == "Never"
    assert placement_rules(pod()) is NO_RULES


def test_match_label_keys_take_the_pods_own_labels_in_every_kind_of_term() -> None:
    """matchLabelKeys ["rev"] adds ``rev In [3]`` (the pod's label) to the selector, in required and
    preferred affinity and anti-affinity terms, in spread constraints, and in placed pods' terms."""
    keyed = term(matchLabelKeys=["rev"])
    spec = {
        "affinity": {
            "podAffinity": {REQ: [keyed], PREF: [{"weight": 2, "podAffinityTerm": keyed}]},
            "podAntiAffinity": {REQ: [keyed], PREF: [{"weight": 3, "podAffinityTerm": keyed}]},
        },
        "topologySpreadConstraints": [
            spread(labelSelector={"matchLabels": {"app": "db"}}, matchLabelKeys=["rev"])
        ],
    }
    rules = placement_rules(pod(spec))
    pa = rules.pod_affinity
    terms = [pa.required[0], pa.preferred[0].term, pa.required_anti[0], pa.preferred_anti[0].term]
    assert [w.weight for w in pa.preferred] == [2] and [w.weight for w in pa.preferred_anti] == [3]
    for t in terms:
        assert t.matches("team", {"app": "db", "rev": "3"}, None)
        assert not t.matches("team", {"app": "db", "rev": "4"}, None)
    selector = rules.spread[0].selector
    assert selector.matches({"app": "db", "rev": "3"}) and not selector.matches({"app": "db", "rev": "4"})
    facts = pod_facts(pod(spec, deletionTimestamp="2026-01-01T00:00:00Z"))
    assert facts.terminating
    assert facts.affinity.required_anti[0].matches("team", {"app": "db", "rev": "3"}, None)
    assert not facts.affinity.required_anti[0].matches("team", {"app": "db", "rev": "4"}, None)
    assert not facts.affinity.preferred[0].term.matches("team", {"app": "db", "rev": "4"}, None)


# -- selectors ------------------------------------------------------------------------------------


def test_label_key_prefix_may_be_a_full_dns_subdomain() -> None:
    label = "a" * 63
    prefix = ".".join([label, label, label, "b" * 61])  # 253 characters
    assert len(prefix) == 253 and valid_label_key(f"{prefix}/name")
    assert not valid_label_key(f"{prefix}b/name")


def test_selector_errors_name_the_allowed_operators_and_the_term() -> None:
    with pytest.raises(
        SelectorError, match=r"^k: operator 'Gt' is not one of DoesNotExist, Exists, In, NotIn$"
    ):
        Requirement.parse("k", "Gt", ["1"], LABEL_OPS)
    with pytest.raises(SelectorError, match="^nodeSelectorTerm must be an object$"):
        parse_node_selector_term("x")
    with pytest.raises(SelectorError, match="^nodeSelectorTerm.matchFields must be a list$"):
        parse_node_selector_term({"matchFields": "metadata.name"})


def test_exists_without_values_parses_and_requirements_are_canonical() -> None:
    selector = parse_label_selector({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]})
    assert selector.matches({"gpu": "x"}) and not selector.matches({})
    term = parse_node_selector_term({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]})
    assert term.matches("n", {}) and not term.matches("n", {"gpu": "x"})
    # a parsed requirement equals the one matchLabelKeys builds (replicas' terms compare equal)
    assert Requirement.parse("rev", "In", ["3"]) == Requirement("rev", Op.IN, frozenset({"3"}))
    assert parse_label_selector({"matchLabels": {"rev": "3"}}) == EVERYTHING.merged({"rev": "3"}, ["rev"])
