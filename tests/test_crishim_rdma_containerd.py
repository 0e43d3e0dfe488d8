"""RDMA interfaces through real containerd (issue #25): the RDMA plugin reads a fake sysfs tree whose
device nodes are real char devices (tests/support/rdmanode.py), and the containers print ``env``
and ``ls -l /dev/infiniband`` to their CRI log: that is the proof of what they were given.

Through the CRI proxy (containerd 1.6, ``kubegpu crishim --device-plugin rdma``): a pod allocated two
VFs gets exactly their verbs nodes and rdma_cm, and ``NCCL_IB_HCA`` naming only them, in each of
its containers; another pod given one of them, another pod's allocation and a forged one are
refused; a container mounting /dev/infiniband or asking for a uverbs node without an allocation is
refused. Through the NRI front (containerd 2.2.9): the same grant, and the mount refused. Every
refusal leaves no container behind.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from crishim.nri.agent import NriAgent
from crishim.nri.plugin import PluginSession
from crishim.rewrite import AllocationRewriter, NodeDevices
from devices.rdma import RdmaPlugin
from kubegpu.allocation import KeyRing
from kubegpu.devenv.containerd import Containerd
from kubegpu.devenv.cri import CriClient
from kubegpu.devenv.shimproc import ShimProcess
from tests.fixtures.keys import OTHER_KEY, SIGNING, write_node_keys
from tests.support.crisandboxes import remove_sandbox, remove_sandboxes_since, sandbox_ids
from tests.support.rdmanode import build_sriov_machine, rdma_allocation, rdma_shim_args
from tests.test_crishim_rewrite import Node
from tests.test_nri_agent import Pods
from tests.test_nri_transport import PLUGIN, PluginThread, nri_containerd

pytestmark = pytest.mark.containerd

__all__ = ["nri_containerd"]  # the module fixture of tests/test_nri_transport.py
NODE = "rdma-node"
SCRIPT = "env; echo ---; ls -l /dev/infiniband 2>&1; echo END; exec sleep 100000"


def seen(output: str) -> tuple[dict[str, str], list[str]]:
    """(env, the char device names listed in /dev/infiniband) from a container's output."""
    env_part, _, dev_part = output.partition("---")
    env = dict(line.split("=", 1) for line in env_part.strip().splitlines() if "=" in line)
    return env, sorted(line.split()[-1] for line in dev_part.splitlines() if line.startswith("c"))


@dataclass
class RdmaNode(Node):
    """tests/test_crishim_rewrite.py's Node, its shim running the RDMA plugin over the fake SR-IOV
    machine (``state_dir``) whose /dev/infiniband is ``dev``; the tests create containers with
    ``script=SCRIPT``, which lists it."""

    dev: Path = Path()

    def refused(self, name: str, annotation: str | None, uid: str, **asks: object) -> grpc.RpcError:
        """Create container ``app`` of a new pod; it must be refused and leave no container."""
        sandbox, config = self.run_pod(name, annotation, uid)
        with pytest.raises(grpc.RpcError) as caught:
            self.create(sandbox, config, "app", script=SCRIPT, **asks)  # type: ignore[arg-type]
        assert self.containers_in(sandbox) == []
        return caught.value


@pytest.fixture
def node(containerd: Containerd, tmp_path: Path, direct: CriClient) -> Iterator[RdmaNode]:
    root = tmp_path / "machine"
    dev = build_sriov_machine(root)
    keys = write_node_keys(tmp_path / "keys")
    shim = ShimProcess(
        socket=Path(f"/tmp/kgshim-rdma-{uuid.uuid4().hex[:8]}.sock"),
        runtime_endpoint=containerd.endpoint,
        log_path=tmp_path / "crishim.log",
        extra_args=rdma_shim_args(root, NODE, keys),
    ).start()
    client = CriClient(shim.endpoint)
    before = sandbox_ids(direct)
    yield RdmaNode(shim, client, direct, root, tmp_path / "logs", dev)
    client.close()
    shim.stop()
    remove_sandboxes_since(direct, before)


