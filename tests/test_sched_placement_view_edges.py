"""PlacementView's filter and score passes hand the pod's whole context to each plugin: the nodes its
node affinity and tolerations allow (spread's inclusion policies), its own uid (never counted),
the pods preemption leaves out, and the rules of the next plugin after spread."""

from __future__ import annotations

import numpy as np

from scheduler.core.affinity import (
    NO_POD_AFFINITY,
    NodeAffinity,
    PodAffinity,
    PodAffinityTerm,
    PodFacts,
    WeightedPodAffinityTerm,
)
from scheduler.core.constraints import PlacementRules
from scheduler.core.placement import (
    ANTI_AFFINITY,
    PASS,
    SPREAD_MISSING_LABEL,
    SPREAD_SKEW,
    PlacementView,
    PodPlacement,
)
from scheduler.core.request import Taint, TaintEffect
from scheduler.core.selectors import NodeSelector, NodeSelectorTerm, Op, Requirement, parse_label_selector
from scheduler.core.spread import SpreadConstraint

ZONE, HOST = "zone", "kubernetes.io/hostname"
WEB = parse_label_selector({"matchLabels": {"app": "web"}})


def view() -> PlacementView:
    """n0, n1: zone a; n2: zone b; n3: zone c, tainted NoSchedule; n4: no zone."""
    names = ["n0", "n1", "n2", "n3", "n4"]
    labels = [
        {ZONE: z, HOST: n} if z else {HOST: n} for n, z in zip(names, ["a", "a", "b", "c", None], strict=True)
    ]
    taints = [(), (), (), (Taint("dedicated", "x", TaintEffect.NO_SCHEDULE),), ()]
    return PlacementView(names, labels, taints)


def web(uid: str, affinity: PodAffinity = NO_POD_AFFINITY) -> PodFacts:
    return PodFacts(uid, "default", {"app": "web"}, affinity)


def not_on(*hosts: str) -> NodeAffinity:
    return NodeAffinity(
        required=NodeSelector((NodeSelectorTerm((Requirement(HOST, Op.NOT_IN, frozenset(hosts)),)),))
    )


def term(key: str, **labels: str) -> PodAffinityTerm:
    return PodAffinityTerm(parse_label_selector({"matchLabels": labels}), key, frozenset({"default"}))


# -- filter ---------------------------------------------------------------------------------------


def test_hard_spread_counts_only_domains_of_nodes_the_pod_may_use() -> None:
    """nodeAffinityPolicy Honor (the default): zones b and c lie outside the pod's node affinity, so
    the minimum is zone a's count and a second web pod may join zone a."""
    v = view()
    v.place(web("w1"), "n0")
    only_a = NodeAffinity(node_selector=((ZONE, "a"),))
    pod = PodPlacement(
        web("new"), PlacementRules(node_affinity=only_a, spread=(SpreadConstraint(1, ZONE, WEB),))
    )
    assert v.filter(pod, np.array([0, 1])).tolist() == [PASS, PASS]
    assert v.filter(pod, np.array([0, 1]), node_affinity=False).tolist() == [PASS, PASS]


def test_hard_spread_with_taints_policy_honor_leaves_untolerated_nodes_out() -> None:
    """nodeTaintsPolicy Honor: zone c (only the tainted n3) is no domain for a pod not tolerating
    it, so zones a and b (one web pod each) set the minimum to 1."""
    v = view()
    v.place(web("w1"), "n0")
    v.place(web("w2"), "n2")
    honor = SpreadConstraint(1, ZONE, WEB, honor_taints=True)
    pod = PodPlacement(web("new"), PlacementRules(spread=(honor,)))
    assert v.filter(pod, np.array([1, 2, 4])).tolist() == [PASS, PASS, SPREAD_MISSING_LABEL]
    ignore = PodPlacement(web("new"), PlacementRules(spread=(SpreadConstraint(1, ZONE, WEB),)))
    assert v.filter(ignore, np.array([1, 2])).tolist() == [SPREAD_SKEW, SPREAD_SKEW]


def test_the_incoming_pod_never_counts_against_its_own_spread() -> None:
    v = view()
    v.place(web("me"), "n0")  # the pod itself, already known to the view (assumed, being bound)
    pod = PodPlacement(web("me"), PlacementRules(spread=(SpreadConstraint(1, ZONE, WEB),)))
    assert v.filter(pod, np.arange(3)).tolist() == [PASS, PASS, PASS]
    other = PodPlacement(web("other"), PlacementRules(spread=(SpreadConstraint(1, ZONE, WEB),)))
    assert v.filter(other, np.arange(3)).tolist() == [SPREAD_SKEW, SPREAD_SKEW, PASS]


def test_excluded_pods_count_for_neither_spread_nor_anti_affinity() -> None:
    """Preemption asks how the nodes look without its victims."""
    v = view()
    v.place(web("victim"), "n0")
    spread = PodPlacement(web("new"), PlacementRules(spread=(SpreadConstraint(1, ZONE, WEB),)))
    assert v.filter(spread, np.arange(3)).tolist() == [SPREAD_SKEW, SPREAD_SKEW, PASS]
    assert v.filter(spread, np.arange(3), exclude={"victim"}).tolist() == [PASS, PASS, PASS]
    anti = PodPlacement(web("new", PodAffinity(required_anti=(term(HOST, app="web"),))))
    assert v.filter(anti, np.arange(3)).tolist() == [ANTI_AFFINITY, PASS, PASS]
    assert v.filter(anti, np.arange(3), exclude={"victim"}).tolist() == [PASS, PASS, PASS]


