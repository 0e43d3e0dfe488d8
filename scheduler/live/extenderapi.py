"""kube-scheduler's HTTP extender protocol, read and written as plain JSON (pure).

kube-scheduler (``k8s.io/kube-scheduler/extender/v1``) POSTs ``ExtenderArgs`` to the filter and
prioritize verbs (with ``nodeCacheCapable: true``: only ``NodeNames``, the extender knows the
nodes from its own cache) and ``ExtenderBindingArgs`` to the bind verb; it reads back
``ExtenderFilterResult`` (``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``,
``Error``), a ``HostPriorityList`` (``[{"Host", "Score"}]``, scores 0..``MAX_PRIORITY``) and an
``ExtenderBindingResult`` (``Error``). The preempt verb gets ``ExtenderPreemptionArgs`` (the pod
and, per candidate node, the victims kube-scheduler proposes: ``NodeNameToMetaVictims`` with
``nodeCacheCapable``, pod UIDs only, else ``NodeNameToVictims`` with whole pods) and answers an
``ExtenderPreemptionResult`` (always ``NodeNameToMetaVictims``). The v1 types carry no JSON tags,
so the keys are the Go field names. Malformed input raises ``ExtenderRequestError``, which the
server answers with 400 and the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_PRIORITY = 10  # kube-scheduler's extenderv1.MaxExtenderPriority
MAX_NODE_NAMES = 100_000
MAX_VICTIMS = 1_000_000  # victims over all nodes in one preempt request (110 pods on 5,000 nodes: 550,000)


class ExtenderRequestError(ValueError):
    """A request kube-scheduler would not send: the reason for the 400 answer."""


@dataclass(frozen=True)
class FilterArgs:
    """``ExtenderArgs``: the pod and the candidate node names."""

    pod: dict[str, Any]
    node_names: tuple[str, ...]
    names_only: bool  # the request named the nodes (NodeNames), rather than sending Node objects
    # the Node objects sent (the Nodes form only), in the order of ``node_names``: the answer
    # returns them whole, as kube-scheduler builds the NodeInfo it scores from the answer's objects
    items: tuple[dict[str, Any], ...] = ()

    @property
    def uid(self) -> str:
        return str((self.pod.get("metadata") or {}).get("uid") or "")


@dataclass(frozen=True)
class BindArgs:
    """``ExtenderBindingArgs``."""

    name: str
    namespace: str
    uid: str
    node: str


@dataclass(frozen=True)
class Proposal:
    """One node's ``Victims``/``MetaVictims``: the victims' UIDs and their PDB violations."""

    uids: tuple[str, ...]
    pdb_violations: int


@dataclass(frozen=True)
class PreemptArgs:
    """``ExtenderPreemptionArgs``: the preemptor and, per candidate node, the proposed victims."""

    pod: dict[str, Any]
    proposals: dict[str, Proposal]  # node name -> victims, in the order sent

    @property
    def uid(self) -> str:
        return str((self.pod.get("metadata") or {}).get("uid") or "")


def _object(doc: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise ExtenderRequestError(f"{what} must be a JSON object")
    return doc


def _string(doc: Mapping[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value:
        raise ExtenderRequestError(f"{key} must be a non-empty string")
    return value


def _pod(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    pod = _object(doc.get("Pod") or doc.get("pod"), "Pod")
    meta = _object(pod.get("metadata"), "Pod.metadata")
    for key in ("name", "namespace", "uid"):
        _string(meta, key)
    return pod


def filter_args(doc: Any) -> FilterArgs:
    """Read ``ExtenderArgs`` (the filter and prioritize verbs)."""
    doc = _object(doc, "ExtenderArgs")
    pod = _pod(doc)
    names = doc.get("NodeNames") if "NodeNames" in doc else doc.get("nodenames")
    if names is not None:
        # set(map(type, ...)) and ``in`` loop in C: a Python loop over 500 names cost more than the filters
        if not isinstance(names, list) or not set(map(type, names)) <= {str} or "" in names:
            raise ExtenderRequestError("NodeNames must be a list of node names")
        if len(names) > MAX_NODE_NAMES:
            raise ExtenderRequestError(f"NodeNames lists more than {MAX_NODE_NAMES} nodes")
        return FilterArgs(dict(pod), tuple(names), True)
    nodes = doc.get("Nodes") or doc.get("nodes")
    if nodes is None:
        raise ExtenderRequestError("ExtenderArgs has neither NodeNames nor Nodes")
    items = _object(nodes, "Nodes").get("items")
    if not isinstance(items, list):
        raise ExtenderRequestError("Nodes.items must be a list")
    found = []
    for item in items:
        found.append(_string(_object(_object(item, "a node").get("metadata"), "a node's metadata"), "name"))
    return FilterArgs(dict(pod), tuple(found), False, tuple(items))


def bind_args(doc: Any) -> BindArgs:
    """Read ``ExtenderBindingArgs``."""
    doc = _object(doc, "ExtenderBindingArgs")
    return BindArgs(
        _string(doc, "PodName"), _string(doc, "PodNamespace"), _string(doc, "PodUID"), _string(doc, "Node")
    )


def preempt_args(doc: Any) -> PreemptArgs:
    """Read ``ExtenderPreemptionArgs``: victims as UIDs (``NodeNameToMetaVictims``) or as pods
    (``NodeNameToVictims``); a node may appear once, a victim once per node."""
    doc = _object(doc, "ExtenderPreemptionArgs")
    pod = _pod(doc)
    meta_form = doc.get("NodeNameToMetaVictims")
    by_node = meta_form if meta_form is not None else doc.get("NodeNameToVictims")
    if by_node is None:
        by_node = {}  # kube-scheduler sends an empty map as null
    by_node = _object(by_node, "NodeNameToMetaVictims" if meta_form is not None else "NodeNameToVictims")
    if len(by_node) > MAX_NODE_NAMES:
        raise ExtenderRequestError(f"victims on more than {MAX_NODE_NAMES} nodes")
    proposals: dict[str, Proposal] = {}
    total = 0
    for node, victims in by_node.items():
        if not node:
            raise ExtenderRequestError("a node name must be a non-empty string")
        victims = _object(victims if victims is not None else {}, f"the victims on {node}")
        pods = victims.get("Pods")
        pods = [] if pods is None else pods
        if not isinstance(pods, list):
            raise ExtenderRequestError(f"the victims on {node}: Pods must be a list")
        total += len(pods)
        if total > MAX_VICTIMS:
            raise ExtenderRequestError(f"more than {MAX_VICTIMS} victims")
        uids = []
        for victim in pods:
            victim = _object(victim, f"a victim on {node}")
            if meta_form is None:  # a whole Pod
                victim = _object(victim.get("metadata"), f"a victim's metadata on {node}")
                uids.append(_string(victim, "uid"))
            else:
                uids.append(_string(victim, "UID"))
        if len(set(uids)) != len(uids):
            raise ExtenderRequestError(f"the victims on {node} name a pod twice")
        violations = victims.get("NumPDBViolations", 0)
        violations = 0 if violations is None else violations
        if not isinstance(violations, int) or isinstance(violations, bool) or violations < 0:
            raise ExtenderRequestError(f"the victims on {node}: NumPDBViolations must be a count")
        proposals[node] = Proposal(tuple(uids), violations)
    return PreemptArgs(dict(pod), proposals)


def preempt_result(kept: Mapping[str, Proposal]) -> dict[str, Any]:
    """``ExtenderPreemptionResult``: the nodes kept, each with its victims' UIDs."""
    return {
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": u} for u in p.uids], "NumPDBViolations": p.pdb_violations}
            for node, p in kept.items()
        }
    }


def filter_result(
    args: FilterArgs, passed: Sequence[str], failed: Mapping[str, str], unresolvable: Mapping[str, str]
) -> dict[str, Any]:
    """``ExtenderFilterResult`` in the form the request used (names, or the Node objects sent)."""
    result: dict[str, Any] = {
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": "",
    }
    if args.names_only:
        result["NodeNames"] = list(passed)
    else:
        sent = dict(zip(args.node_names, args.items, strict=False))  # empty: built without them
        result["Nodes"] = {"items": [sent.get(name) or {"metadata": {"name": name}} for name in passed]}
    return result


def scaled_scores(scores: np.ndarray) -> list[int]:
    """Scores mapped onto 0..MAX_PRIORITY, keeping their order (the lowest 0). All equal: all 0,
    as kube-scheduler adds the same to every node then, whatever it is, and picks the same node."""
    if not len(scores):
        return []
    low, high = float(scores.min()), float(scores.max())
    if not np.isfinite(low) or not np.isfinite(high) or high - low < 1e-12:
        return [0] * len(scores)
    scaled = np.rint((scores - low) / (high - low) * MAX_PRIORITY)
    return [int(v) for v in scaled]
