"""Topology spread constraints: kube-scheduler's PodTopologySpread filter and score."""

from __future__ import annotations

import math

import numpy as np

from scheduler.core.affinity import NodeDomains, PodFacts, PodIndex
from scheduler.core.selectors import NOTHING, parse_label_selector
from scheduler.core.spread import (
    FAIL_MISSING_LABEL,
    FAIL_SKEW,
    MISSING_LABEL_REASON,
    PASS,
    SPREAD_REASON,
    SPREAD_REASONS,
    SpreadConstraint,
    node_match_counts,
    spread_filter,
    spread_scores,
)

ZONE, HOST = "topology.kubernetes.io/zone", "kubernetes.io/hostname"
WEB = parse_label_selector({"matchLabels": {"app": "web"}})


def node_labels(zone: str | None, host: str) -> dict[str, str]:
    labels = {HOST: host}
    if zone is not None:
        labels[ZONE] = zone
    return labels


def setup(zones: list[str | None], pods_per_node: list[int]) -> tuple[PodIndex, NodeDomains]:
    """Nodes n0.. in the given zones, each with that many web pods."""
    names = [f"n{i}" for i in range(len(zones))]
    domains = NodeDomains(names, [node_labels(z, n) for z, n in zip(zones, names, strict=True)])
    index = PodIndex(len(names))
    for i, count in enumerate(pods_per_node):
        for k in range(count):
            index.add(PodFacts(f"web-{i}-{k}", "default", {"app": "web"}), i)
    return index, domains


def zone_rule(max_skew: int = 1, **kw) -> SpreadConstraint:
    return SpreadConstraint(max_skew, ZONE, WEB, **kw)


def run(index, domains, constraints, labels=None, namespace="default", **kw) -> list[int]:
    idx = np.arange(len(domains))
    return spread_filter(namespace, labels or {"app": "web"}, constraints, index, domains, idx, **kw).tolist()


def test_the_documented_two_zone_example() -> None:
    """Zone A (n0, n1) runs 2 matching pods, zone B (n2, n3) 1: with maxSkew 1 the next one must
    go to zone B (2 + 1 - 1 = 2 > 1 in A; 1 + 1 - 1 = 1 in B)."""
    index, domains = setup(["a", "a", "b", "b"], [1, 1, 1, 0])
    assert run(index, domains, [zone_rule()]) == [FAIL_SKEW, FAIL_SKEW, PASS, PASS]
    assert run(index, domains, [zone_rule(max_skew=2)]) == [PASS] * 4


def test_a_pod_the_selector_does_not_match_adds_nothing() -> None:
    index, domains = setup(["a", "a", "b", "b"], [1, 1, 1, 0])
    # skew = count - min: zone A is 2 - 1 = 1, within maxSkew 1
    assert run(index, domains, [zone_rule()], labels={"app": "other"}) == [PASS] * 4
    index.add(PodFacts("extra", "default", {"app": "web"}), 0)
    assert run(index, domains, [zone_rule()], labels={"app": "other"}) == [FAIL_SKEW, FAIL_SKEW, PASS, PASS]


def test_missing_label_and_domains_of_unlabelled_nodes() -> None:
    index, domains = setup(["a", "b", None], [0, 0, 5])
    assert run(index, domains, [zone_rule()]) == [PASS, PASS, FAIL_MISSING_LABEL]
    assert (
        SPREAD_REASONS[FAIL_MISSING_LABEL]
        == MISSING_LABEL_REASON
        == SPREAD_REASON + " (missing required label)"
    )
    assert SPREAD_REASON == "node(s) didn't match pod topology spread constraints"


def test_nodes_must_have_every_hard_key_to_make_a_domain() -> None:
    """n2 (zone b) lacks the rack label, so zone b is no domain for the zone constraint and the
    minimum over zones is zone a's 1: n1 in zone a stays feasible for the zone rule."""
    names = ["n0", "n1", "n2"]
    labels = [
        {ZONE: "a", "rack": "r1", HOST: "n0"},
        {ZONE: "a", "rack": "r2", HOST: "n1"},
        {ZONE: "b", HOST: "n2"},
    ]
    domains = NodeDomains(names, labels)
    index = PodIndex(3)
    index.add(PodFacts("w", "default", {"app": "web"}), 0)
    rules = [zone_rule(), SpreadConstraint(5, "rack", WEB)]
    out = spread_filter("default", {"app": "web"}, rules, index, domains, np.arange(3)).tolist()
    assert out == [PASS, PASS, FAIL_MISSING_LABEL]
    # with only the zone rule, zone b is a domain with 0 pods and zone a exceeds the skew
    out = spread_filter("default", {"app": "web"}, rules[:1], index, domains, np.arange(3)).tolist()
    assert out == [FAIL_SKEW, FAIL_SKEW, PASS]


