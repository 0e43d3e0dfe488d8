"""Pure parts of the rewrite: scrubbing, applying edits, the ledger's rules."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

from crishim import edits
from crishim.cri import api_pb2
from crishim.hostpaths import ManagedDevices
from crishim.intercept import Rejected
from crishim.ledger import Holding, Ledger, OverBooked, mark_value, parse_mark
from crishim.rewrite import AllocationRewriter, NodeDevices
from devices.plugin import ContainerEdits, DeviceNode, Mount
from devices.registry import load_plugins
from kubegpu.allocation import ANNOTATION, Allocation, ContainerAllocation, KeyRing, sign
from tests.fixtures.keys import SIGNING

NEUTRAL = {k: v.encode() for k, v in edits.NEUTRAL_ENV}


def config_with_everything() -> api_pb2.ContainerConfig:
    config = api_pb2.ContainerConfig()
    for key, value in (
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("KUBEGPU_VISIBLE_DEVICES", "GPU-x"),
        ("HOME", "/root"),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ):
        config.envs.add(key=key, value=value.encode())
    config.devices.add(host_path="/dev/nvidia0", container_path="/dev/nvidia0")
    config.devices.add(host_path="/dev/fuse", container_path="/dev/fuse")
    config.mounts.add(host_path="/dev/null", container_path="/var/run/nvidia-container-devices/GPU-x")
    config.mounts.add(host_path="/data", container_path="/data")
    config.CDI_devices.add(name="nvidia.com/gpu=all")
    config.CDI_devices.add(name="vendor.example/fpga=0")
    config.annotations["cdi.k8s.io/gpu"] = "nvidia.com/gpu=0"
    config.annotations["kubegpu.io/devices"] = "forged"
    config.annotations["keep.me/x"] = "1"
    return config


def test_scrub_removes_every_way_to_see_a_managed_device() -> None:
    config = config_with_everything()
    edits.scrub(config, ManagedDevices(patterns=("/dev/nvidia*",)))
    assert {kv.key: kv.value for kv in config.envs} == {
        "HOME": b"/root",
        "CUDA_VISIBLE_DEVICES": b"0",
        **NEUTRAL,
    }
    assert NEUTRAL["NVIDIA_VISIBLE_DEVICES"] == b"void"
    assert [d.host_path for d in config.devices] == ["/dev/fuse"]
    assert [m.container_path for m in config.mounts] == ["/data"]
    assert [c.name for c in config.CDI_devices] == ["vendor.example/fpga=0"]
    assert dict(config.annotations) == {"keep.me/x": "1"}


def test_apply_replaces_env_and_adds_nodes_once() -> None:
    config = api_pb2.ContainerConfig()
    edits.scrub(config, ManagedDevices())
    change = ContainerEdits(
        device_nodes=(
            DeviceNode("/dev/nvidia3", "/dev/nvidia3", "rw"),
            DeviceNode("/dev/nvidiactl", "/dev/nvidiactl"),
        ),
        env={"NVIDIA_VISIBLE_DEVICES": "GPU-3"},
        mounts=(Mount("/usr/lib/x", "/usr/lib/x"),),
        cdi_devices=("nvidia.com/gpu=GPU-3",),
    )
    edits.apply(config, change)
    assert [c.name for c in config.CDI_devices] == ["nvidia.com/gpu=GPU-3"]
    edits.apply(config, change)  # idempotent for nodes and mounts
    assert [kv.value for kv in config.envs if kv.key == "NVIDIA_VISIBLE_DEVICES"] == [b"GPU-3"]
    assert [(d.container_path, d.permissions) for d in config.devices] == [
        ("/dev/nvidia3", "rw"),
        ("/dev/nvidiactl", "rwm"),
    ]
    assert [m.container_path for m in config.mounts] == ["/usr/lib/x"]


def test_ledger_sums_shares_and_exempts_only_the_same_container() -> None:
    ledger = Ledger()
    assert not ledger.try_reserve([Holding("c1", "s1", "podA", "app", "GPU-1", 700)])
    assert not ledger.try_reserve([Holding("", "s2", "podB", "app", "GPU-1", 300)])
    conflicts = ledger.try_reserve([Holding("", "s3", "podC", "app", "GPU-1", 1)])
    assert [c.device for c in conflicts] == ["GPU-1"]
    assert "podA" in conflicts[0].describe() and "podB" in conflicts[0].describe()
    # A restart of the same container may take what its earlier instance holds...
    assert not ledger.try_reserve([Holding("", "s1", "podA", "app", "GPU-1", 700, attempt=1)])
    # ...another container of the same pod may not.
    assert ledger.try_reserve([Holding("", "s1", "podA", "side", "GPU-1", 1)])
    ledger.remove_sandbox("s1")
    assert {h.pod_uid for h in ledger.holdings()} == {"podB"}


def test_a_pod_wide_vf_is_shared_by_its_pods_containers_and_no_other_pod() -> None:
    """An RDMA VF belongs to the whole pod: its containers may all hold it, another pod's may not,
    whether that one asks for it pod-wide or as an ordinary device; the mark keeps which is which."""
    ledger = Ledger()
    vf = "mlx5_0-vf1"
    assert not ledger.try_reserve([Holding("c1", "s1", "podA", "app", vf, 1000, pod_wide=True)])
    assert not ledger.try_reserve([Holding("", "s1", "podA", "side", vf, 1000, pod_wide=True)])
    for holding in (
        Holding("", "s2", "podB", "app", vf, 1000, pod_wide=True),
        Holding("", "s2", "podB", "app", vf, 1000),
        Holding("", "s2", "podB", "app", vf, 1),
    ):
        conflicts = ledger.try_reserve([holding])
        assert [c.device for c in conflicts] == [vf]
        assert "goes to one pod" in conflicts[0].describe() and "podA" in conflicts[0].describe()
    assert {h.pod_uid for h in ledger.holdings()} == {"podA"}
    ledger.remove_sandbox("s1")
    assert not ledger.try_reserve([Holding("", "s2", "podB", "app", vf, 1000, pod_wide=True)])
    # an ordinary holder first: a pod-wide claim of another pod is refused too
    assert not ledger.try_reserve([Holding("", "s3", "podC", "app", "mlx5_0-vf2", 1000)])
    assert ledger.try_reserve([Holding("", "s4", "podD", "app", "mlx5_0-vf2", 1000, pod_wide=True)])
    mark = mark_value("podA", "app", {vf: 1000, "GPU-1": 1000}, pod_wide=[vf])
    assert parse_mark(mark) == ("podA", "app", {vf: 1000, "GPU-1": 1000}, {}, frozenset({vf}))
    assert parse_mark(mark_value("podA", "app", {vf: 500}, pod_wide=[vf])) is None  # pod-wide is whole
    assert parse_mark(mark_value("podA", "app", {}, pod_wide=[vf])) is None  # and among its devices


def test_shares_of_one_pod_and_another_never_add_past_a_whole_device() -> None:
    """P holds a:600 and b:400 of one GPU, Q holds c:400: in the order P/a, Q/c, P/b the last is
    refused (1400 milli otherwise)."""
    ledger = Ledger()
    assert not ledger.try_reserve([Holding("", "sP", "P", "a", "GPU-X", 600)])
    assert not ledger.try_reserve([Holding("", "sQ", "Q", "c", "GPU-X", 400)])
    conflicts = ledger.try_reserve([Holding("", "sP", "P", "b", "GPU-X", 400)])
    assert conflicts and sum(h.milli for h in conflicts[0].holders) == 1000


def test_mark_round_trip_and_forgeries() -> None:
    assert parse_mark(mark_value("uid", "app", {"GPU-1": 1000})) == (
        "uid",
        "app",
        {"GPU-1": 1000},
        {},
        frozenset(),
    )
    for forged in ("", "{}", '{"pod":"u","container":"c","devices":{"GPU-1":5000}}', "[1]", "null"):
        assert parse_mark(forged) is None


def test_allocated_create_waits_for_the_ledger(tmp_path: Path) -> None:
    plugins = load_plugins(["sim"], {"node_name": "n", "topology": "pcie-4gpu", "state_dir": str(tmp_path)})
    node_devices = NodeDevices(plugins, sysfs_root=None)
    node_devices.discover()
    rewriter = AllocationRewriter("n", node_devices, KeyRing(None, SIGNING))
    gpu = sorted(node_devices.devices)[0]
    request = api_pb2.CreateContainerRequest(pod_sandbox_id="sb")
    request.sandbox_config.metadata.uid = "u"
    request.config.metadata.name = "app"
    request.sandbox_config.annotations[ANNOTATION] = sign(
        Allocation("n", "u", {"app": ContainerAllocation((gpu,))}), "k1", SIGNING["k1"]
    )
    with pytest.raises(Rejected) as caught:
        asyncio.run(rewriter.create_container(request))
    assert caught.value.code is grpc.StatusCode.UNAVAILABLE
    rewriter.rebuilt.set()
    rewritten, completion = asyncio.run(rewriter.create_container(request))
    assert completion is not None
    assert [kv.value for kv in rewritten.config.envs if kv.key == "NVIDIA_VISIBLE_DEVICES"] == [gpu.encode()]


def test_a_create_committed_after_reconciliation_claimed_its_container_counts_once() -> None:
    """An unknown holding was settled onto container C just before C's own create reported it:
    the create's in-flight holding must go, not linger as a second claim."""
    ledger = Ledger()
    unknown = Holding("", "sb", "P", "app", "GPU-1", 600, ticket=1)
    retry = Holding("", "sb", "P", "app", "GPU-1", 600, ticket=2)
    assert not ledger.try_reserve([unknown])
    ledger.mark_unknown([unknown])
    assert not ledger.try_reserve([retry])
    ledger.commit([unknown], "C")  # the reconciliation found C first
    ledger.commit([retry], "C")  # then the retry's answer arrives
    assert [(h.container_id, h.milli) for h in ledger.holdings()] == [("C", 600)]
    assert not ledger.try_reserve([Holding("", "sq", "Q", "c", "GPU-1", 400)])


