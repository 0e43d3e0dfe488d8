"""CreateContainer rewrite through the shim against a real containerd with simulated GPUs.

The containers print ``env`` and ``ls -l /dev/kubegpu-sim`` to their CRI log: that is the proof
of what they were given. Every rejection must leave no container behind.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2
from devices.sim import sim_gpu_id
from kubegpu.allocation import ANNOTATION, Allocation, ContainerAllocation, Share, SigningKey, sign
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from kubegpu.devenv.shimproc import ShimProcess, sim_node_args
from tests.fixtures.keys import KEY, KEY_ID, OTHER_KEY, write_node_keys

pytestmark = pytest.mark.containerd

NODE = "node-a"


def gpu(index: int) -> str:
    return sim_gpu_id(NODE, index)


@dataclass
class Node:
    """A shim with the sim plugin (dgx1-v100) in front of the session containerd."""

    shim: ShimProcess
    client: CriClient
    direct: CriClient
    state_dir: Path
    logs: Path

    def signed(
        self,
        pod_uid: str,
        containers: dict[str, list[str]],
        node: str = NODE,
        shares: dict[str, dict[str, Share]] | None = None,
        key: SigningKey = KEY,
    ) -> str:
        allocation = Allocation(
            node,
            pod_uid,
            {
                name: ContainerAllocation(tuple(devs), (shares or {}).get(name, {}))
                for name, devs in containers.items()
            },
        )
        return sign(allocation, KEY_ID, key)

    def run_pod(
        self,
        name: str,
        annotation: str | None,
        uid: str | None = None,
    ) -> tuple[str, api_pb2.PodSandboxConfig]:
        uid = uid or str(uuid.uuid4())
        annotations = {ANNOTATION: annotation} if annotation is not None else {}
        log_dir = self.logs / name
        log_dir.mkdir(parents=True, exist_ok=True)
        config = host_network_sandbox(name, uid, log_directory=str(log_dir), annotations=annotations)
        sandbox = self.client.runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=config), timeout=60)
        return sandbox.pod_sandbox_id, config

    def create(
        self,
        sandbox: str,
        config: api_pb2.PodSandboxConfig,
        container: str,
        envs: dict[str, str] | None = None,
        script: str = "",
        attempt: int = 0,
    ) -> str:
        script = script or "env; echo ---; ls -l /dev/kubegpu-sim 2>&1; echo END; exec sleep 100000"
        request = api_pb2.CreateContainerRequest(
            pod_sandbox_id=sandbox,
            sandbox_config=config,
            config=shell_container(container, BUSYBOX_IMAGE, script, log_path=f"{container}.log", envs=envs),
        )
        request.config.metadata.attempt = attempt
        return self.client.runtime.CreateContainer(request, timeout=60).container_id

    def start_and_read(self, container_id: str, pod: str, container: str) -> str:
        self.client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container_id))
        log = self.logs / pod / f"{container}.log"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if log.exists() and "END" in log.read_text():
                return "\n".join(line.split(" ", 3)[-1] for line in log.read_text().splitlines())
            time.sleep(0.05)
        raise AssertionError(f"no output from {container}")

    def containers_in(self, sandbox: str) -> list[str]:
        listing = self.direct.runtime.ListContainers(
            api_pb2.ListContainersRequest(filter=api_pb2.ContainerFilter(pod_sandbox_id=sandbox))
        )
        return [c.id for c in listing.containers]

    def restart_shim(self, kill: bool = True) -> None:
        if kill:
            self.shim.kill()
        self.shim.start()


@pytest.fixture
def node(containerd: Containerd, tmp_path: Path, direct: CriClient) -> Iterator[Node]:
    keys = write_node_keys(tmp_path / "keys")
    state = tmp_path / "sim"
    shim = ShimProcess(
        socket=Path(f"/tmp/kgshim-rw-{uuid.uuid4().hex[:8]}.sock"),
        runtime_endpoint=containerd.endpoint,
        log_path=tmp_path / "crishim.log",
        extra_args=[*sim_node_args(NODE, "dgx1-v100", str(state), str(keys)), "--health-interval", "0.2"],
    ).start()
    client = CriClient(shim.endpoint)
    sandboxes_before = {s.id for s in direct.runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest()).items}
    yield Node(shim, client, direct, state, tmp_path / "logs")
    client.close()
    shim.stop()
    for sandbox in direct.runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest()).items:
        if sandbox.id not in sandboxes_before:
            direct.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox.id))
            direct.runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox.id))


def visible(output: str) -> tuple[dict[str, str], list[str]]:
    env_part, _, dev_part = output.partition("---")
    env = dict(line.split("=", 1) for line in env_part.strip().splitlines() if "=" in line)
    devices = [line.split()[-1] for line in dev_part.splitlines() if line.startswith("c")]
    return env, sorted(devices)


def test_container_gets_exactly_its_devices(node: Node) -> None:
    uid = str(uuid.uuid4())
    annotation = node.signed(uid, {"train": [gpu(0), gpu(3)], "side": [gpu(5)]})
    sandbox, config = node.run_pod("exact", annotation, uid)
    train = node.create(sandbox, config, "train", envs={"NVIDIA_VISIBLE_DEVICES": "all"})
    env, devices = visible(node.start_and_read(train, "exact", "train"))
    assert devices == ["gpu0", "gpu3"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{gpu(0)},{gpu(3)}"  # the user's "all" is gone
    assert env["KUBEGPU_VISIBLE_DEVICES"] == f"{gpu(0)},{gpu(3)}"
    side = node.create(sandbox, config, "side")
    env, devices = visible(node.start_and_read(side, "exact", "side"))
    assert devices == ["gpu5"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == gpu(5)


def test_container_without_allocation_sees_nothing(node: Node) -> None:
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod("plain", node.signed(uid, {"train": [gpu(1)]}), uid)
    # "helper" is not in the allocation; it tries to grant itself devices by env.
    helper = node.create(
        sandbox, config, "helper", envs={"NVIDIA_VISIBLE_DEVICES": "all", "KUBEGPU_VISIBLE_DEVICES": gpu(1)}
    )
    env, devices = visible(node.start_and_read(helper, "plain", "helper"))
    assert devices == []
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "KUBEGPU_VISIBLE_DEVICES" not in env
    # A pod with no annotation at all: same.
    sandbox, config = node.run_pod("noalloc", None)
    lone = node.create(sandbox, config, "lone", envs={"NVIDIA_VISIBLE_DEVICES": "0,1"})
    env, devices = visible(node.start_and_read(lone, "noalloc", "lone"))
    assert devices == [] and env["NVIDIA_VISIBLE_DEVICES"] == "void"


REJECTIONS: list[tuple[str, Callable[[Node, str], str], grpc.StatusCode, str]] = [
    ("malformed", lambda n, uid: "{not json", grpc.StatusCode.INVALID_ARGUMENT, "not JSON"),
    (
        "unsigned",
        lambda n, uid: json.dumps(
            {k: v for k, v in json.loads(n.signed(uid, {"app": [gpu(0)]})).items() if k != "signature"}
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unsigned",
    ),
    (
        "badsig",
        lambda n, uid: n.signed(uid, {"app": [gpu(0)]}, key=OTHER_KEY),
        grpc.StatusCode.INVALID_ARGUMENT,
        "does not verify",
    ),
    (
        "othernode",
        lambda n, uid: n.signed(uid, {"app": [gpu(0)]}, node="node-b"),
        grpc.StatusCode.FAILED_PRECONDITION,
        "for node 'node-b'",
    ),
    (
        "otheruid",
        lambda n, uid: n.signed(str(uuid.uuid4()), {"app": [gpu(0)]}),
        grpc.StatusCode.FAILED_PRECONDITION,
        "for pod UID",
    ),
    (
        "unknown",
        lambda n, uid: n.signed(uid, {"app": ["GPU-00000000-0000-0000-0000-000000000000"]}),
        grpc.StatusCode.FAILED_PRECONDITION,
        "not on this node",
    ),
    (
        "othernodegpu",
        lambda n, uid: n.signed(uid, {"app": [sim_gpu_id("node-b", 0)]}),
        grpc.StatusCode.FAILED_PRECONDITION,
        "not on this node",
    ),
]


@pytest.mark.parametrize(("case", "make", "code", "reason"), REJECTIONS, ids=[r[0] for r in REJECTIONS])
def test_rejections_create_nothing(
    node: Node, case: str, make: Callable[[Node, str], str], code: grpc.StatusCode, reason: str
) -> None:
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod(f"rej-{case}", make(node, uid), uid)
    with pytest.raises(grpc.RpcError) as caught:
        node.create(sandbox, config, "app")
    assert caught.value.code() is code
    assert reason in caught.value.details() and f"default/rej-{case}" in caught.value.details()
    assert node.containers_in(sandbox) == []


def test_unhealthy_device_is_refused(node: Node) -> None:
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod("sick", node.signed(uid, {"app": [gpu(2)]}), uid)
    (node.state_dir / "unhealthy").write_text(gpu(2) + "\n")
    time.sleep(1.0)  # health is re-read every 0.2 s
    with pytest.raises(grpc.RpcError) as caught:
        node.create(sandbox, config, "app")
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "unhealthy" in caught.value.details()
    assert node.containers_in(sandbox) == []
    (node.state_dir / "unhealthy").write_text("")
    time.sleep(1.0)
    assert node.create(sandbox, config, "app")


def test_device_held_by_a_live_container_of_another_pod(node: Node) -> None:
    first_uid, second_uid = str(uuid.uuid4()), str(uuid.uuid4())
    first, first_config = node.run_pod("holder", node.signed(first_uid, {"app": [gpu(4)]}), first_uid)
    holder = node.create(first, first_config, "app")
    node.client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=holder))
    second, second_config = node.run_pod("taker", node.signed(second_uid, {"app": [gpu(4)]}), second_uid)
    with pytest.raises(grpc.RpcError) as caught:
        node.create(second, second_config, "app")
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert gpu(4) in caught.value.details() and "held by" in caught.value.details()
    assert node.containers_in(second) == []

    # The ledger survives a SIGKILL of the shim: rebuilt from containerd's containers.
    node.restart_shim(kill=True)
    with pytest.raises(grpc.RpcError) as again:
        node.create(second, second_config, "app")
    assert again.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert node.containers_in(second) == []

    # RemoveContainer frees the device.
    node.client.runtime.StopContainer(api_pb2.StopContainerRequest(container_id=holder, timeout=0))
    node.client.runtime.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=holder))
    taken = node.create(second, second_config, "app")
    env, devices = visible(node.start_and_read(taken, "taker", "app"))
    assert devices == ["gpu4"]


def test_restart_of_the_same_pod_reuses_its_devices(node: Node) -> None:
    """kubelet restarts a container by creating a new one while the exited one still exists."""
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod("again", node.signed(uid, {"app": [gpu(6)]}), uid)
    first = node.create(sandbox, config, "app")
    node.start_and_read(first, "again", "app")
    second = node.create(sandbox, config, "app", attempt=1)
    assert second != first


def test_exited_holder_of_another_pod_does_not_block(node: Node) -> None:
    first_uid, second_uid = str(uuid.uuid4()), str(uuid.uuid4())
    first, first_config = node.run_pod("done", node.signed(first_uid, {"app": [gpu(7)]}), first_uid)
    finished = node.create(first, first_config, "app", script="echo END")
    node.client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=finished))
    deadline = time.monotonic() + 20
    while (
        node.client.runtime.ContainerStatus(
            api_pb2.ContainerStatusRequest(container_id=finished)
        ).status.state
        != api_pb2.CONTAINER_EXITED
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second, second_config = node.run_pod("next", node.signed(second_uid, {"app": [gpu(7)]}), second_uid)
    assert node.create(second, second_config, "app")


def test_fractional_shares_fit_together(node: Node) -> None:
    uids = [str(uuid.uuid4()) for _ in range(3)]
    shares = [600, 400, 100]
    made = []
    for index, (uid, milli) in enumerate(zip(uids, shares, strict=True)):
        annotation = node.signed(uid, {"app": [gpu(1)]}, shares={"app": {gpu(1): Share(milli, 4096)}})
        sandbox, config = node.run_pod(f"share{index}", annotation, uid)
        made.append((sandbox, config))
    first = node.create(*made[0], "app")
    node.create(*made[1], "app")
    env, devices = visible(node.start_and_read(first, "share0", "app"))
    assert devices == ["gpu1"] and env["KUBEGPU_GPU_SHARES"] == f"{gpu(1)}:600:4096"
    with pytest.raises(grpc.RpcError) as caught:
        node.create(*made[2], "app")  # 600 + 400 + 100 > 1000
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
