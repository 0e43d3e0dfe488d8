"""Label selectors, node affinity and inter-pod affinity: kube-scheduler's documented semantics."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core.affinity import (
    AFFINITY_REASON,
    ANTI_AFFINITY_REASON,
    EXISTING_ANTI_AFFINITY_REASON,
    FAIL_AFFINITY,
    FAIL_ANTI_AFFINITY,
    FAIL_EXISTING_ANTI_AFFINITY,
    INTERPOD_REASONS,
    NO_POD_AFFINITY,
    PASS,
    NodeAffinity,
    NodeDomains,
    PodAffinity,
    PodAffinityTerm,
    PodFacts,
    PodIndex,
    WeightedPodAffinityTerm,
    default_normalize,
    interpod_counts,
    interpod_filter,
    interpod_scores,
    interpod_topology_score,
    node_affinity_mask,
    node_affinity_scores,
)
from scheduler.core.selectors import (
    EVERYTHING,
    LABEL_OPS,
    NOTHING,
    LabelSelector,
    NodeSelector,
    NodeSelectorTerm,
    Op,
    Requirement,
    SelectorError,
    parse_int64,
    parse_label_selector,
    parse_node_selector_term,
    valid_label_key,
    valid_label_value,
)

# -- selectors ----------------------------------------------------------------------------------


def req(key: str, op: str, *values: str) -> Requirement:
    return Requirement.parse(key, op, list(values))


@pytest.mark.parametrize(
    ("op", "values", "labels", "expected"),
    [
        ("In", ["a", "b"], {"k": "a"}, True),
        ("In", ["a", "b"], {"k": "c"}, False),
        ("In", ["a"], {}, False),
        ("NotIn", ["a"], {"k": "b"}, True),
        ("NotIn", ["a"], {"k": "a"}, False),
        ("NotIn", ["a"], {}, True),  # a missing label is not in any set
        ("Exists", [], {"k": ""}, True),
        ("Exists", [], {"other": "x"}, False),
        ("DoesNotExist", [], {}, True),
        ("DoesNotExist", [], {"k": "x"}, False),
        ("Gt", ["5"], {"k": "6"}, True),
        ("Gt", ["5"], {"k": "5"}, False),
        ("Gt", ["5"], {"k": "-6"}, False),
        ("Gt", ["0"], {"k": "0"}, False),
        ("Gt", ["5"], {}, False),
        ("Gt", ["5"], {"k": "six"}, False),  # a label that is not an integer never compares
        ("Gt", ["5"], {"k": "06"}, True),
        ("Gt", ["5"], {"k": "+6"}, True),
        ("Gt", ["5"], {"k": "6.0"}, False),
        ("Gt", ["5"], {"k": "1_000"}, False),  # Python's int() would take it; Go's ParseInt does not
        ("Gt", ["5"], {"k": " 7"}, False),
        ("Gt", ["5"], {"k": "9223372036854775808"}, False),  # beyond int64
        ("Lt", ["5"], {"k": "4"}, True),
        ("Lt", ["5"], {"k": "5"}, False),
        ("Lt", ["5"], {"k": "x"}, False),
        ("Lt", ["5"], {}, False),
    ],
)
def test_requirement_operators(op: str, values: list[str], labels: dict[str, str], expected: bool) -> None:
    assert req("k", op, *values).matches(labels) is expected


@pytest.mark.parametrize(
    ("key", "op", "values", "message"),
    [
        ("k", "In", [], "must not be empty"),
        ("k", "NotIn", [], "must not be empty"),
        ("k", "Exists", ["a"], "must be empty"),
        ("k", "DoesNotExist", ["a"], "must be empty"),
        ("k", "Gt", ["1", "2"], "exactly one integer"),
        ("k", "Lt", ["x"], "exactly one integer"),
        ("k", "Gt", ["-7"], "invalid label value"),  # Gt values are label values too
        ("k", "Gt", [], "exactly one integer"),
        ("k", "In", ["bad value!"], "invalid label value"),
        ("k", "Equals", ["a"], "operator"),
        ("bad key!", "In", ["a"], "invalid label key"),
        ("", "Exists", [], "invalid label key"),
        ("k", "In", "a", "list of strings"),
        ("k", "In", [1], "list of strings"),
    ],
)
def test_requirement_validation(key: str, op: str, values, message: str) -> None:
    with pytest.raises(SelectorError, match=message):
        Requirement.parse(key, op, values)


def test_label_selectors_do_not_take_gt_lt() -> None:
    with pytest.raises(SelectorError, match="operator 'Gt' is not one of"):
        Requirement.parse("k", "Gt", ["1"], LABEL_OPS)
    with pytest.raises(SelectorError, match="matchExpressions\\[0\\]"):
        parse_label_selector({"matchExpressions": [{"key": "k", "operator": "Lt", "values": ["1"]}]})


def test_label_key_and_value_rules() -> None:
    assert valid_label_key("app") and valid_label_key("topology.kubernetes.io/zone")
    assert valid_label_key("a" * 63) and not valid_label_key("a" * 64)
    assert not valid_label_key("/app") and not valid_label_key("Example.com/app")
    assert not valid_label_key("-app") and not valid_label_key("app-")
    assert not valid_label_key(("a" * 254) + "/app")
    assert valid_label_value("") and valid_label_value("a.b-c_d") and valid_label_value("a" * 63)
    assert not valid_label_value("a" * 64) and not valid_label_value("-a") and not valid_label_value("a b")


def test_parse_int64_is_go_strconv() -> None:
    assert parse_int64("42") == 42 and parse_int64("-42") == -42 and parse_int64("+42") == 42
    assert parse_int64("9223372036854775807") == (1 << 63) - 1
    assert parse_int64("-9223372036854775808") == -(1 << 63)
    for bad in ("", "+", "4 2", "0x10", "1e3", "٣"):
        assert parse_int64(bad) is None


def test_label_selector_nil_empty_and_and() -> None:
    assert parse_label_selector(None) is NOTHING and not NOTHING.matches({})
    assert parse_label_selector({}).empty and parse_label_selector({}).matches({"any": "x"})
    sel = parse_label_selector(
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}],
        }
    )
    assert sel.matches({"app": "web"}) and sel.matches({"app": "web", "tier": "fe"})
    assert not sel.matches({"app": "web", "tier": "db"}) and not sel.matches({"tier": "fe"})
    for bad, message in (
        ([], "must be an object"),
        ({"matchLabels": []}, "matchLabels must be an object"),
        ({"matchLabels": {"a": 1}}, "must be a string"),
        ({"matchLabels": {"a": "b c"}}, "invalid label value"),
        ({"matchExpressions": {}}, "must be a list"),
        ({"matchExpressions": ["x"]}, "must be an object"),
    ):
        with pytest.raises(SelectorError, match=message):
            parse_label_selector(bad)


def test_merged_selector_adds_the_pods_own_values() -> None:
    sel = parse_label_selector({"matchLabels": {"app": "web"}})
    merged = sel.merged({"app": "web", "rev": "7"}, ["rev", "absent"])
    assert merged.matches({"app": "web", "rev": "7"}) and not merged.matches({"app": "web", "rev": "8"})
    anti = sel.merged({"rev": "7"}, ["rev"], negate=True)
    assert anti.matches({"app": "web", "rev": "8"}) and not anti.matches({"app": "web", "rev": "7"})
    assert sel.merged({"x": "y"}, ["absent"]) is sel
    assert NOTHING.merged({"rev": "7"}, ["rev"]) is NOTHING
    assert EVERYTHING.merged({"rev": "7"}, ["rev"]).matches({"rev": "7"})
    assert not EVERYTHING.merged({"rev": "7"}, ["rev"]).matches({"rev": "6"})


def test_node_selector_terms() -> None:
    zone_a = parse_node_selector_term(
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    )
    assert zone_a.matches("n1", {"zone": "a"}) and not zone_a.matches("n1", {"zone": "b"})
    assert not NodeSelectorTerm().matches("n1", {})  # an empty term matches nothing
    assert parse_node_selector_term({}).empty and parse_node_selector_term(None).empty
    by_name = parse_node_selector_term(
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}
    )
    assert by_name.matches("n2", {}) and not by_name.matches("n1", {})
    not_name = parse_node_selector_term(
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}]}
    )
    assert not_name.matches("n1", {}) and not not_name.matches("n2", {})
    both = parse_node_selector_term(
        {
            "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}],
        }
    )
    assert both.matches("n1", {"zone": "a"})
    assert not both.matches("n1", {"zone": "b"}) and not both.matches("n2", {"zone": "a"})
    either = NodeSelector((zone_a, by_name))
    assert either.matches("n2", {}) and either.matches("n9", {"zone": "a"}) and not either.matches("n9", {})
    assert not NodeSelector().matches("n1", {})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ([{"key": "metadata.namespace", "operator": "In", "values": ["x"]}], "only the field metadata.name"),
        ([{"key": "metadata.name", "operator": "Exists"}], "not one of In, NotIn"),
        ([{"key": "metadata.name", "operator": "In", "values": ["a", "b"]}], "exactly one value"),
        ([{"key": "metadata.name", "operator": "In", "values": []}], "exactly one value"),
        ({"key": "metadata.name"}, "must be a list"),
        (["x"], "must be an object"),
    ],
)
def test_match_fields_rules(fields, message: str) -> None:
    with pytest.raises(SelectorError, match=message):
        parse_node_selector_term({"matchFields": fields})
    lazy = parse_node_selector_term({"matchFields": fields}, lazy=True)
    assert lazy.error and not lazy.matches("metadata.name", {}) and not lazy.empty


def test_lazy_term_with_a_bad_value_matches_nothing() -> None:
    """NotIn ["bad value!"] would match every node if the value were not checked; kube-scheduler
    drops the term instead."""
    term = parse_node_selector_term(
        {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["bad value!"]}]}, lazy=True
    )
    assert "invalid label value" in term.error
    assert not term.matches("n1", {"zone": "a"}) and not term.matches("n1", {})
    assert not parse_node_selector_term("nonsense", lazy=True).matches("n1", {})


# -- node affinity ------------------------------------------------------------------------------

NAMES = ["a1", "a2", "b1", "nolabel"]
LABELS = [
    {"zone": "a", "kubernetes.io/hostname": "a1", "gpu": "h100", "cores": "64"},
    {"zone": "a", "kubernetes.io/hostname": "a2", "gpu": "a100", "cores": "32"},
    {"zone": "b", "kubernetes.io/hostname": "b1", "gpu": "h100", "cores": "128"},
    {"kubernetes.io/hostname": "nolabel"},
]
ALL = np.arange(4)


def term(*exprs: Requirement) -> NodeSelectorTerm:
    return NodeSelectorTerm(tuple(exprs))


def test_required_node_affinity_in_and_not_in() -> None:
    nowhere = NodeAffinity(required=NodeSelector((term(req("zone", "In", "does-not-exist")),)))
    assert not node_affinity_mask(nowhere, NAMES, LABELS, ALL).any()
    not_a = NodeAffinity(required=NodeSelector((term(req("zone", "NotIn", "a")),)))
    assert node_affinity_mask(not_a, NAMES, LABELS, ALL).tolist() == [False, False, True, True]
    more = NodeAffinity(required=NodeSelector((term(req("cores", "Gt", "40")),)))
    assert node_affinity_mask(more, NAMES, LABELS, ALL).tolist() == [True, False, True, False]
    assert node_affinity_mask(more, NAMES, LABELS, np.array([1, 2])).tolist() == [False, True]


def test_node_selector_and_required_affinity_both_hold() -> None:
    both = NodeAffinity(
        node_selector=(("gpu", "h100"),), required=NodeSelector((term(req("zone", "In", "a")),))
    )
    assert node_affinity_mask(both, NAMES, LABELS, ALL).tolist() == [True, False, False, False]
    only_selector = NodeAffinity(node_selector=(("gpu", "h100"),))
    assert node_affinity_mask(only_selector, NAMES, LABELS, ALL).tolist() == [True, False, True, False]
    assert node_affinity_mask(NodeAffinity(), NAMES, LABELS, ALL).all()
    no_terms = NodeAffinity(required=NodeSelector(()))  # required with no terms: no node
    assert not node_affinity_mask(no_terms, NAMES, LABELS, ALL).any()


def test_preferred_node_affinity_scores_are_normalised_to_the_best() -> None:
    prefer = NodeAffinity(
        preferred=((30, term(req("zone", "In", "a"))), (40, term(req("gpu", "In", "h100"))))
    )
    assert [prefer.preferred_score(n, ls) for n, ls in zip(NAMES, LABELS, strict=True)] == [70, 30, 40, 0]
    # 100 * s // max over the feasible nodes: 30 -> 42 (integer division), 40 -> 57
    assert node_affinity_scores(prefer, NAMES, LABELS, ALL).tolist() == [100, 42, 57, 0]
    # normalised over the nodes scored: without a1 the best is b1
    assert node_affinity_scores(prefer, NAMES, LABELS, np.array([1, 2, 3])).tolist() == [75, 100, 0]
    assert node_affinity_scores(prefer, NAMES, LABELS, np.array([3])).tolist() == [0]
    assert node_affinity_scores(NodeAffinity(), NAMES, LABELS, ALL).tolist() == [0, 0, 0, 0]


def test_default_normalize() -> None:
    assert default_normalize(np.array([0, 30, 70])).tolist() == [0, 42, 100]
    assert default_normalize(np.array([0, 0])).tolist() == [0, 0]
    assert default_normalize(np.array([], dtype=np.int64)).tolist() == []
    assert default_normalize(np.array([1, 3])).tolist() == [33, 100]


# -- inter-pod affinity -------------------------------------------------------------------------

ZONE, HOST = "zone", "kubernetes.io/hostname"


def sel(**labels: str) -> LabelSelector:
    return parse_label_selector({"matchLabels": labels})


def pod_term(key: str, ns: str = "default", **labels: str) -> PodAffinityTerm:
    return PodAffinityTerm(sel(**labels), key, frozenset({ns}))


def cluster(placements: list[tuple[PodFacts, int]]) -> tuple[PodIndex, NodeDomains]:
    index = PodIndex(len(NAMES))
    for pod, node in placements:
        index.add(pod, node)
    return index, NodeDomains(NAMES, LABELS)


def pod(uid: str, ns: str = "default", affinity: PodAffinity = NO_POD_AFFINITY, **labels: str) -> PodFacts:
    return PodFacts(uid, ns, labels, affinity)


def codes(incoming: PodFacts, index: PodIndex, domains: NodeDomains, ns_labels=None, exclude=()) -> list[int]:
    return interpod_filter(incoming, index, domains, ns_labels or {}, ALL, exclude).tolist()


def test_required_affinity_follows_matching_pods_by_zone() -> None:
    index, domains = cluster([(pod("db1", app="db"), 0)])
    web = pod("web", affinity=PodAffinity(required=(pod_term(ZONE, app="db"),)), app="web")
    # zone a holds a db pod; zone b does not; the unlabelled node lacks the topology key
    assert codes(web, index, domains) == [PASS, PASS, FAIL_AFFINITY, FAIL_AFFINITY]
    by_host = pod("web", affinity=PodAffinity(required=(pod_term(HOST, app="db"),)), app="web")
    assert codes(by_host, index, domains) == [PASS, FAIL_AFFINITY, FAIL_AFFINITY, FAIL_AFFINITY]


def test_first_pod_of_a_self_attracting_group() -> None:
    """No pod matches the terms anywhere: a pod that matches its own terms may go to any node
    that has the topology keys; one that does not match them may go nowhere."""
    index, domains = cluster([(pod("other", app="cache"), 0)])
    self_attracting = pod("db1", affinity=PodAffinity(required=(pod_term(ZONE, app="db"),)), app="db")
    assert codes(self_attracting, index, domains) == [PASS, PASS, PASS, FAIL_AFFINITY]
    stranger = pod("web", affinity=PodAffinity(required=(pod_term(ZONE, app="db"),)), app="web")
    assert codes(stranger, index, domains) == [FAIL_AFFINITY] * 4
    # once one db pod exists, the rest of the group must join its zone
    index.add(pod("db0", app="db"), 2)
    assert codes(self_attracting, index, domains) == [FAIL_AFFINITY, FAIL_AFFINITY, PASS, FAIL_AFFINITY]


def test_the_incoming_pod_never_counts_itself() -> None:
    anti = PodAffinity(required_anti=(pod_term(HOST, app="web"),))
    me = pod("me", affinity=anti, app="web")
    index, domains = cluster([(me, 0)])  # say, a stale booking of the pod being scheduled
    assert codes(me, index, domains) == [PASS] * 4
    assert codes(pod("other", affinity=anti, app="web"), index, domains)[0] == FAIL_ANTI_AFFINITY
    prefer = PodAffinity(preferred=(WeightedPodAffinityTerm(10, pod_term(HOST, app="web")),))
    assert interpod_topology_score(pod("me", affinity=prefer, app="web"), index, domains, {}) is None


def test_an_existing_pod_counts_only_if_it_matches_all_required_terms() -> None:
    index, domains = cluster([(pod("db", app="db"), 0), (pod("cache", tier="cache"), 2)])
    two = PodAffinity(required=(pod_term(ZONE, app="db"), pod_term(ZONE, tier="cache")))
    incoming = pod("x", affinity=two)
    # no single pod matches both terms: the counts are empty and x does not match itself
    assert codes(incoming, index, domains) == [FAIL_AFFINITY] * 4
    index.add(pod("both", app="db", tier="cache"), 1)
    assert codes(incoming, index, domains) == [PASS, PASS, FAIL_AFFINITY, FAIL_AFFINITY]


def test_required_terms_with_different_keys_each_need_a_pod_in_their_domain() -> None:
    index, domains = cluster([(pod("db", app="db"), 0)])
    both = PodAffinity(required=(pod_term(ZONE, app="db"), pod_term(HOST, app="db")))
    assert codes(pod("x", affinity=both), index, domains) == [
        PASS,
        FAIL_AFFINITY,
        FAIL_AFFINITY,
        FAIL_AFFINITY,
    ]


def test_anti_affinity_by_host_spreads_replicas() -> None:
    web = PodAffinity(required_anti=(pod_term(HOST, app="web"),))
    index, domains = cluster([(pod("web-1", affinity=web, app="web"), 0)])
    assert codes(pod("web-2", affinity=web, app="web"), index, domains) == [
        FAIL_ANTI_AFFINITY,
        PASS,
        PASS,
        PASS,
    ]
    index.add(pod("web-2", affinity=web, app="web"), 1)
    index.add(pod("web-3", affinity=web, app="web"), 2)
    assert codes(pod("web-4", affinity=web, app="web"), index, domains) == [
        FAIL_ANTI_AFFINITY,
        FAIL_ANTI_AFFINITY,
        FAIL_ANTI_AFFINITY,
        PASS,
    ]


def test_anti_affinity_ignores_nodes_without_the_key() -> None:
    index, domains = cluster([(pod("web-1", app="web"), 3)])
    by_zone = pod("web-2", affinity=PodAffinity(required_anti=(pod_term(ZONE, app="web"),)), app="web")
    assert codes(by_zone, index, domains) == [PASS] * 4  # the node without a zone makes no zone


def test_existing_pods_anti_affinity_is_symmetric() -> None:
    """A placed pod that refuses web pods in its zone keeps a web pod (without rules of its own)
    out of that zone; pods it does not select are not affected."""
    loner = PodAffinity(required_anti=(pod_term(ZONE, app="web"),))
    index, domains = cluster([(pod("loner", affinity=loner, app="batch"), 2)])
    assert codes(pod("web", app="web"), index, domains) == [PASS, PASS, FAIL_EXISTING_ANTI_AFFINITY, PASS]
    assert codes(pod("api", app="api"), index, domains) == [PASS] * 4
    assert codes(pod("web", ns="other", app="web"), index, domains) == [PASS] * 4  # its namespace only
    assert codes(pod("web", app="web"), index, domains, exclude={"loner"}) == [PASS] * 4


def test_reasons_are_reported_in_kube_schedulers_order() -> None:
    """A node failing all three rules is counted under the pod's own affinity first."""
    loner = PodAffinity(required_anti=(pod_term(HOST, app="web"),))
    index, domains = cluster([(pod("loner", affinity=loner, app="web"), 2), (pod("db", app="db"), 0)])
    rules = PodAffinity(required=(pod_term(ZONE, app="db"),), required_anti=(pod_term(ZONE, app="web"),))
    assert codes(pod("web", affinity=rules, app="web"), index, domains) == [
        PASS,
        PASS,
        FAIL_AFFINITY,
        FAIL_AFFINITY,
    ]
    only_anti = PodAffinity(required_anti=(pod_term(ZONE, app="web"),))
    assert codes(pod("web", affinity=only_anti, app="web"), index, domains) == [
        PASS,
        PASS,
        FAIL_ANTI_AFFINITY,
        PASS,
    ]
    assert INTERPOD_REASONS == {
        FAIL_AFFINITY: AFFINITY_REASON,
        FAIL_ANTI_AFFINITY: ANTI_AFFINITY_REASON,
        FAIL_EXISTING_ANTI_AFFINITY: EXISTING_ANTI_AFFINITY_REASON,
    }
    assert AFFINITY_REASON == "node(s) didn't match pod affinity rules"
    assert EXISTING_ANTI_AFFINITY_REASON == "node(s) didn't satisfy existing pods anti-affinity rules"


