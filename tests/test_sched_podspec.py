"""Pod objects to scheduling requests, and the messages bad requests get."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from scheduler.core.request import Wish
from scheduler.live.podspec import PodSpecError, parse_topology, pod_request


def pod(
    containers: list[k8s.V1Container],
    annotations: dict[str, str] | None = None,
    init: list[k8s.V1Container] | None = None,
    **spec: object,
) -> dict:
    """The pod as the API serves it (JSON), built from typed models for readability."""
    model = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="p", namespace="ns", uid="u-1", annotations=annotations),
        spec=k8s.V1PodSpec(containers=containers, init_containers=init, **spec),
    )
    return k8s.ApiClient().sanitize_for_serialization(model)


def container(
    name: str,
    cpu: str | None = None,
    memory: str | None = None,
    gpus: str | None = None,
) -> k8s.V1Container:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    limits = {"nvidia.com/gpu": gpus} if gpus else None
    return k8s.V1Container(
        name=name, image="x", resources=k8s.V1ResourceRequirements(requests=requests, limits=limits)
    )


def test_whole_gpus_cpu_memory_and_init_rule() -> None:
    request = pod_request(
        pod(
            [container("a", "500m", "1Gi", "2"), container("b", "1", "512Mi", "1")],
            init=[container("setup", "4", "100Mi")],
            node_selector={"pool": "gpu"},
            tolerations=[k8s.V1Toleration(key="gpu", operator="Exists", effect="NoSchedule")],
        )
    )
    assert (request.name, request.uid) == ("ns/p", "u-1")
    assert request.cpu_milli == 4000  # the init container's 4 CPUs beat the 1.5 of the sum
    assert request.memory_mib == 1536
    assert request.gpu_count == 3 and request.whole_gpus == 3 and not request.is_share
    assert [(c.name, c.gpu_count, c.kind) for c in request.containers] == [
        ("setup", 0, "init"),
        ("a", 2, "app"),
        ("b", 1, "app"),
    ]
    assert dict(request.node_selector) == {"pool": "gpu"}
    assert request.tolerations[0].operator == "Exists"


def test_share_by_milli_and_memory() -> None:
    request = pod_request(
        pod(
            [container("a"), container("b")],
            {
                "kubegpu.io/gpu-milli": "250",
                "kubegpu.io/gpu-memory-mib": "4096",
                "kubegpu.io/gpu-containers": "b",
                "kubegpu.io/gpu-model": "NVIDIA L4 | Tesla T4",
            },
        )
    )
    assert request.is_share and request.gpu_count == 1 and request.gpu_milli == 250
    assert request.gpu_memory_mib == 4096
    assert [(c.name, c.gpu_count) for c in request.containers] == [("a", 0), ("b", 1)]
    assert request.gpu_models == frozenset({"NVIDIA L4", "Tesla T4"})


def test_topology_annotation() -> None:
    wish = parse_topology("nvlink=require, numa=prefer")
    assert (wish.nvlink, wish.same_numa, wish.same_pcie_switch) == (Wish.REQUIRE, Wish.PREFER, Wish.NONE)


NOT_QUANTITIES = ["Infinity", "-Infinity", "inf", "NaN", "sNaN", "1e30", "9300000000000000k"]


@pytest.mark.parametrize("value", NOT_QUANTITIES)
@pytest.mark.parametrize("where", ["cpu", "memory", "gpus", "overhead"])
def test_quantities_no_node_could_hold_are_refused_by_name(value: str, where: str) -> None:
    """Non-finite or beyond int64 milli-units: a PodSpecError (a FailedScheduling Event), never an
    OverflowError or decimal signal that would stop the scheduler's planning for every pod."""
    if where == "gpus":
        spec = pod([container("a", gpus=value)])
    elif where == "overhead":
        spec = pod([container("a")], overhead={"cpu": value})
    else:
        spec = pod([container("a", **{where: value})])
    with pytest.raises(PodSpecError, match="invalid quantity"):
        pod_request(spec)


def test_the_largest_quantity_kubernetes_keeps_is_accepted() -> None:
    request = pod_request(pod([container("a", cpu="9223372036854775")]))
    assert request.cpu_milli == 9_223_372_036_854_775_000


