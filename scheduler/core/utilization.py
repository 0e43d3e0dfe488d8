"""Utilisation-aware scores: a node's static score, its live utilisation, its allocation after the pod.

``UtilizationScore`` is the ``utilization`` policy's one plugin (docs/utilisation.md, "Scoring"):

    score = 0.2 x S + 0.5 x L + 0.3 x A        (each part 0..100, so the score is 0..100)

- ``S``, the static score: the node's ``kubegpu.io/static-score`` label (0..100, 100 without it);
- ``L``, live: ``100 - U``, ``U`` the utilisation (percent, the node agent's moving average) of
  the GPUs concerned: for a share, the GPU it would share; for any other pod, the mean over the
  node's healthy GPUs (0 for a node without GPUs). A GPU whose utilisation is unknown, stale
  included, counts as ``UNKNOWN_UTILIZATION`` (100 %): a node never gains by not reporting;
- ``A``, allocation after placing the pod: ``100 x (1 - (c + g) / 2)``, ``c`` the share of the
  node's CPU booked once the pod is placed, ``g`` that of its GPU milli (for a share: of the GPU it
  would take); a node without GPUs counts ``c`` alone. Least allocated wins, as kube-scheduler's
  LeastAllocated.

A share is scored per GPU it fits, the node by its best GPU, and takes that GPU (the lowest index
among equals). ``LiveUtilizationScore`` is ``L`` alone at node level: what the ``utilizationWeight``
setting adds to another policy, whose own plugins keep choosing a share's GPU.

Everything is a few vector operations over the candidate nodes (``[n, G]`` for shares), on the
arrays ``ClusterState.set_live`` keeps; no clock is read here (staleness is the caller's).
"""

from __future__ import annotations

import numpy as np

from scheduler.core.request import MILLI, PodRequest
from scheduler.core.scoring import ScorePlugin
from scheduler.core.state import ClusterState

STATIC_WEIGHT = 0.2
LIVE_WEIGHT = 0.5
ALLOCATION_WEIGHT = 0.3


class UtilizationScore(ScorePlugin):
    """``static x S + live x L + allocation x A`` (module docstring); shares per GPU."""

    name = "utilization"

    def __init__(
        self, static: float = STATIC_WEIGHT, live: float = LIVE_WEIGHT, allocation: float = ALLOCATION_WEIGHT
    ) -> None:
        self.static = static
        self.live = live
        self.allocation = allocation

    @staticmethod
    def _cpu_after(pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        """Per node, the share (0..1) of its CPU booked once the pod is placed."""
        capacity = cluster.cpu_capacity[idx]
        booked = capacity - cluster.cpu_free[idx] + pod.cpu_milli
        return np.clip(booked / np.maximum(capacity, 1), 0.0, 1.0)

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        if pod.is_share:
            return self._share_scores(pod, cluster, idx).max(axis=1)
        cpu = self._cpu_after(pod, cluster, idx)
        gpus = cluster.gpu_count[idx] * MILLI
        booked = gpus - cluster.gpu_free_total[idx] + pod.total_gpu_milli
        gpu = np.clip(booked / np.maximum(gpus, 1), 0.0, 1.0)
        allocated = np.where(gpus > 0, (cpu + gpu) / 2, cpu)
        return (
            self.static * cluster.static_score[idx]
            + self.live * (100.0 - cluster.node_util[idx])
            + self.allocation * 100.0 * (1.0 - allocated)
        )

    def _share_scores(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        """``[n, G]``: the score of the share on each GPU of the nodes ``idx``, -inf where it does not fit."""
        view = cluster.share_view(pod)
        fits = view.fits[idx]
        gpu = (MILLI - np.clip(view.left[idx], 0, MILLI)) / MILLI  # the GPU's share booked after it
        cpu = self._cpu_after(pod, cluster, idx)
        allocated = (cpu[:, None] + gpu) / 2
        scores = (
            (self.static * cluster.static_score[idx])[:, None]
            + self.live * (100.0 - cluster.gpu_busy[idx])
            + self.allocation * 100.0 * (1.0 - allocated)
        )
        return np.where(fits, scores, -np.inf)

    def share_gpu(self, pod: PodRequest, cluster: ClusterState, i: int) -> int | None:
        if not pod.is_share:
            return None
        row = self._share_scores(pod, cluster, np.array([i]))[0]
        best = int(np.argmax(row))  # the first of equal best scores: the lowest index
        return best if np.isfinite(row[best]) else None


class LiveUtilizationScore(ScorePlugin):
    """``L`` alone, per node: ``100 -`` the mean utilisation of its healthy GPUs (unknown: 100 %)."""

    name = "live-utilization"

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        return 100.0 - cluster.node_util[idx]