def test_term_namespaces() -> None:
    db_elsewhere = pod("db", ns="data", app="db")
    index, domains = cluster([(db_elsewhere, 0)])
    own_ns = PodAffinity(required=(pod_term(ZONE, app="db"),))  # the pod's own namespace only
    assert codes(pod("web", affinity=own_ns), index, domains) == [FAIL_AFFINITY] * 4
    listed = PodAffinity(required=(PodAffinityTerm(sel(app="db"), ZONE, frozenset({"data"})),))
    assert codes(pod("web", affinity=listed), index, domains)[:3] == [PASS, PASS, FAIL_AFFINITY]
    every_ns = PodAffinity(required=(PodAffinityTerm(sel(app="db"), ZONE, frozenset(), EVERYTHING),))
    assert codes(pod("web", affinity=every_ns), index, domains)[:3] == [PASS, PASS, FAIL_AFFINITY]
    team = PodAffinity(required=(PodAffinityTerm(sel(app="db"), ZONE, frozenset(), sel(team="ml")),))
    assert codes(pod("web", affinity=team), index, domains, {"data": {"team": "ml"}})[:3] == [
        PASS,
        PASS,
        FAIL_AFFINITY,
    ]
    assert codes(pod("web", affinity=team), index, domains, {"data": {"team": "web"}}) == [FAIL_AFFINITY] * 4
    assert codes(pod("web", affinity=team), index, domains) == [FAIL_AFFINITY] * 4  # labels unknown


