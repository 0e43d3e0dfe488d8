"""CreateContainer rewrite through the shim against a real containerd with simulated GPUs.

The containers print ``env`` and ``ls -l /dev/kubegpu-sim`` to their CRI log: that is the proof
of what they were given. Every rejection must leave no container behind.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2
from crishim.ledger import MARK_ANNOTATION, mark_value
from devices.sim import sim_gpu_id
from kubegpu.allocation import ANNOTATION, Allocation, ContainerAllocation, Share, SigningKey, sign
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from kubegpu.devenv.shimproc import ShimProcess, sim_node_args
from tests.fixtures.keys import KEY, KEY_ID, OTHER_KEY, write_node_keys
from tests.support.crisandboxes import remove_sandboxes_since, sandbox_ids
from tests.support.waiting import wait_for

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
        devices: list[tuple[str, str]] | None = None,
        mounts: list[tuple[str, str]] | None = None,
    ) -> str:
        script = script or "env; echo ---; ls -l /dev/kubegpu-sim 2>&1; echo END; exec sleep 100000"
        request = api_pb2.CreateContainerRequest(
            pod_sandbox_id=sandbox,
            sandbox_config=config,
            config=shell_container(container, BUSYBOX_IMAGE, script, log_path=f"{container}.log", envs=envs),
        )
        request.config.metadata.attempt = attempt
        for host, inside in devices or []:
            request.config.devices.add(host_path=host, container_path=inside, permissions="rwm")
        for host, inside in mounts or []:
            request.config.mounts.add(host_path=host, container_path=inside, readonly=True)
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
    sandboxes_before = sandbox_ids(direct)
    yield Node(shim, client, direct, state, tmp_path / "logs")
    client.close()
    shim.stop()
    remove_sandboxes_since(direct, sandboxes_before)


def visible(output: str) -> tuple[dict[str, str], list[str]]:
    env_part, _, dev_part = output.partition("---")
    env = dict(line.split("=", 1) for line in env_part.strip().splitlines() if "=" in line)
    devices = [line.split()[-1] for line in dev_part.splitlines() if line.startswith("c")]
    return env, sorted(devices)


SharePod = tuple[str, str, api_pb2.PodSandboxConfig]  # uid, sandbox id, sandbox config


def share_pods(node: Node, name: str, device: str, p_milli: int, q_milli: int) -> tuple[SharePod, SharePod]:
    """Pods ``<name>-p`` and ``<name>-q`` with a share of ``device`` each for their container ``app``:
    (uid, sandbox id, sandbox config) of each."""
    pods: list[SharePod] = []
    for suffix, milli in (("p", p_milli), ("q", q_milli)):
        uid = str(uuid.uuid4())
        annotation = node.signed(uid, {"app": [device]}, shares={"app": {device: Share(milli)}})
        pods.append((uid, *node.run_pod(f"{name}-{suffix}", annotation, uid)))
    return pods[0], pods[1]


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
        "nonascii-signature",
        lambda n, uid: json.dumps(
            {**json.loads(n.signed(uid, {"app": [gpu(0)]})), "signature": "é"}, ensure_ascii=False
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "not base64",
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
    counted = f'kubegpu_crishim_calls_total{{code="{code.name}",method="CreateContainer"}} 1.0'

    def metrics() -> str:
        return urllib.request.urlopen(node.shim.metrics_url + "/metrics", timeout=5).read().decode()

    wait_for(lambda: counted in metrics())  # the shim counts a call just after answering it
    assert 'kubegpu_crishim_calls_total{code="OK",method="CreateContainer"} 0.0' in metrics()  # never OK


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


# --- hardening (issue 10): every item that crosses containerd is proven against it ---------------


def test_spelled_device_paths_symlinks_and_toolkit_mounts_are_scrubbed(node: Node, tmp_path: Path) -> None:
    """The scrub decides on what containerd and the toolkit resolve, not on the spelling."""
    dev = node.state_dir / "dev" / "kubegpu-sim"
    link = tmp_path / "innocent-looking"
    link.symlink_to(dev / "gpu4")
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod("spelled", node.signed(uid, {"app": [gpu(0)]}), uid)
    app = node.create(
        sandbox,
        config,
        "app",
        script="ls -l /dev; echo ---; cat /proc/mounts; echo END; exec sleep 100000",
        devices=[
            (f"{dev}/./gpu1", "/dev/spelled-dot"),
            (f"{dev}//gpu2", "/dev/spelled-slashes"),
            (f"{dev}/../kubegpu-sim/gpu3", "/dev/spelled-dotdot"),
            (str(link), "/dev/spelled-link"),
            ("/dev/null", "/dev/plain-null"),  # the sim's nodes are /dev/null's numbers: managed here
            ("/dev/zero", "/dev/kept-zero"),  # not managed: kept
        ],
        mounts=[
            ("/dev/null", "/var/run//nvidia-container-devices/all"),
            ("/dev/null", "/var/run/./nvidia-container-devices/1"),
            ("/dev/null", "/run/../var/run/nvidia-container-devices/2"),
            ("/dev/null", "/var/run/nvidia-container-devicesall"),
        ],
    )
    output = node.start_and_read(app, "spelled", "app")
    devices, _, mounts = output.partition("---")
    assert "kept-zero" in devices and "gpu0" not in devices  # gpu0 is at /dev/kubegpu-sim/gpu0
    for name in ("spelled-dot", "spelled-slashes", "spelled-dotdot", "spelled-link", "plain-null"):
        assert name not in devices, output
    assert "nvidia-container-devices" not in mounts, output


def test_a_directory_holding_managed_nodes_is_refused(node: Node) -> None:
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod("devdir", None, uid)
    with pytest.raises(grpc.RpcError) as caught:
        node.create(sandbox, config, "app", devices=[(str(node.state_dir / "dev"), "/dev/all-of-it")])
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "directory holding managed device nodes" in caught.value.details()
    assert "default/devdir" in caught.value.details() and node.containers_in(sandbox) == []


def test_the_v1alpha2_create_is_refused_not_forwarded(node: Node) -> None:
    """containerd 1.6 still serves runtime.v1alpha2, whose CreateContainer would skip the rewrite."""
    method = "/runtime.v1alpha2.RuntimeService/CreateContainer"
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod("alpha", None, uid)
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=sandbox,
        sandbox_config=config,
        config=shell_container("app", BUSYBOX_IMAGE, "sleep 1", log_path="app.log", envs={"X": "1"}),
    )
    request.config.devices.add(host_path="/dev/null", container_path="/dev/forged", permissions="rwm")
    with pytest.raises(grpc.RpcError) as caught:
        node.client.channel.unary_unary(method)(request.SerializeToString(), timeout=30)
    assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert "runtime.v1" in caught.value.details()
    assert node.containers_in(sandbox) == []
    # The same bytes straight to containerd do create a container: the refusal is what stops it.
    node.direct.channel.unary_unary(method)(request.SerializeToString(), timeout=60)
    assert len(node.containers_in(sandbox)) == 1


def test_shares_of_another_container_of_the_same_pod_count(node: Node) -> None:
    """P holds a:600 and b:400 of one GPU, Q c:400: in the order P/a, Q/c, P/b, P/b is refused."""
    p_uid, q_uid = str(uuid.uuid4()), str(uuid.uuid4())
    device = gpu(3)
    p_annotation = node.signed(
        p_uid,
        {"a": [device], "b": [device]},
        shares={"a": {device: Share(600)}, "b": {device: Share(400)}},
    )
    q_annotation = node.signed(q_uid, {"c": [device]}, shares={"c": {device: Share(400)}})
    p_sandbox, p_config = node.run_pod("share-p", p_annotation, p_uid)
    q_sandbox, q_config = node.run_pod("share-q", q_annotation, q_uid)
    node.create(p_sandbox, p_config, "a")
    node.create(q_sandbox, q_config, "c")
    with pytest.raises(grpc.RpcError) as caught:
        node.create(p_sandbox, p_config, "b")
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "held by" in caught.value.details() and len(node.containers_in(p_sandbox)) == 1


def test_an_ambiguously_failed_create_leaves_no_reservation(node: Node) -> None:
    """containerd answers UNKNOWN (it cannot open a device): the shim cannot know from the code
    alone whether a container exists, so it asks containerd; the retry's success must not leave
    a second 600 milli behind that keeps another pod's 400 out."""
    device = gpu(5)
    (p_uid, p_sandbox, p_config), (q_uid, q_sandbox, q_config) = share_pods(node, "ambig", device, 600, 400)
    with pytest.raises(grpc.RpcError) as failed:
        node.create(p_sandbox, p_config, "app", devices=[("/dev/kubegpu-no-such-device", "/dev/x")])
    assert failed.value.code() is grpc.StatusCode.UNKNOWN, failed.value.details()
    node.create(p_sandbox, p_config, "app")  # kubelet's retry, same attempt
    node.create(q_sandbox, q_config, "app")  # 600 + 400 fit


