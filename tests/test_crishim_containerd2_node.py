"""The shim with simulated devices in front of containerd 2.x: CDI annotations, checkpoint restore.

containerd 2.x (CDI on, specs from the instance's own directory) reads every ``cdi.k8s.io/``
container annotation as a comma-separated list of qualified CDI names and applies the specs'
edits. Here two specs stand in for two vendors: ``example.com/net`` (another device plugin's NIC)
and ``nvidia.com/gpu`` (what the shim manages); each device only sets an environment variable,
which the container prints. The shim must take out the managed entries and leave the other
vendor's, and refuse an entry it cannot read that names a managed vendor.

containerd 2.x also takes a CreateContainer whose image names a file as a checkpoint archive to
restore from, giving the container the checkpoint's annotations: on a device node the shim
refuses it before containerd sees it.
"""

from __future__ import annotations

import json
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from kubegpu.devenv.shimproc import ShimProcess, sim_node_args
from tests.fixtures.keys import write_node_keys

pytestmark = pytest.mark.containerd

NODE = "node-cdi"
SPECS = {
    "example-net.json": {
        "cdiVersion": "0.5.0",
        "kind": "example.com/net",
        "devices": [
            {"name": "eth1", "containerEdits": {"env": ["EXAMPLE_NIC_ETH1=yes"]}},
            {"name": "eth2", "containerEdits": {"env": ["EXAMPLE_NIC_ETH2=yes"]}},
        ],
    },
    "nvidia-gpu.json": {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "all", "containerEdits": {"env": ["FORGED_GPU_ALL=yes"]}},
            {"name": "0", "containerEdits": {"env": ["FORGED_GPU_0=yes"]}},
        ],
    },
}


@dataclass
class CdiNode:
    client: CriClient
    direct: CriClient
    logs: Path
    sandboxes: list[str]

    def sandbox(self, name: str) -> tuple[str, api_pb2.PodSandboxConfig]:
        (self.logs / name).mkdir(parents=True, exist_ok=True)
        config = host_network_sandbox(name, str(uuid.uuid4()), log_directory=str(self.logs / name))
        made = self.direct.runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=config), timeout=60)
        self.sandboxes.append(made.pod_sandbox_id)
        return made.pod_sandbox_id, config

    def request(self, name: str, annotations: dict[str, str]) -> api_pb2.CreateContainerRequest:
        sandbox, config = self.sandbox(name)
        request = api_pb2.CreateContainerRequest(
            pod_sandbox_id=sandbox,
            sandbox_config=config,
            config=shell_container("app", BUSYBOX_IMAGE, "env; echo END", log_path="app.log"),
        )
        request.config.annotations.update(annotations)
        return request

    def run(self, client: CriClient, name: str, annotations: dict[str, str]) -> tuple[str, dict[str, str]]:
        """Create and start a container printing its environment: (its output, its annotations)."""
        request = self.request(name, annotations)
        container = client.runtime.CreateContainer(request, timeout=60).container_id
        client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container), timeout=60)
        log = self.logs / name / "app.log"
        deadline = time.monotonic() + 30
        while not (log.exists() and "END" in log.read_text()):
            assert time.monotonic() < deadline, f"no output from {name}"
            time.sleep(0.05)
        status = self.direct.runtime.ContainerStatus(
            api_pb2.ContainerStatusRequest(container_id=container), timeout=30
        ).status
        return log.read_text(), dict(status.annotations)

    def containers_in(self, sandbox: str) -> list[str]:
        listing = self.direct.runtime.ListContainers(
            api_pb2.ListContainersRequest(filter=api_pb2.ContainerFilter(pod_sandbox_id=sandbox))
        )
        return [c.id for c in listing.containers]


@pytest.fixture
def cdi_node(
    containerd2: Containerd,
    shim2_factory: Callable[..., ShimProcess],
    direct2: CriClient,
    tmp_path: Path,
) -> Iterator[CdiNode]:
    for name, spec in SPECS.items():
        (containerd2.cdi_spec_dir / name).write_text(json.dumps(spec))
    keys = write_node_keys(tmp_path / "keys")
    shim = shim2_factory(
        extra_args=[*sim_node_args(NODE, "dgx1-v100", tmp_path / "sim", keys), "--no-pod-cache"]
    )
    client = CriClient(shim.endpoint)
    node = CdiNode(client, direct2, tmp_path / "logs", [])
    try:
        yield node
    finally:
        client.close()
        for sandbox in node.sandboxes:
            try:
                direct2.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox))
                direct2.runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox))
            except grpc.RpcError:
                pass
        for name in SPECS:
            (containerd2.cdi_spec_dir / name).unlink(missing_ok=True)


