"""Node affinity by node name, pod affinity bookkeeping and selector lookups at their edges:
kube-scheduler's NodeAffinity and InterPodAffinity semantics where several pods, terms or values
meet (two replicas on one node, a selector with several values, terms on several keys)."""

from __future__ import annotations

import numpy as np

from scheduler.core import ClusterState, GpuState, NodeState, PodRequest
from scheduler.core.affinity import (
    FAIL_ANTI_AFFINITY,
    FAIL_EXISTING_ANTI_AFFINITY,
    PASS,
    NodeAffinity,
    NodeDomains,
    PodAffinity,
    PodAffinityTerm,
    PodFacts,
    PodIndex,
    WeightedPodAffinityTerm,
    interpod_filter,
    interpod_scores,
    interpod_topology_score,
    node_affinity_mask,
    node_affinity_scores,
)
from scheduler.core.constraints import PlacementRules
from scheduler.core.filters import NodeSelectorFilter, failed_nodes, run_filters
from scheduler.core.placement import PlacementView, PodPlacement
from scheduler.core.selectors import (
    NodeSelector,
    NodeSelectorTerm,
    parse_label_selector,
    parse_node_selector_term,
)

NAMES = ["n1", "n2", "n3"]
LABELS = [
    {"zone": "a", "rack": "1", "kubernetes.io/hostname": "n1"},
    {"zone": "a", "rack": "2", "kubernetes.io/hostname": "n2"},
    {"zone": "1", "rack": "3", "kubernetes.io/hostname": "n3"},  # zone "1" equals n1's rack value
]
ALL = np.arange(3)
ZONE, RACK, HOST = "zone", "rack", "kubernetes.io/hostname"


def by_name(*names: str, op: str = "In") -> NodeSelectorTerm:
    """A term with ``matchFields`` on ``metadata.name`` (one value per requirement, as the API allows)."""
    return parse_node_selector_term(
        {"matchFields": [{"key": "metadata.name", "operator": op, "values": [n]} for n in names]}
    )


# -- node affinity on the node's name (matchFields) --------------------------------------------


def test_required_match_fields_pick_the_node_by_name() -> None:
    only_n2 = NodeAffinity(required=NodeSelector((by_name("n2"),)))
    assert node_affinity_mask(only_n2, NAMES, LABELS, ALL).tolist() == [False, True, False]
    not_n1 = NodeAffinity(required=NodeSelector((by_name("n1", op="NotIn"),)))
    assert node_affinity_mask(not_n1, NAMES, LABELS, np.array([0, 2])).tolist() == [False, True]
    view = PlacementView(NAMES, LABELS)
    assert view.node_affinity_mask(only_n2).tolist() == [False, True, False]


def test_preferred_match_fields_score_the_named_node() -> None:
    prefer = NodeAffinity(
        preferred=(
            (10, by_name("n3")),
            (30, NodeSelectorTerm(parse_label_selector({"matchLabels": {"zone": "a"}}).requirements)),
        )
    )
    assert [prefer.preferred_score(n, ls) for n, ls in zip(NAMES, LABELS, strict=True)] == [30, 30, 10]
    assert node_affinity_scores(prefer, NAMES, LABELS, ALL).tolist() == [100, 100, 33]


def gpu_node(name: str, labels: dict[str, str]) -> NodeState:
    return NodeState(name, 8_000, 32_000, [GpuState(0, f"{name}-g0")], labels=labels)


def test_the_node_selector_filter_honours_match_fields_without_a_placement_view() -> None:
    """A cluster that keeps no placement view (the simulator) still filters by node name."""
    c = ClusterState([gpu_node(n, ls) for n, ls in zip(NAMES, LABELS, strict=True)])
    rules = PlacementRules(node_affinity=NodeAffinity(required=NodeSelector((by_name("n3"),))))
    pod = PodRequest("ml/p", uid="p", gpu_count=1, placement=PodPlacement(PodFacts("p", "ml"), rules))
    assert c.placement is None
    assert NodeSelectorFilter().keep(pod, c, c.all_indices).tolist() == [False, False, True]
    feasible, _ = run_filters(pod, c)
    assert feasible.tolist() == [2]
    why = "node(s) didn't match Pod's node affinity/selector"
    assert failed_nodes(pod, c) == {"n1": why, "n2": why}
    c.enable_placement()
    assert NodeSelectorFilter().keep(pod, c, c.all_indices).tolist() == [False, False, True]


# -- the pod index counts replicas, not just terms ---------------------------------------------


def term(key: str, **labels: str) -> PodAffinityTerm:
    return PodAffinityTerm(parse_label_selector({"matchLabels": labels}), key, frozenset({"default"}))


