"""The node agent as an NRI plugin (crishim/nri/agent.py) on the Go-built containerd 2.2.9 with NRI
on and the plugin required: the very rewrite core of the CRI proxy decides each container.

A pod with a signed allocation of two simulated GPUs: its container sees exactly those, with
NVIDIA_VISIBLE_DEVICES naming them, whatever it asked for itself; a forged allocation is refused
with the proxy's reason; a second pod asking for a GPU already held is refused (double use); the
ledger follows RemoveContainer; and a plugin that reconnects rebuilds the ledger from
Synchronize, by the marks on the containers still there. A pod's request of ``kubegpu.io/rdma``
above what its allocation holds is refused through NRI as through the proxy."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from crishim.cri import api_pb2 as cri
from crishim.hostpaths import CHAR, DeviceNumber, ManagedDevices
from crishim.nri import api_pb2 as nri_api
from crishim.nri.agent import NriAgent
from crishim.nri.plugin import PluginSession
from crishim.rewrite import AllocationRewriter, NodeDevices
from devices.registry import load_plugins
from devices.sim import sim_gpu_id
from kubegpu.allocation import ANNOTATION, Allocation, ContainerAllocation, KeyRing, sign
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from kubegpu.devenv.shimproc import sim_node_args
from tests.fixtures.keys import KEY, KEY_ID, OTHER_KEY, SIGNING, write_node_keys
from tests.support.crisandboxes import remove_sandbox
from tests.test_nri_transport import PLUGIN, PluginThread, nri_containerd, started_output, wait_until

pytestmark = pytest.mark.containerd

__all__ = ["nri_containerd"]  # the module fixture of tests/test_nri_transport.py (plugin PLUGIN required)
NODE = "nri-node"


def agent_for(tmp_path: Path) -> NriAgent:
    plugins = load_plugins(
        ["sim"], {"node_name": NODE, "topology": "dgx1-v100", "state_dir": str(tmp_path / "sim")}
    )
    devices = NodeDevices(plugins, sysfs_root=None)
    devices.discover()
    return NriAgent(AllocationRewriter(NODE, devices, KeyRing(None, SIGNING)))


def signed(pod_uid: str, devices: list[str], key: object = KEY) -> str:
    allocation = Allocation(NODE, pod_uid, {"app": ContainerAllocation(tuple(devices))})
    return sign(allocation, KEY_ID, key)  # type: ignore[arg-type]


class Pods:
    """Sandboxes and containers made straight on containerd (no proxy: NRI is the only front)."""

    def __init__(self, containerd: Containerd, logs: Path) -> None:
        self.client = CriClient(containerd.endpoint)
        self.logs = logs
        self.sandboxes: list[str] = []

    def create(
        self,
        name: str,
        annotation: Callable[[str], str] | None,
        envs: dict[str, str] | None = None,
        devices: list[tuple[str, str]] | None = None,
        mounts: list[tuple[str, str]] | None = None,
        script: str = "",
    ) -> str | grpc.RpcError:
        uid = str(uuid.uuid4())
        if callable(annotation):
            annotation = annotation(uid)
        log_dir = self.logs / name
        log_dir.mkdir(parents=True, exist_ok=True)
        config = host_network_sandbox(name, uid, log_directory=str(log_dir))
        if annotation is not None:
            config.annotations[ANNOTATION] = annotation
        try:
            sandbox = self.client.runtime.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=60)
        except grpc.RpcError as error:  # containerd still starting after a restart
            return error
        self.sandboxes.append(sandbox.pod_sandbox_id)
        script = script or "env; echo ---; ls /dev/kubegpu-sim 2>&1; echo END; exec sleep 100000"
        request = cri.CreateContainerRequest(
            pod_sandbox_id=sandbox.pod_sandbox_id,
            sandbox_config=config,
            config=shell_container("app", BUSYBOX_IMAGE, script, log_path="app.log", envs=envs),
        )
        for host, inside in devices or []:
            request.config.devices.add(host_path=host, container_path=inside, permissions="rwm")
        for host, inside in mounts or []:
            request.config.mounts.add(host_path=host, container_path=inside, readonly=True)
        try:
            return self.client.runtime.CreateContainer(request, timeout=60).container_id
        except grpc.RpcError as error:
            return error

    def output(self, container_id: str, name: str) -> str:
        lines = started_output(self.client, container_id, self.logs / name / "app.log", f"{name}'s output")
        return "\n".join(lines)

    def close(self) -> None:
        for sandbox in self.sandboxes:
            remove_sandbox(self.client, sandbox)
        self.client.close()


def test_the_rewrite_core_decides_every_container_through_nri(
    nri_containerd: Containerd, tmp_path: Path
) -> None:
    assert nri_containerd.nri_socket is not None
    agent = agent_for(tmp_path)
    plugin = PluginThread(PluginSession(agent, socket=nri_containerd.nri_socket, name=PLUGIN))
    pods = Pods(nri_containerd, tmp_path / "logs")
    gpus = [sim_gpu_id(NODE, 0), sim_gpu_id(NODE, 1)]
    try:
        plugin.synchronize()
        assert agent.rewriter.rebuilt.is_set()

        first = pods.create("granted", lambda uid: signed(uid, gpus), envs={"NVIDIA_VISIBLE_DEVICES": "all"})
        assert isinstance(first, str), first
        out = pods.output(first, "granted")
        assert f"NVIDIA_VISIBLE_DEVICES={','.join(gpus)}" in out
        listing = [name for name in out.split("---", 1)[1].split() if name != "END"]
        assert len(listing) == 2, out  # exactly the two granted device nodes
        assert sorted(h.device for h in agent.rewriter.ledger.holdings()) == sorted(gpus)

        forged = pods.create("forged", lambda uid: signed(uid, [sim_gpu_id(NODE, 2)], key=OTHER_KEY))
        assert isinstance(forged, grpc.RpcError)
        assert "signature" in (forged.details() or "").lower(), forged.details()

        double = pods.create("double", lambda uid: signed(uid, [gpus[0]]))
        assert isinstance(double, grpc.RpcError)
        assert "held by" in (double.details() or "") or "conflict" in (double.details() or "").lower(), (
            double.details()
        )

        plain = pods.create(
            "plain", None, envs={"NVIDIA_VISIBLE_DEVICES": "all", "KUBEGPU_VISIBLE_DEVICES": "x"}
        )
        assert isinstance(plain, str), plain
        out = pods.output(plain, "plain")
        assert "NVIDIA_VISIBLE_DEVICES=void" in out and "KUBEGPU_VISIBLE_DEVICES=x" not in out
        assert "KUBEGPU_VISIBLE_DEVICES=\n" in out  # emptied (NRI cannot remove a variable)

        # a reconnect (the agent restarted): the ledger comes back from Synchronize by the marks
        plugin.stop()
        agent2 = agent_for(tmp_path)
        plugin = PluginThread(PluginSession(agent2, socket=nri_containerd.nri_socket, name=PLUGIN))
        plugin.synchronize("Synchronize after the restart")
        assert sorted(h.device for h in agent2.rewriter.ledger.holdings()) == sorted(gpus)
        again = pods.create("again", lambda uid: signed(uid, [gpus[1]]))
        assert isinstance(again, grpc.RpcError), "a GPU held before the restart was handed out again"

        pods.client.runtime.StopContainer(cri.StopContainerRequest(container_id=first, timeout=1), timeout=60)
        pods.client.runtime.RemoveContainer(cri.RemoveContainerRequest(container_id=first), timeout=60)
        wait_until(
            lambda: not agent2.rewriter.ledger.holdings(), 10, "the ledger to free the removed container"
        )
        time.sleep(0.1)
        reused = pods.create("reused", lambda uid: signed(uid, [gpus[1]]))
        assert isinstance(reused, str), reused
    finally:
        pods.close()
        plugin.stop()


def start_agent(containerd: Containerd, tmp_path: Path, keys: Path) -> subprocess.Popen[bytes]:
    """``kubegpu crishim --front nri`` with the sim plugin, as a process of its own."""
    assert containerd.nri_socket is not None
    log = open(tmp_path / "agent.log", "ab")  # noqa: SIM115 - the process owns it
    command = [
        sys.executable,
        "-m",
        "kubegpu",
        "crishim",
        "--front",
        "nri",
        "--nri-socket",
        str(containerd.nri_socket),
        "--nri-plugin-name",
        PLUGIN,
        "--no-pod-cache",
        "--telemetry-interval",
        "0",
        *sim_node_args(NODE, "dgx1-v100", tmp_path / "sim", keys),
    ]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def test_the_nri_front_process_fails_closed_when_killed_and_rebuilds_when_back(
    nri_containerd: Containerd, tmp_path: Path
) -> None:
    """`kubegpu crishim --front nri`: a pod gets its GPU; with the agent killed (-9) containerd
    creates nothing at all (the plugin is required); started again, it rebuilds its ledger from
    Synchronize and refuses the GPU still held, then grants a free one."""
    keys = tmp_path / "keys"
    write_node_keys(keys)
    pods = Pods(nri_containerd, tmp_path / "logs")
    gpus = [sim_gpu_id(NODE, 0), sim_gpu_id(NODE, 1)]
    agent = start_agent(nri_containerd, tmp_path, keys)
    try:

        def created(name: str, devices: list[str]) -> str | grpc.RpcError:
            return pods.create(name, lambda uid: signed(uid, devices))

        tries: list[str | grpc.RpcError] = []

        def granted() -> bool:
            tries.append(created(f"first-{len(tries)}", gpus[:1]))
            return isinstance(tries[-1], str)

        wait_until(granted, 30, "the agent to register and grant the GPU")
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(10)
        refused = pods.create("while-away", None)
        assert isinstance(refused, grpc.RpcError) and "not present" in (refused.details() or ""), refused

        agent = start_agent(nri_containerd, tmp_path, keys)
        again: list[str | grpc.RpcError] = []

        def answered() -> bool:
            made = created(f"again-{len(again)}", gpus[:1])
            again.append(made)
            return not (isinstance(made, grpc.RpcError) and "not present" in (made.details() or ""))

        wait_until(answered, 30, "the agent to register again")
        held = again[-1]
        assert isinstance(held, grpc.RpcError), "a GPU held before the restart was handed out again"
        assert gpus[0] in (held.details() or ""), held.details()
        free = created("free", gpus[1:])
        assert isinstance(free, str), free

        # containerd restarted under the agent: it registers again and still holds both GPUs
        nri_containerd.restart()

        def registered_again() -> bool:
            made = created(f"after-restart-{time.monotonic()}", gpus[1:])
            return not (isinstance(made, grpc.RpcError) and "not present" in (made.details() or "")) and (
                isinstance(made, grpc.RpcError) and gpus[1] in (made.details() or "")
            )

        wait_until(registered_again, 60, "the agent to hold gpu1 again after containerd's restart")

        # the signing key revoked (removed from the node's keys): allocations it signed are refused
        (keys / KEY_ID).unlink()

        def revoked() -> bool:
            made = created(f"revoked-{time.monotonic()}", [sim_gpu_id(NODE, 5)])
            return isinstance(made, grpc.RpcError) and "k1" in (made.details() or "")

        wait_until(revoked, 30, "the revoked key to be refused")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(10)
        pods.close()


def test_nri_scrubs_managed_nodes_by_number_and_toolkit_mount_requests(
    nri_containerd: Containerd, tmp_path: Path
) -> None:
    """A container asking, past any allocation, for a managed device node under another path and
    for a toolkit device-list mount gets neither: the mount is removed, and the node (NRI v0.11
    cannot remove a device from the spec) is denied in its device cgroup. The sim's own nodes
    share /dev/null's numbers, so the node managed here is /dev/kmsg (c 1:11)."""
    assert nri_containerd.nri_socket is not None
    agent = agent_for(tmp_path)
    kmsg = DeviceNumber(CHAR, 1, 11)
    node = agent.rewriter.node_devices
    node.managed = ManagedDevices(numbers=node.managed.numbers | {kmsg}, patterns=node.managed.patterns)
    plugin = PluginThread(PluginSession(agent, socket=nri_containerd.nri_socket, name=PLUGIN))
    pods = Pods(nri_containerd, tmp_path / "logs")
    source = tmp_path / "grab"
    source.mkdir()
    try:
        plugin.synchronize()
        script = (
            "head -c 1 /dev/grab >/dev/null 2>/tmp/err; echo open=$?; cat /tmp/err; "
            "ls /var/run/nvidia-container-devices 2>&1; echo END; exec sleep 100000"
        )
        made = pods.create(
            "grabber",
            None,
            devices=[("/dev/kmsg", "/dev/grab")],
            mounts=[(str(source), "/var/run/nvidia-container-devices/all")],
            script=script,
        )
        assert isinstance(made, str), made
        out = pods.output(made, "grabber")
        assert "open=1" in out and "Operation not permitted" in out, out
        assert "nvidia-container-devices: No such file or directory" in out, out
    finally:
        pods.close()
        plugin.stop()


