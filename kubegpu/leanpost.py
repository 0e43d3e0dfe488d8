"""One small JSON POST (the scheduler's Binding) over a connection of the client's own urllib3 pool,
written and read without http.client.

The Binding is the scheduler's and the extender's one write per pod; through urllib3 and
http.client a third of its CPU went to building the request and to reading the answer's headers
with the email parser (docs/performance.md). :func:`post` borrows a connection from the pool the
Kubernetes client uses for the API server (the same TLS settings, client certificate, server name,
socket options; a connection the pool finds dropped is reopened, as urllib3 does), writes the
request in one write, reads the answer (interim 1xx answers dropped; status line, headers
through ``kubegpu.httphead``, a body of Content-Length, chunked, or up to the connection's end;
Transfer-Encoding with Content-Length, or "close" anywhere in Connection, ends the connection
after the answer), and gives the connection back
to the pool when the answer leaves it reusable (HTTP/1.1, no ``Connection: close``, read to its
end), closed otherwise. Any failure closes the connection before it goes back. A timeout is
``(connect, read)`` or one number for both (each read, not the whole exchange); a failure raises
what it met (urllib3's connection error, an ``OSError``, ``TimeoutError`` for a timeout) or
``LeanPostError`` for an answer that is not HTTP. Only a failed connect is tried again (up to
``CONNECT_ATTEMPTS``, as urllib3's default retries): once the request is written the outcome is
unknown, which the caller handles (the scheduler reads the pod back).
"""

from __future__ import annotations

import http.client
import re
from dataclasses import dataclass
from typing import Any

import urllib3

from kubegpu.httphead import HeadError, Headers, ascii_digits, parse_header_lines, read_header_lines

MAX_ANSWER_BYTES = 16 << 20


class LeanPostError(OSError):
    """The server's answer was not a readable HTTP/1.x answer."""


@dataclass
class Answer:
    """The answer, read whole; shaped as the urllib3 response the caller would otherwise get
    (``status``, ``reason``, ``data``, ``headers``, ``read``, ``release_conn``)."""

    status: int
    reason: str
    headers: Headers
    data: bytes

    def read(self, *_: Any) -> bytes:
        return self.data

    def release_conn(self) -> None:
        """Nothing to release: the connection went back to its pool when the answer was read."""

    def getheaders(self) -> Headers:
        return self.headers

    def getheader(self, name: str, default: Any = None) -> Any:
        return self.headers.get(name, default)


# http.client's own checks (putrequest's _validate_path, putheader's name and value checks)
_LEGAL_NAME = re.compile(r"[^:\s][^:\r\n]*")
_ILLEGAL_VALUE = re.compile(r"\n(?![ \t])|\r(?![ \t\n])")
_ILLEGAL_TARGET = re.compile("[\x00-\x20\x7f]")


