"""Edges of ``podspec``: the messages a bad pod's FailedScheduling Event carries, the bounds of the
share annotations and quantities, and the defaults of tolerations and share containers.

Added for the survivors of ``make mutate-live`` (docs/testing.md); each test states what the
module promises a user, not how it is written.
"""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.request import ContainerKind, ContainerRequest, HostPort, Toleration
from scheduler.live.podspec import PodSpecError, parse_topology, pod_request, pod_resources
from scheduler.live.translate import node_facts
from tests.support.schedworld import node_json

GPU = "nvidia.com/gpu"
# The largest quantity Kubernetes keeps: int64 milli-units.
MAX_MILLI = (1 << 63) - 1


def container(
    name: str = "app", requests: dict | None = None, limits: dict | None = None, **extra: Any
) -> dict:
    return {
        "name": name,
        "image": "x",
        "resources": {"requests": requests or {}, "limits": limits or {}},
        **extra,
    }


def pod(
    *containers: dict, annotations: dict | None = None, init: list[dict] | None = None, **spec: Any
) -> dict:
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init:
        body["initContainers"] = init
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": "u"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": body}


def refusal(p: dict) -> str:
    with pytest.raises(PodSpecError) as error:
        pod_request(p)
    return str(error.value)


# --- messages that name what is wrong --------------------------------------------------------------


def test_resources_that_are_not_objects_get_their_message() -> None:
    """Not a Python error text ("'str' object has no attribute 'get'"): the container's own message
    (the GPU count used to be read first, and failed on the shape)."""
    bad_resources = pod({"name": "trainer", "image": "x", "resources": "lots"})
    assert refusal(bad_resources) == "resources of container trainer must be an object"
    bad_limits = pod({"name": "trainer", "image": "x", "resources": {"limits": [GPU]}})
    assert refusal(bad_limits) == "container trainer must be an object of quantities"


def test_messages_name_the_container_and_field_at_fault() -> None:
    negative_limit = pod(container("trainer", limits={"memory": "-1Gi"}))
    assert refusal(negative_limit) == "memory of container trainer must not be negative, got -1Gi"
    fractional = pod(container("trainer", limits={GPU: "1.5"}))
    assert refusal(fractional) == f"{GPU} of container trainer must be a whole number, got 1.5"
    unreadable = pod(container("trainer", limits={GPU: "lots"}))
    assert refusal(unreadable) == f"invalid quantity 'lots' for {GPU} of container trainer"
    assert refusal(pod()) == "pod has no containers"


def test_messages_name_the_pod_level_field_at_fault() -> None:
    assert refusal(pod(container(), resources="big")) == "spec.resources must be an object"
    requests = pod(container(), resources={"requests": {"cpu": "x"}})
    assert refusal(requests) == "invalid quantity 'x' for cpu of spec.resources.requests"
    limits = pod(container(), resources={"limits": {"memory": "-1"}})
    assert refusal(limits) == "memory of spec.resources.limits must not be negative, got -1"
    assert refusal(pod(container(), overhead=["cpu"])) == "spec.overhead must be an object of quantities"
    overhead = pod(container(), overhead={"cpu": "?"})
    assert refusal(overhead) == "invalid quantity '?' for cpu of spec.overhead"


def test_messages_about_ports_name_the_container() -> None:
    assert refusal(pod(container("web", ports=["80"]))) == "a port of container web must be an object"
    text = refusal(pod(container("web", ports=[{"containerPort": 80, "hostPort": 80, "protocol": 6}])))
    assert text == "protocol and hostIP of container web's ports must be strings"
    text = refusal(pod(container("web", ports=[{"containerPort": 80, "hostPort": 80, "hostIP": 10}])))
    assert text == "protocol and hostIP of container web's ports must be strings"


def test_messages_about_tolerations_and_topology() -> None:
    assert refusal(pod(container(), tolerations={"key": "gpu"})) == "spec.tolerations must be a list"
    with pytest.raises(PodSpecError) as error:
        parse_topology("nvlink=always")
    assert str(error.value) == (
        "annotation kubegpu.io/topology: 'nvlink=always' is not one of"
        " nvlink, numa, pcie-switch =require|prefer"
    )


def test_share_container_messages_say_how_to_fix_them() -> None:
    share = {"kubegpu.io/gpu-milli": "500"}
    empty = pod(container("a"), annotations={**share, "kubegpu.io/gpu-containers": "a,,b"})
    assert refusal(empty) == (
        "annotation kubegpu.io/gpu-containers='a,,b' names an empty container"
        " (give container names separated by single commas)"
    )
    unknown = pod(
        container("a"), init=[container("setup")], annotations={**share, "kubegpu.io/gpu-containers": "setup"}
    )
    assert refusal(unknown) == (
        "annotation kubegpu.io/gpu-containers names unknown containers ['setup']"
        " (a share goes to app containers only)"
    )


def test_a_sum_beyond_int64_names_the_resource() -> None:
    half = f"{MAX_MILLI // 2 + 1}m"
    text = refusal(pod(container("a", {"cpu": half}), container("b", {"cpu": half})))
    assert text.startswith("the pod's cpu request (") and text.endswith(") is beyond what Kubernetes keeps")


# --- bounds ---------------------------------------------------------------------------------------


def test_the_largest_quantity_kubernetes_keeps_is_accepted() -> None:
    request = pod_request(pod(container(requests={"cpu": f"{MAX_MILLI}m"})))
    assert request.cpu_milli == MAX_MILLI
    assert "within int64" in refusal(pod(container(requests={"cpu": f"{MAX_MILLI + 1}m"})))