class StallingAgent(NriAgent):
    """An agent whose CreateContainer never answers: killed (its connection closed) mid-create."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.entered = threading.Event()

    async def create_container(self, request: Any) -> Any:  # type: ignore[override]
        self.entered.set()
        await asyncio.sleep(3600)


def test_an_agent_killed_mid_create_lets_no_unscrubbed_container_through(
    nri_containerd: Containerd, tmp_path: Path
) -> None:
    assert nri_containerd.nri_socket is not None
    base = agent_for(tmp_path)
    agent = StallingAgent(base.rewriter)
    plugin = PluginThread(PluginSession(agent, socket=nri_containerd.nri_socket, name=PLUGIN))
    pods = Pods(nri_containerd, tmp_path / "logs")
    outcome: list[str | grpc.RpcError] = []
    try:
        plugin.synchronize()
        creating = threading.Thread(
            target=lambda: outcome.append(pods.create("grab", None, envs={"NVIDIA_VISIBLE_DEVICES": "all"}))
        )
        creating.start()
        assert agent.entered.wait(30)
        plugin.run(plugin.session.close())  # the agent dies with the create in flight
        creating.join(60)
        made = outcome[0]
        if isinstance(made, str):
            out = pods.output(made, "grab")
            assert "NVIDIA_VISIBLE_DEVICES=all" not in out, "created without the scrub"
        assert isinstance(made, grpc.RpcError), made  # containerd 2.2.9 without the validator: created
    finally:
        pods.close()
        plugin.stop()


class DeviceAdder:
    """Another NRI plugin that adds a device node to every container it sees."""

    def create_container(self, request: Any) -> Any:
        adjust = nri_api.ContainerAdjustment()
        added = adjust.linux.devices.add(path="/dev/sneak", type="c", major=1, minor=11)
        added.file_mode.value = 0o666
        return nri_api.CreateContainerResponse(adjust=adjust)


def test_the_agent_rejects_another_plugins_managed_device(nri_containerd: Containerd, tmp_path: Path) -> None:
    """A plugin after kubegpu's puts back a managed node (here /dev/kmsg, c 1:11, made managed):
    kubegpu's validation of the final adjustments rejects the create, naming the device."""
    assert nri_containerd.nri_socket is not None
    agent = agent_for(tmp_path)
    node = agent.rewriter.node_devices
    node.managed = ManagedDevices(
        numbers=node.managed.numbers | {DeviceNumber(CHAR, 1, 11)}, patterns=node.managed.patterns
    )
    ours = PluginThread(PluginSession(agent, socket=nri_containerd.nri_socket, name=PLUGIN))
    other = PluginThread(
        PluginSession(DeviceAdder(), socket=nri_containerd.nri_socket, name="adder", index="20")
    )
    pods = Pods(nri_containerd, tmp_path / "logs")
    try:
        ours.synchronize()
        other.synchronize()
        made = pods.create("sneaked", None)
        assert isinstance(made, grpc.RpcError), made
        assert "/dev/sneak" in (made.details() or "") and "did not grant" in (made.details() or ""), (
            made.details()
        )
    finally:
        pods.close()
        other.stop()
        ours.stop()


