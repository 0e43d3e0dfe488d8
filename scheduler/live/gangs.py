"""The live scheduler's book of pod groups: the PodGroups the API serves, which pods belong to
which, and how each group's scheduling stands (when it started trying, whether it timed out).

The scheduler keeps one ``GroupBook`` under its lock and feeds it from the pod reflector and the
two PodGroup reflectors (``podgroups.py`` parses the objects). Nothing here talks to the API.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.live.podgroups import GroupError, GroupRef, GroupSpec, group_ref, parse_group


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


NOT_PLACED_YET = (None, "", "Pending", "Scheduling")  # phases whose scheduleStartTime is the current try


def rfc3339(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class GroupProgress:
    """How a group's scheduling stands in this replica."""

    first_try: float  # monotonic time of its first attempt since it last had its minimum
    start_time: str  # the same moment as an RFC 3339 time (``scheduleStartTime``)
    timed_out: bool = False  # reported as timed out since ``first_try``
    message: str = ""  # why its last attempt failed ("" once placed)
    placed: bool = False  # its minimum was bound (or assumed) at least once
    told_at: float = float("-inf")  # when every waiting member was last told why (monotonic)
    told: str = ""  # the reason last posted on the PodGroup
    short_since: float | None = None  # monotonic time it was first seen short of members, lately


class GroupBook:
    """PodGroups by reference, group membership by pod uid, and each group's progress."""

    def __init__(self) -> None:
        self.specs: dict[GroupRef, GroupSpec | GroupError] = {}
        self.members: dict[GroupRef, set[str]] = {}
        self.of: dict[str, GroupRef | GroupError] = {}
        self.pods: dict[str, Mapping[str, Any]] = {}  # members as last seen, whatever their state
        self.progress: dict[GroupRef, GroupProgress] = {}
        self.dirty: set[GroupRef] = set()  # groups whose status may need writing

    # --- pods ---------------------------------------------------------------------------------

    def set_pod(self, uid: str, pod: Mapping[str, Any]) -> GroupRef | GroupError | None:
        """Record which group the pod joins now (GroupError: it names one wrongly). Every pod
        that exists counts, whoever schedules it and whatever its phase: a group's status counts
        its finished, gated and other schedulers' pods too."""
        try:
            ref: GroupRef | GroupError | None = group_ref(pod)
        except GroupError as error:
            ref = error
        old = self.of.get(uid)
        if isinstance(old, GroupRef) and old != ref:
            self._leave(old, uid)
        if ref is None:
            self.of.pop(uid, None)
            self.pods.pop(uid, None)
            return None
        self.of[uid] = ref
        if isinstance(ref, GroupRef):
            self.members.setdefault(ref, set()).add(uid)
            self.pods[uid] = pod
            self.dirty.add(ref)
        else:
            self.pods.pop(uid, None)
        return ref

    def drop_pod(self, uid: str) -> None:
        self.pods.pop(uid, None)
        old = self.of.pop(uid, None)
        if isinstance(old, GroupRef):
            self._leave(old, uid)

    def replace_pods(self, pods: Mapping[str, Mapping[str, Any]]) -> None:
        for uid in set(self.of) - set(pods):
            self.drop_pod(uid)
        for uid, pod in pods.items():
            self.set_pod(uid, pod)

    def _leave(self, ref: GroupRef, uid: str) -> None:
        members = self.members.get(ref)
        if members is not None:
            members.discard(uid)
            if not members:
                del self.members[ref]
        self.dirty.add(ref)

    # --- groups -------------------------------------------------------------------------------

    def put_group(self, api: str, obj: Mapping[str, Any]) -> GroupRef:
        meta = _meta(obj)
        ref = GroupRef(api, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        try:
            self.specs[ref] = parse_group(api, obj)
        except GroupError as error:
            self.specs[ref] = error
        self.dirty.add(ref)
        return ref

    def delete_group(self, api: str, obj: Mapping[str, Any]) -> GroupRef:
        meta = _meta(obj)
        ref = GroupRef(api, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        self.specs.pop(ref, None)
        self.progress.pop(ref, None)
        self.dirty.discard(ref)
        return ref

    def replace_groups(self, api: str, items: Iterable[Mapping[str, Any]]) -> None:
        seen = {self.put_group(api, item) for item in items}
        for ref in [r for r in self.specs if r.api == api and r not in seen]:
            self.specs.pop(ref, None)
            self.progress.pop(ref, None)

    # --- progress -----------------------------------------------------------------------------

    def trying(self, ref: GroupRef, now: float, wall: dt.datetime) -> GroupProgress:
        """The group's progress, starting its clock at its first attempt (an earlier start
        recorded in the PodGroup's status, by this or another replica, is kept while the status
        says the group was not placed since: a group that ran, tried again for a member that
        came back, starts a new clock)."""
        progress = self.progress.get(ref)
        if progress is None:
            start = rfc3339(wall)
            spec = self.specs.get(ref)
            recorded = spec.status.get("scheduleStartTime") if isinstance(spec, GroupSpec) else None
            if isinstance(spec, GroupSpec) and spec.status.get("phase") not in NOT_PLACED_YET:
                recorded = None
            first = now
            if isinstance(recorded, str) and recorded:
                try:
                    then = dt.datetime.fromisoformat(recorded.upper().replace("Z", "+00:00"))
                    if then.tzinfo is None:  # no offset (a bare date, a local time): read as UTC
                        then = then.replace(tzinfo=dt.UTC)
                    first = now - max(0.0, (wall - then).total_seconds())
                    start = recorded
                except (ValueError, OverflowError):
                    pass  # unreadable: the clock starts now
            progress = self.progress[ref] = GroupProgress(first, start)
        return progress
