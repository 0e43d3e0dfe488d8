"""The CreateContainer rewrite on a node that enforces shares (sim GPUs, stand-in MPS control).

A container holding a share becomes an MPS client: env and mounts from ``crishim.mps``, its GPU's
daemon running; a whole-GPU container is not one; a daemon that cannot start refuses the create
with UNAVAILABLE (kubelet retries) and frees the reservation; removing the last share's container
stops the daemon. Real containerd shows the same inside a container: test_mps_containerd.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2
from crishim.intercept import Rejected
from crishim.mps import MpsSharing, MpsSupervisor
from crishim.rewrite import AllocationRewriter, NodeDevices
from devices.registry import load_plugins
from devices.sim import sim_gpu_id
from kubegpu.allocation import ANNOTATION, Allocation, ContainerAllocation, KeyRing, Share, sign
from tests.fixtures.keys import SIGNING
from tests.support.mps_standin import events, write_standin
from tests.support.waiting import wait_for

NODE = "mps-node"
KEYS = SIGNING


def gpu(index: int) -> str:
    return sim_gpu_id(NODE, index)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[AllocationRewriter, MpsSupervisor, Path]]:
    control = write_standin(tmp_path / "bin")
    supervisor = MpsSupervisor(str(control), tmp_path / "mps", private_shm=False, stop_timeout=5.0)
    plugins = load_plugins(["sim"], {"node_name": NODE, "topology": "pcie-4gpu", "state_dir": str(tmp_path)})
    node_devices = NodeDevices(plugins, sysfs_root=None, sharing=MpsSharing(supervisor, interval=0.1))
    node_devices.discover()
    rewriter = AllocationRewriter(NODE, node_devices, KeyRing(None, KEYS))
    rewriter.rebuilt.set()
    assert node_devices.sharing is not None
    node_devices.sharing.start(rewriter._shared_devices)
    yield rewriter, supervisor, control
    node_devices.sharing.close()
    supervisor.stop_all()


def request(
    containers: dict[str, ContainerAllocation], container: str, uid: str | None = None
) -> api_pb2.CreateContainerRequest:
    uid = uid or str(uuid.uuid4())
    value = sign(Allocation(NODE, uid, containers), "k1", KEYS["k1"])
    req = api_pb2.CreateContainerRequest(pod_sandbox_id=f"sandbox-{uid[:8]}")
    req.sandbox_config.metadata.name = "pod"
    req.sandbox_config.metadata.namespace = "ns"
    req.sandbox_config.metadata.uid = uid
    req.sandbox_config.annotations[ANNOTATION] = value
    req.config.metadata.name = container
    # The user's own /dev/shm (an emptyDir) and MPS settings must not win over the daemon's.
    req.config.mounts.add(host_path="/var/lib/kubelet/pods/x/volumes/shm", container_path="/dev/shm/")
    req.config.envs.add(key="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", value=b"100")
    return req


def create(rewriter: AllocationRewriter, req: api_pb2.CreateContainerRequest, container_id: str) -> None:
    async def run() -> None:
        _, done = await rewriter.create_container(req)
        assert done is not None
        done(container_id)

    asyncio.run(run())


def test_share_container_is_an_mps_client(node: tuple[AllocationRewriter, MpsSupervisor, Path]) -> None:
    rewriter, supervisor, control = node
    req = request({"app": ContainerAllocation((gpu(1),), {gpu(1): Share(250, 4096)})}, "app")
    create(rewriter, req, "c1")
    env = {kv.key: kv.value.decode() for kv in req.config.envs}
    dirs = supervisor.dirs(gpu(1))
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(dirs.pipe)
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(dirs.log)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert env["KUBEGPU_GPU_SHARES"] == f"{gpu(1)}:250:4096"
    mounts = {m.container_path: (m.host_path, m.readonly) for m in req.config.mounts}
    assert mounts == {
        str(dirs.pipe): (str(dirs.pipe), True),
        str(dirs.log): (str(dirs.log), True),
        "/dev/shm": (str(dirs.shm), False),
    }
    (started,) = events(control, "started")
    assert started["visible"] == gpu(1)
    assert supervisor.is_running(gpu(1))


def test_whole_gpu_container_is_not_an_mps_client(
    node: tuple[AllocationRewriter, MpsSupervisor, Path],
) -> None:
    rewriter, supervisor, control = node
    req = request({"app": ContainerAllocation((gpu(2),))}, "app")
    create(rewriter, req, "c1")
    env = {kv.key: kv.value.decode() for kv in req.config.envs}
    assert not {k for k in env if k.startswith("CUDA_MPS_") and k != "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}
    assert [m.container_path for m in req.config.mounts] == ["/dev/shm/"]  # the user's own, untouched
    assert events(control, "started") == []


def test_daemon_that_cannot_start_refuses_with_unavailable_and_frees_the_share(
    node: tuple[AllocationRewriter, MpsSupervisor, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    rewriter, supervisor, _ = node
    monkeypatch.setenv("STANDIN_FAIL", "start")
    req = request({"app": ContainerAllocation((gpu(0),), {gpu(0): Share(600, 1024)})}, "app")
    with pytest.raises(Rejected) as caught:
        asyncio.run(rewriter.create_container(req))
    assert caught.value.code is grpc.StatusCode.UNAVAILABLE
    assert f"GPU {gpu(0)}" in caught.value.message and "cannot start" in caught.value.message
    assert rewriter.ledger.holdings() == []
    # The node now advertises that GPU's shares as not enforced (until it works again).
    inventory = rewriter.node_devices.current_inventory()
    sharing = {d.id: d.attributes["sharing"] for d in inventory.devices}
    assert sharing[gpu(0)] == "advisory" and sharing[gpu(1)] == "mps"
    monkeypatch.delenv("STANDIN_FAIL")
    create(rewriter, req, "c1")  # kubelet's retry succeeds
    assert supervisor.is_running(gpu(0))


def test_share_beside_another_gpu_is_refused(node: tuple[AllocationRewriter, MpsSupervisor, Path]) -> None:
    rewriter, _, control = node
    req = request({"app": ContainerAllocation((gpu(0), gpu(3)), {gpu(0): Share(500)})}, "app")
    with pytest.raises(Rejected) as caught:
        asyncio.run(rewriter.create_container(req))
    assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "exactly one GPU" in caught.value.message
    assert rewriter.ledger.holdings() == []
    assert events(control, "started") == []


def test_last_share_leaving_stops_the_daemon(node: tuple[AllocationRewriter, MpsSupervisor, Path]) -> None:
    rewriter, supervisor, control = node
    first = request({"a": ContainerAllocation((gpu(3),), {gpu(3): Share(300, 2048)})}, "a")
    second = request({"b": ContainerAllocation((gpu(3),), {gpu(3): Share(300, 2048)})}, "b")
    create(rewriter, first, "c-first")
    create(rewriter, second, "c-second")
    assert len(events(control, "started")) == 1  # one daemon per GPU, shared by its clients
    rewriter.removed_container("c-first")
    rewriter.node_devices.sharing.reconcile()  # type: ignore[union-attr]
    assert supervisor.is_running(gpu(3))  # the second share still uses it
    rewriter.removed_sandbox(second.pod_sandbox_id)
    wait_for(lambda: gpu(3) not in supervisor.known())  # stopped, its directories gone
    assert not supervisor.is_running(gpu(3))
    assert [c["command"] for c in events(control, "command")] == ["quit"]


def test_failed_create_releases_and_the_daemon_goes(
    node: tuple[AllocationRewriter, MpsSupervisor, Path],
) -> None:
    rewriter, supervisor, _ = node
    req = request({"a": ContainerAllocation((gpu(2),), {gpu(2): Share(300, 2048)})}, "a")

    async def run() -> None:
        _, done = await rewriter.create_container(req)
        assert done is not None
        done(None)  # containerd refused the create

    asyncio.run(run())
    wait_for(lambda: gpu(2) not in supervisor.known())


def test_user_mounts_at_or_inside_the_clients_mounts_are_dropped(
    node: tuple[AllocationRewriter, MpsSupervisor, Path],
) -> None:
    rewriter, supervisor, _ = node
    req = request({"app": ContainerAllocation((gpu(0),), {gpu(0): Share(250, 2048)})}, "app")
    dirs = supervisor.dirs(gpu(0))
    spelled = ["/dev/shm/cache", "//dev/shm", "/dev/./shm/../shm/x/", f"{dirs.pipe}/sub", f"{dirs.log}//y"]
    for path in [*spelled, "/dev/shmem", "/data"]:
        req.config.mounts.add(host_path="/var/lib/kubelet/pods/x/volumes/v", container_path=path)
    create(rewriter, req, "c1")
    paths = sorted(m.container_path for m in req.config.mounts)
    assert paths == sorted(["/data", "/dev/shmem", str(dirs.pipe), str(dirs.log), "/dev/shm"])


def test_a_whole_gpu_container_never_starts_beside_the_gpus_mps_daemon(tmp_path: Path) -> None:
    """A share of GPU 3 ended, but its container was never removed (kubelet removes containers
    late); a whole-GPU pod's create finds the exited holder, drops it from the ledger and takes the
    GPU. The GPU's daemon must be gone, and its compute mode back to DEFAULT, before that container
    exists: in EXCLUSIVE_PROCESS mode beside an MPS server its CUDA processes find the GPU busy."""
    control = write_standin(tmp_path / "bin")
    modes: list[tuple[str, bool]] = []
    supervisor = MpsSupervisor(
        str(control),
        tmp_path / "mps",
        private_shm=False,
        stop_timeout=5.0,
        compute_mode=lambda g, exclusive: modes.append((g, exclusive)),
    )
    plugins = load_plugins(["sim"], {"node_name": NODE, "topology": "pcie-4gpu", "state_dir": str(tmp_path)})
    sharing = MpsSharing(supervisor, interval=3600.0)  # no watchdog pass during the test
    node_devices = NodeDevices(plugins, sysfs_root=None, sharing=sharing)
    node_devices.discover()
    rewriter = AllocationRewriter(NODE, node_devices, KeyRing(None, KEYS))
    rewriter.rebuilt.set()
    sharing.start(rewriter._shared_devices)
    try:
        create(
            rewriter,
            request({"a": ContainerAllocation((gpu(3),), {gpu(3): Share(300, 2048)})}, "a"),
            "c-share",
        )
        sharing.reconcile()
        assert supervisor.is_running(gpu(3)) and modes == [(gpu(3), True)]
        rewriter.ledger.remove_container("c-share")  # what _reserve does with an exited holder
        create(rewriter, request({"w": ContainerAllocation((gpu(3),))}, "w"), "c-whole")
        assert not supervisor.is_running(gpu(3))
        assert modes == [(gpu(3), True), (gpu(3), False)]
        assert [c["command"] for c in events(control, "command")] == ["quit"]
    finally:
        sharing.close()
        supervisor.stop_all()