def test_deleting_a_key_file_revokes_it_without_a_restart(node: Node, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    write_node_keys(keys, ["k2"])
    later = time.time() + 3600  # k2 is the newest file: its mtime does not change when k1 goes
    os.utime(keys / "k2", (later, later))
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod("revoke", node.signed(uid, {"app": [gpu(6)]}), uid)
    assert node.create(sandbox, config, "app")
    (keys / KEY_ID).unlink()
    deadline = time.monotonic() + 20  # the shim looks at the directory every 5 s
    while True:
        uid = str(uuid.uuid4())
        annotation = node.signed(uid, {"app": [gpu(6)]})
        sandbox, config = node.run_pod(f"revoked-{uid[:4]}", annotation, uid)
        try:
            node.create(sandbox, config, "other")  # not in the allocation: no devices, just verified
        except grpc.RpcError as error:
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "unknown key id 'k1'" in error.details()
            break
        assert time.monotonic() < deadline, "a deleted key was still accepted"
        time.sleep(0.5)


def test_dotdot_after_a_symlink_is_resolved_as_containerd_does(node: Node, tmp_path: Path) -> None:
    """``..`` after a symlink goes up from the link's target (the kernel and Go's EvalSymlinks),
    not from the link: ``<dir-link>/../null`` with the link pointing at /dev/shm reaches
    /dev/null (managed here) although its lexically cleaned spelling names a missing file."""
    hop = tmp_path / "hop"
    hop.symlink_to("/dev/shm")
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod("dotdot", None, uid)
    app = node.create(
        sandbox,
        config,
        "app",
        script="ls -l /dev; echo END; exec sleep 100000",
        devices=[(f"{hop}/../null", "/dev/through-hop"), ("/var/run/../dev/null", "/dev/through-var-run")],
    )
    output = node.start_and_read(app, "dotdot", "app")
    assert "through-hop" not in output and "through-var-run" not in output, output


@pytest.mark.parametrize(
    "method",
    [
        "runtime.v1.RuntimeService/CreateContainer",
        "runtime.v1alpha2.RuntimeService/CreateContainer",
    ],
)
def test_a_create_under_another_spelling_of_its_method_is_refused(node: Node, method: str) -> None:
    """containerd's gRPC server (Go) takes a method path with or without its leading slash: the
    shim must not forward a spelling it does not recognise as a create to be rewritten."""
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod("spelled-method", None, uid)
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=sandbox,
        sandbox_config=config,
        config=shell_container("app", BUSYBOX_IMAGE, "sleep 1", log_path="app.log", envs={"X": "1"}),
    )
    request.config.devices.add(host_path="/dev/null", container_path="/dev/forged", permissions="rwm")
    with pytest.raises(grpc.RpcError) as caught:
        node.client.channel.unary_unary(method)(request.SerializeToString(), timeout=30)
    assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED, caught.value.details()
    assert f"method {method!r} is refused" in caught.value.details()
    assert f"dispatch this one as '/{method}'" in caught.value.details()
    assert node.containers_in(sandbox) == []
    # containerd does take the slashless spelling for the method: the refusal is what stops it.
    node.direct.channel.unary_unary(method)(request.SerializeToString(), timeout=60)
    assert len(node.containers_in(sandbox)) == 1


