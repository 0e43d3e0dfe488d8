"""Leader election on a ``coordination.k8s.io/v1`` Lease, so that only one scheduler replica binds.

The protocol is client-go's ``leaderelection`` with a Lease lock:

- The Lease's ``spec.holderIdentity`` names the leader. ``spec.renewTime`` is when it last renewed
  and ``spec.leaseDurationSeconds`` how long that renewal is good for.
- A candidate takes the Lease when it is missing, has no holder (released) or has expired
  (``renewTime + leaseDurationSeconds < now``). The holder renews it every ``retry_period``.
- Every write is a create (fails with 409 AlreadyExists if someone else created it first) or an
  update carrying the ``resourceVersion`` that was read (fails with 409 Conflict if someone
  else wrote in between). So two candidates racing for the same Lease can never both win.
- A leader that cannot renew for ``renew_deadline`` seconds stops leading. The deadline counts
  from the start of the last successful step, taken before its read and so no later than the
  ``renewTime`` it wrote, however slowly the calls answered. Since ``renew_deadline <
  lease_seconds``, it stops before anyone else may take over, provided the replicas' clocks
  agree to within ``lease_seconds - renew_deadline``.
- ``release()`` on a clean shutdown clears the holder, so another replica takes over at once
  instead of waiting for the lease to expire.

What to do with the Lease is decided by :func:`decide`, a pure function of the Lease as read,
our identity and the time; :func:`next_record` and :func:`released_record` build what is
written. Times travel as ``MicroTime`` (RFC 3339 with microseconds, UTC).

Typical use (the scheduler's main loop)::

    elector = LeaderElector(k8s.CoordinationV1Api(api), "kubegpu-system", "kubegpu-scheduler",
                            identity=os.environ["POD_NAME"])
    leading, lost, stop = threading.Event(), threading.Event(), threading.Event()
    thread = elector.start(leading.set, lost.set, stop)   # or elector.run(...) in your own thread
    leading.wait()          # then schedule; check ``elector.is_leader`` before each bind
    ...                     # on ``lost``: stop binding and exit; on SIGTERM: stop.set(), thread.join()
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import urllib3
from kubernetes import client as k8s

# API errors and network errors alike count as a failed attempt, never a dead elector thread.
API_ERRORS: tuple[type[Exception], ...] = (k8s.ApiException, urllib3.exceptions.HTTPError, OSError)
log = logging.getLogger(__name__)

LEASE_API_VERSION = "coordination.k8s.io/v1"
# How much a wait between acquire attempts may be stretched, as a fraction (client-go: 1.2).
JITTER = 0.2
# leaseDurationSeconds written by release(): the released lease is free at once anyway (no
# holder), and an old candidate that ignores empty holders sees it expire within a second.
RELEASED_LEASE_SECONDS = 1


# --------------------------------------------------------------------------- pure part


def utc_now() -> datetime:
    """The wall clock, as an aware UTC datetime (the default ``clock``)."""
    return datetime.now(UTC)


def format_micro_time(value: datetime) -> str:
    """RFC 3339 with exactly six fractional digits in UTC, as ``metav1.MicroTime`` marshals.

    ``datetime.isoformat()`` drops the fraction when it is zero, which the apiserver's MicroTime
    parser does not accept; this never does.
    """
    if value.tzinfo is None:
        raise ValueError("MicroTime needs an aware datetime")
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def wire_time(value: datetime) -> str:
    """``value`` as MicroTime for a request body, never with a zero fraction.

    The python client validates a dict body into its model (``V1Lease``), parsing the strings
    back into datetimes, and writes them out with ``isoformat()``. That drops a zero fraction
    (``12:00:00+00:00``), which the apiserver's MicroTime parser refuses with 400. A time
    whose fraction is zero is therefore sent 1 µs later.
    """
    if value.microsecond == 0:
        value += timedelta(microseconds=1)
    return format_micro_time(value)


def parse_time(value: datetime | str | None) -> datetime | None:
    """An aware UTC datetime from a MicroTime string or a datetime (naive means UTC)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