def test_mark_fields_must_all_have_their_types() -> None:
    good = {"pod": "u", "container": "c", "devices": {"GPU-1": 1}}
    assert parse_mark(json.dumps(good)) == ("u", "c", {"GPU-1": 1}, {}, frozenset())
    for field, wrong in (("pod", 1), ("container", None), ("devices", ["GPU-1"])):
        assert parse_mark(json.dumps({**good, field: wrong})) is None, field
    for milli in (0, -1, 1001, True, 1.0):
        assert parse_mark(json.dumps({**good, "devices": {"GPU-1": milli}})) is None, milli
    assert parse_mark(json.dumps({**good, "devices": {"GPU-1": 1000}})) == (
        "u",
        "c",
        {"GPU-1": 1000},
        {},
        frozenset(),
    )
    assert parse_mark(json.dumps({**good, "memoryMiB": {"GPU-1": 1}})) == (
        "u",
        "c",
        {"GPU-1": 1},
        {"GPU-1": 1},
        frozenset(),
    )


def test_ledger_bookkeeping_of_creates_whose_device_entries_went_away() -> None:
    ledger = Ledger()
    mine = Holding("", "sb", "P", "app", "GPU-1", 300, ticket=1)
    other = Holding("", "sq", "Q", "app", "GPU-1", 300, ticket=2)
    assert not ledger.try_reserve([mine]) and not ledger.try_reserve([other])
    ledger.remove_sandbox("sb")
    ledger.remove_sandbox("sq")
    ledger.mark_unknown([mine])  # nothing left to mark: no error
    ledger.commit([mine], "c1")  # containerd made it after all: it holds the device
    assert [(h.container_id, h.device) for h in ledger.holdings()] == [("c1", "GPU-1")]
    assert not ledger.try_reserve([other])
    ledger.commit([other], "c2")  # another container on the same device is its own claim
    assert sorted(h.container_id for h in ledger.holdings()) == ["c1", "c2"]


