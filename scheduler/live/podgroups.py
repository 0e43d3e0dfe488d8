"""Pod groups as the API serves them: which group a pod joins, what the group asks, its status.

Two APIs name gangs (docs/gang.md):

- **scheduler-plugins' PodGroup** (``scheduling.x-k8s.io/v1alpha1``, resource ``podgroups``):
  pods join with the label ``scheduling.x-k8s.io/pod-group: NAME`` (same namespace). The group
  asks ``spec.minMember`` pods together, optionally ``spec.minResources`` free in the cluster
  first, and waits at most ``spec.scheduleTimeoutSeconds`` before it is reported and backed off.
  Its status (``phase``, ``scheduled``, ``running``, ``succeeded``, ``failed``, ``occupiedBy``,
  ``scheduleStartTime``) is kept by the scheduler (``plugins_status``).
- **Kubernetes' own PodGroup** (``scheduling.k8s.io/v1beta1``, resource ``podgroups``, served
  with the ``GenericWorkload`` feature gate): pods join through ``spec.schedulingGroup.
  podGroupName``. ``spec.schedulingPolicy.gang.minCount`` makes it a gang; the ``basic`` policy
  schedules its pods one by one. ``spec.schedulingConstraints.topology[0].key`` names the
  topology domain the group is kept in. Its status is the ``PodGroupInitiallyScheduled``
  condition (``initially_scheduled_condition``).

Everything here is pure: JSON in, values out; malformed input raises ``GroupError`` with a
message fit for an Event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from scheduler.core.gang import GPUS

PLUGINS_API = "scheduling.x-k8s.io"
PLUGINS_VERSION = "v1alpha1"
PLUGINS_LABEL = "scheduling.x-k8s.io/pod-group"
KUBE_API = "scheduling.k8s.io"
KUBE_VERSION = "v1beta1"
PLURAL = "podgroups"
INITIALLY_SCHEDULED = "PodGroupInitiallyScheduled"
MAX_MIN_MEMBER = 100_000  # more members than any cluster holds pods: a typo, refused
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600
MAX_QUANTITY = Decimal(2**63 - 1)  # a quantity's int64 value, as the apiserver reads one; beyond: a typo
TERMINAL = ("Succeeded", "Failed")


class GroupError(ValueError):
    """A pod's group reference or a PodGroup is malformed (the message is for an Event)."""


@dataclass(frozen=True, order=True)
class GroupRef:
    """Which PodGroup object a pod joins: the API group that serves it, namespace and name."""

    api: str  # PLUGINS_API or KUBE_API
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def kind(self) -> str:
        """How Events and logs name the object: ``podgroups.<api group>``."""
        return f"{PLURAL}.{self.api}"


@dataclass(frozen=True)
class GroupSpec:
    """What a PodGroup asks of the scheduler."""

    ref: GroupRef
    uid: str
    min_member: int
    gang: bool = True  # False: Kubernetes' ``basic`` policy, each pod on its own
    min_resources: Mapping[str, Decimal] = field(default_factory=dict)
    timeout_seconds: float | None = None  # None: the scheduler's default
    domain_key: str | None = None  # None: the scheduler's default domain label
    status: Mapping[str, Any] = field(default_factory=dict)  # as last seen (for writing on change)


def min_resources_wanted(spec: GroupSpec, gpu_resource: str) -> dict[str, int]:
    """``minResources`` in the units of the core's ``resource_gap``: ``cpu`` in milli, the GPU
    resource as ``GPUS`` (whole GPUs), the rest (memory in bytes, ``pods``, extended resources)
    rounded up to whole units, as kube-scheduler reads a quantity's value."""
    wanted: dict[str, int] = {}
    for name, quantity in spec.min_resources.items():
        if name == "cpu":
            amount = int((quantity * 1000).to_integral_value(rounding="ROUND_CEILING"))
        else:
            amount = int(quantity.to_integral_value(rounding="ROUND_CEILING"))
        key = GPUS if name == gpu_resource else name
        if amount > 0:
            wanted[key] = wanted.get(key, 0) + amount
    return wanted


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def group_ref(pod: Mapping[str, Any]) -> GroupRef | None:
    """The group ``pod`` joins (None: none). A pod that names a group in both APIs, or names one
    with something other than a non-empty string, raises GroupError."""
    meta = _meta(pod)
    namespace = str(meta.get("namespace") or "")
    labels = meta.get("labels")
    plugins = labels.get(PLUGINS_LABEL) if isinstance(labels, Mapping) else None
    spec = pod.get("spec")
    group = spec.get("schedulingGroup") if isinstance(spec, Mapping) else None
    kube = None
    if group is not None:
        if not isinstance(group, Mapping):
            raise GroupError("spec.schedulingGroup must be an object")
        kube = group.get("podGroupName")
        if kube is not None and (not isinstance(kube, str) or not kube):
            raise GroupError(f"spec.schedulingGroup.podGroupName must be a non-empty name, got {kube!r}")
    if plugins is not None and not isinstance(plugins, str):
        raise GroupError(f"label {PLUGINS_LABEL} must be a string")
    if plugins and kube:
        raise GroupError(
            f"the pod joins two pod groups: {PLUGINS_API} {plugins!r} (label {PLUGINS_LABEL}) and "
            f"{KUBE_API} {kube!r} (spec.schedulingGroup); name one"
        )
    if kube:
        return GroupRef(KUBE_API, namespace, kube)
    if plugins:  # an empty label joins no group, as in scheduler-plugins
        return GroupRef(PLUGINS_API, namespace, plugins)
    return None


