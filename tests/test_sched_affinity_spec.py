"""Reading placement rules from a Pod's JSON: affinity, spread constraints, priority."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.affinity import NO_POD_AFFINITY
from scheduler.core.constraints import (
    NO_RULES,
    SpecError,
    parse_node_affinity,
    parse_pod_affinity,
    parse_spread,
    placement_rules,
    pod_facts,
    priority_of,
)
from scheduler.core.preempt import PREEMPT_LOWER, PREEMPT_NEVER
from scheduler.core.selectors import EVERYTHING, NOTHING


def pod(spec: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    metadata = {"name": "p", "namespace": "team", "uid": "u1", "labels": {"app": "web", "rev": "3"}}
    metadata.update(meta)
    return {"metadata": metadata, "spec": {"containers": [{"name": "c"}], **(spec or {})}}


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": op}
    if values:
        out["values"] = list(values)
    return out


def node_affinity(*terms: dict, preferred: list | None = None) -> dict[str, Any]:
    na: dict[str, Any] = {}
    if terms:
        na["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": list(terms)}
    if preferred is not None:
        na["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    return {"affinity": {"nodeAffinity": na}}


def test_no_rules() -> None:
    rules = placement_rules(pod())
    assert rules == NO_RULES and not rules.uses_pods
    assert rules.priority == 0 and rules.preemption_policy == PREEMPT_LOWER
    assert not rules.node_affinity.has_required


def test_required_node_affinity_from_the_issue() -> None:
    nowhere = placement_rules(
        pod(node_affinity({"matchExpressions": [expr("zone", "In", "does-not-exist")]}))
    )
    assert nowhere.node_affinity.has_required
    assert not nowhere.node_affinity.matches("n1", {"zone": "a"})
    not_a = placement_rules(pod(node_affinity({"matchExpressions": [expr("zone", "NotIn", "a")]})))
    assert not not_a.node_affinity.matches("n1", {"zone": "a"})
    assert not_a.node_affinity.matches("n2", {"zone": "b"}) and not_a.node_affinity.matches("n3", {})


def test_node_selector_joins_node_affinity() -> None:
    spec = {"nodeSelector": {"gpu": "h100"}, **node_affinity({"matchExpressions": [expr("zone", "In", "a")]})}
    na = placement_rules(pod(spec)).node_affinity
    assert na.node_selector == (("gpu", "h100"),)
    assert na.matches("n", {"gpu": "h100", "zone": "a"})
    assert not na.matches("n", {"gpu": "a100", "zone": "a"}) and not na.matches("n", {"gpu": "h100"})


def test_required_terms_that_do_not_parse_match_nothing() -> None:
    bad = {"matchExpressions": [expr("zone", "NotIn", "bad value!")]}
    good = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}
    na = placement_rules(pod(node_affinity(bad, good))).node_affinity
    assert not na.matches("n1", {"zone": "a"}) and na.matches("n2", {})
    assert na.required is not None and na.required.terms[0].error


def test_preferred_node_affinity() -> None:
    preferred = [
        {"weight": 30, "preference": {"matchExpressions": [expr("zone", "In", "a")]}},
        {"weight": 10, "preference": {}},  # empty: ignored
    ]
    na = placement_rules(pod(node_affinity(preferred=preferred))).node_affinity
    assert not na.has_required and len(na.preferred) == 1
    assert na.preferred_score("n", {"zone": "a"}) == 30 and na.preferred_score("n", {}) == 0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"nodeSelector": []}, "spec.nodeSelector must be an object"),
        ({"nodeSelector": {"a": 1}}, r"spec.nodeSelector\[a\] must be a string"),
        ({"affinity": []}, "spec.affinity must be an object"),
        (node_affinity(preferred=[{"weight": 0, "preference": {}}]), "weight must be an integer in 1..100"),
        (node_affinity(preferred=[{"weight": 101, "preference": {}}]), "1..100"),
        (node_affinity(preferred=[{"weight": True, "preference": {}}]), "1..100"),
        (
            node_affinity(
                preferred=[{"weight": 1, "preference": {"matchExpressions": [expr("k", "Gt", "x")]}}]
            ),
            "integer value",
        ),
        (
            {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}},
            "must be an object",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": {}}
                    }
                }
            },
            "nodeSelectorTerms must be a list",
        ),
    ],
)
def test_node_affinity_errors_name_the_field(spec: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_node_affinity(spec)


# -- pod affinity -------------------------------------------------------------------------------


def term(key: str = "zone", **extra: Any) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": key, **extra}


def pod_affinity(kind: str = "podAffinity", required=(), preferred=()) -> dict[str, Any]:
    return {
        "affinity": {
            kind: {
                "requiredDuringSchedulingIgnoredDuringExecution": list(required),
                "preferredDuringSchedulingIgnoredDuringExecution": list(preferred),
            }
        }
    }


def test_pod_affinity_terms() -> None:
    spec = pod_affinity(required=[term()], preferred=[{"weight": 7, "podAffinityTerm": term("host")}])
    spec["affinity"]["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [term("host")]}
    rules = placement_rules(pod(spec))
    pa = rules.pod_affinity
    assert rules.uses_pods and pa.has_required
    assert len(pa.required) == 1 and len(pa.required_anti) == 1 and not pa.preferred_anti
    assert pa.preferred[0].weight == 7 and pa.preferred[0].term.topology_key == "host"
    t = pa.required[0]
    assert (
        t.topology_key == "zone" and t.namespaces == frozenset({"team"}) and t.namespace_selector is NOTHING
    )
    assert t.matches("team", {"app": "db"}, None) and not t.matches("other", {"app": "db"}, None)


def test_term_namespaces_and_namespace_selector() -> None:
    listed = parse_pod_affinity(pod_affinity(required=[term(namespaces=["a", "b"])]), "team", {})
    assert listed.required[0].namespaces == frozenset({"a", "b"})
    every = parse_pod_affinity(pod_affinity(required=[term(namespaceSelector={})]), "team", {})
    assert every.required[0].namespaces == frozenset() and every.required[0].namespace_selector == EVERYTHING
    assert every.required[0].matches("anywhere", {"app": "db"}, {})
    chosen = parse_pod_affinity(
        pod_affinity(required=[term(namespaceSelector={"matchLabels": {"team": "ml"}})]), "team", {}
    )
    assert chosen.required[0].matches("x", {"app": "db"}, {"team": "ml"})
    assert not chosen.required[0].matches("team", {"app": "db"}, {"team": "web"})
    no_selector = parse_pod_affinity(pod_affinity(required=[{"topologyKey": "zone"}]), "team", {})
    assert not no_selector.required[0].matches("team", {"app": "db"}, None)  # nil selector: no pod


def test_match_and_mismatch_label_keys() -> None:
    labels = {"app": "web", "rev": "3"}
    spec = pod_affinity(required=[term(matchLabelKeys=["rev", "absent"])])
    t = parse_pod_affinity(spec, "team", labels).required[0]
    assert t.matches("team", {"app": "db", "rev": "3"}, None)
    assert not t.matches("team", {"app": "db", "rev": "4"}, None)
    assert not t.matches("team", {"app": "db"}, None)
    cache = {
        "labelSelector": {"matchLabels": {"tier": "cache"}},
        "topologyKey": "zone",
        "mismatchLabelKeys": ["app"],
    }
    anti = parse_pod_affinity(pod_affinity(required=[cache]), "team", labels).required[0]
    assert anti.matches("team", {"tier": "cache", "app": "api"}, None)
    assert anti.matches("team", {"tier": "cache"}, None)
    assert not anti.matches("team", {"tier": "cache", "app": "web"}, None)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (pod_affinity(required=[{"labelSelector": {}}]), "topologyKey must be a label key"),
        (pod_affinity(required=[term("bad key!")]), "topologyKey must be a label key"),
        (
            pod_affinity(required=["x"]),
            r"requiredDuringSchedulingIgnoredDuringExecution\[0\] must be an object",
        ),
        (pod_affinity(required=[term(namespaces="a")]), "namespaces must be a list"),
        (pod_affinity(required=[term(namespaces=[1])]), "namespaces must be a list of strings"),
        (pod_affinity(required=[term(matchLabelKeys=[1])]), "matchLabelKeys must be a list of strings"),
        (
            pod_affinity(
                required=[{"topologyKey": "z", "labelSelector": {"matchExpressions": [expr("a", "Gt", "1")]}}]
            ),
            "operator 'Gt'",
        ),
        (pod_affinity(required=[term(namespaceSelector=[])]), "namespaceSelector must be an object"),
        (
            pod_affinity("podAntiAffinity", preferred=[{"weight": 5}]),
            "podAffinityTerm must be an object|topologyKey",
        ),
        (pod_affinity("podAntiAffinity", preferred=[{"weight": 500, "podAffinityTerm": term()}]), "1..100"),
        ({"affinity": {"podAffinity": []}}, "spec.affinity.podAffinity must be an object"),
    ],
)
def test_pod_affinity_errors_name_the_field(spec: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        placement_rules(pod(spec))


# -- spread constraints -------------------------------------------------------------------------


def constraint(**kw: Any) -> dict[str, Any]:
    out = {
        "maxSkew": 1,
        "topologyKey": "zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}},
    }
    out.update(kw)
    return {k: v for k, v in out.items() if v is not None}


def test_spread_defaults_and_fields() -> None:
    (c,) = parse_spread({"topologySpreadConstraints": [constraint()]}, {})
    assert (c.max_skew, c.topology_key, c.hard, c.min_domains) == (1, "zone", True, 1)
    assert c.honor_node_affinity and not c.honor_taints
    assert c.selector.matches({"app": "web"}) and not c.selector.matches({"app": "db"})
    (soft,) = parse_spread(
        {
            "topologySpreadConstraints": [
                constraint(
                    whenUnsatisfiable="ScheduleAnyway",
                    maxSkew=3,
                    nodeAffinityPolicy="Ignore",
                    nodeTaintsPolicy="Honor",
                )
            ]
        },
        {},
    )
    assert not soft.hard and soft.max_skew == 3 and not soft.honor_node_affinity and soft.honor_taints
    (md,) = parse_spread({"topologySpreadConstraints": [constraint(minDomains=3)]}, {})
    assert md.min_domains == 3
    (keys,) = parse_spread({"topologySpreadConstraints": [constraint(matchLabelKeys=["rev"])]}, {"rev": "3"})
    assert keys.selector.matches({"app": "web", "rev": "3"}) and not keys.selector.matches(
        {"app": "web", "rev": "4"}
    )
    (nil,) = parse_spread({"topologySpreadConstraints": [constraint(labelSelector=None)]}, {})
    assert nil.selector is NOTHING


@pytest.mark.parametrize(
    ("c", "message"),
    [
        (constraint(maxSkew=0), "maxSkew must be an integer"),
        (constraint(maxSkew="1"), "maxSkew must be an integer"),
        (constraint(topologyKey=""), "topologyKey must be a label key"),
        (constraint(whenUnsatisfiable="Sometimes"), "whenUnsatisfiable must be"),
        (constraint(minDomains=0), "minDomains must be an integer"),
        (constraint(whenUnsatisfiable="ScheduleAnyway", minDomains=2), "minDomains may only be set"),
        (constraint(nodeAffinityPolicy="Maybe"), "nodeAffinityPolicy must be Honor or Ignore"),
        (constraint(nodeTaintsPolicy="x"), "nodeTaintsPolicy must be Honor or Ignore"),
        (constraint(labelSelector={"matchLabels": {"a": "b c"}}), "invalid label value"),
        (constraint(matchLabelKeys="rev"), "matchLabelKeys must be a list"),
        ("x", r"topologySpreadConstraints\[0\] must be an object"),
    ],
)
def test_spread_errors_name_the_field(c: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        placement_rules(pod({"topologySpreadConstraints": [c]}))


# -- priority, and placed pods ------------------------------------------------------------------


def test_priority_and_preemption_policy() -> None:
    rules = placement_rules(pod({"priority": 1000, "preemptionPolicy": "Never"}))
    assert rules.priority == 1000 and rules.preemption_policy == PREEMPT_NEVER
    assert placement_rules(pod({"priority": -5})).priority == -5
    for bad, message in (
        ({"priority": "high"}, "spec.priority must be an integer"),
        ({"priority": 1 << 40}, "spec.priority"),
        ({"preemptionPolicy": "Sometimes"}, "spec.preemptionPolicy must be"),
    ):
        with pytest.raises(SpecError, match=message):
            placement_rules(pod(bad))
    assert priority_of(pod({"priority": 7})) == 7
    assert (
        priority_of(pod({"priority": "x"})) == 0 and priority_of({}) == 0 and priority_of({"spec": []}) == 0
    )


def test_metadata_errors() -> None:
    with pytest.raises(SpecError, match="metadata.labels must be an object"):
        placement_rules(pod(labels=["a"]))
    with pytest.raises(SpecError, match="spec must be an object"):
        placement_rules({"metadata": {}, "spec": "x"})


def test_pod_facts_of_placed_pods() -> None:
    spec = pod_affinity("podAntiAffinity", required=[term("host")])
    facts = pod_facts(pod(spec))
    assert facts.uid == "u1" and facts.namespace == "team" and facts.labels == {"app": "web", "rev": "3"}
    assert len(facts.affinity.required_anti) == 1 and not facts.terminating
    assert pod_facts(pod(deletionTimestamp="2024-01-01T00:00:00Z")).terminating
    assert pod_facts(pod()).affinity is NO_POD_AFFINITY
    # bad terms of a placed pod are dropped, never an error
    broken = pod_affinity("podAntiAffinity", required=[{"topologyKey": "bad key!"}])
    broken["affinity"]["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [term()]}
    facts = pod_facts(pod(broken))
    assert not facts.affinity.required_anti and len(facts.affinity.required) == 1
    assert pod_facts({"metadata": "x", "spec": 5}).uid == "default/"
    assert pod_facts({"metadata": {"name": "n"}}).uid == "default/n"
    assert pod_facts(pod({"affinity": "nonsense"})).affinity is NO_POD_AFFINITY


def test_placed_pods_keep_every_kind_of_term() -> None:
    preferred_only = pod_affinity(preferred=[{"weight": 3, "podAffinityTerm": term("host")}])
    facts = pod_facts(pod(preferred_only))
    assert [w.weight for w in facts.affinity.preferred] == [3] and not facts.affinity.required
    anti_only = pod_affinity("podAntiAffinity", preferred=[{"weight": 4, "podAffinityTerm": term()}])
    facts = pod_facts(pod(anti_only))
    assert [w.weight for w in facts.affinity.preferred_anti] == [4] and not facts.affinity.preferred
    assert facts.affinity.preferred_anti[0].term.namespaces == frozenset({"team"})
    assert facts.affinity.preferred_anti[0].term.selector.matches({"app": "db"})
    assert facts.terminating is False and pod_facts(pod()).terminating is False


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"affinity": {"nodeAffinity": []}},
            "spec.affinity.nodeAffinity must be an object",
        ),
        (
            {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"}}},
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution must be an object",
        ),
        (
            {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": {}}}},
            "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution must be a list",
        ),
        (
            {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": ["x"]}}},
            r"spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution\[0\]"
            r" must be an object",
        ),
        (
            node_affinity(preferred=[{"weight": 0, "preference": {}}]),
            r"spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution\[0\].weight must be",
        ),
        (
            node_affinity(
                preferred=[{"weight": 1, "preference": {"matchExpressions": [expr("k", "Gt", "x")]}}]
            ),
            r"^spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution\[0\].preference"
            r".matchExpressions\[0\]: k Gt: needs exactly one integer value",
        ),
    ],
)
def test_node_affinity_messages_give_the_full_path(spec: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_node_affinity(spec)


def test_a_required_term_that_does_not_parse_names_its_path() -> None:
    na = parse_node_affinity(node_affinity({"matchExpressions": [expr("k", "Gt", "x")]}))
    assert na.required is not None
    assert na.required.terms[0].error.startswith(
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
        ".matchExpressions[0]: k Gt"
    )