def test_terminating_pods_still_count_and_exclude_removes_pods() -> None:
    web = PodAffinity(required_anti=(pod_term(HOST, app="web"),))
    index, domains = cluster([(PodFacts("old", "default", {"app": "web"}, terminating=True), 0)])
    assert codes(pod("new", affinity=web, app="web"), index, domains)[0] == FAIL_ANTI_AFFINITY
    assert codes(pod("new", affinity=web, app="web"), index, domains, exclude={"old"})[0] == PASS


def test_pod_index_add_replace_remove() -> None:
    anti = PodAffinity(required_anti=(pod_term(HOST, app="x"),))
    index = PodIndex(2)
    index.add(pod("p", affinity=anti), 0)
    assert index.node_of == {"p": 0} and "p" in index.with_affinity and "p" in index.with_required_anti
    index.add(pod("p"), 1)  # re-placed without rules
    assert index.node_of == {"p": 1} and not index.by_node[0] and "p" in index.by_node[1]
    assert not index.with_affinity and not index.with_required_anti and len(index) == 1
    assert index.remove("p") == 1 and index.remove("p") is None and len(index) == 0


def test_counts_are_keyed_by_domain() -> None:
    index, domains = cluster([(pod("a", app="db"), 0), (pod("b", app="db"), 1), (pod("c", app="db"), 2)])
    rules = PodAffinity(required=(pod_term(ZONE, app="db"),), required_anti=(pod_term(HOST, app="db"),))
    counts = interpod_counts(pod("x", affinity=rules), index, domains, {})
    assert counts.affinity == {(ZONE, "a"): 2, (ZONE, "b"): 1}
    assert counts.anti == {(HOST, "a1"): 1, (HOST, "a2"): 1, (HOST, "b1"): 1}
    assert not counts.existing_anti


