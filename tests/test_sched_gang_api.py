"""Gang scheduling against a real kube-apiserver (v1.37.2) that serves both PodGroup APIs:
scheduler-plugins' CRD from deploy/crds/ and Kubernetes' own ``scheduling.k8s.io/v1beta1``
(``GenericWorkload`` gate on). The live scheduler places groups whole or not at all, keeps their
status, reports timeouts on the PodGroup, completes a group after a restart, and two replicas
never bind a member twice (docs/gang.md)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from kubegpu.allocation import ANNOTATION, verify
from kubegpu.devenv.controlplane import POD_GROUP_API_ARGS, ControlPlane, ensure_namespace
from kubegpu.devenv.manifests import apply_manifests
from scheduler.live.podgroups import (
    KUBE_API,
    KUBE_VERSION,
    PLUGINS_API,
    PLUGINS_LABEL,
    PLUGINS_VERSION,
    PLURAL,
)
from scheduler.live.scheduler import Scheduler
from tests.support.schedtrial import kubelet_stand_in, priority_classes
from tests.test_scheduler_api import KEYS, advertise, gpu_pod, scheduler_starter

pytestmark = pytest.mark.apiserver

CRDS = Path(__file__).resolve().parents[1] / "deploy" / "crds"


@pytest.fixture(scope="module")
def gang_plane(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane
) -> Iterator[ControlPlane]:
    """A control plane of this module's own, serving both PodGroup APIs."""
    plane = ControlPlane(
        run_dir=tmp_path_factory.mktemp("gang-plane"),
        binaries=control_plane.binaries,
        apiserver_extra_args=POD_GROUP_API_ARGS,
    )
    plane.start()
    api = plane.admin_client()
    apply_manifests(api, [CRDS])
    extensions = k8s.ApiextensionsV1Api(api)
    deadline = time.monotonic() + 30
    while True:
        crd = extensions.read_custom_resource_definition(f"{PLURAL}.{PLUGINS_API}")
        if any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or []):
            break
        assert time.monotonic() < deadline, "the PodGroup CRD was not established"
        time.sleep(0.2)
    try:
        yield plane
    finally:
        api.close()
        plane.stop()


class Gang:
    """One test's slice of the gang plane: a namespace, nodes only its pods select, its scheduler."""

    def __init__(self, api: k8s.ApiClient, state: Path, start: Callable[..., Scheduler]) -> None:
        self.api = api
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.run = uuid.uuid4().hex[:6]
        self.namespace = f"g-{self.run}"
        ensure_namespace(self.core, self.namespace)
        self.state = state
        self.start = start
        self.name = f"kubegpu-{self.run}"

    def node(self, prefix: str, topology: str = "dgx1-v100", **labels: str) -> str:
        name = f"{prefix}-{self.run}"
        advertise(self.core, name, topology, self.state, labels={"run": self.run, **labels})
        return name

    def scheduler(self, **overrides: Any) -> Scheduler:
        return self.start(self.name, **overrides)

    def pod(
        self,
        name: str,
        gpus: int,
        *,
        group: str | None = None,
        kube_group: str | None = None,
        priority_class: str | None = None,
        on: str | None = None,
        scheduler: str | None = None,
    ) -> str:
        selector = {"run": self.run} if on is None else {"run": self.run, "pin": on}
        body = gpu_pod(self.namespace, name, gpus, scheduler=scheduler or self.name, selector=selector)
        if priority_class is not None:
            body["spec"]["priorityClassName"] = priority_class
        if group is not None:
            body["metadata"]["labels"] = {PLUGINS_LABEL: group}
        if kube_group is not None:
            body["spec"]["schedulingGroup"] = {"podGroupName": kube_group}
        self.core.create_namespaced_pod(self.namespace, body)
        return name

    def plugins_group(self, name: str, min_member: int, **spec: Any) -> None:
        body = {
            "apiVersion": f"{PLUGINS_API}/{PLUGINS_VERSION}",
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": {"minMember": min_member, **spec},
        }
        self.custom.create_namespaced_custom_object(
            PLUGINS_API, PLUGINS_VERSION, self.namespace, PLURAL, body
        )

    def kube_group(self, name: str, min_count: int) -> None:
        body = {
            "apiVersion": f"{KUBE_API}/{KUBE_VERSION}",
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}},
        }
        self.custom.create_namespaced_custom_object(KUBE_API, KUBE_VERSION, self.namespace, PLURAL, body)

    def group(self, api: str, name: str) -> dict[str, Any]:
        version = PLUGINS_VERSION if api == PLUGINS_API else KUBE_VERSION
        return self.custom.get_namespaced_custom_object(api, version, self.namespace, PLURAL, name)

    def nodes_of(self, names: list[str]) -> dict[str, str | None]:
        pods = {p.metadata.name: p for p in self.core.list_namespaced_pod(self.namespace).items}
        return {n: pods[n].spec.node_name if n in pods else None for n in names}

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)

    def events(self, name: str, kind: str = "Pod") -> list[k8s.CoreV1Event]:
        return [
            e
            for e in self.core.list_namespaced_event(self.namespace).items
            if e.involved_object.name == name and e.involved_object.kind == kind
        ]

    def event_with(self, name: str, text: str, kind: str = "Pod", timeout: float = 30) -> k8s.CoreV1Event:
        return self.wait(
            f"an event on {kind} {name} containing {text!r}",
            lambda: next((e for e in self.events(name, kind) if text in (e.message or "")), None),
            timeout,
        )

    def bound_whole(self, names: list[str], timeout: float = 60) -> dict[str, str]:
        return self.wait(f"{names} bound", lambda: _all_bound(self.nodes_of(names)), timeout)