def test_a_pod_gets_exactly_its_two_vfs_and_no_other_pod_gets_them(node: RdmaNode) -> None:
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod("two-vfs", rdma_allocation(NODE, uid, ["mlx5_1", "mlx5_3"]), uid)
    train = node.create(sandbox, config, "train", envs={"NCCL_IB_HCA": "mlx5"}, script=SCRIPT)
    env, devices = seen(node.start_and_read(train, "two-vfs", "train"))
    assert devices == ["rdma_cm", "uverbs1", "uverbs3"]  # not uverbs0 (the PF) nor uverbs2
    assert env["NCCL_IB_HCA"] == "=mlx5_1,mlx5_3"
    # every container of the pod: the VFs are pod-wide
    side = node.create(sandbox, config, "side", script=SCRIPT)
    env, devices = seen(node.start_and_read(side, "two-vfs", "side"))
    assert devices == ["rdma_cm", "uverbs1", "uverbs3"] and env["NCCL_IB_HCA"] == "=mlx5_1,mlx5_3"

    other = str(uuid.uuid4())
    taken = node.refused("taken", rdma_allocation(NODE, other, ["mlx5_2", "mlx5_3"]), other)
    assert taken.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "mlx5_3" in (taken.details() or "") and "goes to one pod" in (taken.details() or "")
    stolen = node.refused("stolen", rdma_allocation(NODE, uid, ["mlx5_2"]), str(uuid.uuid4()))
    assert "allocation is for pod UID" in (stolen.details() or "")
    forged = node.refused("forged", rdma_allocation(NODE, other, ["mlx5_2"], key=OTHER_KEY), other)
    assert forged.code() is grpc.StatusCode.INVALID_ARGUMENT and "signature" in (forged.details() or "")

    # the pod's VFs come free with its sandbox: then another pod gets mlx5_3
    remove_sandbox(node.client, sandbox)
    sandbox, config = node.run_pod("next", rdma_allocation(NODE, other, ["mlx5_3"]), other)
    app = node.create(sandbox, config, "app", script=SCRIPT)
    env, devices = seen(node.start_and_read(app, "next", "app"))
    assert devices == ["rdma_cm", "uverbs3"] and env["NCCL_IB_HCA"] == "=mlx5_3"


def test_a_container_asking_for_rdma_devices_itself_is_refused(node: RdmaNode) -> None:
    dev = str(node.dev)
    for name, asks in (
        ("mount", {"mounts": [(dev, "/dev/infiniband")]}),
        ("verbs", {"devices": [(f"{dev}/uverbs2", "/dev/infiniband/uverbs2")]}),
    ):
        uid = str(uuid.uuid4())
        error = node.refused(name, None, uid, **asks)
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert "RDMA" in (error.details() or ""), error.details()
    # with an allocation, a mount of the directory is refused all the same
    uid = str(uuid.uuid4())
    error = node.refused("mount-alloc", rdma_allocation(NODE, uid, ["mlx5_1"]), uid, mounts=[(dev, "/ib")])
    assert "reaches the node's RDMA devices" in (error.details() or "")


def test_the_nri_front_gives_a_pod_its_vfs_and_refuses_a_mount_of_them(
    nri_containerd: Containerd, tmp_path: Path
) -> None:
    assert nri_containerd.nri_socket is not None
    root = tmp_path / "machine"
    dev = build_sriov_machine(root)
    devices = NodeDevices([RdmaPlugin(str(root))], sysfs_root=str(root))
    devices.discover()
    agent = NriAgent(AllocationRewriter(NODE, devices, KeyRing(None, SIGNING)))
    plugin = PluginThread(PluginSession(agent, socket=nri_containerd.nri_socket, name=PLUGIN))
    pods = Pods(nri_containerd, tmp_path / "logs")
    try:
        plugin.synchronize()
        granted = pods.create(
            "vfs",
            lambda uid: rdma_allocation(NODE, uid, ["mlx5_1", "mlx5_2"]),
            envs={"NCCL_IB_HCA": "x"},
            script=SCRIPT,
        )
        assert isinstance(granted, str), granted
        env, listed = seen(pods.output(granted, "vfs"))
        assert listed == ["rdma_cm", "uverbs1", "uverbs2"]
        assert env["NCCL_IB_HCA"] == "=mlx5_1,mlx5_2"
        assert sorted(h.device for h in agent.rewriter.ledger.holdings() if h.pod_wide) == [
            "mlx5_1",
            "mlx5_2",
        ]

        taken = pods.create("taken", lambda uid: rdma_allocation(NODE, uid, ["mlx5_2"]), script=SCRIPT)
        assert isinstance(taken, grpc.RpcError) and "goes to one pod" in (taken.details() or "")
        mount = pods.create("mount", None, mounts=[(str(dev), "/dev/infiniband")], script=SCRIPT)
        assert isinstance(mount, grpc.RpcError)
        assert "reaches the node's RDMA devices" in (mount.details() or ""), mount.details()
        verbs = pods.create(
            "verbs", None, devices=[(f"{dev}/uverbs3", "/dev/infiniband/uverbs3")], script=SCRIPT
        )
        assert isinstance(verbs, grpc.RpcError)
        assert "holds no RDMA interfaces" in (verbs.details() or ""), verbs.details()
    finally:
        pods.close()
        plugin.stop()
