"""The NRI front's transport: ttrpc framing, NRI's multiplexer, and a plugin session with the real
containerd 2.x (NRI on a private socket): registration, Configure, Synchronize and a
CreateContainer whose adjustment reaches the container."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2 as cri
from crishim.nri import api_pb2, ttrpc_pb2
from crishim.nri.mux import HEADER, MAX_CHUNK, PLUGIN_SERVICE_CONN, Mux, chunks
from crishim.nri.plugin import PluginSession, event_mask, subscribed_events
from crishim.nri.ttrpc import (
    DEADLINE_EXCEEDED,
    INTERNAL,
    REQUEST,
    RESPONSE,
    UNAVAILABLE,
    UNIMPLEMENTED,
    Endpoint,
    ProtocolError,
    RpcError,
    frame,
    read_message,
)
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd, containerd2_bin_dir
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from tests.fixtures.common import missing_component, require_executable
from tests.support.crisandboxes import remove_sandbox

# -- framing ------------------------------------------------------------------------------------


def read_bytes(data: bytes) -> tuple[int, int, int, bytes]:
    """read_message over a stream holding ``data`` and then its end."""

    async def read() -> tuple[int, int, int, bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await read_message(reader)

    return asyncio.run(read())


def test_a_ttrpc_message_is_a_ten_byte_header_and_its_data() -> None:
    message = frame(5, REQUEST, b"abc", flags=2)
    assert message == struct.pack(">IIBB", 3, 5, 1, 2) + b"abc"
    assert read_bytes(message) == (5, REQUEST, 2, b"abc")


def test_a_message_over_four_mebibytes_is_neither_sent_nor_read() -> None:
    with pytest.raises(ValueError, match="over the"):
        frame(1, REQUEST, b"x" * ((4 << 20) + 1))
    header = struct.pack(">IIBB", (4 << 20) + 1, 1, REQUEST, 0)
    with pytest.raises(ProtocolError, match="over the"):
        read_bytes(header)


def test_a_connection_cut_inside_a_message_is_a_protocol_error_and_a_clean_end_is_eof() -> None:
    with pytest.raises(EOFError):
        read_bytes(b"")
    with pytest.raises(ProtocolError, match="header"):
        read_bytes(b"\x00\x00\x00")
    with pytest.raises(ProtocolError, match="inside a message"):
        read_bytes(struct.pack(">IIBB", 10, 1, REQUEST, 0) + b"short")


def test_mux_chunks_carry_the_connection_id_and_split_at_the_ttrpc_limit() -> None:
    assert chunks(2, b"hello") == [HEADER.pack(2, 5) + b"hello"]
    assert chunks(1, b"") == [HEADER.pack(1, 0)]
    big = b"y" * (MAX_CHUNK + 7)
    parts = chunks(1, big)
    assert [HEADER.unpack(p[:8]) for p in parts] == [(1, MAX_CHUNK), (1, 7)]
    assert b"".join(p[8:] for p in parts) == big
    with pytest.raises(ValueError, match="reserved"):
        chunks(0, b"x")


def test_event_masks_are_nris_bits() -> None:
    assert event_mask({api_pb2.Event.RUN_POD_SANDBOX}) == 1
    both = {api_pb2.Event.CREATE_CONTAINER, api_pb2.Event.REMOVE_CONTAINER}
    assert event_mask(both) == (1 << 3) | (1 << 10)
    with pytest.raises(ValueError):
        event_mask({api_pb2.Event.LAST})

    class Creates:
        def create_container(self, request: api_pb2.CreateContainerRequest) -> None: ...

        def remove_container(self, event: api_pb2.StateChangeEvent) -> None: ...

    assert subscribed_events(Creates()) == {api_pb2.Event.CREATE_CONTAINER, api_pb2.Event.REMOVE_CONTAINER}
    assert subscribed_events(object()) == set()


# -- two endpoints over one multiplexed socket pair ---------------------------------------------


async def mux_on_socketpair() -> tuple[Mux, socket.socket]:
    """A started Mux on one end of a socket pair, and the other end (the test plays the runtime)."""
    left, right = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=left)
    mux = Mux(reader, writer)
    mux.start()
    return mux, right


async def linked_pair(serve: object) -> tuple[Endpoint, Endpoint, Mux, Mux, socket.socket]:
    left, right = socket.socketpair()
    muxes = []
    for sock in (left, right):
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        mux = Mux(reader, writer)
        mux.start()
        muxes.append(mux)
    client = Endpoint(muxes[0].channel(PLUGIN_SERVICE_CONN), None, name="client")
    server = Endpoint(muxes[1].channel(PLUGIN_SERVICE_CONN), serve, name="server")  # type: ignore[arg-type]
    client.start()
    server.start()
    return client, server, muxes[0], muxes[1], right


async def echo(service: str, method: str, payload: bytes) -> bytes:
    if method == "Echo":
        return payload[::-1]
    if method == "Slow":
        await asyncio.sleep(5)
        return b""
    if method == "Crash":
        raise KeyError("boom")
    raise RpcError(UNIMPLEMENTED, f"{service}/{method}")


def test_calls_and_answers_cross_the_multiplexer_concurrently() -> None:
    async def scenario() -> None:
        client, server, m1, m2, _ = await linked_pair(echo)
        calls = (client.call("s", "Echo", bytes([i]) * 3 + b"!", 2) for i in range(20))
        answers = await asyncio.gather(*calls)
        assert answers == [b"!" + bytes([i]) * 3 for i in range(20)]
        big = bytes(range(256)) * 8192  # 2 MiB: one ttrpc message, one mux chunk
        assert await client.call("s", "Echo", big, 5) == big[::-1]
        for endpoint in (client, server):
            await endpoint.close()
        await m1.close()
        await m2.close()

    asyncio.run(scenario())


def test_errors_come_back_as_status_codes_never_as_hangs() -> None:
    async def scenario() -> None:
        client, server, m1, m2, far = await linked_pair(echo)
        with pytest.raises(RpcError) as unknown:
            await client.call("s", "Nope", b"", 2)
        assert unknown.value.code == UNIMPLEMENTED
        with pytest.raises(RpcError) as crash:
            await client.call("s", "Crash", b"", 2)
        assert crash.value.code == INTERNAL and "boom" in crash.value.message
        with pytest.raises(RpcError) as late:
            await client.call("s", "Slow", b"", 0.2)
        assert late.value.code == DEADLINE_EXCEEDED
        pending = asyncio.ensure_future(client.call("s", "Slow", b"", 10))
        await asyncio.sleep(0.1)
        await m2.close()  # the far side goes away mid-call
        with pytest.raises(RpcError) as gone:
            await pending
        assert gone.value.code == UNAVAILABLE
        with pytest.raises(RpcError) as after:
            await client.call("s", "Echo", b"x", 1)
        assert after.value.code == UNAVAILABLE
        for endpoint in (client, server):
            await endpoint.close()
        await m1.close()
        far.close()

    asyncio.run(scenario())


def test_garbage_on_the_trunk_closes_the_mux_with_the_reason() -> None:
    async def scenario() -> None:
        mux, right = await mux_on_socketpair()
        channel = mux.channel(PLUGIN_SERVICE_CONN)
        right.sendall(HEADER.pack(0, 4) + b"junk")  # connection id 0 is reserved
        await asyncio.wait_for(mux.closed.wait(), 2)
        assert "malformed" in str(mux.error)
        assert await channel.reader.read() == b""
        right.close()
        await mux.close()

    asyncio.run(scenario())


def test_a_response_for_an_unknown_stream_is_ignored_and_a_bad_type_breaks_the_connection() -> None:
    async def scenario() -> None:
        mux, right = await mux_on_socketpair()
        endpoint = Endpoint(mux.channel(PLUGIN_SERVICE_CONN), echo, name="x")
        endpoint.start()
        stray = ttrpc_pb2.Response(payload=b"nobody asked").SerializeToString()
        for piece in chunks(PLUGIN_SERVICE_CONN, frame(7, RESPONSE, stray)):
            right.sendall(piece)
        request = ttrpc_pb2.Request(service="s", method="Echo", payload=b"ab").SerializeToString()
        for piece in chunks(PLUGIN_SERVICE_CONN, frame(1, REQUEST, request)):
            right.sendall(piece)
        right.setblocking(False)
        data = b""
        deadline = time.monotonic() + 2
        while len(data) < 8 + 10 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            try:
                data += right.recv(4096)
            except BlockingIOError:
                pass
        assert HEADER.unpack(data[:8])[0] == PLUGIN_SERVICE_CONN
        stream_id, kind = struct.unpack(">IIBB", data[8:18])[1:3]
        response = ttrpc_pb2.Response()
        response.ParseFromString(data[18:])
        assert (stream_id, kind, response.payload) == (1, RESPONSE, b"ba")
        for piece in chunks(PLUGIN_SERVICE_CONN, frame(3, 9, b"")):
            right.sendall(piece)
        await asyncio.wait_for(endpoint.closed.wait(), 2)
        assert "unknown type 9" in str(endpoint.error)
        await endpoint.close()
        await mux.close()
        right.close()

    asyncio.run(scenario())


def test_a_plugin_index_must_be_two_digits() -> None:
    for bad in ("1", "100", "a1", "١٠"):
        with pytest.raises(ValueError, match="two digits"):
            PluginSession(object(), index=bad)


# -- the real containerd 2.x with NRI on --------------------------------------------------------


@pytest.fixture(scope="module")
def nri_containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    bin_dir = containerd2_bin_dir()
    if bin_dir is None:
        missing_component("containerd 2.x is not built: run `bash tests/containerd/build.sh`")
    assert bin_dir is not None
    require_executable("runc")
    socket_path = tmp_path_factory.mktemp("nri") / "nri.sock"
    instance = Containerd(bin_dir=bin_dir, nri_socket=socket_path, nri_required_plugins=(PLUGIN,))
    try:
        instance.start()
    except Exception as exc:
        instance.stop()
        missing_component(f"containerd 2.x with NRI could not start: {exc}")
    yield instance
    instance.stop()


PLUGIN = "kubegpu-test"


class Recorder:
    """Handlers that record what containerd sends and add one variable to each new container."""

    def __init__(self) -> None:
        self.configured: list[api_pb2.ConfigureRequest] = []
        self.synced: list[tuple[int, int]] = []
        self.created: list[tuple[str, str, dict[str, str]]] = []
        self.removed: list[str] = []

    def configure(self, request: api_pb2.ConfigureRequest) -> None:
        self.configured.append(request)

    def synchronize(self, pods: list, containers: list) -> None:
        self.synced.append((len(pods), len(containers)))

    def create_container(self, request: api_pb2.CreateContainerRequest) -> api_pb2.CreateContainerResponse:
        self.created.append((request.pod.uid, request.container.name, dict(request.pod.annotations)))
        adjust = api_pb2.ContainerAdjustment(env=[api_pb2.KeyValue(key="KUBEGPU_NRI", value=request.pod.uid)])
        return api_pb2.CreateContainerResponse(adjust=adjust)

    def remove_container(self, event: api_pb2.StateChangeEvent) -> None:
        self.removed.append(event.container.id)


class PluginThread:
    """A plugin session on its own event loop thread (the test drives CRI synchronously)."""

    def __init__(self, session: PluginSession) -> None:
        self.session = session
        self.loop = asyncio.new_event_loop()
        self.ended: str | None = None
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: object, timeout: float = 20) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def synchronize(self, what: str = "Synchronize") -> None:
        """Register the session with containerd and wait (10 s) for containerd's Synchronize."""
        self.run(self.session.connect())
        wait_until(self.session.synchronized.is_set, 10, what)

    def stop(self) -> None:
        self.run(self.session.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def wait_until(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.containerd
def test_a_plugin_registers_with_containerd_and_adjusts_a_new_container(
    nri_containerd: Containerd, tmp_path: Path
) -> None:
    assert nri_containerd.nri_socket is not None
    handlers = Recorder()
    plugin = PluginThread(PluginSession(handlers, socket=nri_containerd.nri_socket, name=PLUGIN))
    client = CriClient(nri_containerd.endpoint)
    sandbox = ""
    try:
        plugin.synchronize()
        assert handlers.configured[0].runtime_name == "containerd"
        assert handlers.configured[0].runtime_version.startswith("v2.")
        assert handlers.configured[0].request_timeout == 2000
        assert handlers.synced

        uid = str(uuid.uuid4())
        logs = tmp_path / "logs"
        logs.mkdir()
        config = host_network_sandbox("nri-pod", uid, log_directory=str(logs))
        config.annotations["kubegpu.io/allocation"] = "signed-allocation-text"
        made = client.runtime.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=60)
        sandbox = made.pod_sandbox_id
        request = cri.CreateContainerRequest(
            pod_sandbox_id=sandbox,
            sandbox_config=config,
            config=shell_container("app", BUSYBOX_IMAGE, "env; echo END", log_path="app.log"),
        )
        container = client.runtime.CreateContainer(request, timeout=60).container_id
        assert [(u, name) for u, name, _ in handlers.created] == [(uid, "app")]
        assert handlers.created[0][2]["kubegpu.io/allocation"] == "signed-allocation-text"
        output = started_output(client, container, logs / "app.log", "the container's output")
        assert f"KUBEGPU_NRI={uid}" in "\n".join(output)

        client.runtime.StopContainer(cri.StopContainerRequest(container_id=container, timeout=5), timeout=60)
        client.runtime.RemoveContainer(cri.RemoveContainerRequest(container_id=container), timeout=60)
        wait_until(lambda: container in handlers.removed, 10, "RemoveContainer")
    finally:
        if sandbox:
            remove_sandbox(client, sandbox)
        client.close()
        plugin.stop()


def started_output(client: CriClient, container: str, log: Path, what: str) -> list[str]:
    """Start ``container`` and wait (30 s) for ``END`` in its CRI log ``log``; the log's lines without
    their CRI prefix (time, stream, tag)."""
    client.runtime.StartContainer(cri.StartContainerRequest(container_id=container), timeout=60)
    wait_until(lambda: log.exists() and "END" in log.read_text(), 30, what)
    return [line.split(" ", 3)[-1] for line in log.read_text().splitlines()]


def create_in_new_sandbox(
    client: CriClient, logs: Path, name: str, image: str = BUSYBOX_IMAGE, script: str = "true"
) -> tuple[str, str | grpc.RpcError]:
    """(sandbox id, the created container's id or the create's error)."""
    config = host_network_sandbox(name, str(uuid.uuid4()), log_directory=str(logs))
    sandbox = client.runtime.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=60).pod_sandbox_id
    request = cri.CreateContainerRequest(
        pod_sandbox_id=sandbox,
        sandbox_config=config,
        config=shell_container("app", image, script, log_path="app.log"),
    )
    try:
        return sandbox, client.runtime.CreateContainer(request, timeout=60).container_id
    except grpc.RpcError as error:
        return sandbox, error


