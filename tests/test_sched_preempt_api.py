"""Priority and preemption through the live scheduler and a real kube-apiserver (issue #9, item 12):
the right victim is evicted through the Eviction API, the preemptor is nominated and gets exactly
the freed GPUs, PodDisruptionBudgets and ``preemptionPolicy: Never`` are honoured."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from kubegpu.allocation import ANNOTATION, verify
from tests.support.rdmainv import sim_nic_topology
from tests.support.schedtrial import (
    create,
    kubelet_stand_in,
    make_trial,
    priority_classes,
    wait_for,
)
from tests.test_scheduler_api import KEYS, Trial, gpu_index, scheduler_starter, wait_failed_scheduling

pytestmark = pytest.mark.apiserver


@pytest.fixture
def trial(admin_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path) -> Iterator[Trial]:
    with scheduler_starter(admin_api) as start:
        yield make_trial(admin_api, kube_namespace, tmp_path, start)


@pytest.fixture
def classes(admin_api: k8s.ApiClient, trial: Trial) -> Iterator[dict[str, str]]:
    with priority_classes(admin_api, trial.run, low=100, mid=500, high=1000) as names:
        yield names


def devices(pod: k8s.V1Pod) -> list[int]:
    allocation = verify(pod.metadata.annotations[ANNOTATION], KEYS)
    return sorted(gpu_index(allocation.node, d) for c in allocation.containers.values() for d in c.devices)


def pod(trial: Trial, name: str) -> k8s.V1Pod | None:
    try:
        return trial.core.read_namespaced_pod(name, trial.namespace)
    except k8s.ApiException as error:
        if error.status == 404:
            return None
        raise


def events(trial: Trial, name: str, reason: str) -> list[str]:
    return [
        e.message
        for e in trial.core.list_namespaced_event(trial.namespace).items
        if e.involved_object.name == name and e.reason == reason
    ]


def test_preemption_evicts_the_cheapest_victim_and_hands_its_gpus_over(
    trial: Trial, classes: dict[str, str]
) -> None:
    """A DGX-1 runs a low-priority 4-GPU pod and a mid-priority one. A high-priority pod asking for
    4 NVLink GPUs fits nowhere: the low one is evicted, the preemptor is nominated to the node and
    gets exactly the GPUs the victim held; the mid one keeps running."""
    node = trial.node("dgx", "dgx1-v100")
    trial.scheduler()
    create(trial, "low", 4, priorityClassName=classes["low"])
    create(trial, "mid", 4, priorityClassName=classes["mid"])
    placed = trial.bound(["low", "mid"])
    freed = devices(placed["low"])
    create(
        trial,
        "high",
        4,
        annotations={"kubegpu.io/topology": "nvlink=require"},
        priorityClassName=classes["high"],
    )
    # the victim is terminating (no kubelet finishes it yet) and the preemptor nominated
    wait_for(lambda: pod(trial, "low").metadata.deletion_timestamp, "the eviction of low")
    assert wait_for(lambda: pod(trial, "high").status.nominated_node_name, "the nomination") == node
    assert not pod(trial, "high").spec.node_name  # the victim still holds its GPUs
    with kubelet_stand_in(trial.core, trial.namespace) as removed:
        high = trial.bound(["high"], timeout=90)["high"]
    assert removed == ["low"]
    assert high.spec.node_name == node and devices(high) == freed
    assert pod(trial, "mid") is not None and pod(trial, "mid").metadata.deletion_timestamp is None
    assert any(f"on node {node}" in m for m in events(trial, "low", "Preempted"))


def test_pdb_protected_pod_is_not_the_victim(trial: Trial, classes: dict[str, str]) -> None:
    """The cheapest victim is covered by a PodDisruptionBudget that allows no disruption: the
    next one is evicted instead, through the Eviction API that enforces the budget."""
    trial.node("pcie", "pcie-4gpu")
    trial.scheduler()
    k8s.PolicyV1Api(trial.core.api_client).create_namespaced_pod_disruption_budget(
        trial.namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "keep-db"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}},
        },
    )
    create(trial, "db", 2, labels={"app": "db"}, priorityClassName=classes["low"])
    create(trial, "batch", 2, labels={"app": "batch"}, priorityClassName=classes["mid"])
    placed = trial.bound(["db", "batch"])
    with kubelet_stand_in(trial.core, trial.namespace) as removed:
        create(trial, "urgent", 2, priorityClassName=classes["high"])
        urgent = trial.bound(["urgent"], timeout=90)["urgent"]
    assert removed == ["batch"]
    assert devices(urgent) == devices(placed["batch"])
    assert pod(trial, "db") is not None and pod(trial, "db").metadata.deletion_timestamp is None


def test_a_budget_that_protects_everything_leaves_the_preemptor_pending(
    trial: Trial, classes: dict[str, str]
) -> None:
    trial.node("pcie", "pcie-4gpu")
    trial.scheduler()
    k8s.PolicyV1Api(trial.core.api_client).create_namespaced_pod_disruption_budget(
        trial.namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "keep-all"},
            "spec": {"maxUnavailable": 0, "selector": {}},
        },
    )
    create(trial, "a", 4, priorityClassName=classes["low"])
    trial.bound(["a"])
    create(trial, "urgent", 1, priorityClassName=classes["high"])
    wait_failed_scheduling(trial.core, trial.namespace, "urgent")
    time.sleep(2)
    assert pod(trial, "a").metadata.deletion_timestamp is None
    assert not pod(trial, "urgent").spec.node_name and not pod(trial, "urgent").status.nominated_node_name


def test_preemption_policy_never_waits_instead(admin_api: k8s.ApiClient, trial: Trial) -> None:
    trial.node("pcie", "pcie-4gpu")
    trial.scheduler()
    scheduling = k8s.SchedulingV1Api(admin_api)
    polite = f"polite-{trial.run}"
    scheduling.create_priority_class(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": polite},
            "value": 1000,
            "preemptionPolicy": "Never",
        }
    )
    try:
        create(trial, "occupant", 4)
        trial.bound(["occupant"])
        create(trial, "patient", 2, priorityClassName=polite)
        wait_failed_scheduling(trial.core, trial.namespace, "patient")
        time.sleep(2)
        assert pod(trial, "occupant").metadata.deletion_timestamp is None
        patient = pod(trial, "patient")
        assert patient.spec.preemption_policy == "Never" and patient.spec.priority == 1000
        assert not patient.spec.node_name and not patient.status.nominated_node_name
        # when room appears, the patient pod is placed ahead of lower-priority pods waiting
        create(trial, "later", 2)
        wait_failed_scheduling(trial.core, trial.namespace, "later")
        trial.core.delete_namespaced_pod("occupant", trial.namespace, grace_period_seconds=0)
        assert trial.bound(["patient"])["patient"].spec.node_name
    finally:
        scheduling.delete_priority_class(polite)


def test_equal_priority_never_preempts(trial: Trial, classes: dict[str, str]) -> None:
    trial.node("pcie", "pcie-4gpu")
    trial.scheduler()
    create(trial, "first", 4, priorityClassName=classes["mid"])
    trial.bound(["first"])
    create(trial, "second", 1, priorityClassName=classes["mid"])
    wait_failed_scheduling(trial.core, trial.namespace, "second")
    time.sleep(2)
    assert pod(trial, "first").metadata.deletion_timestamp is None


def test_freed_gpus_go_to_the_preemptor_not_to_a_lower_priority_pod(
    trial: Trial, classes: dict[str, str]
) -> None:
    """While the victim terminates, a low-priority pod that would fit in the freed room arrives:
    the room is the preemptor's (it is nominated), so the newcomer waits."""
    trial.node("pcie", "pcie-4gpu")
    trial.scheduler()
    create(trial, "victim", 4, priorityClassName=classes["low"])
    trial.bound(["victim"])
    create(trial, "preemptor", 4, priorityClassName=classes["high"])
    wait_for(
        lambda: (p := pod(trial, "victim")) is not None and p.metadata.deletion_timestamp, "the eviction"
    )
    wait_for(lambda: pod(trial, "preemptor").status.nominated_node_name, "the nomination")
    create(trial, "newcomer", 4, priorityClassName=classes["mid"])
    wait_failed_scheduling(trial.core, trial.namespace, "newcomer")
    with kubelet_stand_in(trial.core, trial.namespace):
        assert trial.bound(["preemptor"], timeout=90)["preemptor"].spec.node_name
        time.sleep(1)
        assert not pod(trial, "newcomer").spec.node_name


