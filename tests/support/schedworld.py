"""An in-memory apiserver for the live scheduler's tests: Nodes and Pods as JSON, watch logs,
scripted Binding answers, a fake clock and captured binder jobs.

Nothing here starts a thread or touches the network. ``World`` holds the objects and appends
every change to a per-resource event log; ``Feed`` delivers those logs (in order, any amount at a
time, or skipped and replaced by a relist) to one scheduler; ``FakeCore`` is the ``CoreV1Api``
the scheduler calls, answering Bindings as ``bind_outcomes`` says; ``Jobs`` holds what the
scheduler hands to its binder pool until a test runs it.

Typical use::

    world = World()
    world.add_node(node_json("n1", gpus=4))
    sched, jobs = make_scheduler(world)
    feed = Feed(world, sched); feed.relist()
    world.add_pod(pod_json("p", gpus=1)); feed.sync()
    sched.schedule_next(0); jobs.run_all(); feed.sync()
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from crishim.advertiser import HEARTBEAT_ANNOTATION, INVENTORY_ANNOTATION, publication
from devices.model import Device, DeviceKind, NodeInventory
from kubegpu.allocation import ANNOTATION, KeyRing, verify
from scheduler.live.config import SchedulerConfig
from scheduler.live.podgroups import KUBE_API, PLUGINS_API
from scheduler.live.scheduler import Scheduler
from tests.fixtures.keys import SIGNING, public

KEYS = public()  # verifying keys; the scheduler signs with SIGNING (tests.fixtures.keys)
GPU_MEMORY_MIB = 40960
GROUP_APIS = (PLUGINS_API, KUBE_API)  # the two PodGroup APIs, each a watch log of its own


def gpu_id(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


def inventory_json(gpus: Iterable[tuple[str, bool]], nics: Iterable[str] = ()) -> str:
    """The ``kubegpu.io/inventory`` value of a node with these (GPU id, healthy) in index order."""
    devices = [
        Device(gid, DeviceKind.GPU, index, "A100", GPU_MEMORY_MIB, numa_node=index // 4, healthy=healthy)
        for index, (gid, healthy) in enumerate(gpus)
    ]
    devices += [Device(nic, DeviceKind.RDMA, i, "CX6") for i, nic in enumerate(nics)]
    return publication(NodeInventory(tuple(devices))).inventory


def now_stamp() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def beating_at(node: dict[str, Any], at: dt.datetime) -> dict[str, Any]:
    """A copy of ``node`` whose device heartbeat is ``at``: for a cache on a test's own clock, which
    would read the real clock's heartbeat of ``node_json`` as from the future once the suite has run
    past the skew allowed."""
    node = copy.deepcopy(node)
    node["metadata"]["annotations"][HEARTBEAT_ANNOTATION] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    return node


def plugins_group(name: str, min_member: int | Any, **spec: Any) -> dict[str, Any]:
    """A scheduler-plugins PodGroup (scheduling.x-k8s.io/v1alpha1) in namespace ``ns``."""
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"minMember": min_member, **spec},
    }


def node_json(
    name: str,
    gpus: int | list[tuple[str, bool]] = 4,
    *,
    cpu: str = "64",
    memory: str = "256Gi",
    pods: str | None = "110",
    gpu_count: str | None = None,
    cordoned: bool = False,
    inventory: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Node as kubelet plus the advertiser leave it (``inventory`` overrides the annotation)."""
    if isinstance(gpus, int):
        gpus = [(gpu_id(name, i), True) for i in range(gpus)]
    allocatable = {"cpu": cpu, "memory": memory}
    if pods is not None:
        allocatable["pods"] = pods
    healthy = sum(1 for _, ok in gpus if ok)
    allocatable["nvidia.com/gpu"] = gpu_count if gpu_count is not None else str(healthy)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": dict(labels or {}),
            "annotations": {
                INVENTORY_ANNOTATION: inventory if inventory is not None else inventory_json(gpus),
                HEARTBEAT_ANNOTATION: now_stamp(),
            },
        },
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }


_CREATED = itertools.count()


