"""Pod topology spread constraints, with kube-scheduler's PodTopologySpread semantics.

A constraint counts, per domain of its topology key, the placed pods of the incoming pod's
namespace that its label selector matches (terminating pods excluded). Only *eligible* nodes
contribute domains: nodes that have the labels of every constraint of the same kind (hard or
soft), that match the pod's node affinity and node selector (``nodeAffinityPolicy: Honor``, the
default) and, with ``nodeTaintsPolicy: Honor`` (default Ignore), whose NoSchedule/NoExecute taints
the pod tolerates.

**Filter** (``whenUnsatisfiable: DoNotSchedule``). In constraint order, a node fails when it lacks
the topology key (``... (missing required label)``), or when ``count(node's domain) + (1 if the
pod matches the selector) - min`` exceeds ``maxSkew``; ``min`` is the smallest count over the
eligible domains, or 0 when there are fewer than ``minDomains`` of them.

**Score** (``ScheduleAnyway``). Feasible nodes lacking a key score 0. Each other node gets, per
constraint, ``count * log(domains + 2) + maxSkew - 1`` (``count``: the pods of its domain, or for
``kubernetes.io/hostname`` of the node itself; ``domains``: the distinct domains among the
feasible nodes, or their number for hostname), summed and rounded, then normalised to
``100 * (max + min - s) // max`` (100 for all when max is 0): fewer matching pods, higher score.

``matchLabelKeys`` are merged into the selector when the constraint is parsed (as the API server
does); system-default spreading (from Services and ReplicaSets) is not applied.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.core.affinity import MAX_NODE_SCORE, NodeDomains, PodIndex
from scheduler.core.selectors import LabelSelector

HOSTNAME_KEY = "kubernetes.io/hostname"
SPREAD_REASON = "node(s) didn't match pod topology spread constraints"
MISSING_LABEL_REASON = SPREAD_REASON + " (missing required label)"
PASS, FAIL_MISSING_LABEL, FAIL_SKEW = 0, 1, 2
SPREAD_REASONS = {FAIL_MISSING_LABEL: MISSING_LABEL_REASON, FAIL_SKEW: SPREAD_REASON}
MAX_INT32 = (1 << 31) - 1


@dataclass(frozen=True)
class SpreadConstraint:
    """One ``topologySpreadConstraints`` entry (``hard``: ``whenUnsatisfiable: DoNotSchedule``)."""

    max_skew: int
    topology_key: str
    selector: LabelSelector
    hard: bool = True
    min_domains: int = 1
    honor_node_affinity: bool = True
    honor_taints: bool = False


def node_match_counts(
    selector: LabelSelector,
    namespace: str,
    index: PodIndex,
    n_nodes: int,
    exclude: Collection[str] = (),
    me: str = "",
) -> np.ndarray:
    """Per node, the placed non-terminating pods of ``namespace`` that ``selector`` matches
    (other than ``me`` and those in ``exclude``)."""
    counts = np.zeros(n_nodes, dtype=np.int64)
    if selector.nothing:
        return counts
    for pod, node in index.placed(index.candidates(selector, index.in_namespace(namespace)), exclude, me):
        if pod.namespace != namespace:
            continue
        if not pod.terminating and selector.matches(pod.labels):
            counts[node] += 1
    return counts


def _eligible(
    c: SpreadConstraint, has_keys: np.ndarray, affinity_ok: np.ndarray | None, taints_ok: np.ndarray | None
) -> np.ndarray:
    ok = has_keys.copy()
    if c.honor_node_affinity and affinity_ok is not None:
        ok &= affinity_ok
    if c.honor_taints and taints_ok is not None:
        ok &= taints_ok
    return ok


def _has_keys(constraints: Sequence[SpreadConstraint], domains: NodeDomains) -> np.ndarray:
    ok = np.ones(len(domains), dtype=bool)
    for c in constraints:
        ok &= domains.codes(c.topology_key) >= 0
    return ok


def spread_filter(
    namespace: str,
    labels: Mapping[str, str],
    constraints: Sequence[SpreadConstraint],
    index: PodIndex,
    domains: NodeDomains,
    idx: np.ndarray,
    affinity_ok: np.ndarray | None = None,
    taints_ok: np.ndarray | None = None,
    exclude: Collection[str] = (),
    uid: str = "",
) -> np.ndarray:
    """Per node of ``idx``: ``PASS``, ``FAIL_MISSING_LABEL`` or ``FAIL_SKEW`` (``SPREAD_REASONS``).

    ``affinity_ok`` / ``taints_ok`` (over all nodes): which nodes match the pod's required node
    affinity and selector, and which have only taints it tolerates (None: all). ``uid``: the
    incoming pod's, which never counts should the index already hold it.
    """
    out = np.zeros(len(idx), dtype=np.int8)
    hard = [c for c in constraints if c.hard]
    if not hard:
        return out
    n = len(domains)
    has_keys = _has_keys(hard, domains)
    for c in hard:
        codes = domains.codes(c.topology_key)
        eligible = _eligible(c, has_keys, affinity_ok, taints_ok)
        per_node = node_match_counts(c.selector, namespace, index, n, exclude, uid)
        n_values = int(codes.max()) + 1 if n else 0
        totals = np.bincount(codes[eligible], weights=per_node[eligible], minlength=n_values).astype(np.int64)
        present = np.bincount(codes[eligible], minlength=n_values) > 0
        n_domains = int(present.sum())
        low = int(totals[present].min()) if n_domains else MAX_INT32
        if n_domains < c.min_domains:
            low = 0
        own = 1 if c.selector.matches(labels) else 0
        mine = codes[idx]
        undecided = out == PASS
        missing = undecided & (mine < 0)
        out[missing] = FAIL_MISSING_LABEL
        labelled = undecided & (mine >= 0)
        if n_values:
            skew = totals[np.where(mine >= 0, mine, 0)] + own - low
            out[labelled & (skew > c.max_skew)] = FAIL_SKEW
    return out


def spread_scores(
    namespace: str,
    constraints: Sequence[SpreadConstraint],
    index: PodIndex,
    domains: NodeDomains,
    idx: np.ndarray,
    affinity_ok: np.ndarray | None = None,
    taints_ok: np.ndarray | None = None,
    exclude: Collection[str] = (),
    uid: str = "",
) -> np.ndarray:
    """Normalised PodTopologySpread scores (0..100) of the feasible nodes ``idx`` (``uid``: the
    incoming pod's, never counted)."""
    soft = [c for c in constraints if not c.hard]
    if not soft or not len(idx):
        return np.zeros(len(idx))
    n = len(domains)
    has_keys = _has_keys(soft, domains)
    scored = has_keys[idx]  # feasible nodes lacking a key are ignored (score 0)
    n_scored = int(scored.sum())
    if not n_scored:
        return np.zeros(len(idx))
    raw = np.zeros(len(idx))
    for c in soft:
        codes = domains.codes(c.topology_key)
        per_node = node_match_counts(c.selector, namespace, index, n, exclude, uid)
        if c.topology_key == HOSTNAME_KEY:
            size = n_scored
            counts = per_node[idx].astype(np.float64)
        else:
            n_values = int(codes.max()) + 1
            present = np.zeros(n_values, dtype=bool)
            present[codes[idx][scored]] = True
            size = int(present.sum())
            eligible = _eligible(c, has_keys, affinity_ok, taints_ok)
            eligible &= present[np.where(codes >= 0, codes, 0)] & (codes >= 0)
            totals = np.bincount(codes[eligible], weights=per_node[eligible], minlength=n_values)
            counts = totals[np.where(codes[idx] >= 0, codes[idx], 0)]
        raw += counts * math.log(size + 2) + (c.max_skew - 1)
    # Go's math.Round (half away from zero; the scores are never negative)
    node_scores = np.where(raw - np.floor(raw) >= 0.5, np.ceil(raw), np.floor(raw)).astype(np.int64)
    out = np.zeros(len(idx))
    valid = node_scores[scored]
    low, high = int(valid.min()), int(valid.max())
    if high == 0:
        out[scored] = MAX_NODE_SCORE
    else:
        out[scored] = MAX_NODE_SCORE * (high + low - valid) // high
    return out