def test_node_domains() -> None:
    domains = NodeDomains(NAMES, LABELS)
    assert domains.codes(ZONE).tolist() == [0, 0, 1, -1]
    assert domains.code(ZONE, "b") == 1 and domains.code(ZONE, "z") == -1
    assert domains.in_domains(ZONE, ["b", "z"], ALL).tolist() == [False, False, True, False]
    assert domains.in_domains(ZONE, ["z"], ALL).tolist() == [False] * 4
    assert domains.codes("absent").tolist() == [-1] * 4
    with pytest.raises(ValueError):
        NodeDomains(["a"], [])


# -- inter-pod affinity: scores -----------------------------------------------------------------


def weighted(weight: int, key: str, **labels: str) -> WeightedPodAffinityTerm:
    return WeightedPodAffinityTerm(weight, pod_term(key, **labels))


def test_preferred_affinity_and_anti_affinity_scores() -> None:
    index, domains = cluster([(pod("db", app="db"), 0), (pod("web", app="web"), 2)])
    rules = PodAffinity(
        preferred=(weighted(80, ZONE, app="db"),), preferred_anti=(weighted(20, HOST, app="web"),)
    )
    incoming = pod("x", affinity=rules)
    topo = interpod_topology_score(incoming, index, domains, {})
    assert topo == {(ZONE, "a"): 80, (HOST, "b1"): -20}
    # raw: a1 80, a2 80, b1 -20, nolabel 0 -> int(100 * (s - min) / (max - min))
    assert interpod_scores(incoming, index, domains, {}, ALL).tolist() == [100, 100, 0, 20]
    # normalised over the nodes given: b1 and nolabel only
    assert interpod_scores(incoming, index, domains, {}, np.array([2, 3])).tolist() == [0, 100]