def _all_bound(nodes: dict[str, str | None]) -> dict[str, str] | None:
    return {k: v for k, v in nodes.items() if v} if all(nodes.values()) else None


@pytest.fixture
def gang(gang_plane: ControlPlane, tmp_path: Path) -> Iterator[Gang]:
    api = gang_plane.admin_client()
    with scheduler_starter(api) as start:
        yield Gang(api, tmp_path, start)
    api.close()


def test_the_crd_takes_upstream_podgroups_and_their_status(gang: Gang) -> None:
    gang.plugins_group(
        "shape", 2, minResources={"nvidia.com/gpu": "16", "cpu": "500m"}, scheduleTimeoutSeconds=30
    )
    status = {"phase": "Running", "scheduled": 1, "running": 2, "scheduleStartTime": "2026-01-01T00:00:00Z"}
    gang.custom.patch_namespaced_custom_object_status(
        PLUGINS_API, PLUGINS_VERSION, gang.namespace, PLURAL, "shape", {"status": status}
    )
    stored = gang.group(PLUGINS_API, "shape")
    assert stored["spec"]["minResources"] == {"nvidia.com/gpu": "16", "cpu": "500m"}
    assert {k: stored["status"][k] for k in status} == status
    with pytest.raises(k8s.ApiException) as refused:
        gang.plugins_group("zero", 0)
    assert refused.value.status == 422  # minMember at least 1, as upstream's schema says


def test_a_group_that_only_fits_across_two_nodes_is_bound_whole(gang: Gang) -> None:
    gang.node("a")
    gang.node("b")
    gang.scheduler(gang_member_grace_seconds=1.0)  # told after 1 s short of members, not 10
    gang.plugins_group("train", 2)
    gang.pod("w0", 8, group="train")
    first = gang.event_with("w0", "has 1 of its 2 minimum members; waiting for the others")
    assert first.reason == "FailedScheduling"
    assert gang.nodes_of(["w0"]) == {"w0": None}
    gang.pod("w1", 8, group="train")
    nodes = gang.bound_whole(["w0", "w1"])
    assert sorted(nodes.values()) == sorted([f"a-{gang.run}", f"b-{gang.run}"])
    for pod in gang.core.list_namespaced_pod(gang.namespace).items:
        allocation = verify(pod.metadata.annotations[ANNOTATION], KEYS)
        assert allocation.node == pod.spec.node_name and len(allocation.containers["app"].devices) == 8
    status = gang.wait(
        "PodGroup status Scheduled",
        lambda: (gang.group(PLUGINS_API, "train").get("status") or {}).get("scheduled"),
    )
    assert status == 2
    stored = gang.group(PLUGINS_API, "train")["status"]
    assert stored["phase"] == "Scheduled" and stored["scheduleStartTime"]