def _int(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GroupError(f"{what} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise GroupError(f"{what} must be between {low} and {high}, got {value}")
    return value


def _min_resources(raw: Any) -> dict[str, Decimal]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise GroupError("spec.minResources must be an object of quantities")
    out: dict[str, Decimal] = {}
    for name, value in raw.items():
        try:
            quantity = Decimal(parse_quantity(value))
        except (ValueError, TypeError, ArithmeticError):
            raise GroupError(f"spec.minResources.{name}: invalid quantity {value!r}") from None
        if not quantity.is_finite() or quantity < 0:
            raise GroupError(f"spec.minResources.{name} must be a finite quantity, at least 0: {value!r}")
        if quantity > MAX_QUANTITY:
            raise GroupError(f"spec.minResources.{name} is too large: {str(value)[:40]!r} (at most 2^63-1)")
        out[str(name)] = quantity
    return out


def parse_group(api: str, obj: Mapping[str, Any]) -> GroupSpec:
    """A PodGroup object of ``api`` as the scheduler uses it; GroupError when malformed."""
    meta = _meta(obj)
    ref = GroupRef(api, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
    uid = str(meta.get("uid") or "")
    spec = obj.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise GroupError("spec must be an object")
    status = obj.get("status")
    status = status if isinstance(status, Mapping) else {}
    if api == PLUGINS_API:
        raw_min = spec.get("minMember")
        # scheduler-plugins: an absent or zero minMember holds nobody back (each pod alone)
        minimum = 1 if raw_min in (None, 0) else _int(raw_min, "spec.minMember", 1, MAX_MIN_MEMBER)
        timeout = spec.get("scheduleTimeoutSeconds")
        seconds = None if timeout is None else _int(
            timeout, "spec.scheduleTimeoutSeconds", 1, MAX_TIMEOUT_SECONDS
        )
        return GroupSpec(
            ref,
            uid,
            minimum,
            min_resources=_min_resources(spec.get("minResources")),
            timeout_seconds=None if seconds is None else float(seconds),
            status=status,
        )
    if api != KUBE_API:
        raise GroupError(f"unknown pod group API {api!r}")
    policy = spec.get("schedulingPolicy")
    if not isinstance(policy, Mapping):
        raise GroupError("spec.schedulingPolicy must be an object")
    gang = policy.get("gang")
    domain = _topology_key(spec.get("schedulingConstraints"))
    if gang is None:
        if policy.get("basic") is None:
            raise GroupError("spec.schedulingPolicy names neither basic nor gang")
        return GroupSpec(ref, uid, 1, gang=False, domain_key=domain, status=status)
    if not isinstance(gang, Mapping):
        raise GroupError("spec.schedulingPolicy.gang must be an object")
    minimum = _int(gang.get("minCount"), "spec.schedulingPolicy.gang.minCount", 1, MAX_MIN_MEMBER)
    return GroupSpec(ref, uid, minimum, domain_key=domain, status=status)


def _topology_key(raw: Any) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise GroupError("spec.schedulingConstraints must be an object")
    topology = raw.get("topology")
    if topology is None:
        return None
    if not isinstance(topology, list) or not all(isinstance(t, Mapping) for t in topology):
        raise GroupError("spec.schedulingConstraints.topology must be a list of objects")
    if not topology:
        return None
    key = topology[0].get("key")
    if not isinstance(key, str) or not key:
        raise GroupError("spec.schedulingConstraints.topology[0].key must be a non-empty label name")
    return key


@dataclass(frozen=True)
class MemberCounts:
    """A group's pods by where they stand (terminating pods count where their phase says)."""

    pods: int = 0
    scheduled: int = 0  # bound to a node (and not finished)
    running: int = 0
    succeeded: int = 0
    failed: int = 0


def member_counts(pods: Iterable[Mapping[str, Any]]) -> MemberCounts:
    total = scheduled = running = succeeded = failed = 0
    for pod in pods:
        total += 1
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        phase = status.get("phase") if isinstance(status, Mapping) else None
        if phase == "Running":
            running += 1
        elif phase == "Succeeded":
            succeeded += 1
        elif phase == "Failed":
            failed += 1
        if isinstance(spec, Mapping) and spec.get("nodeName") and phase not in TERMINAL:
            scheduled += 1
    return MemberCounts(total, scheduled, running, succeeded, failed)


def occupied_by(pods: Iterable[Mapping[str, Any]]) -> str:
    """scheduler-plugins' ``occupiedBy``: the first member's owners as ``namespace/name``, sorted."""
    for pod in pods:
        meta = _meta(pod)
        owners = meta.get("ownerReferences")
        if not isinstance(owners, list) or not owners:
            return ""
        names = sorted(
            f"{meta.get('namespace', '')}/{o.get('name', '')}" for o in owners if isinstance(o, Mapping)
        )
        return ",".join(names)
    return ""


def plugins_phase(previous: str, min_member: int, counts: MemberCounts) -> str:
    """The next ``status.phase`` of a scheduler-plugins PodGroup, by its controller's rules, with
    the ``Scheduled`` phase of the releases that had one (``scheduled`` at least the minimum,
    fewer running). ``Finished`` and ``Failed`` are final. Where the controller steps through
    ``Pending`` once per reconcile, this goes straight to where the counts say."""
    if previous in ("Finished", "Failed"):
        return previous
    if counts.pods < min_member:
        return "Pending"
    active = counts.running + counts.succeeded
    phase = "Scheduling"
    if counts.scheduled + counts.succeeded >= min_member and active < min_member:
        phase = "Scheduled"
    if active >= min_member:
        phase = "Running"
    if counts.failed and counts.failed + active >= min_member:
        phase = "Failed"
    if counts.succeeded >= min_member:
        phase = "Finished"
    return phase


def plugins_status(
    spec: GroupSpec, pods: list[Mapping[str, Any]], schedule_start: str | None
) -> dict[str, Any]:
    """The status a scheduler-plugins PodGroup should show now (fields that are zero left out,
    as the API's ``omitempty`` serialises them)."""
    previous = spec.status.get("phase")
    counts = member_counts(pods)
    status: dict[str, Any] = {
        "phase": plugins_phase(previous if isinstance(previous, str) else "", spec.min_member, counts)
    }
    for name in ("scheduled", "running", "succeeded", "failed"):
        value = getattr(counts, name)
        if value:
            status[name] = value
    owner = occupied_by(pods) or spec.status.get("occupiedBy")
    if owner:
        status["occupiedBy"] = owner
    start = spec.status.get("scheduleStartTime") or schedule_start
    if start:
        status["scheduleStartTime"] = start
    return status


def status_patch(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any] | None:
    """A merge patch of ``status`` taking ``current`` to ``wanted`` (zeroed counts written as
    null), or None when nothing differs."""
    patch: dict[str, Any] = {}
    for name in ("phase", "scheduled", "running", "succeeded", "failed", "occupiedBy", "scheduleStartTime"):
        have, want = current.get(name), wanted.get(name)
        if have != want and not (have in (None, 0, "") and want is None):
            patch[name] = want
    return {"status": patch} if patch else None


def initially_scheduled_condition(
    conditions: Any, scheduled: bool, reason: str, message: str, now: str, generation: int | None
) -> dict[str, Any] | None:
    """The ``PodGroupInitiallyScheduled`` condition to write on a Kubernetes PodGroup, or None when
    the one there already says it (True is final: never turned back to False)."""
    current = None
    if isinstance(conditions, list):
        for condition in conditions:
            if isinstance(condition, Mapping) and condition.get("type") == INITIALLY_SCHEDULED:
                current = condition
    status = "True" if scheduled else "False"
    if current is not None:
        if current.get("status") == "True":
            return None
        if current.get("status") == status and current.get("reason") == reason and (
            current.get("message") == message
        ):
            return None
    changed = current is None or current.get("status") != status
    condition: dict[str, Any] = {
        "type": INITIALLY_SCHEDULED,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": now if changed else current.get("lastTransitionTime", now),
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return condition