@dataclass(frozen=True)
class LeaseRecord:
    """The leader-election fields of a Lease's spec."""

    holder: str = ""
    lease_seconds: int = 0
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0

    @classmethod
    def from_spec(cls, spec: Any) -> LeaseRecord:
        """From a ``V1LeaseSpec`` or a spec dict in API (camelCase) form; None gives a free record."""
        if spec is None:
            return cls()
        if isinstance(spec, Mapping):
            get = spec.get
            return cls(
                holder=get("holderIdentity") or "",
                lease_seconds=int(get("leaseDurationSeconds") or 0),
                acquire_time=parse_time(get("acquireTime")),
                renew_time=parse_time(get("renewTime")),
                transitions=int(get("leaseTransitions") or 0),
            )
        return cls(
            holder=spec.holder_identity or "",
            lease_seconds=int(spec.lease_duration_seconds or 0),
            acquire_time=parse_time(spec.acquire_time),
            renew_time=parse_time(spec.renew_time),
            transitions=int(spec.lease_transitions or 0),
        )

    def to_spec(self) -> dict[str, Any]:
        """The spec dict to write (:func:`wire_time` strings; an empty holder is written as null)."""
        return {
            "holderIdentity": self.holder or None,
            "leaseDurationSeconds": self.lease_seconds,
            "acquireTime": wire_time(self.acquire_time) if self.acquire_time else None,
            "renewTime": wire_time(self.renew_time) if self.renew_time else None,
            "leaseTransitions": self.transitions,
        }

    def expiry(self) -> datetime | None:
        """When the holder's last renewal runs out (None when it never renewed)."""
        if self.renew_time is None:
            return None
        return self.renew_time + timedelta(seconds=self.lease_seconds)


class Decision(enum.Enum):
    """What a candidate may do with a Lease it has just read."""

    RENEW = "renew"  # it is ours: renew it
    ACQUIRE = "acquire"  # no holder, or the holder's lease has expired: take it
    HELD = "held"  # someone else holds a fresh lease: keep off


def decide(record: LeaseRecord, identity: str, now: datetime) -> Decision:
    """Is the Lease ours, free (no holder, or expired: ``renewTime + duration < now``) or held?

    A lease whose holder never renewed counts as expired.
    """
    if not identity:
        raise ValueError("an elector needs a non-empty identity")
    if record.holder == identity:
        return Decision.RENEW
    if not record.holder:
        return Decision.ACQUIRE
    expiry = record.expiry()
    if expiry is None or expiry < now:
        return Decision.ACQUIRE
    return Decision.HELD


def next_record(record: LeaseRecord, identity: str, now: datetime, lease_seconds: int) -> LeaseRecord:
    """The record to write after deciding RENEW or ACQUIRE.

    A renewal keeps ``acquireTime`` and ``leaseTransitions`` and moves ``renewTime``. A take-over
    sets ``acquireTime`` too and counts a transition, as client-go does (from a released lease
    as well).
    """
    if record.holder == identity:
        return replace(
            record, lease_seconds=lease_seconds, renew_time=now, acquire_time=record.acquire_time or now
        )
    return LeaseRecord(
        holder=identity,
        lease_seconds=lease_seconds,
        acquire_time=now,
        renew_time=now,
        transitions=record.transitions + 1,
    )


def first_record(identity: str, now: datetime, lease_seconds: int) -> LeaseRecord:
    """The record that creates a missing Lease (no transition yet)."""
    return LeaseRecord(identity, lease_seconds, now, now, 0)


def released_record(record: LeaseRecord, now: datetime) -> LeaseRecord:
    """The record written by a clean shutdown: no holder, so any candidate may take it now."""
    return LeaseRecord(
        holder="",
        lease_seconds=RELEASED_LEASE_SECONDS,
        acquire_time=now,
        renew_time=now,
        transitions=record.transitions,
    )


def lease_body(
    namespace: str,
    name: str,
    record: LeaseRecord,
    resource_version: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Lease as the API takes it; with ``resource_version`` the update is conditional."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": LEASE_API_VERSION, "kind": "Lease", "metadata": metadata, "spec": record.to_spec()}


def check_timings(lease_seconds: float, renew_deadline: float, retry_period: float) -> None:
    """client-go's rule: ``lease_seconds > renew_deadline > retry_period * (1 + JITTER)`` > 0."""
    if retry_period <= 0:
        raise ValueError("retry_period must be positive")
    if not renew_deadline > retry_period * (1 + JITTER):
        raise ValueError(f"renew_deadline must exceed retry_period * {1 + JITTER}")
    if not lease_seconds > renew_deadline:
        raise ValueError("lease_seconds must exceed renew_deadline")
    if int(lease_seconds) != lease_seconds:
        raise ValueError("lease_seconds must be a whole number (leaseDurationSeconds is an integer)")


# --------------------------------------------------------------------------- the elector


class Outcome(enum.Enum):
    """The result of one :meth:`LeaderElector.step`."""

    ACQUIRED = "acquired"  # created the Lease, or took it over
    RENEWED = "renewed"  # it was ours and we renewed it
    HELD = "held"  # someone else holds a fresh lease
    LOST_RACE = "lost_race"  # 409: someone else wrote between our read and our write
    ERROR = "error"  # the API call failed otherwise (logged)

    @property
    def leading(self) -> bool:
        return self in (Outcome.ACQUIRED, Outcome.RENEWED)


