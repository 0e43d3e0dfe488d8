"""The rewrite core's node side of RDMA interfaces (issue #25), on the RDMA plugin reading a fake
sysfs tree with real char device nodes (tests/support/rdmanode.py): a pod's allocated VFs reach
every container of that pod as exactly their verbs nodes, rdma_cm and ``NCCL_IB_HCA``; they are
booked pod-wide (never to two pods); a container asking for RDMA devices itself is refused; a VF
gone from sysfs is refused with nothing booked; a rebuild from the marks keeps them pod-wide.
(Through real containerd: tests/test_crishim_rdma_containerd.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2
from crishim.intercept import Rejected
from crishim.ledger import MARK_ANNOTATION, parse_mark
from crishim.rewrite import AllocationRewriter, NodeDevices, RdmaResourceLookup
from devices.rdma import RdmaPlugin
from kubegpu.allocation import ANNOTATION, RDMA_INTERFACES_ANNOTATION, KeyRing
from tests.fixtures.keys import OTHER_KEY, SIGNING
from tests.support.rdmanode import PF, build_sriov_machine, rdma_allocation

NODE = "rdma-node"
UID_A, UID_B = "aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002"


@pytest.fixture
def machine(tmp_path: Path) -> Path:
    build_sriov_machine(tmp_path)
    return tmp_path


def rewriter_on(root: Path, rdma_resource: RdmaResourceLookup | None = None) -> AllocationRewriter:
    node = NodeDevices([RdmaPlugin(str(root))], sysfs_root=str(root))
    node.discover()
    rewriter = AllocationRewriter(NODE, node, KeyRing(None, SIGNING), rdma_resource=rdma_resource)
    rewriter.rebuilt.set()
    return rewriter


def request(
    uid: str,
    annotation: str | None,
    container: str = "app",
    sandbox: str = "",
    devices: list[str] | None = None,
    mounts: list[tuple[str, str]] | None = None,
    envs: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    privileged: bool = False,
) -> api_pb2.CreateContainerRequest:
    req = api_pb2.CreateContainerRequest(pod_sandbox_id=sandbox or f"sb-{uid[:4]}")
    meta = req.sandbox_config.metadata
    meta.name, meta.namespace, meta.uid = f"p-{uid[:4]}", "default", uid
    req.sandbox_config.annotations.update(annotations or {})
    if annotation is not None:
        req.sandbox_config.annotations[ANNOTATION] = annotation
    req.config.metadata.name = container
    for host in devices or []:
        req.config.devices.add(host_path=host, container_path=f"/dev/asked{len(req.config.devices)}")
    for host, inside in mounts or []:
        req.config.mounts.add(host_path=host, container_path=inside, readonly=True)
    for key, value in (envs or {}).items():
        req.config.envs.add(key=key, value=value.encode())
    req.config.linux.security_context.privileged = privileged
    return req


def create(
    rewriter: AllocationRewriter, req: api_pb2.CreateContainerRequest
) -> api_pb2.CreateContainerRequest:
    """The rewrite, committed to a container id named after the sandbox and container."""
    rewritten, done = asyncio.run(rewriter.create_container(req))
    if done is not None:
        done(f"{req.pod_sandbox_id}-{req.config.metadata.name}")
    return rewritten


def refused(rewriter: AllocationRewriter, req: api_pb2.CreateContainerRequest) -> Rejected:
    with pytest.raises(Rejected) as caught:
        asyncio.run(rewriter.create_container(req))
    return caught.value


def nodes_of(config: api_pb2.ContainerConfig) -> list[tuple[str, str]]:
    return sorted((d.host_path, d.container_path) for d in config.devices)


def env_of(config: api_pb2.ContainerConfig) -> dict[str, str]:
    return {kv.key: kv.value.decode() for kv in config.envs}


def held(rewriter: AllocationRewriter) -> list[tuple[str, str, str, bool]]:
    return sorted((h.pod_uid, h.container, h.device, h.pod_wide) for h in rewriter.ledger.holdings())


def test_every_container_of_the_pod_gets_exactly_its_vfs_booked_pod_wide(machine: Path) -> None:
    rewriter = rewriter_on(machine)
    dev = f"{machine}/dev/infiniband"
    alloc = rdma_allocation(NODE, UID_A, ["mlx5_1", "mlx5_2"])
    app = create(
        rewriter, request(UID_A, alloc, envs={"NCCL_IB_HCA": "mlx5", "KUBEGPU_RDMA_DEVICES": "mlx5_3"})
    )
    assert nodes_of(app.config) == [
        (f"{dev}/rdma_cm", "/dev/infiniband/rdma_cm"),
        (f"{dev}/uverbs1", "/dev/infiniband/uverbs1"),
        (f"{dev}/uverbs2", "/dev/infiniband/uverbs2"),
    ]
    env = env_of(app.config)
    assert env["NCCL_IB_HCA"] == "=mlx5_1,mlx5_2"  # exact match, only its VFs: the user's value is gone
    assert env["KUBEGPU_RDMA_DEVICES"] == "mlx5_1,mlx5_2"
    mark = parse_mark(app.config.annotations[MARK_ANNOTATION])
    assert mark is not None and mark.pod_wide == {"mlx5_1", "mlx5_2"}
    # another container of the same pod shares them
    side = create(rewriter, request(UID_A, alloc, container="side"))
    assert nodes_of(side.config) == nodes_of(app.config)
    assert held(rewriter) == [
        (UID_A, "app", "mlx5_1", True),
        (UID_A, "app", "mlx5_2", True),
        (UID_A, "side", "mlx5_1", True),
        (UID_A, "side", "mlx5_2", True),
    ]
    # another pod, with a signed allocation of one of them, never gets it
    other = refused(rewriter, request(UID_B, rdma_allocation(NODE, UID_B, ["mlx5_2", "mlx5_3"])))
    assert other.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "mlx5_2" in other.message and "goes to one pod" in other.message
    assert {h.pod_uid for h in rewriter.ledger.holdings()} == {UID_A}  # nothing of B booked
    # the pod holds them while any of its containers does
    rewriter.removed_container(f"sb-{UID_A[:4]}-app")
    refused(rewriter, request(UID_B, rdma_allocation(NODE, UID_B, ["mlx5_2"])))
    rewriter.removed_container(f"sb-{UID_A[:4]}-side")
    assert held(rewriter) == []
    b = create(rewriter, request(UID_B, rdma_allocation(NODE, UID_B, ["mlx5_2"])))
    assert env_of(b.config)["NCCL_IB_HCA"] == "=mlx5_2"
    rewriter.removed_sandbox(f"sb-{UID_B[:4]}")
    assert held(rewriter) == []


def test_vfs_and_gpus_of_one_container_name_each_other_and_the_pod_alone(machine: Path) -> None:
    """A container with its own RDMA device (a PF, version 1 style) and the pod's VF: one edit set,
    NCCL_IB_HCA naming both; only the VF is pod-wide."""
    rewriter = rewriter_on(machine)
    alloc = rdma_allocation(NODE, UID_A, ["mlx5_3"], containers={"app": [PF]})
    app = create(rewriter, request(UID_A, alloc))
    assert env_of(app.config)["NCCL_IB_HCA"] == "=mlx5_0,mlx5_3"
    assert held(rewriter) == [(UID_A, "app", PF, False), (UID_A, "app", "mlx5_3", True)]


def test_a_vf_gone_from_sysfs_since_scheduling_is_refused_with_nothing_booked(machine: Path) -> None:
    rewriter = rewriter_on(machine)
    (machine / "sys/class/infiniband/mlx5_2").unlink()  # sriov_numvfs lowered after discovery
    req = request(UID_A, rdma_allocation(NODE, UID_A, ["mlx5_1", "mlx5_2"]))
    error = refused(rewriter, req)
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "mlx5_2 is not on this host now" in error.message and "default/p-aaaa" in error.message
    assert held(rewriter) == []
    # its verbs node gone instead: the same
    (machine / "dev/infiniband/uverbs1").unlink()
    error = refused(rewriter, request(UID_A, rdma_allocation(NODE, UID_A, ["mlx5_1"])))
    assert "uverbs1 is missing" in error.message
    assert held(rewriter) == []


@pytest.mark.parametrize(
    ("what", "rdma", "want"),
    [
        ("another node", dict(node="node-b"), "allocation is for node"),
        ("another pod", dict(uid=UID_B), "allocation is for pod UID"),
        ("unknown VF", dict(vfs=["mlx5_9"]), "mlx5_9 is not on this node"),
        ("a PF as VF", dict(vfs=[PF], pf="mlx5_1"), "mlx5_0 is not an RDMA VF"),
        ("wrong PF", dict(vfs=["mlx5_1"], pf="mlx5_7"), "VF of mlx5_0 on this node, not of mlx5_7"),
    ],
)
def test_an_allocation_this_node_cannot_honour_is_refused(
    machine: Path, what: str, rdma: dict[str, object], want: str
) -> None:
    rewriter = rewriter_on(machine)
    annotation = rdma_allocation(
        str(rdma.get("node", NODE)),
        str(rdma.get("uid", UID_A)),
        list(rdma.get("vfs", ["mlx5_1"])),  # type: ignore[call-overload]
        pf=str(rdma.get("pf", PF)),
    )
    error = refused(rewriter, request(UID_A, annotation))
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION, what
    assert want in error.message, (what, error.message)
    assert held(rewriter) == []


def test_a_forged_or_unhealthy_vf_allocation_is_refused(machine: Path) -> None:
    rewriter = rewriter_on(machine)
    forged = refused(rewriter, request(UID_A, rdma_allocation(NODE, UID_A, ["mlx5_1"], key=OTHER_KEY)))
    assert forged.code is grpc.StatusCode.INVALID_ARGUMENT and "signature" in forged.message
    rewriter.node_devices.healthy["mlx5_1"] = False
    sick = refused(rewriter, request(UID_A, rdma_allocation(NODE, UID_A, ["mlx5_1"])))
    assert sick.code is grpc.StatusCode.FAILED_PRECONDITION and "mlx5_1 is unhealthy" in sick.message
    assert held(rewriter) == []


def test_a_container_asking_for_rdma_devices_without_an_allocation_is_refused(machine: Path) -> None:
    rewriter = rewriter_on(machine)
    dev = f"{machine}/dev/infiniband"
    gpu_only = None  # no allocation at all
    asks = [
        [f"{dev}/uverbs3"],
        [f"{dev}/../infiniband/./uverbs3"],
        ["/dev/char/231:195"],  # uverbs3 by its numbers
        [f"{dev}/rdma_cm"],
    ]
    for devices in asks:
        error = refused(rewriter, request(UID_A, gpu_only, devices=devices))
        assert error.code is grpc.StatusCode.INVALID_ARGUMENT, devices
        assert "holds no RDMA interfaces" in error.message and devices[0][:100] in error.message
    # a version-2 allocation without interfaces for this pod: the same (it holds none)
    version_1 = rdma_allocation(NODE, UID_A, [], containers={"app": [PF]})
    error = refused(rewriter, request(UID_A, version_1, devices=[f"{dev}/uverbs3"]))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT and "holds no RDMA interfaces" in error.message
    # the directory as a device entry: undecidable, refused by the scrub
    error = refused(rewriter, request(UID_A, None, devices=[dev]))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT and "directory holding managed" in error.message
    assert held(rewriter) == []


def test_a_mount_reaching_rdma_devices_is_refused_even_with_an_allocation(
    machine: Path, tmp_path: Path
) -> None:
    rewriter = rewriter_on(machine)
    dev = f"{machine}/dev/infiniband"
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "link").symlink_to(dev)
    alloc = rdma_allocation(NODE, UID_A, ["mlx5_1"])
    mounts = [
        (dev, "/dev/infiniband"),
        (f"{dev}/", "/ib"),
        (f"{dev}/uverbs2", "/dev/x"),
        (str(other / "link"), "/ib"),  # through a symlink
        ("/dev/infiniband", "/ib"),  # the host's own, whether or not it exists here
        (str(other), "/dev/infiniband"),  # over the place of the pod's VFs in the container
    ]
    for annotation in (None, alloc):
        for host, inside in mounts:
            error = refused(rewriter, request(UID_A, annotation, mounts=[(host, inside)]))
            assert error.code is grpc.StatusCode.INVALID_ARGUMENT, (host, inside)
            assert "reaches the node's RDMA devices" in error.message
    assert held(rewriter) == []
    nul = refused(rewriter, request(UID_A, None, mounts=[(f"{dev}\x00x", "/ib")]))
    assert nul.code is grpc.StatusCode.INVALID_ARGUMENT and "has a NUL" in nul.message
    # a mount of a directory above (/dev: its nodes stay shut by the device cgroup) is Pod Security's
    fine = create(rewriter, request(UID_A, None, mounts=[(str(machine / "dev"), "/host-dev")]))
    assert [m.host_path for m in fine.config.mounts] == [str(machine / "dev")]


def test_with_an_allocation_asked_nodes_are_scrubbed_to_exactly_the_pods_vfs(machine: Path) -> None:
    rewriter = rewriter_on(machine)
    dev = f"{machine}/dev/infiniband"
    alloc = rdma_allocation(NODE, UID_A, ["mlx5_1"])
    app = create(rewriter, request(UID_A, alloc, devices=[f"{dev}/uverbs3", "/dev/char/231:192"]))
    assert [d.host_path for d in app.config.devices] == [f"{dev}/uverbs1", f"{dev}/rdma_cm"]


def test_a_privileged_container_is_not_refused_for_rdma_requests(
    machine: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    rewriter = rewriter_on(machine)
    dev = f"{machine}/dev/infiniband"
    made = create(rewriter, request(UID_A, None, mounts=[(dev, "/ib")], privileged=True))
    assert [m.host_path for m in made.config.mounts] == [dev]
    assert any(r.getMessage() == "create_container.privileged" for r in caplog.records)


def test_a_pod_asking_for_rdma_interfaces_without_them_is_refused(machine: Path) -> None:
    rewriter = rewriter_on(machine)
    for value in ("2", "two"):
        error = refused(rewriter, request(UID_A, None, annotations={RDMA_INTERFACES_ANNOTATION: value}))
        assert error.code is grpc.StatusCode.FAILED_PRECONDITION
        assert "asks for RDMA interfaces" in error.message and "no kubegpu allocation" in error.message
    gpu_only = rdma_allocation(NODE, UID_A, [], containers={"app": [PF]})
    error = refused(rewriter, request(UID_A, gpu_only, annotations={RDMA_INTERFACES_ANNOTATION: "1"}))
    assert "its allocation holds none" in error.message
    for zero in ("0", "00", " 0", "0\t"):  # none, as the scheduler reads it: it placed the pod so
        create(rewriter, request(UID_A, None, annotations={RDMA_INTERFACES_ANNOTATION: zero}))
    assert held(rewriter) == []


def test_a_rebuild_from_the_marks_keeps_the_vfs_pod_wide(machine: Path) -> None:
    rewriter = rewriter_on(machine)
    alloc = rdma_allocation(NODE, UID_A, ["mlx5_1", "mlx5_2"])
    app = create(rewriter, request(UID_A, alloc))
    mark = app.config.annotations[MARK_ANNOTATION]
    restarted = rewriter_on(machine)
    found = restarted.holdings_by_mark("c-app", "sb-a", "app", 0, mark, UID_A)
    restarted.install_rebuilt([("c-app", found)])
    assert held(restarted) == [(UID_A, "app", "mlx5_1", True), (UID_A, "app", "mlx5_2", True)]
    error = refused(restarted, request(UID_B, rdma_allocation(NODE, UID_B, ["mlx5_1"])))
    assert "goes to one pod" in error.message
    create(restarted, request(UID_A, alloc, container="side", sandbox="sb-a"))  # its own pod: shared
    restarted.removed_sandbox("sb-a")
    assert held(restarted) == []


@pytest.mark.parametrize(
    ("value", "asks"),
    [("2", True), ("0", False), (" 0", False), ("00\t", False), ("two", True), ("", True), ("\u0660", True)],
)
def test_a_pod_read_from_the_api_asking_for_rdma_interfaces_needs_an_allocation(
    value: str, asks: bool
) -> None:
    """The API path (a sandbox without the allocation annotation): the pod's annotation asks for
    interfaces, so without an allocation it is refused, named as the scheduler names it."""
    from crishim.podlookup import decide, facts_of
    from scheduler.live import podspec

    assert podspec.RDMA_INTERFACES_ANNOTATION == RDMA_INTERFACES_ANNOTATION
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u",
            "annotations": {RDMA_INTERFACES_ANNOTATION: value},
        },
        "spec": {"containers": [{"name": "app", "image": "x"}]},
    }
    try:  # the node asks exactly when the scheduler reads a count above 0, or cannot read it
        assert asks == bool(podspec.rdma_request({RDMA_INTERFACES_ANNOTATION: value}))
    except podspec.PodSpecError:
        assert asks
    if asks:
        with pytest.raises(Rejected, match=f"requests {RDMA_INTERFACES_ANNOTATION} but carries no kubegpu"):
            decide(facts_of(pod, ("nvidia.com/gpu",)))
    else:
        assert decide(facts_of(pod, ("nvidia.com/gpu",))) is None


def test_a_sim_node_gives_a_pod_its_simulated_vfs_beside_its_gpu(tmp_path: Path) -> None:
    """The sim plugin's VFs (hgx-h100-sriov) go through the same checks: the pod's container gets
    its GPU and both VFs' stand-in nodes, and another pod none of them."""
    from devices.registry import load_plugins
    from devices.sim import sim_gpu_id

    options = {"node_name": NODE, "topology": "hgx-h100-sriov", "state_dir": str(tmp_path)}
    node = NodeDevices(load_plugins(["sim"], options), sysfs_root=None)
    node.discover()
    rewriter = AllocationRewriter(NODE, node, KeyRing(None, SIGNING))
    rewriter.rebuilt.set()
    gpu = sim_gpu_id(NODE, 0)
    alloc = rdma_allocation(NODE, UID_A, ["mlx5_0-vf0", "mlx5_0-vf1"], containers={"app": [gpu]})
    app = create(rewriter, request(UID_A, alloc))
    assert sorted(d.container_path for d in app.config.devices) == [
        "/dev/kubegpu-sim/gpu0",
        "/dev/kubegpu-sim/mlx5_0-vf0",
        "/dev/kubegpu-sim/mlx5_0-vf1",
    ]
    assert env_of(app.config)["KUBEGPU_RDMA_DEVICES"] == "mlx5_0-vf0,mlx5_0-vf1"
    error = refused(rewriter, request(UID_B, rdma_allocation(NODE, UID_B, ["mlx5_0-vf1"])))
    assert "goes to one pod" in error.message
    wrong_pf = refused(rewriter, request(UID_B, rdma_allocation(NODE, UID_B, ["mlx5_1-vf0"])))
    assert "VF of mlx5_1 on this node, not of mlx5_0" in wrong_pf.message


