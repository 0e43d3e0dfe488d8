"""Hostile review of the NRI transport (crishim/nri): defects found by attacking the multiplexer,
ttrpc and the plugin session, each against the real containerd 2.x where containerd's behaviour is
what makes it a defect."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2 as cri
from crishim.nri import api_pb2
from crishim.nri.plugin import PluginSession
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from tests.test_nri_transport import PLUGIN, PluginThread, Recorder, nri_containerd, wait_until

__all__ = ["nri_containerd"]  # the module fixture, shared with tests/test_nri_transport.py


class SlowRecorder(Recorder):
    """A CreateContainer handler stuck past containerd's request timeout (2 s) while ``delay`` is."""

    delay = 3.5

    async def create_container(  # type: ignore[override]
        self, request: api_pb2.CreateContainerRequest
    ) -> api_pb2.CreateContainerResponse:
        await asyncio.sleep(self.delay)
        return super().create_container(request)


def try_create(client: CriClient, logs: Path, name: str) -> tuple[str, str | grpc.RpcError, str]:
    """(sandbox id, container id or the create's error, the container's log path)."""
    config = host_network_sandbox(name, str(uuid.uuid4()), log_directory=str(logs))
    sandbox = client.runtime.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=60).pod_sandbox_id
    request = cri.CreateContainerRequest(
        pod_sandbox_id=sandbox,
        sandbox_config=config,
        config=shell_container("app", BUSYBOX_IMAGE, "env; echo END", log_path=f"{name}.log"),
    )
    try:
        return sandbox, client.runtime.CreateContainer(request, timeout=60).container_id, f"{name}.log"
    except grpc.RpcError as error:
        return sandbox, error, f"{name}.log"


@pytest.mark.containerd
def test_a_handler_slower_than_containerds_timeout_fails_the_create_instead_of_skipping_the_plugin(
    nri_containerd: Containerd, tmp_path: Path
) -> None:
    """containerd treats a plugin's DEADLINE_EXCEEDED as fatal: it drops the plugin and creates the
    container WITHOUT its adjustment (the required-plugin check already counted it present). The
    plugin must answer with an error of its own before containerd's deadline, so the create fails
    closed."""
    assert nri_containerd.nri_socket is not None
    client = CriClient(nri_containerd.endpoint)
    handlers = SlowRecorder()
    plugin = PluginThread(PluginSession(handlers, socket=nri_containerd.nri_socket, name=PLUGIN))
    sandboxes = []
    try:
        plugin.run(plugin.session.connect())
        wait_until(lambda: plugin.session.synchronized.is_set(), 10, "Synchronize")
        sandbox, made, _ = try_create(client, tmp_path, "slow")
        sandboxes.append(sandbox)
        assert isinstance(made, grpc.RpcError), "container created without the plugin's adjustment"
        assert "not done in" in (made.details() or ""), made.details()
        handlers.delay = 0  # the same session, still connected, adjusts the next create
        sandbox, made, log = try_create(client, tmp_path, "fast")
        sandboxes.append(sandbox)
        assert isinstance(made, str), made
        assert [name for _, name, _ in handlers.created] == ["app"]
    finally:
        for sandbox in sandboxes:
            client.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sandbox), timeout=60)
            client.runtime.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox), timeout=60)
        client.close()
        plugin.stop()
