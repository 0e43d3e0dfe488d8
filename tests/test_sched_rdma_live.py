"""The live scheduler with RDMA interfaces, against the in-memory apiserver (tests/support/schedworld):
a pod lands where its VFs can sit beside its GPUs, the signed allocation carries them (version 2),
bound pods' VFs are booked from it, and bad or impossible requests get their Events."""

from __future__ import annotations

import json
from dataclasses import replace

from crishim.advertiser import publication
from devices.model import NodeInventory
from kubegpu.allocation import ANNOTATION, verify
from tests.support.rdmainv import Pf, rdma_inventory
from tests.support.schedworld import KEYS, Feed, World, drive, make_scheduler, node_json, pod_json

RDMA = {"kubegpu.io/rdma-interfaces": "2", "kubegpu.io/rdma-bandwidth": "100Gbps"}


def world_with_nics() -> World:
    world = World()
    # bandwidth short: one 100G PF, VFs beside every GPU
    thin = rdma_inventory("thin", [0, 0, 1, 1], [Pf("mlx5_0", 100, 0, (0, 1, 2, 3), vfs=4)])
    # VFs short: a 400G PF with a single VF
    few = rdma_inventory("few", [0, 0, 1, 1], [Pf("mlx5_0", 400, 0, (0, 1), vfs=1)])
    # one 200G PF per pair of GPUs; the PF beside GPUs 0, 1 is on the other NUMA node's switch order
    good = rdma_inventory(
        "good", [0, 0, 1, 1], [Pf("mlx5_0", 200, 1, (2, 3), vfs=2), Pf("mlx5_1", 200, 0, (0, 1), vfs=2)]
    )
    for name, inv in (("thin", thin), ("few", few), ("good", good)):
        world.put_node(node_json(name, 4, inventory=publication(inv).inventory))
    return world


def test_a_pod_asking_two_100g_interfaces_lands_beside_its_gpus() -> None:
    world = world_with_nics()
    sched, jobs, core, clock = make_scheduler(world)
    feed = Feed(world, sched)
    feed.relist()
    world.put_pod(pod_json("train", 2, annotations=RDMA))
    drive(sched, jobs, feed, clock)
    assert world.node_of("train") == "good"
    pod = world.find("ns", "train")
    assert pod is not None
    raw = pod["metadata"]["annotations"][ANNOTATION]
    assert json.loads(raw)["version"] == 2
    signed = verify(raw, KEYS)
    gpus = set(signed.containers["app"].devices)
    near = {"mlx5_0": {"GPU-good-2", "GPU-good-3"}, "mlx5_1": {"GPU-good-0", "GPU-good-1"}}
    assert len(signed.rdma) == 2 and len({r.device for r in signed.rdma}) == 2
    for interface in signed.rdma:
        assert interface.min_mbps == 100_000
        assert gpus <= near[interface.pf], f"{interface} is not beside {gpus}"
    # a scheduler starting afresh (a restart, a new leader) books the bound pod's VFs from its annotation
    fresh, _, _, _ = make_scheduler(world)
    Feed(world, fresh).relist()
    good = fresh.cache.view().node("good")
    held = {vf for pf in good.nics.pfs.values() for vf in pf.held}
    assert held == {r.device for r in signed.rdma}
    assert sum(pf.reserved_mbps for pf in good.nics.pfs.values()) == 200_000


def test_a_pod_no_node_can_serve_gets_the_reasons_by_count() -> None:
    world = world_with_nics()
    sched, jobs, core, clock = make_scheduler(world)
    feed = Feed(world, sched)
    feed.relist()
    three = {
        "kubegpu.io/rdma-interfaces": "3",
        "kubegpu.io/rdma-bandwidth": "150Gbps",
    }  # 2 PFs of 200G at most
    world.put_pod(pod_json("big", 1, annotations=three))
    world.put_pod(pod_json("first", 2, annotations=RDMA))
    drive(sched, jobs, feed, clock)
    assert world.node_of("first") == "good"
    assert world.node_of("big") is None
    messages = core.failed_events("big")
    assert messages, "no FailedScheduling Event"
    assert messages[-1] == (
        "0/3 nodes are available: 2 node(s) had insufficient RDMA bandwidth, "
        "1 node(s) had too few free RDMA virtual functions."
    )


