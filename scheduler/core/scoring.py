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

    def share_gpu(self, pod: PodRequest, cluster: ClusterState, i: int) -> int | None:
        order = self.__dict__.get("_by_weight")  # the plugins, heaviest first (kept per plugins tuple)
        if order is None or order[0] is not self.plugins:
            order = self.__dict__["_by_weight"] = (self.plugins, sorted(self.plugins, key=lambda pw: -pw[1]))
        for plugin, _ in order[1]:
            choice = plugin.share_gpu(pod, cluster, i)
            if choice is not None:
                return choice
        return None
