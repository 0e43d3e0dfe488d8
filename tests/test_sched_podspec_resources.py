"""What a pod requests by Kubernetes' rule, and what nodes and bound pods hold (issue 20, items 1-4).

``podspec.pod_resources`` follows component-helpers' ``PodRequests`` (containers' requests, else
their limits, by the init/sidecar rule; pod-level ``spec.resources`` for CPU, memory and hugepages
with the apiserver's defaulting; then overhead) and kube-scheduler's ``GetHostPorts``; the cache
charges every bound pod, whoever bound it, for all of it.
"""

from __future__ import annotations

from typing import Any

import pytest

from crishim.advertiser import publication
from scheduler.core.request import HostPort
from scheduler.live.podspec import PodSpecError, pod_request
from scheduler.live.translate import node_facts, pod_usage
from tests.support.rdmainv import Pf, rdma_inventory
from tests.support.schedworld import drive, node_json, pod_json
from tests.test_sched_cache import setup

MiB = 1 << 20


def container(
    name: str = "app", requests: dict | None = None, limits: dict | None = None, **extra: Any
) -> dict:
    return {
        "name": name,
        "image": "x",
        "resources": {"requests": requests or {}, "limits": limits or {}},
        **extra,
    }


def pod(*containers: dict, init: list[dict] | None = None, **spec: Any) -> dict:
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init:
        body["initContainers"] = init
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": body}


# --- item 1: every requested resource -------------------------------------------------------------


def test_every_resource_is_read_by_the_init_and_sidecar_rule() -> None:
    request = pod_request(
        pod(
            container("a", {"example.com/foo": "2", "ephemeral-storage": "1Gi", "memory": "1Gi"}),
            container("b", limits={"example.com/foo": "1", "kubegpu.io/rdma": "1", "hugepages-2Mi": "4Mi"}),
            init=[
                container("proxy", {"example.com/foo": "1"}, restartPolicy="Always"),
                container("setup", {"example.com/foo": "5", "ephemeral-storage": "500Mi"}),
            ],
        )
    )
    assert dict(request.resources) == {
        "example.com/foo": 5 + 1,  # the init container beside the sidecar before it beats 2 + 1 + 1
        "ephemeral-storage": 1 << 30,
        "hugepages-2Mi": 4 * MiB,
        "kubegpu.io/rdma": 1,  # from its limit, as the apiserver defaults requests
        "memory": 1 << 30,
    }


def test_the_gpu_resource_is_counted_apart_and_cpu_is_not_among_the_resources() -> None:
    request = pod_request(pod(container(requests={"cpu": "1"}, limits={"nvidia.com/gpu": "2"})))
    assert request.gpu_count == 2 and request.resources == () and request.cpu_milli == 1000


def test_a_request_beats_its_limit_and_zero_requests_are_dropped() -> None:
    request = pod_request(
        pod(container(requests={"memory": "1Gi", "example.com/foo": "0"}, limits={"memory": "2Gi"}))
    )
    assert request.resources == (("memory", 1 << 30),) and request.memory_mib == 1024


def test_quantities_are_summed_exactly_then_rounded_up() -> None:
    """Kubernetes sums the quantities and rounds once (``MilliValue`` / ``Value``)."""
    request = pod_request(
        pod(
            container("a", {"cpu": "0.0005", "memory": "1.5"}),
            container("b", {"cpu": "0.0005", "memory": "1.5"}),
        )
    )
    assert request.cpu_milli == 1 and dict(request.resources)["memory"] == 3


def test_overhead_adds_to_every_resource() -> None:
    request = pod_request(
        pod(container(requests={"memory": "1Gi"}), overhead={"memory": "64Mi", "example.com/foo": "1"})
    )
    assert dict(request.resources) == {"memory": (1 << 30) + 64 * MiB, "example.com/foo": 1}


def test_a_negative_request_is_refused_by_name() -> None:
    with pytest.raises(PodSpecError, match="example.com/foo of container app must not be negative"):
        pod_request(pod(container(requests={"example.com/foo": "-1"})))


# --- item 2: pod-level resources -------------------------------------------------------------------