def test_answering_off_filesystem_mounts_from_one_stat_changes_no_answer(
    machine: Path, tmp_path: Path
) -> None:
    """``_mount_reaches`` skips resolving a source through symlinks when it exists, is no device
    node and lies on none of the RDMA places' filesystems. Every answer must be the one the full
    resolution gives: sources on this host's /tmp and /etc, /dev (devtmpfs: resolved), links into
    /dev and into the fake machine's /dev/infiniband, missing paths, and the fake machine's own
    nodes (its tree shares /tmp's filesystem, so nothing is skipped there)."""
    from crishim.container import MountEntry
    from crishim.edits import _filesystems, _mount_reaches
    from crishim.hostpaths import HostFS

    fs = HostFS()
    links = tmp_path / "links"
    links.mkdir()
    infiniband = machine / "dev" / "infiniband"
    targets = {
        "dev": "/dev",
        "null": "/dev/null",
        "ib": str(infiniband),
        "uverbs": str(infiniband / "uverbs1"),
    }
    for name, target in targets.items():
        (links / name).symlink_to(target)
    sources = [
        "/etc/hostname",
        "/dev/shm",
        "/dev",
        "/dev/null",
        "/dev/infiniband",
        str(tmp_path),
        str(links / "missing"),
        *(str(links / name) for name in targets),
        str(infiniband),
        str(infiniband / "uverbs1"),
        "/proc/self/fd",
    ]
    for plugins_root in ("/", str(machine)):
        node = NodeDevices([RdmaPlugin(plugins_root)], sysfs_root=plugins_root)
        places = [*node.rdma_dirs, *(os.path.dirname(p) for p in node.rdma.patterns)]
        filesystems = _filesystems(places, fs)
        for source in sources:
            mount = MountEntry(container_path="/data", host_path=source)
            full = _mount_reaches(mount, node.rdma, node.rdma_dirs, fs)
            assert _mount_reaches(mount, node.rdma, node.rdma_dirs, fs, filesystems) == full, (
                plugins_root,
                source,
            )


