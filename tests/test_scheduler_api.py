"""The live scheduler against a real kube-apiserver: bindings, signed allocations, events, restarts."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from crishim.advertiser import Advertiser
from crishim.rewrite import NodeDevices
from devices.registry import load_plugins
from devices.sim import sim_gpu_id
from kubegpu.allocation import ANNOTATION, KeyRing, verify
from kubegpu.devenv.controlplane import create_fake_node
from scheduler.live.config import SchedulerConfig
from scheduler.live.scheduler import Scheduler
from tests.fixtures.keys import SIGNING, public, write_scheduler_keys

pytestmark = pytest.mark.apiserver
KEYS = public()  # verifying keys; the scheduler signs with tests.fixtures.keys.SIGNING


def advertise(
    core: k8s.CoreV1Api,
    name: str,
    topology: str,
    state: Path,
    cpu: str = "64",
    memory: str = "256Gi",
    labels: dict[str, str] | None = None,
) -> None:
    """A node as kubelet plus the kubegpu advertiser would leave it."""
    create_fake_node(core, name, labels=labels, capacity={"cpu": cpu, "memory": memory, "pods": "110"})
    plugins = load_plugins(["sim"], {"node_name": name, "topology": topology, "state_dir": str(state / name)})
    devices = NodeDevices(plugins, sysfs_root=None)
    devices.discover()
    Advertiser(core, name, devices.current_inventory).sync_once()


def gpu_pod(
    namespace: str,
    name: str,
    gpus: int = 0,
    annotations: dict[str, str] | None = None,
    scheduler: str = "kubegpu",
    cpu: str = "1",
    selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": selector or {},
            "containers": [
                {
                    "name": "app",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}, "limits": limits},
                }
            ],
        },
    }


@contextlib.contextmanager
def scheduler_starter(admin_api: k8s.ApiClient) -> Iterator[Callable[..., Scheduler]]:
    """Yields ``start(name, policy, **config)``: a leading scheduler on its own thread, signing with
    the test key; stops every scheduler it started on exit."""
    started: list[tuple[Scheduler, threading.Thread]] = []

    def start(name: str, policy: str = SchedulerConfig().policy, **overrides: Any) -> Scheduler:
        config = SchedulerConfig(scheduler_name=name, policy=policy, **overrides)
        scheduler = Scheduler(config, admin_api, KeyRing(None, SIGNING), seed=7)
        scheduler.start_watching()
        assert scheduler.wait_synced(30)
        scheduler.leading.set()
        thread = threading.Thread(target=scheduler.run, daemon=True)
        thread.start()
        started.append((scheduler, thread))
        return scheduler

    try:
        yield start
    finally:
        for scheduler, thread in started:
            scheduler.stop()
            thread.join(timeout=10)


@pytest.fixture
def scheduler_factory(admin_api: k8s.ApiClient) -> Iterator[Callable[..., Scheduler]]:
    with scheduler_starter(admin_api) as start:
        yield start


@dataclass
class Trial:
    """One test's slice of the shared cluster: its own scheduler name, nodes labelled for it."""

    core: k8s.CoreV1Api
    namespace: str
    state: Path
    start_scheduler: Callable[..., Scheduler]
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    @property
    def name(self) -> str:
        """The schedulerName this test's pods ask for."""
        return f"kubegpu-{self.run}"

    def node(self, prefix: str, topology: str) -> str:
        """Advertise a node only this test's pods select; returns its name."""
        name = f"{prefix}-{self.run}"
        advertise(self.core, name, topology, self.state, labels={"run": self.run})
        return name

    def pod(self, name: str, gpus: int = 0, **kwargs: Any) -> str:
        """Create a pod for this test's scheduler and nodes; returns its name."""
        body = gpu_pod(self.namespace, name, gpus, scheduler=self.name, selector={"run": self.run}, **kwargs)
        self.core.create_namespaced_pod(self.namespace, body)
        return name

    def scheduler(self, **overrides: Any) -> Scheduler:
        return self.start_scheduler(self.name, **overrides)

    def bound(self, names: list[str], timeout: float = 60) -> dict[str, Any]:
        return wait_bound(self.core, self.namespace, names, timeout)


