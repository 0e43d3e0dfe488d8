"""kube-scheduler v1.37.2 with kubegpu as its HTTP extender, against the real kube-apiserver
(issue #23): nodes advertised by the sim plugin (no kubelet), pods of a kube-scheduler profile of
this test's own. kube-scheduler calls kubegpu's filter, prioritize and bind: a multi-GPU pod gets
an NVLink set with the signed allocation, shares of one GPU are booked exactly, a pod that fits
nowhere carries the extender's per-node reasons in its FailedScheduling Event, and with the
extender down (ignorable: false) pods wait, then schedule once it is back; two kube-scheduler replicas
with leader election place each pod once, and the standby takes over when the leader is killed."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from devices.sim import sim_gpu_id
from kubegpu import allocation as contract
from kubegpu.allocation import ANNOTATION, KeyRing, verify
from scheduler.core.rdma import NO_FREE_VFS
from scheduler.live.config import SchedulerConfig
from scheduler.live.extender import Extender, ExtenderServer
from scheduler.live.scheduler import Scheduler
from tests.fixtures.keys import SIGNING
from tests.support.rdmainv import sim_nic_topology
from tests.support.schedtrial import kubelet_stand_in, priority_classes
from tests.support.tlscerts import Authority, Issued
from tests.test_scheduler_api import KEYS, advertise, gpu_index, gpu_pod, wait_bound, wait_failed_scheduling

pytestmark = pytest.mark.apiserver


class RunningExtender:
    """kubegpu's extender in this process: a Scheduler's cache, its tend loop and the HTTP server."""

    def __init__(
        self, api: k8s.ApiClient, profile: str, port: int = 0, tls: tuple[str, str] | None = None
    ) -> None:
        config = SchedulerConfig(scheduler_name=profile, policy="topology", signing_key_id="k1")
        self.scheduler = Scheduler(config, api, KeyRing(None, SIGNING), seed=3)
        self.scheduler.start_watching()
        assert self.scheduler.wait_synced(30)
        self.scheduler.leading.set()
        self.extender = Extender(self.scheduler)
        self.server = ExtenderServer(self.extender, f"127.0.0.1:{port}", lambda: (True, "ready"), tls)
        self.server.start()
        self.thread = threading.Thread(target=self._tend, daemon=True)
        self.thread.start()

    def _tend(self) -> None:
        while not self.scheduler.stop_event.is_set():
            self.scheduler.tend(0.2)

    @property
    def port(self) -> int:
        return self.server.port

    def stop(self) -> None:
        self.server.stop()
        self.scheduler.stop()
        self.thread.join(5)


MANAGED_RESOURCES = ("nvidia.com/gpu", "kubegpu.io/rdma")
SHIPPED_STANZA = Path(__file__).resolve().parents[1] / "deploy" / "extender" / "kube-scheduler-config.yaml"


def extender_config(profile: str, port: int, verbs: str = "shipped") -> dict[str, Any]:
    """deploy/extender/kube-scheduler-config.yaml's extender stanza for ``profile``, calling the
    extender on ``port``: its verbs (``filterVerb: choose``), or with ``verbs="scored"`` filter and
    prioritize (weight 5), the other way docs/extender.md describes, or with ``verbs="managed"``
    the shipped verbs and ``managedResources``."""
    (stanza,) = yaml.safe_load(SHIPPED_STANZA.read_text())["extenders"]
    stanza["urlPrefix"] = f"http://127.0.0.1:{port}"
    if verbs == "scored":
        stanza.update(filterVerb="filter", prioritizeVerb="prioritize", weight=5)
    elif verbs == "managed":  # consulted only for pods requesting these (docs/extender.md)
        stanza["managedResources"] = [{"name": r, "ignoredByScheduler": False} for r in MANAGED_RESOURCES]
    return {"profiles": [{"schedulerName": profile}], "extenders": [stanza]}


class Setup:
    """One test's slice: its kube-scheduler profile, nodes labelled for it, its extender."""

    def __init__(
        self, api: k8s.ApiClient, core: k8s.CoreV1Api, namespace: str, run: str, verbs: str = "shipped"
    ) -> None:
        self.api, self.core, self.namespace, self.run, self.verbs = api, core, namespace, run, verbs
        self.profile = f"kube-ext-{run}"
        self.extenders: list[RunningExtender] = []

    def start_extender(self, port: int = 0, tls: tuple[str, str] | None = None) -> RunningExtender:
        extender = RunningExtender(self.api, self.profile, port, tls)
        self.extenders.append(extender)
        return extender

    def pod(self, name: str, gpus: int, priority: str = "", **kw: Any) -> str:
        body = gpu_pod(self.namespace, name, gpus, scheduler=self.profile, selector={"run": self.run}, **kw)
        if priority:
            body["spec"]["priorityClassName"] = priority
        self.core.create_namespaced_pod(self.namespace, body)
        return name