@pytest.mark.parametrize(
    "method",
    [
        "/runtime.v1.RuntimeService/CreateContainer/",
        "/runtime.v1.RuntimeService/createContainer",
        "/RUNTIME.V1.RUNTIMESERVICE/CREATECONTAINER",
        "//runtime.v1.RuntimeService/CreateContainer",
    ],
)
def test_other_spellings_of_the_create_are_no_method_to_containerd(node: Node, method: str) -> None:
    """Forwarded as unknown methods, they reach nothing: containerd answers UNIMPLEMENTED and
    creates nothing, so the shim need not refuse them itself."""
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod("odd-method", None, uid)
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=sandbox,
        sandbox_config=config,
        config=shell_container("app", BUSYBOX_IMAGE, "sleep 1", log_path="app.log"),
    )
    request.config.devices.add(host_path="/dev/null", container_path="/dev/forged", permissions="rwm")
    for client in (node.client, node.direct):
        with pytest.raises(grpc.RpcError) as caught:
            client.channel.unary_unary(method)(request.SerializeToString(), timeout=30)
        assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED, caught.value.details()
    assert node.containers_in(sandbox) == []


def test_restore_pod_is_refused_on_a_device_node_with_its_reason(node: Node) -> None:
    method = "/runtime.v1.RuntimeService/RestorePod"
    request = api_pb2.RestorePodRequest(checkpoint_path="/nonexistent/checkpoint.tar").SerializeToString()
    with pytest.raises(grpc.RpcError) as caught:
        node.client.channel.unary_unary(method)(request, timeout=30)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION, caught.value.details()
    assert f"method {method!r} is refused" in caught.value.details()
    assert "without CreateContainer" in caught.value.details()
    with pytest.raises(grpc.RpcError) as direct:  # containerd 1.6 has no RestorePod at all
        node.direct.channel.unary_unary(method)(request, timeout=30)
    assert direct.value.code() is grpc.StatusCode.UNIMPLEMENTED