def test_scores_truncate_like_go() -> None:
    index, domains = cluster([(pod("db", app="db"), 0), (pod("db2", app="db"), 2)])
    rules = PodAffinity(preferred=(weighted(1, HOST, app="db"), weighted(2, ZONE, app="db")))
    # raw a1 3, a2 2, b1 3, nolabel 0 -> a2: int(100 * 2/3) = 66
    assert interpod_scores(pod("x", affinity=rules), index, domains, {}, ALL).tolist() == [100, 66, 100, 0]


def test_existing_pods_terms_attract_and_repel_the_incoming_pod() -> None:
    hard = PodAffinity(required=(pod_term(ZONE, app="web"),))
    soft = PodAffinity(
        preferred=(weighted(5, HOST, app="web"),), preferred_anti=(weighted(7, ZONE, app="web"),)
    )
    index, domains = cluster([(pod("needs-web", affinity=hard), 0), (pod("mixed", affinity=soft), 2)])
    web = pod("w", app="web")
    # needs-web: +1 (hard weight) in zone a; mixed: +5 on b1, -7 in zone b
    assert interpod_topology_score(web, index, domains, {}) == {
        (ZONE, "a"): 1,
        (HOST, "b1"): 5,
        (ZONE, "b"): -7,
    }
    # raw a1 1, a2 1, b1 5 - 7 = -2, nolabel 0 -> nolabel int(100 * 2 / 3)
    assert interpod_scores(web, index, domains, {}, ALL).tolist() == [100, 100, 0, 66]
    assert interpod_topology_score(web, index, domains, {}, hard_weight=0) == {
        (HOST, "b1"): 5,
        (ZONE, "b"): -7,
    }
    assert interpod_topology_score(pod("o", app="other"), index, domains, {}) is None
    assert interpod_scores(pod("o", app="other"), index, domains, {}, ALL).tolist() == [0, 0, 0, 0]