def resource_pod(uid: str, app: str, init: str = "") -> dict:
    """A pod (API JSON) asking for ``kubegpu.io/rdma`` through its containers' resources only."""

    def container(name: str, count: str) -> dict:
        return {"name": name, "image": "x", "resources": {"limits": {"kubegpu.io/rdma": count}}}

    return {
        "metadata": {"name": f"p-{uid[:4]}", "namespace": "default", "uid": uid, "annotations": {}},
        "spec": {
            "initContainers": [container("init", init)] if init else [],
            "containers": [container("app", app)],
        },
    }


def rewriter_reading(root: Path, pods: list[dict]) -> AllocationRewriter:
    """A rewriter whose pods' kubegpu.io/rdma requests are read from these pods' JSON, as the API
    lookup reads them (crishim.podlookup.facts_of); a pod it does not know: None (no answer)."""
    from crishim.podlookup import facts_of

    facts = {pod["metadata"]["uid"]: facts_of(pod, ("kubegpu.io/rdma",)) for pod in pods}

    async def rdma_resource(namespace: str, name: str, uid: str) -> int | None:
        found = facts.get(uid)
        return found.rdma if found is not None else None

    return rewriter_on(root, rdma_resource)


def test_a_pod_requesting_the_rdma_resource_gets_its_allocated_vfs_and_no_more_than_them(
    machine: Path,
) -> None:
    """``kubegpu.io/rdma: 2`` with a signed allocation of two VFs: each container gets exactly those;
    a request above what the allocation holds is refused, a GPU-only allocation included (before,
    such a pod started silently without RDMA); what is granted is the allocation's VFs, never more."""
    rewriter = rewriter_reading(machine, [resource_pod(UID_A, "2"), resource_pod(UID_B, "1", init="2")])
    dev = f"{machine}/dev/infiniband"
    made = create(rewriter, request(UID_A, rdma_allocation(NODE, UID_A, ["mlx5_1", "mlx5_2"])))
    assert nodes_of(made.config) == [
        (f"{dev}/rdma_cm", "/dev/infiniband/rdma_cm"),
        (f"{dev}/uverbs1", "/dev/infiniband/uverbs1"),
        (f"{dev}/uverbs2", "/dev/infiniband/uverbs2"),
    ]
    assert env_of(made.config)["NCCL_IB_HCA"] == "=mlx5_1,mlx5_2"
    # B's request is 2 (its init container's): an allocation of one VF, or none, is refused
    error = refused(rewriter, request(UID_B, rdma_allocation(NODE, UID_B, ["mlx5_3"])))
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "requests kubegpu.io/rdma: 2 (RDMA interfaces) but its allocation holds 1" in error.message
    gpu_only = rdma_allocation(NODE, UID_B, [], containers={"app": [PF]})
    assert "its allocation holds 0" in refused(rewriter, request(UID_B, gpu_only)).message
    assert held(rewriter) == [(UID_A, "app", "mlx5_1", True), (UID_A, "app", "mlx5_2", True)]
    rewriter.removed_sandbox("sb-aaaa")
    made = create(rewriter, request(UID_B, rdma_allocation(NODE, UID_B, ["mlx5_2", "mlx5_3"])))
    assert env_of(made.config)["NCCL_IB_HCA"] == "=mlx5_2,mlx5_3"
    # a pod the API cannot answer for (None): its allocation's VFs, exactly, as for any pod
    other = "cccccccc-0000-4000-8000-000000000003"
    made = create(rewriter, request(other, rdma_allocation(NODE, other, ["mlx5_1"])))
    assert env_of(made.config)["NCCL_IB_HCA"] == "=mlx5_1"