def test_a_malformed_bandwidth_is_an_invalid_request_event() -> None:
    world = world_with_nics()
    sched, jobs, core, clock = make_scheduler(world)
    feed = Feed(world, sched)
    feed.relist()
    world.put_pod(pod_json("typo", 1, annotations={**RDMA, "kubegpu.io/rdma-bandwidth": "100GB/s"}))
    drive(sched, jobs, feed, clock)
    assert world.node_of("typo") is None
    assert any(
        m.startswith(
            "invalid kubegpu request: annotation kubegpu.io/rdma-bandwidth: '100GB/s' is not a bandwidth"
        )
        for m in core.failed_events("typo")
    ), core.failed_events("typo")


def test_more_interfaces_than_any_node_has_waits_with_the_reason_and_preempts_nothing() -> None:
    """Eight interfaces, where the roomiest node has four VFs: the pod waits with every node's RDMA
    reason, and, important as it is, evicts no one (evicting every pod would free too few VFs; the
    GPU holders on those nodes would go in vain). 33 interfaces is beyond any pod's: invalid."""
    world = world_with_nics()
    sched, jobs, core, clock = make_scheduler(world)
    feed = Feed(world, sched)
    feed.relist()
    world.put_pod(pod_json("many", 0, annotations={"kubegpu.io/rdma-interfaces": "8"}))
    world.put_pod(pod_json("absurd", 0, annotations={"kubegpu.io/rdma-interfaces": "33"}))
    drive(sched, jobs, feed, clock)
    assert core.failed_events("many")[-1] == (
        "0/3 nodes are available: 3 node(s) had too few free RDMA virtual functions."
    )
    assert core.failed_events("absurd")[-1].startswith(
        "invalid kubegpu request: annotation kubegpu.io/rdma-interfaces"
    ), core.failed_events("absurd")
    for node in ("thin", "few", "good"):
        world.put_pod(pod_json(f"fill-{node}", 4, priority=1, node=node))
    world.put_pod(pod_json("greedy", 1, priority=100, annotations={"kubegpu.io/rdma-interfaces": "8"}))
    drive(sched, jobs, feed, clock)
    assert world.node_of("greedy") is None and not sched.nominated
    messages = core.failed_events("greedy")
    assert messages and not any("Preempting" in m for m in messages), messages


def test_a_held_vf_that_turns_unhealthy_keeps_its_pfs_bandwidth_reserved() -> None:
    """A VF goes out of use (its health, or its PF's) while a bound pod holds it: nobody new gets it,
    and the bandwidth the pod reserved on its PF stays reserved (the node still applies that pod's
    minimum rate there). Before, the VF's booking was dropped with it, so a second pod got the
    PF's other VF with that bandwidth and the PF was reserved past its line rate."""
    world = World()
    inv = rdma_inventory("one", [0, 0], [Pf("mlx5_0", 100, 0, (0, 1), vfs=2)])
    world.put_node(node_json("one", 2, inventory=publication(inv).inventory))
    sched, jobs, core, clock = make_scheduler(world)
    feed = Feed(world, sched)
    feed.relist()
    asks = {"kubegpu.io/rdma-interfaces": "1", "kubegpu.io/rdma-bandwidth": "60Gbps"}
    world.put_pod(pod_json("first", 0, annotations=asks))
    drive(sched, jobs, feed, clock)
    assert world.node_of("first") == "one"
    pod = world.find("ns", "first")
    assert pod is not None
    held = verify(pod["metadata"]["annotations"][ANNOTATION], KEYS).rdma[0].device
    for sick_pf in (False, True):
        devices = tuple(
            replace(d, healthy=False) if d.id == held or (sick_pf and d.id == "mlx5_0") else d
            for d in inv.devices
        )
        sick = NodeInventory(devices, inv.topology)
        world.put_node(node_json("one", 2, inventory=publication(sick).inventory))
        name = f"second-{int(sick_pf)}"
        world.put_pod(pod_json(name, 0, annotations=asks))
        drive(sched, jobs, feed, clock)
        assert world.node_of(name) is None, f"{name} got the PF's bandwidth that {held}'s pod reserved"
        assert core.failed_events(name)[-1] == (
            "0/1 nodes are available: 1 node(s) had insufficient RDMA bandwidth."
            if not sick_pf
            else "0/1 nodes are available: 1 node(s) had too few free RDMA virtual functions."
        ), core.failed_events(name)
        pf = sched.cache.view().node("one").nics.pfs["mlx5_0"]
        assert pf.reserved_mbps == 60_000 and pf.held == {held: 1}
        second = world.find("ns", name)
        assert second is not None
        world.delete_pod(second["metadata"]["uid"])
    world.put_node(node_json("one", 2, inventory=publication(inv).inventory))
    world.put_pod(pod_json("third", 0, annotations={**asks, "kubegpu.io/rdma-bandwidth": "40Gbps"}))
    drive(sched, jobs, feed, clock)
    assert world.node_of("third") == "one"  # the other VF, with the 40G left