def _header_text(value: Any) -> str:
    """A header value as http.client's putheader writes it: text, bytes as they are, an int."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value if isinstance(value, str) else str(value)


def request_bytes(host: str, target: str, headers: dict[str, str], body: bytes) -> bytes:
    """The request as http.client writes it for urllib3: request line, ``Host`` (unless given),
    ``Accept-Encoding: identity`` (unless given), the headers, ``Content-Length``, the body. What
    http.client refuses is refused the same way: a target with a control byte or a space
    (``http.client.InvalidURL``), a header name or value that would end the line (``ValueError``)."""
    if _ILLEGAL_TARGET.search(target):
        raise http.client.InvalidURL(f"URL can't contain control characters. {target!r}")
    headers = {name: _header_text(value) for name, value in headers.items()}
    for name, value in headers.items():
        if not _LEGAL_NAME.fullmatch(name):
            raise ValueError(f"Invalid header name {name!r}")
        if _ILLEGAL_VALUE.search(value):
            raise ValueError(f"Invalid header value {value!r}")
    given = {name.lower() for name in headers}
    lines = [f"POST {target} HTTP/1.1"]
    if "host" not in given:
        lines.append(f"Host: {host}")
    if "accept-encoding" not in given:
        lines.append("Accept-Encoding: identity")
    for name, value in headers.items():
        if name.lower() != "content-length":
            lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


MAX_INTERIM_ANSWERS = 16
MAX_TRAILERS = 100
_HEX = frozenset(b"0123456789abcdefABCDEF")


def read_answer(stream: Any) -> tuple[Answer, bool]:
    """The answer on ``stream`` (a buffered binary reader) and whether the connection can carry
    another request after it. Interim (1xx) answers before it are read and dropped, as RFC 9110
    section 15.2 asks of a client (http.client drops ``100 Continue`` only); a ``101 Switching
    Protocols`` ends the exchange (``LeanPostError``)."""
    for _ in range(MAX_INTERIM_ANSWERS + 1):
        version, status, reason, headers = _read_head(stream)
        if status == 101:
            raise LeanPostError("the server switched protocols")
        if not 100 <= status < 200:
            return _read_body(stream, version, status, reason, headers)
    raise LeanPostError("too many interim answers")


def _read_head(stream: Any) -> tuple[str, int, str, Headers]:
    line = stream.readline(65537)
    if not line:
        raise LeanPostError("the server closed the connection without an answer")
    version, _, rest = line.decode("iso-8859-1").rstrip("\r\n").partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or not ascii_digits(code) or len(code) != 3:
        raise LeanPostError(f"not an HTTP answer: {line[:80]!r}")
    try:
        headers = parse_header_lines(read_header_lines(stream))
    except HeadError as error:
        raise LeanPostError(f"unreadable answer headers: {error.reason}") from error
    return version, int(code), reason, headers


def _read_body(stream: Any, version: str, status: int, reason: str, headers: Headers) -> tuple[Answer, bool]:
    # "close" anywhere in Connection, as http.client's will_close reads it
    reusable = version != "HTTP/1.0" and "close" not in headers.get("connection", "").lower()
    if status in (204, 304):
        return Answer(status, reason, headers, b""), reusable
    coding = headers.get("transfer-encoding")
    if coding is not None:  # RFC 9112 section 6.3: it overrides a Content-Length
        if "content-length" in headers:  # a framing a proxy could read otherwise: not kept
            reusable = False
        if coding.rpartition(",")[2].strip(" \t").lower() == "chunked":
            return Answer(status, reason, headers, _read_chunked(stream)), reusable
        reusable = False  # another coding last: the body runs to the connection's end
    else:
        length = headers.get("content-length")
        if length is not None:
            if not ascii_digits(length) or int(length) > MAX_ANSWER_BYTES:
                raise LeanPostError(f"bad Content-Length {length[:40]!r}")
            data = stream.read(int(length))
            if len(data) != int(length):
                raise LeanPostError("the answer ended before its Content-Length")
            return Answer(status, reason, headers, data), reusable
    data = stream.read(MAX_ANSWER_BYTES + 1)  # delimited by the connection's end
    if len(data) > MAX_ANSWER_BYTES:
        raise LeanPostError("answer too large")
    return Answer(status, reason, headers, data), False


def _read_chunked(stream: Any) -> bytes:
    """A chunked body (RFC 9112 section 7.1): sizes are hex digits only (``int(_, 16)`` also
    takes ``0x``, ``_``, signs and spaces), each size line whole, at most ``MAX_TRAILERS``
    trailer lines."""
    parts: list[bytes] = []
    total = 0
    while True:
        line = stream.readline(1024)
        if not line.endswith(b"\n"):
            raise LeanPostError(f"bad chunk size line {line[:40]!r}")
        size_text = line.split(b";", 1)[0].rstrip(b"\r\n \t")
        if not size_text or len(size_text) > 16 or not _HEX.issuperset(size_text):
            raise LeanPostError(f"bad chunk size {size_text[:40]!r}")
        size = int(size_text, 16)
        if size == 0:
            for _ in range(MAX_TRAILERS + 1):  # trailers
                trailer = stream.readline(65537)
                if trailer in (b"\r\n", b"\n", b""):  # the end (a hang-up here, as http.client)
                    return b"".join(parts)
                if not trailer.endswith(b"\n"):
                    raise LeanPostError("a trailer line over the line limit")
            raise LeanPostError("too many trailers")
        total += size
        if total > MAX_ANSWER_BYTES:
            raise LeanPostError("answer too large")
        chunk = stream.read(size)
        if len(chunk) != size or stream.read(2) != b"\r\n":
            raise LeanPostError("the answer ended inside a chunk")
        parts.append(chunk)


CONNECT_ATTEMPTS = 4  # as urllib3's default Retry(3) for a failed connect: nothing was sent yet


def host_header(conn: Any) -> str:
    """``Host`` as http.client writes it for ``conn``: an IPv6 address in brackets, the port
    unless it is the scheme's default."""
    host = str(conn.host)
    if ":" in host:
        host = f"[{host}]"
    return host if conn.port in (None, conn.default_port) else f"{host}:{conn.port}"


def timeouts(timeout: Any) -> tuple[float | None, float | None]:
    """(connect, read) seconds from the REST layer's ``_request_timeout``: one positive number
    for both, or a pair (each kept where it is a positive number); anything else, 0 and booleans
    included, means no limit (None)."""

    def seconds(value: Any) -> float | None:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
        return None

    if isinstance(timeout, tuple) and len(timeout) == 2:
        return seconds(timeout[0]), seconds(timeout[1])
    return seconds(timeout), seconds(timeout)


def post(pool: Any, target: str, headers: dict[str, str], body: bytes, timeout: Any) -> Answer:
    """POST ``body`` to ``target`` (path and query) on a connection of urllib3 ``pool`` (see the
    module docstring)."""
    connect_timeout, read_timeout = timeouts(timeout)
    conn = pool._get_conn()  # a pooled connection (a dropped one is closed by the pool) or a new one
    try:  # refused before anything is sent: the connection goes back as it came
        request = request_bytes(host_header(conn), target, headers, body)
    except Exception:
        pool._put_conn(conn)
        raise
    reusable = False
    try:
        for attempt in range(CONNECT_ATTEMPTS):
            if conn.sock is not None:
                break
            if connect_timeout is not None:
                conn.timeout = connect_timeout
            try:
                conn.connect()
            except (OSError, urllib3.exceptions.HTTPError):
                conn.close()
                if attempt == CONNECT_ATTEMPTS - 1:
                    raise
        sock = conn.sock
        sock.settimeout(read_timeout)
        sock.sendall(request)
        stream = sock.makefile("rb")
        try:
            answer, reusable = read_answer(stream)
        finally:
            stream.close()
        return answer
    finally:
        if not reusable:
            conn.close()
        pool._put_conn(conn)