@contextlib.contextmanager
def trial_of(
    api: k8s.ApiClient,
    namespace: str,
    kube_scheduler: Callable[..., Any],
    state: Path,
    topology: str,
    tls: tuple[Issued, bytes] | None = None,
    verbs: str = "shipped",
) -> Iterator[Setup]:
    """An extender, kube-scheduler with it, and two nodes of ``topology`` (``a-<run>``, ``b-<run>``).
    ``tls``: the extender serves HTTPS with that certificate, and kube-scheduler trusts that CA."""
    core = k8s.CoreV1Api(api)
    trial = Setup(api, core, namespace, uuid.uuid4().hex[:6], verbs)
    extender = trial.start_extender(tls=(str(tls[0].cert), str(tls[0].key)) if tls else None)
    config = extender_config(trial.profile, extender.port, verbs)
    if tls is not None:
        (stanza,) = config["extenders"]
        stanza["urlPrefix"] = stanza["urlPrefix"].replace("http://", "https://")
        stanza["enableHTTPS"] = True
        stanza["tlsConfig"] = {"caData": base64.b64encode(tls[1]).decode()}
    kube_scheduler(config)
    for name in ("a", "b"):
        advertise(core, f"{name}-{trial.run}", topology, state, labels={"run": trial.run})
    try:
        yield trial
    finally:
        for running in trial.extenders:
            running.stop()


@pytest.fixture(params=["shipped"])
def setup(
    request: pytest.FixtureRequest,
    admin_api: k8s.ApiClient,
    kube_namespace: str,
    kube_scheduler: Callable[..., Any],
    tmp_path: Path,
) -> Iterator[Setup]:
    """A trial on two DGX-1 nodes with the shipped stanza (``choose``), or with filter and
    prioritize where a test is parametrized ``indirect`` with ``"scored"``."""
    with trial_of(
        admin_api, kube_namespace, kube_scheduler, tmp_path, "dgx1-v100", verbs=request.param
    ) as trial:
        yield trial


@pytest.mark.parametrize("setup", ["shipped", "scored"], indirect=True)
def test_kube_scheduler_with_the_extender_places_topology_aware_and_shares(setup: Setup) -> None:
    core, namespace = setup.core, setup.namespace
    setup.pod("four", 4)
    placed = wait_bound(core, namespace, ["four"])["four"]
    allocation = verify(placed.metadata.annotations[ANNOTATION], KEYS)
    assert allocation.node == placed.spec.node_name and allocation.pod_uid == placed.metadata.uid
    indices = sorted(gpu_index(allocation.node, d) for d in allocation.containers["app"].devices)
    assert indices in ([0, 1, 2, 3], [4, 5, 6, 7])  # an NVLink-connected quad of the DGX-1

    share = {"kubegpu.io/gpu-milli": "500"}
    for name in ("half-1", "half-2"):
        setup.pod(name, 0, annotations=share)
    halves = wait_bound(core, namespace, ["half-1", "half-2"])
    used: dict[tuple[str, str], int] = {}
    for bound in halves.values():
        granted = verify(bound.metadata.annotations[ANNOTATION], KEYS)
        for device, got in granted.containers["app"].shares.items():
            used[(granted.node, device)] = used.get((granted.node, device), 0) + got.milli
    assert used and all(milli <= 1000 for milli in used.values())


