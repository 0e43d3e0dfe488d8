"""Score plugins and policies.

A ``ScorePlugin`` scores an array of feasible nodes for one pod (higher is better) and may choose
which GPU a sharing pod gets on the chosen node. A ``Policy`` is a weighted set of plugins (often a
single one): the node score is the weighted sum and the best node wins. Among equal best scores an
optional ``tie_break`` plugin decides (scored only on the tied nodes); what is still tied goes to
the cluster's node order or at random (``schedule.pick``). The share's GPU is chosen by the
heaviest plugin that has an opinion (best fit otherwise). ``bind`` hands plugins the cluster, the
expected workload and a random source before the first pod (FGD derives its typical pods from the
workload).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.core.request import PodRequest
from scheduler.core.state import ClusterState

_largest = np.maximum.reduce  # ndarray.max without its Python wrapper
_least = np.minimum.reduce
EXACT_SUMS = 2.0**40  # Policy.best_scores narrows only below this: a float step there is 2**-12


class ScorePlugin:
    """Base class of the scoring plugins."""

    name = "plugin"

    def bind(self, cluster: ClusterState, workload: Sequence[PodRequest], rng: random.Random) -> None:
        """Prepare for a cluster and its expected workload (default: nothing)."""

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        """Scores (float, higher better) of the nodes ``idx``, all of which can take ``pod``."""
        raise NotImplementedError

    def share_gpu(self, pod: PodRequest, cluster: ClusterState, i: int) -> int | None:
        """The GPU index a sharing pod should get on node ``i``; None: no opinion (best fit)."""
        return None

    def bounds(self) -> tuple[float, float] | None:
        """The least and the largest score this plugin ever gives, whatever the pod and the cluster
        (``Policy.best_scores`` leaves out nodes that cannot reach the best); None (the default): no
        bound is promised."""
        return None

    def pick_tied(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> int | None:
        """As a tie-breaker: the position in ``idx`` of the node that ``score`` and then the cluster's
        node order pick (``schedule.pick`` with ``cluster.tie_rank``), when the plugin can tell it
        without the scores; None (the default): it cannot, the caller scores and picks."""
        return None

    def applies(self, pod: PodRequest) -> bool:
        """False when ``score`` is 0 on every node for ``pod`` whatever the cluster (``Policy.score``
        then skips the plugin); default True."""
        return True

    def observe(self, pod: PodRequest) -> None:
        """A pod has arrived (before it is tried; placed or not), for plugins that adapt to the
        arrivals seen so far (default: nothing). Never called with a pod that has not arrived."""


@dataclass
class Policy:
    """A named, weighted set of score plugins."""

    name: str
    plugins: tuple[tuple[ScorePlugin, float], ...]
    description: str = ""
    tie_break: ScorePlugin | None = None

    def bind(
        self, cluster: ClusterState, workload: Sequence[PodRequest], rng: random.Random | None = None
    ) -> None:
        """Prepare every plugin for ``cluster`` and the expected ``workload``."""
        rng = rng or random.Random()
        for plugin, _ in self.plugins:
            plugin.bind(cluster, workload, rng)
        if self.tie_break is not None:
            self.tie_break.bind(cluster, workload, rng)

    def observe(self, pod: PodRequest) -> None:
        """Tell every plugin (and the tie-breaker) that ``pod`` has arrived."""
        for plugin, _ in self.plugins:
            plugin.observe(pod)
        if self.tie_break is not None:
            self.tie_break.observe(pod)

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        """The weighted sum of the plugins' scores, in plugin order; plugins that do not apply to the
        pod (0 everywhere) are left out, which changes no sum."""
        plugins: Sequence[tuple[ScorePlugin, float]] = self.plugins
        if len(plugins) > 1:
            plugins = [pw for pw in plugins if pw[0].applies(pod)]
        if len(plugins) == 1:
            plugin, weight = plugins[0]
            return (
                plugin.score(pod, cluster, idx) * weight if weight != 1 else plugin.score(pod, cluster, idx)
            )
        if not plugins:
            return np.zeros(len(idx))
        (first, weight), *rest = plugins
        # a new float array, as 0 + it would be (the same sums)
        total = np.multiply(weight, first.score(pod, cluster, idx), dtype=np.float64)
        for plugin, weight in rest:
            part = plugin.score(pod, cluster, idx)
            total += part if weight == 1 else weight * part
        return total

    def best_scores(
        self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The nodes of ``idx`` (in their order) that may score best and their ``score`` (the same
        values): every node when the plugins after the first applicable one do not all promise
        ``bounds``; else only the nodes whose first score, weighted, is within the others' weighted
        span (plus a margin of 1) of the largest first score. Those are scored by the others, and the
        rest are left out only when the best of these is above what any of the rest could reach (below
        that margin plus the others' largest; else every node is scored), and only while the largest
        first score and the others' span are below ``EXACT_SUMS`` (beyond, float sums round by more
        than the margins). So the best score and the nodes that have it are ``score``'s."""
        plugins: Sequence[tuple[ScorePlugin, float]] = self.plugins
        if len(plugins) > 1:
            plugins = [pw for pw in plugins if pw[0].applies(pod)]
        if len(plugins) == 1:  # as score with the one plugin that applies
            plugin, weight = plugins[0]
            return idx, (
                plugin.score(pod, cluster, idx) * weight if weight != 1 else plugin.score(pod, cluster, idx)
            )
        if len(plugins) < 2 or len(idx) < 2:
            return idx, self.score(pod, cluster, idx)
        low = high = 0.0  # the least and the largest the other plugins' weighted sum can be
        for plugin, weight in plugins[1:]:
            bounds = plugin.bounds()
            if bounds is None or weight < 0 or not bounds[0] <= bounds[1]:  # no promise (or no range)
                return idx, self.score(pod, cluster, idx)
            low += weight * bounds[0]
            high += weight * bounds[1]
        (first, weight), *rest = plugins
        total = np.multiply(weight, first.score(pod, cluster, idx), dtype=np.float64)  # as score
        top = float(_largest(total))
        near = top - (high - low) - 1.0  # below it: at most top + low - 1 with the others
        # every node can (or a NaN: every node is kept); or the sums are so large that their float
        # rounding may pass the margins of 1 and 0.5 (a node left out could tie with the best)
        if not (_least(total) < near and abs(top) + (high - low) < EXACT_SUMS):
            kept = idx
        else:
            keep = (total >= near).nonzero()[0]
            kept, total = idx.take(keep), total.take(keep)
        for plugin, weight in rest:
            part = plugin.score(pod, cluster, kept)
            total += part if weight == 1 else weight * part
        # every node left out scores below near + high; the best kept, by the bounds, at least top + low
        if kept is not idx and not float(_largest(total)) > near + high + 0.5:
            return idx, self.score(pod, cluster, idx)  # the others' scores were below their bounds
        return kept, total

    def share_gpu(self, pod: PodRequest, cluster: ClusterState, i: int) -> int | None:
        order = self.__dict__.get("_by_weight")  # the plugins, heaviest first (kept per plugins tuple)
        if order is None or order[0] is not self.plugins:
            order = self.__dict__["_by_weight"] = (self.plugins, sorted(self.plugins, key=lambda pw: -pw[1]))
        for plugin, _ in order[1]:
            choice = plugin.share_gpu(pod, cluster, i)
            if choice is not None:
                return choice
        return None
