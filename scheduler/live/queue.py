"""The live scheduler's queue of pending pods: kube-scheduler's three queues, without threads.

- **active**: pods ready to be tried, popped in kube-scheduler's order: higher ``spec.priority``
  first, then earlier ``metadata.creationTimestamp``, then name (a total order, so equal pods do
  not swap places between runs);
- **backoff**: pods that failed recently, each until its own ready time;
- **parked**: unschedulable pods, waiting for a change in the cluster (``move_all``) or, for a
  pod whose request is invalid, for a change to the pod itself (``update``).

Every failed attempt (unschedulable, bind failure) doubles the pod's backoff, from
``initial`` up to ``maximum``: a pod is ready again ``backoff(attempts)`` after its last failure.
A parked pod that a cluster change releases goes to the backoff queue if its backoff has not
expired yet, else to the active queue. ``wait_seconds`` tells the caller how long it may sleep:
until the next backoff expiry, or indefinitely (``None``) when nothing is backing off. The caller
provides the clock and the locking.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Entry:
    uid: str
    key: tuple  # (-priority, created, name)
    attempts: int = 0
    failed_at: float = 0.0
    where: str = ""  # "active", "backoff", "parked", "held" (being bound) or "" (popped: being tried)
    until_pod_changes: bool = False
    token: int = 0  # heap entries carrying an older token are stale


class SchedulingQueue:
    """Pending pods by uid (see the module docstring)."""

    def __init__(self, initial: float, maximum: float, clock: Callable[[], float]) -> None:
        self.initial = initial
        self.maximum = maximum
        self.clock = clock
        self._entries: dict[str, _Entry] = {}
        self._active: list[tuple[tuple, int, str]] = []
        self._backoff: list[tuple[float, int, str]] = []
        self._tokens = 0
        self.counts = {"active": 0, "backoff": 0, "parked": 0}

    # --- membership -------------------------------------------------------------------------

    def __contains__(self, uid: str) -> bool:
        return uid in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def where(self, uid: str) -> str | None:
        """Which queue holds the pod ('' while it is being tried), or None if it is not queued."""
        entry = self._entries.get(uid)
        return None if entry is None else entry.where

    def attempts(self, uid: str) -> int:
        entry = self._entries.get(uid)
        return 0 if entry is None else entry.attempts

    def backoff_seconds(self, attempts: int) -> float:
        """The backoff after ``attempts`` failed attempts (0 before the first failure)."""
        if attempts <= 0:
            return 0.0
        return min(self.maximum, self.initial * 2 ** min(attempts - 1, 62))

    def ready_at(self, uid: str) -> float:
        entry = self._entries[uid]
        return entry.failed_at + self.backoff_seconds(entry.attempts)

    # --- changes ------------------------------------------------------------------------------

    def add(self, uid: str, priority: int, created: str, name: str) -> None:
        """A pending pod: queue it if new; a known pod keeps its place and backoff."""
        entry = self._entries.get(uid)
        if entry is None:
            entry = self._entries[uid] = _Entry(uid, (-priority, created, name))
            self._to_ready_queue(entry)

    def update(self, uid: str, priority: int, created: str, name: str) -> None:
        """The pod changed: queue it if new, and a parked pod may be tried again (after its backoff)."""
        entry = self._entries.get(uid)
        if entry is None:
            self.add(uid, priority, created, name)
            return
        entry.key = (-priority, created, name)
        if entry.where in ("parked", "active"):
            entry.until_pod_changes = False
            self._to_ready_queue(entry)

    def uids(self) -> list[str]:
        return list(self._entries)

    def hold(self, uid: str) -> None:
        """The pod is being bound: out of every queue, but its attempts are kept (``requeue``
        backs off from them if the Binding fails; ``remove`` once it is bound)."""
        entry = self._entries.get(uid)
        if entry is not None:
            self._leave(entry)
            entry.where = "held"

    def remove(self, uid: str) -> None:
        """The pod is bound, assumed or gone."""
        entry = self._entries.pop(uid, None)
        if entry is not None:
            self._leave(entry)

    def requeue(self, uid: str, priority: int, created: str, name: str) -> None:
        """A pod whose attempt failed through no fault of its own (a binding that did not happen):
        back off, counting the attempt."""
        entry = self._entries.get(uid)
        if entry is None:
            entry = self._entries[uid] = _Entry(uid, (-priority, created, name))
        self._fail(entry)
        self._to_ready_queue(entry)

    def park(self, uid: str, until_pod_changes: bool = False) -> None:
        """The pod fits nowhere (or its request is invalid): wait for a change."""
        entry = self._entries.get(uid)
        if entry is None:
            return
        self._fail(entry)
        self._leave(entry)
        entry.where = "parked"
        entry.until_pod_changes = until_pod_changes
        self.counts["parked"] += 1

    def move_all(self) -> int:
        """The cluster changed: parked pods (but those waiting for their own change) may retry."""
        moved = 0
        for entry in self._entries.values():
            if entry.where == "parked" and not entry.until_pod_changes:
                self._to_ready_queue(entry)
                moved += 1
        return moved

    def clear(self) -> None:
        self._entries.clear()
        self._active.clear()
        self._backoff.clear()
        self.counts = {"active": 0, "backoff": 0, "parked": 0}

    # --- taking pods --------------------------------------------------------------------------

    def pop(self) -> str | None:
        """The next pod to try, or None when none is ready. The pod stays known (with its
        attempts) until ``remove``, ``park`` or ``requeue``."""
        self._flush_backoff()
        while self._active:
            _key, token, uid = heapq.heappop(self._active)
            entry = self._entries.get(uid)
            if entry is None or entry.token != token or entry.where != "active":
                continue
            self.counts["active"] -= 1
            entry.where = ""
            return uid
        return None

    def wait_seconds(self) -> float | None:
        """How long until a pod becomes ready: 0 if one is, None if none is waiting on a time."""
        self._flush_backoff()
        if self.counts["active"]:
            return 0.0
        while self._backoff:
            ready, token, uid = self._backoff[0]
            entry = self._entries.get(uid)
            if entry is None or entry.token != token or entry.where != "backoff":
                heapq.heappop(self._backoff)
                continue
            return max(0.0, ready - self.clock())
        return None

    # --- internals ----------------------------------------------------------------------------

    def _fail(self, entry: _Entry) -> None:
        entry.attempts += 1
        entry.failed_at = self.clock()

    def _leave(self, entry: _Entry) -> None:
        if entry.where in self.counts:
            self.counts[entry.where] -= 1
        entry.where = ""
        entry.token = self._next_token()  # invalidates its heap entries

    def _next_token(self) -> int:
        self._tokens += 1
        return self._tokens

    def _to_ready_queue(self, entry: _Entry) -> None:
        """Into the backoff queue if its backoff has not expired, else the active queue."""
        self._leave(entry)
        ready = entry.failed_at + self.backoff_seconds(entry.attempts)
        if entry.attempts and ready > self.clock():
            entry.where = "backoff"
            heapq.heappush(self._backoff, (ready, entry.token, entry.uid))
        else:
            entry.where = "active"
            heapq.heappush(self._active, (entry.key, entry.token, entry.uid))
        self.counts[entry.where] += 1

    def _flush_backoff(self) -> None:
        now = self.clock()
        while self._backoff and self._backoff[0][0] <= now:
            _ready, token, uid = heapq.heappop(self._backoff)
            entry = self._entries.get(uid)
            if entry is None or entry.token != token or entry.where != "backoff":
                continue
            self.counts["backoff"] -= 1
            entry.where = "active"
            heapq.heappush(self._active, (entry.key, entry.token, entry.uid))
            self.counts["active"] += 1