def test_two_competing_groups_one_goes_whole_and_the_other_waits_then_times_out(gang: Gang) -> None:
    gang.node("a")
    gang.node("b")
    gang.scheduler(gang_timeout_seconds=3.0)
    gang.plugins_group("x", 2)
    gang.plugins_group("y", 2)
    for name, group in (("x0", "x"), ("y0", "y"), ("x1", "x"), ("y1", "y")):
        gang.pod(name, 8, group=group)
    nodes = gang.wait(
        "one group bound whole",
        lambda: _all_bound(gang.nodes_of(["x0", "x1"])) or _all_bound(gang.nodes_of(["y0", "y1"])),
    )
    winner = "x" if "x0" in nodes else "y"
    loser = "y" if winner == "x" else "x"
    gang.event_with(loser, "timed out after", kind="PodGroup", timeout=30)
    time.sleep(1)
    assert gang.nodes_of([f"{loser}0", f"{loser}1"]) == {f"{loser}0": None, f"{loser}1": None}
    for index in (0, 1):
        gang.core.delete_namespaced_pod(f"{winner}{index}", gang.namespace, grace_period_seconds=0)
    gang.bound_whole([f"{loser}0", f"{loser}1"])


def test_kubernetes_podgroup_gang_with_its_condition(gang: Gang) -> None:
    gang.node("a", pin="a")
    gang.node("b", pin="b")
    gang.scheduler()
    gang.pod("blocker", 1, on="b")
    gang.bound_whole(["blocker"])
    gang.kube_group("kg", 2)
    gang.pod("k0", 8, kube_group="kg")
    gang.pod("k1", 8, kube_group="kg")
    gang.event_with("k0", "only 1 of its 2 minimum members fit together")

    def condition() -> dict[str, Any] | None:
        for c in (gang.group(KUBE_API, "kg").get("status") or {}).get("conditions") or []:
            if c["type"] == "PodGroupInitiallyScheduled":
                return c
        return None

    assert gang.wait("the False condition", condition)["status"] == "False"
    assert gang.nodes_of(["k0", "k1"]) == {"k0": None, "k1": None}
    gang.core.delete_namespaced_pod("blocker", gang.namespace, grace_period_seconds=0)
    gang.bound_whole(["k0", "k1"])
    done = gang.wait("the True condition", lambda: (c := condition()) and c["status"] == "True" and c)
    assert done["reason"] == "Scheduled"


def test_a_restarted_scheduler_and_a_second_replica_never_bind_a_member_twice(gang: Gang) -> None:
    gang.node("a")
    gang.node("b")
    first = gang.scheduler()
    gang.plugins_group("r", 2)
    gang.pod("r0", 8, group="r")
    gang.event_with("r0", "waiting for the others")
    first.stop()  # the replica dies with the group half-arrived
    gang.pod("r1", 8, group="r")
    gang.scheduler()
    gang.scheduler()  # two replicas leading at once (no election): the apiserver refuses a 2nd Binding
    nodes = gang.bound_whole(["r0", "r1"])
    assert len(set(nodes.values())) == 2
    time.sleep(1)
    for pod in gang.core.list_namespaced_pod(gang.namespace).items:
        verify(pod.metadata.annotations[ANNOTATION], KEYS)