def test_a_mark_the_shim_did_not_write_for_its_container_holds_nothing_after_a_restart(node: Node) -> None:
    """A container made without the shim (a checkpoint restore brings the checkpointed
    container's annotations) carries the mark of another pod's container for GPU 4: the
    rebuilt ledger must not count it, or GPU 4 is held by nobody for good."""
    device = gpu(4)
    x_uid, victim_uid = str(uuid.uuid4()), str(uuid.uuid4())
    x_sandbox, x_config = node.run_pod("foreign-x", None, x_uid)
    restored = api_pb2.CreateContainerRequest(
        pod_sandbox_id=x_sandbox,
        sandbox_config=x_config,
        config=shell_container("app", BUSYBOX_IMAGE, "sleep 100000", log_path="app.log"),
    )
    restored.config.annotations[MARK_ANNOTATION] = mark_value(victim_uid, "app", {device: 1000})
    node.direct.runtime.CreateContainer(restored, timeout=60)
    node.restart_shim(kill=True)
    y_uid = str(uuid.uuid4())
    y_sandbox, y_config = node.run_pod("foreign-y", node.signed(y_uid, {"app": [device]}), y_uid)
    assert node.create(y_sandbox, y_config, "app")
    assert "ledger.foreign_mark" in node.shim.log_path.read_text()


def test_an_annotation_nested_to_the_parsers_limit_is_invalid_argument(node: Node) -> None:
    """Somewhere near 1000 levels json.loads succeeds and the canonical form's json.dumps fails
    (where exactly depends on the shim's stack): every depth must be INVALID_ARGUMENT, never
    INTERNAL, and create nothing."""
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod("nested", None, uid)
    signature = base64.b64encode(bytes(64)).decode()
    codes = set()
    for depth in range(600, 1000):
        nested = "[" * depth + "1" + "]" * depth
        config.annotations[ANNOTATION] = f'{{"keyId":"{KEY_ID}","signature":"{signature}","x":{nested}}}'
        try:
            node.create(sandbox, config, "app")
        except grpc.RpcError as error:
            codes.add(error.code())
    assert codes == {grpc.StatusCode.INVALID_ARGUMENT} and node.containers_in(sandbox) == []


def test_a_key_file_of_an_unknown_algorithm_revokes_no_other_key(node: Node, tmp_path: Path) -> None:
    """An operator drops a key the library cannot read into the node's key directory: the
    allocations signed with the other keys still verify."""
    from tests.fixtures.keys import unknown_algorithm_pem

    (tmp_path / "keys" / "k9").write_bytes(unknown_algorithm_pem(private=False))
    time.sleep(5.5)  # the shim looks at the directory every 5 s
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod("exotic-key", node.signed(uid, {"app": [gpu(2)]}), uid)
    app = node.create(sandbox, config, "app")
    _, devices = visible(node.start_and_read(app, "exotic-key", "app"))
    assert devices == ["gpu2"]