def pod_json(
    name: str,
    gpus: int = 0,
    *,
    uid: str | None = None,
    cpu: str = "1",
    memory: str = "1Gi",
    scheduler: str = "kubegpu",
    node: str | None = None,
    annotations: dict[str, str] | None = None,
    priority: int | None = None,
    created: str | None = None,
    namespace: str = "ns",
    init: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    group: str | None = None,
) -> dict[str, Any]:
    """A Pod as the API serves it; ``created`` defaults to a fresh, strictly later timestamp."""
    if created is None:
        created = (dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=next(_CREATED))).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [
            {
                "name": "app",
                "image": "x",
                "resources": {"requests": {"cpu": cpu, "memory": memory, **limits}, "limits": limits},
            }
        ],
    }
    if init:
        spec["initContainers"] = init
    if node:
        spec["nodeName"] = node
    if priority is not None:
        spec["priority"] = priority
    if group is not None:  # Kubernetes' own PodGroup (scheduling.k8s.io)
        spec["schedulingGroup"] = {"podGroupName": group}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}),
            "creationTimestamp": created,
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


class World:
    """The apiserver's objects and, per resource, the log of watch events it served."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> pod
        self.rv = 0
        self.groups: dict[tuple[str, str, str], dict[str, Any]] = {}  # (api, namespace, name) -> PodGroup
        self.logs: dict[str, list[tuple[str, dict[str, Any]]]] = {"nodes": [], "pods": []}
        for api in GROUP_APIS:
            self.logs[api] = []

    def _emit(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.logs[resource].append((kind, copy.deepcopy(obj)))

    def put_node(self, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        kind = "MODIFIED" if name in self.nodes else "ADDED"
        self.nodes[name] = copy.deepcopy(node)
        self._emit("nodes", kind, self.nodes[name])

    def delete_node(self, name: str) -> None:
        node = self.nodes.pop(name)
        self._emit("nodes", "DELETED", node)

    def put_pod(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        kind = "MODIFIED" if uid in self.pods else "ADDED"
        self.pods[uid] = copy.deepcopy(pod)
        self._emit("pods", kind, self.pods[uid])

    def delete_pod(self, uid: str) -> None:
        pod = self.pods.pop(uid)
        self._emit("pods", "DELETED", pod)

    def put_group(self, api: str, group: dict[str, Any]) -> None:
        meta = group["metadata"]
        key = (api, meta.get("namespace", "ns"), meta["name"])
        kind = "MODIFIED" if key in self.groups else "ADDED"
        meta.setdefault("uid", f"uid-pg-{meta['name']}")
        self.groups[key] = copy.deepcopy(group)
        self._emit(api, kind, self.groups[key])

    def delete_group(self, api: str, name: str, namespace: str = "ns") -> None:
        self._emit(api, "DELETED", self.groups.pop((api, namespace, name)))

    def group(self, api: str, name: str, namespace: str = "ns") -> dict[str, Any]:
        return self.groups[(api, namespace, name)]

    def find(self, namespace: str, name: str) -> dict[str, Any] | None:
        for pod in self.pods.values():
            if pod["metadata"]["namespace"] == namespace and pod["metadata"]["name"] == name:
                return pod
        return None

    def bind(self, namespace: str, name: str, body: dict[str, Any]) -> int:
        """Store a Binding as the apiserver does; returns 201, 404 or 409."""
        pod = self.find(namespace, name)
        if pod is None:
            return 404
        uid = (body.get("metadata") or {}).get("uid")
        if uid and uid != pod["metadata"]["uid"]:
            return 409
        if pod["spec"].get("nodeName"):
            return 409
        pod = copy.deepcopy(pod)
        pod["spec"]["nodeName"] = body["target"]["name"]
        pod["metadata"]["annotations"].update((body.get("metadata") or {}).get("annotations") or {})
        self.put_pod(pod)
        return 201

    def list_body(self, resource: str) -> dict[str, Any]:
        if resource in GROUP_APIS:
            items: Any = [g for (api, _, _), g in self.groups.items() if api == resource]
        else:
            items = self.nodes.values() if resource == "nodes" else self.pods.values()
        return {"metadata": {"resourceVersion": str(self.rv)}, "items": copy.deepcopy(list(items))}

    # --- what the tests check -----------------------------------------------------------------

    def device_holders(self) -> dict[str, list[tuple[str, int]]]:
        """device id -> [(pod name, milli)] over the live pods' verified allocations."""
        holders: dict[str, list[tuple[str, int]]] = {}
        for pod in self.pods.values():
            raw = pod["metadata"]["annotations"].get(ANNOTATION)
            if not raw or not pod["spec"].get("nodeName"):
                continue
            allocation = verify(raw, KEYS)
            seen: dict[str, int] = {}
            for entry in allocation.containers.values():
                for device in entry.devices:
                    share = entry.shares.get(device)
                    seen[device] = 1000 if share is None else min(1000, seen.get(device, 0) + share.milli)
            for device, milli in seen.items():
                holders.setdefault(device, []).append((pod["metadata"]["name"], milli))
        return holders

    def double_booked(self) -> dict[str, list[tuple[str, int]]]:
        """The devices that live pods' allocations hold beyond their capacity."""
        return {d: h for d, h in self.device_holders().items() if sum(m for _, m in h) > 1000}

    def devices_of(self, name: str, namespace: str = "ns") -> list[str]:
        pod = self.find(namespace, name)
        assert pod is not None, name
        raw = pod["metadata"]["annotations"].get(ANNOTATION)
        if raw is None:
            return []
        return sorted({d for e in verify(raw, KEYS).containers.values() for d in e.devices})

    def node_of(self, name: str, namespace: str = "ns") -> str | None:
        pod = self.find(namespace, name)
        return None if pod is None else pod["spec"].get("nodeName")