def setup(placed: list[tuple[PodFacts, int]]) -> tuple[PodIndex, NodeDomains]:
    index = PodIndex(len(NAMES))
    for pod, node in placed:
        index.add(pod, node)
    return index, NodeDomains(NAMES, LABELS)


def test_anti_affinity_of_a_remaining_replica_still_holds_after_its_twin_leaves() -> None:
    """Two replicas on n1 share the required anti-affinity term "no app=web on my host"; when one
    goes, the other still repels a web pod from n1 (the index counts pods per term and node)."""
    anti = PodAffinity(required_anti=(term(HOST, app="web"),))
    index, domains = setup([(PodFacts("r1", affinity=anti), 0), (PodFacts("r2", affinity=anti), 0)])
    web = PodFacts("w", labels={"app": "web"})
    assert interpod_filter(web, index, domains, {}, ALL).tolist() == [FAIL_EXISTING_ANTI_AFFINITY, PASS, PASS]
    index.remove("r1")
    assert interpod_filter(web, index, domains, {}, ALL).tolist() == [FAIL_EXISTING_ANTI_AFFINITY, PASS, PASS]
    index.add(PodFacts("r3", affinity=anti), 1)  # a third replica elsewhere keeps its own count
    assert interpod_filter(web, index, domains, {}, ALL).tolist() == [
        FAIL_EXISTING_ANTI_AFFINITY,
        FAIL_EXISTING_ANTI_AFFINITY,
        PASS,
    ]
    index.remove("r2")
    assert interpod_filter(web, index, domains, {}, ALL).tolist() == [PASS, FAIL_EXISTING_ANTI_AFFINITY, PASS]


def test_placed_pods_preferences_weigh_once_per_pod() -> None:
    """Two placed pods on n1 preferring app=web on their host weigh twice what one on n2 does."""
    likes = PodAffinity(preferred=(WeightedPodAffinityTerm(10, term(HOST, app="web")),))
    index, domains = setup(
        [
            (PodFacts("l1", affinity=likes), 0),
            (PodFacts("l2", affinity=likes), 0),
            (PodFacts("l3", affinity=likes), 1),
        ]
    )
    web = PodFacts("w", labels={"app": "web"})
    assert interpod_topology_score(web, index, domains, {}) == {(HOST, "n1"): 20, (HOST, "n2"): 10}
    # raw 20, 10, 0 -> int(100 * (s - 0) / 20)
    assert interpod_scores(web, index, domains, {}, ALL).tolist() == [100, 50, 0]
    # the same through the pod-by-pod path (some pods excluded, as preemption asks)
    assert interpod_scores(web, index, domains, {}, ALL, exclude={"l3"}).tolist() == [100, 0, 0]
    index.remove("l2")  # one of the two on n1 leaves: n1 and n2 weigh the same
    assert interpod_topology_score(web, index, domains, {}) == {(HOST, "n1"): 10, (HOST, "n2"): 10}


def test_a_hard_weight_of_zero_ignores_required_terms_but_keeps_preferred_ones() -> None:
    """kube-scheduler's hardPodAffinityWeight 0: placed pods' required affinity no longer scores,
    their preferred terms still do, whichever path counts them."""
    needs = PodAffinity(required=(term(HOST, app="web"),))
    likes = PodAffinity(preferred=(WeightedPodAffinityTerm(4, term(HOST, app="web")),))
    index, domains = setup([(PodFacts("n", affinity=needs), 0), (PodFacts("l", affinity=likes), 1)])
    web = PodFacts("w", labels={"app": "web"})
    for exclude in ((), ("nobody",)):
        assert interpod_topology_score(web, index, domains, {}, hard_weight=0, exclude=exclude) == {
            (HOST, "n2"): 4
        }
        assert interpod_scores(web, index, domains, {}, ALL, hard_weight=0, exclude=exclude).tolist() == [
            0,
            100,
            0,
        ]
        assert interpod_topology_score(web, index, domains, {}, exclude=exclude) == {
            (HOST, "n1"): 1,
            (HOST, "n2"): 4,
        }


def test_scores_of_no_feasible_node_are_empty() -> None:
    likes = PodAffinity(preferred=(WeightedPodAffinityTerm(4, term(HOST, app="web")),))
    index, domains = setup([(PodFacts("l", affinity=likes), 1)])
    web = PodFacts("w", labels={"app": "web"})
    assert interpod_scores(web, index, domains, {}, np.array([], dtype=np.int64)).tolist() == []


# -- selectors with several values and several requirements --------------------------------------


