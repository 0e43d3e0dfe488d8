"""CPU and memory are charged by a pod's requests, not its limits (Kubernetes' rule).

A container's limits count only where it states no request (the apiserver then defaults the
request to the limit). Every pod of these tests has requests below its limits, which no other
test pod has: a pod charged its limits is refused room it has, whether it is pending (our
request) or bound by anyone (what it takes from its node).
"""

from __future__ import annotations

from typing import Any

from scheduler.live.podspec import pod_request, pod_resources
from scheduler.live.translate import pod_usage
from tests.support.schedworld import Feed, World, drive, make_scheduler, node_json, pod_json


def resources(requests: dict[str, str] | None, limits: dict[str, str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if requests is not None:
        out["requests"] = requests
    if limits is not None:
        out["limits"] = limits
    return out


def pod(
    containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": containers, **spec}
    if init:
        body["initContainers"] = init
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u-p"}, "spec": body}


def container(
    name: str, requests: dict[str, str] | None, limits: dict[str, str] | None, **extra: Any
) -> dict:
    return {"name": name, "image": "x", "resources": resources(requests, limits), **extra}


LIMITS = {"cpu": "4", "memory": "8Gi"}


def test_requests_below_limits_are_what_a_pending_pod_asks_for() -> None:
    request = pod_request(pod([container("app", {"cpu": "500m", "memory": "1Gi"}, LIMITS)]))
    assert (request.cpu_milli, request.memory_mib) == (500, 1024)


def test_a_bound_pod_takes_its_requests_from_its_node() -> None:
    usage = pod_usage(pod([container("app", {"cpu": "250m", "memory": "300Mi"}, LIMITS)]))
    assert (usage.cpu_milli, usage.memory_mib, usage.gpus, usage.problem) == (250, 300, 0, "")


def cpu_memory(body: dict[str, Any]) -> tuple[int, int]:
    """(CPU milli, memory MiB) that ``pod_resources`` finds for ``body``."""
    found = pod_resources(body, "nvidia.com/gpu")
    return found.cpu_milli, found.memory_mib


def test_a_limit_counts_only_where_no_request_is_stated() -> None:
    only_limits = pod([container("app", None, {"cpu": "2", "memory": "3Gi"})])
    assert cpu_memory(only_limits) == (2000, 3072)
    cpu_request_only = pod([container("app", {"cpu": "100m"}, {"cpu": "1", "memory": "2Gi"})])
    assert cpu_memory(cpu_request_only) == (100, 2048)
    memory_request_only = pod([container("app", {"memory": "64Mi"}, {"cpu": "3", "memory": "2Gi"})])
    assert cpu_memory(memory_request_only) == (3000, 64)
    nothing = pod([container("app", None, None)])
    assert cpu_memory(nothing) == (0, 0)


def test_init_sidecar_and_app_containers_are_each_charged_their_requests() -> None:
    spec = pod(
        [
            container("a", {"cpu": "1", "memory": "1Gi"}, LIMITS),
            container("b", {"cpu": "500m", "memory": "512Mi"}, LIMITS),
        ],
        init=[
            container("setup", {"cpu": "2", "memory": "1Gi"}, {"cpu": "16", "memory": "64Gi"}),
            container("proxy", {"cpu": "100m", "memory": "128Mi"}, LIMITS, restartPolicy="Always"),
        ],
        overhead={"cpu": "50m", "memory": "16Mi"},
    )
    cpu, memory = cpu_memory(spec)
    # CPU: max(setup 2000 (no sidecar before it), apps 1500 + sidecar 100) + overhead 50.
    # Memory: max(setup 1024, apps 1536 + sidecar 128) + overhead 16.
    assert (cpu, memory) == (2050, 1680)
    request = pod_request(spec)
    assert (request.cpu_milli, request.memory_mib) == (2050, 1680)


def with_limits(body: dict[str, Any], limits: dict[str, str]) -> dict[str, Any]:
    body["spec"]["containers"][0]["resources"]["limits"].update(limits)
    return body


def test_pods_bound_by_anyone_or_pending_are_charged_their_requests() -> None:
    # 4 CPUs and 16 GiB: the three pods' requests fill the node exactly; their limits are the
    # whole node each.
    world = World()
    world.put_node(node_json("n1", 0, cpu="4", memory="16Gi"))
    scheduler, jobs, _core, clock = make_scheduler(world)
    feed = Feed(world, scheduler)
    feed.relist()
    node_limits = {"cpu": "4", "memory": "16Gi"}
    theirs = pod_json("theirs", cpu="1", memory="2Gi", scheduler="default-scheduler", node="n1")
    world.put_pod(with_limits(theirs, node_limits))
    world.put_pod(with_limits(pod_json("p", cpu="2", memory="4Gi"), node_limits))
    world.put_pod(with_limits(pod_json("q", cpu="1", memory="10Gi"), node_limits))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") == "n1" and world.node_of("q") == "n1"
    # After a relist every pod is a bound fact: each is booked at its requests.
    feed.relist()
    view = scheduler.cache.view()
    booked = {}
    for name in ("theirs", "p", "q"):
        alloc = view.allocation(f"uid-{name}")
        assert alloc is not None
        booked[name] = (alloc.cpu_milli, alloc.memory_mib)
    assert booked == {"theirs": (1000, 2048), "p": (2000, 4096), "q": (1000, 10240)}
    # The node is full by requests: one more millicore does not fit.
    world.put_pod(pod_json("r", cpu="1m", memory="1Mi"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("r") is None