@pytest.mark.parametrize(
    ("annotations", "gpus", "message"),
    [
        ({"kubegpu.io/gpu-milli": "1500"}, None, "outside 1..999"),
        ({"kubegpu.io/gpu-milli": "lots"}, None, "not a whole number in decimal digits"),
        ({"kubegpu.io/gpu-milli": "500"}, "1", "not both"),
        ({"kubegpu.io/gpu-milli": "500", "kubegpu.io/gpu-containers": "ghost"}, None, "unknown containers"),
        ({"kubegpu.io/topology": "nvlink=always"}, "2", "is not one of"),
        ({}, "1.5", "whole number"),
        ({}, "-1", "whole number"),
        ({}, "many", "invalid quantity"),
    ],
)
def test_bad_requests_get_clear_messages(annotations: dict[str, str], gpus: str | None, message: str) -> None:
    with pytest.raises(PodSpecError, match=message):
        pod_request(pod([container("a", gpus=gpus)], annotations))


@pytest.mark.parametrize(
    "value",
    ["1_00", "+100", "-100", "\u0661\u0660\u0660", "\uff11\uff10\uff10", "100.0", "1e2", "0x64", "", " ",
     "1 00", "\u00a0100", "100\u2003"],
)
@pytest.mark.parametrize("key", ["kubegpu.io/gpu-milli", "kubegpu.io/gpu-memory-mib"])
def test_share_figures_are_plain_decimal_digits(key: str, value: str) -> None:
    """int() would read "1_00" as 100 and Unicode digits as numbers: a share is ASCII digits, with
    at most spaces or tabs around them; anything else is named."""
    with pytest.raises(PodSpecError, match=f"annotation {key}=.* is not a whole number in decimal digits"):
        pod_request(pod([container("a")], {key: value}))


@pytest.mark.parametrize(("value", "milli"), [("100", 100), (" 250\t", 250), ("0999", 999)])
def test_share_figures_in_decimal_digits_are_read(value: str, milli: int) -> None:
    assert pod_request(pod([container("a")], {"kubegpu.io/gpu-milli": value})).gpu_milli == milli


@pytest.mark.parametrize("value", ["", ",", "a,,b", "a,", ",b", " , ", "a, ,b"])
def test_a_container_list_with_an_empty_name_is_refused(value: str) -> None:
    """``","`` used to mean the default (the first container) and ``"a,,b"`` to be read as a,b."""
    annotations = {"kubegpu.io/gpu-milli": "100", "kubegpu.io/gpu-containers": value}
    with pytest.raises(PodSpecError, match="kubegpu.io/gpu-containers=.* names an empty container"):
        pod_request(pod([container("a"), container("b")], annotations))


def test_container_names_may_have_spaces_around_them() -> None:
    annotations = {"kubegpu.io/gpu-milli": "100", "kubegpu.io/gpu-containers": "a, b"}
    request = pod_request(pod([container("a"), container("b")], annotations))
    assert [(c.name, c.gpu_count) for c in request.containers] == [("a", 1), ("b", 1)]


def test_share_goes_only_to_the_named_containers() -> None:
    from scheduler.core.allocate import split_containers
    from scheduler.core.state import GpuGrant

    request = pod_request(
        pod(
            [container("a"), container("b")],
            {"kubegpu.io/gpu-milli": "400", "kubegpu.io/gpu-containers": "b"},
        )
    )
    assert split_containers(request, (GpuGrant(0, "GPU-x", 400, 0),)) == {"b": ("GPU-x",)}


def test_binpack_and_spread_choose_opposite_nodes() -> None:
    import random

    from scheduler.core.policies import make_policy
    from scheduler.core.request import PodRequest
    from scheduler.core.schedule import Placement, schedule_one
    from scheduler.core.state import ClusterState, GpuState, NodeState

    def node(name: str, free: int) -> NodeState:
        state = NodeState(name, 16000, 65536, [GpuState(i, f"{name}-{i}") for i in range(4)])
        for gpu in state.gpus[free:]:
            gpu.free_milli = 0
        return state

    pod = PodRequest("p", cpu_milli=1000, memory_mib=1024, gpu_count=1)
    chosen = {}
    for name in ("binpack", "spread"):
        cluster = ClusterState([node("busy", 1), node("idle", 4)])
        policy = make_policy(name)
        policy.bind(cluster, [pod])
        result = schedule_one(pod, cluster, policy, random.Random(0))
        assert isinstance(result, Placement)
        chosen[name] = result.node
    assert chosen == {"binpack": "busy", "spread": "idle"}


