"""kubegpu/httphead.py: request heads read without the email parser, answers in one write.

The pure parts against the standard library's own reading of the same heads, and a real
threading server (the extender's) on a loopback socket for the connection rules: keep-alive,
``Connection: close``, HTTP/1.0, ``Expect: 100-continue``, and malformed heads answered with a
status and a closed connection, never a crash or a hung thread.
"""

from __future__ import annotations

import http.client
import io
import json
import random
import socket
from collections.abc import Iterator

import pytest

from kubegpu.httphead import (
    MAX_HEADERS,
    HeadError,
    http_date,
    parse_header_lines,
    parse_request_line,
    read_header_lines,
)
from tests.support.echohttp import echo_server


def test_headers_read_as_the_standard_library_reads_them() -> None:
    """Random well-formed heads (names in any case, repeated names, spaces around values): ``get``
    gives what ``http.client.parse_headers`` gives, for every name in any case, but for the
    spaces after a value, which are not part of it (RFC 9110 section 5.5) and which the standard
    library keeps (a ``Content-Length: 12 `` it would take for no length)."""
    rng = random.Random(7)
    names = ["Host", "Content-Length", "Content-Type", "Connection", "X-Thing", "Accept", "Expect"]
    for _ in range(300):
        lines = []
        for _ in range(rng.randint(0, 8)):
            name = rng.choice(names)
            name = "".join(c.upper() if rng.random() < 0.3 else c.lower() for c in name)
            value = rng.choice(["1", "close", "keep-alive", "a b", "application/json", "é", ""])
            if name.lower() == "content-length":
                value = "12"  # repeated Content-Lengths agree (two different ones are refused)
            spaced = f"{' ' * rng.randint(0, 2)}{value}{' ' * rng.randint(0, 2)}"
            lines.append(f"{name}:{spaced}\r\n".encode("latin-1"))
        raw = b"".join(lines) + b"\r\n"
        ours = parse_header_lines(read_header_lines(io.BytesIO(raw)))
        theirs = http.client.parse_headers(io.BytesIO(raw))
        for name in names:
            for spelt in (name, name.lower(), name.upper()):
                expected = theirs.get(spelt)
                assert ours.get(spelt) == (expected.rstrip(" \t") if expected is not None else None), raw
                assert (spelt in ours) == (spelt in theirs)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"Host: x\r\n folded\r\n\r\n", 400),  # obsolete line folding
        (b" Host: x\r\n\r\n", 400),
        (b"Host : x\r\n\r\n", 400),  # a space before the colon
        (b"no colon here\r\n\r\n", 400),
        (b": empty name\r\n\r\n", 400),
        (b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n", 400),  # smuggling
        (b"X: " + b"a" * 70000 + b"\r\n\r\n", 431),
        (b"".join(b"X%d: y\r\n" % i for i in range(MAX_HEADERS + 1)) + b"\r\n", 431),
        # a name that is not a token (RFC 9110 section 5.1): a proxy might read it as another
        (b"Content-Length\x0b: 5\r\n\r\n", 400),
        (b"Content\x00Length: 5\r\n\r\n", 400),
        (b"Content Length: 5\r\n\r\n", 400),
        (b"X-\xe9: 1\r\n\r\n", 400),
        # a bare CR or a NUL in a value (RFC 9112 section 2.2): some read a CR as a line's end
        (b"X: a\rContent-Length: 5\r\n\r\n", 400),
        (b"X: a\x00b\r\n\r\n", 400),
    ],
)
def test_malformed_heads_are_refused_with_a_status(raw: bytes, status: int) -> None:
    with pytest.raises(HeadError) as caught:
        parse_header_lines(read_header_lines(io.BytesIO(raw)))
    assert caught.value.status == status and caught.value.reason


def test_a_head_at_the_limits_is_read() -> None:
    raw = b"".join(b"X%d: y\r\n" % i for i in range(MAX_HEADERS)) + b"\r\n"
    assert len(parse_header_lines(read_header_lines(io.BytesIO(raw)))) == MAX_HEADERS
    same = parse_header_lines([b"Content-Length: 5\r\n", b"content-length: 5\r\n"])
    assert same.get("CONTENT-LENGTH") == "5"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("POST /filter HTTP/1.1", ("POST", "/filter", "HTTP/1.1", (1, 1))),
        ("GET /healthz HTTP/1.0", ("GET", "/healthz", "HTTP/1.0", (1, 0))),
        ("GET //evil.example/x HTTP/1.1", ("GET", "/evil.example/x", "HTTP/1.1", (1, 1))),
        ("GET / HTTP/1.10", ("GET", "/", "HTTP/1.10", (1, 10))),
    ],
)
def test_request_lines(line: str, expected: tuple) -> None:
    assert parse_request_line(line) == expected


@pytest.mark.parametrize(
    ("line", "status"),
    [
        ("GET /", 400),  # HTTP/0.9
        ("GET / HTTP/1.1 extra", 400),
        ("GET / HTP/1.1", 400),
        ("GET / HTTP/1", 400),
        ("GET / HTTP/1.x", 400),
        ("GET / HTTP/1." + "1" * 11, 400),
        ("GET / HTTP/2.0", 505),
        ("GET / HTTP/10.0", 505),
        ("GET / HTTP/1.\u00b2", 400),  # a digit to str.isdigit, not to int()
        ("GET / HTTP/\u00b9.1", 400),
        ("GET / HTTP/\u0661.\u0661", 400),  # Arabic-Indic digits: int() reads them, HTTP does not
    ],
)
def test_bad_request_lines(line: str, status: int) -> None:
    with pytest.raises(HeadError) as caught:
        parse_request_line(line)
    assert caught.value.status == status


