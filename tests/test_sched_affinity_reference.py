"""The vectorised affinity and spread code against a per-node transcription of kube-scheduler's
plugins (InterPodAffinity, PodTopologySpread), on random clusters."""

from __future__ import annotations

import math
import random
from collections import defaultdict

import numpy as np
import pytest

from scheduler.core.affinity import (
    FAIL_AFFINITY,
    FAIL_ANTI_AFFINITY,
    FAIL_EXISTING_ANTI_AFFINITY,
    PASS,
    NodeDomains,
    PodAffinity,
    PodAffinityTerm,
    PodFacts,
    PodIndex,
    WeightedPodAffinityTerm,
    interpod_filter,
    interpod_scores,
)
from scheduler.core.selectors import EVERYTHING, LabelSelector, Op, Requirement
from scheduler.core.spread import (
    FAIL_MISSING_LABEL,
    FAIL_SKEW,
    SpreadConstraint,
    spread_filter,
    spread_scores,
)

KEYS = ["zone", "rack", "kubernetes.io/hostname"]
APPS = ["a", "b", "c"]
NAMESPACES = ["n1", "n2"]


def random_selector(rng: random.Random) -> LabelSelector:
    choice = rng.random()
    if choice < 0.1:
        return EVERYTHING
    if choice < 0.8:
        return LabelSelector((Requirement("app", Op.IN, frozenset({rng.choice(APPS)})),))
    return LabelSelector((Requirement("app", Op.NOT_IN, frozenset({rng.choice(APPS)})),))


def random_term(rng: random.Random, ns: str) -> PodAffinityTerm:
    namespaces = frozenset({ns}) if rng.random() < 0.7 else frozenset(rng.sample(NAMESPACES, 2))
    choice = rng.random()
    if choice < 0.1:
        selector, namespaces = EVERYTHING, frozenset()
    elif choice < 0.25:  # namespaces by their labels (the test's NS_LABELS)
        team = rng.choice(["x", "y"])
        selector, namespaces = LabelSelector((Requirement("team", Op.IN, frozenset({team})),)), frozenset()
    else:
        selector = LabelSelector(nothing=True)
    return PodAffinityTerm(random_selector(rng), rng.choice(KEYS), namespaces, selector)


def random_affinity(rng: random.Random, ns: str, p: float) -> PodAffinity:
    def terms(k: int) -> tuple[PodAffinityTerm, ...]:
        return tuple(random_term(rng, ns) for _ in range(k if rng.random() < p else 0))

    def weighted(k: int) -> tuple[WeightedPodAffinityTerm, ...]:
        return tuple(WeightedPodAffinityTerm(rng.randint(1, 100), t) for t in terms(k))

    return PodAffinity(terms(rng.randint(1, 2)), terms(1), weighted(2), weighted(2))


def random_world(seed: int) -> tuple[random.Random, NodeDomains, PodIndex]:
    rng = random.Random(seed)
    names, labels = [], []
    for i in range(rng.randint(1, 9)):
        name = f"node{i}"
        ls = {}
        if rng.random() < 0.85:
            ls["zone"] = rng.choice(["z1", "z2", "z3"])
        if rng.random() < 0.7:
            ls["rack"] = rng.choice(["r1", "r2"])
        if rng.random() < 0.9:
            ls["kubernetes.io/hostname"] = name
        names.append(name)
        labels.append(ls)
    domains = NodeDomains(names, labels)
    index = PodIndex(len(names))
    for k in range(rng.randint(0, 14)):
        ns = rng.choice(NAMESPACES)
        index.add(
            PodFacts(
                f"p{k}",
                ns,
                {"app": rng.choice(APPS)} if rng.random() < 0.9 else {},
                random_affinity(rng, ns, 0.2),
                terminating=rng.random() < 0.1,
            ),
            rng.randrange(len(names)),
        )
    return rng, domains, index


NS_LABELS = {"n1": {"team": "x"}, "n2": {"team": "y"}}


# -- a transcription of kube-scheduler's InterPodAffinity, node by node --------------------------