def test_a_high_priority_group_preempts_only_what_its_minimum_needs(gang: Gang) -> None:
    """Three DGX-1s: low-priority pods hold all of a and b and one GPU of c, beside a high-priority
    pod on c. A group of two 8-GPU members at mid priority evicts the pods on a and b (not the one
    on c, which would not make room) and lands there whole."""
    with (
        priority_classes(gang.api, gang.run, low=100, mid=500, high=1000) as classes,
        kubelet_stand_in(gang.core, gang.namespace) as removed,
    ):
        for node in ("a", "b", "c"):
            gang.node(node, pin=node)
        gang.scheduler()
        gang.pod("low-a", 8, priority_class=classes["low"], on="a")
        gang.pod("low-b", 8, priority_class=classes["low"], on="b")
        gang.bound_whole(["low-a", "low-b"])
        gang.pod("high-c", 7, priority_class=classes["high"], on="c")
        gang.pod("low-c", 1, priority_class=classes["low"], on="c")
        gang.bound_whole(["high-c", "low-c"])
        gang.plugins_group("urgent", 2)
        gang.pod("u0", 8, group="urgent", priority_class=classes["mid"])
        gang.pod("u1", 8, group="urgent", priority_class=classes["mid"])
        nodes = gang.bound_whole(["u0", "u1"])
        assert sorted(nodes.values()) == [f"a-{gang.run}", f"b-{gang.run}"]
        assert sorted(removed) == ["low-a", "low-b"]
        assert gang.nodes_of(["low-c", "high-c"]) == {"low-c": f"c-{gang.run}", "high-c": f"c-{gang.run}"}


def test_side_by_side_with_kube_schedulers_own_gang(gang: Gang, gang_plane: ControlPlane) -> None:
    """The same Kubernetes PodGroups, given to kube-scheduler v1.37.2 (GenericWorkload on, pods
    counting nvidia.com/gpu as an extended resource) and to kubegpu, on worlds of their own (one
    8-GPU node each, then a second): a group short of members and a group that does not fit stay
    wholly unbound under both; once a node is added, the group that did not fit is bound whole
    under both."""
    kube = gang_plane.start_scheduler(extra_args=["--feature-gates=GenericWorkload=true"])
    try:
        gang.scheduler()
        worlds = {"kubegpu": gang.name, "kube": "default-scheduler"}
        for world in worlds:
            gang.node(f"{world}-1", pin=world)
        for world, scheduler_name in worlds.items():
            gang.kube_group(f"{world}-short", 3)
            gang.kube_group(f"{world}-big", 2)
            for index in range(2):
                gang.pod(
                    f"{world}-short-{index}",
                    1,
                    kube_group=f"{world}-short",
                    on=world,
                    scheduler=scheduler_name,
                )
                gang.pod(
                    f"{world}-big-{index}", 8, kube_group=f"{world}-big", on=world, scheduler=scheduler_name
                )
        gang.event_with("kubegpu-big-0", "only 1 of its 2 minimum members fit together")
        time.sleep(5)  # kube-scheduler holds a member at Permit; neither binds a part of a group
        names = [f"{w}-{g}-{i}" for w in worlds for g in ("short", "big") for i in range(2)]
        assert gang.nodes_of(names) == dict.fromkeys(names)
        for world in worlds:
            gang.node(f"{world}-2", pin=world)
        big = [f"{w}-big-{i}" for w in worlds for i in range(2)]
        nodes = gang.bound_whole(big, timeout=120)
        for world in worlds:
            assert {nodes[f"{world}-big-0"], nodes[f"{world}-big-1"]} == {
                f"{world}-1-{gang.run}",
                f"{world}-2-{gang.run}",
            }
        short = [f"{w}-short-{i}" for w in worlds for i in range(2)]
        assert gang.nodes_of(short) == dict.fromkeys(short)
    finally:
        kube.stop()


def test_elastic_extras_are_bound_when_they_fit_without_holding_back_the_minimum(gang: Gang) -> None:
    """minMember 2 of 3 members of 8 GPUs on two nodes: the minimum is bound whole at once, the
    extra waits; a third node lets the extra in."""
    gang.node("a")
    gang.node("b")
    gang.scheduler()
    gang.plugins_group("elastic", 2)
    for index in range(3):
        gang.pod(f"e{index}", 8, group="elastic")
    names = ["e0", "e1", "e2"]
    bound = gang.wait("the minimum bound", lambda: [n for n, node in gang.nodes_of(names).items() if node])
    time.sleep(2)
    assert len([node for node in gang.nodes_of(names).values() if node]) == 2, bound
    gang.node("c")
    gang.bound_whole(names)
