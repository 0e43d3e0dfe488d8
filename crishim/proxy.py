"""Raw-bytes forwarding of CRI calls from kubelet to the runtime (containerd).

Requests and responses are forwarded as opaque bytes: no parse, no copy beyond gRPC's own.
Methods of the CRI v1 descriptor use handlers of their streaming kind; any other method (a newer
CRI, or something we have never heard of) is forwarded as a bidirectional stream, which carries
every kind of call on the wire. Deadlines, cancellation and request metadata go upstream;
status codes, messages and trailing metadata (with rich error details) come back unchanged.
CreateContainer is routed through ``intercept.intercept_create_container``. Some calls are
answered by the shim itself, never forwarded (``refusal_for``), with a message naming the method
as called and the reason: the CRI v1alpha2 CreateContainer (still served by containerd 1.6 and
1.7: forwarding it would bypass the rewrite), any method path without its leading slash (which
containerd would dispatch as if it had one), and the methods the interceptor refuses. A failure
inside the shim itself comes back as INTERNAL and is counted as such, never as OK.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from crishim.cri import api_pb2
from crishim.intercept import (
    Completion,
    Interceptor,
    Refusal,
    Rejected,
    intercept_create_container,
)
from crishim.metrics import ShimMetrics
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.crishim")

CREATE_CONTAINER = "/runtime.v1.RuntimeService/CreateContainer"
REMOVE_CONTAINER = "/runtime.v1.RuntimeService/RemoveContainer"
START_CONTAINER = "/runtime.v1.RuntimeService/StartContainer"
REMOVE_SANDBOX = "/runtime.v1.RuntimeService/RemovePodSandbox"
V1ALPHA2_CREATE = "/runtime.v1alpha2.RuntimeService/CreateContainer"
# Older CRI versions' creates: refused, never forwarded (they would bypass the rewrite); so is any
# method path without its leading slash (see refusal_for).
REFUSED_METHODS: Mapping[str, Refusal] = {
    V1ALPHA2_CREATE: Refusal(
        grpc.StatusCode.UNIMPLEMENTED,
        "CRI v1alpha2's CreateContainer would create the container without the device-allocation "
        f"rewrite; this node creates containers only through CRI v1 ({CREATE_CONTAINER})",
    )
}
# How much of a caller's method path a refusal quotes.
MAX_METHOD_SHOWN = 200
# A hook sees the request bytes before forwarding; it returns the bytes to send and a callback
# told the outcome: the response bytes, or None when the call failed, with ``ambiguous`` True
# when the runtime may have done the work anyway (see AMBIGUOUS_FAILURES).
Outcome = Callable[[bytes | None, bool], None]
Hook = Callable[[bytes], Awaitable[tuple[bytes, Outcome | None]]]
UNKNOWN_METHOD_LABEL = "unknown"
# Failures after which the runtime may still have done the work: keep what a hook reserved.
AMBIGUOUS_FAILURES = frozenset(
    {grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN}
)
# Metadata gRPC sets itself, or that a server may not forward as request metadata.
_HOP_BY_HOP = frozenset({"user-agent", "content-type", "te", "host", ":authority"})


@dataclass(frozen=True)
class MethodKind:
    """Streaming kind of a CRI method, from the descriptor."""

    path: str
    client_streaming: bool
    server_streaming: bool


def cri_methods() -> dict[str, MethodKind]:
    """Every method of the CRI v1 services in our descriptor, keyed by its gRPC path."""
    methods: dict[str, MethodKind] = {}
    for service in api_pb2.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            path = f"/{service.full_name}/{method.name}"
            methods[path] = MethodKind(path, method.client_streaming, method.server_streaming)
    return methods


def refusal_for(method: str, refused: Mapping[str, Refusal]) -> Refusal | None:
    """Why the shim answers ``method`` itself instead of forwarding it; None to forward it.

    ``refused`` are the interceptor's own refusals (exact paths). Any path without its leading
    slash is refused: Go's gRPC server (containerd) dispatches ``runtime.v1.RuntimeService/X``
    like ``/runtime.v1.RuntimeService/X``, so forwarding it would reach the method past the
    shim's hooks. Other odd spellings (a trailing slash, another case, a doubled slash) name no
    method containerd serves: they are forwarded, and containerd answers UNIMPLEMENTED.
    """
    if method in refused:
        return refused[method]
    if method in REFUSED_METHODS:
        return REFUSED_METHODS[method]
    if not method.startswith("/"):
        return Refusal(
            grpc.StatusCode.UNIMPLEMENTED,
            "a method path must start with '/'; containerd would dispatch this one as "
            f"{'/' + method[:MAX_METHOD_SHOWN]!r}, past the shim's checks",
        )
    return None


def forwardable_metadata(metadata: Any) -> tuple[tuple[str, str | bytes], ...] | None:
    """Request metadata to send upstream: everything but gRPC's own and hop-by-hop keys."""
    if not metadata:
        return None
    kept = tuple(
        (key, value) for key, value in metadata if key not in _HOP_BY_HOP and not key.startswith("grpc-")
    )
    return kept or None