def test_with_choose_a_pod_lands_where_kubegpu_picks_though_kube_scheduler_scores_it_lower(
    setup: Setup,
) -> None:
    """The shipped stanza (``filterVerb: choose``): the second half-GPU share goes to the GPU the
    first left half free (kubegpu's policy completes shares), though a CPU hog on that node makes
    kube-scheduler's own scoring (least allocated) prefer the idle node; kube-scheduler never calls
    prioritize, as choose leaves it one node."""
    core, namespace = setup.core, setup.namespace
    share = {"kubegpu.io/gpu-milli": "500"}
    setup.pod("half-1", 0, annotations=share)
    first = wait_bound(core, namespace, ["half-1"])["half-1"]
    hog = gpu_pod(namespace, "hog", 0, cpu="56", scheduler=setup.profile)
    hog["spec"]["nodeName"] = first.spec.node_name
    core.create_namespaced_pod(namespace, hog)
    setup.pod("half-2", 0, annotations=share)
    second = wait_bound(core, namespace, ["half-2"])["half-2"]
    (gpu_1,) = verify(first.metadata.annotations[ANNOTATION], KEYS).containers["app"].shares
    granted = verify(second.metadata.annotations[ANNOTATION], KEYS)
    assert granted.node == second.spec.node_name == first.spec.node_name
    assert set(granted.containers["app"].shares) == {gpu_1}
    (extender,) = setup.extenders
    counted = verb_calls(extender)
    assert counted.get(("choose", "200"), 0) >= 2, counted
    assert {verb for verb, _ in counted} == {"choose", "bind"}, counted  # no filter, no prioritize


def test_a_pod_that_fits_nowhere_carries_the_extenders_reasons(setup: Setup) -> None:
    # kube-scheduler's own filters pass these nodes (8 nvidia.com/gpu each): only kubegpu's refuse
    setup.pod("wrong-model", 2, annotations={"kubegpu.io/gpu-model": "A100-SXM4-80GB"})
    event = wait_failed_scheduling(setup.core, setup.namespace, "wrong-model", timeout=60)
    assert "0/" in event.message and "A100-SXM4-80GB" in event.message, event.message


@pytest.mark.parametrize("setup", ["shipped", "managed"], indirect=True)
def test_pods_wait_while_the_extender_is_down_and_schedule_when_it_is_back(setup: Setup) -> None:
    """``ignorable: false``: a GPU pod waits while the extender is down. With the shipped stanza
    (no ``managedResources``: a share asks for no resource, so every pod must reach kubegpu) a
    pod asking for no device waits too; with ``managedResources`` kube-scheduler places it alone."""
    managed = setup.verbs == "managed"
    first = setup.extenders[0]
    port = first.port
    first.stop()
    setup.pod("waits", 2)
    setup.pod("cpu-only", 0)
    wait_failed_scheduling(setup.core, setup.namespace, "waits", timeout=60)
    if managed:
        wait_bound(setup.core, setup.namespace, ["cpu-only"], timeout=60)
    else:
        wait_failed_scheduling(setup.core, setup.namespace, "cpu-only", timeout=60)
    time.sleep(1)
    assert not setup.core.read_namespaced_pod("waits", setup.namespace).spec.node_name
    assert bool(setup.core.read_namespaced_pod("cpu-only", setup.namespace).spec.node_name) is managed
    setup.start_extender(port)
    bound = wait_bound(setup.core, setup.namespace, ["waits", "cpu-only"], timeout=120)
    placed = bound["waits"]
    assert verify(placed.metadata.annotations[ANNOTATION], KEYS).node == placed.spec.node_name


