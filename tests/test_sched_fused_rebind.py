"""A tie-breaker asked about a cluster of another size than the one it was bound to.

``AlignmentScore._node_states`` binds afresh when the cluster's size is not the one bound. In a
``ReserveThenAlign`` that called the subclass's ``bind`` with an empty workload, half way through a
decision: ``pick_tied`` had taken the reserve's penalty with the workload's shapes, then (in
``_fused_keys``) read the share remainders of an empty workload's table, while ``score`` takes every
term before the rebind. The two then picked different nodes for a plain share, and every later decision
ran without the reserve's shapes and the workload's remainders. Checked here: ``pick_tied`` against
``score`` then ``pick`` of a twin bound the same way, on the first and on later decisions; and a walk
over two clusters in turn against a twin with nothing kept (``fresh``: the plain computation, where the
walks of ``test_sched_fused_paths`` compare with ``score`` over the same kept tables), which also fails
when ``_follow`` leaves the node states' ids or the reserve's host flags behind.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest

from scheduler.core import state
from scheduler.core.filters import run_filters
from scheduler.core.policies import GpuStateValues, ReserveThenAlign
from scheduler.core.schedule import pick
from scheduler.core.state import ClusterState, LiveGpu
from tests.test_sched_fused_paths import PODS, WORKLOAD, cluster_of, random_change

SHARES = [p for p in PODS if p.is_share and not p.gpu_models]


def bound(cluster: object) -> ReserveThenAlign:
    tie_break = ReserveThenAlign(0.2, keep=3, waste_band=10)
    tie_break.bind(cluster, WORKLOAD, random.Random(0))  # type: ignore[arg-type]
    return tie_break


def test_pick_tied_on_a_cluster_of_another_size_is_scores_pick() -> None:
    checked = 0
    for seed in range(40):
        rng = random.Random(seed)
        small = cluster_of(rng.randint(10, 30), rng)
        large = cluster_of(len(small) + rng.randint(1, 10), rng)
        for k in range(200):
            random_change(large, rng, k)
        large.set_tie_order(rng.sample(range(len(large)), len(large)))
        fused, plain = bound(small), bound(small)
        shapes = list(fused.reserve.shapes)
        for look in range(3):  # the first decision (the rebind inside it) and later ones
            pod = SHARES[(seed + look) % len(SHARES)]
            idx, _ = run_filters(pod, large, explain=False)
            if len(idx) < 2:
                continue
            expected, _ = pick(idx, plain.score(pod, large, idx), random.Random(0), large.tie_rank)
            pos = fused.pick_tied(pod, large, idx)
            assert pos is not None and int(idx[pos]) == expected, (seed, look, pod.name)
            checked += 1
        assert fused.reserve.shapes == shapes  # the workload's whole-node shapes are not forgotten
        assert np.array_equal(fused.waste, plain.waste)
    assert checked > 60


def fresh(tie_break: ReserveThenAlign) -> ReserveThenAlign:
    """A twin of ``tie_break`` in its state but with nothing kept: no node states, key or band tables,
    remainders or host table (what ``score`` then works out is the plain computation)."""
    twin = copy.copy(tie_break)
    twin._states, twin._order = None, None
    twin._wasted, twin._remainders_of = GpuStateValues(), (None, {})
    twin.reserve = copy.copy(tie_break.reserve)
    twin.reserve._table = None
    return twin


def health_flip(cluster: ClusterState, rng: random.Random) -> None:
    """A node's live report takes some of its GPUs out of placement (or puts them back)."""
    node = cluster.nodes[rng.randrange(len(cluster))]
    cluster.set_live(node.name, {g.id: LiveGpu(unfit="xid" if rng.random() < 0.3 else "") for g in node.gpus})


def test_pick_tied_follows_clusters_it_alternates_between(monkeypatch: pytest.MonkeyPatch) -> None:
    """One tie-breaker asked about two clusters in turn (of one size or two, never bound to the
    second), each changing between looks (placements, releases, GPU health, bursts past the change log,
    a new node order): the node of ``pick_tied`` is the one ``score`` of a twin with nothing kept and
    ``pick`` take."""
    monkeypatch.setattr(state, "CHANGE_LOG", 8)  # bursts of changes pass the log
    counts = {"keys": 0, "declined": 0}
    for seed in range(24):
        rng = random.Random(seed)
        first = cluster_of(rng.randint(10, 30), rng)
        second = cluster_of(len(first) + (rng.randint(1, 8) if seed % 2 else 0), rng)
        clusters = [first, second]
        tie_break = ReserveThenAlign(
            rng.choice((0.2, 0.0)), keep=rng.choice((3, None)), waste_band=10, adaptive=rng.random() < 0.5
        )
        tie_break.bind(first, WORKLOAD, random.Random(0))
        for step in range(60):
            cluster = clusters[rng.randrange(2)]
            if cluster.tie_rank is None or rng.random() < 0.05:
                cluster.set_tie_order(rng.sample(range(len(cluster)), len(cluster)))
            for k in range(rng.choice((0, 1, 3, 40))):
                if rng.random() < 0.1:
                    health_flip(cluster, rng)
                else:
                    random_change(cluster, rng, step * 1000 + k)
            pod = PODS[rng.randrange(len(PODS))]
            tie_break.observe(pod)
            idx, _ = run_filters(pod, cluster, explain=False)
            if len(idx) < 2:
                continue
            expected, _ = pick(
                idx, fresh(tie_break).score(pod, cluster, idx), random.Random(0), cluster.tie_rank
            )
            pos = tie_break.pick_tied(pod, cluster, idx)
            if pos is None:
                counts["declined"] += 1
                continue
            assert int(idx[pos]) == expected, (seed, step, pod.name)
            counts["keys"] += 1
    assert counts["keys"] > 500, counts
