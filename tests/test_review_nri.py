"""Hostile review of the NRI transport (crishim/nri): defects found by attacking the multiplexer,
ttrpc and the plugin session, each against the real containerd 2.x where containerd's behaviour is
what makes it a defect."""

from __future__ import annotations

import asyncio
import socket
import uuid
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2 as cri
from crishim.nri import api_pb2
from crishim.nri.mux import HEADER, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux, chunks
from crishim.nri.plugin import PluginSession
from crishim.nri.ttrpc import RESOURCE_EXHAUSTED, Endpoint, RpcError
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from tests.test_nri_transport import (
    PLUGIN,
    PluginThread,
    Recorder,
    mux_on_socketpair,
    nri_containerd,
    wait_until,
)

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


class SyncOnly:
    """Handlers for no event at all: the plugin only wants Synchronize's snapshot."""

    def __init__(self) -> None:
        self.synced: list[tuple[int, int]] = []

    def synchronize(self, pods: list, containers: list) -> None:
        self.synced.append((len(pods), len(containers)))


@pytest.mark.containerd
def test_a_plugin_with_no_event_handlers_does_not_break_container_creation(
    nri_containerd: Containerd, tmp_path: Path
) -> None:
    """NRI reads an event mask of 0 as "every event": containerd then sends CreateContainer (and
    the rest) to a plugin that serves none of them, and every create fails UNIMPLEMENTED."""
    assert nri_containerd.nri_socket is not None
    client = CriClient(nri_containerd.endpoint)
    handlers = SyncOnly()
    plugin = PluginThread(PluginSession(handlers, socket=nri_containerd.nri_socket, name=PLUGIN))
    sandbox = ""
    try:
        plugin.run(plugin.session.connect())
        wait_until(lambda: plugin.session.synchronized.is_set(), 10, "Synchronize")
        assert handlers.synced
        sandbox, made, _ = try_create(client, tmp_path, "no-events")
        assert isinstance(made, str), made
    finally:
        if sandbox:
            client.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sandbox), timeout=60)
            client.runtime.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox), timeout=60)
        client.close()
        plugin.stop()


def test_bytes_for_a_connection_nobody_opened_are_dropped_not_kept() -> None:
    """NRI's multiplexer drops chunks for a connection id not opened on its side. Ours kept them in
    a new channel's buffer that nobody reads: a peer could grow the plugin's memory without bound."""

    async def scenario() -> None:
        left, right = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=left)
        mux = Mux(reader, writer)
        opened = mux.channel(PLUGIN_SERVICE_CONN)
        mux.start()
        right.setblocking(False)
        loop = asyncio.get_running_loop()
        for conn_id in range(3, 40):
            for piece in chunks(conn_id, b"z" * 65536):
                await loop.sock_sendall(right, piece)
        await loop.sock_sendall(right, HEADER.pack(PLUGIN_SERVICE_CONN, 2) + b"ok")
        assert await asyncio.wait_for(opened.reader.readexactly(2), 2) == b"ok"
        late = mux.channel(3)  # opened after its bytes came: they are not there
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(late.reader.read(1), 0.2)
        right.close()
        await mux.close()

    asyncio.run(scenario())


def test_a_call_too_big_for_ttrpc_fails_as_an_rpc_error() -> None:
    """``Endpoint.call`` promises its result or RpcError; a payload over ttrpc's 4 MiB escaped as a
    bare ValueError (ttrpc's Go client answers RESOURCE_EXHAUSTED)."""

    async def scenario() -> None:
        mux, right = await mux_on_socketpair()
        endpoint = Endpoint(mux.channel(RUNTIME_SERVICE_CONN), None, name="runtime")
        endpoint.start()
        try:
            with pytest.raises(RpcError) as error:
                await endpoint.call("s", "m", b"x" * (5 << 20), 1)
            assert error.value.code == RESOURCE_EXHAUSTED
        finally:
            await endpoint.close()
            await mux.close()
            right.close()

    asyncio.run(scenario())