@pytest.fixture
def trial(
    admin_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path, scheduler_factory: Callable[..., Scheduler]
) -> Trial:
    return Trial(k8s.CoreV1Api(admin_api), kube_namespace, tmp_path, scheduler_factory)


def wait_bound(core: k8s.CoreV1Api, namespace: str, names: list[str], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        pods = {
            p.metadata.name: p for p in core.list_namespaced_pod(namespace).items if p.metadata.name in names
        }
        if all(pods.get(n) is not None and pods[n].spec.node_name for n in names):
            return pods
        assert time.monotonic() < deadline, (
            f"unbound: {[n for n in names if not pods.get(n) or not pods[n].spec.node_name]}"
        )
        time.sleep(0.1)


def wait_failed_scheduling(
    core: k8s.CoreV1Api, namespace: str, pod: str, containing: str = "", timeout: float = 30
) -> k8s.CoreV1Event:
    """The first FailedScheduling Event of ``pod`` whose message contains ``containing``."""
    deadline = time.monotonic() + timeout
    while True:
        for event in core.list_namespaced_event(namespace).items:
            if (
                event.involved_object.name == pod
                and event.reason == "FailedScheduling"
                and containing in (event.message or "")
            ):
                return event
        assert time.monotonic() < deadline, f"no FailedScheduling event for {pod} containing {containing!r}"
        time.sleep(0.2)


def gpu_index(node: str, device: str) -> int:
    for index in range(16):
        if sim_gpu_id(node, index) == device:
            return index
    raise AssertionError(f"{device} is not a sim GPU of {node}")


def test_pods_bound_with_signed_topology_aware_allocations(trial: Trial) -> None:
    trial.node("dgx", "dgx1-v100")
    trial.scheduler()
    bound = trial.bound([trial.pod("four", 4)])["four"]
    allocation = verify(bound.metadata.annotations[ANNOTATION], KEYS)
    assert allocation.node == bound.spec.node_name and allocation.pod_uid == bound.metadata.uid
    indices = sorted(gpu_index(allocation.node, d) for d in allocation.containers["app"].devices)
    assert indices in ([0, 1, 2, 3], [4, 5, 6, 7])


def device_usage(pods: list[k8s.V1Pod]) -> dict[tuple[str, str], int]:
    """(node, device) -> milli used, from the bound pods' verified annotations."""
    used: dict[tuple[str, str], int] = {}
    for pod in pods:
        raw = (pod.metadata.annotations or {}).get(ANNOTATION)
        if not raw:
            continue
        allocation = verify(raw, KEYS)
        assert allocation.node == pod.spec.node_name and allocation.pod_uid == pod.metadata.uid
        for entry in allocation.containers.values():
            for device in entry.devices:
                share = entry.shares.get(device)
                key = (allocation.node, device)
                used[key] = used.get(key, 0) + (share.milli if share else 1000)
    return used


def test_mixed_burst_never_double_books(trial: Trial) -> None:
    for index, topology in enumerate(("dgx1-v100", "pcie-4gpu", "hgx-h100")):
        trial.node(f"mix{index}", topology)
    # Filling the cluster to the last GPU needs packing: whether a policy packs is the core's tests'
    # business; this one is about never booking a device twice, so it uses the packing policy.
    trial.scheduler(policy="bestfit")
    sizes = [4, 2, 2, 1, 1, 8]  # 18 of the 20 GPUs; the 6 shares of 300 fill the last 2
    names = [trial.pod(f"whole-{index}", gpus) for index, gpus in enumerate(sizes)]
    share_annotations = {"kubegpu.io/gpu-milli": "300", "kubegpu.io/gpu-memory-mib": "2048"}
    names += [trial.pod(f"share-{index}", annotations=share_annotations) for index in range(6)]
    pods = trial.bound(names)
    used = device_usage(list(pods.values()))
    assert all(milli <= 1000 for milli in used.values()), used
    whole = sum(sizes)
    assert sum(1 for m in used.values() if m == 1000) >= whole
    share = verify(pods["share-0"].metadata.annotations[ANNOTATION], KEYS).containers["app"]
    (device,) = share.devices
    assert share.shares[device].milli == 300


def test_unschedulable_pod_gets_an_event_then_runs_when_a_node_appears(trial: Trial) -> None:
    trial.node("small", "pcie-4gpu")
    trial.scheduler()
    trial.pod("big", 8)
    message = wait_failed_scheduling(trial.core, trial.namespace, "big").message
    assert message.startswith("0/") and "nodes are available" in message, message
    assert "1 Insufficient nvidia.com/gpu" in message, message
    status = trial.core.read_namespaced_pod("big", trial.namespace).status
    condition = [c for c in status.conditions or [] if c.type == "PodScheduled"]
    assert condition and condition[0].status == "False" and condition[0].reason == "Unschedulable"
    # A new node that fits: the pod is requeued and bound without any change to it.
    big = trial.node("big", "dgx1-v100")
    assert trial.bound(["big"])["big"].spec.node_name == big


def test_stale_heartbeat_makes_a_node_unschedulable(trial: Trial) -> None:
    node = trial.node("stale", "pcie-4gpu")

    def heartbeat(stamp: str) -> None:
        trial.core.patch_node(node, {"metadata": {"annotations": {"kubegpu.io/heartbeat": stamp}}})

    heartbeat("2020-01-01T00:00:00Z")
    trial.scheduler()
    trial.pod("p", 1)
    wait_failed_scheduling(trial.core, trial.namespace, "p", containing="heartbeat is stale")
    heartbeat(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    assert trial.bound(["p"])["p"].spec.node_name == node


def test_restart_in_the_middle_of_a_burst(trial: Trial) -> None:
    """200 pods; the scheduler is stopped half way and a new one finishes: no pod lost, no GPU twice."""
    for index in range(40):  # 320 GPUs for the 300 asked
        trial.node(f"burst{index:02d}", "dgx1-v100")
    first = trial.scheduler()
    names = []
    for index in range(200):
        names.append(trial.pod(f"b-{index:03d}", 1 + index % 2, cpu="100m"))
        if index == 100:
            first.stop()  # mid-burst: binds in flight are finished or dropped, nothing is remembered
    trial.scheduler()
    pods = trial.bound(names, timeout=120)
    used = device_usage(list(pods.values()))
    assert all(milli == 1000 for milli in used.values())  # whole GPUs, each held by exactly one pod
    assert len(used) == sum(1 + i % 2 for i in range(200))


def test_two_replicas_with_leader_election(admin_api: k8s.ApiClient, trial: Trial) -> None:
    """Two replicas at once: one schedules; when it stops the other takes over; no GPU twice."""
    from scheduler.live.config import LeaderElection

    for index in range(12):
        trial.node(f"ha{index:02d}", "dgx1-v100")
    election = LeaderElection(
        enabled=True,
        namespace=trial.namespace,
        lease_name=f"lease-{trial.run}",
        # generous enough for the leader to keep the lease on a loaded machine (with 2 s / 1.5 s
        # the second replica lost it at load 25 and stopped, as a replica that loses it does);
        # the hand-over below releases the lease, so it is no slower for that
        lease_seconds=6.0,
        renew_deadline_seconds=4.5,
        retry_period_seconds=0.2,
    )
    replicas = []
    for identity in ("replica-a", "replica-b"):
        config = SchedulerConfig(
            scheduler_name=trial.name,
            policy="bestfit",
            identity=identity,
            leader_election=LeaderElection(**vars(election)),
        )
        scheduler = Scheduler(config, admin_api, KeyRing(None, SIGNING), seed=1)
        scheduler.start_watching()
        assert scheduler.wait_synced(30)
        scheduler.start_leading(admin_api)
        thread = threading.Thread(target=scheduler.run, daemon=True)
        thread.start()
        replicas.append((scheduler, thread))
    names = []
    try:
        for index in range(80):
            names.append(trial.pod(f"ha-{index:03d}", 1, cpu="100m"))
            if index == 40:
                leader = next(s for s, _ in replicas if s.leading.is_set())
                assert sum(s.leading.is_set() for s, _ in replicas) == 1
                leader.stop()  # releases the lease: the other replica takes over
        pods = trial.bound(names, timeout=120)
    finally:
        for scheduler, thread in replicas:
            scheduler.stop()
            thread.join(timeout=10)
    used = device_usage(list(pods.values()))
    assert len(used) == len(names) and all(milli == 1000 for milli in used.values())


def test_scheduler_command_serves_metrics_and_health(
    control_plane: Any, trial: Trial, tmp_path: Path
) -> None:
    """``kubegpu scheduler`` as a process: config file, flags, /healthz, /metrics, clean SIGTERM."""
    import signal
    import subprocess
    import sys
    import urllib.request

    from kubegpu.devenv.shimproc import free_port

    node = trial.node("cli", "pcie-4gpu")
    keys = write_scheduler_keys(tmp_path / "keys")
    port = free_port()
    config = tmp_path / "scheduler.yaml"
    config.write_text(f"schedulerName: {trial.name}\npolicy: bestfit\nkeysDir: {keys}\nsigningKeyId: k1\n")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kubegpu",
            "scheduler",
            "--config",
            str(config),
            "--kubeconfig",
            str(control_plane.admin_kubeconfig),
            "--metrics-address",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        pod = trial.bound([trial.pod("p", 2)])["p"]
        assert verify(pod.metadata.annotations[ANNOTATION], KEYS).node == node
        base = f"http://127.0.0.1:{port}"
        assert urllib.request.urlopen(base + "/healthz", timeout=5).status == 200
        assert urllib.request.urlopen(base + "/readyz", timeout=5).status == 200
        metrics = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        assert 'kubegpu_scheduler_attempts_total{result="scheduled"} 1.0' in metrics
        assert 'kubegpu_scheduler_bindings_total{result="ok"} 1.0' in metrics
        assert "kubegpu_scheduler_scheduling_duration_seconds_count 1.0" in metrics
        assert "kubegpu_scheduler_e2e_duration_seconds_count 1.0" in metrics
        assert "kubegpu_scheduler_is_leader 1.0" in metrics
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=30)[0].decode()
    assert process.returncode == 0, output
    assert '"event":"pod.bound"' in output and f'"node":"{node}"' in output


def test_scheduling_gates_hold_a_pod_back(trial: Trial) -> None:
    node = trial.node("gate", "pcie-4gpu")
    trial.scheduler()
    pod = gpu_pod(trial.namespace, "gated", 1, scheduler=trial.name, selector={"run": trial.run})
    pod["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
    trial.core.create_namespaced_pod(trial.namespace, pod)
    time.sleep(2)
    assert not trial.core.read_namespaced_pod("gated", trial.namespace).spec.node_name
    trial.core.patch_namespaced_pod(
        "gated",
        trial.namespace,
        {"spec": {"schedulingGates": None}},
        _content_type="application/merge-patch+json",
    )
    assert trial.bound(["gated"])["gated"].spec.node_name == node


def test_deleting_a_pod_requeues_what_it_blocked(trial: Trial) -> None:
    node = trial.node("full", "pcie-4gpu")
    trial.scheduler()
    trial.bound([trial.pod("holder", 4)])
    trial.pod("waiter", 2)
    wait_failed_scheduling(trial.core, trial.namespace, "waiter")
    trial.core.delete_namespaced_pod("holder", trial.namespace, grace_period_seconds=0)
    assert trial.bound(["waiter"])["waiter"].spec.node_name == node


def test_an_invalid_request_gets_an_event_naming_the_problem(trial: Trial) -> None:
    trial.node("inv", "pcie-4gpu")
    trial.scheduler()
    trial.pod("odd", annotations={"kubegpu.io/gpu-milli": "1500"})
    event = wait_failed_scheduling(trial.core, trial.namespace, "odd", containing="invalid kubegpu request")
    assert "kubegpu.io/gpu-milli=1500 is outside 1..999" in event.message
    # values a lenient reading would take (int() reads "1_00" as 100): the same Event, none bound
    trial.pod("underscore", annotations={"kubegpu.io/gpu-milli": "1_00"})
    trial.pod("comma", annotations={"kubegpu.io/gpu-milli": "100", "kubegpu.io/gpu-containers": ","})
    for name, problem in (
        ("underscore", "kubegpu.io/gpu-milli='1_00' is not a whole number in decimal digits"),
        ("comma", "kubegpu.io/gpu-containers=',' names an empty container"),
    ):
        event = wait_failed_scheduling(trial.core, trial.namespace, name, containing=problem)
        assert event.message.startswith("invalid kubegpu request: annotation "), event.message
        assert not trial.core.read_namespaced_pod(name, trial.namespace).spec.node_name


def test_a_binding_of_unknown_outcome_is_read_back_from_the_apiserver(trial: Trial) -> None:
    """The Binding was stored but its answer was lost: the booking stays until the pod is seen
    bound, and the read-back (the real client call, RBAC verb get) books what the pod says."""
    import urllib3

    from scheduler.live.cache import Assumed, Binding

    node = trial.node("lost", "pcie-4gpu")
    scheduler = trial.scheduler()
    real = scheduler.core.create_namespaced_pod_binding
    calls: list[str] = []

    def stored_then_lost(name: str, namespace: str, body: Any, **kwargs: Any) -> Any:
        calls.append(name)
        real(name, namespace, body, **kwargs).release_conn()
        raise urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError())

    scheduler.core.create_namespaced_pod_binding = stored_then_lost  # type: ignore[method-assign]
    pod = trial.bound([trial.pod("p", 1)])["p"]
    assert pod.spec.node_name == node and calls == ["p"]
    uid = pod.metadata.uid
    devices = verify(pod.metadata.annotations[ANNOTATION], KEYS).containers["app"].devices
    deadline = time.monotonic() + 30
    while uid in scheduler.assumed:
        assert time.monotonic() < deadline, "still assumed"
        time.sleep(0.1)
    with scheduler.cond:
        booked = scheduler.cache.view().allocation(uid)
        assert booked is not None and booked.device_ids() == tuple(devices)
        # The watch usually settles it first; the read-back itself, against the real apiserver:
        scheduler.cache.assumed[uid] = Assumed(booked, Binding.UNCERTAIN, 0.0)
    scheduler._read_back(uid, trial.namespace, "p")
    assert uid not in scheduler.assumed and calls == ["p"]
    assert 'kubegpu_scheduler_read_backs_total{outcome="bound"} 1.0' in scheduler.metrics.render().decode()


def test_a_cordoned_node_takes_only_pods_tolerating_the_cordon(trial: Trial) -> None:
    """kube-scheduler's NodeUnschedulable: a cordoned node refuses a pod with "node(s) were
    unschedulable" unless the pod tolerates node.kubernetes.io/unschedulable:NoSchedule."""
    node = trial.node("cordoned", "pcie-4gpu")
    trial.core.patch_node(node, {"spec": {"unschedulable": True}})
    trial.scheduler()
    trial.pod("plain", 1)
    tolerating = gpu_pod(trial.namespace, "tolerating", 1, scheduler=trial.name, selector={"run": trial.run})
    tolerating["spec"]["tolerations"] = [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    ]
    trial.core.create_namespaced_pod(trial.namespace, tolerating)
    assert trial.bound(["tolerating"])["tolerating"].spec.node_name == node
    # every cordoned node of the shared apiserver counts here (the filter runs before the selector)
    wait_failed_scheduling(trial.core, trial.namespace, "plain", containing=" node(s) were unschedulable")