def test_a_pod_bound_through_the_extender_gets_one_scheduled_event_kube_schedulers(setup: Setup) -> None:
    """kube-scheduler posts ``Scheduled`` after an extender's bind itself (its finishBinding): the
    extender posts none, or the pod would show two."""
    setup.pod("once", 1)
    placed = wait_bound(setup.core, setup.namespace, ["once"])["once"]
    selector = "involvedObject.name=once,reason=Scheduled"
    deadline = time.monotonic() + 30
    while not setup.core.list_namespaced_event(setup.namespace, field_selector=selector).items:
        assert time.monotonic() < deadline, "no Scheduled Event"
        time.sleep(0.2)
    for running in setup.extenders:
        running.scheduler._binders.shutdown(wait=True)  # whatever the extender queued has run
    [event] = setup.core.list_namespaced_event(setup.namespace, field_selector=selector).items
    assert event.message == f"Successfully assigned {setup.namespace}/once to {placed.spec.node_name}"
    assert event.reporting_component == setup.profile


def place(setup: Setup, name: str, node: str, gpu: int, priority_class: str) -> None:
    """A one-GPU pod bound to ``node`` holding GPU ``gpu``, as an earlier binder left it."""
    body = gpu_pod(setup.namespace, name, 1, scheduler=setup.profile, selector={"run": setup.run})
    body["spec"].update(nodeName=node, priorityClassName=priority_class)
    uid = setup.core.create_namespaced_pod(setup.namespace, body).metadata.uid
    allocation = contract.Allocation(
        node, uid, {"app": contract.ContainerAllocation((sim_gpu_id(node, gpu),))}
    )
    signed = contract.sign(allocation, "k1", SIGNING["k1"])
    setup.core.patch_namespaced_pod(
        name, setup.namespace, {"metadata": {"annotations": {ANNOTATION: signed}}}
    )


def test_preemption_evicts_only_victims_whose_gpus_make_an_nvlink_pair(
    admin_api: k8s.ApiClient, kube_namespace: str, kube_scheduler: Callable[..., Any], tmp_path: Path
) -> None:
    """Two full nodes whose NVLink bridges join GPUs (0,3) and (1,2). kube-scheduler, counting
    GPUs, would evict the two least important pods of a, on GPUs 0 and 1, which no bridge joins (its
    victims there have the lowest priorities), and the pod asking for a bridged pair would still fit
    nowhere. The preempt verb drops a: the victims are b's pods on GPUs 0 and 3, and the pod is then
    bound by the extender on exactly those GPUs."""
    with (
        trial_of(admin_api, kube_namespace, kube_scheduler, tmp_path, "rtx8000-4gpu") as setup,
        priority_classes(
            admin_api, setup.run, p100=100, p110=110, p200=200, p210=210, p300=300, p310=310, high=1000
        ) as classes,
    ):
        layout = {"a": ("p100", "p110", "p300", "p310"), "b": ("p200", "p300", "p310", "p210")}
        for node, priorities in layout.items():
            for gpu, priority in enumerate(priorities):
                place(setup, f"{node}{gpu}", f"{node}-{setup.run}", gpu, classes[priority])
        with kubelet_stand_in(setup.core, setup.namespace) as removed:
            setup.pod(
                "pair", 2, annotations={"kubegpu.io/topology": "nvlink=require"}, priority=classes["high"]
            )
            placed = wait_bound(setup.core, setup.namespace, ["pair"], timeout=120)["pair"]
        assert sorted(removed) == ["b0", "b3"]
        allocation = verify(placed.metadata.annotations[ANNOTATION], KEYS)
        assert placed.spec.node_name == allocation.node == f"b-{setup.run}"
        assert sorted(gpu_index(allocation.node, d) for d in allocation.containers["app"].devices) == [0, 3]
        left = {p.metadata.name for p in setup.core.list_namespaced_pod(setup.namespace).items}
        assert {"a0", "a1", "a2", "a3", "b1", "b2"} <= left