def test_anti_affinity_selector_with_several_values_sees_every_value() -> None:
    """``app In [db, cache]`` matches pods of either value (the label lookup must merge them)."""
    selector = parse_label_selector(
        {"matchExpressions": [{"key": "app", "operator": "In", "values": ["db", "cache"]}]}
    )
    anti = PodAffinity(required_anti=(PodAffinityTerm(selector, HOST, frozenset({"default"})),))
    index, domains = setup(
        [(PodFacts("c", labels={"app": "cache"}), 1), (PodFacts("o", labels={"app": "other"}), 2)]
    )
    assert interpod_filter(PodFacts("x", affinity=anti), index, domains, {}, ALL).tolist() == [
        PASS,
        FAIL_ANTI_AFFINITY,
        PASS,
    ]
    index.add(PodFacts("d", labels={"app": "db"}), 0)
    assert interpod_filter(PodFacts("x", affinity=anti), index, domains, {}, ALL).tolist() == [
        FAIL_ANTI_AFFINITY,
        FAIL_ANTI_AFFINITY,
        PASS,
    ]


def test_anti_affinity_selector_with_several_labels_needs_all_of_them() -> None:
    selector = parse_label_selector({"matchLabels": {"app": "db", "tier": "cache"}})
    anti = PodAffinity(required_anti=(PodAffinityTerm(selector, HOST, frozenset({"default"})),))
    index, domains = setup(
        [
            (PodFacts("d", labels={"app": "db"}), 0),
            (PodFacts("t", labels={"tier": "cache"}), 1),
            (PodFacts("both", labels={"app": "db", "tier": "cache"}), 2),
        ]
    )
    assert interpod_filter(PodFacts("x", affinity=anti), index, domains, {}, ALL).tolist() == [
        PASS,
        PASS,
        FAIL_ANTI_AFFINITY,
    ]


def test_anti_affinity_terms_on_two_keys_each_reject_their_own_domains() -> None:
    """Anti-affinity by zone against app=db (on n1, zone a) and by rack against app=web (on n3,
    rack 3): n1 and n2 (zone a) and n3 (rack 3) all fail. n3's zone value "1" is also a rack value
    (n1's): a domain hit of one key must not be looked up under another key."""
    anti = PodAffinity(required_anti=(term(ZONE, app="db"), term(RACK, app="web")))
    index, domains = setup(
        [(PodFacts("d", labels={"app": "db"}), 0), (PodFacts("w", labels={"app": "web"}), 2)]
    )
    assert (
        interpod_filter(PodFacts("x", affinity=anti), index, domains, {}, ALL).tolist()
        == [FAIL_ANTI_AFFINITY] * 3
    )
    # only the rack rule hits (no db pod): rack 3 only; zone "1" (n3) is not rack "1" (n1)
    index.remove("d")
    assert interpod_filter(PodFacts("x", affinity=anti), index, domains, {}, ALL).tolist() == [
        PASS,
        PASS,
        FAIL_ANTI_AFFINITY,
    ]
    # rack value "1" hit by a web pod on n1: zone "1" (n3) must not count as that domain
    index.remove("w")
    index.add(PodFacts("w1", labels={"app": "web"}), 0)
    assert interpod_filter(PodFacts("x", affinity=anti), index, domains, {}, ALL).tolist() == [
        FAIL_ANTI_AFFINITY,
        PASS,
        PASS,
    ]


# -- a pod without placement rules still meets placed pods' anti-affinity ------------------------


def test_a_pod_without_rules_is_kept_away_by_anti_affinity_in_its_own_namespace() -> None:
    """A placed pod repelling every pod of namespace ml from its host (empty label selector) keeps
    a rule-less pod "ml/p" off n1; the same term for namespace default applies to a pod named
    without a namespace ("p"), and not to "ml/p"."""
    c = ClusterState([gpu_node(n, ls) for n, ls in zip(NAMES, LABELS, strict=True)])
    c.enable_placement()
    everyone = parse_label_selector({})
    for ns in ("ml", "default"):
        loner = PodAffinity(required_anti=(PodAffinityTerm(everyone, HOST, frozenset({ns})),))
        c.placement.place(PodFacts(f"loner-{ns}", ns, {"app": "loner"}, loner), "n1" if ns == "ml" else "n2")
    why = "node(s) didn't satisfy existing pods anti-affinity rules"
    in_ml = PodRequest("ml/p", uid="p1", gpu_count=1)
    assert run_filters(in_ml, c)[0].tolist() == [1, 2]
    assert failed_nodes(in_ml, c) == {"n1": why}
    bare = PodRequest("p", uid="p2", gpu_count=1)
    assert run_filters(bare, c)[0].tolist() == [0, 2]
    assert failed_nodes(bare, c) == {"n2": why}