def ref_interpod_filter(pod: PodFacts, index: PodIndex, domains: NodeDomains) -> list[int]:
    affinity_counts: dict = defaultdict(int)
    anti_counts: dict = defaultdict(int)
    existing_counts: dict = defaultdict(int)
    req, anti = pod.affinity.required, pod.affinity.required_anti
    for uid, other in index.facts.items():
        node = domains.labels[index.node_of[uid]]
        ns = NS_LABELS.get(other.namespace)
        if req and all(t.matches(other.namespace, other.labels, ns) for t in req):
            for t in req:
                if t.topology_key in node:
                    affinity_counts[(t.topology_key, node[t.topology_key])] += 1
        for t in anti:
            if t.matches(other.namespace, other.labels, ns) and t.topology_key in node:
                anti_counts[(t.topology_key, node[t.topology_key])] += 1
        for t in other.affinity.required_anti:
            if t.matches(pod.namespace, pod.labels, NS_LABELS.get(pod.namespace)) and t.topology_key in node:
                existing_counts[(t.topology_key, node[t.topology_key])] += 1
    affinity_counts = {k: v for k, v in affinity_counts.items() if v}
    out = []
    for labels in domains.labels:
        pods_exist, has_all = True, True
        for t in req:
            if t.topology_key not in labels:
                has_all = False
                break
            if affinity_counts.get((t.topology_key, labels[t.topology_key]), 0) <= 0:
                pods_exist = False
        own = NS_LABELS.get(pod.namespace)
        if not has_all or (
            not pods_exist
            and not (not affinity_counts and all(t.matches(pod.namespace, pod.labels, own) for t in req))
        ):
            out.append(FAIL_AFFINITY)
        elif any(
            t.topology_key in labels and anti_counts.get((t.topology_key, labels[t.topology_key]), 0) > 0
            for t in anti
        ):
            out.append(FAIL_ANTI_AFFINITY)
        elif any(existing_counts.get((k, v), 0) > 0 for k, v in labels.items()):
            out.append(FAIL_EXISTING_ANTI_AFFINITY)
        else:
            out.append(PASS)
    return out


def ref_interpod_scores(pod: PodFacts, index: PodIndex, domains: NodeDomains, idx: list[int]) -> list[int]:
    topo: dict = defaultdict(lambda: defaultdict(int))
    touched = False
    own = NS_LABELS.get(pod.namespace)

    def process(term, weight, target, target_ns, node) -> None:
        nonlocal touched
        if term.matches(target.namespace, target.labels, target_ns) and term.topology_key in node:
            topo[term.topology_key][node[term.topology_key]] += weight
            touched = True

    for uid, other in index.facts.items():
        node = domains.labels[index.node_of[uid]]
        if not node:
            continue
        ns = NS_LABELS.get(other.namespace)
        for wt in pod.affinity.preferred:
            process(wt.term, wt.weight, other, ns, node)
        for wt in pod.affinity.preferred_anti:
            process(wt.term, -wt.weight, other, ns, node)
        for t in other.affinity.required:
            process(t, 1, pod, own, node)
        for wt in other.affinity.preferred:
            process(wt.term, wt.weight, pod, own, node)
        for wt in other.affinity.preferred_anti:
            process(wt.term, -wt.weight, pod, own, node)
    if not touched:
        return [0] * len(idx)
    raw = []
    for i in idx:
        labels = domains.labels[i]
        raw.append(sum(values.get(labels[k], 0) for k, values in topo.items() if k in labels))
    low, high = min(raw), max(raw)
    if high - low <= 0:
        return [0] * len(idx)
    return [int(100.0 * ((s - low) / float(high - low))) for s in raw]