def test_the_date_is_an_http_date() -> None:
    from email.utils import parsedate_to_datetime

    assert parsedate_to_datetime(http_date()).tzname() == "UTC"


@pytest.fixture
def server() -> Iterator[int]:
    with echo_server() as http_server:
        yield int(http_server.server_address[1])


def _answer(stream: io.BufferedReader) -> tuple[int, dict[str, str], bytes]:
    status = stream.readline()
    assert status.startswith(b"HTTP/1.1 "), status
    headers = {}
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.lower()] = value.strip()
    body = stream.read(int(headers.get("content-length", 0)))
    return int(status.split()[1]), headers, body


def test_keep_alive_and_close(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        stream = sock.makefile("rb")
        for i in range(3):  # one connection, three requests
            sock.sendall(b"POST /v%d HTTP/1.1\r\nX-Thing: t\r\nContent-Length: 3\r\n\r\nabc" % i)
            status, headers, body = _answer(stream)
            assert status == 200 and "connection" not in headers and "date" in headers
            assert json.loads(body) == {"path": f"/v{i}", "length": 3, "x": "t"}
        sock.sendall(b"GET /h HTTP/1.1\r\nConnection: close\r\n\r\n")
        status, headers, body = _answer(stream)
        assert (status, headers["connection"], body) == (200, "close", b"/h")
        assert stream.read() == b""  # closed after it
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(b"GET /h HTTP/1.0\r\n\r\n")  # HTTP/1.0 without keep-alive: closed
        stream = sock.makefile("rb")
        assert _answer(stream)[1]["connection"] == "close" and stream.read() == b""
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(b"GET /h HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /h HTTP/1.1\r\n\r\n")
        stream = sock.makefile("rb")
        assert _answer(stream)[0] == 200 and _answer(stream)[0] == 200  # kept open for the second


@pytest.mark.parametrize(
    "request_head",
    [
        b"GET /h HTTP/1.1\r\nContent-Length: 20\r\n\r\nGET /smuggled HTTP/1.1",
        b"GET /h HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nGET /\r\n0\r\n\r\n",
        b"DELETE /h HTTP/1.1\r\nContent-Length: 2\r\n\r\nab",
    ],
)
def test_a_body_no_handler_reads_ends_the_connection(server: int, request_head: bytes) -> None:
    """A GET (or any method whose handler reads no body) announcing a body is answered, and its
    connection ends: the unread body is never served as the next request."""
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(request_head)
        stream = sock.makefile("rb")
        status, headers, _ = _answer(stream)
        assert headers.get("connection") == "close" and status in (200, 501)
        assert stream.read() == b""


def test_a_get_with_an_empty_body_keeps_its_connection(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(b"GET /h HTTP/1.1\r\nContent-Length: 0\r\n\r\nGET /h HTTP/1.1\r\n\r\n")
        stream = sock.makefile("rb")
        assert _answer(stream)[0] == 200 and _answer(stream)[0] == 200


def test_expect_100_continue(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(b"POST /e HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
        stream = sock.makefile("rb")
        assert stream.readline().startswith(b"HTTP/1.1 100")
        assert stream.readline() == b"\r\n"
        sock.sendall(b"hi")
        status, _, body = _answer(stream)
        assert status == 200 and json.loads(body)["length"] == 2


@pytest.mark.parametrize(
    ("request_head", "status"),
    [
        (b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
        (b"POST /x HTTP/1.1\r\nA: b\r\n  folded\r\n\r\n", 400),
        (b"GET /x HTTP/2.0\r\n\r\n", 505),
        (b"GET /x HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(150)) + b"\r\n", 431),
        (b"GET /x HTTP/1.1\r\nA: " + b"v" * 70000 + b"\r\n\r\n", 431),
        (b"BREW /x HTTP/1.1\r\n\r\n", 501),
        (b"garbage\r\n\r\n", 400),
        (b"GET /x HTTP/1.\xb2\r\n\r\n", 400),
        # a body whose end the two headers give differently (RFC 9112 section 6.3): smuggling
        (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n", 400),
        # a Content-Length that is not 1*DIGIT (RFC 9110 section 8.6)
        (b"POST /x HTTP/1.1\r\nContent-Length: \xb2\r\n\r\nab", 400),
        (b"POST /x HTTP/1.1\r\nContent-Length: +2\r\n\r\nab", 400),
        (b"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST /x HTTP/1.1\r\nContent-Length: 2, 2\r\n\r\nab", 400),
        (b"GET /x HTTP/1.1\r\nContent-Length: 1 1\r\n\r\nab", 400),
    ],
)
def test_malformed_requests_get_a_status_and_a_closed_connection(
    server: int, request_head: bytes, status: int
) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(request_head)
        answer = sock.makefile("rb").read()  # returns: the server closed the connection
    assert answer.startswith(b"HTTP/1.1 %d" % status), answer[:100]
    # the server still serves the next client
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(b"GET /h HTTP/1.1\r\n\r\n")
        assert _answer(sock.makefile("rb"))[0] == 200