ANNOTATIONS = {
    "cdi.k8s.io/nic": "example.com/net=eth1",
    "cdi.k8s.io/gpu": "nvidia.com/gpu=all",
    "cdi.k8s.io/mixed": "nvidia.com/gpu=0,example.com/net=eth2",
}


def test_another_vendors_cdi_annotation_reaches_containerd_and_ours_do_not(cdi_node: CdiNode) -> None:
    """Straight to containerd every entry is injected (the specs work); through the shim the NIC
    entries are still injected and the GPU entries are gone, the mixed annotation rewritten."""
    direct_output, _ = cdi_node.run(cdi_node.direct, "cdi-direct", ANNOTATIONS)
    for variable in ("EXAMPLE_NIC_ETH1", "EXAMPLE_NIC_ETH2", "FORGED_GPU_ALL", "FORGED_GPU_0"):
        assert f"{variable}=yes" in direct_output, direct_output
    output, annotations = cdi_node.run(cdi_node.client, "cdi-shim", ANNOTATIONS)
    assert "EXAMPLE_NIC_ETH1=yes" in output and "EXAMPLE_NIC_ETH2=yes" in output, output
    assert "FORGED_GPU" not in output, output
    assert annotations["cdi.k8s.io/nic"] == "example.com/net=eth1"
    assert annotations["cdi.k8s.io/mixed"] == "example.com/net=eth2"
    assert "cdi.k8s.io/gpu" not in annotations


def test_an_unreadable_entry_naming_a_managed_vendor_is_refused_by_name(cdi_node: CdiNode) -> None:
    """containerd itself fails the whole create for an entry that is not a qualified name (so a
    refusal loses nothing that would have run); the shim says which annotation and creates nothing."""
    annotations = {"cdi.k8s.io/nic": "example.com/net=eth1", "cdi.k8s.io/gpu": "nvidia.com/gpu=all "}
    direct = cdi_node.request("cdi-bad-direct", annotations)
    with pytest.raises(grpc.RpcError) as at_containerd:
        cdi_node.direct.runtime.CreateContainer(direct, timeout=60)
    assert "CDI" in at_containerd.value.details(), at_containerd.value.details()
    request = cdi_node.request("cdi-bad-shim", annotations)
    with pytest.raises(grpc.RpcError) as caught:
        cdi_node.client.runtime.CreateContainer(request, timeout=60)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert "'cdi.k8s.io/gpu'" in caught.value.details() and "default/cdi-bad-shim" in caught.value.details()
    assert cdi_node.containers_in(request.pod_sandbox_id) == []


def test_a_create_from_a_checkpoint_archive_is_refused_before_containerd_restores_it(
    cdi_node: CdiNode, tmp_path: Path
) -> None:
    archive = tmp_path / "checkpoint.tar"
    with tarfile.open(archive, "w"):
        pass
    direct = cdi_node.request("ckpt-direct", {})
    direct.config.image.image = str(archive)
    with pytest.raises(grpc.RpcError) as at_containerd:  # containerd reads the file as a checkpoint
        cdi_node.direct.runtime.CreateContainer(direct, timeout=60)
    assert "checkpoint" in at_containerd.value.details().lower(), at_containerd.value.details()
    request = cdi_node.request("ckpt-shim", {})
    request.config.image.image = str(archive)
    with pytest.raises(grpc.RpcError) as caught:
        cdi_node.client.runtime.CreateContainer(request, timeout=60)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION, caught.value.details()
    assert f"image {str(archive)!r} is a file" in caught.value.details()
    assert cdi_node.containers_in(request.pod_sandbox_id) == []


def test_restore_pod_is_refused_and_this_containerd_has_none(cdi_node: CdiNode) -> None:
    method = "/runtime.v1.RuntimeService/RestorePod"
    request = api_pb2.RestorePodRequest(checkpoint_path="/nonexistent/checkpoint.tar").SerializeToString()
    with pytest.raises(grpc.RpcError) as caught:
        cdi_node.client.channel.unary_unary(method)(request, timeout=30)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION, caught.value.details()
    with pytest.raises(grpc.RpcError) as direct:
        cdi_node.direct.channel.unary_unary(method)(request, timeout=30)
    assert direct.value.code() is grpc.StatusCode.UNIMPLEMENTED, direct.value.details()
