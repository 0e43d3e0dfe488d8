"""RDMA interfaces asked through pod annotations: what is read, and what is refused by name."""

from __future__ import annotations

import pytest

from scheduler.core.rdma import RdmaRequest
from scheduler.live.podspec import PodSpecError, pod_request


def pod(annotations: dict[str, str], gpus: str | None = None) -> dict:
    limits = {"nvidia.com/gpu": gpus} if gpus else {}
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "annotations": annotations},
        "spec": {"containers": [{"name": "a", "image": "x", "resources": {"limits": limits}}]},
    }


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, RdmaRequest()),
        ({"kubegpu.io/rdma-interfaces": "2"}, RdmaRequest(2)),
        ({"kubegpu.io/rdma-interfaces": " 2\t"}, RdmaRequest(2)),
        (
            {"kubegpu.io/rdma-interfaces": "2", "kubegpu.io/rdma-bandwidth": "100Gbps"},
            RdmaRequest(2, 100_000),
        ),
        (
            {"kubegpu.io/rdma-interfaces": "1", "kubegpu.io/rdma-bandwidth": "25Gbps-50Gbps"},
            RdmaRequest(1, 25_000, 50_000),
        ),
        ({"kubegpu.io/rdma-interfaces": "0"}, RdmaRequest()),
        ({"kubegpu.io/rdma-interfaces": "0", "kubegpu.io/rdma-bandwidth": "25Gbps"}, RdmaRequest()),
        ({"kubegpu.io/rdma-interfaces": "32"}, RdmaRequest(32)),
    ],
)
def test_rdma_annotations_are_read(annotations: dict[str, str], expected: RdmaRequest) -> None:
    assert pod_request(pod(annotations, gpus="1")).rdma == expected


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"kubegpu.io/rdma-interfaces": "-1"}, "rdma-interfaces=.* is not a whole number in decimal digits"),
        (
            {"kubegpu.io/rdma-interfaces": "\u0662"},
            "rdma-interfaces=.* is not a whole number in decimal digits",
        ),
        ({"kubegpu.io/rdma-interfaces": "two"}, "rdma-interfaces=.* is not a whole number"),
        ({"kubegpu.io/rdma-interfaces": "33"}, "rdma-interfaces=33 is outside 0..32"),
        ({"kubegpu.io/rdma-bandwidth": "25Gbps"}, "rdma-bandwidth needs kubegpu.io/rdma-interfaces"),
        (
            {"kubegpu.io/rdma-interfaces": "1", "kubegpu.io/rdma-bandwidth": "25GB/s"},
            "rdma-bandwidth: '25GB/s' is not a bandwidth .*units Gbps or Mbps",
        ),
        ({"kubegpu.io/rdma-interfaces": "1", "kubegpu.io/rdma-bandwidth": "-25Gbps"}, "is not a bandwidth"),
        (
            {"kubegpu.io/rdma-interfaces": "1", "kubegpu.io/rdma-bandwidth": "\u0662\u0665Gbps"},
            "is not a bandwidth",
        ),
        (
            {"kubegpu.io/rdma-interfaces": "1", "kubegpu.io/rdma-bandwidth": "50Gbps-25Gbps"},
            "the maximum must be above 0 and at least the minimum",
        ),
        ({"kubegpu.io/rdma-interfaces": "0", "kubegpu.io/rdma-bandwidth": "furious"}, "is not a bandwidth"),
    ],
)
def test_bad_rdma_requests_are_refused_by_name(annotations: dict[str, str], message: str) -> None:
    with pytest.raises(PodSpecError, match=message):
        pod_request(pod(annotations))


def resource_pod(annotations: dict[str, str], apps: list[str], inits: list[tuple[str, bool]] = ()) -> dict:
    """A pod whose app containers ask for ``kubegpu.io/rdma`` (each a limit, '' none) and whose init
    containers (count, sidecar) too."""

    def container(name: str, count: str, sidecar: bool = False) -> dict:
        limits = {"kubegpu.io/rdma": count} if count else {}
        return {
            "name": name,
            "image": "x",
            "resources": {"limits": limits},
            **({"restartPolicy": "Always"} if sidecar else {}),
        }

    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "annotations": annotations},
        "spec": {
            "initContainers": [
                container(f"i{k}", count, sidecar) for k, (count, sidecar) in enumerate(inits)
            ],
            "containers": [container(f"a{k}", count) for k, count in enumerate(apps)],
        },
    }


@pytest.mark.parametrize(
    ("annotations", "apps", "inits", "expected"),
    [
        ({}, ["2"], [], RdmaRequest(2)),  # the resource alone asks exactly as the annotation would
        ({}, ["1", "2", ""], [], RdmaRequest(3)),  # summed over the app containers
        ({"kubegpu.io/rdma-bandwidth": "25Gbps"}, ["2"], [], RdmaRequest(2, 25_000)),
        ({"kubegpu.io/rdma-interfaces": "2"}, ["2"], [], RdmaRequest(2)),  # both, agreeing
        ({"kubegpu.io/rdma-interfaces": " 3"}, ["1", "2"], [], RdmaRequest(3)),
        ({}, ["1"], [("4", False)], RdmaRequest(4)),  # a regular init container: the larger
        ({}, ["3"], [("2", False)], RdmaRequest(3)),
        ({}, ["1"], [("1", True), ("2", False)], RdmaRequest(3)),  # a sidecar runs beside what follows
        ({"kubegpu.io/rdma-interfaces": "4"}, ["1"], [("4", False)], RdmaRequest(4)),
        ({}, ["0"], [], RdmaRequest()),  # a zero request asks for none
        ({"kubegpu.io/rdma-interfaces": "2"}, ["0"], [], RdmaRequest(2)),
    ],
)
def test_the_rdma_resource_asks_for_interfaces_by_the_pods_effective_request(
    annotations: dict[str, str], apps: list[str], inits: list[tuple[str, bool]], expected: RdmaRequest
) -> None:
    request = pod_request(resource_pod(annotations, apps, inits))
    assert request.rdma == expected
    if any(count not in ("", "0") for count in apps):  # still counted as the extended resource too
        assert dict(request.resources)["kubegpu.io/rdma"] == expected.count  # (NodeResourcesFit)


@pytest.mark.parametrize(
    ("annotations", "apps", "inits", "message"),
    [
        (
            {"kubegpu.io/rdma-interfaces": "1"},
            ["2"],
            [],
            "annotation kubegpu.io/rdma-interfaces='1' and resource kubegpu.io/rdma=2 .* disagree",
        ),
        (
            {"kubegpu.io/rdma-interfaces": "0"},
            ["1"],
            [],
            "annotation kubegpu.io/rdma-interfaces='0' and resource kubegpu.io/rdma=1 .* disagree",
        ),
        (
            {"kubegpu.io/rdma-interfaces": "2"},
            ["1"],
            [("3", False)],
            "annotation kubegpu.io/rdma-interfaces='2' and resource kubegpu.io/rdma=3 .* disagree",
        ),
        ({}, ["33"], [], "resource kubegpu.io/rdma=33 .* is more than 32 RDMA interfaces"),
        ({"kubegpu.io/rdma-bandwidth": "25GB/s"}, ["1"], [], "rdma-bandwidth: '25GB/s' is not a bandwidth"),
    ],
)
def test_an_rdma_resource_request_the_annotation_contradicts_is_refused_naming_both(
    annotations: dict[str, str], apps: list[str], inits: list[tuple[str, bool]], message: str
) -> None:
    with pytest.raises(PodSpecError, match=message):
        pod_request(resource_pod(annotations, apps, inits))