def resource_pod(name: str, gpus: int, rdma: str, annotations: dict[str, str] | None = None) -> dict:
    """A pod asking for ``rdma`` of the extended resource kubegpu.io/rdma (a limit: the request too)."""
    pod = pod_json(name, gpus, annotations=annotations)
    resources = pod["spec"]["containers"][0]["resources"]
    resources["limits"]["kubegpu.io/rdma"] = rdma
    resources["requests"]["kubegpu.io/rdma"] = rdma
    return pod


def test_a_pod_asking_for_the_rdma_resource_gets_those_vfs_in_its_signed_allocation() -> None:
    """``kubegpu.io/rdma: 2`` asks for two interfaces as the annotation would: the pod lands where
    two VFs are free (the node without NICs has none to give), and its version-2 allocation carries
    them. Before, it was placed by the count alone with no VFs allocated (the shim then refused
    every container), or silently without RDMA beside a GPU."""
    world = World()
    world.put_node(node_json("plain", 4))
    inv = rdma_inventory("nics", [0, 0, 1, 1], [Pf("mlx5_0", 200, 0, (0, 1), vfs=2)])
    nics = node_json("nics", 4, inventory=publication(inv).inventory)
    nics["status"]["allocatable"]["kubegpu.io/rdma"] = "2"  # the advertiser's count: its healthy VFs
    world.put_node(nics)
    sched, jobs, core, clock = make_scheduler(world)
    feed = Feed(world, sched)
    feed.relist()
    world.put_pod(resource_pod("train", 1, "2"))
    drive(sched, jobs, feed, clock)
    assert world.node_of("train") == "nics", core.failed_events("train")
    pod = world.find("ns", "train")
    assert pod is not None
    raw = pod["metadata"]["annotations"][ANNOTATION]
    assert json.loads(raw)["version"] == 2
    signed = verify(raw, KEYS)
    assert sorted(r.device for r in signed.rdma) == ["mlx5_0-vf0", "mlx5_0-vf1"]
    assert all(r.pf == "mlx5_0" and r.min_mbps == 0 and r.max_mbps == 0 for r in signed.rdma)
    # no VF left: the next pod waits, whichever way it asks
    world.put_pod(resource_pod("more", 0, "1"))
    world.put_pod(pod_json("annotated", 0, annotations={"kubegpu.io/rdma-interfaces": "1"}))
    drive(sched, jobs, feed, clock)
    assert world.node_of("more") is None and world.node_of("annotated") is None
    assert "Insufficient kubegpu.io/rdma" in core.failed_events("more")[-1], core.failed_events("more")
    assert "too few free RDMA virtual functions" in core.failed_events("annotated")[-1]


def test_the_rdma_resource_and_annotation_disagreeing_is_an_invalid_request_event() -> None:
    world = world_with_nics()
    sched, jobs, core, clock = make_scheduler(world)
    feed = Feed(world, sched)
    feed.relist()
    world.put_pod(resource_pod("both", 1, "2", annotations={"kubegpu.io/rdma-interfaces": "1"}))
    drive(sched, jobs, feed, clock)
    assert world.node_of("both") is None
    assert any(
        m.startswith("invalid kubegpu request: annotation kubegpu.io/rdma-interfaces='1' and resource")
        and "kubegpu.io/rdma=2" in m
        for m in core.failed_events("both")
    ), core.failed_events("both")