def sidecar(name: str, cpu: str | None = None, memory: str | None = None, gpus: str | None = None):
    c = container(name, cpu, memory, gpus)
    c.restart_policy = "Always"
    return c


def test_sidecars_add_to_the_app_containers() -> None:
    """Restartable init containers run beside the app: their requests add up (Kubernetes' rule)."""
    request = pod_request(pod([container("app", "1", "1Gi")], init=[sidecar("proxy", "2", "512Mi")]))
    assert (request.cpu_milli, request.memory_mib) == (3000, 1536)


def test_a_regular_init_container_counts_with_the_sidecars_declared_before_it() -> None:
    app = [container("app", "1", "1Gi")]
    before = pod_request(pod(app, init=[sidecar("proxy", "2", "64Mi"), container("setup", "4", "64Mi")]))
    assert before.cpu_milli == 6000  # setup's 4 with proxy's 2 beside it beat app 1 + proxy 2
    after = pod_request(pod(app, init=[container("setup", "4", "64Mi"), sidecar("proxy", "2", "64Mi")]))
    assert after.cpu_milli == 4000  # proxy starts after setup ended
    assert after.memory_mib == 1024 + 64


def test_overhead_is_added() -> None:
    request = pod_request(pod([container("app", "1", "1Gi")], overhead={"cpu": "250m", "memory": "64Mi"}))
    assert (request.cpu_milli, request.memory_mib) == (1250, 1088)


def test_gpus_of_init_containers_follow_the_same_rule() -> None:
    from scheduler.core.allocate import split_containers
    from scheduler.core.state import GpuGrant

    # A regular init container asking for more GPUs than the app: the pod needs the larger.
    request = pod_request(pod([container("app", gpus="2")], init=[container("warmup", gpus="4")]))
    assert request.gpu_count == 4 and request.whole_gpus == 4
    grants = tuple(GpuGrant(i, f"g{i}") for i in range(4))
    assert split_containers(request, grants) == {"warmup": ("g0", "g1", "g2", "g3"), "app": ("g0", "g1")}
    # A sidecar's GPU adds to the app's, and an init container after it must not get its GPU.
    request = pod_request(
        pod(
            [container("app", gpus="2")],
            init=[sidecar("monitor", gpus="1"), container("check", gpus="2")],
        )
    )
    assert request.gpu_count == 3
    grants = tuple(GpuGrant(i, f"g{i}") for i in range(3))
    assert split_containers(request, grants) == {
        "monitor": ("g0",),
        "check": ("g1", "g2"),
        "app": ("g1", "g2"),
    }
    # Whole GPUs in an init container of a sharing pod: not both.
    with pytest.raises(PodSpecError, match="not both"):
        pod_request(pod([container("a")], {"kubegpu.io/gpu-milli": "500"}, init=[container("i", gpus="1")]))


@pytest.mark.parametrize(
    ("toleration", "message"),
    [
        ({"key": "a", "operator": {"": None}}, "operator"),
        ({"key": "a", "operator": "Sometimes"}, "operator"),
        ({"key": ["a"], "operator": "Exists"}, "key"),
        ({"key": "a", "value": 3}, "value"),
        ({"key": "a", "effect": ["NoSchedule"]}, "effect"),
        ("gpu", "must be an object"),
    ],
)
def test_a_malformed_toleration_gets_a_clear_message(toleration: object, message: str) -> None:
    body = pod([container("a", gpus="1")])
    body["spec"]["tolerations"] = [toleration]
    with pytest.raises(PodSpecError, match=rf"spec\.tolerations\[0\].*{message}"):
        pod_request(body)