def test_constraints_are_checked_in_order() -> None:
    """n2 (zone a, no rack) fails the zone rule's skew and lacks the rack label: the first
    constraint in the pod's order names the reason."""
    names = ["n0", "n1", "n2"]
    labels = [{ZONE: "a", "rack": "r0"}, {ZONE: "b", "rack": "r1"}, {ZONE: "a"}]
    domains = NodeDomains(names, labels)
    index = PodIndex(3)
    for k in range(2):
        index.add(PodFacts(f"w{k}", "default", {"app": "web"}), 0)
    rack_rule = SpreadConstraint(1, "rack", WEB)
    assert run(index, domains, [zone_rule(), rack_rule]) == [FAIL_SKEW, PASS, FAIL_SKEW]
    assert run(index, domains, [rack_rule, zone_rule()]) == [FAIL_SKEW, PASS, FAIL_MISSING_LABEL]


def test_min_domains() -> None:
    """Two zones but minDomains 3: the global minimum counts as 0."""
    index, domains = setup(["a", "b"], [1, 1])
    assert run(index, domains, [zone_rule()]) == [PASS, PASS]
    assert run(index, domains, [zone_rule(min_domains=3)]) == [FAIL_SKEW, FAIL_SKEW]
    assert run(index, domains, [zone_rule(max_skew=2, min_domains=3)]) == [PASS, PASS]
    assert run(index, domains, [zone_rule(min_domains=2)]) == [PASS, PASS]


def test_node_affinity_policy() -> None:
    """Zone c (empty) is excluded by the pod's node affinity: Honor leaves it out of the minimum."""
    index, domains = setup(["a", "b", "c"], [1, 0, 0])
    index.add(PodFacts("w2", "default", {"app": "web"}), 1)
    affinity_ok = np.array([True, True, False])
    honor = run(index, domains, [zone_rule()], affinity_ok=affinity_ok)
    ignore = run(index, domains, [zone_rule(honor_node_affinity=False)], affinity_ok=affinity_ok)
    assert honor[:2] == [PASS, PASS]
    assert ignore[:2] == [FAIL_SKEW, FAIL_SKEW]


def test_node_taints_policy() -> None:
    index, domains = setup(["a", "b", "c"], [1, 1, 0])
    taints_ok = np.array([True, True, False])
    assert run(index, domains, [zone_rule()], taints_ok=taints_ok)[:2] == [FAIL_SKEW, FAIL_SKEW]
    honored = run(index, domains, [zone_rule(honor_taints=True)], taints_ok=taints_ok)
    assert honored[:2] == [PASS, PASS]


def test_other_namespaces_terminating_and_excluded_pods_do_not_count() -> None:
    index, domains = setup(["a", "b"], [0, 0])
    index.add(PodFacts("elsewhere", "other", {"app": "web"}), 0)
    index.add(PodFacts("leaving", "default", {"app": "web"}, terminating=True), 0)
    assert run(index, domains, [zone_rule()]) == [PASS, PASS]
    index.add(PodFacts("here", "default", {"app": "web"}), 0)
    assert run(index, domains, [zone_rule()]) == [FAIL_SKEW, PASS]
    assert run(index, domains, [zone_rule()], exclude={"here"}) == [PASS, PASS]
    assert run(index, domains, [zone_rule()], namespace="other") == [FAIL_SKEW, PASS]
    counts = node_match_counts(WEB, "default", index, 2)
    assert counts.tolist() == [1, 0]
    assert node_match_counts(WEB, "default", index, 2, me="here").tolist() == [0, 0]
    assert run(index, domains, [zone_rule()], uid="here") == [PASS, PASS]
    soft = [zone_rule(hard=False)]
    assert spread_scores("default", soft, index, domains, np.arange(2)).tolist() == [0, 100]
    assert spread_scores("default", soft, index, domains, np.arange(2), uid="here").tolist() == [100, 100]
    assert node_match_counts(NOTHING, "default", index, 2).tolist() == [0, 0]


def test_soft_constraints_never_filter_and_hard_never_score() -> None:
    index, domains = setup(["a", "b"], [3, 0])
    soft = zone_rule(hard=False)
    assert run(index, domains, [soft]) == [PASS, PASS]
    assert spread_scores("default", [zone_rule()], index, domains, np.arange(2)).tolist() == [0, 0]


