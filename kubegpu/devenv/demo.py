"""``make demo``: the shim in front of a private containerd, driven the way kubelet drives it.

Starts containerd and ``kubegpu crishim``, runs a host-network pod with one container through
the shim, shows what the container saw (its env and /dev, from its CRI log), then what the shim
measured, and tears everything down.
"""

from __future__ import annotations

import sys
import time
import urllib.request
import uuid

from crishim.cri import api_pb2
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from kubegpu.devenv.shimproc import ShimProcess


def run() -> int:
    with Containerd() as containerd:
        shim = ShimProcess(
            containerd.base / "crishim.sock", containerd.endpoint, containerd.base / "crishim.log"
        ).start()
        client = CriClient(shim.endpoint)
        try:
            version = client.runtime.Version(api_pb2.VersionRequest())
            print(
                f"kubelet -> kubegpu crishim ({shim.socket}) -> {version.runtime_name} "
                f"{version.runtime_version}"
            )
            logs = containerd.base / "pod-logs"
            logs.mkdir()
            pod = host_network_sandbox("demo", str(uuid.uuid4()), log_directory=str(logs))
            sandbox = client.runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=pod))
            container = shell_container(
                "show",
                BUSYBOX_IMAGE,
                "env | sort; ls -l /dev",
                log_path="show.log",
                envs={"GREETING": "hello from kubegpu"},
            )
            created = client.runtime.CreateContainer(
                api_pb2.CreateContainerRequest(
                    pod_sandbox_id=sandbox.pod_sandbox_id, config=container, sandbox_config=pod
                )
            )
            client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=created.container_id))
            for _ in range(100):
                state = client.runtime.ContainerStatus(
                    api_pb2.ContainerStatusRequest(container_id=created.container_id)
                ).status.state
                if state == api_pb2.CONTAINER_EXITED:
                    break
                time.sleep(0.05)
            print(f"\npod {sandbox.pod_sandbox_id[:12]} container {created.container_id[:12]} saw:")
            for line in (logs / "show.log").read_text().splitlines():
                print("  " + line.split(" ", 3)[-1])
            client.runtime.StopPodSandbox(
                api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox.pod_sandbox_id)
            )
            client.runtime.RemovePodSandbox(
                api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox.pod_sandbox_id)
            )
            metrics = urllib.request.urlopen(shim.metrics_url + "/metrics", timeout=5).read().decode()
            print("\nshim metrics (calls by method and code):")
            for line in metrics.splitlines():
                if line.startswith("kubegpu_crishim_calls_total") and not line.endswith(" 0.0"):
                    print("  " + line)
        finally:
            client.close()
            shim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(run())