@pytest.mark.containerd
def test_containerd_refuses_every_create_while_the_required_plugin_is_away(
    nri_containerd: Containerd, tmp_path: Path
) -> None:
    """Fail closed: containerd's NRI validator requires the plugin by name, so no container is
    created before it registers or after its connection ends (a killed agent)."""
    assert nri_containerd.nri_socket is not None
    client = CriClient(nri_containerd.endpoint)
    sandboxes = []
    plugin: PluginThread | None = None
    try:
        sandbox, before = create_in_new_sandbox(client, tmp_path, "before-plugin")
        sandboxes.append(sandbox)
        assert isinstance(before, grpc.RpcError)
        assert f'required plugin "{PLUGIN}" not present' in (before.details() or "")

        plugin = PluginThread(PluginSession(Recorder(), socket=nri_containerd.nri_socket, name=PLUGIN))
        plugin.synchronize()
        sandbox, during = create_in_new_sandbox(client, tmp_path, "with-plugin")
        sandboxes.append(sandbox)
        assert isinstance(during, str), during

        plugin.stop()  # the agent's connection ends, as when it is killed
        plugin = None

        def refused() -> bool:
            sandbox, after = create_in_new_sandbox(client, tmp_path, f"after-{len(sandboxes)}")
            sandboxes.append(sandbox)
            return isinstance(after, grpc.RpcError) and "not present" in (after.details() or "")

        wait_until(refused, 10, "containerd to notice the plugin is gone")
    finally:
        for sandbox in sandboxes:
            remove_sandbox(client, sandbox)
        client.close()
        if plugin is not None:
            plugin.stop()