def test_a_key_another_user_planted_is_never_used(node: Node, tmp_path: Path) -> None:
    """A local user's key file in the node's key directory (here: owned by uid 65534) is skipped
    and logged, never used: an allocation it signs is refused and creates nothing, while the
    allocations signed with root's keys still verify."""
    from kubegpu.allocation import public_key_pem

    planted = tmp_path / "keys" / "k9"
    planted.write_bytes(public_key_pem(OTHER_KEY))
    os.chown(planted, 65534, 65534)
    time.sleep(5.5)  # the shim looks at the directory every 5 s
    uid = str(uuid.uuid4())
    forged = sign(Allocation(NODE, uid, {"app": ContainerAllocation((gpu(7),))}), "k9", OTHER_KEY)
    sandbox, config = node.run_pod("planted-key", forged, uid)
    with pytest.raises(grpc.RpcError) as caught:
        node.create(sandbox, config, "app")
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown key id 'k9'" in caught.value.details()
    assert node.containers_in(sandbox) == []
    lines = node.shim.log_path.read_text().splitlines()
    skipped = [json.loads(line) for line in lines if "keys.skipped" in line]
    assert any(f"k9: {planted} is owned by uid 65534, not root" in entry["problem"] for entry in skipped)
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod("root-key", node.signed(uid, {"app": [gpu(7)]}), uid)
    assert node.create(sandbox, config, "app")


CAP_SYS_ADMIN_BIT = 1 << 21  # linux/capability.h


def create_with_capabilities(
    node: Node, pod: str, container: str, added: list[str], dropped: list[str]
) -> tuple[str, api_pb2.PodSandboxConfig, str | None]:
    """A pod ``pod`` whose container prints its capability sets; (sandbox, config, container id
    or None when the create was refused with FAILED_PRECONDITION)."""
    sandbox, config = node.run_pod(pod, None)
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=sandbox,
        sandbox_config=config,
        config=shell_container(
            container,
            BUSYBOX_IMAGE,
            "grep Cap /proc/self/status; echo END; exec sleep 100000",
            log_path=f"{container}.log",
        ),
    )
    request.config.linux.security_context.capabilities.add_capabilities.extend(added)
    request.config.linux.security_context.capabilities.drop_capabilities.extend(dropped)
    try:
        return sandbox, config, node.client.runtime.CreateContainer(request, timeout=60).container_id
    except grpc.RpcError as error:
        assert error.code() is grpc.StatusCode.FAILED_PRECONDITION, error
        assert f"pod default/{pod} container {container}: capability SYS_ADMIN" in error.details()
        return sandbox, config, None


def capability_sets(output: str) -> dict[str, int]:
    return {
        k: int(v, 16)
        for k, v in (line.split(":\t") for line in output.splitlines() if line.startswith("Cap"))
    }


def sys_admin_events(node: Node) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in node.shim.log_path.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "create_container.sys_admin"]


def test_a_container_given_sys_admin_is_refused_unless_its_namespace_is_allowed(node: Node) -> None:
    """CAP_SYS_ADMIN lifts the device cgroup: refused on a device node (nothing created) in any
    spelling containerd grants it; with --allow-sys-admin-namespace the container is created and
    containerd does give it the capability (the reading of its rules is containerd's own);
    ALL with SYS_ADMIN dropped is no grant, and containerd indeed leaves it out."""
    for spelling in ("SYS_ADMIN", "sys_admin", "ALL"):
        sandbox, _, created = create_with_capabilities(
            node, f"sysadmin-{spelling.lower().replace('_', '-')}", "app", [spelling], []
        )
        assert created is None and node.containers_in(sandbox) == []
    lines = sys_admin_events(node)
    assert [(e["event"], e["capability"], e["allowed"]) for e in lines] == [
        ("create_container.sys_admin", spelling, False) for spelling in ("SYS_ADMIN", "sys_admin", "ALL")
    ]
    sandbox, _, created = create_with_capabilities(node, "sysadmin-dropped", "app", ["ALL"], ["SYS_ADMIN"])
    assert created is not None
    caps = capability_sets(node.start_and_read(created, "sysadmin-dropped", "app"))
    assert caps["CapBnd"] & CAP_SYS_ADMIN_BIT == 0 and caps["CapBnd"] != 0

    node.shim.stop()
    node.shim.extra_args += ["--allow-sys-admin-namespace", "default"]
    node.shim.start()
    sandbox, _, created = create_with_capabilities(node, "sysadmin-allowed", "app", ["sys_admin"], [])
    assert created is not None
    caps = capability_sets(node.start_and_read(created, "sysadmin-allowed", "app"))
    assert caps["CapEff"] & CAP_SYS_ADMIN_BIT  # root in the container: effective
    lines = sys_admin_events(node)
    assert (lines[-1]["pod"], lines[-1]["capability"], lines[-1]["allowed"]) == (
        "default/sysadmin-allowed",
        "sys_admin",
        True,
    )