class Response:
    """What the client returns with ``_preload_content=False``."""

    def __init__(self, body: Any) -> None:
        self.data = json.dumps(body).encode()

    def release_conn(self) -> None:
        pass


def connection_error() -> Exception:
    pool = urllib3.HTTPConnectionPool("127.0.0.1", 1)
    return urllib3.exceptions.MaxRetryError(
        pool, "/api/v1/binding", urllib3.exceptions.NewConnectionError(pool, "connection refused")
    )


def read_timeout() -> Exception:
    pool = urllib3.HTTPConnectionPool("127.0.0.1", 1)
    return urllib3.exceptions.ReadTimeoutError(pool, "/api/v1/binding", "read timed out")


# What a Binding POST does: (store it?, what to raise afterwards or None)
OUTCOMES: dict[str, tuple[bool, Callable[[], Exception] | None]] = {
    "ok": (True, None),
    "500": (False, lambda: ApiException(status=500, reason="Internal Server Error")),
    "500-after-commit": (True, lambda: ApiException(status=500, reason="etcdserver: request timed out")),
    "504-after-commit": (True, lambda: ApiException(status=504, reason="Gateway Timeout")),
    "timeout-after-commit": (True, read_timeout),
    "timeout": (False, read_timeout),
    "connection": (False, connection_error),
    "409": (False, lambda: ApiException(status=409, reason="Conflict")),
    "403": (False, lambda: ApiException(status=403, reason="Forbidden")),
    "429": (False, lambda: ApiException(status=429, reason="Too Many Requests")),
}


def core_view(event: dict[str, Any]) -> dict[str, Any]:
    """An Event as core/v1 shows it: an events.k8s.io/v1 one converted as the apiserver converts it
    (regarding -> involvedObject, note -> message, reportingController -> reportingComponent)."""
    if event.get("apiVersion") != "events.k8s.io/v1":
        return event
    view = {k: v for k, v in event.items() if k not in ("regarding", "note", "reportingController")}
    view.update(
        apiVersion="v1",
        involvedObject=event["regarding"],
        message=event.get("note", ""),
        reportingComponent=event.get("reportingController", ""),
    )
    return view