def test_soft_zone_scores() -> None:
    """Feasible n0, n1 (zone a) and n2 (zone b); zone a runs 3 web pods, zone b 1. Two domains:
    weight log(4). Raw a: round(3 * 1.386) = 4, b: round(1.386) = 1; normalised
    100 * (max + min - s) // max: a 100 * 1 // 4 = 25, b 100."""
    index, domains = setup(["a", "a", "b"], [2, 1, 1])
    scores = spread_scores("default", [zone_rule(hard=False)], index, domains, np.arange(3)).tolist()
    assert scores == [25, 25, 100]
    assert round(3 * math.log(4)) == 4


def test_soft_scores_count_pods_on_infeasible_nodes_of_feasible_domains() -> None:
    """n1 is not feasible but lies in zone a with n0: its pods count for n0. Zone c (n3) holds no
    feasible node, so its pods count nowhere."""
    index, domains = setup(["a", "a", "b", "c"], [0, 2, 1, 9])
    scores = spread_scores("default", [zone_rule(hard=False)], index, domains, np.array([0, 2])).tolist()
    # weight log(2 + 2); a: round(2 * 1.386) = 3, b: round(1.386) = 1 -> a 100 * 1 // 3 = 33
    assert scores == [33, 100]


def test_soft_scores_honour_inclusion_policies_when_counting() -> None:
    index, domains = setup(["a", "a", "b"], [0, 2, 1])
    affinity_ok = np.array([True, False, True])
    honor = spread_scores("default", [zone_rule(hard=False)], index, domains, np.array([0, 2]), affinity_ok)
    # n1 does not match the pod's node affinity: zone a counts 0 pods
    assert honor.tolist() == [100, 0]
    ignore = spread_scores(
        "default",
        [zone_rule(hard=False, honor_node_affinity=False)],
        index,
        domains,
        np.array([0, 2]),
        affinity_ok,
    )
    assert ignore.tolist() == [33, 100]


def test_soft_hostname_scores_count_the_node_itself() -> None:
    index, domains = setup(["a", "a", "b"], [2, 0, 1])
    rule = SpreadConstraint(1, HOST, WEB, hard=False)
    # three scored nodes: weight log(5); raw n0 round(2 * 1.609) = 3, n1 0, n2 round(1.609) = 2
    # -> 100 * (3 + 0 - s) // 3: n0 0, n1 100, n2 33
    assert spread_scores("default", [rule], index, domains, np.arange(3)).tolist() == [0, 100, 33]


def test_max_skew_softens_differences() -> None:
    index, domains = setup(["a", "b"], [1, 0])
    # maxSkew 3 adds 2 to every raw score: a round(1.386) + 2 = 3, b 2 -> a 100 * 2 // 3 = 66
    scores = spread_scores("default", [zone_rule(max_skew=3, hard=False)], index, domains, np.arange(2))
    assert scores.tolist() == [66, 100]


def test_nodes_without_the_key_score_zero_and_all_equal_score_full() -> None:
    index, domains = setup(["a", None, "b"], [0, 0, 0])
    scores = spread_scores("default", [zone_rule(hard=False)], index, domains, np.arange(3)).tolist()
    assert scores == [100, 0, 100]  # max raw 0: every scored node gets 100
    assert spread_scores("default", [zone_rule(hard=False)], index, domains, np.array([1])).tolist() == [0]
    assert spread_scores("default", [], index, domains, np.arange(3)).tolist() == [0, 0, 0]
    nowhere = SpreadConstraint(1, "rack", WEB, hard=False)  # no node has the key at all
    assert spread_scores("default", [nowhere], index, domains, np.arange(3)).tolist() == [0, 0, 0]
    assert run(index, domains, [SpreadConstraint(1, "rack", WEB)]) == [FAIL_MISSING_LABEL] * 3


def test_two_soft_constraints_add_up() -> None:
    index, domains = setup(["a", "a", "b"], [1, 0, 0])
    rules = [zone_rule(hard=False), SpreadConstraint(1, HOST, WEB, hard=False)]
    # zone weight log(4) -> a 1.386; host weight log(5) -> n0 1.609; n0 round(2.996) = 3,
    # n1 round(1.386) = 1, n2 0 -> 100 * (3 + 0 - s) // 3
    assert spread_scores("default", rules, index, domains, np.arange(3)).tolist() == [0, 66, 100]