@pytest.mark.parametrize("seed", range(150))
def test_interpod_matches_kube_scheduler(seed: int) -> None:
    rng, domains, index = random_world(seed)
    ns = rng.choice(NAMESPACES)
    pod = PodFacts("new", ns, {"app": rng.choice(APPS)}, random_affinity(rng, ns, 0.6))
    all_nodes = np.arange(len(domains))
    got = interpod_filter(pod, index, domains, NS_LABELS, all_nodes).tolist()
    assert got == ref_interpod_filter(pod, index, domains)
    feasible = [i for i in range(len(domains)) if rng.random() < 0.7] or [0]
    scores = interpod_scores(pod, index, domains, NS_LABELS, np.array(feasible)).tolist()
    assert scores == ref_interpod_scores(pod, index, domains, feasible)


# -- a transcription of kube-scheduler's PodTopologySpread, node by node -------------------------


def count_on(index: PodIndex, i: int, c: SpreadConstraint, ns: str) -> int:
    return sum(
        1
        for p in index.by_node[i].values()
        if p.namespace == ns and not p.terminating and c.selector.matches(p.labels)
    )


def ref_spread_filter(ns, labels, constraints, index, domains, affinity_ok, taints_ok) -> list[int]:
    hard = [c for c in constraints if c.hard]
    tp = [defaultdict(int) for _ in hard]
    for i, node in enumerate(domains.labels):
        if not all(c.topology_key in node for c in hard):
            continue
        for k, c in enumerate(hard):
            if (c.honor_node_affinity and not affinity_ok[i]) or (c.honor_taints and not taints_ok[i]):
                continue
            tp[k][node[c.topology_key]] += count_on(index, i, c, ns)
    out = []
    for node in domains.labels:
        result = PASS
        for k, c in enumerate(hard):
            if c.topology_key not in node:
                result = FAIL_MISSING_LABEL
                break
            low = min(tp[k].values()) if tp[k] else (1 << 31) - 1
            if len(tp[k]) < c.min_domains:
                low = 0
            own = 1 if c.selector.matches(labels) else 0
            if tp[k].get(node[c.topology_key], 0) + own - low > c.max_skew:
                result = FAIL_SKEW
                break
        out.append(result)
    return out