@dataclass
class FakeCore:
    """The ``CoreV1Api`` calls the scheduler makes, against a ``World``."""

    world: World
    # Binding answer per call: "ok" or an OUTCOMES key; called with (namespace, name, body)
    bind_outcome: Callable[[str, str, dict[str, Any]], str] = lambda ns, name, body: "ok"
    read_error: Callable[[], Exception] | None = None  # raise this from read_namespaced_pod
    list_error: Callable[[], Exception] | None = None
    binds: list[tuple[str, str, str]] = field(default_factory=list)  # (pod, node, outcome)
    events: list[dict[str, Any]] = field(default_factory=list)  # as core/v1 shows them
    posted: list[dict[str, Any]] = field(default_factory=list)  # the bodies as posted
    status_patches: list[dict[str, Any]] = field(default_factory=list)
    reads: int = 0

    def create_namespaced_pod_binding(self, name: str, namespace: str, body: Any, **_: Any) -> Response:
        outcome = self.bind_outcome(namespace, name, body)
        self.binds.append((f"{namespace}/{name}", body["target"]["name"], outcome))
        store, then = OUTCOMES[outcome]
        if store:
            status = self.world.bind(namespace, name, body)
            if status == 404:
                raise ApiException(status=404, reason="Not Found")
            if status == 409:
                raise ApiException(status=409, reason="Conflict")
        if then is not None:
            raise then()
        return Response(body)

    def read_namespaced_pod(self, name: str, namespace: str, **_: Any) -> Response:
        self.reads += 1
        if self.read_error is not None:
            raise self.read_error()
        pod = self.world.find(namespace, name)
        if pod is None:
            raise ApiException(status=404, reason="Not Found")
        return Response(pod)

    def create_namespaced_event(self, namespace: str, body: Any, **_: Any) -> Response:
        """Either events API (this fake serves as the ``EventsV1Api`` too): recorded as posted,
        and as the apiserver shows it through core/v1 (``kubectl get events``)."""
        self.posted.append(body)
        self.events.append(core_view(body))
        return Response(body)

    def patch_namespaced_pod_status(self, name: str, namespace: str, body: Any, **_: Any) -> Response:
        self.status_patches.append(body)
        return Response(body)

    def list_node(self, **kwargs: Any) -> Response:
        assert not kwargs.get("watch"), "the tests feed watch events themselves"
        if self.list_error is not None:
            raise self.list_error()
        return Response(self.world.list_body("nodes"))

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Response:
        assert not kwargs.get("watch"), "the tests feed watch events themselves"
        if self.list_error is not None:
            raise self.list_error()
        return Response(self.world.list_body("pods"))

    def failed_events(self, pod: str) -> list[str]:
        return [e["message"] for e in self.events if e["involvedObject"]["name"] == pod]


@dataclass
class FakeCustom:
    """The ``CustomObjectsApi`` calls the scheduler makes (PodGroup status), against a ``World``."""

    world: World
    patches: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # (api, name, body)
    patch_error: Callable[[], Exception] | None = None

    def patch_namespaced_custom_object_status(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any, **_: Any
    ) -> Response:
        if self.patch_error is not None:
            raise self.patch_error()
        key = (group, namespace, name)
        if key not in self.world.groups:
            raise ApiException(status=404, reason="Not Found")
        self.patches.append((group, name, copy.deepcopy(body)))
        stored = copy.deepcopy(self.world.groups[key])
        status = stored.setdefault("status", {})
        for field_name, value in body.get("status", {}).items():
            if value is None:
                status.pop(field_name, None)
            else:
                status[field_name] = value
        self.world.put_group(group, stored)
        return Response(stored)

    def list_cluster_custom_object(self, group: str, version: str, plural: str, **kwargs: Any) -> Response:
        assert not kwargs.get("watch"), "the tests feed watch events themselves"
        return Response(self.world.list_body(group))