def test_pod_level_requests_replace_the_containers_aggregate() -> None:
    request = pod_request(
        pod(
            container("a", {"cpu": "100m", "memory": "100Mi", "ephemeral-storage": "1Gi"}),
            container("b", {"cpu": "100m"}),
            resources={"requests": {"cpu": "3", "memory": "1Gi", "ephemeral-storage": "5Gi"}},
            overhead={"cpu": "250m"},
        )
    )
    assert request.cpu_milli == 3250  # the pod-level 3 CPUs, then the overhead
    # memory is pod-level too; ephemeral storage is not a pod-level resource: the containers' figure
    assert dict(request.resources) == {"memory": 1 << 30, "ephemeral-storage": 1 << 30}


def test_pod_level_limits_default_the_requests_as_the_apiserver_does() -> None:
    # CPU: the containers ask for some, so the pod-level request defaults to their aggregate;
    # memory: no container asks, so it defaults to the pod-level limit.
    request = pod_request(
        pod(container("a", {"cpu": "500m"}), resources={"limits": {"cpu": "4", "memory": "2Gi"}})
    )
    assert request.cpu_milli == 500 and dict(request.resources) == {"memory": 2 << 30}


def test_pod_level_hugepages_limits_stand_for_their_requests() -> None:
    request = pod_request(
        pod(
            container("a", {"cpu": "1"}),
            resources={"requests": {"cpu": "2"}, "limits": {"hugepages-2Mi": "8Mi"}},
        )
    )
    assert request.cpu_milli == 2000 and dict(request.resources) == {"hugepages-2Mi": 8 * MiB}


def test_pod_level_resources_of_unsupported_names_change_nothing() -> None:
    request = pod_request(pod(container("a", {"cpu": "1"}), resources={"requests": {"example.com/foo": "3"}}))
    assert request.cpu_milli == 1000 and request.resources == ()


# --- item 3: host ports ------------------------------------------------------------------------------


def test_host_ports_of_app_containers_and_sidecars_count_not_of_init_containers() -> None:
    request = pod_request(
        pod(
            container("a", ports=[{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81}]),
            container(
                "b", ports=[{"containerPort": 53, "hostPort": 53, "protocol": "UDP", "hostIP": "10.0.0.1"}]
            ),
            init=[
                container("proxy", restartPolicy="Always", ports=[{"containerPort": 9, "hostPort": 9000}]),
                container("setup", ports=[{"containerPort": 7, "hostPort": 7000}]),
            ],
        )
    )
    assert set(request.host_ports) == {
        HostPort("TCP", "0.0.0.0", 8080),
        HostPort("UDP", "10.0.0.1", 53),
        HostPort("TCP", "0.0.0.0", 9000),
    }


def test_a_host_network_pod_binds_its_container_ports() -> None:
    request = pod_request(pod(container(ports=[{"containerPort": 80}]), hostNetwork=True))
    assert request.host_ports == (HostPort("TCP", "0.0.0.0", 80),)


@pytest.mark.parametrize("port", ["80", -1, 70000, True])
def test_a_malformed_host_port_gets_a_clear_message(port: object) -> None:
    with pytest.raises(PodSpecError, match="hostPort of container app is not a port number"):
        pod_request(pod(container(ports=[{"containerPort": 80, "hostPort": port}])))


# --- item 4 and the node side: exact allocatable --------------------------------------------------


def test_node_allocatable_is_read_exactly() -> None:
    node = node_json("n1", 2, memory=str(1000 * MiB + 1))
    node["status"]["allocatable"].update(
        {"example.com/foo": "3", "hugepages-1Gi": "2Gi", "ephemeral-storage": "100Gi"}
    )
    facts = node_facts(node)
    assert not facts.problem
    assert facts.memory_mib == 1000  # rounded down: it only feeds scores
    assert dict(facts.allocatable) == {
        "memory": 1000 * MiB + 1,
        "example.com/foo": 3,
        "hugepages-1Gi": 2 << 30,
        "ephemeral-storage": 100 << 30,
    }


def test_an_unreadable_extended_allocatable_leaves_the_node_out_naming_it() -> None:
    node = node_json("n1", 2)
    node["status"]["allocatable"]["example.com/foo"] = "lots"
    assert "allocatable example.com/foo is unreadable" in node_facts(node).problem


