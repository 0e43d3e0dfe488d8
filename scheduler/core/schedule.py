"""One scheduling decision: filter the nodes, score the feasible ones, pick one, choose its devices.

``schedule_one`` is the single entry point the live scheduler, the extender and the simulator
share. It does not change the cluster: the caller books the returned ``Placement.allocation`` with
``ClusterState.assume`` (and releases it with ``forget``). The cost per pod is a few vector
operations over the nodes plus the policy's per-node work, which the policies memoise.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from scheduler.core.allocate import allocate
from scheduler.core.filters import (
    DEFAULT_FILTERS,
    FilterPlugin,
    pod_placement,
    run_filters,
    unschedulable_message,
)
from scheduler.core.request import PodRequest
from scheduler.core.scoring import Policy
from scheduler.core.state import Allocation, ClusterState

_largest = np.maximum.reduce


@dataclass(frozen=True)
class Placement:
    """The chosen node and devices for a pod."""

    node: str
    allocation: Allocation
    score: float
    feasible: int  # how many nodes passed the filters


@dataclass(frozen=True)
class Unschedulable:
    """No node fits; ``reasons`` counts nodes per reason (empty when not asked to explain)."""

    total_nodes: int
    reasons: Mapping[str, int] = field(default_factory=dict)

    def message(self) -> str:
        return unschedulable_message(self.total_nodes, self.reasons)


def pick(
    idx: np.ndarray, scores: np.ndarray, rng: random.Random, tie_rank: np.ndarray | None = None
) -> tuple[int, float]:
    """The index of a best-scoring node and its score.

    Equal best scores go to the node of lowest ``tie_rank`` when the cluster has one (a fixed node
    order), else to one of them uniformly at random (kube-scheduler's ``selectHost``).
    """
    if len(idx) == 1:
        return int(idx[0]), float(scores[0])
    best = scores.max()
    ties = np.flatnonzero(scores == best)
    if len(ties) == 1:
        pos = int(ties[0])
    elif tie_rank is not None:
        pos = int(ties[np.argmin(tie_rank[idx[ties]])])
    else:
        pos = int(ties[rng.randrange(len(ties))])
    return int(idx[pos]), float(best)


def schedule_one(
    pod: PodRequest,
    cluster: ClusterState,
    policy: Policy,
    rng: random.Random,
    *,
    filters: Sequence[FilterPlugin] = DEFAULT_FILTERS,
    explain: bool = True,
) -> Placement | Unschedulable:
    """Place one pod: its node and exact devices, or why no node fits (if ``explain``)."""
    idx, reasons = run_filters(pod, cluster, filters, explain)
    feasible = len(idx)
    if not feasible:
        return Unschedulable(len(cluster), dict(reasons))
    view = cluster.placement
    placement = pod_placement(pod) if view is not None and feasible > 1 else None
    if placement is not None and view is not None and view.scores_apply(placement):
        # node affinity, pod affinity, spread preferences
        scores = policy.score(pod, cluster, idx) + view.scores(placement, idx)
    else:  # only the nodes that can score best (every one of them)
        idx, scores = policy.best_scores(pod, cluster, idx)
    tie_break = policy.tie_break
    if tie_break is not None and len(idx) > 1:
        best = _largest(scores)  # scores.max() and np.flatnonzero without their Python wrappers
        tied = (scores == best).nonzero()[0]
        if len(tied) == 1:
            return _place(pod, cluster, policy, int(idx[tied[0]]), float(best), feasible)
        # only the tied nodes are scored by the tie-breaker
        among = idx.take(tied)
        pos = tie_break.pick_tied(pod, cluster, among) if cluster.tie_rank is not None else None
        if pos is None:
            i, _ = pick(among, tie_break.score(pod, cluster, among), rng, cluster.tie_rank)
        else:
            i = int(among[pos])
        return _place(pod, cluster, policy, i, float(best), feasible)
    i, score = pick(idx, scores, rng, cluster.tie_rank)
    return _place(pod, cluster, policy, i, score, feasible)


def place_on(pod: PodRequest, cluster: ClusterState, policy: Policy, i: int) -> Placement:
    """The pod's devices on node ``i``, which the caller has checked passes the filters (the gang
    planner's search tries nodes the policy did not pick first)."""
    return _place(pod, cluster, policy, i, 0.0, 1)


def _place(
    pod: PodRequest, cluster: ClusterState, policy: Policy, i: int, score: float, feasible: int
) -> Placement:
    """The allocation of ``pod`` on the chosen node ``i``."""
    share = policy.share_gpu(pod, cluster, i) if pod.is_share else None
    alloc = allocate(pod, cluster.nodes[i], share)
    if alloc is None:  # the filters passed, so this is a bug in a plugin or filter
        raise RuntimeError(f"pod {pod.name} passed the filters on {cluster.nodes[i].name} but does not fit")
    return Placement(cluster.nodes[i].name, alloc, score, feasible)