def test_ledger_releases_and_lists_only_what_it_is_asked_about() -> None:
    ledger = Ledger()
    first = Holding("", "sb", "P", "a", "GPU-1", 100, ticket=1)
    second = Holding("", "sb", "P", "b", "GPU-1", 100, ticket=2)
    third = Holding("", "sc", "R", "a", "GPU-2", 100, ticket=3)
    for h in (first, second, third):
        assert not ledger.try_reserve([h])
    ledger.mark_unknown([first, third])
    assert sorted(h.ticket for h in ledger.unknown()) == [1, 3]
    assert [h.ticket for h in ledger.unknown("sb")] == [1]
    ledger.release([first])  # an unknown one
    assert sorted(h.ticket for h in ledger.holdings()) == [2, 3]
    ledger.release([second])
    assert [h.ticket for h in ledger.holdings()] == [3]


def test_a_conflict_names_every_holder() -> None:
    ledger = Ledger()
    ledger.try_reserve([Holding("c1234567890abcdef", "s1", "P", "a", "GPU-1", 500)])
    ledger.try_reserve([Holding("", "s2", "Q", "b", "GPU-1", 400)])
    ledger.mark_unknown([Holding("", "s2", "Q", "b", "GPU-1", 400)])
    [conflict] = ledger.try_reserve([Holding("", "s3", "R", "c", "GPU-1", 200)])
    assert (
        conflict.describe()
        == "device GPU-1 is held by a of pod P (c1234567890a), b of pod Q (outcome unknown)"
    )


