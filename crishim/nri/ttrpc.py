"""ttrpc, containerd's small RPC protocol, on one logical connection of NRI's multiplexer.

A ttrpc message is a 10-byte header (the data's length as a big-endian uint32, the stream id as
a big-endian uint32, a type byte and a flags byte) followed by the data, at most 4 MiB. A unary
call is one ``Request`` message (type 1, a ``ttrpc.Request`` naming service and method, with the
argument as payload) answered on the same stream id by one ``Response`` (type 2, a status code
and message, the result as payload). A client numbers its streams 1, 3, 5, ... (odd ids).

``Endpoint`` plays both parts on a ``Channel`` (crishim/nri/mux.py): ``call`` sends a request and
waits for its response, and requests that arrive are passed to the ``serve`` handler, whose
answer (or ``RpcError``) goes back as the response; a handler still running at 90% of the
caller's deadline (the request's ``timeout_nano``) is cancelled and answered DEADLINE_EXCEEDED, so
the caller sees an error rather than its own timeout. A request naming a method the handler does
not know gets UNIMPLEMENTED, so the runtime sees an error rather than a hang. A message longer
than 4 MiB or of an unknown type breaks the connection (the peer sent something ttrpc never does).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from collections.abc import Awaitable, Callable

from crishim.nri import ttrpc_pb2
from crishim.nri.mux import TTRPC_MAX_MESSAGE, Channel
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.nri")

HEADER = struct.Struct(">IIBB")
REQUEST = 0x1
RESPONSE = 0x2
DATA = 0x3

# gRPC status codes, as ttrpc uses them
OK = 0
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14


class RpcError(Exception):
    """A call's failure as a status code and message (sent by a handler, or received)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ProtocolError(ConnectionError):
    """The peer broke ttrpc's framing; the connection cannot be trusted any further."""


Handler = Callable[[str, str, bytes], Awaitable[bytes]]


def frame(stream_id: int, kind: int, data: bytes, flags: int = 0) -> bytes:
    """One ttrpc message: header and data."""
    if len(data) > TTRPC_MAX_MESSAGE:
        raise ValueError(f"ttrpc message of {len(data)} bytes is over the {TTRPC_MAX_MESSAGE}-byte limit")
    return HEADER.pack(len(data), stream_id, kind, flags) + data