@pytest.mark.parametrize("length", [5000, 200_000])
def test_a_refusal_naming_a_very_long_path_still_arrives_as_such(node: Node, length: int) -> None:
    """A device host path longer than PATH_MAX cannot be resolved: refused, and the refusal must
    reach the caller as INVALID_ARGUMENT with its reason, not be lost to the caller's limit on
    status metadata (gRPC clients accept about 8 KiB of it) because it quotes the whole path."""
    uid = str(uuid.uuid4())
    sandbox, config = node.run_pod("long-path", None, uid)
    with pytest.raises(grpc.RpcError) as caught:
        node.create(sandbox, config, "app", devices=[("/dev/" + "n" * length, "/dev/x")])
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()[:300]
    assert "cannot be resolved" in caught.value.details() and len(caught.value.details()) < 1000
    assert node.containers_in(sandbox) == []


def test_shares_survive_a_shim_restart_in_every_state(node: Node) -> None:
    """P/a 600 running, Q/c 300 created but not started, S/x 500 exited: after a SIGKILL of the
    shim the rebuilt ledger still counts 900 of the GPU (the exited one nothing), so R's 200 is
    refused and T's 100 fits; P/a restarting (attempt 1, the old one still there) is the same
    container and fits too."""
    device = gpu(1)
    pods = {}
    for name, container, milli in (("p", "a", 600), ("q", "c", 300), ("r", "d", 200), ("t", "e", 100)):
        uid = str(uuid.uuid4())
        annotation = node.signed(uid, {container: [device]}, shares={container: {device: Share(milli)}})
        pods[name] = (*node.run_pod(f"restart-{name}", annotation, uid), container)
    s_uid = str(uuid.uuid4())
    s_annotation = node.signed(s_uid, {"x": [device]}, shares={"x": {device: Share(500)}})
    s_sandbox, s_config = node.run_pod("restart-s", s_annotation, s_uid)
    exited = node.create(s_sandbox, s_config, "x", script="echo END")
    node.client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=exited))
    wait_for(
        lambda: (
            node.direct.runtime.ContainerStatus(
                api_pb2.ContainerStatusRequest(container_id=exited)
            ).status.state
            == api_pb2.CONTAINER_EXITED
        ),
        timeout=20,
    )
    running = node.create(*pods["p"])
    node.client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=running))
    node.create(*pods["q"])  # created, never started
    node.restart_shim(kill=True)
    with pytest.raises(grpc.RpcError) as caught:
        node.create(*pods["r"])
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION, caught.value.details()
    assert node.create(*pods["t"])
    p_sandbox, p_config, _ = pods["p"]
    assert node.create(p_sandbox, p_config, "a", attempt=1)


def test_a_create_past_its_deadline_and_its_retry_hold_the_share_once(node: Node) -> None:
    """kubelet's create runs past its deadline (the shim and containerd may still finish it),
    kubelet retries: however the first one ended, P's 600 is counted once and Q's 400 fits."""
    device = gpu(0)
    (p_uid, p_sandbox, p_config), (q_uid, q_sandbox, q_config) = share_pods(
        node, "deadline", device, 600, 400
    )
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=p_sandbox,
        sandbox_config=p_config,
        config=shell_container("app", BUSYBOX_IMAGE, "sleep 100000", log_path="app.log"),
    )
    with pytest.raises(grpc.RpcError) as late:
        node.client.runtime.CreateContainer(request, timeout=0.001)
    assert late.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    try:
        node.create(p_sandbox, p_config, "app")  # kubelet's retry
    except grpc.RpcError as error:  # containerd is still making (or has made) the first one
        assert error.code() is grpc.StatusCode.UNKNOWN and "is reserved for" in error.details()
    assert node.create(q_sandbox, q_config, "app")