def test_the_mark_is_compact_and_sorted() -> None:
    assert mark_value("u", "c", {"GPU-b": 5, "GPU-a": 1000}) == (
        '{"container":"c","devices":{"GPU-a":1000,"GPU-b":5},"pod":"u"}'
    )


def test_a_refusal_message_is_cut_to_what_grpc_clients_accept() -> None:
    """Trailers carry the message percent-encoded; C-core clients drop a status whose metadata
    passes 8 KiB (RESOURCE_EXHAUSTED instead of the refusal), so a refusal is cut at 2000 UTF-8
    bytes, at a character boundary, and says so. A conflict naming hundreds of share holders of
    one GPU is such a message."""
    from crishim.intercept import MAX_MESSAGE_BYTES

    ledger = Ledger()
    for i in range(300):
        assert not ledger.try_reserve([Holding(f"c{i}", "sb", f"pod-é-{i:04d}", "app", "GPU-x", 3)])
    conflicts = ledger.try_reserve([Holding("", "sb", "late", "app", "GPU-x", 200)])
    reason = "; ".join(c.describe() for c in conflicts)
    assert len(reason.encode()) > 3 * MAX_MESSAGE_BYTES
    rejected = Rejected(grpc.StatusCode.FAILED_PRECONDITION, "pod x: " + reason)
    encoded = rejected.message.encode()
    assert len(encoded) <= MAX_MESSAGE_BYTES and rejected.message.startswith("pod x: device GPU-x")
    assert rejected.message.endswith(f"({len(('pod x: ' + reason).encode())} bytes, cut)")
    assert str(rejected) == rejected.message
    assert Rejected(grpc.StatusCode.INTERNAL, "é" * 999).message == "é" * 999  # 1998 bytes: whole
    assert len(Rejected(grpc.StatusCode.INTERNAL, "é" * 1001).message.encode()) <= MAX_MESSAGE_BYTES