def test_scores_all_zero_when_nothing_differs() -> None:
    index, domains = cluster([(pod("db", app="db"), 3)])  # on the node without labels for the key
    rules = PodAffinity(preferred=(weighted(50, ZONE, app="db"),))
    assert interpod_scores(pod("x", affinity=rules), index, domains, {}, ALL).tolist() == [0, 0, 0, 0]
    index.add(pod("db2", app="db"), 0)
    index.add(pod("db3", app="db"), 2)  # zones a and b equally attractive, nolabel not
    assert interpod_scores(pod("x", affinity=rules), index, domains, {}, np.array([0, 2])).tolist() == [0, 0]
    assert interpod_scores(pod("x", affinity=rules), index, domains, {}, ALL).tolist() == [100, 100, 100, 0]
    assert interpod_scores(pod("x", affinity=rules), index, domains, {}, ALL, exclude={"db2"}).tolist() == [
        0,
        0,
        100,
        0,
    ]


def test_no_rules_anywhere_costs_nothing() -> None:
    index, domains = cluster([(pod("a", app="db"), 0)])
    plain = pod("x", app="db")
    assert interpod_filter(plain, index, domains, {}, ALL).tolist() == [PASS] * 4
    assert interpod_scores(plain, index, domains, {}, ALL).tolist() == [0, 0, 0, 0]