def test_the_shim_reads_a_pods_rdma_request_as_the_scheduler_counts_it() -> None:
    """The node and the scheduler count ``kubegpu.io/rdma`` by one rule (app containers summed,
    the larger of each init container with the sidecars before it, plus overhead)."""
    from crishim.podlookup import facts_of
    from scheduler.live.podspec import pod_resources

    side = {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"kubegpu.io/rdma": "1"}}}
    pods = [resource_pod(UID_A, "2"), resource_pod(UID_A, "1", init="3"), resource_pod(UID_A, "0")]
    with_sidecar = resource_pod(UID_A, "1", init="2")
    with_sidecar["spec"]["initContainers"].insert(0, side)
    with_sidecar["spec"]["overhead"] = {"kubegpu.io/rdma": "1"}
    for pod, expected in zip([*pods, with_sidecar], [2, 3, 0, 4], strict=True):
        assert facts_of(pod, ()).rdma == expected
        assert dict(pod_resources(pod, "nvidia.com/gpu").resources).get("kubegpu.io/rdma", 0) == expected


def test_a_read_of_the_rdma_request_gives_up_at_the_lookups_timeout() -> None:
    """docs/crishim.md: a read of an uncached pod waits at most the lookup's timeout, then the request
    is not checked (None; the allocation's VFs, never more). Against a real HTTP server that leaves
    the first GET unanswered and answers a second one (with a pod asking for two interfaces) half a
    timeout later: before the fix urllib3 retried the timed-out read (three times by default, so up
    to four timeouts per container create) and the lookup answered 2 from the retry."""
    import json
    import socket
    import threading

    from kubernetes import client

    from crishim.podlookup import ApiPodLookup

    timeout = 1.0
    pod = resource_pod(UID_A, "2")
    body = json.dumps(pod).encode()
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    held: list[socket.socket] = []
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            if len(held) == 1:
                continue  # the first GET is never answered
            conn.recv(65536)
            done.wait(timeout / 2)
            header = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            with contextlib.suppress(OSError):
                conn.sendall(header.encode() + b"\r\n" + body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    lookup = ApiPodLookup(client.CoreV1Api(client.ApiClient(configuration)), timeout=timeout)
    try:
        assert asyncio.run(lookup.rdma_resource("default", pod["metadata"]["name"], UID_A)) is None
    finally:
        done.set()
        server.close()
        for conn in held:
            conn.close()
        thread.join(5)


def test_a_vf_named_by_its_pfs_pci_address_alone_is_granted_as_the_scheduler_places_it(machine: Path) -> None:
    # The scheduler and the advertiser find a VF's PF by `parentDevice`, else by `parentPf` (its PCI
    # address); the shim compared `parentDevice` alone, so such a VF was placed and refused forever.
    from dataclasses import replace

    rewriter = rewriter_on(machine)
    devices = rewriter.node_devices.devices
    pf_pci = devices[PF].pci_bus_id
    assert pf_pci
    attributes = {k: v for k, v in devices["mlx5_1"].attributes.items() if k != "parentDevice"}
    devices["mlx5_1"] = replace(devices["mlx5_1"], attributes={**attributes, "parentPf": pf_pci})
    app = create(rewriter, request(UID_A, rdma_allocation(NODE, UID_A, ["mlx5_1"])))
    assert env_of(app.config)["NCCL_IB_HCA"] == "=mlx5_1"
    devices["mlx5_1"] = replace(devices["mlx5_1"], attributes={**attributes, "parentPf": "0000:ff:00.7"})
    error = refused(rewriter, request(UID_B, rdma_allocation(NODE, UID_B, ["mlx5_1"])))
    assert "not of" in error.message
