"""A tie-breaker asked about a cluster of another size than the one it was bound to.

``AlignmentScore._node_states`` binds afresh when the cluster's size is not the one bound. In a
``ReserveThenAlign`` that called the subclass's ``bind`` with an empty workload, half way through a
decision: ``pick_tied`` had taken the reserve's penalty with the workload's shapes, then (in
``_fused_keys``) read the share remainders of an empty workload's table, while ``score`` takes every
term before the rebind. The two then picked different nodes for a plain share, and every later decision
ran without the reserve's shapes and the workload's remainders. Checked here: ``pick_tied`` against
``score`` then ``pick`` of a twin bound the same way, on the first and on later decisions.
"""

from __future__ import annotations

import random

import numpy as np

from scheduler.core.filters import run_filters
from scheduler.core.policies import ReserveThenAlign
from scheduler.core.schedule import pick
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
