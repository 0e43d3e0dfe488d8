"""PlacementView: the three placement plugins together, in kube-scheduler's order and weights."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core.affinity import (
    NodeAffinity,
    PodAffinity,
    PodAffinityTerm,
    PodFacts,
    WeightedPodAffinityTerm,
    interpod_scores,
    node_affinity_scores,
)
from scheduler.core.constraints import PlacementRules, placement_rules, pod_facts
from scheduler.core.placement import (
    AFFINITY,
    ANTI_AFFINITY,
    EXISTING_ANTI_AFFINITY,
    NODE_AFFINITY,
    PASS,
    REASONS,
    SPREAD_MISSING_LABEL,
    SPREAD_SKEW,
    UNRESOLVABLE,
    PlacementView,
    PodPlacement,
    untolerated,
)
from scheduler.core.request import Taint, TaintEffect, Toleration
from scheduler.core.selectors import NodeSelector, NodeSelectorTerm, Op, Requirement, parse_label_selector
from scheduler.core.spread import SpreadConstraint, spread_scores

ZONE, HOST = "zone", "kubernetes.io/hostname"
WEB = parse_label_selector({"matchLabels": {"app": "web"}})


def view(extra: bool = False) -> PlacementView:
    """n0, n1 in zone a; n2 in zone b; n3 unlabelled (tainted); with ``extra``, row 4 is a node of
    zone b kubegpu does not schedule on."""
    names = ["n0", "n1", "n2", "n3"]
    labels = [{ZONE: "a", HOST: "n0"}, {ZONE: "a", HOST: "n1"}, {ZONE: "b", HOST: "n2"}, {HOST: "n3"}]
    taints = [(), (), (), (Taint("gpu", "x", TaintEffect.NO_SCHEDULE),)]
    if extra:
        names.append("other")
        labels.append({ZONE: "b", HOST: "other"})
        taints.append(())
    return PlacementView(names, labels, taints, n_cluster=4)


def web_pod(uid: str = "w", **kw) -> PodFacts:
    return PodFacts(uid, "default", {"app": "web"}, **kw)


ALL = np.arange(4)


def term(key: str, **labels: str) -> PodAffinityTerm:
    return PodAffinityTerm(parse_label_selector({"matchLabels": labels}), key, frozenset({"default"}))


def test_nothing_to_do_for_plain_pods() -> None:
    v = view()
    plain = PodPlacement(web_pod())
    assert not v.filters_apply(plain) and not v.scores_apply(plain)
    assert v.filter(plain, ALL).tolist() == [PASS] * 4
    assert v.scores(plain, ALL).tolist() == [0, 0, 0, 0]


def test_filter_codes_in_plugin_order() -> None:
    v = view()
    v.place(web_pod("w1"), "n2")
    rules = PlacementRules(
        node_affinity=NodeAffinity(
            required=NodeSelector((NodeSelectorTerm((Requirement(HOST, Op.NOT_IN, frozenset({"n0"})),)),))
        ),
        spread=(SpreadConstraint(1, ZONE, WEB),),
    )
    anti = PodAffinity(required_anti=(term(HOST, app="web"),))
    pod = PodPlacement(web_pod(affinity=anti), rules)
    assert v.filters_apply(pod)
    # n0: node affinity; n1: passes (zone a 0 + 1 - 0); n2: zone b has w1 -> skew 1 + 1 - 0 = 2;
    # n3: no zone
    assert v.filter(pod, ALL).tolist() == [NODE_AFFINITY, PASS, SPREAD_SKEW, SPREAD_MISSING_LABEL]
    # without the spread rule, n2 fails the anti-affinity (w1 is there)
    pod2 = PodPlacement(web_pod(affinity=anti), PlacementRules(node_affinity=rules.node_affinity))
    assert v.filter(pod2, ALL).tolist() == [NODE_AFFINITY, PASS, ANTI_AFFINITY, PASS]
    assert v.filter(pod2, np.array([2, 3])).tolist() == [ANTI_AFFINITY, PASS]


def test_existing_anti_affinity_and_required_affinity_codes() -> None:
    v = view()
    loner = PodAffinity(required_anti=(term(ZONE, app="web"),))
    assert v.place(PodFacts("db", "default", {"app": "db"}, loner), "n0")
    pod = PodPlacement(web_pod())
    assert v.filters_apply(pod)  # a placed pod has required anti-affinity
    assert v.filter(pod, ALL).tolist() == [EXISTING_ANTI_AFFINITY, EXISTING_ANTI_AFFINITY, PASS, PASS]
    follow = PodPlacement(web_pod(affinity=PodAffinity(required=(term(ZONE, app="db"),))))
    assert v.filter(follow, ALL).tolist() == [
        EXISTING_ANTI_AFFINITY,
        EXISTING_ANTI_AFFINITY,
        AFFINITY,
        AFFINITY,
    ]
    v.remove("db")
    assert not v.filters_apply(pod)


def test_reasons_and_unresolvable() -> None:
    assert REASONS[NODE_AFFINITY] == "node(s) didn't match Pod's node affinity/selector"
    assert REASONS[SPREAD_SKEW] == "node(s) didn't match pod topology spread constraints"
    assert REASONS[SPREAD_MISSING_LABEL].endswith("(missing required label)")
    assert REASONS[AFFINITY] == "node(s) didn't match pod affinity rules"
    assert REASONS[ANTI_AFFINITY] == "node(s) didn't match pod anti-affinity rules"
    assert REASONS[EXISTING_ANTI_AFFINITY] == "node(s) didn't satisfy existing pods anti-affinity rules"
    assert UNRESOLVABLE == {NODE_AFFINITY, SPREAD_MISSING_LABEL, AFFINITY}


def test_pods_on_nodes_outside_the_cluster_still_count() -> None:
    v = view(extra=True)
    assert v.place(web_pod("w1"), "other")  # zone b, but not a cluster node
    assert not v.place(web_pod("w2"), "nowhere")  # an unknown node: counts nowhere
    anti = PodPlacement(web_pod(affinity=PodAffinity(required_anti=(term(ZONE, app="web"),))))
    assert v.filter(anti, ALL).tolist() == [PASS, PASS, ANTI_AFFINITY, PASS]
    spread = PodPlacement(web_pod(), PlacementRules(spread=(SpreadConstraint(1, ZONE, WEB),)))
    assert v.filter(spread, ALL).tolist() == [PASS, PASS, SPREAD_SKEW, SPREAD_MISSING_LABEL]


def test_taints_policy_uses_the_pods_tolerations() -> None:
    v = view()
    assert v.taints_mask(()).tolist() == [True, True, True, False]
    tolerate = (Toleration("gpu", "Exists"),)
    assert v.taints_mask(tolerate).tolist() == [True] * 4
    assert v.taints_mask(()) is v.taints_mask(())  # memoised
    assert untolerated([Taint("a", "", TaintEffect.NO_EXECUTE)], [])
    assert not untolerated([Taint("a", "", TaintEffect.PREFER_NO_SCHEDULE)], [])


def test_node_affinity_mask_is_memoised_per_rule() -> None:
    v = view()
    na = NodeAffinity(node_selector=((ZONE, "a"),))
    mask = v.node_affinity_mask(na)
    assert mask.tolist() == [True, True, False, False] and v.node_affinity_mask(na) is mask
    assert v.node_affinity_mask(NodeAffinity()).all()


def test_scores_are_the_weighted_sum_of_the_three_plugins() -> None:
    v = view()
    v.place(web_pod("w1"), "n0")
    v.place(PodFacts("db", "default", {"app": "db"}), "n2")
    rules = PlacementRules(
        node_affinity=NodeAffinity(
            preferred=((10, NodeSelectorTerm((Requirement(ZONE, Op.IN, frozenset({"b"})),))),)
        ),
        spread=(SpreadConstraint(1, ZONE, WEB, hard=False),),
    )
    affinity = PodAffinity(preferred=(WeightedPodAffinityTerm(50, term(HOST, app="db")),))
    pod = PodPlacement(web_pod(affinity=affinity), rules)
    assert v.scores_apply(pod)
    idx = np.array([0, 1, 2])
    na = node_affinity_scores(rules.node_affinity, v.domains.names, v.domains.labels, idx)
    sp = spread_scores("default", rules.spread, v.index, v.domains, idx)
    ip = interpod_scores(pod.facts, v.index, v.domains, {}, idx)
    assert na.tolist() == [0, 0, 100] and ip.tolist() == [0, 0, 100]
    assert sp.tolist() == [0, 0, 100]
    assert v.scores(pod, idx).tolist() == (2 * (na + sp + ip)).tolist() == [0, 0, 600]


def test_unknown_namespaces_have_their_name_label() -> None:
    v = view()
    labels = v.ns_labels()
    assert labels.get("ghost") == {"kubernetes.io/metadata.name": "ghost"}
    v.namespace_labels["team"] = {"kubernetes.io/metadata.name": "team", "tier": "gold"}
    assert labels["team"]["tier"] == "gold" and len(labels) == 1 and list(labels) == ["team"]
    by_name = PodAffinityTerm(
        parse_label_selector({"matchLabels": {"app": "db"}}),
        ZONE,
        frozenset(),
        parse_label_selector({"matchLabels": {"kubernetes.io/metadata.name": "ghost"}}),
    )
    v.place(PodFacts("db", "ghost", {"app": "db"}), "n2")
    pod = PodPlacement(web_pod(affinity=PodAffinity(required=(by_name,))))
    assert v.filter(pod, ALL).tolist() == [AFFINITY, AFFINITY, PASS, AFFINITY]


def test_from_pod_json() -> None:
    """The parse functions feed the view: required node affinity and anti-affinity by host."""
    v = view()
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": ZONE, "operator": "NotIn", "values": ["b"]}]}
                    ]
                }
            },
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": HOST}
                ]
            },
        }
    }
    pod_json = {
        "metadata": {"name": "w", "namespace": "default", "uid": "w", "labels": {"app": "web"}},
        "spec": spec,
    }
    other = dict(pod_json, metadata={**pod_json["metadata"], "uid": "w0", "name": "w0"})
    v.place(pod_facts(other), "n0")
    placement = PodPlacement(pod_facts(pod_json), placement_rules(pod_json))
    assert v.filter(placement, ALL).tolist() == [ANTI_AFFINITY, PASS, NODE_AFFINITY, PASS]


def test_view_shapes() -> None:
    v = view(extra=True)
    assert len(v) == 5 and v.n_cluster == 4 and v.row["other"] == 4
    with pytest.raises(ValueError):
        PlacementView(["a"], [{}], [(), ()])
