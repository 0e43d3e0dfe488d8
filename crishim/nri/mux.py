"""NRI's connection multiplexer: several logical byte streams over one unix socket.

An NRI plugin talks to containerd over a single connection (the "trunk") that carries two logical
connections: the plugin's own ttrpc service (``PLUGIN_SERVICE_CONN``, containerd calls it) and
the runtime's ttrpc service (``RUNTIME_SERVICE_CONN``, the plugin calls it). On the trunk every
chunk is an 8-byte header, the logical connection id and the chunk's length (both big-endian
uint32), then that many bytes. A chunk is at most ``MAX_CHUNK`` bytes (a whole ttrpc message);
longer writes are split. Connection id 0 is reserved.

This module only moves bytes: ``Mux.channel(id)`` gives a ``Channel`` with an asyncio
``StreamReader`` of what arrived for that id and a ``write`` that frames outgoing bytes. A
malformed trunk (a chunk for id 0, or longer than ``MAX_CHUNK``) closes the mux with the reason;
a chunk for a connection this side has not opened is dropped (NRI's multiplexer does the same).
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field

PLUGIN_SERVICE_CONN = 1
RUNTIME_SERVICE_CONN = 2
HEADER = struct.Struct(">II")
TTRPC_HEADER_BYTES = 10
TTRPC_MAX_MESSAGE = 4 << 20
MAX_CHUNK = TTRPC_HEADER_BYTES + TTRPC_MAX_MESSAGE


class MuxError(ConnectionError):
    """The trunk broke or carried something NRI's multiplexer never sends."""


def chunks(conn_id: int, data: bytes) -> list[bytes]:
    """The trunk bytes that carry ``data`` on logical connection ``conn_id`` (header + chunk each)."""
    if conn_id <= 0 or conn_id > 0xFFFFFFFF:
        raise ValueError(f"connection id {conn_id} is reserved or out of range")
    out = []
    for start in range(0, max(len(data), 1), MAX_CHUNK):
        piece = data[start : start + MAX_CHUNK]
        out.append(HEADER.pack(conn_id, len(piece)) + piece)
    return out


@dataclass
class Channel:
    """One logical connection: ``reader`` gets its bytes, ``write`` sends bytes on it."""

    conn_id: int
    mux: Mux
    reader: asyncio.StreamReader = field(default_factory=asyncio.StreamReader)

    async def write(self, data: bytes) -> None:
        await self.mux.send(self.conn_id, data)


class Mux:
    """The multiplexer over one connected trunk (an asyncio stream pair)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._channels: dict[int, Channel] = {}
        self._write_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        self.error: BaseException | None = None

    def channel(self, conn_id: int) -> Channel:
        """The logical connection ``conn_id``, opened on this side (made on first use). Chunks for a
        connection this side never opened are dropped, as NRI's multiplexer does: nobody would
        read them, and kept they would grow without bound."""
        if conn_id == 0:
            raise ValueError("connection id 0 is reserved")
        found = self._channels.get(conn_id)
        if found is None:
            found = self._channels[conn_id] = Channel(conn_id, self)
        return found

    def start(self) -> None:
        """Start routing the trunk's chunks to their channels."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._route(), name="nri-mux")

    async def send(self, conn_id: int, data: bytes) -> None:
        if self.closed.is_set():
            raise MuxError(f"trunk closed: {self.error}")
        async with self._write_lock:
            for piece in chunks(conn_id, data):
                self._writer.write(piece)
            await self._writer.drain()

    async def _route(self) -> None:
        try:
            while True:
                try:
                    header = await self._reader.readexactly(HEADER.size)
                except asyncio.IncompleteReadError as error:
                    raise MuxError("trunk closed by the runtime") from error
                conn_id, length = HEADER.unpack(header)
                if conn_id == 0 or length > MAX_CHUNK:
                    raise MuxError(f"malformed chunk header (connection {conn_id}, {length} bytes)")
                data = await self._reader.readexactly(length) if length else b""
                channel = self._channels.get(conn_id)
                if channel is not None:
                    channel.reader.feed_data(data)
        except (MuxError, ConnectionError, asyncio.IncompleteReadError) as error:
            self._shut(error)
        except asyncio.CancelledError:
            self._shut(MuxError("closed"))
            raise

    def _shut(self, error: BaseException) -> None:
        if self.closed.is_set():
            return
        self.error = error
        for channel in self._channels.values():
            channel.reader.feed_eof()
        self.closed.set()
        self._writer.close()

    async def close(self) -> None:
        """Close the trunk and end every channel's reader."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, MuxError):
                pass
        self._shut(MuxError("closed"))
