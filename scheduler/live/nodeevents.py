"""Kubernetes Events on a Node whose agent published something the scheduler refuses, and on its
recovery; at most one per node per ``MIN_INTERVAL_SECONDS`` (docs/errors.md).

The scheduler's cache logs every change of a node's exclusion (``node.excluded``); this module
tells the node's owner where they look (``kubectl describe node``): a Warning
``InvalidDevicePublication`` naming the problem (an unreadable or absurd inventory, absurd
allocatable counts, a heartbeat from the future), and a Normal ``DevicePublicationValid`` once it
is fixed. A node that merely has no inventory (not a GPU node), a stale heartbeat or a cordon gets
none: those are states, not mistakes. Only the leader posts; posting never blocks a decision and a
failed post is a log line. The Events are events.k8s.io/v1, reported as the scheduler's others
(scheduler/live/events.py).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from kubegpu.logs import log_event
from scheduler.live import nodecheck
from scheduler.live.events import event_body
from scheduler.live.translate import NO_INVENTORY, NodeFacts

log = logging.getLogger("kubegpu.scheduler.nodes")
MIN_INTERVAL_SECONDS = 60.0
NAMESPACE = "default"  # where the kubelet puts a Node's events
WARNING_REASON = "InvalidDevicePublication"
RECOVERED_REASON = "DevicePublicationValid"
ACTION = "CheckingDevicePublication"  # the Events' action (events.k8s.io/v1)


def publication_problem(facts: NodeFacts, now: dt.datetime) -> str:
    """What the node's agent published wrong ('' if nothing, or if it merely published nothing)."""
    if facts.problem and facts.problem != NO_INVENTORY:
        return facts.problem
    return nodecheck.heartbeat_problem(facts.heartbeat, now)


class NodeEvents:
    """Decides which Node events to post; ``post(node, reason, message, type)`` posts one."""

    def __init__(
        self,
        post: Callable[[str, str, str, str], None],
        clock: Callable[[], float],
        min_interval: float = MIN_INTERVAL_SECONDS,
    ) -> None:
        self._post = post
        self._clock = clock
        self._min_interval = min_interval
        self._posted: dict[str, tuple[str, float]] = {}  # node -> (what was posted, '' = valid; when)
        self._pending: set[str] = set()

    def update(self, facts: Mapping[str, NodeFacts], now: dt.datetime, changed: bool) -> None:
        """Post what changed; ``changed``: the view was rebuilt (else only held-back posts are due)."""
        names = (set(facts) | set(self._posted)) if changed else set(self._pending)
        self._pending.clear()
        clock = self._clock()
        for name in sorted(names):
            node = facts.get(name)
            if node is None:
                self._posted.pop(name, None)  # the Node is gone
                continue
            problem = publication_problem(node, now)
            last_problem, last_time = self._posted.get(name, ("", -math.inf))
            if problem == last_problem:
                continue
            if clock - last_time < self._min_interval:
                self._pending.add(name)  # too soon after the last post: posted once the interval is over
                continue
            self._posted[name] = (problem, clock)
            if problem:
                self._post(name, WARNING_REASON, problem, "Warning")
            else:
                self._post(name, RECOVERED_REASON, "the node's device publication is valid again", "Normal")

    @property
    def pending(self) -> bool:
        return bool(self._pending)


def node_event(
    node: str, reason: str, message: str, kind: str, component: str, instance: str
) -> dict[str, Any]:
    """An events.k8s.io/v1 Event about Node ``node`` (its uid is its name, as the kubelet and
    kubectl have it), in the ``default`` namespace."""
    regarding = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node}
    return event_body(regarding, reason, message, kind, ACTION, component, instance)  # it cuts the note


def poster(
    core: Any, submit: Callable[..., Any], component: str, instance: str
) -> Callable[[str, str, str, str], None]:
    """``post`` for ``NodeEvents``: creates the Event through ``core`` (an ``EventsV1Api``) in a
    ``submit``ted task."""

    def create(node: str, reason: str, message: str, kind: str) -> None:
        event = node_event(node, reason, message, kind, component, instance)
        try:
            response = core.create_namespaced_event(NAMESPACE, event, _preload_content=False)
            try:
                _ = response.data  # read it, so the connection goes back to the pool
            finally:
                response.release_conn()
        except Exception as error:  # an Event is best effort; never let it escape into a future
            log_event(log, "node.event_failed", logging.WARNING, node=node, error=str(error)[:200])
            return
        log_event(log, "node.event", node=node, reason=reason, message=message[:200])

    def post(node: str, reason: str, message: str, kind: str) -> None:
        submit(create, node, reason, message, kind)

    return post