def test_in_every_order_the_owners_on_a_device_never_pass_a_whole_one() -> None:
    """Creates of P/a 600, P/b 400, Q/c 400, R/d whole, P/a's restart and Q/c's restart, in every
    order: the distinct containers accepted on the GPU (a restart is its container again) never
    add up past 1000 milli, and every create that fits is accepted. A restart's earlier instance
    has exited: the shim drops it once it is in someone's way (here at once)."""
    import itertools

    creates = [
        ("P", "a", 600, 0),
        ("P", "b", 400, 0),
        ("Q", "c", 400, 0),
        ("R", "d", 1000, 0),
        ("P", "a", 600, 1),
        ("Q", "c", 400, 1),
    ]
    for order in itertools.permutations(creates):
        if order.index(("P", "a", 600, 1)) < order.index(("P", "a", 600, 0)):
            continue  # kubelet restarts a container after creating it
        if order.index(("Q", "c", 400, 1)) < order.index(("Q", "c", 400, 0)):
            continue
        ledger = Ledger()
        owners: dict[tuple[str, str], int] = {}
        for pod, container, milli, attempt in order:
            if attempt and (pod, container) not in owners:
                continue  # never created: nothing to restart
            others = sum(m for owner, m in owners.items() if owner != (pod, container))
            holding = Holding("", f"s{pod}", pod, container, "GPU-X", milli, attempt)
            refused = ledger.try_reserve([holding])
            assert bool(refused) == (others + milli > 1000), order
            if not refused:
                ledger.commit([holding], f"{pod}-{container}-{attempt}")
                if attempt:
                    ledger.remove_container(f"{pod}-{container}-{attempt - 1}")
                owners[(pod, container)] = milli
            assert sum(owners.values()) <= 1000, order


def test_a_create_answering_after_its_holdings_went_is_not_booked_past_capacity() -> None:
    """P's create of GPU-1 (whole) and GPU-2 (600) is in flight when its sandbox is removed, and Q
    and R take the devices. When containerd answers with P's container, booking it would pass
    both devices' capacity: OverBooked names every device and holder, and nothing is recorded.
    Once Q and R are gone, the same answer books P's container (it exists and may use them)."""
    ledger = Ledger()
    mine = [
        Holding("", "sb", "P", "app", "GPU-1", 1000, ticket=1),
        Holding("", "sb", "P", "app", "GPU-2", 600, ticket=1),
    ]
    assert not ledger.try_reserve(mine)
    ledger.remove_sandbox("sb")
    q, r = Holding("c-q", "sq", "Q", "c", "GPU-1", 1000), Holding("", "sr", "R", "d", "GPU-2", 500, ticket=2)
    assert not ledger.try_reserve([q]) and not ledger.try_reserve([r])
    with pytest.raises(OverBooked) as caught:
        ledger.commit(mine, "c-p")
    assert str(caught.value) == (
        "device GPU-1 is held by c of pod Q (c-q); device GPU-2 is held by d of pod R (creating)"
    )
    assert [c.device for c in caught.value.conflicts] == ["GPU-1", "GPU-2"]
    assert sorted(h.pod_uid for h in ledger.holdings()) == ["Q", "R"]
    ledger.remove_container("c-q")
    ledger.release([r])
    ledger.commit(mine, "c-p")
    assert sorted((h.container_id, h.device, h.milli) for h in ledger.holdings()) == [
        ("c-p", "GPU-1", 1000),
        ("c-p", "GPU-2", 600),
    ]


def test_a_late_answer_is_booked_beside_the_same_containers_earlier_instance() -> None:
    """The restart exemption holds for a create answering after its sandbox went: P's container
    of an earlier sandbox still holds GPU-1, and P's new instance of that container is booked
    beside it, as its reservation was."""
    ledger = Ledger()
    ledger.commit([Holding("", "sb-old", "P", "app", "GPU-1", 1000, ticket=1)], "c-old")
    new = Holding("", "sb", "P", "app", "GPU-1", 1000, ticket=2)
    assert not ledger.try_reserve([new])
    ledger.remove_sandbox("sb")
    ledger.commit([new], "c-new")
    assert sorted(h.container_id for h in ledger.holdings()) == ["c-new", "c-old"]
    assert ledger.try_reserve([Holding("", "sq", "Q", "c", "GPU-1", 1)])  # both P's for anyone else