def test_rdma_interfaces_through_the_extender_bound_signed_and_refused_with_reasons(
    setup: Setup, tmp_path: Path
) -> None:
    """Beside the two NIC-less DGX-1 nodes, r has two VFs. A pod asking only for an interface and
    one asking a GPU and an interface are bound there by the extender with their VFs in the signed
    version-2 allocation (the GPU beside the NIC); a pod asking three interfaces, more than any node
    has, waits with the extender's reason for every node, and an unknown bandwidth unit is an
    invalid kubegpu request."""
    node = f"r-{setup.run}"
    advertise(setup.core, node, sim_nic_topology(tmp_path), tmp_path, labels={"run": setup.run})
    rdma = {"kubegpu.io/rdma-interfaces": "1", "kubegpu.io/rdma-bandwidth": "50Gbps"}
    setup.pod("vf-only", 0, annotations=rdma)
    setup.pod("gpu-vf", 1, annotations={"kubegpu.io/rdma-interfaces": "1"})
    placed = wait_bound(setup.core, setup.namespace, ["vf-only", "gpu-vf"], timeout=90)
    vfs = set()
    for name, pod in placed.items():
        assert pod.spec.node_name == node, (name, pod.spec.node_name)
        raw = pod.metadata.annotations[ANNOTATION]
        assert json.loads(raw)["version"] == contract.RDMA_VERSION
        granted = verify(raw, KEYS)
        assert [r.pf for r in granted.rdma] == ["mlx5_0"]
        vfs |= {r.device for r in granted.rdma}
    assert vfs == {"mlx5_0-vf0", "mlx5_0-vf1"}
    assert [r.min_mbps for r in verify(placed["vf-only"].metadata.annotations[ANNOTATION], KEYS).rdma] == [
        50_000
    ]
    gpu = verify(placed["gpu-vf"].metadata.annotations[ANNOTATION], KEYS).containers["app"].devices
    assert [gpu_index(node, d) for d in gpu] == [1]

    setup.pod("too-many", 0, annotations={"kubegpu.io/rdma-interfaces": "3"})
    event = wait_failed_scheduling(setup.core, setup.namespace, "too-many", "RDMA", timeout=60)
    assert f"3 node(s) had {NO_FREE_VFS.removeprefix('node(s) had ')}" in event.message, event.message
    setup.pod("typo", 0, annotations={**rdma, "kubegpu.io/rdma-bandwidth": "50GB/s"})
    event = wait_failed_scheduling(setup.core, setup.namespace, "typo", timeout=60)
    assert "invalid kubegpu request: annotation kubegpu.io/rdma-bandwidth: '50GB/s'" in event.message
    unbound = [
        setup.core.read_namespaced_pod(n, setup.namespace).spec.node_name for n in ("too-many", "typo")
    ]
    assert unbound == [None, None]
    binds = verb_calls(setup.extenders[0]).get(("bind", "200"), 0)
    assert binds == 2, binds  # kube-scheduler never tried to bind the refused pods


def verb_calls(extender: RunningExtender) -> dict[tuple[str, str], float]:
    """(verb, HTTP status) -> requests the extender answered."""
    calls: dict[tuple[str, str], float] = {}
    for metric in extender.scheduler.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "kubegpu_extender_requests_total":
                calls[(sample.labels["verb"], sample.labels["code"])] = sample.value
    return calls


def test_kube_scheduler_calls_the_extender_over_https_with_the_ca_it_is_given(
    admin_api: k8s.ApiClient, kube_namespace: str, kube_scheduler: Callable[..., Any], tmp_path: Path
) -> None:
    """``enableHTTPS`` and ``tlsConfig.caData``: filter, prioritize and bind reach the extender over
    TLS and the pod is bound with its devices."""
    authority = Authority(tmp_path, "extender")
    served = authority.issue("kubegpu-extender")
    with trial_of(
        admin_api, kube_namespace, kube_scheduler, tmp_path, "dgx1-v100", (served, authority.pem())
    ) as setup:
        setup.pod("over-tls", 2)
        placed = wait_bound(setup.core, setup.namespace, ["over-tls"], timeout=90)["over-tls"]
        assert verify(placed.metadata.annotations[ANNOTATION], KEYS).node == placed.spec.node_name
        calls = verb_calls(setup.extenders[0])
        assert calls.get(("choose", "200")) and calls.get(("bind", "200")), calls


