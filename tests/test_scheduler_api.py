"""The live scheduler against a real kube-apiserver: bindings, signed allocations, events, restarts."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from crishim.advertiser import Advertiser
from crishim.rewrite import KeyRing, NodeDevices
from devices.plugin import load_plugins
from devices.sim import sim_gpu_id
from kubegpu.allocation import ANNOTATION, verify
from kubegpu.devenv.controlplane import create_fake_node
from scheduler.live.config import SchedulerConfig
from scheduler.live.scheduler import Scheduler

pytestmark = pytest.mark.apiserver
KEYS = {"k1": b"scheduler-test-key-0123456789abcdef"}


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


@pytest.fixture
def scheduler_factory(admin_api: k8s.ApiClient) -> Iterator[Callable[..., Scheduler]]:
    started: list[tuple[Scheduler, threading.Thread]] = []

    def start(name: str, policy: str = SchedulerConfig().policy, **overrides: Any) -> Scheduler:
        config = SchedulerConfig(scheduler_name=name, policy=policy, **overrides)
        scheduler = Scheduler(config, admin_api, KeyRing(None, KEYS), seed=7)
        scheduler.start_watching()
        assert scheduler.wait_synced(30)
        scheduler.leading.set()
        thread = threading.Thread(target=scheduler.run, daemon=True)
        thread.start()
        started.append((scheduler, thread))
        return scheduler

    yield start
    for scheduler, thread in started:
        scheduler.stop()
        thread.join(timeout=10)


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


def test_pods_bound_with_signed_topology_aware_allocations(
    admin_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path, scheduler_factory: Callable[..., Scheduler]
) -> None:
    core = k8s.CoreV1Api(admin_api)
    sched_name = f"kubegpu-{uuid.uuid4().hex[:6]}"
    node = f"dgx-{uuid.uuid4().hex[:6]}"
    advertise(core, node, "dgx1-v100", tmp_path, labels={"run": node})
    scheduler_factory(sched_name)
    core.create_namespaced_pod(
        kube_namespace, gpu_pod(kube_namespace, "four", 4, scheduler=sched_name, selector={"run": node})
    )
    bound = wait_bound(core, kube_namespace, ["four"])["four"]
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


def test_mixed_burst_never_double_books(
    admin_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path, scheduler_factory: Callable[..., Scheduler]
) -> None:
    core = k8s.CoreV1Api(admin_api)
    run = uuid.uuid4().hex[:6]
    for index, topology in enumerate(("dgx1-v100", "pcie-4gpu", "hgx-h100")):
        advertise(core, f"mix-{run}-{index}", topology, tmp_path, labels={"run": run})
    name = f"kubegpu-{run}"
    # Filling the cluster to the last GPU needs packing: whether a policy packs is the core's tests'
    # business; this one is about never booking a device twice, so it uses the packing policy.
    scheduler_factory(name, policy="bestfit")
    sizes = [4, 2, 2, 1, 1, 8]  # 18 of the 20 GPUs; the 6 shares of 300 fill the last 2
    names = []
    for index, gpus in enumerate(sizes):
        names.append(f"whole-{index}")
        core.create_namespaced_pod(
            kube_namespace, gpu_pod(kube_namespace, names[-1], gpus, scheduler=name, selector={"run": run})
        )
    for index in range(6):
        names.append(f"share-{index}")
        core.create_namespaced_pod(
            kube_namespace,
            gpu_pod(
                kube_namespace,
                names[-1],
                scheduler=name,
                selector={"run": run},
                annotations={"kubegpu.io/gpu-milli": "300", "kubegpu.io/gpu-memory-mib": "2048"},
            ),
        )
    pods = wait_bound(core, kube_namespace, names)
    used = device_usage(list(pods.values()))
    assert all(milli <= 1000 for milli in used.values()), used
    whole = sum(sizes)
    assert sum(1 for m in used.values() if m == 1000) >= whole
    share = verify(pods["share-0"].metadata.annotations[ANNOTATION], KEYS).containers["app"]
    (device,) = share.devices
    assert share.shares[device].milli == 300


def test_unschedulable_pod_gets_an_event_then_runs_when_a_node_appears(
    admin_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path, scheduler_factory: Callable[..., Scheduler]
) -> None:
    core = k8s.CoreV1Api(admin_api)
    run = uuid.uuid4().hex[:6]
    advertise(core, f"small-{run}", "pcie-4gpu", tmp_path, labels={"run": run})
    name = f"kubegpu-{run}"
    scheduler_factory(name)
    core.create_namespaced_pod(
        kube_namespace, gpu_pod(kube_namespace, "big", 8, scheduler=name, selector={"run": run})
    )
    message = wait_failed_scheduling(core, kube_namespace, "big").message
    assert message.startswith("0/") and "nodes are available" in message, message
    assert "1 Insufficient nvidia.com/gpu" in message, message
    condition = [
        c
        for c in core.read_namespaced_pod("big", kube_namespace).status.conditions or []
        if c.type == "PodScheduled"
    ]
    assert condition and condition[0].status == "False" and condition[0].reason == "Unschedulable"
    # A new node that fits: the pod is requeued and bound without any change to it.
    advertise(core, f"big-{run}", "dgx1-v100", tmp_path, labels={"run": run})
    bound = wait_bound(core, kube_namespace, ["big"])["big"]
    assert bound.spec.node_name == f"big-{run}"


def test_stale_heartbeat_makes_a_node_unschedulable(
    admin_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path, scheduler_factory: Callable[..., Scheduler]
) -> None:
    core = k8s.CoreV1Api(admin_api)
    run = uuid.uuid4().hex[:6]
    node = f"stale-{run}"
    advertise(core, node, "pcie-4gpu", tmp_path, labels={"run": run})
    core.patch_node(node, {"metadata": {"annotations": {"kubegpu.io/heartbeat": "2020-01-01T00:00:00Z"}}})
    name = f"kubegpu-{run}"
    scheduler_factory(name)
    core.create_namespaced_pod(
        kube_namespace, gpu_pod(kube_namespace, "p", 1, scheduler=name, selector={"run": run})
    )
    wait_failed_scheduling(core, kube_namespace, "p", containing="heartbeat is stale")
    core.patch_node(
        node,
        {
            "metadata": {
                "annotations": {"kubegpu.io/heartbeat": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            }
        },
    )
    assert wait_bound(core, kube_namespace, ["p"])["p"].spec.node_name == node


def test_restart_in_the_middle_of_a_burst(
    admin_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path, scheduler_factory: Callable[..., Scheduler]
) -> None:
    """200 pods; the scheduler is stopped half way and a new one finishes: no pod lost, no GPU twice."""
    core = k8s.CoreV1Api(admin_api)
    run = uuid.uuid4().hex[:6]
    for index in range(40):  # 320 GPUs for the 300 asked
        advertise(core, f"burst-{run}-{index:02d}", "dgx1-v100", tmp_path, labels={"run": run})
    name = f"kubegpu-{run}"
    first = scheduler_factory(name)
    names = [f"b-{i:03d}" for i in range(200)]
    for index, pod_name in enumerate(names):
        core.create_namespaced_pod(
            kube_namespace,
            gpu_pod(
                kube_namespace, pod_name, 1 + index % 2, scheduler=name, selector={"run": run}, cpu="100m"
            ),
        )
        if index == 100:
            first.stop()  # mid-burst: binds in flight are finished or dropped, nothing is remembered
    scheduler_factory(name)
    pods = wait_bound(core, kube_namespace, names, timeout=120)
    used = device_usage(list(pods.values()))
    assert all(milli == 1000 for milli in used.values())  # whole GPUs, each held by exactly one pod
    assert len(used) == sum(1 + i % 2 for i in range(200))


def test_two_replicas_with_leader_election(
    admin_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path
) -> None:
    """Two replicas at once: one schedules; when it stops the other takes over; no GPU twice."""
    from scheduler.live.config import LeaderElection

    core = k8s.CoreV1Api(admin_api)
    run = uuid.uuid4().hex[:6]
    for index in range(12):
        advertise(core, f"ha-{run}-{index:02d}", "dgx1-v100", tmp_path, labels={"run": run})
    name = f"kubegpu-{run}"
    election = LeaderElection(
        enabled=True,
        namespace=kube_namespace,
        lease_name=f"lease-{run}",
        lease_seconds=2.0,
        renew_deadline_seconds=1.5,
        retry_period_seconds=0.2,
    )
    replicas = []
    for identity in ("replica-a", "replica-b"):
        config = SchedulerConfig(
            scheduler_name=name,
            policy="bestfit",
            identity=identity,
            leader_election=LeaderElection(**vars(election)),
        )
        scheduler = Scheduler(config, admin_api, KeyRing(None, KEYS), seed=1)
        scheduler.start_watching()
        assert scheduler.wait_synced(30)
        scheduler.start_leading(admin_api)
        thread = threading.Thread(target=scheduler.run, daemon=True)
        thread.start()
        replicas.append((scheduler, thread))
    names = [f"ha-{i:03d}" for i in range(80)]
    try:
        for index, pod_name in enumerate(names):
            core.create_namespaced_pod(
                kube_namespace,
                gpu_pod(kube_namespace, pod_name, 1, scheduler=name, selector={"run": run}, cpu="100m"),
            )
            if index == 40:
                leader = next(s for s, _ in replicas if s.leading.is_set())
                assert sum(s.leading.is_set() for s, _ in replicas) == 1
                leader.stop()  # releases the lease: the other replica takes over
        pods = wait_bound(core, kube_namespace, names, timeout=120)
    finally:
        for scheduler, thread in replicas:
            scheduler.stop()
            thread.join(timeout=10)
    used = device_usage(list(pods.values()))
    assert len(used) == len(names) and all(milli == 1000 for milli in used.values())


def test_scheduler_command_serves_metrics_and_health(
    control_plane: Any, admin_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path
) -> None:
    """``kubegpu scheduler`` as a process: config file, flags, /healthz, /metrics, clean SIGTERM."""
    import signal
    import subprocess
    import sys
    import urllib.request

    from kubegpu.devenv.shimproc import free_port

    core = k8s.CoreV1Api(admin_api)
    run = uuid.uuid4().hex[:6]
    advertise(core, f"cli-{run}", "pcie-4gpu", tmp_path, labels={"run": run})
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "k1").write_bytes(KEYS["k1"])
    port = free_port()
    config = tmp_path / "scheduler.yaml"
    config.write_text(f"schedulerName: kubegpu-{run}\npolicy: bestfit\nkeysDir: {keys}\nsigningKeyId: k1\n")
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
        core.create_namespaced_pod(
            kube_namespace, gpu_pod(kube_namespace, "p", 2, scheduler=f"kubegpu-{run}", selector={"run": run})
        )
        pod = wait_bound(core, kube_namespace, ["p"])["p"]
        assert verify(pod.metadata.annotations[ANNOTATION], KEYS).node == f"cli-{run}"
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
    assert '"event":"pod.bound"' in output and f'"node":"cli-{run}"' in output


def test_scheduling_gates_hold_a_pod_back(
    admin_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path, scheduler_factory: Callable[..., Scheduler]
) -> None:
    core = k8s.CoreV1Api(admin_api)
    run = uuid.uuid4().hex[:6]
    advertise(core, f"gate-{run}", "pcie-4gpu", tmp_path, labels={"run": run})
    name = f"kubegpu-{run}"
    scheduler_factory(name)
    pod = gpu_pod(kube_namespace, "gated", 1, scheduler=name, selector={"run": run})
    pod["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
    core.create_namespaced_pod(kube_namespace, pod)
    time.sleep(2)
    assert not core.read_namespaced_pod("gated", kube_namespace).spec.node_name
    core.patch_namespaced_pod(
        "gated",
        kube_namespace,
        {"spec": {"schedulingGates": None}},
        _content_type="application/merge-patch+json",
    )
    assert wait_bound(core, kube_namespace, ["gated"])["gated"].spec.node_name == f"gate-{run}"


def test_deleting_a_pod_requeues_what_it_blocked(
    admin_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path, scheduler_factory: Callable[..., Scheduler]
) -> None:
    core = k8s.CoreV1Api(admin_api)
    run = uuid.uuid4().hex[:6]
    advertise(core, f"full-{run}", "pcie-4gpu", tmp_path, labels={"run": run})
    name = f"kubegpu-{run}"
    scheduler_factory(name)
    core.create_namespaced_pod(
        kube_namespace, gpu_pod(kube_namespace, "holder", 4, scheduler=name, selector={"run": run})
    )
    wait_bound(core, kube_namespace, ["holder"])
    core.create_namespaced_pod(
        kube_namespace, gpu_pod(kube_namespace, "waiter", 2, scheduler=name, selector={"run": run})
    )
    wait_failed_scheduling(core, kube_namespace, "waiter")
    core.delete_namespaced_pod("holder", kube_namespace, grace_period_seconds=0)
    assert wait_bound(core, kube_namespace, ["waiter"])["waiter"].spec.node_name == f"full-{run}"