def test_sub_milli_cpu_and_fractional_bytes_round_up() -> None:
    """Kubernetes' MilliValue and Value round up: 500 micro-CPUs are 1 milli-CPU, half a byte is one."""
    asked = pod_resources(
        pod(container(requests={"cpu": "500u", "memory": "0.5", "ephemeral-storage": "1.5"})), GPU
    )
    assert asked.cpu_milli == 1
    assert dict(asked.resources) == {"memory": 1, "ephemeral-storage": 2}
    node = node_json("n1", cpu="2500u")  # 2.5 milli-CPUs: up, not to the even 2
    assert node_facts(node).cpu_milli == 3


@pytest.mark.parametrize(
    ("annotation", "low", "high"),
    [("kubegpu.io/gpu-milli", 1, 999), ("kubegpu.io/gpu-memory-mib", 1, 1 << 24)],
)
def test_share_annotations_accept_their_whole_range_and_nothing_beyond(
    annotation: str, low: int, high: int
) -> None:
    for value in (low, high):
        request = pod_request(pod(container(), annotations={annotation: str(value)}))
        assert request.is_share and request.gpu_count == 1
    for value in ("0", str(high + 1), "9" * 19, "9" * 5000):
        text = refusal(pod(container(), annotations={annotation: value}))
        assert text == f"annotation {annotation}={value} is outside {low}..{high}"


def test_leading_zeros_do_not_make_a_share_annotation_too_long() -> None:
    request = pod_request(pod(container(), annotations={"kubegpu.io/gpu-milli": "0" * 30 + "250"}))
    assert request.gpu_milli == 250


def test_non_string_annotation_values_are_refused_not_crashed_on() -> None:
    """The API serves annotation values as strings; a hand-made object gets a message, not a crash."""
    with pytest.raises(PodSpecError, match="not a whole number"):
        pod_request(pod(container(), annotations={"kubegpu.io/gpu-milli": 500}))
    with pytest.raises(PodSpecError):
        pod_request(
            pod(container(), annotations={"kubegpu.io/gpu-milli": "500", "kubegpu.io/gpu-containers": 1})
        )


@pytest.mark.parametrize(("port", "ok"), [(65535, True), (65536, False), (0, True)])
def test_host_ports_up_to_65535(port: int, ok: bool) -> None:
    p = pod(container("web", ports=[{"containerPort": 8080, "hostPort": port}]))
    if ok:
        expected = (HostPort.of(port),) if port else ()
        assert pod_request(p).host_ports == expected
    else:
        assert refusal(p) == f"hostPort of container web is not a port number: {port}"


# --- what a pod asks for --------------------------------------------------------------------------


def test_a_sidecar_after_a_regular_init_container_binds_its_host_port() -> None:
    p = pod(
        container("app"),
        init=[
            container("setup", ports=[{"containerPort": 1, "hostPort": 7001}]),
            container("proxy", ports=[{"containerPort": 2, "hostPort": 7002}], restartPolicy="Always"),
        ],
    )
    assert pod_request(p).host_ports == (HostPort.of(7002),)


def test_a_gpu_count_given_only_as_a_request_is_read() -> None:
    """``requests`` alone (no limit) still names the container's whole GPUs."""
    request = pod_request(pod(container(requests={GPU: "2"})))
    assert request.gpu_count == 2 and request.containers == (ContainerRequest("app", 2, ContainerKind.APP),)


def test_a_share_goes_to_the_first_app_container_only_by_default() -> None:
    request = pod_request(
        pod(
            container("a"),
            container("b"),
            init=[container("setup")],
            annotations={"kubegpu.io/gpu-milli": "300"},
        )
    )
    assert request.containers == (
        ContainerRequest("setup", 0, ContainerKind.INIT),
        ContainerRequest("a", 1, ContainerKind.APP),
        ContainerRequest("b", 0, ContainerKind.APP),
    )


def test_a_pod_level_memory_limit_does_not_replace_the_containers_memory_request() -> None:
    """The apiserver defaults a pod-level request of CPU or memory from the containers' aggregate
    first, and from the pod-level limit only when the containers ask for none."""
    with_containers = pod(container(requests={"memory": "1Gi"}), resources={"limits": {"memory": "4Gi"}})
    assert dict(pod_resources(with_containers, GPU).resources)["memory"] == 1 << 30
    without = pod(container(), resources={"limits": {"memory": "4Gi"}})
    assert dict(pod_resources(without, GPU).resources)["memory"] == 4 << 30


def test_pod_level_cpu_with_container_hugepages() -> None:
    asked = pod_resources(
        pod(
            container(limits={"hugepages-2Mi": "4Mi", "memory": "1Gi"}), resources={"requests": {"cpu": "3"}}
        ),
        GPU,
    )
    assert asked.cpu_milli == 3000
    assert dict(asked.resources) == {"hugepages-2Mi": 4 << 20, "memory": 1 << 30}


# --- tolerations ----------------------------------------------------------------------------------


def test_toleration_defaults_and_operators() -> None:
    """No operator means Equal; an Exists toleration without a key tolerates every taint."""
    request = pod_request(
        pod(
            container(),
            tolerations=[
                {"key": "pool", "value": "gpu"},
                {"key": "pool", "operator": "Equal", "value": "a", "effect": "NoSchedule"},
                {"operator": "Exists"},
            ],
        )
    )
    assert request.tolerations == (
        Toleration("pool", "Equal", "gpu", ""),
        Toleration("pool", "Equal", "a", "NoSchedule"),
        Toleration("", "Exists", "", ""),
    )
    assert request.placement.tolerations == request.tolerations  # spread's nodeTaintsPolicy: Honor reads them
