"""Enforced GPU shares through the NRI front, on the Go-built containerd 2.2.9 with NRI on and the
agent required: the same MPS client settings and daemon lifecycle as through the CRI proxy
(tests/test_mps_containerd.py, docs/gpu-sharing.md).

The node runs the sim plugin and the stand-in MPS control binary (tests/support/mps_standin.py),
which the agent starts as each shared GPU's daemon in a private mount namespace, as the CRI
proxy's tests do. Checked here: a share's container is an MPS client of its GPU's daemon (env,
pipe and log directories read-only, the daemon's /dev/shm), whatever MPS settings and /dev/shm the
container brought; a whole GPU gets none of it; environment set more than once (the image's and
the pod's) cannot override the enforced values; a daemon that cannot start refuses the create with
the proxy's UNAVAILABLE reason within containerd's NRI request timeout and frees the share; the
daemon stops with the last share (StopContainer, RemoveContainer, RemovePodSandbox) and survives
an agent restart (adopted by the next agent's Synchronize), and a restarted agent stops, rather
than adopts, a daemon beside a container that holds its GPU whole.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2 as cri
from crishim.mps import MpsSharing, MpsSupervisor
from crishim.nri.agent import NriAgent
from crishim.nri.plugin import PluginSession
from crishim.rewrite import AllocationRewriter, NodeDevices
from devices.registry import load_plugins
from devices.sim import sim_gpu_id
from kubegpu.allocation import ANNOTATION, Allocation, ContainerAllocation, KeyRing, Share, sign
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from tests.fixtures.common import missing_component
from tests.fixtures.keys import KEY, KEY_ID, SIGNING
from tests.support.crisandboxes import remove_sandbox, remove_sandboxes_since, sandbox_ids
from tests.support.mps_standin import events, kill_started, os_pid_alive, write_standin
from tests.test_nri_transport import PLUGIN, PluginThread, nri_containerd, started_output, wait_until

pytestmark = pytest.mark.containerd

__all__ = ["nri_containerd"]  # the module fixture of tests/test_nri_transport.py (plugin PLUGIN required)
NODE = "nri-mps-node"
# What the share's container shows: its env, then what it reaches of the daemon's directories.
PROBE = (
    "env; echo ===; "
    "echo pid=$(cat $CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid 2>/dev/null); "
    "echo shm=$(ls /dev/shm | tr '\\n' ' '); "
    "echo logs=$(ls $CUDA_MPS_LOG_DIRECTORY 2>/dev/null | tr '\\n' ' '); "
    "(touch $CUDA_MPS_LOG_DIRECTORY/x 2>/dev/null && echo log=writable) || echo log=readonly; "
    "(touch $CUDA_MPS_PIPE_DIRECTORY/x 2>/dev/null && echo pipe=writable) || echo pipe=readonly; "
    "echo END; exec sleep 100000"
)


def gpu(index: int) -> str:
    return sim_gpu_id(NODE, index)


@dataclass
class MpsNri:
    """An NRI agent with enforced shares, connected to the session's containerd."""

    containerd: Containerd
    control: Path
    mps_dir: Path
    logs: Path
    tmp: Path
    client: CriClient
    agent: NriAgent | None = None
    plugin: PluginThread | None = None

    def connect(self, **supervisor: object) -> NriAgent:
        """A new agent (an agent restart when one ran before): its own supervisor and watchdog
        over the same MPS directory, registered and synchronized."""
        assert self.containerd.nri_socket is not None
        plugins = load_plugins(
            ["sim"], {"node_name": NODE, "topology": "dgx1-v100", "state_dir": str(self.tmp / "sim")}
        )
        mps = MpsSupervisor(str(self.control), self.mps_dir, stop_timeout=5.0, **supervisor)  # type: ignore[arg-type]
        devices = NodeDevices(plugins, sysfs_root=None, sharing=MpsSharing(mps, interval=0.2))
        devices.discover()
        agent = NriAgent(AllocationRewriter(NODE, devices, KeyRing(None, SIGNING)))
        plugin = PluginThread(PluginSession(agent, socket=self.containerd.nri_socket, name=PLUGIN))
        plugin.synchronize()
        self.agent, self.plugin = agent, plugin
        return agent

    def disconnect(self) -> None:
        """The agent goes away (its watchdog too); the daemons it started keep running."""
        if self.plugin is not None:
            self.plugin.stop()
        if self.agent is not None and self.agent.rewriter.node_devices.sharing is not None:
            self.agent.rewriter.node_devices.sharing.close()
        self.agent = self.plugin = None

    @property
    def supervisor(self) -> MpsSupervisor:
        assert self.agent is not None and self.agent.rewriter.node_devices.sharing is not None
        supervisor = self.agent.rewriter.node_devices.sharing.supervisor
        assert supervisor is not None
        return supervisor

    def pod(
        self,
        name: str,
        devices: list[str],
        shares: dict[str, Share] | None = None,
        envs: list[tuple[str, str]] = (),  # type: ignore[assignment]
        mounts: list[tuple[str, str]] = (),  # type: ignore[assignment]
    ) -> tuple[str, str | grpc.RpcError]:
        """A sandbox with a signed allocation for its container ``app``, and the container's
        create straight on containerd (NRI is the only front): (sandbox id, container id or error)."""
        uid = str(uuid.uuid4())
        allocation = Allocation(NODE, uid, {"app": ContainerAllocation(tuple(devices), shares or {})})
        log_dir = self.logs / name
        log_dir.mkdir(parents=True, exist_ok=True)
        config = host_network_sandbox(name, uid, log_directory=str(log_dir))
        config.annotations[ANNOTATION] = sign(allocation, KEY_ID, KEY)
        sandbox = self.client.runtime.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=60)
        request = cri.CreateContainerRequest(
            pod_sandbox_id=sandbox.pod_sandbox_id,
            sandbox_config=config,
            config=shell_container("app", BUSYBOX_IMAGE, PROBE, log_path="app.log"),
        )
        for key, value in envs:  # in order, repeats kept: containerd appends each to the OCI env
            request.config.envs.add(key=key, value=value.encode())
        for host, inside in mounts:
            request.config.mounts.add(host_path=host, container_path=inside)
        try:
            created = self.client.runtime.CreateContainer(request, timeout=60).container_id
        except grpc.RpcError as error:
            return sandbox.pod_sandbox_id, error
        return sandbox.pod_sandbox_id, created

    def read(self, container: str, name: str) -> tuple[dict[str, str], dict[str, str]]:
        """Start the container; (its environment, what the probe saw)."""
        lines = started_output(self.client, container, self.logs / name / "app.log", f"{name}'s output")
        cut = lines.index("===")
        env = dict(line.split("=", 1) for line in lines[:cut] if "=" in line)
        seen = dict(line.split("=", 1) for line in lines[cut + 1 :] if "=" in line)
        return env, seen

    def remove_sandbox(self, sandbox: str) -> None:
        remove_sandbox(self.client, sandbox)


