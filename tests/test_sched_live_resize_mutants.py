"""What the mutation run of the live scheduler's functions changed since their last measurement
showed untested (docs/testing.md, "the in-place resize fix and preemption's inputs"): the kubelet's
reported resources read entry by entry, the resize condition among others, and a victim's other
resources and host ports as preemption sees them."""

from __future__ import annotations

from decimal import Decimal

from scheduler.core.request import HostPort
from scheduler.core.state import Allocation
from scheduler.live.podspec import container_statuses, resize_infeasible
from scheduler.live.preemption import running_pod


def test_an_unreadable_reported_quantity_leaves_the_others_and_zero_is_a_quantity() -> None:
    pod = {
        "status": {
            "containerStatuses": [
                {
                    "name": "app",
                    "resources": {"requests": {"cpu": "lots", "memory": "1Gi", "example.com/foo": "0"}},
                    "allocatedResources": {"cpu": "-1", "memory": "2Gi"},
                }
            ]
        }
    }
    running, allocated = container_statuses(pod)["app"]
    assert running == {"memory": Decimal(2**30), "example.com/foo": Decimal(0)}
    assert allocated == {"memory": Decimal(2**31)}


def test_the_resize_condition_is_found_among_others_and_a_pod_may_have_no_status() -> None:
    others = [{"type": "PodScheduled", "status": "True", "reason": "Infeasible"}, "not a condition"]
    refused = {"type": "PodResizePending", "status": "True", "reason": "Infeasible"}
    assert resize_infeasible({"status": {"conditions": [*others, refused]}})
    assert not resize_infeasible({"status": {"conditions": others}})
    assert not resize_infeasible({"status": {"conditions": [{**refused, "reason": "Deferred"}]}})
    assert not resize_infeasible({})
    assert not resize_infeasible({"status": "pending"})


def test_a_victim_frees_its_other_resources_memory_in_bytes_and_host_ports() -> None:
    port = HostPort("TCP", "0.0.0.0", 8080)
    alloc = Allocation(
        node="n1",
        pod_uid="u",
        pod_name="ns/p",
        memory_mib=512,
        resources=(("example.com/foo", 2),),
        host_ports=(port,),
    )
    victim = running_pod(alloc, {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {}})
    assert victim.resources == {"example.com/foo": 2, "memory": 512 * 2**20}
    assert victim.host_ports == (port,)


def test_statuses_of_init_containers_count_and_an_entry_without_resources_is_skipped() -> None:
    pod = {
        "status": {
            "containerStatuses": [
                {"name": "starting"},  # no resources reported yet
                {"name": "app", "resources": {"requests": {"cpu": "2"}}},
            ],
            "initContainerStatuses": [{"name": "sidecar", "resources": {"requests": {"cpu": "1"}}}],
        }
    }
    assert container_statuses(pod) == {
        "app": ({"cpu": Decimal(2)}, {}),
        "sidecar": ({"cpu": Decimal(1)}, {}),
    }