class Jobs:
    """The binder pool, captured: jobs run only when a test says, in the order it says."""

    def __init__(self) -> None:
        self.pending: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.errors: list[BaseException] = []

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self.pending.append((fn, args))

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        self.pending.clear()

    def run(self, index: int = 0) -> None:
        fn, args = self.pending.pop(index)
        try:
            fn(*args)
        except Exception as error:  # a future would swallow it; the tests look at it
            self.errors.append(error)

    def run_all(self) -> None:
        while self.pending:
            self.run(0)

    def binds(self) -> list[int]:
        return [i for i, (fn, _) in enumerate(self.pending) if getattr(fn, "__name__", "") == "_bind"]


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_scheduler(
    world: World,
    name: str = "kubegpu",
    clock: Clock | None = None,
    seed: int = 1,
    **overrides: Any,
) -> tuple[Scheduler, Jobs, FakeCore, Clock]:
    """A scheduler wired to ``world``: nothing runs until the test calls it."""
    clock = clock or Clock()
    jobs = Jobs()
    core = FakeCore(world)
    config = SchedulerConfig(
        scheduler_name=name, policy=overrides.pop("policy", "bestfit"), signing_key_id="k1", **overrides
    )
    scheduler = Scheduler(
        config,
        k8s.ApiClient(),
        KeyRing(None, SIGNING),
        seed=seed,
        clock=clock,
        submit=jobs.submit,
        core=core,
        events=core,
        custom_api=FakeCustom(world),
    )
    scheduler._binders.shutdown()
    scheduler._binders = jobs  # type: ignore[assignment]
    scheduler.leading.set()
    return scheduler, jobs, core, clock


class Feed:
    """Delivers a world's watch logs to one scheduler, in order, as much as a test wants."""

    def __init__(self, world: World, scheduler: Scheduler) -> None:
        self.world = world
        self.scheduler = scheduler
        self.cursor = {"nodes": 0, "pods": 0, **{api: 0 for api in GROUP_APIS}}

    def relist(self, resource: str | None = None) -> None:
        """A full list (whatever events were missed), then the watch resumes at the end."""
        for name in [resource] if resource else [*GROUP_APIS, "nodes", "pods"]:
            items = self.world.list_body(name)["items"]
            if name == "nodes":
                self.scheduler.replace_nodes(items)
            elif name in GROUP_APIS:
                self.scheduler.replace_groups(name, items)
            else:
                self.scheduler.replace_pods(items)
            self.cursor[name] = len(self.world.logs[name])

    def sync(self, resource: str | None = None, limit: int | None = None) -> int:
        """Deliver up to ``limit`` pending events of one resource (or all of both)."""
        delivered = 0
        for name in [resource] if resource else [*GROUP_APIS, "nodes", "pods"]:
            log = self.world.logs[name]
            while self.cursor[name] < len(log) and (limit is None or delivered < limit):
                kind, obj = log[self.cursor[name]]
                self.cursor[name] += 1
                delivered += 1
                if name == "nodes":
                    self.scheduler.apply_node(kind, copy.deepcopy(obj))
                elif name in GROUP_APIS:
                    self.scheduler.apply_group(name, kind, copy.deepcopy(obj))
                else:
                    self.scheduler.apply_pod(kind, copy.deepcopy(obj))
        return delivered

    def lag(self, resource: str) -> int:
        return len(self.world.logs[resource]) - self.cursor[resource]

    def skip(self, resource: str) -> None:
        """Lose the pending events (a broken watch); a relist must repair what they said."""
        self.cursor[resource] = len(self.world.logs[resource])


def drive(
    scheduler: Scheduler, jobs: Jobs, feed: Feed, clock: Clock, rounds: int = 50, decide_errors: bool = False
) -> None:
    """Schedule, bind and deliver until nothing is left to do (advancing the clock past backoffs).
    Deciding a pod must not raise (the scheduler survives it, but it is a bug) unless
    ``decide_errors``."""
    try:
        _drive(scheduler, jobs, feed, clock, rounds)
    finally:
        if not decide_errors:
            assert scheduler.metrics.attempts.labels("error")._value.get() == 0, "deciding a pod raised"


def _drive(scheduler: Scheduler, jobs: Jobs, feed: Feed, clock: Clock, rounds: int) -> None:
    for _ in range(rounds):
        progressed = False
        while scheduler.schedule_next(0):
            progressed = True
        if jobs.pending:
            jobs.run_all()
            progressed = True
        if feed.sync():
            progressed = True
        if not progressed:
            clock.advance(61)
            if not scheduler.schedule_next(0) and not jobs.pending and not feed.lag("pods"):
                return