def test_a_pod_asking_an_rdma_interface_evicts_the_pod_holding_the_bandwidth_it_needs(
    trial: Trial, classes: dict[str, str]
) -> None:
    """The node's one 100G PF has two VFs, held by a low-priority 10G pod and a mid-priority 60G
    one. A high-priority pod asking a 50G interface needs the 60G pod's bandwidth: the cheaper low
    pod would free a VF but not enough bandwidth, so the mid pod is the victim, and the preemptor
    gets its VF (version-2 allocation, 50G reserved)."""
    node = trial.node("nic", sim_nic_topology(trial.state))
    trial.scheduler()

    def rdma(bandwidth: str) -> dict[str, str]:
        return {"kubegpu.io/rdma-interfaces": "1", "kubegpu.io/rdma-bandwidth": bandwidth}

    create(trial, "light", 0, annotations=rdma("10Gbps"), priorityClassName=classes["low"])
    create(trial, "bulk", 0, annotations=rdma("60Gbps"), priorityClassName=classes["mid"])
    placed = trial.bound(["light", "bulk"])
    freed = [r.device for r in verify(placed["bulk"].metadata.annotations[ANNOTATION], KEYS).rdma]
    with kubelet_stand_in(trial.core, trial.namespace) as removed:
        create(trial, "urgent", 0, annotations=rdma("50Gbps"), priorityClassName=classes["high"])
        urgent = trial.bound(["urgent"], timeout=90)["urgent"]
    assert removed == ["bulk"]
    granted = verify(urgent.metadata.annotations[ANNOTATION], KEYS)
    assert urgent.spec.node_name == node
    assert [(r.device, r.pf, r.min_mbps) for r in granted.rdma] == [(freed[0], "mlx5_0", 50_000)]
    assert pod(trial, "light") is not None and pod(trial, "light").metadata.deletion_timestamp is None