def test_pods_booked_without_facts_count_in_their_namespace_for_the_placement_view() -> None:
    """Pods booked before the view existed, or without their facts, are known by namespace only
    (no labels): a spread constraint with an empty selector in namespace ml counts "ml/old" and
    not "old" (namespace default), whether booked before or after the view was enabled."""
    from scheduler.core.state import Allocation

    for enable_first in (False, True):
        c = ClusterState([gpu_node(n, ls) for n, ls in zip(NAMES, LABELS, strict=True)])
        if enable_first:
            c.enable_placement()
        c.assume(Allocation("n1", "u-ml", "ml/old"))
        c.assume(Allocation("n2", "u-default", "old"))
        view = c.placement if enable_first else c.enable_placement()
        everyone = parse_label_selector({})
        for ns, where in (("ml", 0), ("default", 1)):
            anti = PodAffinity(required_anti=(PodAffinityTerm(everyone, HOST, frozenset({ns})),))
            codes = interpod_filter(PodFacts("x", ns, {}, anti), view.index, view.domains, {}, ALL).tolist()
            assert codes == [FAIL_ANTI_AFFINITY if i == where else PASS for i in range(3)], (ns, enable_first)


def test_the_placement_view_takes_the_cluster_nodes_taints_and_other_nodes() -> None:
    from scheduler.core.request import Taint, TaintEffect

    tainted = NodeState(
        "t",
        8_000,
        32_000,
        [GpuState(0, "t-g0")],
        labels={HOST: "t"},
        taints=(Taint("k", "v", TaintEffect.NO_SCHEDULE),),
    )
    c = ClusterState([gpu_node("n1", LABELS[0]), tainted])
    view = c.enable_placement(others=[("far", {HOST: "far"}, [Taint("k", "v", TaintEffect.NO_EXECUTE)])])
    assert view.n_cluster == 2 and len(view) == 3
    assert view.taints_mask(()).tolist() == [True, False, False]


def test_node_selector_and_required_node_affinity_must_both_hold() -> None:
    """nodeSelector zone=a AND required affinity on rack In [2, 3]: only n2 (zone a, rack 2)."""
    from scheduler.core.selectors import Op, Requirement

    c = ClusterState([gpu_node(n, ls) for n, ls in zip(NAMES, LABELS, strict=True)])
    racks = NodeSelector((NodeSelectorTerm((Requirement(RACK, Op.IN, frozenset({"2", "3"})),)),))
    rules = PlacementRules(node_affinity=NodeAffinity(node_selector=((ZONE, "a"),), required=racks))
    pod = PodRequest(
        "ml/p",
        uid="p",
        gpu_count=1,
        node_selector={ZONE: "a"},
        placement=PodPlacement(PodFacts("p", "ml"), rules),
    )
    for enable in (False, True):
        if enable:
            c.enable_placement()
        assert NodeSelectorFilter().keep(pod, c, c.all_indices).tolist() == [False, True, False]
        assert run_filters(pod, c)[0].tolist() == [1]


def test_domains_and_views_need_one_label_set_and_one_taint_list_per_node() -> None:
    import pytest

    with pytest.raises(ValueError, match="^one label set per node$"):
        NodeDomains(["a", "b"], [{}])
    with pytest.raises(ValueError, match="^one taint list per node$"):
        PlacementView(["a"], [{}], [(), ()])


def test_preferences_decide_between_two_feasible_nodes() -> None:
    """With exactly two feasible nodes the placement scores still count: preferred node affinity
    for zone 1 sends the pod to n3, although the policy alone would take n1 (lowest tie rank)."""
    import random

    from scheduler.core import Placement, make_policy, schedule_one
    from scheduler.core.placement import placement_of

    c = ClusterState([gpu_node("n1", LABELS[0]), gpu_node("n3", LABELS[2])])
    c.enable_placement()
    c.set_tie_order([0, 1])
    term = {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["1"]}]}
    doc = {
        "metadata": {"name": "p", "namespace": "ml", "uid": "p"},
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "preference": term}]
                }
            }
        },
    }
    pod = PodRequest("ml/p", uid="p", gpu_count=1, placement=placement_of(doc))
    plain = PodRequest("ml/q", uid="q", gpu_count=1)
    assert schedule_one(plain, c, make_policy("binpack"), random.Random(0)).node == "n1"
    placed = schedule_one(pod, c, make_policy("binpack"), random.Random(0))
    assert isinstance(placed, Placement) and placed.node == "n3"