def late_container(
    node: Node, sandbox: str, config: api_pb2.PodSandboxConfig, uid: str, device: str, milli: int
) -> str:
    """The container containerd makes from the shim's rewrite of P's create after the caller gave
    up (made here straight at containerd, as the rewrite would have sent it)."""
    late = api_pb2.CreateContainerRequest(
        pod_sandbox_id=sandbox,
        sandbox_config=config,
        config=shell_container("app", BUSYBOX_IMAGE, "sleep 100000", log_path="late.log"),
    )
    late.config.annotations[MARK_ANNOTATION] = mark_value(uid, "app", {device: milli})
    return node.direct.runtime.CreateContainer(late, timeout=60).container_id


def test_a_container_containerd_makes_after_the_outcome_was_settled_holds_its_share(node: Node) -> None:
    """P's create fails ambiguously (UNKNOWN) and the shim, asking containerd, finds no container:
    the 600 are let go. Then containerd's container for that create turns up after all: Q's 500
    are refused, and once the container is removed through the shim they fit."""
    device = gpu(7)
    (p_uid, p_sandbox, p_config), (q_uid, q_sandbox, q_config) = share_pods(node, "late", device, 600, 500)
    with pytest.raises(grpc.RpcError) as failed:
        node.create(p_sandbox, p_config, "app", devices=[("/dev/kubegpu-no-such-device", "/dev/x")])
    assert failed.value.code() is grpc.StatusCode.UNKNOWN, failed.value.details()
    wait_for(lambda: '"ledger.reconciled"' in node.shim.log_path.read_text(), timeout=30)
    late = late_container(node, p_sandbox, p_config, p_uid, device, 600)
    with pytest.raises(grpc.RpcError) as refused:
        node.create(q_sandbox, q_config, "app")
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION, refused.value.details()
    assert late[:12] in refused.value.details()
    node.client.runtime.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=late), timeout=60)
    assert node.create(q_sandbox, q_config, "app")


def test_a_container_made_while_the_shim_restarted_holds_its_device(node: Node) -> None:
    """containerd finishes a create the killed shim forwarded only after the new shim rebuilt
    its ledger: the device is still not handed to another pod."""
    p_uid, q_uid = str(uuid.uuid4()), str(uuid.uuid4())
    device = gpu(6)
    p_sandbox, p_config = node.run_pod("restart-late-p", node.signed(p_uid, {"app": [device]}), p_uid)
    q_sandbox, q_config = node.run_pod("restart-late-q", node.signed(q_uid, {"app": [device]}), q_uid)
    node.restart_shim(kill=True)
    late_container(node, p_sandbox, p_config, p_uid, device, 1000)
    with pytest.raises(grpc.RpcError) as refused:
        node.create(q_sandbox, q_config, "app")
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION, refused.value.details()
    assert node.containers_in(q_sandbox) == []


def test_shares_whose_memory_adds_up_past_the_gpus_are_refused(node: Node) -> None:
    """A 16 GiB sim GPU: P's share takes all its memory with 500 milli; Q's 300 milli with 4 GiB
    fit by milli but not by memory, and a share asking for 64 GiB does not fit the GPU at all.
    Neither creates a container; once P's container is gone Q's share fits."""
    device = gpu(3)
    p_uid, q_uid, big_uid = (str(uuid.uuid4()) for _ in range(3))
    shares = ((p_uid, "mem-p", 500, 16384), (q_uid, "mem-q", 300, 4096), (big_uid, "mem-big", 100, 65536))
    pods = {}
    for uid, name, milli, memory in shares:
        annotation = node.signed(uid, {"app": [device]}, shares={"app": {device: Share(milli, memory)}})
        pods[name] = node.run_pod(name, annotation, uid)
    held = node.create(*pods["mem-p"], "app")
    with pytest.raises(grpc.RpcError) as refused:
        node.create(*pods["mem-q"], "app")
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION, refused.value.details()
    assert "GPU memory would add up to 20480 MiB, more than its 16384 MiB" in refused.value.details()
    with pytest.raises(grpc.RpcError) as too_big:
        node.create(*pods["mem-big"], "app")
    assert too_big.value.code() is grpc.StatusCode.FAILED_PRECONDITION, too_big.value.details()
    assert "asks for 65536 MiB of memory, the device has 16384 MiB" in too_big.value.details()
    assert node.containers_in(pods["mem-q"][0]) == [] and node.containers_in(pods["mem-big"][0]) == []
    node.client.runtime.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=held), timeout=60)
    assert node.create(*pods["mem-q"], "app")