def test_requirement_str() -> None:
    assert str(req("zone", "In", "b", "a")) == "zone In [a,b]"
    assert str(req("zone", "Exists")) == "zone Exists"
    assert Op("Gt") is Op.GT


def test_pods_are_looked_up_by_the_terms_namespaces() -> None:
    likes_web = PodAffinity(preferred=(weighted(3, HOST, ns="b", app="web"),))
    index, domains = cluster(
        [(pod("db-a", ns="a", app="db"), 0), (pod("db-b", ns="b", affinity=likes_web, app="db"), 2)]
    )
    assert set(index.by_namespace) == {"a", "b"}
    in_a = PodAffinityTerm(sel(app="db"), ZONE, frozenset({"a"}))
    assert set(index.selectable([in_a])) == {"db-a"}
    both = PodAffinityTerm(sel(app="db"), ZONE, frozenset({"a", "b"}))
    assert set(index.selectable([both])) == {"db-a", "db-b"}
    by_label = PodAffinityTerm(sel(app="db"), ZONE, frozenset(), EVERYTHING)
    assert index.selectable([in_a, by_label]) is index.facts
    assert index.selectable([PodAffinityTerm(sel(app="db"), ZONE, frozenset({"none"}))]) == {}
    # the incoming web pod of namespace b prefers db pods of namespace a (zone a, +5), and db-b
    # (placed, namespace b) prefers web pods of its namespace on its host b1 (+3)
    rules = PodAffinity(preferred=(WeightedPodAffinityTerm(5, in_a),))
    web = pod("w", ns="b", affinity=rules, app="web")
    assert interpod_topology_score(web, index, domains, {}) == {(ZONE, "a"): 5, (HOST, "b1"): 3}
    index.remove("db-b")
    assert set(index.by_namespace) == {"a"} and index.in_namespace("b") == {}
    assert interpod_topology_score(web, index, domains, {}) == {(ZONE, "a"): 5}
