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