class LeaderElector:
    """Holds (or waits for) Lease ``namespace/name`` on behalf of ``identity``.

    ``coordination_api`` is a ``kubernetes.client.CoordinationV1Api`` (or anything with its
    ``read_namespaced_lease``, ``create_namespaced_lease`` and ``replace_namespaced_lease``).
    ``clock`` gives the wall time written into the Lease and compared with ``renewTime``;
    ``monotonic`` times the renew deadline, so a wall-clock step never keeps a stale leader on.
    """

    def __init__(
        self,
        coordination_api: Any,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: int = 15,
        renew_deadline: float = 10,
        retry_period: float = 2,
        clock: Callable[[], datetime] = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        if not identity:
            raise ValueError("an elector needs a non-empty identity")
        check_timings(lease_seconds, renew_deadline, retry_period)
        self.api = coordination_api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = int(lease_seconds)
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()  # one API step (or release) at a time
        self._leading = False
        self._last_renewed = 0.0  # monotonic time at the start of the last successful step
        self.observed: LeaseRecord | None = None  # the Lease as last read or written
        # the Lease's annotations as last read or written; ``annotations`` are ours, written with
        # every create, take-over and renewal and dropped on release (the holder's facts, such as
        # where its extender listens: scheduler/live/relay.py)
        self.observed_annotations: dict[str, str] = {}
        self.annotations = dict(annotations or {})
        # Each API call may take at most this long, so a hung call cannot outlive the deadline.
        self._timeout = {"_request_timeout": max(retry_period, renew_deadline / 2)}

    # ---- state

    @property
    def is_leader(self) -> bool:
        """True while we hold the Lease and its last renewal began less than ``renew_deadline`` ago.

        It takes no lock, so it never waits for an API call in progress: cheap enough to ask
        before every bind.
        """
        return self._leading_now()

    def _leading_now(self) -> bool:
        return self._leading and self._monotonic() - self._last_renewed < self.renew_deadline

    @property
    def holder(self) -> str:
        """The holder we last saw ('' when none, or not read yet)."""
        return self.observed.holder if self.observed else ""

    # ---- one step

    def try_acquire_or_renew(self) -> bool:
        """One attempt: read the Lease, then create, take over or renew it. True when we lead."""
        return self.step().leading

    def step(self) -> Outcome:
        """Like :meth:`try_acquire_or_renew`, with the reason."""
        with self._lock:
            # The renew deadline counts from before the read, no later than the renewTime that
            # _step writes: a write that lands late must not move it on (the safety margin,
            # lease_seconds - renew_deadline, would shrink by the calls' duration).
            began = self._monotonic()
            outcome = self._step()
            if outcome.leading:
                self._leading = True
                self._last_renewed = began
            elif outcome is Outcome.HELD:
                self._leading = False  # someone else holds it: we are not leading, whatever we thought
            return outcome

    def _step(self) -> Outcome:
        now = self._clock()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, **self._timeout)
        except API_ERRORS as exc:
            if getattr(exc, "status", None) != 404:
                return self._failed("read", exc)
            return self._create(first_record(self.identity, now, self.lease_seconds))
        current = LeaseRecord.from_spec(lease.spec)
        self.observed = current
        self.observed_annotations = dict(lease.metadata.annotations or {})
        decision = decide(current, self.identity, now)
        if decision is Decision.HELD:
            return Outcome.HELD
        failure = self._update(lease, next_record(current, self.identity, now, self.lease_seconds))
        if failure is not None:
            return failure
        if decision is Decision.ACQUIRE:
            log.info(
                "leader.acquired lease=%s/%s identity=%s previous=%r",
                self.namespace,
                self.name,
                self.identity,
                current.holder,
            )
            return Outcome.ACQUIRED
        return Outcome.RENEWED

    def _create(self, record: LeaseRecord) -> Outcome:
        body = lease_body(self.namespace, self.name, record, annotations=self.annotations)
        try:
            self.api.create_namespaced_lease(self.namespace, body, **self._timeout)
        except API_ERRORS as exc:
            if getattr(exc, "status", None) == 409:  # AlreadyExists: another candidate created it first
                return Outcome.LOST_RACE
            return self._failed("create", exc)
        self.observed = record
        self.observed_annotations = dict(self.annotations)
        log.info(
            "leader.acquired lease=%s/%s identity=%s (created)", self.namespace, self.name, self.identity
        )
        return Outcome.ACQUIRED

    def _update(self, lease: Any, record: LeaseRecord) -> Outcome | None:
        """Conditional update (the resourceVersion as read): None when written, else why not.

        The Lease keeps its labels and others' annotations; ours are written while we hold it
        (``record.holder``) and removed when we give it up."""
        metadata = lease.metadata
        annotations = dict(metadata.annotations or {})
        for key in self.annotations:
            annotations.pop(key, None)
        if record.holder == self.identity:
            annotations.update(self.annotations)
        body = lease_body(
            self.namespace,
            self.name,
            record,
            metadata.resource_version,
            metadata.labels,
            annotations,
        )
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, body, **self._timeout)
        except API_ERRORS as exc:
            if getattr(exc, "status", None) == 409:  # Conflict: written by someone else since we read it
                return Outcome.LOST_RACE
            return self._failed("update", exc)
        self.observed = record
        self.observed_annotations = annotations
        return None

    def _failed(self, verb: str, exc: Exception) -> Outcome:
        log.warning(
            "leader.api_error lease=%s/%s verb=%s status=%s reason=%s",
            self.namespace,
            self.name,
            verb,
            getattr(exc, "status", None),
            getattr(exc, "reason", None) or str(exc)[:200],
        )
        return Outcome.ERROR

    # ---- release

    def release(self) -> bool:
        """Give the Lease up if we hold it (clean shutdown). True when it was released.

        The holder is cleared, so any candidate takes it on its next attempt instead of waiting
        ``lease_seconds``. We stop leading first, whatever the write's outcome.
        """
        with self._lock:
            was_leading, self._leading = self._leading, False
            if not was_leading:
                return False
            try:
                lease = self.api.read_namespaced_lease(self.name, self.namespace, **self._timeout)
            except API_ERRORS as exc:
                self._failed("read", exc)
                return False
            current = LeaseRecord.from_spec(lease.spec)
            if current.holder != self.identity:
                return False
            released = self._update(lease, released_record(current, self._clock())) is None
            if released:
                log.info("leader.released lease=%s/%s identity=%s", self.namespace, self.name, self.identity)
            return released

    # ---- the loop

    def run(
        self,
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[], None],
        stop_event: threading.Event,
        release_on_stop: bool = True,
    ) -> bool:
        """Acquire, then renew until the Lease is lost or ``stop_event`` is set. Blocks.

        - Tries every ``retry_period`` (with up to 20 % jitter) until it leads, then calls
          ``on_started_leading()``.
        - Renews every ``retry_period``. When no renewal succeeded for ``renew_deadline`` seconds,
          or another holder shows up, it calls ``on_stopped_leading()`` and returns False. It does
          not try again: the scheduler is expected to stop scheduling (or exit and restart).
        - When ``stop_event`` is set while leading, it releases the Lease (``release_on_stop``),
          calls ``on_stopped_leading()`` and returns True. Set before leading: returns True and
          calls neither callback.

        Both callbacks run in this thread and must return quickly (set an event, for example).
        """
        while not stop_event.is_set():
            if self.try_acquire_or_renew():
                break
            stop_event.wait(self.retry_period * (1 + random.uniform(0, JITTER)))
        else:
            return True
        clean = False
        try:
            on_started_leading()
            clean = self._renew_until_lost(stop_event)
            if clean and release_on_stop:
                self.release()
            else:
                with self._lock:
                    self._leading = False
        finally:
            on_stopped_leading()
        return clean

    def _renew_until_lost(self, stop_event: threading.Event) -> bool:
        """Renew every retry_period; True when stopped, False when leadership was lost."""
        while not stop_event.wait(self.retry_period):
            outcome = self.step()
            if outcome.leading:
                continue
            if outcome is Outcome.HELD:
                log.error(
                    "leader.lost lease=%s/%s identity=%s holder=%r",
                    self.namespace,
                    self.name,
                    self.identity,
                    self.holder,
                )
                return False
            if not self._leading_now():
                log.error(
                    "leader.lost lease=%s/%s identity=%s: no renewal for %ss",
                    self.namespace,
                    self.name,
                    self.identity,
                    self.renew_deadline,
                )
                return False
        return True

    def start(
        self,
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[], None],
        stop_event: threading.Event,
        release_on_stop: bool = True,
    ) -> threading.Thread:
        """:meth:`run` in a new daemon thread named ``leader-election``, which is returned."""
        thread = threading.Thread(
            target=self.run,
            args=(on_started_leading, on_stopped_leading, stop_event, release_on_stop),
            name="leader-election",
            daemon=True,
        )
        thread.start()
        return thread