@pytest.fixture
def node(nri_containerd: Containerd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MpsNri]:
    if os.geteuid() != 0:
        missing_component("the MPS daemons' private /dev/shm needs root")
    monkeypatch.setenv("STANDIN_SHM_MARKER", "1")  # the daemons' /dev/shm is private here
    client = CriClient(nri_containerd.endpoint)
    before = sandbox_ids(client)
    control = write_standin(tmp_path / "bin")
    mps = MpsNri(nri_containerd, control, tmp_path / "mps", tmp_path / "logs", tmp_path, client)
    try:
        yield mps
    finally:
        remove_sandboxes_since(client, before, timeout=60)
        mps.disconnect()
        client.close()
        kill_started(control, signal.SIGTERM)


def test_a_share_through_nri_is_an_mps_client_of_its_gpus_daemon(node: MpsNri, tmp_path: Path) -> None:
    node.connect()
    volume = tmp_path / "volume"
    volume.mkdir()
    pipe = node.mps_dir / gpu(1) / "pipe"
    own = [
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"),
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=999999M"),
        ("CUDA_MPS_PIPE_DIRECTORY", "/tmp/elsewhere"),
    ]
    _, created = node.pod(
        "share",
        [gpu(1)],
        {gpu(1): Share(250, 4096)},
        envs=own,
        # the pod's own /dev/shm (an emptyDir) and mounts inside the daemon's directories
        mounts=[(str(volume), "/dev/shm"), (str(volume), "/dev/shm/cache"), (str(volume), f"{pipe}/sub")],
    )
    assert isinstance(created, str), created
    env, seen = node.read(created, "share")
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(node.mps_dir / gpu(1) / "log")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert env["NVIDIA_VISIBLE_DEVICES"] == gpu(1)
    (started,) = events(node.control, "started")
    assert started["visible"] == gpu(1)
    assert seen["pid"] == str(started["pid"])  # the daemon's pipe directory, through the mount
    assert f"kubegpu-standin-{started['pid']}" in seen["shm"].split()  # the daemon's own /dev/shm
    assert "cache" not in seen["shm"].split()  # the pod's mount inside it was dropped
    assert "control.log" in seen["logs"].split()
    assert (seen["log"], seen["pipe"]) == ("readonly", "readonly")
    assert not (pipe / "sub").exists() and not list(volume.iterdir())

    # A whole GPU gets no MPS at all, and no daemon starts for it.
    _, whole = node.pod("whole", [gpu(2)])
    assert isinstance(whole, str), whole
    env, seen = node.read(whole, "whole")
    assert not [key for key in env if key.startswith("CUDA_MPS_")]
    assert seen["pid"] == "" and f"kubegpu-standin-{started['pid']}" not in seen["shm"]
    assert len(events(node.control, "started")) == 1