def test_kube_scheduler_trusting_another_ca_fails_the_call_and_pods_wait(
    admin_api: k8s.ApiClient, kube_namespace: str, kube_scheduler: Callable[..., Any], tmp_path: Path
) -> None:
    """The extender's certificate is signed by a CA kube-scheduler was not given: every call fails
    its TLS handshake (kube-scheduler says why in the pod's FailedScheduling Event), no verb reaches
    the extender, and the pod waits (``ignorable: false``) rather than being placed without it."""
    served = Authority(tmp_path, "extender").issue("kubegpu-extender")
    other = Authority(tmp_path, "other")
    with trial_of(
        admin_api, kube_namespace, kube_scheduler, tmp_path, "dgx1-v100", (served, other.pem())
    ) as setup:
        setup.pod("distrusted", 2)
        event = wait_failed_scheduling(setup.core, setup.namespace, "distrusted", timeout=60)
        assert "x509: certificate signed by unknown authority" in event.message, event.message
        time.sleep(2)
        assert not setup.core.read_namespaced_pod("distrusted", setup.namespace).spec.node_name
        assert not verb_calls(setup.extenders[0])


LEASE = "kube-scheduler"  # the name system:kube-scheduler's bootstrap role may get and update


def lease_holder(api: k8s.ApiClient, namespace: str) -> str:
    """The identity holding kube-scheduler's lease in ``namespace`` ("" when none or no lease)."""
    try:
        lease = k8s.CoordinationV1Api(api).read_namespaced_lease(LEASE, namespace)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return ""
        raise
    return lease.spec.holder_identity or ""


def wait_holder(api: k8s.ApiClient, namespace: str, other_than: str = "", timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not (holder := lease_holder(api, namespace)) or holder == other_than:
        assert time.monotonic() < deadline, f"lease holder still {holder!r}"
        time.sleep(0.2)
    return holder


def scheduled_events(core: k8s.CoreV1Api, namespace: str, name: str) -> list[k8s.CoreV1Event]:
    selector = f"involvedObject.name={name},reason=Scheduled"
    return core.list_namespaced_event(namespace, field_selector=selector).items


def test_two_kube_scheduler_replicas_place_each_pod_once_and_the_standby_takes_over(
    admin_api: k8s.ApiClient, kube_namespace: str, kube_scheduler: Callable[..., Any], tmp_path: Path
) -> None:
    """Two kube-scheduler replicas with ``--leader-elect`` (a lease in the test's namespace), both
    configured with the extender. Only the leader schedules: each pod is bound once, with one
    ``Scheduled`` Event and its own GPUs. The leader is then killed (SIGKILL, the lease is not
    released): the standby acquires the lease once it expires and places the next pods through the
    extender, from the same account (no GPU given twice)."""
    configs: list[dict[str, Any]] = []
    with trial_of(admin_api, kube_namespace, configs.append, tmp_path, "dgx1-v100") as setup:
        (config,) = configs
        config["leaderElection"] = {
            "leaderElect": True,
            "resourceLock": "leases",
            "resourceNamespace": kube_namespace,
            "resourceName": LEASE,
            "leaseDuration": "4s",
            "renewDeadline": "3s",
            "retryPeriod": "500ms",
        }
        first = kube_scheduler(config)
        leader = wait_holder(admin_api, kube_namespace)
        second = kube_scheduler(config)
        assert second.alive() and lease_holder(admin_api, kube_namespace) == leader

        before = [setup.pod(f"before-{i}", 2) for i in range(3)]
        placed = wait_bound(setup.core, setup.namespace, before, timeout=90)
        after: list[str] = []
        try:
            assert lease_holder(admin_api, kube_namespace) == leader
            assert first.process is not None
            os.killpg(first.process.pid, signal.SIGKILL)
            first.process.wait(10)
            successor = wait_holder(admin_api, kube_namespace, other_than=leader, timeout=60)
            assert second.alive()
            after = [setup.pod(f"after-{i}", 2) for i in range(3)]
            placed |= wait_bound(setup.core, setup.namespace, after, timeout=90)
            assert lease_holder(admin_api, kube_namespace) == successor
        finally:
            first.stop()

        held: dict[tuple[str, str], str] = {}
        for name in before + after:
            pod = placed[name]
            allocation = verify(pod.metadata.annotations[ANNOTATION], KEYS)
            assert allocation.node == pod.spec.node_name and allocation.pod_uid == pod.metadata.uid
            devices = allocation.containers["app"].devices
            assert len(devices) == 2
            for device in devices:
                assert (allocation.node, device) not in held, f"{device} given to {held} and {name}"
                held[(allocation.node, device)] = name
        deadline = time.monotonic() + 30
        while not all(scheduled_events(setup.core, setup.namespace, n) for n in before + after):
            assert time.monotonic() < deadline, "a pod has no Scheduled Event"
            time.sleep(0.2)
        for running in setup.extenders:
            running.scheduler._binders.shutdown(wait=True)
        time.sleep(1)  # a second binding replica's Event would be posted by now
        for name in before + after:
            [event] = scheduled_events(setup.core, setup.namespace, name)
            node = placed[name].spec.node_name
            assert event.message == f"Successfully assigned {setup.namespace}/{name} to {node}"
        calls = verb_calls(setup.extenders[0])
        assert calls.get(("bind", "200")) == len(before + after), calls


def replica_metrics(port: int) -> dict[tuple[str, str, str], float]:
    """(metric, verb, HTTP status) -> count, from a ``kubegpu extender`` process's /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    counts: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("kubegpu_extender_requests_total", "kubegpu_extender_relayed_total"):
                counts[(sample.name, sample.labels["verb"], sample.labels["code"])] = sample.value
    return counts


def wait_ready(port: int, says: str, timeout: float = 60) -> None:
    """Until the replica's /readyz answers 200 with ``says`` in its text."""
    import urllib.error
    import urllib.request

    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            last = urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5).read().decode()
            if says in last:
                return
        except (urllib.error.URLError, OSError) as error:
            last = str(error)
        time.sleep(0.3)
    raise AssertionError(f"replica on {port} not ready ({says!r}): {last}")