def test_the_nri_front_refuses_a_pod_whose_rdma_request_its_allocation_does_not_hold(
    nri_containerd: Containerd, tmp_path: Path
) -> None:
    """The request of ``kubegpu.io/rdma`` is checked through NRI as through the CRI proxy (the one
    ``AllocationRewriter.decide``): a pod asking for two interfaces whose signed allocation holds one
    VF, or only a GPU, is refused with the proxy's reason and books nothing; a pod whose allocation
    holds its two VFs sees exactly those; a pod the API cannot answer for gets its allocation's VFs,
    never more (sim topology hgx-h100-sriov, on containerd 2.x with the plugin required)."""
    from crishim.podlookup import facts_of
    from tests.support.rdmanode import rdma_allocation

    assert nri_containerd.nri_socket is not None
    plugins = load_plugins(
        ["sim"], {"node_name": NODE, "topology": "hgx-h100-sriov", "state_dir": str(tmp_path / "sim")}
    )
    devices = NodeDevices(plugins, sysfs_root=None)
    devices.discover()
    requests: dict[str, int] = {}  # pod UID -> its kubegpu.io/rdma, read from its API JSON

    async def rdma_resource(namespace: str, name: str, uid: str) -> int | None:
        return requests.get(uid)  # a pod not listed: the API gave no answer

    def asking(count: str, vfs: list[str], gpus: tuple[str, ...] = ()) -> Callable[[str], str]:
        def annotation(uid: str) -> str:
            if count:
                app = {"name": "app", "resources": {"limits": {"kubegpu.io/rdma": count}}}
                pod = {"metadata": {"uid": uid}, "spec": {"containers": [app]}}
                requests[uid] = facts_of(pod, ("kubegpu.io/rdma",)).rdma
            containers = {"app": list(gpus)} if gpus else None
            return rdma_allocation(NODE, uid, vfs, containers=containers, pf="mlx5_0")

        return annotation

    rewriter = AllocationRewriter(NODE, devices, KeyRing(None, SIGNING), rdma_resource=rdma_resource)
    agent = NriAgent(rewriter)
    plugin = PluginThread(PluginSession(agent, socket=nri_containerd.nri_socket, name=PLUGIN))
    pods = Pods(nri_containerd, tmp_path / "logs")
    script = "env; echo ---; ls /dev/kubegpu-sim 2>&1; echo END; exec sleep 100000"
    try:
        plugin.synchronize()
        short = pods.create("short", asking("2", ["mlx5_0-vf0"]), script=script)
        assert isinstance(short, grpc.RpcError), "a pod asking for 2 VFs started with 1"
        assert "requests kubegpu.io/rdma: 2 (RDMA interfaces) but its allocation holds 1" in (
            short.details() or ""
        ), short.details()
        gpu_only = pods.create("gpu-only", asking("1", [], (sim_gpu_id(NODE, 0),)), script=script)
        assert isinstance(gpu_only, grpc.RpcError), "a pod asking for a VF started without one"
        assert "its allocation holds 0" in (gpu_only.details() or ""), gpu_only.details()
        assert not rewriter.ledger.holdings()

        whole = pods.create("whole", asking("2", ["mlx5_0-vf0", "mlx5_0-vf1"]), script=script)
        assert isinstance(whole, str), whole
        out = pods.output(whole, "whole")
        assert "KUBEGPU_RDMA_DEVICES=mlx5_0-vf0,mlx5_0-vf1" in out
        assert out.split("---", 1)[1].split() == ["mlx5_0-vf0", "mlx5_0-vf1", "END"], out

        unknown = pods.create("unknown", asking("", ["mlx5_0-vf2"]), script=script)
        assert isinstance(unknown, str), unknown
        out = pods.output(unknown, "unknown")
        assert "KUBEGPU_RDMA_DEVICES=mlx5_0-vf2" in out
        assert out.split("---", 1)[1].split() == ["mlx5_0-vf2", "END"], out
    finally:
        pods.close()
        plugin.stop()
