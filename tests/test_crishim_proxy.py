"""The shim's forwarding rules, against a fake runtime that records what it receives.

containerd cannot show us the metadata it got, or return rich error details, or serve a method
from a future CRI; this fake can. The real-containerd behaviour is in test_crishim_containerd.py.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2
from crishim.intercept import PassthroughInterceptor, Rejected, intercept_create_container
from crishim.rewrite import REFUSED_ON_DEVICE_NODES
from crishim.server import CriShim, ShimConfig, ShimConfigError, prepare_socket_path, unix_path

DETAILS_KEY = "grpc-status-details-bin"


@dataclass
class FakeRuntime:
    """A gRPC server on a unix socket answering any method by fixed rules, recording calls."""

    socket: Path
    received: list[tuple[str, dict[str, str | bytes], bytes]] = field(default_factory=list)

    def handler(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method

        def record(request: bytes, context: grpc.ServicerContext) -> None:
            self.received.append((method, dict(context.invocation_metadata()), request))

        if method.endswith("/Version"):

            def version(request: bytes, context: grpc.ServicerContext) -> bytes:
                record(request, context)
                context.set_trailing_metadata((("x-runtime-trailer", "kept"),))
                return api_pb2.VersionResponse(runtime_name="fake").SerializeToString()

            return grpc.unary_unary_rpc_method_handler(version)
        if method.endswith("/ContainerStatus"):

            def missing(request: bytes, context: grpc.ServicerContext) -> bytes:
                record(request, context)
                context.abort_with_status(
                    _Status(
                        grpc.StatusCode.NOT_FOUND,
                        "no such container",
                        ((DETAILS_KEY, b"\x08\x05\x12\x03why"),),
                    )
                )
                raise AssertionError("unreachable")

            return grpc.unary_unary_rpc_method_handler(missing)
        if method.endswith("/GetContainerEvents"):

            def events(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
                record(request, context)
                for index in range(3):
                    yield api_pb2.ContainerEventResponse(container_id=f"c{index}").SerializeToString()

            return grpc.unary_stream_rpc_method_handler(events)
        if method.endswith("/CreateContainer"):

            def create(request: bytes, context: grpc.ServicerContext) -> bytes:
                record(request, context)
                sandbox = api_pb2.CreateContainerRequest.FromString(request).pod_sandbox_id
                if sandbox == "slow":  # never answers: the caller's deadline ends the call
                    while context.is_active():
                        threading.Event().wait(0.02)
                    self.received.append((method + "#cancelled", {}, b""))
                    return b""
                if sandbox == "missing":
                    context.abort(grpc.StatusCode.NOT_FOUND, "no such sandbox")
                return request  # an echo: field 1 (pod_sandbox_id) reads as the response's container_id

            return grpc.unary_unary_rpc_method_handler(create)
        if method.endswith("/Sleep"):

            def sleep(request: bytes, context: grpc.ServicerContext) -> bytes:
                record(request, context)
                while context.is_active():
                    threading.Event().wait(0.02)
                self.received.append((method + "#cancelled", {}, b""))
                return b""

            return grpc.unary_unary_rpc_method_handler(sleep)

        def echo(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            for request in requests:
                record(request, context)
                yield request

        return grpc.stream_stream_rpc_method_handler(echo)


@dataclass(frozen=True)
class _Status(grpc.Status):
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, bytes], ...]


class _Generic(grpc.GenericRpcHandler):
    def __init__(self, fake: FakeRuntime) -> None:
        self.fake = fake

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return self.fake.handler(handler_call_details)


@pytest.fixture
def fake_runtime(tmp_path: Path) -> Iterator[FakeRuntime]:
    fake = FakeRuntime(Path(f"/tmp/kgfake-{uuid.uuid4().hex[:8]}.sock"))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers([_Generic(fake)])
    server.add_insecure_port(f"unix:{fake.socket}")
    server.start()
    yield fake
    server.stop(0)
    fake.socket.unlink(missing_ok=True)


class ShimThread:
    """A CriShim served by an event loop in a background thread (for in-process interceptors)."""

    def __init__(self, config: ShimConfig, interceptor: object = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.shim = CriShim(config, interceptor)  # type: ignore[arg-type]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.shim.start(), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.shim.stop(), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def shim_over(fake_runtime: FakeRuntime) -> Iterator[Callable[..., grpc.Channel]]:
    """Start an in-process shim in front of the fake runtime; yields a channel factory."""
    started: list[tuple[ShimThread, grpc.Channel]] = []

    def start(interceptor: object = None) -> grpc.Channel:
        listen = Path(f"/tmp/kgshim-unit-{uuid.uuid4().hex[:8]}.sock")
        config = ShimConfig(
            listen=f"unix://{listen}", runtime_endpoint=f"unix://{fake_runtime.socket}", drain_seconds=1
        )
        shim = ShimThread(config, interceptor)
        channel = grpc.insecure_channel(f"unix:{listen}")
        started.append((shim, channel))
        return channel

    yield start
    for shim, channel in started:
        channel.close()
        shim.stop()


def test_metadata_goes_up_and_trailers_come_back(
    shim_over: Callable[..., grpc.Channel], fake_runtime: FakeRuntime
) -> None:
    channel = shim_over()
    call = channel.unary_unary("/runtime.v1.RuntimeService/Version")
    response, info = call.with_call(
        b"", metadata=(("x-request-id", "r-42"), ("x-bin", b"\x00\x01")), timeout=5
    )
    assert api_pb2.VersionResponse.FromString(response).runtime_name == "fake"
    method, metadata, _ = fake_runtime.received[-1]
    assert method == "/runtime.v1.RuntimeService/Version"
    assert metadata["x-request-id"] == "r-42"
    assert metadata["x-bin"] == b"\x00\x01"
    assert ("x-runtime-trailer", "kept") in tuple(info.trailing_metadata())


def test_error_code_message_and_details_come_back(shim_over: Callable[..., grpc.Channel]) -> None:
    call = shim_over().unary_unary("/runtime.v1.RuntimeService/ContainerStatus")
    with pytest.raises(grpc.RpcError) as caught:
        call(b"", timeout=5)
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == "no such container"
    assert (DETAILS_KEY, b"\x08\x05\x12\x03why") in tuple(caught.value.trailing_metadata())


def test_server_stream_is_relayed(shim_over: Callable[..., grpc.Channel]) -> None:
    call = shim_over().unary_stream("/runtime.v1.RuntimeService/GetContainerEvents")
    ids = [api_pb2.ContainerEventResponse.FromString(m).container_id for m in call(b"", timeout=5)]
    assert ids == ["c0", "c1", "c2"]


def test_unknown_method_from_a_future_cri_is_forwarded(
    shim_over: Callable[..., grpc.Channel], fake_runtime: FakeRuntime
) -> None:
    channel = shim_over()
    unary = channel.unary_unary("/runtime.v2.FutureService/Hello")
    assert unary(b"payload", timeout=5) == b"payload"
    bidi = channel.stream_stream("/runtime.v2.FutureService/Chat")
    assert list(bidi(iter([b"a", b"bb", b"ccc"]), timeout=5)) == [b"a", b"bb", b"ccc"]
    assert [m for m, _, _ in fake_runtime.received][-3:] == ["/runtime.v2.FutureService/Chat"] * 3


def test_conversational_bidi_stream_of_unknown_kind(shim_over: Callable[..., grpc.Channel]) -> None:
    """A caller that waits for each answer before sending more must not deadlock the peek."""
    import queue

    outbox: queue.Queue[bytes | None] = queue.Queue()

    def requests() -> Iterator[bytes]:
        while (message := outbox.get(timeout=10)) is not None:
            yield message

    call = shim_over().stream_stream("/runtime.v2.FutureService/Talk")(requests(), timeout=10)
    answers = []
    for word in (b"ping", b"pong", b"done"):
        outbox.put(word)
        answers.append(next(call))
    outbox.put(None)
    assert answers == [b"ping", b"pong", b"done"]
    assert list(call) == []


def test_client_cancellation_reaches_the_runtime(
    shim_over: Callable[..., grpc.Channel], fake_runtime: FakeRuntime
) -> None:
    call = shim_over().unary_unary("/runtime.v2.Slow/Sleep")
    future = call.future(b"", timeout=30)
    _wait(lambda: any(m == "/runtime.v2.Slow/Sleep" for m, _, _ in fake_runtime.received))
    future.cancel()
    _wait(lambda: any(m.endswith("#cancelled") for m, _, _ in fake_runtime.received))


class Tagging(PassthroughInterceptor):
    """Adds an env var; records completions and removals it is told about."""

    def __init__(self) -> None:
        self.completed: list[str | None] = []
        self.ambiguous: list[bool] = []
        self.removed: list[str] = []

    async def create_container(self, request):  # type: ignore[no-untyped-def]
        request.config.envs.add(key="REWRITTEN", value=b"yes")
        return request, self.done

    def done(self, container_id: str | None, ambiguous: bool) -> None:
        self.completed.append(container_id)
        self.ambiguous.append(ambiguous)

    def removed_container(self, container_id: str) -> None:
        self.removed.append("container:" + container_id)

    def removed_sandbox(self, sandbox_id: str) -> None:
        self.removed.append("sandbox:" + sandbox_id)


def test_create_container_goes_through_the_interceptor(
    shim_over: Callable[..., grpc.Channel], fake_runtime: FakeRuntime
) -> None:
    tagging = Tagging()
    channel = shim_over(tagging)
    request = api_pb2.CreateContainerRequest(pod_sandbox_id="sb")
    # CreateContainer is unary in the CRI; the fake answers unknown-to-it methods by echo.
    answer = channel.unary_unary("/runtime.v1.RuntimeService/CreateContainer")(
        request.SerializeToString(), timeout=5
    )
    seen = api_pb2.CreateContainerRequest.FromString(answer)
    assert seen.pod_sandbox_id == "sb"
    assert [(e.key, e.value) for e in seen.config.envs] == [("REWRITTEN", b"yes")]
    assert tagging.completed == ["sb"] and tagging.ambiguous == [False]


def test_a_create_that_ends_without_an_answer_is_reported_ambiguous(
    shim_over: Callable[..., grpc.Channel], fake_runtime: FakeRuntime
) -> None:
    """A deadline (or cancellation) may leave a container behind: the interceptor must hear
    "unknown", never "nothing was created"; a plain refusal by the runtime is "nothing"."""
    tagging = Tagging()
    call = shim_over(tagging).unary_unary("/runtime.v1.RuntimeService/CreateContainer")
    with pytest.raises(grpc.RpcError) as caught:
        call(api_pb2.CreateContainerRequest(pod_sandbox_id="slow").SerializeToString(), timeout=0.5)
    assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    _wait(lambda: len(tagging.completed) == 1)
    assert tagging.completed == [None] and tagging.ambiguous == [True]
    with pytest.raises(grpc.RpcError) as refused:
        call(api_pb2.CreateContainerRequest(pod_sandbox_id="missing").SerializeToString(), timeout=5)
    assert refused.value.code() is grpc.StatusCode.NOT_FOUND
    assert tagging.completed == [None, None] and tagging.ambiguous == [True, False]


def test_a_create_the_caller_cancels_before_the_runtime_answers_is_reported_ambiguous(
    shim_over: Callable[..., grpc.Channel], fake_runtime: FakeRuntime
) -> None:
    """kubelet cancels while containerd is still creating: the cancel goes upstream, and the
    interceptor hears "unknown" (containerd may finish the container anyway)."""
    tagging = Tagging()
    call = shim_over(tagging).unary_unary("/runtime.v1.RuntimeService/CreateContainer")
    future = call.future(
        api_pb2.CreateContainerRequest(pod_sandbox_id="slow").SerializeToString(), timeout=30
    )
    _wait(lambda: any(m.endswith("/CreateContainer") for m, _, _ in fake_runtime.received))
    future.cancel()
    _wait(lambda: len(tagging.completed) == 1)
    assert tagging.completed == [None] and tagging.ambiguous == [True]
    _wait(lambda: any(m.endswith("/CreateContainer#cancelled") for m, _, _ in fake_runtime.received))


def test_an_internal_failure_is_internal_and_counted_as_such(fake_runtime: FakeRuntime) -> None:
    class Broken(PassthroughInterceptor):
        async def create_container(self, request):  # type: ignore[no-untyped-def]
            raise TypeError("something the shim did not expect")

    listen = Path(f"/tmp/kgshim-unit-{uuid.uuid4().hex[:8]}.sock")
    shim = ShimThread(
        ShimConfig(
            listen=f"unix://{listen}", runtime_endpoint=f"unix://{fake_runtime.socket}", drain_seconds=1
        ),
        Broken(),
    )
    channel = grpc.insecure_channel(f"unix:{listen}")
    try:
        call = channel.unary_unary("/runtime.v1.RuntimeService/CreateContainer")
        with pytest.raises(grpc.RpcError) as caught:
            call(api_pb2.CreateContainerRequest(pod_sandbox_id="sb").SerializeToString(), timeout=5)
        assert caught.value.code() is grpc.StatusCode.INTERNAL
        assert "TypeError: something the shim did not expect" in caught.value.details()
        _wait(lambda: b'code="INTERNAL",method="CreateContainer"} 1.0' in shim.shim.metrics.render())
        assert b'code="OK",method="CreateContainer"} 0.0' in shim.shim.metrics.render()
        assert not any(m.endswith("/CreateContainer") for m, _, _ in fake_runtime.received)
    finally:
        channel.close()
        shim.stop()


def test_the_v1alpha2_create_is_refused_not_forwarded(
    shim_over: Callable[..., grpc.Channel], fake_runtime: FakeRuntime
) -> None:
    channel = shim_over(Tagging())
    with pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary("/runtime.v1alpha2.RuntimeService/CreateContainer")(b"", timeout=5)
    assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert "'/runtime.v1alpha2.RuntimeService/CreateContainer' is refused" in caught.value.details()
    assert not fake_runtime.received
    # Other v1alpha2 methods are still forwarded (containerd answers them as before).
    assert channel.unary_unary("/runtime.v1alpha2.RuntimeService/Version")(b"", timeout=5)


class RefusingRestore(PassthroughInterceptor):
    """Refuses RestorePod, as the allocation rewriter does on a device node."""

    def refused_methods(self):  # type: ignore[no-untyped-def]
        return REFUSED_ON_DEVICE_NODES


def test_restore_pod_is_refused_with_its_reason_and_never_forwarded_on_a_device_node(
    shim_over: Callable[..., grpc.Channel], fake_runtime: FakeRuntime
) -> None:
    restore = "/runtime.v1.RuntimeService/RestorePod"
    request = api_pb2.RestorePodRequest(checkpoint_path="/var/lib/kubelet/checkpoints/p.tar")
    channel = shim_over(RefusingRestore())
    with pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary(restore)(request.SerializeToString(), timeout=5)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert f"method {restore!r} is refused" in caught.value.details()
    assert "without CreateContainer" in caught.value.details() and "ledger" in caught.value.details()
    assert not fake_runtime.received
    # Checkpointing leaves the containers where they are: forwarded.
    checkpoint = "/runtime.v1.RuntimeService/CheckpointContainer"
    channel.unary_unary(checkpoint)(api_pb2.CheckpointContainerRequest(container_id="c").SerializeToString())
    assert [m for m, _, _ in fake_runtime.received] == [checkpoint]
    # Without device allocation (a plain proxy) RestorePod is forwarded like any other call.
    plain = shim_over(PassthroughInterceptor())
    plain.unary_unary(restore)(request.SerializeToString(), timeout=5)
    assert [m for m, _, _ in fake_runtime.received] == [checkpoint, restore]


@pytest.mark.parametrize(
    ("method", "reason"),
    [
        ("runtime.v1.RuntimeService/CreateContainer", "containerd would dispatch this one as "),
        ("runtime.v1.RuntimeService/Version", "must start with '/'"),
        ("runtime.v1alpha2.RuntimeService/CreateContainer", "must start with '/'"),
        ("runtime.v1.RuntimeService/RestorePod", "must start with '/'"),
        ("CreateContainer", "must start with '/'"),
        ("/runtime.v1alpha2.RuntimeService/CreateContainer", "CRI v1alpha2's CreateContainer"),
        ("/runtime.v1.RuntimeService/RestorePod", "without CreateContainer"),
    ],
)
def test_a_refusal_names_the_method_as_called_and_its_own_reason(
    shim_over: Callable[..., grpc.Channel], fake_runtime: FakeRuntime, method: str, reason: str
) -> None:
    channel = shim_over(RefusingRestore())
    with pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary(method)(b"", timeout=5)
    details = caught.value.details()
    assert f"method {method!r} is refused: " in details and reason in details, details
    if not method.startswith("/"):
        assert f"'/{method}'" in details and "CRI v1alpha2" not in details
    else:
        assert "must start with '/'" not in details
    if "RestorePod" not in method:
        assert "without CreateContainer" not in details
    assert not fake_runtime.received


@pytest.mark.parametrize(
    "method",
    [
        "/runtime.v1.RuntimeService/CreateContainer/",
        "/runtime.v1.RuntimeService/createcontainer",
        "/Runtime.V1.RuntimeService/CreateContainer",
        "//runtime.v1.RuntimeService/CreateContainer",
        "/runtime.v1alpha2.RuntimeService/Version",
    ],
)
def test_other_odd_spellings_are_forwarded_unchanged_not_rewritten(
    shim_over: Callable[..., grpc.Channel], fake_runtime: FakeRuntime, method: str
) -> None:
    """No other spelling is a method containerd serves under the create's name (Go's server
    matches the path exactly once one leading slash is gone): they go to the runtime as they
    are, and none is taken for a create to rewrite."""
    tagging = Tagging()
    channel = shim_over(tagging)
    raw = api_pb2.CreateContainerRequest(pod_sandbox_id="sb").SerializeToString()
    channel.unary_unary(method)(raw, timeout=5)
    assert [(m, r) for m, _, r in fake_runtime.received] == [(method, raw)]
    assert tagging.completed == []


def test_removals_are_reported_after_success(
    shim_over: Callable[..., grpc.Channel], fake_runtime: FakeRuntime
) -> None:
    tagging = Tagging()
    channel = shim_over(tagging)
    channel.unary_unary("/runtime.v1.RuntimeService/RemoveContainer")(
        api_pb2.RemoveContainerRequest(container_id="c1").SerializeToString(), timeout=5
    )
    channel.unary_unary("/runtime.v1.RuntimeService/RemovePodSandbox")(
        api_pb2.RemovePodSandboxRequest(pod_sandbox_id="s1").SerializeToString(), timeout=5
    )
    assert tagging.removed == ["container:c1", "sandbox:s1"]


def test_rejected_create_container_never_reaches_the_runtime(
    shim_over: Callable[..., grpc.Channel], fake_runtime: FakeRuntime
) -> None:
    class Refusing(PassthroughInterceptor):
        async def create_container(self, request):  # type: ignore[no-untyped-def]
            raise Rejected(grpc.StatusCode.FAILED_PRECONDITION, "pod default/p: device gpu-0 is taken")

    call = shim_over(Refusing()).unary_unary("/runtime.v1.RuntimeService/CreateContainer")
    with pytest.raises(grpc.RpcError) as caught:
        call(api_pb2.CreateContainerRequest(pod_sandbox_id="sb").SerializeToString(), timeout=5)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "gpu-0 is taken" in caught.value.details()
    assert not any(m.endswith("/CreateContainer") for m, _, _ in fake_runtime.received)


def test_garbage_create_container_gets_invalid_argument(
    shim_over: Callable[..., grpc.Channel], fake_runtime: FakeRuntime
) -> None:
    call = shim_over().unary_unary("/runtime.v1.RuntimeService/CreateContainer")
    with pytest.raises(grpc.RpcError) as caught:
        call(b"\xff\xff\xff\xff", timeout=5)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert not fake_runtime.received


def test_rewrite_keeps_fields_unknown_to_our_proto() -> None:
    """Fields from a newer CRI survive parse and re-serialise, nested ones too."""
    known = api_pb2.CreateContainerRequest(
        pod_sandbox_id="sb", config=api_pb2.ContainerConfig(image=api_pb2.ImageSpec(image="busybox"))
    )
    unknown_top = b"\xf8\x3e\x07"  # field 999, varint 7
    unknown_nested = b"\xa2\x3e\x03new"  # field 996, length-delimited "new"
    config = known.config.SerializeToString() + unknown_nested
    raw = (
        api_pb2.CreateContainerRequest(pod_sandbox_id="sb").SerializeToString()
        + b"\x12"
        + bytes([len(config)])
        + config
        + unknown_top
    )
    out, _ = asyncio.run(intercept_create_container(raw, PassthroughInterceptor()))
    assert unknown_top in out and unknown_nested in out
    parsed = api_pb2.CreateContainerRequest.FromString(out)
    assert parsed.config.image.image == "busybox"


def test_unix_endpoint_parsing() -> None:
    assert unix_path("unix:///run/x.sock") == Path("/run/x.sock")
    assert unix_path("unix:/run/x.sock") == Path("/run/x.sock")
    assert unix_path("/run/x.sock") == Path("/run/x.sock")
    with pytest.raises(ShimConfigError):
        unix_path("tcp://127.0.0.1:1")


def test_refuses_to_replace_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "not-a-socket"
    path.write_text("precious")
    with pytest.raises(ShimConfigError, match="not a socket"):
        prepare_socket_path(path)
    assert path.read_text() == "precious"


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        done.wait(0.02)
    raise AssertionError("condition not met")


def test_an_unreadable_symlink_in_a_device_host_path_is_invalid_argument(
    shim_over: Callable[..., grpc.Channel],
    fake_runtime: FakeRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A device host path through a symlink the shim may not read (readlink fails, as on
    ``/proc/<pid>/root`` of a process it may not trace) cannot be decided: the create is refused
    with INVALID_ARGUMENT naming the path and the reason, through the real rewriter and proxy,
    never INTERNAL, and nothing reaches the runtime."""
    import errno
    import os

    from crishim.rewrite import AllocationRewriter, NodeDevices
    from kubegpu.allocation import KeyRing

    link = tmp_path / "unreadable"
    link.symlink_to("/dev/null")
    real_readlink = os.readlink

    def readlink(path: object, *args: object, **kwargs: object) -> str:
        if os.fspath(path) == str(link):  # type: ignore[call-overload]
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_readlink(path, *args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(os, "readlink", readlink)

    class Attached(AllocationRewriter):
        def start(self, channel: object, health_interval: float) -> list[asyncio.Task[None]]:
            self.attach(channel)  # type: ignore[arg-type]
            self.rebuilt.set()
            return []

    rewriter = Attached("n", NodeDevices([], sysfs_root=None), KeyRing(None, {}))
    call = shim_over(rewriter).unary_unary("/runtime.v1.RuntimeService/CreateContainer")
    request = api_pb2.CreateContainerRequest(pod_sandbox_id="sb")
    request.sandbox_config.metadata.name, request.sandbox_config.metadata.namespace = "p", "default"
    request.config.metadata.name = "app"
    request.config.devices.add(host_path=f"{link}/x", container_path="/dev/x", permissions="rwm")
    with pytest.raises(grpc.RpcError) as caught:
        call(request.SerializeToString(), timeout=10)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    details = caught.value.details()
    assert "pod default/p container app" in details and f"{link}/x" in details
    assert "cannot be resolved: Permission denied" in details
    assert not any(m.endswith("/CreateContainer") for m, _, _ in fake_runtime.received)


def test_a_start_the_interceptor_refuses_never_reaches_the_runtime(
    shim_over: Callable[..., grpc.Channel], fake_runtime: FakeRuntime
) -> None:
    class RefusingStart(PassthroughInterceptor):
        def start_container(self, container_id: str) -> None:
            if container_id == "c-over":
                raise Rejected(grpc.StatusCode.FAILED_PRECONDITION, "container c-over: device taken")

    call = shim_over(RefusingStart()).unary_unary("/runtime.v1.RuntimeService/StartContainer")
    with pytest.raises(grpc.RpcError) as caught:
        call(api_pb2.StartContainerRequest(container_id="c-over").SerializeToString(), timeout=5)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == "container c-over: device taken"
    assert not any(m.endswith("/StartContainer") for m, _, _ in fake_runtime.received)
    started = api_pb2.StartContainerRequest(container_id="c-fine").SerializeToString()
    call(started, timeout=5)
    call(b"\xff\xff", timeout=5)  # not a request: containerd's to refuse (the fake echoes)
    assert [r for m, _, r in fake_runtime.received if m.endswith("/StartContainer")] == [started, b"\xff\xff"]