def test_a_standby_relays_kube_schedulers_calls_to_the_leader_and_takes_over_when_it_dies(
    control_plane: Any,
    admin_api: k8s.ApiClient,
    kube_namespace: str,
    kube_scheduler: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """Two ``kubegpu extender --leader-elect`` processes; kube-scheduler calls the standby (as a
    Service may). The standby answers no verb itself: it relays each to the leader, which binds
    the pod. The leader is killed (SIGKILL: no release); once the lease runs out the standby
    leads and answers kube-scheduler itself."""
    import os
    import signal
    import subprocess
    import sys

    from kubegpu.devenv.shimproc import free_port
    from tests.fixtures.keys import write_scheduler_keys

    core = k8s.CoreV1Api(admin_api)
    run = uuid.uuid4().hex[:6]
    profile = f"kube-ext-{run}"
    keys = write_scheduler_keys(tmp_path / "keys")
    config = tmp_path / "extender.yaml"
    config.write_text(
        f"keysDir: {keys}\nsigningKeyId: k1\npolicy: topology\nleaderElection:\n  enabled: true\n"
        f"  namespace: {kube_namespace}\n  leaseName: ext-{run}\n  leaseSeconds: 6\n"
        "  renewDeadlineSeconds: 4.5\n  retryPeriodSeconds: 0.5\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "POD_IP"}
    ports, processes = {}, {}

    def start(identity: str) -> None:
        ports[identity] = free_port()
        log = (tmp_path / f"{identity}.log").open("wb")
        processes[identity] = subprocess.Popen(
            [sys.executable, "-m", "kubegpu", "extender", "--config", str(config),
             "--kubeconfig", str(control_plane.admin_kubeconfig), "--scheduler-name", profile,
             "--address", f"127.0.0.1:{ports[identity]}", "--identity", identity],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip

    try:
        start("ext-a")
        wait_ready(ports["ext-a"], "ready")  # the leader, past its fence
        assert "extender.heap_frozen" in (tmp_path / "ext-a.log").read_text()  # after its first lists
        start("ext-b")
        wait_ready(ports["ext-b"], "standby: relaying to")
        kube_scheduler(extender_config(profile, ports["ext-b"]))
        for name in ("a", "b"):
            advertise(core, f"{name}-{run}", "dgx1-v100", tmp_path, labels={"run": run})

        def pod(name: str) -> k8s.V1Pod:
            body = gpu_pod(kube_namespace, name, 2, scheduler=profile, selector={"run": run})
            core.create_namespaced_pod(kube_namespace, body)
            placed = wait_bound(core, kube_namespace, [name], timeout=120)[name]
            assert verify(placed.metadata.annotations[ANNOTATION], KEYS).node == placed.spec.node_name
            return placed

        pod("via-standby")
        leader, standby = replica_metrics(ports["ext-a"]), replica_metrics(ports["ext-b"])
        answered = "kubegpu_extender_requests_total"
        assert leader.get((answered, "choose", "200")) and leader.get((answered, "bind", "200")), leader
        assert not any(key[0] == answered for key in standby), standby  # no call answered by a standby
        assert standby.get(("kubegpu_extender_relayed_total", "bind", "200")), standby
        lease = k8s.CoordinationV1Api(admin_api).read_namespaced_lease(f"ext-{run}", kube_namespace)
        assert lease.spec.holder_identity == "ext-a"
        assert f"127.0.0.1:{ports['ext-a']}" in lease.metadata.annotations["kubegpu.io/extender-leader"]

        processes["ext-a"].send_signal(signal.SIGKILL)
        processes["ext-a"].wait(10)
        pod("after-failover")
        took_over = replica_metrics(ports["ext-b"])
        assert took_over.get((answered, "bind", "200")), took_over
        lease = k8s.CoordinationV1Api(admin_api).read_namespaced_lease(f"ext-{run}", kube_namespace)
        assert lease.spec.holder_identity == "ext-b"
        assert '"holder":"ext-b"' in lease.metadata.annotations["kubegpu.io/extender-leader"]
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()


@pytest.mark.parametrize("extender", [False, True])
def test_a_replicas_api_client_keeps_a_connection_for_each_binding_in_flight(
    control_plane: Any, caplog: pytest.LogCaptureFixture, extender: bool
) -> None:
    """``kubegpu scheduler`` and ``kubegpu extender`` make their API client with
    ``scheduler_api``: as many Bindings in flight as ``bindWorkers`` (and, serving the extender,
    kube-scheduler's binds through it) each get back a kept connection, none opens and drops a TLS
    connection. The client's default pool is 5 per CPU (10 here), so the workers are set above it."""
    import multiprocessing

    from scheduler.live.main import EXTENDER_BIND_CONNECTIONS, scheduler_api
    from scheduler.live.scheduler import drain

    workers = multiprocessing.cpu_count() * 5 + 4
    config = SchedulerConfig(scheduler_name="pool-test", bind_workers=workers)
    api = scheduler_api(config, str(control_plane.admin_kubeconfig), extender=extender)
    core = k8s.CoreV1Api(api)
    binds = workers + (EXTENDER_BIND_CONNECTIONS if extender else 0)
    try:
        for _ in range(2):  # the second time round, every request finds a kept connection
            caplog.clear()
            with caplog.at_level("WARNING", logger="urllib3.connectionpool"):
                in_flight = [core.read_namespace("default", _preload_content=False) for _ in range(binds)]
                for response in in_flight:
                    assert response.status == 200
                    drain(response)  # read, then handed back as a Binding's answer is
            dropped = [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()]
            assert dropped == []
        (pool,) = api.rest_client.pool_manager.pools._container.values()
        assert pool.num_connections == binds  # opened once, reused the second time
    finally:
        api.close()