def _timeout(context: grpc.aio.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    # grpc reports a huge value (or None) when the caller set no deadline.
    if remaining is None or remaining > 1e8:
        return None
    return max(remaining, 0.0)


class ForwardingHandler(grpc.GenericRpcHandler):
    """A generic handler that forwards every call it is asked for to ``channel``."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        metrics: ShimMetrics,
        interceptor: Interceptor,
    ) -> None:
        self._channel = channel
        self._metrics = metrics
        self._interceptor = interceptor
        self._hooks: dict[str, Hook] = {
            CREATE_CONTAINER: self._create_container_hook,
            REMOVE_CONTAINER: self._remove_container_hook,
            START_CONTAINER: self._start_container_hook,
            REMOVE_SANDBOX: self._remove_sandbox_hook,
        }
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._refused = dict(interceptor.refused_methods())
        known = cri_methods()
        for kind in known.values():
            label = kind.path.rsplit("/", 1)[1]
            refusal = refusal_for(kind.path, self._refused)
            if refusal is not None:
                self._handlers[kind.path] = _refusing(kind, refusal, self._recorder(label))
            else:
                self._handlers[kind.path] = self._build(kind.path, kind, label)
        for path, refusal in {**REFUSED_METHODS, **self._refused}.items():
            if path not in known:
                kind = MethodKind(path, False, False)
                self._handlers[path] = _refusing(kind, refusal, self._recorder(UNKNOWN_METHOD_LABEL))

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is not None:
            return handler
        # Not cached below: unknown method names come from callers and must not grow memory.
        refusal = refusal_for(method, self._refused)
        if refusal is not None:
            return _refusing(MethodKind(method, False, False), refusal, self._recorder(UNKNOWN_METHOD_LABEL))
        return self._build(method, MethodKind(method, True, True), UNKNOWN_METHOD_LABEL)

    def _recorder(self, label: str) -> _Recorder:
        ok = self._metrics.calls.labels(label, "OK")
        return _Recorder(self._metrics, label, ok, self._metrics.latency.labels(label).observe)

    def _build(self, path: str, kind: MethodKind, label: str) -> grpc.RpcMethodHandler:
        record = self._recorder(label)
        if not kind.client_streaming and not kind.server_streaming:
            upstream_uu = self._channel.unary_unary(path)
            return grpc.unary_unary_rpc_method_handler(
                _unary_unary(upstream_uu, record, self._hooks.get(path))
            )
        if not kind.client_streaming:
            upstream_us = self._channel.unary_stream(path)
            return grpc.unary_stream_rpc_method_handler(_streaming(upstream_us, record))
        single = _streaming(self._channel.unary_stream(path), record)
        streamed = _streaming(self._channel.stream_stream(path), record)
        return grpc.stream_stream_rpc_method_handler(_any_kind(single, streamed))

    async def _create_container_hook(self, raw: bytes) -> tuple[bytes, Outcome | None]:
        rewritten, completion = await intercept_create_container(raw, self._interceptor)
        if completion is None:
            return rewritten, None
        return rewritten, _created(completion)

    async def _start_container_hook(self, raw: bytes) -> tuple[bytes, None]:
        """The interceptor may refuse to start a container (Rejected); bytes that do not parse are
        forwarded as they are (containerd refuses them itself)."""
        try:
            request = api_pb2.StartContainerRequest.FromString(raw)
        except Exception:  # noqa: BLE001 - not ours to judge: containerd answers it
            return raw, None
        self._interceptor.start_container(request.container_id)
        return raw, None

    async def _remove_container_hook(self, raw: bytes) -> tuple[bytes, Outcome]:
        def removed(response: bytes | None, ambiguous: bool) -> None:
            if response is not None:
                request = api_pb2.RemoveContainerRequest.FromString(raw)
                self._interceptor.removed_container(request.container_id)

        return raw, removed

    async def _remove_sandbox_hook(self, raw: bytes) -> tuple[bytes, Outcome]:
        def removed(response: bytes | None, ambiguous: bool) -> None:
            if response is not None:
                request = api_pb2.RemovePodSandboxRequest.FromString(raw)
                self._interceptor.removed_sandbox(request.pod_sandbox_id)

        return raw, removed


def _created(completion: Completion) -> Outcome:
    """Translate the CreateContainer response bytes into the new container id for a completion."""

    def done(response: bytes | None, ambiguous: bool) -> None:
        if response is None:
            completion(None, ambiguous)
        else:
            completion(api_pb2.CreateContainerResponse.FromString(response).container_id, False)

    return done


def _settle(outcome: Outcome | None, response: bytes | None, ambiguous: bool) -> None:
    """Tell a hook how its call ended; a failing hook is logged, never the caller's problem
    (the runtime has already answered)."""
    if outcome is None:
        return
    try:
        outcome(response, ambiguous)
    except Exception as error:  # noqa: BLE001 - bookkeeping must not turn a done call into an error
        log_event(log, "hook.outcome_failed", logging.ERROR, error=f"{type(error).__name__}: {error}"[:300])


def refusal_message(method: str, refusal: Refusal) -> str:
    """What the caller reads: the method as it asked for it (quoted, cut) and the reason."""
    return f"kubegpu crishim: method {method[:MAX_METHOD_SHOWN]!r} is refused: {refusal.reason}"


def _refusing(kind: MethodKind, refusal: Refusal, record: _Recorder) -> grpc.RpcMethodHandler:
    """A handler, of the method's own streaming kind, that answers every call with the refusal
    and forwards nothing."""
    message = refusal_message(kind.path, refusal)

    async def refuse(context: grpc.aio.ServicerContext) -> None:
        started = time.perf_counter()
        log_event(
            log, "call.refused", logging.WARNING, method=kind.path[:MAX_METHOD_SHOWN], code=refusal.code.name
        )
        record.done(started, refusal.code)
        await context.abort(refusal.code, message)

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> bytes:
        await refuse(context)
        raise AssertionError("unreachable")  # abort raises

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        await refuse(context)
        yield b""  # unreachable: abort raises; makes this an async generator

    if kind.client_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming)
    if kind.server_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming)
    return grpc.unary_unary_rpc_method_handler(unary)


class _Recorder:
    """Per-method metric children, bound once so the per-call path does no label lookups."""

    __slots__ = ("_metrics", "label", "ok", "observe")

    def __init__(self, metrics: ShimMetrics, label: str, ok: Any, observe: Callable[[float], None]) -> None:
        self._metrics = metrics
        self.label = label
        self.ok = ok
        self.observe = observe

    def done(self, started: float, code: grpc.StatusCode | None) -> None:
        self.observe(time.perf_counter() - started)
        if code is None or code is grpc.StatusCode.OK:
            self.ok.inc()
        else:
            self._metrics.calls.labels(self.label, code.name).inc()

    @property
    def inflight(self) -> Any:
        return self._metrics.inflight


async def _abort_with(context: grpc.aio.ServicerContext, error: grpc.aio.AioRpcError) -> None:
    await context.abort(error.code(), error.details() or "", tuple(error.trailing_metadata() or ()))


def _unary_unary(
    upstream: grpc.aio.UnaryUnaryMultiCallable,
    record: _Recorder,
    hook: Hook | None,
) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
    async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        started = time.perf_counter()
        code: grpc.StatusCode | None = None
        outcome: Outcome | None = None
        settled = False
        record.inflight.inc()
        try:
            if hook is not None:
                try:
                    request, outcome = await hook(request)
                except Rejected as rejected:
                    code = rejected.code
                    log_event(
                        log,
                        "create_container.rejected" if record.label == "CreateContainer" else "call.rejected",
                        logging.WARNING,
                        method=None if record.label == "CreateContainer" else record.label,
                        code=code.name,
                        reason=rejected.message,
                    )
                    await context.abort(rejected.code, rejected.message)
                except Exception as error:  # a bug or an unexpected input: INTERNAL, named, logged
                    code = grpc.StatusCode.INTERNAL
                    message = f"kubegpu crishim: internal error: {type(error).__name__}: {error}"[:1000]
                    log.exception("internal error in the %s hook", record.label)
                    log_event(log, "call.internal_error", logging.ERROR, method=record.label, error=message)
                    await context.abort(code, message)
            call = upstream(
                request,
                timeout=_timeout(context),
                metadata=forwardable_metadata(context.invocation_metadata()),
            )
            try:
                response = await call
            except grpc.aio.AioRpcError as error:
                code = error.code()
                settled = True
                _settle(outcome, None, code in AMBIGUOUS_FAILURES)
                await _abort_with(context, error)
            settled = True
            _settle(outcome, response, False)
            trailing = await call.trailing_metadata()
            if trailing:
                context.set_trailing_metadata(trailing)
            return response
        except asyncio.CancelledError:
            code = code or grpc.StatusCode.CANCELLED
            raise
        except BaseException:
            code = code or grpc.StatusCode.UNKNOWN
            raise
        finally:
            if not settled:  # cancelled or failed before the runtime answered: it may have acted
                _settle(outcome, None, True)
            record.inflight.dec()
            record.done(started, code)

    return forward


# How long a call of unknown kind may take to show that it sends exactly one message.
PEEK_SECONDS = 0.05
StreamingForward = Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[bytes]]


def _any_kind(single: StreamingForward, streamed: StreamingForward) -> StreamingForward:
    """Forward a call whose kind we do not know (a method from a newer CRI).

    A caller that sends one message and half-closes (unary or server-streaming, the common case)
    is forwarded as one request with streamed responses: message and half-close reach the runtime
    together. Anything else is pumped as a bidirectional stream.
    """

    async def forward(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        incoming = requests.__aiter__()
        try:
            first = await incoming.__anext__()
        except StopAsyncIteration:
            async for response in streamed(_replay([], None, incoming), context):
                yield response
            return
        second = asyncio.ensure_future(incoming.__anext__())
        await asyncio.wait([second], timeout=PEEK_SECONDS)
        if second.done() and not second.cancelled() and isinstance(second.exception(), StopAsyncIteration):
            async for response in single(first, context):
                yield response
            return
        async for response in streamed(_replay([first], second, incoming), context):
            yield response

    return forward


async def _replay(
    seen: list[bytes], pending: asyncio.Future[bytes] | None, rest: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    """The caller's messages again: those already read, the one being read, then the rest."""
    for message in seen:
        yield message
    if pending is not None:
        try:
            yield await pending
        except StopAsyncIteration:
            return
    async for message in rest:
        yield message


async def _pump(requests: AsyncIterator[bytes], call: grpc.aio.StreamStreamCall) -> None:
    """Copy the caller's messages to the runtime; stop quietly once either side is done."""
    try:
        async for message in requests:
            await call.write(message)
        await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
        return  # the runtime already finished the call; its status is what the caller gets


def _streaming(
    upstream: grpc.aio.UnaryStreamMultiCallable | grpc.aio.StreamStreamMultiCallable,
    record: _Recorder,
) -> Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[bytes]]:
    """Forward a call whose responses stream back: the request is bytes or an async iterator."""
    client_streaming = isinstance(upstream, grpc.aio.StreamStreamMultiCallable)

    async def forward(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        started = time.perf_counter()
        code: grpc.StatusCode | None = None
        record.inflight.inc()
        options = {
            "timeout": _timeout(context),
            "metadata": forwardable_metadata(context.invocation_metadata()),
        }
        # Client streams are pumped by our own task: when the runtime ends the call first (an
        # unknown method is refused at once), gRPC's own pump would fail the caller with INTERNAL.
        call = upstream(**options) if client_streaming else upstream(request, **options)
        pump = asyncio.create_task(_pump(request, call)) if client_streaming else None
        try:
            async for response in call:
                yield response
            trailing = await call.trailing_metadata()
            if trailing:
                context.set_trailing_metadata(trailing)
        except grpc.aio.AioRpcError as error:
            code = error.code()
            await _abort_with(context, error)
        except (asyncio.CancelledError, GeneratorExit):
            code = code or grpc.StatusCode.CANCELLED
            raise
        except BaseException:
            code = code or grpc.StatusCode.UNKNOWN
            raise
        finally:
            call.cancel()  # the caller went away or we failed: stop the upstream stream too
            if pump is not None:
                pump.cancel()
            record.inflight.dec()
            record.done(started, code)

    return forward