def test_a_gpu_whose_create_may_still_complete_is_not_granted_again(node: Node) -> None:
    """Issue #20: P's create of a whole GPU fails ambiguously (UNKNOWN) and the shim, asking
    containerd, finds no container. Q must not get the GPU while containerd may still finish
    P's create; when P's container turns up it holds the GPU (once), and removing P's sandbox
    through the shim lets Q have it."""
    device = gpu(2)
    p_uid, q_uid = str(uuid.uuid4()), str(uuid.uuid4())
    p_sandbox, p_config = node.run_pod("quarantine-p", node.signed(p_uid, {"app": [device]}), p_uid)
    q_sandbox, q_config = node.run_pod("quarantine-q", node.signed(q_uid, {"app": [device]}), q_uid)
    with pytest.raises(grpc.RpcError) as failed:
        node.create(p_sandbox, p_config, "app", devices=[("/dev/kubegpu-no-such-device", "/dev/x")])
    assert failed.value.code() is grpc.StatusCode.UNKNOWN, failed.value.details()
    wait_for(lambda: '"ledger.reconciled"' in node.shim.log_path.read_text(), timeout=30)
    with pytest.raises(grpc.RpcError) as quarantined:
        node.create(q_sandbox, q_config, "app")
    assert quarantined.value.code() is grpc.StatusCode.FAILED_PRECONDITION, quarantined.value.details()
    assert "outcome unknown" in quarantined.value.details() and node.containers_in(q_sandbox) == []
    late = late_container(node, p_sandbox, p_config, p_uid, device, 1000)
    with pytest.raises(grpc.RpcError) as held:
        node.create(q_sandbox, q_config, "app")
    assert late[:12] in held.value.details() and "outcome unknown" not in held.value.details()
    node.client.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=p_sandbox), timeout=60)
    node.client.runtime.RemovePodSandbox(
        api_pb2.RemovePodSandboxRequest(pod_sandbox_id=p_sandbox), timeout=60
    )
    assert node.create(q_sandbox, q_config, "app")


def test_a_late_container_is_not_booked_past_its_gpus_capacity(node: Node) -> None:
    """containerd finishes P's create of a whole GPU after the shim restarted, and Q has the GPU
    by then: the shim does not book P's container beside Q's (it reports it, naming pod,
    container and device) and the GPU stays Q's alone."""
    device = gpu(0)
    p_uid, q_uid, r_uid = (str(uuid.uuid4()) for _ in range(3))
    p_sandbox, p_config = node.run_pod("overbook-p", node.signed(p_uid, {"app": [device]}), p_uid)
    q_sandbox, q_config = node.run_pod("overbook-q", node.signed(q_uid, {"app": [device]}), q_uid)
    r_sandbox, r_config = node.run_pod("overbook-r", node.signed(r_uid, {"app": [gpu(1)]}), r_uid)
    node.restart_shim(kill=True)
    q_container = node.create(q_sandbox, q_config, "app")
    late = late_container(node, p_sandbox, p_config, p_uid, device, 1000)
    node.create(r_sandbox, r_config, "app")  # a reservation: the adoption pass sees P's container
    refused = [
        json.loads(line) for line in node.shim.log_path.read_text().splitlines() if "adopt_refused" in line
    ]
    assert len(refused) == 1, refused
    fields = refused[0]
    assert (fields["container"], fields["pod_uid"], fields["name"], fields["devices"]) == (
        late,
        p_uid,
        "app",
        [device],
    )
    assert q_container[:12] in fields["reason"]
    with pytest.raises(grpc.RpcError) as start:  # P's container must not start with Q's GPU
        node.client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=late), timeout=60)
    assert start.value.code() is grpc.StatusCode.FAILED_PRECONDITION, start.value.details()
    status = node.direct.runtime.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=late))
    assert status.status.state == api_pb2.CONTAINER_CREATED
    node.client.runtime.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=q_container), timeout=60)
    s_uid = str(uuid.uuid4())
    s_sandbox, s_config = node.run_pod("overbook-s", node.signed(s_uid, {"app": [device]}), s_uid)
    with pytest.raises(grpc.RpcError) as taken:  # Q's gone: P's container fits, and is adopted
        node.create(s_sandbox, s_config, "app")
    assert late[:12] in taken.value.details()
