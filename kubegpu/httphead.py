"""HTTP/1.1 request heads read, and answers written, without the standard library's email parser.

``http.server.BaseHTTPRequestHandler`` reads every request's headers through ``email.parser``
and writes every answer's head a header at a time; on the extender's hot path (kube-scheduler
calls filter, prioritize and bind for every pod) that was a tenth of the process's CPU.
``LeanHead`` is a drop-in base for such handlers: the same request-line rules (HTTP/1.0 and 1.1;
2.0 and above answered 505), the same keep-alive rules (``Connection: close`` / ``keep-alive``,
``Expect: 100-continue``), headers read by :func:`read_header_lines` and
:func:`parse_header_lines` (pure), and :meth:`LeanHead.send_answer`, which writes the head and
the body in one write. Malformed heads get the status the standard library gives (400, 431 for a
line over 64 KiB or more than 100 headers, 505) and the connection is closed; in addition a head
with obsolete line folding, a header name that is not a token (a space before the colon, a
control byte), a bare CR or a NUL in a value, or two different Content-Lengths is refused with
400 (RFC 9110 section 5.1, RFC 9112 sections 2.2, 5 and 6.3: such heads are how requests get
smuggled past proxies); so is a request with a Content-Length that is not ASCII digits, or with
both Transfer-Encoding and Content-Length (``LeanHead.parse_request``). Version numbers are
ASCII digits only (``str.isdigit`` also takes ``'²'``, which ``int`` refuses).
"""

from __future__ import annotations

import re
import time
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, BinaryIO

MAX_LINE = 65536  # http.client's _MAXLINE
MAX_HEADERS = 100  # http.client's _MAXHEADERS
_PHRASES = {s.value: s.phrase for s in HTTPStatus}
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 section 5.6.2


def ascii_digits(text: str, most: int = 20) -> bool:
    """Whether ``text`` is 1 to ``most`` ASCII digits (``str.isdigit`` alone takes ``'²'``,
    which ``int`` refuses, and ``'٣'``, which ``int`` reads as 3)."""
    return 0 < len(text) <= most and text.isascii() and text.isdigit()


class HeadError(ValueError):
    """A request head that cannot be served: the status and reason to answer with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Headers(dict[str, str]):
    """A request's headers by lower-cased name (the first of repeated ones, as the standard
    library's ``HTTPMessage.get`` gives); ``get`` takes a name in any case."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and dict.__contains__(self, name.lower())


def read_header_lines(rfile: BinaryIO) -> list[bytes]:
    """The header lines after the request line, up to the empty line (not included)."""
    lines: list[bytes] = []
    while True:
        line = rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise HeadError(431, "Line too long")
        if line in (b"\r\n", b"\n", b""):
            return lines
        lines.append(line)
        if len(lines) > MAX_HEADERS:
            raise HeadError(431, "Too many headers")


def parse_header_lines(lines: list[bytes]) -> Headers:
    """``Name: value`` lines into ``Headers`` (see the module docstring for what is refused)."""
    headers = Headers()
    for raw in lines:
        line = raw.decode("iso-8859-1").rstrip("\r\n")
        if line[:1] in (" ", "\t"):
            raise HeadError(400, "Bad header: obsolete line folding")
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name) or "\r" in value or "\x00" in value:
            raise HeadError(400, f"Bad header line ({line[:100]!r})")
        key, value = name.lower(), value.strip(" \t")
        if key in headers:
            if key == "content-length" and dict.__getitem__(headers, key) != value:
                raise HeadError(400, "Bad request: two different Content-Lengths")
            continue
        headers[key] = value
    return headers


def parse_request_line(line: str) -> tuple[str, str, str, tuple[int, int]]:
    """(method, path, version, (major, minor)) of ``METHOD PATH HTTP/x.y``; below HTTP/2 only."""
    words = line.split()
    if len(words) != 3:
        raise HeadError(400, f"Bad request syntax ({line[:100]!r})")
    method, path, version = words
    major, dot, minor = version[5:].partition(".") if version.startswith("HTTP/") else ("", "", "")
    if not (dot and ascii_digits(major, 10) and ascii_digits(minor, 10)):
        raise HeadError(400, f"Bad request version ({version[:40]!r})")
    number = int(major), int(minor)
    if number >= (2, 0):
        raise HeadError(505, f"Invalid HTTP version ({version[5:45]})")
    if path.startswith("//"):  # as the standard library: never an absolute URI without scheme
        path = "/" + path.lstrip("/")
    return method, path, version, number


def check_framing(headers: Headers) -> None:
    """Refuse a request whose body's end is unclear: a Content-Length that is not ASCII digits
    (RFC 9110 section 8.6), or Transfer-Encoding with Content-Length (RFC 9112 section 6.3; the
    standard library reads neither as a body's length, a proxy in front may read either)."""
    length = headers.get("content-length")
    if length is not None and not ascii_digits(length):
        raise HeadError(400, f"Bad Content-Length ({length[:40]!r})")
    if length is not None and "transfer-encoding" in headers:
        raise HeadError(400, "Bad request: both Transfer-Encoding and Content-Length")


_date_cache: tuple[int, str] = (0, "")


def http_date() -> str:
    """The Date header's value, formatted once a second."""
    global _date_cache
    now = int(time.time())
    cached = _date_cache
    if cached[0] != now:
        cached = (now, formatdate(now, usegmt=True))
        _date_cache = cached
    return cached[1]


class LeanHead(BaseHTTPRequestHandler):
    """A ``BaseHTTPRequestHandler`` whose request heads are read by this module (see its
    docstring); ``self.headers`` is a ``Headers``."""

    protocol_version = "HTTP/1.1"
    # methods whose handlers read the request's body; a request of any other method that
    # announces one ends its connection after the answer: left unread on a kept-alive connection,
    # the body would be read as the next request (one a proxy in front never saw)
    methods_with_bodies: frozenset[str] = frozenset({"POST", "PUT", "PATCH"})

    def parse_request(self) -> bool:
        self.command = None  # type: ignore[assignment]  # the standard library's "no request yet"
        self.request_version = self.default_request_version
        self.close_connection = True
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        if not self.requestline.strip():
            return False
        try:
            method, path, version, number = parse_request_line(self.requestline)
            self.request_version = version
            headers = parse_header_lines(read_header_lines(self.rfile))
            check_framing(headers)
        except HeadError as error:
            self.request_version = "HTTP/1.1"  # the answer has a status line (the standard
            # library's, for a bad version, had none: it answered as to HTTP/0.9)
            self.send_error(error.status, error.reason)
            return False
        self.command, self.path, self.headers = method, path, headers  # type: ignore[assignment]
        connection = headers.get("connection", "").lower()
        self.close_connection = number < (1, 1) or connection == "close"
        if connection == "keep-alive":
            self.close_connection = False
        if method not in self.methods_with_bodies and (
            headers.get("content-length", "0").strip("0") or "transfer-encoding" in headers
        ):
            self.close_connection = True
        if headers.get("expect", "").lower() == "100-continue" and number >= (1, 1):
            return bool(self.handle_expect_100())
        return True

    def send_answer(self, status: int, content_type: str, body: bytes) -> None:
        """The whole answer in one write: status line, Date, Content-Type, Content-Length,
        ``Connection: close`` when the connection ends after it, then the body."""
        close = "Connection: close\r\n" if self.close_connection else ""
        head = (
            f"HTTP/1.1 {status} {_PHRASES.get(status, '')}\r\nDate: {http_date()}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n{close}\r\n"
        )
        self.wfile.write(head.encode("iso-8859-1") + body)