async def read_message(reader: asyncio.StreamReader) -> tuple[int, int, int, bytes]:
    """(stream id, type, flags, data) of the next message; raises EOFError at a clean end."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as error:
        if not error.partial:
            raise EOFError("connection closed") from None
        raise ProtocolError("connection closed inside a message header") from None
    length, stream_id, kind, flags = HEADER.unpack(header)
    if length > TTRPC_MAX_MESSAGE:
        raise ProtocolError(f"message of {length} bytes is over the {TTRPC_MAX_MESSAGE}-byte limit")
    try:
        data = await reader.readexactly(length) if length else b""
    except asyncio.IncompleteReadError:
        raise ProtocolError("connection closed inside a message") from None
    return stream_id, kind, flags, data


ANSWER_SHARE = 0.9  # of the caller's deadline a handler may use; the rest carries the answer back


def answer_budget(timeout_nano: int) -> float | None:
    """Seconds a handler may take for a request whose caller waits ``timeout_nano`` (0: no limit).

    The answer must reach the caller before its own deadline: containerd treats a call that runs
    out its deadline as the plugin's death and then creates the container without the plugin's
    adjustment (fail open), while an error answered in time fails just that call (fail closed).
    """
    if timeout_nano <= 0:
        return None
    return timeout_nano / 1e9 * ANSWER_SHARE


class Endpoint:
    """ttrpc client and server on one channel."""

    def __init__(self, channel: Channel, serve: Handler | None = None, name: str = "") -> None:
        self._channel = channel
        self._serve = serve
        self._name = name or f"conn{channel.conn_id}"
        self._ids = itertools.count(1, 2)
        self._pending: dict[int, asyncio.Future[ttrpc_pb2.Response]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._reader_task: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        self.error: BaseException | None = None

    def start(self) -> None:
        if self._reader_task is None:
            loop = asyncio.get_running_loop()
            self._reader_task = loop.create_task(self._read(), name=f"ttrpc-{self._name}")

    async def call(self, service: str, method: str, payload: bytes, timeout: float) -> bytes:
        """Call ``service/method`` with ``payload``; its result, or RpcError (DEADLINE_EXCEEDED on
        ``timeout`` seconds, UNAVAILABLE when the connection ends first, RESOURCE_EXHAUSTED for a
        request over ttrpc's 4 MiB)."""
        if self.closed.is_set():
            raise RpcError(UNAVAILABLE, f"connection closed: {self.error}")
        request = ttrpc_pb2.Request(
            service=service, method=method, payload=payload, timeout_nano=int(timeout * 1e9)
        )
        data = request.SerializeToString()
        if len(data) > TTRPC_MAX_MESSAGE:  # as ttrpc's Go client: refused before sending
            raise RpcError(
                RESOURCE_EXHAUSTED,
                f"{service}/{method}: request of {len(data)} bytes is over ttrpc's {TTRPC_MAX_MESSAGE}",
            )
        stream_id = next(self._ids)
        waiter: asyncio.Future[ttrpc_pb2.Response] = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = waiter
        try:
            await self._channel.write(frame(stream_id, REQUEST, data))
            response = await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            raise RpcError(DEADLINE_EXCEEDED, f"{service}/{method}: no answer in {timeout:g}s") from None
        except ConnectionError as error:
            raise RpcError(UNAVAILABLE, f"{service}/{method}: {error}") from None
        finally:
            self._pending.pop(stream_id, None)
        if response.status.code != OK:
            raise RpcError(response.status.code, response.status.message)
        return response.payload

    async def _read(self) -> None:
        try:
            while True:
                stream_id, kind, _flags, data = await read_message(self._channel.reader)
                if kind == REQUEST:
                    task = asyncio.get_running_loop().create_task(self._answer(stream_id, data))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                elif kind == RESPONSE:
                    waiter = self._pending.get(stream_id)
                    if waiter is not None and not waiter.done():
                        response = ttrpc_pb2.Response()
                        response.ParseFromString(data)
                        waiter.set_result(response)
                elif kind != DATA:  # unary calls carry no data messages; a stream's are ignored
                    raise ProtocolError(f"message of unknown type {kind} on stream {stream_id}")
        except EOFError as error:
            self._end(error)
        except (ProtocolError, ConnectionError) as error:
            log_event(log, "nri.ttrpc_broken", logging.ERROR, conn=self._name, reason=str(error))
            self._end(error)
        except Exception as error:  # a payload that is not a ttrpc message
            log_event(log, "nri.ttrpc_broken", logging.ERROR, conn=self._name, reason=repr(error)[:200])
            self._end(error)

    async def _answer(self, stream_id: int, data: bytes) -> None:
        status, payload = ttrpc_pb2.Status(code=OK), b""
        try:
            request = ttrpc_pb2.Request()
            request.ParseFromString(data)
            if self._serve is None:
                raise RpcError(UNIMPLEMENTED, f"{request.service}/{request.method}: no service here")
            budget = answer_budget(request.timeout_nano)
            try:
                payload = await asyncio.wait_for(
                    self._serve(request.service, request.method, request.payload), budget
                )
            except TimeoutError:
                raise RpcError(
                    DEADLINE_EXCEEDED,
                    f"kubegpu NRI plugin: {request.service}/{request.method} not done in {budget:.3g}s",
                ) from None
        except RpcError as error:
            status = ttrpc_pb2.Status(code=error.code, message=error.message)
        except Exception as error:  # a handler's bug must still answer the runtime
            log_event(log, "nri.handler_failed", logging.ERROR, conn=self._name, reason=repr(error)[:300])
            status = ttrpc_pb2.Status(code=INTERNAL, message=f"kubegpu NRI plugin: {error!r}"[:500])
        response = ttrpc_pb2.Response(status=status, payload=payload)
        try:
            await self._channel.write(frame(stream_id, RESPONSE, response.SerializeToString()))
        except (ConnectionError, ValueError) as error:
            log_event(log, "nri.answer_lost", logging.WARNING, conn=self._name, reason=str(error)[:200])

    def _end(self, error: BaseException) -> None:
        self.error = error
        for waiter in self._pending.values():
            if not waiter.done():
                waiter.set_exception(ConnectionError(f"connection closed: {error}"))
        self.closed.set()

    async def close(self) -> None:
        for task in [self._reader_task, *self._tasks]:
            if task is not None:
                task.cancel()
        for task in [self._reader_task, *self._tasks]:
            if task is not None:
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        if not self.closed.is_set():
            self._end(EOFError("closed"))