def test_adopting_a_found_container_leaves_every_other_holding_alone() -> None:
    ledger = Ledger()
    committed = Holding("c-q", "sq", "Q", "c", "GPU-1", 1000)
    in_flight = Holding("", "sr", "R", "d", "GPU-2", 500, ticket=1)
    unknown = Holding("", "ss", "S", "e", "GPU-3", 500, ticket=2)
    for h in (committed, in_flight, unknown):
        assert not ledger.try_reserve([h])
    ledger.mark_unknown([unknown])
    found = Holding("c-p", "sb", "P", "app", "GPU-0", 1000)
    assert ledger.adopt([found])
    assert sorted(ledger.holdings(), key=lambda h: h.device) == [
        found,
        committed,
        in_flight,
        Holding("", "ss", "S", "e", "GPU-3", 500, ticket=2, unknown=True),
    ]


def test_a_container_already_recorded_or_still_being_created_is_not_adopted() -> None:
    """Adoption is for containers the ledger does not account for: one whose id it holds, or one
    whose create is still in flight here (its own commit records it), is left as it is."""
    ledger = Ledger()
    ledger.commit([Holding("", "sb", "P", "app", "GPU-1", 600, ticket=1)], "c-p")
    assert not ledger.adopt([Holding("c-p", "sb", "P", "app", "GPU-1", 600)])
    in_flight = Holding("", "sb", "P", "side", "GPU-2", 600, ticket=2)
    assert not ledger.try_reserve([in_flight])
    assert not ledger.adopt([Holding("c-side", "sb", "P", "side", "GPU-2", 600)])
    assert sorted((h.container_id, h.device) for h in ledger.holdings()) == [("", "GPU-2"), ("c-p", "GPU-1")]
    # The same container name and attempt in another sandbox of the pod is another container.
    assert ledger.adopt([Holding("c-p2", "sb2", "P", "app", "GPU-1", 600)])
    assert sorted(h.container_id for h in ledger.holdings()) == ["", "c-p", "c-p2"]


def test_a_quarantined_create_counts_at_its_largest_for_other_pods() -> None:
    """A create and its retry, both of unknown outcome, are one container at most: it counts once,
    at the larger of the two holdings."""
    ledger = Ledger()
    first = Holding("", "sb", "P", "app", "GPU-1", 600, ticket=1)
    retry = Holding("", "sb", "P", "app", "GPU-1", 300, ticket=2)
    for h in (first, retry):
        assert not ledger.try_reserve([h])
        ledger.mark_unknown([h])
    assert not ledger.try_reserve([Holding("", "sq", "Q", "c", "GPU-1", 400, ticket=3)])
    assert ledger.try_reserve([Holding("", "sr", "R", "d", "GPU-1", 1, ticket=4)])


def test_a_create_is_refused_if_any_one_of_its_devices_is_taken() -> None:
    ledger = Ledger()
    assert not ledger.try_reserve([Holding("c-q", "sq", "Q", "c", "GPU-1", 1000)])
    wanted = [Holding("", "sb", "P", "app", gpu, 1000, ticket=1) for gpu in ("GPU-0", "GPU-1", "GPU-2")]
    assert [c.device for c in ledger.try_reserve(wanted)] == ["GPU-1"]
    assert [h.container_id for h in ledger.holdings()] == ["c-q"]


def test_memory_is_checked_whenever_the_gpus_memory_is_known() -> None:
    """Without a memory source (or with 0: unknown) shares are checked by milli alone; any known
    memory, down to 1 MiB, is checked."""
    roomy = Ledger()
    assert not roomy.try_reserve([Holding("", "sb", "P", "a", "GPU-1", 500, memory_mib=10**6)])
    assert not roomy.try_reserve([Holding("", "sq", "Q", "c", "GPU-1", 500, memory_mib=10**6)])
    tiny = Ledger(lambda device: 1)
    assert not tiny.try_reserve([Holding("", "sb", "P", "a", "GPU-1", 100, memory_mib=1)])
    [conflict] = tiny.try_reserve([Holding("", "sq", "Q", "c", "GPU-1", 100, memory_mib=1)])
    assert conflict.describe() == (
        "device GPU-1 is held by a of pod P (creating): their GPU memory would add up to 2 MiB, "
        "more than its 1 MiB"
    )