def test_a_bound_pod_is_charged_for_everything_it_requests() -> None:
    bound = pod_json("theirs", scheduler="default-scheduler", node="n1")
    bound["spec"]["containers"][0]["resources"]["limits"]["example.com/foo"] = "2"
    bound["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 80}]
    usage = pod_usage(bound)
    assert dict(usage.resources) == {"example.com/foo": 2, "memory": 1 << 30}
    assert usage.host_ports == (HostPort("TCP", "0.0.0.0", 80),)


# --- the cache: pods bound by any scheduler hold what they request --------------------------------


def asking(
    name: str, resources: dict[str, str] | None = None, ports: tuple[int, ...] = (), **kw: Any
) -> dict:
    body = pod_json(name, **kw)
    app = body["spec"]["containers"][0]
    app["resources"]["limits"].update(resources or {})
    app["ports"] = [{"containerPort": p, "hostPort": p} for p in ports]
    return body


@pytest.mark.parametrize(
    ("resource", "node_has"),
    [
        ("example.com/foo", "2"),
        ("kubegpu.io/rdma", "2"),
        ("hugepages-2Mi", "4Mi"),
        ("ephemeral-storage", "2Gi"),
    ],
)
def test_resources_held_by_pods_of_other_schedulers_count(resource: str, node_has: str) -> None:
    # kubegpu.io/rdma asks for VFs too: the node has more than its allocatable, so only the count binds
    vfs = rdma_inventory("n1", [], [Pf("mlx5_0", 400, vfs=4)]) if resource == "kubegpu.io/rdma" else None
    node = node_json("n1", 0, inventory=publication(vfs).inventory if vfs else None)
    node["status"]["allocatable"][resource] = node_has
    half = {"2": "1", "4Mi": "2Mi", "2Gi": "1Gi"}[node_has]
    world, scheduler, jobs, core, clock, feed = setup([node])
    world.put_pod(asking("theirs", {resource: half}, scheduler="default-scheduler", node="n1"))
    world.put_pod(asking("fits", {resource: half}))
    world.put_pod(asking("more", {resource: half}))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    placed = [name for name in ("fits", "more") if world.node_of(name) == "n1"]
    assert len(placed) == 1, placed
    waiting = "more" if placed == ["fits"] else "fits"
    assert core.failed_events(waiting)[0] == f"0/1 nodes are available: 1 Insufficient {resource}."


def test_a_resource_no_node_has_is_never_bound() -> None:
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 0), node_json("n2", 0)])
    world.put_pod(asking("p", {"example.com/foo": "1"}))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") is None
    assert core.failed_events("p")[0] == "0/2 nodes are available: 2 Insufficient example.com/foo."


def test_host_ports_held_by_pods_of_other_schedulers_count() -> None:
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 0), node_json("n2", 0)])
    world.put_pod(asking("theirs", ports=[8080], scheduler="default-scheduler", node="n1"))
    world.put_pod(asking("web1", ports=[8080]))
    world.put_pod(asking("web2", ports=[8080]))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    nodes = sorted(filter(None, (world.node_of("web1"), world.node_of("web2"))))
    assert nodes == ["n2"]
    waiting = "web2" if world.node_of("web1") else "web1"
    assert core.failed_events(waiting)[0] == (
        "0/2 nodes are available: 2 node(s) didn't have free ports for the requested pod ports."
    )


def test_memory_is_compared_in_bytes() -> None:
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 0, memory=str(1000 * MiB + 1))])
    world.put_pod(pod_json("p", memory="1001Mi"))
    world.put_pod(pod_json("q", memory="1000Mi"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") is None and world.node_of("q") == "n1"
    assert core.failed_events("p")[0] == "0/1 nodes are available: 1 Insufficient memory."


def test_pod_level_cpu_is_charged_to_bound_pods() -> None:
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 0, cpu="4")])
    theirs = pod_json("theirs", cpu="100m", scheduler="default-scheduler", node="n1")
    theirs["spec"]["resources"] = {"requests": {"cpu": "3"}}
    world.put_pod(theirs)
    world.put_pod(pod_json("p", cpu="2"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") is None
    assert core.failed_events("p")[0] == "0/1 nodes are available: 1 Insufficient cpu."
