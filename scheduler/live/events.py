"""Kubernetes Events as kube-scheduler records them (docs/scheduler.md, "Events").

kube-scheduler v1.37 records its Events through ``k8s.io/client-go/tools/events``: the
events.k8s.io/v1 API, ``reportingController`` the profile's scheduler name, ``reportingInstance``
``<scheduler name>-<hostname>``, an ``action`` per kind of Event (``Scheduling`` for
``FailedScheduling``, ``Binding`` for ``Scheduled``, ``Preempting`` for ``Preempted``), the note cut
to the API's 1024-byte limit with `` ...``, and the name ``<object name>.<unix nanoseconds in hex>``.
The bodies built here are the same, so ``kubectl describe``, ``kubectl get events`` and its field
selectors (``involvedObject.name``, ``reason``, ``source``, ``reportingComponent``, ``type``) show a
kubegpu pod as any other. Pure functions: the scheduler posts what they build.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Mapping
from typing import Any

from scheduler.live.leader import format_micro_time

API_VERSION = "events.k8s.io/v1"
NOTE_LIMIT = 1024  # bytes: the apiserver's NoteLengthLimit
NAME_LIMIT = 253  # a DNS subdomain
INSTANCE_LIMIT = 128  # characters of reportingInstance
SCHEDULING = "Scheduling"  # kube-scheduler's action of FailedScheduling
BINDING = "Binding"  # of Scheduled
PREEMPTING = "Preempting"  # of Preempted
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def scheduled_message(namespace: str, name: str, node: str) -> str:
    """kube-scheduler's note of a ``Scheduled`` Event."""
    return f"Successfully assigned {namespace}/{name} to {node}"


def reporting_instance(controller: str, identity: str) -> str:
    """``<scheduler name>-<identity>``: kube-scheduler's ``<scheduler name>-<hostname>``, the
    identity being the hostname unless configured; cut to the API's 128 characters."""
    return f"{controller}-{identity}"[:INSTANCE_LIMIT]


def truncate_note(message: str) -> str:
    """The message within the API's 1024 bytes, cut as kube-scheduler cuts it (`` ...`` appended),
    never inside a UTF-8 character."""
    raw = message.encode()
    if len(raw) <= NOTE_LIMIT:
        return message
    suffix = " ..."
    return raw[: NOTE_LIMIT - len(suffix)].decode(errors="ignore") + suffix


def event_name(object_name: str, nanos: int) -> str:
    """``<object name>.<nanos in hex>``, or a random UUID where that is no valid name."""
    name = f"{object_name}.{nanos:x}"
    if len(name) > NAME_LIMIT or not _SUBDOMAIN.fullmatch(name):
        return str(uuid.uuid4())
    return name


def object_ref(obj: Mapping[str, Any], kind: str = "Pod", api_version: str = "v1") -> dict[str, Any]:
    """An ObjectReference to ``obj`` (a Pod by default), as client-go's ``GetReference`` makes it."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    ref = {"apiVersion": api_version, "kind": kind}
    for key in ("name", "namespace", "uid", "resourceVersion"):
        value = meta.get(key)
        if isinstance(value, str) and value:
            ref[key] = value
    return ref


def event_body(
    regarding: Mapping[str, Any],
    reason: str,
    note: str,
    kind: str,
    action: str,
    controller: str,
    instance: str,
    related: Mapping[str, Any] | None = None,
    now: dt.datetime | None = None,
) -> dict[str, Any]:
    """An events.k8s.io/v1 Event about ``regarding`` (an ObjectReference), ``kind`` Normal or
    Warning. It goes to the object's namespace (``default`` for a cluster-scoped one)."""
    when = now or dt.datetime.now(dt.UTC)
    nanos = int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "Event",
        "metadata": {
            "name": event_name(str(regarding.get("name") or "object"), nanos),
            "namespace": namespace_of(regarding),
        },
        "eventTime": format_micro_time(when),
        "reportingController": controller,
        "reportingInstance": instance,
        "action": action,
        "reason": reason,
        "regarding": dict(regarding),
        "note": truncate_note(note),
        "type": kind,
    }
    if related is not None:
        body["related"] = dict(related)
    return body


def namespace_of(regarding: Mapping[str, Any]) -> str:
    """Where an Event about ``regarding`` is created."""
    return str(regarding.get("namespace") or "default")