def ref_spread_scores(ns, constraints, index, domains, idx, affinity_ok, taints_ok) -> list[int]:
    soft = [c for c in constraints if not c.hard]
    if not soft:
        return [0] * len(idx)  # PreScore skips the plugin
    ignored = {i for i in idx if not all(c.topology_key in domains.labels[i] for c in soft)}
    counts: list[dict] = [{} for _ in soft]
    sizes = [0] * len(soft)
    for i in idx:
        if i in ignored:
            continue
        for k, c in enumerate(soft):
            if c.topology_key == "kubernetes.io/hostname":
                continue
            value = domains.labels[i][c.topology_key]
            if value not in counts[k]:
                counts[k][value] = 0
                sizes[k] += 1
    weights = []
    for k, c in enumerate(soft):
        size = len(idx) - len(ignored) if c.topology_key == "kubernetes.io/hostname" else sizes[k]
        weights.append(math.log(size + 2))
    for i, node in enumerate(domains.labels):
        if not all(c.topology_key in node for c in soft):
            continue
        for k, c in enumerate(soft):
            if (c.honor_node_affinity and not affinity_ok[i]) or (c.honor_taints and not taints_ok[i]):
                continue
            value = node[c.topology_key]
            if value in counts[k]:
                counts[k][value] += count_on(index, i, c, ns)
    raw = []
    for i in idx:
        if i in ignored:
            raw.append(None)
            continue
        score = 0.0
        for k, c in enumerate(soft):
            if c.topology_key == "kubernetes.io/hostname":
                cnt = count_on(index, i, c, ns)
            else:
                cnt = counts[k][domains.labels[i][c.topology_key]]
            score += cnt * weights[k] + (c.max_skew - 1)
        raw.append(math.floor(score + 0.5))
    valid = [s for s in raw if s is not None]
    if not valid:
        return [0] * len(idx)
    low, high = min(valid), max(valid)
    out = []
    for s in raw:
        if s is None:
            out.append(0)
        elif high == 0:
            out.append(100)
        else:
            out.append(100 * (high + low - s) // high)
    return out


def random_constraint(rng: random.Random, hard: bool) -> SpreadConstraint:
    return SpreadConstraint(
        rng.randint(1, 3),
        rng.choice(KEYS),
        random_selector(rng),
        hard,
        rng.choice([1, 1, 2, 4]) if hard else 1,
        rng.random() < 0.7,
        rng.random() < 0.3,
    )


@pytest.mark.parametrize("seed", range(150))
def test_spread_matches_kube_scheduler(seed: int) -> None:
    rng, domains, index = random_world(seed)
    n = len(domains)
    ns = rng.choice(NAMESPACES)
    constraints = [random_constraint(rng, rng.random() < 0.5) for _ in range(rng.randint(1, 3))]
    affinity_ok = np.array([rng.random() < 0.8 for _ in range(n)])
    taints_ok = np.array([rng.random() < 0.8 for _ in range(n)])
    labels = {"app": rng.choice(APPS)}
    got = spread_filter(
        ns, labels, constraints, index, domains, np.arange(n), affinity_ok, taints_ok
    ).tolist()
    assert got == ref_spread_filter(ns, labels, constraints, index, domains, affinity_ok, taints_ok)
    feasible = [i for i in range(n) if rng.random() < 0.7] or [n - 1]
    scores = spread_scores(
        ns, constraints, index, domains, np.array(feasible), affinity_ok, taints_ok
    ).tolist()
    assert scores == ref_spread_scores(ns, constraints, index, domains, feasible, affinity_ok, taints_ok)


def without(index: PodIndex, domains: NodeDomains, gone: set[str]) -> PodIndex:
    fresh = PodIndex(len(domains))
    for uid, pod in index.facts.items():
        if uid not in gone:
            fresh.add(pod, index.node_of[uid])
    return fresh


@pytest.mark.parametrize("seed", range(100))
def test_excluding_pods_is_removing_them(seed: int) -> None:
    """The pod-by-pod path (``exclude``, or the pod itself placed) agrees with the per-term path
    on an index that never held the excluded pods."""
    rng, domains, index = random_world(seed)
    ns = rng.choice(NAMESPACES)
    pod = PodFacts("new", ns, {"app": rng.choice(APPS)}, random_affinity(rng, ns, 0.6))
    nodes = np.arange(len(domains))
    gone = {uid for uid in index.facts if rng.random() < 0.3}
    fresh = without(index, domains, gone)
    for ghost in (gone, {"no-such-pod"}):
        expect = without(index, domains, ghost)
        assert (
            interpod_filter(pod, index, domains, NS_LABELS, nodes, ghost).tolist()
            == interpod_filter(pod, expect, domains, NS_LABELS, nodes).tolist()
        )
        assert (
            interpod_scores(pod, index, domains, NS_LABELS, nodes, exclude=ghost).tolist()
            == interpod_scores(pod, expect, domains, NS_LABELS, nodes).tolist()
        )
    assert interpod_filter(pod, fresh, domains, NS_LABELS, nodes).tolist() == ref_interpod_filter(
        pod, fresh, domains
    )
    # the incoming pod already in the index (a stale booking) counts as if it were not
    placed = without(index, domains, set())
    placed.add(pod, 0)
    assert interpod_filter(pod, placed, domains, NS_LABELS, nodes).tolist() == ref_interpod_filter(
        pod, index, domains
    )
    assert interpod_scores(pod, placed, domains, NS_LABELS, nodes).tolist() == ref_interpod_scores(
        pod, index, domains, list(range(len(domains)))
    )
    constraints = [random_constraint(rng, rng.random() < 0.5) for _ in range(2)]
    ok = np.ones(len(domains), dtype=bool)
    assert (
        spread_filter(ns, pod.labels, constraints, index, domains, nodes, ok, ok, gone).tolist()
        == spread_filter(ns, pod.labels, constraints, fresh, domains, nodes, ok, ok).tolist()
    )
    assert (
        spread_scores(ns, constraints, index, domains, nodes, ok, ok, gone).tolist()
        == spread_scores(ns, constraints, fresh, domains, nodes, ok, ok).tolist()
    )
