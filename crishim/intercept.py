"""The shim's interception points: CreateContainer in, and container/sandbox removal observed.

Every other CRI call is forwarded as raw bytes. CreateContainer alone is parsed into a
``CreateContainerRequest``, handed to the interceptor, which may change it, and re-serialised.
protobuf keeps fields it does not know (from a newer CRI) through parse and serialise, so a
rewrite never drops what kubelet sent. An interceptor refuses a request by raising ``Rejected``.
It may return a completion, called once the create is over: with the new container's id, or with
None and ``ambiguous`` False when nothing was created, or None and ``ambiguous`` True when the
create failed in a way that leaves it open whether containerd created the container (deadline,
cancellation, UNKNOWN). StartContainer is forwarded untouched unless the interceptor refuses it
(``start_container`` raises ``Rejected``). RemoveContainer and RemovePodSandbox are forwarded
untouched; after they succeed the interceptor is told which container or sandbox is gone. An
interceptor may also name whole methods it refuses (``refused_methods``): the proxy answers
them itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import grpc
import grpc.aio

from crishim.cri import api_pb2

Completion = Callable[[str | None, bool], None]  # (container id, ambiguous)


# A refusal's message travels in the status trailers, which gRPC clients cap (C-core at 8 KiB,
# after percent-encoding every non-ASCII byte): it is cut to this many UTF-8 bytes.
MAX_MESSAGE_BYTES = 2000


def bounded(message: str) -> str:
    """``message`` cut to MAX_MESSAGE_BYTES UTF-8 bytes (at a character), marked when cut."""
    data = message.encode("utf-8", "replace")
    if len(data) <= MAX_MESSAGE_BYTES:
        return message
    marker = f" ... ({len(data)} bytes, cut)"
    return data[: MAX_MESSAGE_BYTES - len(marker)].decode("utf-8", "ignore") + marker


@dataclass(frozen=True)
class Refusal:
    """A whole CRI method an interceptor refuses (never forwarded): gRPC code and the reason."""

    code: grpc.StatusCode
    reason: str


class Rejected(Exception):
    """The request is refused with ``code`` and ``message``; nothing reaches the runtime."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        message = bounded(message)
        super().__init__(message)
        self.code = code
        self.message = message


class Interceptor(Protocol):
    """What the shim asks about CreateContainer and tells about removals, plus its lifecycle:
    ``start`` begins background work once the runtime channel exists, ``ready`` returns when
    the interceptor can decide creates (the shim waits for it, bounded, before READY=1)."""

    def start(self, channel: grpc.aio.Channel, health_interval: float) -> list[asyncio.Task[None]]: ...

    async def ready(self) -> None: ...

    async def create_container(
        self, request: api_pb2.CreateContainerRequest
    ) -> tuple[api_pb2.CreateContainerRequest, Completion | None]: ...

    def start_container(self, container_id: str) -> None:
        """Raise ``Rejected`` to refuse starting the container; return to let it start."""
        ...

    def removed_container(self, container_id: str) -> None: ...

    def removed_sandbox(self, sandbox_id: str) -> None: ...

    def refused_methods(self) -> Mapping[str, Refusal]:
        """CRI methods (full gRPC paths) this interceptor cannot let through, with the reason."""
        ...


class PassthroughInterceptor:
    """Changes nothing (the shim without device allocation)."""

    def start(self, channel: grpc.aio.Channel, health_interval: float) -> list[asyncio.Task[None]]:
        return []

    async def ready(self) -> None:
        return None

    async def create_container(
        self, request: api_pb2.CreateContainerRequest
    ) -> tuple[api_pb2.CreateContainerRequest, Completion | None]:
        return request, None

    def start_container(self, container_id: str) -> None:
        return None

    def removed_container(self, container_id: str) -> None:
        return None

    def removed_sandbox(self, sandbox_id: str) -> None:
        return None

    def refused_methods(self) -> Mapping[str, Refusal]:
        return {}


def parse_create_container(raw: bytes) -> api_pb2.CreateContainerRequest:
    """Parse kubelet's bytes; Rejected (INVALID_ARGUMENT) when they are not a CreateContainerRequest."""
    try:
        return api_pb2.CreateContainerRequest.FromString(raw)
    except Exception as exc:  # protobuf raises DecodeError, or others on corrupt input
        raise Rejected(
            grpc.StatusCode.INVALID_ARGUMENT, f"kubegpu crishim: cannot parse CreateContainerRequest: {exc}"
        ) from exc


async def intercept_create_container(raw: bytes, interceptor: Interceptor) -> tuple[bytes, Completion | None]:
    """Parse, let the interceptor rewrite, serialise. Unknown fields survive the round trip."""
    request, completion = await interceptor.create_container(parse_create_container(raw))
    return request.SerializeToString(), completion
