"""The least a Python CRI proxy can do: forward every unary CRI call as opaque bytes, nothing else.

Run by ``bench/cri_cpu_floor.py`` as the floor of the shim's CPU per call: the same grpcio aio
stack, event loop (uvloop) and gRPC settings as ``kubegpu crishim`` (``crishim.grpc_settings``, the
shim's channel and server options), without the shim's metrics, hooks, metadata and deadline
handling. Not a product: it forwards unary calls only and rewrites nothing.

Usage: ``python bench/minimal_forwarder.py LISTEN_SOCKET RUNTIME_SOCKET``; prints ``READY`` once
it serves.
"""

from __future__ import annotations

import sys

from crishim import grpc_settings

grpc_settings.apply()  # before grpc is imported, as `kubegpu crishim` does

import grpc  # noqa: E402
import grpc.aio  # noqa: E402
import uvloop  # noqa: E402

from crishim.server import CHANNEL_OPTIONS, SERVER_OPTIONS  # noqa: E402


class Forward(grpc.GenericRpcHandler):
    """One cached unary-unary handler per method, forwarding bytes to the runtime."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None:
            upstream = self._channel.unary_unary(method)

            async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                return await upstream(request)

            handler = self._handlers[method] = grpc.unary_unary_rpc_method_handler(forward)
        return handler


async def serve(listen: str, runtime: str) -> None:
    channel = grpc.aio.insecure_channel(f"unix:{runtime}", options=CHANNEL_OPTIONS)
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers([Forward(channel)])
    server.add_insecure_port(f"unix:{listen}")
    await server.start()
    print("READY", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    uvloop.run(serve(sys.argv[1], sys.argv[2]))
