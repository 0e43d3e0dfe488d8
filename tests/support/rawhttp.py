"""A scripted plain-HTTP endpoint on loopback for tests of HTTP clients (the Binding's POST).

It records every request (request line, headers by lower-cased name, body), counts the
connections it accepted, and answers request number ``i`` (over all connections) with
``answer(i) -> (bytes, close_after)``: the raw answer, and whether to hang up after it. The
default answer is a 201 ``Status`` that keeps the connection open.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

STATUS = b'{"kind":"Status","status":"Success"}'
CREATED = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(STATUS),
    STATUS,
)


def created(_: int) -> tuple[bytes, bool]:
    return CREATED, False


class ScriptedHTTPServer:
    """See the module docstring; ``close()`` stops it (connections in service end with it)."""

    def __init__(
        self, answer: Callable[[int], tuple[bytes, bool]] = created, host: str = "127.0.0.1"
    ) -> None:
        self.answer = answer
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.connections = 0
        self.listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.listener.bind((host, 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn, conn.makefile("rb") as stream:
                while line := stream.readline():
                    headers = {}
                    while (header := stream.readline()) not in (b"\r\n", b""):
                        name, _, value = header.decode("latin-1").partition(":")
                        headers[name.lower()] = value.strip()
                    body = stream.read(int(headers.get("content-length", "0")))
                    answer, close = self.answer(len(self.requests))
                    self.requests.append((line.decode("latin-1").strip(), headers, body))
                    conn.sendall(answer)
                    if close:
                        break

    def close(self) -> None:
        self.listener.close()