def test_mps_settings_the_container_sets_twice_cannot_override_the_enforced_ones(node: MpsNri) -> None:
    """containerd puts both entries of a variable set twice (the image's and the pod's, or the pod's
    twice through CRI) in the OCI spec, and NRI v0.11 applies a plugin's value to the first and
    then lets the later original win: the enforced value must still be what the container runs
    with, or the create must be refused."""
    node.connect()
    twice = [
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"),
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=999999M"),
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"),
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=999999M"),
    ]
    _, created = node.pod("twice", [gpu(3)], {gpu(3): Share(250, 4096)}, envs=twice)
    if isinstance(created, str):  # what the container would run with
        env, _ = node.read(created, "twice")
        limits = {k: v for k, v in env.items() if k.startswith("CUDA_MPS_")}
        pytest.fail(f"created, with {limits}")
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is set 2 times" in (created.details() or ""), created
    assert node.agent is not None and not node.agent.rewriter.ledger.holdings()  # the share is free

    # Set twice to the very value kubegpu gives, the container runs with that value.
    same = [("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25"), ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25")]
    _, created = node.pod("same", [gpu(4)], {gpu(4): Share(250, 4096)}, envs=same)
    assert isinstance(created, str), created
    env, seen = node.read(created, "same")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    # without a /dev/shm of the pod's own, containerd's sandbox shm gives way to the daemon's too
    (started,) = [e for e in events(node.control, "started") if e["visible"] == gpu(4)]
    assert f"kubegpu-standin-{started['pid']}" in seen["shm"].split()


def test_a_device_selector_set_twice_cannot_survive_the_scrub_either(node: MpsNri) -> None:
    """The same NRI rule for every variable the core sets: a selector the scrub neutralises (or
    empties), set twice, would keep the container's own last value."""
    node.connect()
    for name, key in (
        ("twice-nvidia", "NVIDIA_VISIBLE_DEVICES"),
        ("twice-kubegpu", "KUBEGPU_VISIBLE_DEVICES"),
    ):
        _, created = node.pod(name, [gpu(5)], envs=[(key, "all"), (key, "all")])
        if isinstance(created, str):
            env, _ = node.read(created, name)
            pytest.fail(f"created, with {key}={env.get(key)!r}")
        assert f"{key} is set 2 times" in (created.details() or ""), created
        assert node.agent is not None and not node.agent.rewriter.ledger.holdings()  # the GPU is free


def test_a_daemon_that_cannot_start_refuses_the_create_with_the_proxys_reason_in_nris_time(
    node: MpsNri, monkeypatch: pytest.MonkeyPatch
) -> None:
    """containerd gives an NRI call 2 s (plugin_request_timeout); a daemon start may take up to
    the supervisor's start timeout. The create must still be refused with the reason, UNAVAILABLE
    (kubelet retries), the share freed, and the reason of the failed start named once known."""
    node.connect(start_timeout=4.0)
    monkeypatch.setenv("STANDIN_FAIL", "nopid")  # the daemon runs but never writes its pid file
    _, refused = node.pod("nopid", [gpu(6)], {gpu(6): Share(250, 2048)})
    assert isinstance(refused, grpc.RpcError), refused
    details = refused.details() or ""
    assert "not done in" not in details, details  # not the plugin's own deadline
    assert f"GPU {gpu(6)}: its MPS daemon has not started within" in details, details
    assert node.agent is not None and not node.agent.rewriter.ledger.holdings()  # the share is free
    wait_until(lambda: node.supervisor.failing(gpu(6)), 15, "the failed start to be recorded")

    _, again = node.pod("nopid-again", [gpu(6)], {gpu(6): Share(250, 2048)})  # kubelet's retry
    assert isinstance(again, grpc.RpcError), again
    assert "left no live daemon" in (again.details() or ""), again.details()  # the start's own reason

    monkeypatch.setenv("STANDIN_FAIL", "start")  # -d fails at once: the proxy's very refusal
    _, failed = node.pod("fails", [gpu(7)], {gpu(7): Share(250, 2048)})
    assert isinstance(failed, grpc.RpcError), failed
    assert "standin: cannot start: STANDIN_FAIL=start" in (failed.details() or ""), failed.details()
    assert not node.agent.rewriter.ledger.holdings()


def test_the_daemon_follows_the_ledger_through_stop_remove_and_an_agent_restart(node: MpsNri) -> None:
    node.connect()
    first_sandbox, first = node.pod("share-a", [gpu(0)], {gpu(0): Share(300, 2048)})
    second_sandbox, second = node.pod("share-b", [gpu(0)], {gpu(0): Share(300, 2048)})
    assert isinstance(first, str) and isinstance(second, str), (first, second)
    (started,) = events(node.control, "started")
    pid = int(started["pid"])  # type: ignore[call-overload]

    node.disconnect()  # the agent goes away: its daemon and the clients keep running
    assert os_pid_alive(pid)
    node.connect()  # the next agent's Synchronize books both shares and adopts the daemon
    wait_until(lambda: node.supervisor.pid(gpu(0)) == pid, 10, "the daemon to be known again")
    assert os_pid_alive(pid) and len(events(node.control, "started")) == 1

    node.client.runtime.StopContainer(cri.StopContainerRequest(container_id=first, timeout=1), timeout=60)
    assert node.agent is not None
    wait_until(lambda: len(node.agent.rewriter.ledger.holdings()) == 1, 10, "StopContainer to free a share")
    assert os_pid_alive(pid)  # the second share still holds the GPU
    node.remove_sandbox(first_sandbox)
    assert os_pid_alive(pid) and not events(node.control, "command")

    node.remove_sandbox(second_sandbox)  # the last share leaves: the daemon is told to quit
    wait_until(lambda: not os_pid_alive(pid), 15, "the daemon to stop")
    assert [c["command"] for c in events(node.control, "command")] == ["quit"]
    wait_until(lambda: not (node.mps_dir / gpu(0)).exists(), 10, "the GPU's MPS directory to go")
    assert len(events(node.control, "started")) == 1  # never restarted


def test_a_restarted_agent_stops_a_daemon_beside_a_container_holding_its_gpu_whole(node: MpsNri) -> None:
    """An agent restart must not restart (nor adopt) a daemon for a GPU a container now holds whole."""
    node.connect()
    _, whole = node.pod("whole", [gpu(2)])
    assert isinstance(whole, str), whole
    node.disconnect()
    # A daemon for that GPU still runs (left by an earlier agent whose share of it has gone).
    MpsSupervisor(str(node.control), node.mps_dir).ensure(gpu(2))
    (started,) = events(node.control, "started")
    pid = int(started["pid"])  # type: ignore[call-overload]

    node.connect()  # Synchronize: the container holds the GPU whole by its mark
    assert node.agent is not None
    assert [(h.device, h.milli) for h in node.agent.rewriter.ledger.holdings()] == [(gpu(2), 1000)]
    wait_until(lambda: not os_pid_alive(pid), 15, "the daemon beside the whole GPU to stop")
    assert [c["command"] for c in events(node.control, "command")] == ["quit"]
    assert len(events(node.control, "started")) == 1
