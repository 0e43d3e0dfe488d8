"""Leader election on a Lease (scheduler/live/leader.py).

The decision and the records written are pure functions, tested with a fake clock; the elector
is tested against an in-memory Lease API with fake clocks, and then against the real
kube-apiserver (``apiserver`` marked tests): exactly one of two candidates wins, also when they
race, a stale lease is taken over, a released one at once, and ``run`` hands over on stop.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from kubernetes import client as k8s

from kubegpu.devenv.controlplane import MERGE_PATCH
from scheduler.live.leader import (
    Decision,
    LeaderElector,
    LeaseRecord,
    Outcome,
    check_timings,
    decide,
    first_record,
    format_micro_time,
    lease_body,
    next_record,
    parse_time,
    released_record,
    wire_time,
)

T0 = datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC)
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


class FakeClock:
    """Wall and monotonic time that only move when told to."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start
        self.mono = 1000.0

    def __call__(self) -> datetime:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
        self.mono += seconds


def held(holder: str, renewed: datetime, seconds: int = 15, transitions: int = 0) -> LeaseRecord:
    return LeaseRecord(holder, seconds, renewed, renewed, transitions)


# --------------------------------------------------------------------------- pure functions


def test_decide_ours_free_expired_held() -> None:
    assert decide(LeaseRecord(), "a", T0) is Decision.ACQUIRE  # no holder (missing or released)
    assert decide(held("a", T0), "a", T0) is Decision.RENEW
    assert decide(held("a", T0 - timedelta(hours=1)), "a", T0) is Decision.RENEW  # ours, even stale
    assert decide(held("b", T0), "a", T0 + timedelta(seconds=14)) is Decision.HELD
    assert decide(held("b", T0), "a", T0 + timedelta(seconds=15)) is Decision.HELD  # not yet past
    assert decide(held("b", T0), "a", T0 + timedelta(seconds=15, microseconds=1)) is Decision.ACQUIRE
    assert decide(LeaseRecord("b", 15), "a", T0) is Decision.ACQUIRE  # holder never renewed
    with pytest.raises(ValueError):
        decide(LeaseRecord(), "", T0)


def test_next_record_renewal_keeps_acquire_time_and_transitions() -> None:
    mine = held("a", T0, transitions=3)
    later = T0 + timedelta(seconds=2)
    renewed = next_record(mine, "a", later, 15)
    assert renewed == LeaseRecord("a", 15, T0, later, 3)


def test_next_record_takeover_counts_a_transition() -> None:
    later = T0 + timedelta(seconds=60)
    assert next_record(held("b", T0, transitions=3), "a", later, 10) == LeaseRecord("a", 10, later, later, 4)
    assert first_record("a", T0, 15) == LeaseRecord("a", 15, T0, T0, 0)


def test_released_record_is_free_at_once() -> None:
    released = released_record(held("a", T0, transitions=2), T0)
    assert released.holder == "" and released.transitions == 2
    assert decide(released, "b", T0) is Decision.ACQUIRE
    assert released.to_spec()["holderIdentity"] is None


def test_micro_time_always_has_six_digits_in_utc() -> None:
    assert format_micro_time(T0) == "2026-11-26T12:00:00.000000Z"
    plus_two = datetime(2026, 11, 26, 14, 0, 0, 5, tzinfo=timezone(timedelta(hours=2)))
    assert format_micro_time(plus_two) == "2026-11-26T12:00:00.000005Z"
    with pytest.raises(ValueError):
        format_micro_time(datetime(2026, 1, 1))
    assert parse_time("2026-11-26T12:00:00.000005Z") == T0 + timedelta(microseconds=5)
    assert parse_time(datetime(2026, 11, 26, 12)) == T0  # naive means UTC
    assert parse_time(None) is None and parse_time("") is None


def test_wire_time_never_sends_a_zero_fraction() -> None:
    # The client re-serialises the body with isoformat(), which would drop ".000000".
    assert wire_time(T0) == "2026-11-26T12:00:00.000001Z"
    assert wire_time(T0 + timedelta(microseconds=250)) == "2026-11-26T12:00:00.000250Z"


