"""End to end: scheduler (real apiserver) -> signed Binding -> shim (real containerd) -> container.

kubelet is played by the test: it takes the bound pod's UID and annotations into the sandbox
config, as kubelet does, and creates the container through the shim. The container's own view
(``env`` and ``ls /dev/kubegpu-sim``) must show exactly the GPUs the scheduler chose.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from kubernetes import client as k8s

from crishim.cri import api_pb2
from kubegpu.allocation import ANNOTATION, KeyRing, verify
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd
from kubegpu.devenv.controlplane import ControlPlane, create_fake_node
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from kubegpu.devenv.shimproc import ShimProcess, sim_node_args
from scheduler.live.config import SchedulerConfig
from scheduler.live.scheduler import Scheduler
from tests.fixtures.keys import KEY_ID, public, write_node_keys, write_scheduler_keys
from tests.test_scheduler_api import gpu_index, gpu_pod, wait_bound

pytestmark = [pytest.mark.apiserver, pytest.mark.containerd]


def test_container_sees_exactly_the_scheduled_gpus(
    control_plane: ControlPlane,
    admin_api: k8s.ApiClient,
    kube_namespace: str,
    containerd: Containerd,
    tmp_path: Path,
) -> None:
    core = k8s.CoreV1Api(admin_api)
    run = uuid.uuid4().hex[:6]
    node = f"e2e-{run}"
    state = tmp_path / "sim"
    # The node object as kubelet leaves it; the shim's own advertiser publishes its devices.
    create_fake_node(
        core, node, labels={"run": run}, capacity={"cpu": "64", "memory": "256Gi", "pods": "110"}
    )
    # As deployed: the scheduler holds the private key, the node only the public one.
    keys = write_node_keys(tmp_path / "node-keys")
    scheduler_keys = write_scheduler_keys(tmp_path / "scheduler-keys")
    shim = ShimProcess(
        socket=Path(f"/tmp/kgshim-e2e-{run}.sock"),
        runtime_endpoint=containerd.endpoint,
        log_path=tmp_path / "crishim.log",
        extra_args=[
            *sim_node_args(node, "dgx1-v100", str(state / node), str(keys)),
            "--advertise",
            "--kubeconfig",
            str(control_plane.admin_kubeconfig),
            "--advertise-interval",
            "0.5",
        ],
    ).start()
    deadline = time.monotonic() + 30
    while (core.read_node(node).status.capacity or {}).get("nvidia.com/gpu") != "8":
        assert time.monotonic() < deadline, f"the shim did not advertise:\n{shim.log_tail()}"
        time.sleep(0.2)
    scheduler = Scheduler(
        SchedulerConfig(scheduler_name=f"kubegpu-{run}", signing_key_id=KEY_ID, policy="bestfit"),
        admin_api,
        KeyRing(scheduler_keys, allow_private=True),
        seed=3,
    )
    scheduler.start_watching()
    assert scheduler.wait_synced(30)
    scheduler.leading.set()
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    client = CriClient(shim.endpoint)
    try:
        core.create_namespaced_pod(
            kube_namespace,
            gpu_pod(kube_namespace, "train", 2, scheduler=f"kubegpu-{run}", selector={"run": run}),
        )
        pod = wait_bound(core, kube_namespace, ["train"])["train"]
        granted = verify(pod.metadata.annotations[ANNOTATION], public()).containers["app"].devices
        assert pod.spec.node_name == node and len(granted) == 2

        # kubelet's part: sandbox with the pod's identity and annotations, then the container.
        logs = tmp_path / "logs"
        logs.mkdir()
        sandbox_config = host_network_sandbox(
            "train",
            pod.metadata.uid,
            namespace=kube_namespace,
            log_directory=str(logs),
            annotations=dict(pod.metadata.annotations),
        )
        sandbox = client.runtime.RunPodSandbox(
            api_pb2.RunPodSandboxRequest(config=sandbox_config)
        ).pod_sandbox_id
        container = client.runtime.CreateContainer(
            api_pb2.CreateContainerRequest(
                pod_sandbox_id=sandbox,
                sandbox_config=sandbox_config,
                config=shell_container(
                    "app",
                    BUSYBOX_IMAGE,
                    "env; ls /dev/kubegpu-sim; echo END",
                    log_path="app.log",
                    envs={"NVIDIA_VISIBLE_DEVICES": "all"},
                ),
            )
        ).container_id
        client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container))
        log = logs / "app.log"
        deadline = time.monotonic() + 20
        while not (log.exists() and "END" in log.read_text()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        lines = [line.split(" ", 3)[-1] for line in log.read_text().splitlines()]
        env = dict(line.split("=", 1) for line in lines if "=" in line)
        seen = sorted(line for line in lines if line.startswith("gpu"))
        assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(granted)
        assert seen == sorted(f"gpu{gpu_index(node, d)}" for d in granted)
        client.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox))
        client.runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox))
    finally:
        client.close()
        scheduler.stop()
        thread.join(timeout=10)
        shim.stop()
