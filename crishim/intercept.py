"""The CreateContainer interception point of the shim.

Every other CRI call is forwarded as raw bytes. CreateContainer alone is parsed into a
``CreateContainerRequest``, handed to a rewriter that may change it, and re-serialised.
protobuf keeps fields it does not know (from a newer CRI) through parse and serialise, so a
rewrite never drops what kubelet sent. A rewriter refuses a request by raising ``Rejected``.
"""

from __future__ import annotations

from typing import Protocol

import grpc

from crishim.cri import api_pb2


class Rejected(Exception):
    """The rewriter refuses the request; the caller gets ``code`` and ``message``, nothing is created."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class CreateContainerRewriter(Protocol):
    """Turns kubelet's CreateContainerRequest into the one containerd receives."""

    def rewrite(self, request: api_pb2.CreateContainerRequest) -> api_pb2.CreateContainerRequest: ...


class IdentityRewriter:
    """Passes the request through unchanged (the default until allocations are applied)."""

    def rewrite(self, request: api_pb2.CreateContainerRequest) -> api_pb2.CreateContainerRequest:
        return request


def rewrite_create_container(raw: bytes, rewriter: CreateContainerRewriter) -> bytes:
    """Parse a serialised CreateContainerRequest, rewrite it and serialise the result.

    Raises ``Rejected`` (INVALID_ARGUMENT) when the bytes are not a CreateContainerRequest, or
    whatever ``Rejected`` the rewriter raises.
    """
    try:
        request = api_pb2.CreateContainerRequest.FromString(raw)
    except Exception as exc:  # protobuf raises DecodeError, or others on corrupt input
        raise Rejected(
            grpc.StatusCode.INVALID_ARGUMENT, f"kubegpu crishim: cannot parse CreateContainerRequest: {exc}"
        ) from exc
    return rewriter.rewrite(request).SerializeToString()