def test_record_from_model_and_dict_and_back() -> None:
    start = T0 + timedelta(microseconds=123)
    record = LeaseRecord("a", 15, start, start + timedelta(seconds=1), 2)
    spec = record.to_spec()
    assert spec == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-11-26T12:00:00.000123Z",
        "renewTime": "2026-11-26T12:00:01.000123Z",
        "leaseTransitions": 2,
    }
    assert LeaseRecord.from_spec(spec) == record
    model = k8s.V1Lease.from_dict(lease_body("ns", "l", record, "7")).spec
    assert LeaseRecord.from_spec(model) == record
    assert LeaseRecord.from_spec(None) == LeaseRecord()


def test_lease_body_is_conditional_only_with_a_resource_version() -> None:
    body = lease_body("ns", "l", LeaseRecord("a", 15, T0, T0), "42", {"app": "x"})
    assert body["metadata"] == {
        "name": "l",
        "namespace": "ns",
        "resourceVersion": "42",
        "labels": {"app": "x"},
    }
    assert "resourceVersion" not in lease_body("ns", "l", LeaseRecord())["metadata"]


@pytest.mark.parametrize(
    ("lease", "deadline", "retry"),
    [(15, 10, 0), (15, 10, 9), (10, 10, 2), (15.5, 10, 2)],
)
def test_bad_timings_are_refused(lease: float, deadline: float, retry: float) -> None:
    with pytest.raises(ValueError):
        check_timings(lease, deadline, retry)


def test_default_timings_are_clients_gos() -> None:
    check_timings(15, 10, 2)


# --------------------------------------------------------------------------- in-memory Lease API


