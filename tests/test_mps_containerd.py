"""Enforced shares through the shim and a real containerd: what an MPS client container really gets.

The node runs the sim plugin and the stand-in MPS control binary (tests/support/mps_standin.py),
which the shim starts as each shared GPU's daemon in a private mount namespace. Inside the share's
container: the CUDA_MPS_* variables, the daemon's pipe directory (its pid file readable), its log
directory read-only, and the daemon's own /dev/shm (the marker the daemon wrote there). A
whole-GPU container gets none of it. The daemon stops when the last share's pod is removed, and a
shim killed and restarted adopts the running daemon instead of starting another.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from crishim.cri import api_pb2
from kubegpu.allocation import Share
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd
from kubegpu.devenv.cri import CriClient, shell_container
from kubegpu.devenv.shimproc import ShimProcess, sim_node_args
from tests.fixtures.common import missing_component
from tests.fixtures.keys import write_node_keys
from tests.support.crisandboxes import remove_sandboxes_since, sandbox_ids
from tests.support.mps_standin import events, kill_started, os_pid_alive, write_standin
from tests.support.waiting import wait_for
from tests.test_crishim_rewrite import NODE, Node, gpu, visible

pytestmark = pytest.mark.containerd

PROBE = (
    "env; echo ---; ls -l /dev/kubegpu-sim 2>&1; echo ===; "
    "echo pid=$(cat $CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid 2>/dev/null); "
    "echo shm=$(ls /dev/shm | tr '\\n' ' '); "
    "echo logs=$(ls $CUDA_MPS_LOG_DIRECTORY 2>/dev/null | tr '\\n' ' '); "
    "(touch $CUDA_MPS_LOG_DIRECTORY/x 2>/dev/null && echo log=writable) || echo log=readonly; "
    "echo END; exec sleep 100000"
)


@dataclass
class MpsNode(Node):
    control: Path = Path()
    mps_dir: Path = Path()


@pytest.fixture
def node(containerd: Containerd, tmp_path: Path, direct: CriClient) -> Iterator[MpsNode]:
    if os.geteuid() != 0:
        missing_component("the MPS daemons' private /dev/shm needs root")
    keys = write_node_keys(tmp_path / "keys")
    control = write_standin(tmp_path / "bin")
    mps_dir = tmp_path / "mps"
    shim = ShimProcess(
        socket=Path(f"/tmp/kgshim-mps-{uuid.uuid4().hex[:8]}.sock"),
        runtime_endpoint=containerd.endpoint,
        log_path=tmp_path / "crishim.log",
        extra_args=[
            *sim_node_args(NODE, "dgx1-v100", str(tmp_path / "sim"), str(keys)),
            *("--mps-control", str(control), "--mps-dir", str(mps_dir)),
        ],
        env={"STANDIN_SHM_MARKER": "1"},  # the daemons' /dev/shm is private here
    ).start()
    client = CriClient(shim.endpoint)
    before = sandbox_ids(direct)
    yield MpsNode(shim, client, direct, tmp_path / "sim", tmp_path / "logs", control, mps_dir)
    client.close()
    shim.stop()
    remove_sandboxes_since(direct, before)
    kill_started(control, signal.SIGTERM)


def probe(output: str) -> dict[str, str]:
    tail = output.split("===", 1)[1]
    return dict(line.split("=", 1) for line in tail.splitlines() if "=" in line)


def share_pod(node: MpsNode, name: str, index: int, milli: int, memory: int) -> tuple[str, str]:
    uid = str(uuid.uuid4())
    annotation = node.signed(uid, {"app": [gpu(index)]}, shares={"app": {gpu(index): Share(milli, memory)}})
    sandbox, config = node.run_pod(name, annotation, uid)
    container = node.create(sandbox, config, "app", script=PROBE)
    return sandbox, node.start_and_read(container, name, "app")


def test_share_container_is_an_mps_client_of_its_gpus_daemon(node: MpsNode) -> None:
    sandbox, output = share_pod(node, "mps-share", 1, 250, 4096)
    env, devices = visible(output.split("===", 1)[0])
    assert devices == ["gpu1"]
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(node.mps_dir / gpu(1) / "pipe")
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(node.mps_dir / gpu(1) / "log")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    (started,) = events(node.control, "started")
    assert started["visible"] == gpu(1)
    seen = probe(output)
    assert seen["pid"] == str(started["pid"])  # the daemon's pipe directory, read through the mount
    assert f"kubegpu-standin-{started['pid']}" in seen["shm"].split()  # the daemon's own /dev/shm
    assert "control.log" in seen["logs"].split()
    assert seen["log"] == "readonly"

    # Another share of the same GPU joins the same daemon; a whole GPU gets no MPS at all.
    _, second = share_pod(node, "mps-share2", 1, 500, 8192)
    assert probe(second)["pid"] == str(started["pid"])
    assert visible(second.split("===", 1)[0])[0]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    uid = str(uuid.uuid4())
    whole_sandbox, config = node.run_pod("mps-whole", node.signed(uid, {"app": [gpu(2)]}), uid)
    whole = node.start_and_read(node.create(whole_sandbox, config, "app", script=PROBE), "mps-whole", "app")
    env, devices = visible(whole.split("===", 1)[0])
    assert devices == ["gpu2"]
    assert not [k for k in env if k.startswith("CUDA_MPS_")]
    assert probe(whole)["pid"] == "" and f"kubegpu-standin-{started['pid']}" not in probe(whole)["shm"]
    assert len(events(node.control, "started")) == 1


def test_daemon_stops_with_the_last_share_and_survives_a_shim_restart(node: MpsNode) -> None:
    first, output = share_pod(node, "mps-a", 4, 300, 2048)
    second, _ = share_pod(node, "mps-b", 4, 300, 2048)
    (started,) = events(node.control, "started")
    pid = int(started["pid"])  # type: ignore[call-overload]

    node.restart_shim(kill=True)  # SIGKILL: the daemon and its clients keep running, and are adopted
    wait_for(lambda: node.shim.log_path.read_text().count("mps.daemon_adopted") >= 1)
    assert os_pid_alive(pid) and len(events(node.control, "started")) == 1

    for sandbox in (first, second):
        node.client.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox))
    node.client.runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=first))
    assert os_pid_alive(pid)  # the second share still holds the GPU
    node.client.runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=second))
    wait_for(lambda: not os_pid_alive(pid))
    assert [c["command"] for c in events(node.control, "command")] == ["quit"]
    wait_for(lambda: not (node.mps_dir / gpu(4)).exists())


def exec_in(node: MpsNode, container: str, script: str) -> tuple[int, str]:
    done = node.client.runtime.ExecSync(
        api_pb2.ExecSyncRequest(container_id=container, cmd=["/bin/sh", "-c", script], timeout=20), timeout=60
    )
    return done.exit_code, (done.stdout + done.stderr).decode()


def test_a_running_client_reaches_the_restarted_daemon_through_its_read_only_mounts(node: MpsNode) -> None:
    uid = str(uuid.uuid4())
    annotation = node.signed(uid, {"app": [gpu(2)]}, shares={"app": {gpu(2): Share(250, 2048)}})
    sandbox, config = node.run_pod("mps-restart", annotation, uid)
    container = node.create(sandbox, config, "app", script=PROBE)
    node.start_and_read(container, "mps-restart", "app")
    (started,) = events(node.control, "started")
    pipe = node.mps_dir / gpu(2) / "pipe"

    # The client cannot change the daemon's pipe directory: not its pid file, not a new file.
    code, out = exec_in(node, container, f"rm -f {pipe}/nvidia-cuda-mps-control.pid; touch {pipe}/x")
    assert code != 0 and "Read-only file system" in out, out
    assert (pipe / "nvidia-cuda-mps-control.pid").exists() and not (pipe / "x").exists()

    os.kill(int(started["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    wait_for(lambda: len(events(node.control, "started")) == 2, timeout=30)  # the watchdog's restart
    new_pid = events(node.control, "started")[1]["pid"]
    # The container's mounts (made before the restart) show the new daemon, and reach it.
    code, out = exec_in(node, container, f"cat {pipe}/nvidia-cuda-mps-control.pid")
    assert (code, out.strip()) == (0, str(new_pid))
    code, out = exec_in(node, container, f"echo get_server_list > {pipe}/control")
    assert code == 0, out
    wait_for(
        lambda: (
            [(c["pid"], c["command"]) for c in events(node.control, "command")]
            == [(new_pid, "get_server_list")]
        )
    )
    marker = f"kubegpu-standin-{new_pid}"
    assert marker in exec_in(node, container, "ls /dev/shm")[1].split()  # the new daemon's /dev/shm


def test_user_mounts_inside_the_clients_mounts_are_dropped(node: MpsNode, tmp_path: Path) -> None:
    """A pod's volume at /dev/shm/<x> or inside the pipe directory would make the runtime create
    its mount point in the directories every share of the GPU shares (or fail on the read-only one)."""
    volume = tmp_path / "volume"
    volume.mkdir()
    uid = str(uuid.uuid4())
    annotation = node.signed(uid, {"app": [gpu(5)]}, shares={"app": {gpu(5): Share(250, 2048)}})
    sandbox, config = node.run_pod("mps-nested", annotation, uid)
    pipe = node.mps_dir / gpu(5) / "pipe"
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=sandbox,
        sandbox_config=config,
        config=shell_container("app", BUSYBOX_IMAGE, PROBE, log_path="app.log"),
    )
    for path in ("/dev/shm/cache", "/dev//shm/./other/", f"{pipe}/sub"):
        request.config.mounts.add(host_path=str(volume), container_path=path)
    container = node.client.runtime.CreateContainer(request, timeout=60).container_id
    output = node.start_and_read(container, "mps-nested", "app")
    (started,) = events(node.control, "started")
    assert f"kubegpu-standin-{started['pid']}" in probe(output)["shm"].split()
    assert sorted(os.listdir(node.mps_dir / gpu(5) / "shm")) == [f"kubegpu-standin-{started['pid']}"]
    assert not (pipe / "sub").exists()
    assert list(volume.iterdir()) == []
