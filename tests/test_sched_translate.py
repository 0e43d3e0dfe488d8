"""API objects to the scheduling core and back (scheduler/live/translate.py), one rule at a time.

What a Node's taints, allocatable and heartbeat become, what an unreadable Node, inventory or
pod becomes (the reason, exactly), how a bound pod's signed allocation becomes its booking
(devices several containers share, init containers, the GPU shape), and how a core allocation's
share is split between its containers in the annotation.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from kubegpu import allocation as contract
from scheduler.core.request import MILLI, Taint, TaintEffect
from scheduler.core.state import Allocation, GpuGrant
from scheduler.live import nodecheck
from scheduler.live.translate import (
    NodeFacts,
    PodUsage,
    allocation_contract,
    fact_allocation,
    node_facts,
    node_state,
    parse_inventory,
    parse_time,
    pod_usage,
)
from tests.support.schedworld import inventory_json, node_json, pod_json

NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
USAGE = PodUsage(500, 256, 2)


# --------------------------------------------------------------------------- nodes


def test_taints_are_read_with_their_key_value_and_effect_and_unknown_effects_skipped() -> None:
    node = node_json("n1", 2)
    node["spec"]["taints"] = [
        {"key": "gpu", "value": "a100", "effect": "NoSchedule"},
        {"key": "maintenance", "effect": "NoExecute"},  # no value
        {"key": "soft", "value": None, "effect": "PreferNoSchedule"},
        {"key": "odd", "value": "x", "effect": "Sometimes"},  # not an effect: skipped
        {"effect": "NoSchedule"},  # no key
    ]
    facts = node_facts(node)
    assert facts.taints == (
        Taint("gpu", "a100", TaintEffect.NO_SCHEDULE),
        Taint("maintenance", "", TaintEffect.NO_EXECUTE),
        Taint("soft", "", TaintEffect.PREFER_NO_SCHEDULE),
        Taint("", "", TaintEffect.NO_SCHEDULE),
    )
    assert node_state(facts).taints == facts.taints
    assert node_facts(node_json("n2", 2)).taints == ()


@pytest.mark.parametrize(
    ("node", "name", "problem"),
    [
        ("junk", "", "node object unreadable: AttributeError: 'str' object has no attribute 'get'"),
        ({"metadata": "junk"}, "", "node has no kubegpu device inventory"),  # as no metadata
        (
            {"metadata": {"name": "n1"}, "spec": "junk"},
            "n1",
            "node object unreadable: AttributeError: 'str' object has no attribute 'get'",
        ),
    ],
)
def test_a_node_object_of_the_wrong_shape_is_a_problem_never_an_error(
    node: Any, name: str, problem: str
) -> None:
    assert node_facts(node) == NodeFacts(
        name=name,
        cpu_milli=0,
        memory_mib=0,
        labels={},
        taints=(),
        inventory=None,
        heartbeat=None,
        cordoned=False,
        problem=problem,
        # a node object read this far has its allocatable read: every absent figure is 0
        **(
            {"allocatable": {"memory": 0}, "max_pods": 0, "gpu_resource": 0}
            if name == "" and problem.startswith("node has no")
            else {}
        ),
    )


def test_a_nameless_node_has_an_empty_name() -> None:
    node = node_json("n1", 1)
    del node["metadata"]["name"]
    assert node_facts(node).name == ""


def test_allocatable_figures_absent_unreadable_and_negative() -> None:
    node = node_json("n1", 1, pods=None)
    del node["status"]["allocatable"]["cpu"]
    del node["status"]["allocatable"]["memory"]
    facts = node_facts(node)
    assert (facts.cpu_milli, facts.memory_mib, facts.max_pods) == (0, 0, 0)  # absent: 0, as kube-scheduler
    negative = node_facts(node_json("n1", 1, pods="-3", gpu_count="0"))
    assert (negative.max_pods, negative.gpu_resource) == (0, 0)
    long_value = "x" * 50
    for key, value, what in (
        ("cpu", "abc", "cpu"),
        ("memory", long_value, "memory"),
        ("pods", "1.5.2", "pods"),
    ):
        node = node_json("n1", 1)
        node["status"]["allocatable"][key] = value
        facts = node_facts(node)
        assert (facts.cpu_milli, facts.memory_mib, facts.max_pods, facts.gpu_resource) == (0, 0, None, None)
        assert facts.problem == f"node's allocatable {what} is unreadable ({value[:40]!r})"


def test_a_heartbeat_is_stale_only_beyond_the_limit_and_a_missing_one_is_stale() -> None:
    node = node_json("n1", 1)
    node["metadata"]["annotations"]["kubegpu.io/heartbeat"] = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    facts = node_facts(node)
    assert facts.heartbeat == NOW
    assert facts.schedulable(NOW + dt.timedelta(seconds=120), 120) == ""
    assert facts.schedulable(NOW + dt.timedelta(seconds=121), 120) == "node's device heartbeat is stale"
    del node["metadata"]["annotations"]["kubegpu.io/heartbeat"]
    assert node_facts(node).schedulable(NOW, 120) == "node's device heartbeat is stale"


def test_parse_time_takes_only_the_api_form() -> None:
    assert parse_time("2026-11-26T12:00:00Z") == NOW
    for value in (None, "", "yesterday", 5, ["2026-11-26T12:00:00Z"]):
        assert parse_time(value) is None  # type: ignore[arg-type]


def valid_inventory() -> dict[str, Any]:
    return json.loads(inventory_json([("GPU-a", True), ("GPU-b", True)]))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (5, "annotation is not a string: int"),
        ("[1, 2]", "not a JSON object: list"),
        (json.dumps({**valid_inventory(), "version": 2}), "unsupported inventory version 2"),
        (json.dumps({**valid_inventory(), "devices": "x"}), "devices must be a list and topology an object"),
        (json.dumps({**valid_inventory(), "topology": []}), "devices must be a list and topology an object"),
    ],
)
def test_an_unreadable_inventory_is_named_exactly(raw: Any, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_inventory(raw)
    assert str(caught.value) == message


def test_two_gpus_sharing_an_id_or_an_index_are_refused() -> None:
    doc = valid_inventory()
    doc["devices"][1]["id"] = doc["devices"][0]["id"]
    with pytest.raises(ValueError, match="^two devices share the id GPU-a$"):  # nodecheck's words
        parse_inventory(json.dumps(doc))
    doc = valid_inventory()
    doc["devices"][1]["index"] = doc["devices"][0]["index"]
    doc["topology"] = {}
    with pytest.raises(ValueError, match="^two GPUs share an index$"):
        parse_inventory(json.dumps(doc))


def test_the_inventory_size_limit_is_inclusive() -> None:
    at_limit = " " * nodecheck.MAX_INVENTORY_BYTES  # as long as allowed: then read as JSON
    with pytest.raises(ValueError, match="^not JSON"):
        parse_inventory(at_limit)
    with pytest.raises(ValueError) as caught:
        parse_inventory(at_limit + " ")
    limit = nodecheck.MAX_INVENTORY_BYTES
    assert str(caught.value) == f"{limit + 1} characters (at most {limit})"


# --------------------------------------------------------------------------- bound pods


def test_pod_usage_counts_the_default_gpu_resource_and_names_unreadable_resources() -> None:
    assert pod_usage(pod_json("p", 2, cpu="250m", memory="1Gi")) == PodUsage(
        250, 1024, 2, resources=(("memory", 1 << 30),)
    )
    bad = pod_json("p", cpu="lots")
    message = "resources unreadable: invalid quantity 'lots' for cpu of container app"
    assert pod_usage(bad) == PodUsage(0, 0, 0, message)


def signed(containers: dict[str, contract.ContainerAllocation]) -> contract.Allocation:
    return contract.Allocation("n1", "u", containers)


def test_a_bound_pod_holds_the_devices_its_allocation_names() -> None:
    whole = contract.ContainerAllocation(("GPU-a", "GPU-b"))
    setup = contract.ContainerAllocation(("GPU-a",), init=True)
    alloc = fact_allocation("n1", "u", "ns/p", USAGE, signed({"setup": setup, "app": whole}))
    assert alloc == Allocation(
        node="n1",
        pod_uid="u",
        pod_name="ns/p",
        cpu_milli=500,
        memory_mib=256,
        gpus=(GpuGrant(-1, "GPU-a", MILLI, 0), GpuGrant(-1, "GPU-b", MILLI, 0)),
        containers={"setup": ("GPU-a",), "app": ("GPU-a", "GPU-b")},
        gpu_tag="2-gpu",
        gpu_resource=2,
        init_containers=frozenset({"setup"}),
    )


def test_shares_of_one_device_in_several_containers_add_up_to_at_most_a_gpu() -> None:
    def grants(*entries: tuple[str, int | None, int]) -> tuple[GpuGrant, ...]:
        containers = {
            f"c{i}": contract.ContainerAllocation(
                ("GPU-a",), {} if milli is None else {"GPU-a": contract.Share(milli, memory)}
            )
            for i, (_, milli, memory) in enumerate(entries)
        }
        return fact_allocation("n1", "u", "ns/p", USAGE, signed(containers)).gpus

    assert grants(("a", 300, 1024), ("b", 200, 2048)) == (GpuGrant(-1, "GPU-a", 500, 3072),)
    assert grants(("a", 600, 1024), ("b", 600, 1024)) == (GpuGrant(-1, "GPU-a", MILLI, 2048),)
    assert grants(("a", None, 0), ("b", 300, 1024)) == (GpuGrant(-1, "GPU-a", MILLI, 0),)  # whole first
    assert grants(("a", 300, 1024), ("b", None, 0)) == (GpuGrant(-1, "GPU-a", MILLI, 0),)  # whole later
    assert grants(
        ("a", 250, 512),
    ) == (GpuGrant(-1, "GPU-a", 250, 512),)


def test_the_gpu_shape_of_a_bound_pod() -> None:
    share = contract.ContainerAllocation(("GPU-a",), {"GPU-a": contract.Share(400)})
    assert fact_allocation("n1", "u", "ns/p", USAGE, signed({"app": share})).gpu_tag == "share-gpu"
    whole = contract.ContainerAllocation(("GPU-a",))
    assert fact_allocation("n1", "u", "ns/p", USAGE, signed({"app": whole})).gpu_tag == "1-gpu"
    none = fact_allocation("n1", "u", "ns/p", USAGE, None)
    assert (none.gpu_tag, none.gpus, dict(none.containers), none.init_containers) == (
        "no-gpu",
        (),
        {},
        frozenset(),
    )


# --------------------------------------------------------------------------- to the annotation


def core_share(milli: int, memory: int, containers: dict[str, tuple[str, ...]]) -> Allocation:
    return Allocation(
        node="n1",
        pod_uid="u",
        pod_name="ns/p",
        gpus=(GpuGrant(0, "GPU-a", milli, memory),),
        containers=containers,
    )


def test_a_share_is_split_between_its_containers_the_first_taking_the_remainder() -> None:
    both = {"a": ("GPU-a",), "b": ("GPU-a",)}
    document = allocation_contract(core_share(501, 1001, both))
    assert document.containers["a"].shares == {"GPU-a": contract.Share(251, 501)}
    assert document.containers["b"].shares == {"GPU-a": contract.Share(250, 500)}
    three = {"a": ("GPU-a",), "b": ("GPU-a",), "c": ("GPU-a",)}
    document = allocation_contract(core_share(1, 0, three))
    assert [document.containers[n].shares["GPU-a"] for n in "abc"] == [contract.Share(1, 0)] * 3  # at least 1
    one = allocation_contract(core_share(300, 2048, {"a": ("GPU-a",)}))
    assert one.containers["a"].shares == {"GPU-a": contract.Share(300, 2048)}


def test_an_allocation_without_containers_cannot_be_written() -> None:
    with pytest.raises(ValueError) as caught:
        allocation_contract(core_share(300, 0, {}))
    assert str(caught.value) == "allocation of pod ns/p names no containers"