class FakeLeases:
    """The three CoordinationV1Api calls the elector makes, on one in-memory Lease store."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.fail_with: int | None = None  # every call raises ApiException(status) while set
        self.writes = 0

    def _check(self) -> None:
        if self.fail_with is not None:
            raise k8s.ApiException(status=self.fail_with, reason="injected")

    def _store(self, key: tuple[str, str], body: dict[str, Any]) -> None:
        self.version += 1
        self.writes += 1
        body = json.loads(json.dumps(body))
        body["metadata"]["resourceVersion"] = str(self.version)
        self.leases[key] = body

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> k8s.V1Lease:
        self._check()
        if (namespace, name) not in self.leases:
            raise k8s.ApiException(status=404, reason="NotFound")
        return k8s.V1Lease.from_dict(self.leases[(namespace, name)])

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self._check()
        key = (namespace, body["metadata"]["name"])
        if key in self.leases:
            raise k8s.ApiException(status=409, reason="AlreadyExists")
        self._store(key, body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self._check()
        current = self.leases[(namespace, name)]
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise k8s.ApiException(status=409, reason="Conflict")
        self._store((namespace, name), body)

    def record(self, namespace: str = "ns", name: str = "lease") -> LeaseRecord:
        return LeaseRecord.from_spec(self.leases[(namespace, name)]["spec"])


def fake_elector(api: Any, identity: str, clock: FakeClock, **timings: float) -> LeaderElector:
    settings: dict[str, Any] = {"lease_seconds": 15, "renew_deadline": 10, "retry_period": 2, **timings}
    return LeaderElector(api, "ns", "lease", identity, clock=clock, monotonic=clock.monotonic, **settings)


def test_one_of_two_electors_leads_until_the_lease_expires() -> None:
    api, clock = FakeLeases(), FakeClock()
    a, b = fake_elector(api, "a", clock), fake_elector(api, "b", clock)
    assert a.step() is Outcome.ACQUIRED and a.is_leader
    assert b.step() is Outcome.HELD and not b.is_leader and b.holder == "a"
    clock.advance(2)
    assert a.step() is Outcome.RENEWED
    clock.advance(15)
    assert b.step() is Outcome.HELD  # renewed 15 s ago: not yet expired
    assert not a.is_leader  # but a has not renewed for longer than renew_deadline
    clock.advance(0.001)
    assert b.step() is Outcome.ACQUIRED and b.is_leader
    assert api.record() == LeaseRecord("b", 15, clock.now, clock.now, 1)
    assert a.step() is Outcome.HELD and not a.is_leader


def test_a_stale_read_loses_with_a_conflict() -> None:
    api, clock = FakeLeases(), FakeClock()
    a, b = fake_elector(api, "a", clock), fake_elector(api, "b", clock)
    a.step()
    clock.advance(60)
    stale = api.read_namespaced_lease("lease", "ns")
    assert b.step() is Outcome.ACQUIRED

    class StaleRead(FakeLeases):
        def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> k8s.V1Lease:
            return stale

    api.__class__ = StaleRead  # a reads the lease as it was before b took it over
    assert a.step() is Outcome.LOST_RACE and not a.is_leader
    api.__class__ = FakeLeases
    assert api.record().holder == "b"


def test_errors_keep_the_leader_only_until_the_renew_deadline() -> None:
    api, clock = FakeLeases(), FakeClock()
    a = fake_elector(api, "a", clock)
    assert a.try_acquire_or_renew()
    api.fail_with = 500
    clock.advance(2)
    assert a.step() is Outcome.ERROR and a.is_leader
    clock.advance(8)
    assert not a.is_leader
    api.fail_with = None
    assert a.step() is Outcome.RENEWED and a.is_leader


class SlowLeases(FakeLeases):
    """A Lease API whose every call answers just under its client timeout (on the fake clock).

    The answers are right, only late, as from an overloaded apiserver: the wait comes before
    the call takes effect, so a write lands at the end of it.
    """

    EARLY = 0.01  # how much sooner than its timeout each call answers, in seconds

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def _wait(self, kwargs: dict[str, Any]) -> None:
        self.clock.advance(kwargs["_request_timeout"] - self.EARLY)

    def read_namespaced_lease(self, name: str, namespace: str, **kwargs: Any) -> k8s.V1Lease:
        self._wait(kwargs)
        return super().read_namespaced_lease(name, namespace)

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **kwargs: Any) -> None:
        self._wait(kwargs)
        super().create_namespaced_lease(namespace, body)

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: dict[str, Any], **kwargs: Any
    ) -> None:
        self._wait(kwargs)
        super().replace_namespaced_lease(name, namespace, body)


@pytest.mark.parametrize("first", ["acquire", "renew"])
def test_a_slow_step_keeps_the_margin_before_the_lease_expires(first: str) -> None:
    # On the default timings each call may take 5 s, so a read and a write that answer just in
    # time end almost 10 s after the renewTime they wrote. The leader must stop leading
    # renew_deadline (10 s) after that renewTime, lease_seconds - renew_deadline (5 s) before a
    # candidate may take the Lease over; counted from the end of the write, that margin was ~0 s.
    clock = FakeClock(T0 + timedelta(microseconds=500))  # a non-zero fraction travels unchanged
    api = SlowLeases(clock)
    a, b = fake_elector(api, "a", clock), fake_elector(api, "b", clock)
    if first == "renew":
        assert a.step() is Outcome.ACQUIRED
        clock.advance(2)
    began = clock.now
    assert a.step() is (Outcome.ACQUIRED if first == "acquire" else Outcome.RENEWED)
    assert api.record().renew_time == began and api.record().holder == "a"
    assert clock.now - began > timedelta(seconds=9.9)  # both calls took almost their timeout
    assert a.is_leader  # within renew_deadline of the renewTime it wrote
    clock.advance(10.001 - (clock.now - began).total_seconds())
    assert not a.is_leader  # renew_deadline after that renewTime
    clock.advance(5)
    expiry = api.record().expiry()
    assert expiry is not None and clock.now > expiry
    assert not a.is_leader  # the Lease has expired: b may take it now ...
    assert b.step() is Outcome.ACQUIRED  # ... and does
    assert not a.is_leader


def test_release_frees_the_lease_and_is_a_no_op_for_a_follower() -> None:
    api, clock = FakeLeases(), FakeClock()
    a, b = fake_elector(api, "a", clock), fake_elector(api, "b", clock)
    a.step()
    assert not b.release()
    writes = api.writes
    assert b.step() is Outcome.HELD and api.writes == writes
    assert a.release() and not a.is_leader
    assert api.record().holder == ""
    assert b.step() is Outcome.ACQUIRED
    assert not a.release()


def test_run_calls_back_and_stops_when_another_holder_shows_up() -> None:
    api, clock = FakeLeases(), FakeClock()
    a = fake_elector(api, "a", clock, lease_seconds=3, renew_deadline=2, retry_period=0.01)
    started, stopped, stop = threading.Event(), threading.Event(), threading.Event()
    results: list[bool] = []
    thread = threading.Thread(target=lambda: results.append(a.run(started.set, stopped.set, stop)))
    thread.start()
    assert started.wait(5)
    body = api.leases[("ns", "lease")]
    body["spec"]["holderIdentity"] = "intruder"
    api._store(("ns", "lease"), body)
    assert stopped.wait(5)
    thread.join(5)
    assert results == [False] and not a.is_leader
    assert api.record().holder == "intruder"  # losing never writes


def test_run_gives_up_after_the_renew_deadline() -> None:
    api, clock = FakeLeases(), FakeClock()
    a = fake_elector(api, "a", clock, lease_seconds=3, renew_deadline=2, retry_period=0.01)
    started, stopped, stop = threading.Event(), threading.Event(), threading.Event()
    thread = a.start(started.set, stopped.set, stop)
    assert started.wait(5)
    api.fail_with = 503
    time.sleep(0.1)
    assert not stopped.is_set()  # failures within the deadline are tolerated
    clock.advance(2)
    assert stopped.wait(5)
    thread.join(5)
    assert not thread.is_alive()


def test_run_stop_before_leading_calls_nothing() -> None:
    api, clock = FakeLeases(), FakeClock()
    calls: list[str] = []
    stop = threading.Event()
    stop.set()
    elector = fake_elector(api, "a", clock)
    assert elector.run(lambda: calls.append("start"), lambda: calls.append("stop"), stop)
    assert calls == [] and api.leases == {}


# --------------------------------------------------------------------------- the real apiserver

ElectorFactory = Callable[..., LeaderElector]
SHORT: dict[str, Any] = {"lease_seconds": 2, "renew_deadline": 1.5, "retry_period": 0.2}


@pytest.fixture
def electors(admin_api: k8s.ApiClient, kube_namespace: str) -> ElectorFactory:
    """Factory ``(identity, lease=name) -> LeaderElector`` on short timings in the test namespace."""
    coordination = k8s.CoordinationV1Api(admin_api)
    default_lease = f"lease-{uuid.uuid4().hex[:6]}"

    def make(identity: str, lease: str = default_lease) -> LeaderElector:
        return LeaderElector(coordination, kube_namespace, lease, identity, **SHORT)

    return make


def raw_lease(api: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    response = k8s.CoordinationV1Api(api).read_namespaced_lease(name, namespace, _preload_content=False)
    return json.loads(response.data)


@pytest.mark.apiserver
def test_api_exactly_one_acquires_and_the_other_waits(
    electors: ElectorFactory, admin_api: k8s.ApiClient, kube_namespace: str
) -> None:
    a, b = electors("replica-a"), electors("replica-b")
    assert a.try_acquire_or_renew()
    for _ in range(4):
        assert not b.try_acquire_or_renew() and b.holder == "replica-a"
        assert a.try_acquire_or_renew()
        time.sleep(0.2)
    spec = raw_lease(admin_api, kube_namespace, a.name)["spec"]
    assert spec["holderIdentity"] == "replica-a" and spec["leaseDurationSeconds"] == 2
    assert spec["leaseTransitions"] == 0
    assert MICRO_TIME.match(spec["renewTime"]) and MICRO_TIME.match(spec["acquireTime"]), spec
    assert spec["renewTime"] > spec["acquireTime"]


@pytest.mark.apiserver
def test_api_a_stale_lease_is_taken_over(electors: ElectorFactory) -> None:
    a, b = electors("replica-a"), electors("replica-b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    deadline = time.monotonic() + 10
    while not b.try_acquire_or_renew():  # a stopped renewing: the lease expires after 2 s
        assert time.monotonic() < deadline, "replica-b never took the expired lease"
        time.sleep(0.2)
    waited = 10 - (deadline - time.monotonic())
    assert 1.0 < waited < 6.0, waited
    assert b.observed is not None and b.observed.transitions == 1
    assert not a.try_acquire_or_renew() and a.holder == "replica-b"


@pytest.mark.apiserver
def test_api_release_hands_over_at_once(
    electors: ElectorFactory, admin_api: k8s.ApiClient, kube_namespace: str
) -> None:
    a, b = electors("replica-a"), electors("replica-b")
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    assert a.release() and not a.is_leader
    assert raw_lease(admin_api, kube_namespace, a.name)["spec"].get("holderIdentity") is None
    assert b.try_acquire_or_renew()
    assert not a.try_acquire_or_renew()


class ReadThenWait:
    """A CoordinationV1Api whose reads all return before any candidate writes.

    Every read waits at a barrier shared by the contenders, so each of them decides on the same
    state of the Lease and all of them then write: the apiserver must refuse all but one.
    """

    def __init__(self, api: k8s.CoordinationV1Api, barrier: threading.Barrier) -> None:
        self.api, self.barrier = api, barrier

    def read_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.api.read_namespaced_lease(*args, **kwargs)
        finally:
            self.barrier.wait(30)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)


def race(api: k8s.ApiClient, namespace: str, lease: str, identities: list[str]) -> list[Outcome]:
    """One step of each candidate, all having read the Lease before any writes; the outcomes."""
    barrier = threading.Barrier(len(identities))
    racing = ReadThenWait(k8s.CoordinationV1Api(api), barrier)
    contenders = [LeaderElector(racing, namespace, lease, identity, **SHORT) for identity in identities]
    outcomes: list[Outcome | None] = [None] * len(contenders)

    def go(index: int) -> None:
        outcomes[index] = contenders[index].step()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(contenders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sum(e.is_leader for e in contenders) == 1
    return [outcome for outcome in outcomes if outcome is not None]


IDENTITIES = ["replica-a", "replica-b", "replica-c"]


@pytest.mark.apiserver
def test_api_racing_on_a_missing_lease_exactly_one_wins(
    admin_api: k8s.ApiClient, kube_namespace: str
) -> None:
    for round_ in range(20):
        lease = f"race-{round_}"
        outcomes = race(admin_api, kube_namespace, lease, IDENTITIES[:2])
        # Both saw 404 and both created: one create wins, the other gets 409 AlreadyExists.
        assert sorted(o.value for o in outcomes) == ["acquired", "lost_race"], outcomes
    outcomes = race(admin_api, kube_namespace, "race-three", IDENTITIES)
    assert sorted(o.value for o in outcomes) == ["acquired", "lost_race", "lost_race"], outcomes


@pytest.mark.apiserver
def test_api_racing_on_an_expired_lease_exactly_one_wins(
    admin_api: k8s.ApiClient, kube_namespace: str
) -> None:
    coordination = k8s.CoordinationV1Api(admin_api)
    old = datetime.now(UTC) - timedelta(minutes=1)
    for round_ in range(20):
        lease = f"expired-{round_}"
        expired = lease_body(kube_namespace, lease, held("gone", old, 2))
        coordination.create_namespaced_lease(kube_namespace, expired)
        outcomes = race(admin_api, kube_namespace, lease, IDENTITIES[:2])
        # Both read the same expired lease and updated it: one wins, the other gets 409 Conflict.
        assert sorted(o.value for o in outcomes) == ["acquired", "lost_race"], outcomes
        spec = raw_lease(admin_api, kube_namespace, lease)["spec"]
        assert spec["leaseTransitions"] == 1 and spec["holderIdentity"] in IDENTITIES


@pytest.mark.apiserver
def test_api_run_hands_over_on_stop_and_steps_down_when_overwritten(
    admin_api: k8s.ApiClient, kube_namespace: str
) -> None:
    # A 10 s lease: a handover well within that can only come from the release.
    coordination = k8s.CoordinationV1Api(admin_api)
    lease = f"handover-{uuid.uuid4().hex[:6]}"
    a, b = (
        LeaderElector(
            coordination,
            kube_namespace,
            lease,
            identity,
            lease_seconds=10,
            renew_deadline=1.5,
            retry_period=0.2,
        )
        for identity in ("replica-a", "replica-b")
    )
    events = {key: threading.Event() for key in ("a-led", "a-stopped", "b-led", "b-stopped")}
    stop_a, stop_b = threading.Event(), threading.Event()
    thread_a = a.start(events["a-led"].set, events["a-stopped"].set, stop_a)
    assert events["a-led"].wait(10)
    thread_b = b.start(events["b-led"].set, events["b-stopped"].set, stop_b)
    time.sleep(2.0)
    # a keeps renewing: is_leader needs a renewal within the last renew_deadline (1.5 s).
    assert not events["b-led"].is_set() and a.is_leader

    began = time.monotonic()
    stop_a.set()
    thread_a.join(10)
    assert events["a-stopped"].is_set() and not a.is_leader
    assert events["b-led"].wait(10)
    assert time.monotonic() - began < 5  # released: no wait for the 10 s lease to expire

    # Someone else writes the lease: b sees another holder at its next renewal and steps down.
    patch = {"spec": {"holderIdentity": "intruder"}}
    k8s.CoordinationV1Api(admin_api).patch_namespaced_lease(
        b.name, kube_namespace, patch, _content_type=MERGE_PATCH
    )
    assert events["b-stopped"].wait(10)
    thread_b.join(10)
    assert not thread_b.is_alive() and not b.is_leader
    assert raw_lease(admin_api, kube_namespace, b.name)["spec"]["holderIdentity"] == "intruder"