def test_nodes_passing_spread_still_face_pod_anti_affinity() -> None:
    v = view()
    v.place(web("w1"), "n1")
    rules = PlacementRules(spread=(SpreadConstraint(2, ZONE, WEB),))
    pod = PodPlacement(web("new", PodAffinity(required_anti=(term(HOST, app="web"),))), rules)
    assert v.filter(pod, np.array([0, 1, 2, 4])).tolist() == [PASS, ANTI_AFFINITY, PASS, SPREAD_MISSING_LABEL]


# -- score ----------------------------------------------------------------------------------------


def test_soft_spread_scores_honour_node_affinity_taints_uid_and_exclusions() -> None:
    """A web pod on n1 makes zone a less attractive, unless n1 is a node the incoming pod may not
    use (node affinity, Honor), the pod is the incoming one itself, or it is left out."""
    soft = SpreadConstraint(1, ZONE, WEB, hard=False)
    idx = np.array([0, 2])  # n0 (zone a) and n2 (zone b) feasible
    v = view()
    v.place(web("w1"), "n1")
    plain = PodPlacement(web("new"), PlacementRules(spread=(soft,)))
    s = v.scores(plain, idx).tolist()
    assert s[0] < s[1]
    avoid_n1 = PodPlacement(web("new"), PlacementRules(node_affinity=not_on("n1"), spread=(soft,)))
    assert v.scores(avoid_n1, idx).tolist() == [200, 200]
    assert v.scores(plain, idx, exclude={"w1"}).tolist() == [200, 200]
    me = PodPlacement(web("w1"), PlacementRules(spread=(soft,)))
    assert v.scores(me, idx).tolist() == [200, 200]


def test_soft_spread_scores_with_taints_policy_honor() -> None:
    """Zone c has the tainted n3 (holding a web pod) and an untainted n5. For a pod that does not
    tolerate the taint, nodeTaintsPolicy Honor leaves n3's pod out: zone c scores like the empty
    zone b; with Ignore (the default) it counts and zone c scores lower."""
    v = PlacementView(
        ["n2", "n3", "n5"],
        [{ZONE: "b", HOST: "n2"}, {ZONE: "c", HOST: "n3"}, {ZONE: "c", HOST: "n5"}],
        [(), (Taint("dedicated", "x", TaintEffect.NO_SCHEDULE),), ()],
    )
    v.place(web("w1"), "n3")
    idx = np.array([0, 2])
    honor = SpreadConstraint(1, ZONE, WEB, hard=False, honor_taints=True)
    assert v.scores(PodPlacement(web("new"), PlacementRules(spread=(honor,))), idx).tolist() == [200, 200]
    ignore = SpreadConstraint(1, ZONE, WEB, hard=False)
    s = v.scores(PodPlacement(web("new"), PlacementRules(spread=(ignore,))), idx).tolist()
    assert s[0] > s[1]


def test_preferred_anti_affinity_alone_is_scored() -> None:
    v = view()
    v.place(PodFacts("db", "default", {"app": "db"}), "n0")
    shy = PodPlacement(
        web("new", PodAffinity(preferred_anti=(WeightedPodAffinityTerm(10, term(ZONE, app="db")),)))
    )
    assert v.scores_apply(shy)
    assert v.scores(shy, np.arange(3)).tolist() == [0, 0, 200]
    assert v.scores(shy, np.arange(3), exclude={"db"}).tolist() == [0, 0, 0]


def test_scores_apply_whenever_some_rule_can_score() -> None:
    v = view()
    likes = PodPlacement(
        web("new", PodAffinity(preferred=(WeightedPodAffinityTerm(1, term(ZONE, app="db")),)))
    )
    assert v.scores_apply(likes)  # the pod's own preference, no placed pod has any
    plain = PodPlacement(web("plain"))
    hard_spread = PodPlacement(web("h"), PlacementRules(spread=(SpreadConstraint(1, ZONE, WEB),)))
    assert not v.scores_apply(plain) and not v.scores_apply(hard_spread)
    # a placed pod preferring web pods makes every web pod's scores matter
    v.place(
        PodFacts(
            "fan", "default", {}, PodAffinity(preferred=(WeightedPodAffinityTerm(5, term(HOST, app="web")),))
        ),
        "n2",
    )
    assert v.scores_apply(plain) and v.scores_apply(hard_spread)
    assert v.scores(plain, np.arange(3)).tolist() == [0, 0, 200]


def test_filters_apply_for_the_pods_own_required_terms_whatever_its_other_rules() -> None:
    v = view()  # no placed pod has any rule
    anti = PodAffinity(required_anti=(term(HOST, app="web"),))
    assert v.filters_apply(PodPlacement(web("new", anti)))
    assert v.filters_apply(PodPlacement(web("new", anti), PlacementRules(priority=5)))
    assert not v.filters_apply(PodPlacement(web("new"), PlacementRules(priority=5)))
    v.place(web("loner", anti), "n2")  # now a placed pod's anti-affinity may reject any pod
    assert v.filters_apply(PodPlacement(web("new"), PlacementRules(priority=5)))


def test_placement_of_keeps_the_tolerations_and_a_view_counts_its_cluster_rows() -> None:
    from scheduler.core.placement import placement_of
    from scheduler.core.request import Toleration

    tolerate = (Toleration("dedicated", "Exists"),)
    doc = {"metadata": {"name": "p", "namespace": "ml", "uid": "u"}, "spec": {"priority": 1}}
    assert placement_of(doc, tolerate).tolerations == tolerate
    assert view().n_cluster == 5


def test_default_normalize_of_a_best_score_of_one() -> None:
    from scheduler.core.affinity import default_normalize

    assert default_normalize(np.array([0, 1, 1])).tolist() == [0, 100, 100]
