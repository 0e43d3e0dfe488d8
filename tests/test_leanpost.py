"""kubegpu/leanpost.py: the Binding's POST written and read without http.client, on a connection
of urllib3's pool. Answers read as http.client reads them (lengths, chunks, the connection's end,
HTTP/1.0), malformed ones refused with a reason, and the pooled connection kept only when the
answer leaves it reusable; against real sockets: a connection the server dropped while idle is
replaced, a server that hangs up mid-answer raises."""

from __future__ import annotations

import http.client
import io
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
import urllib3

from kubegpu.leanpost import LeanPostError, host_header, post, read_answer, request_bytes, timeouts
from tests.support.rawhttp import ScriptedHTTPServer


def _their_read(raw: bytes) -> tuple[int, bytes]:
    """http.client's reading of the same answer."""

    class FakeSocket:
        def makefile(self, *_: object) -> io.BytesIO:
            return io.BytesIO(raw)

    response = http.client.HTTPResponse(FakeSocket(), method="POST")  # type: ignore[arg-type]
    response.begin()
    return response.status, response.read()


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\n"


@pytest.mark.parametrize(
    ("raw", "reusable"),
    [
        (b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\nhello", True),
        (b"HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n", True),
        (b"HTTP/1.1 409 Conflict\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}", False),
        (CHUNKED, True),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n", True),  # no end line
        (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", False),
        (b"HTTP/1.1 204 No Content\r\n\r\n", True),
        (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 3\r\n\r\nbad", True),
        # an interim answer before the answer (http.client skips 100 Continue)
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}", True),
        (b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok", True),  # no reason phrase
        # http.client's will_close: "close" anywhere in Connection
        (b"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 0\r\n\r\n", False),
        # both lengths: the chunks count (RFC 9112 section 6.3) and the connection is not kept
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
            False,
        ),
        # a coding other than chunked last: the body runs to the connection's end
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, x\r\n\r\n2\r\nab\r\n0\r\n\r\n", False),
    ],
)
def test_answers_read_as_http_client_reads_them(raw: bytes, reusable: bool) -> None:
    answer, keep = read_answer(io.BytesIO(raw))
    assert (answer.status, answer.data) == _their_read(raw)
    assert keep is reusable
    assert answer.read() == answer.data and answer.getheader("x-none", "d") == "d"


@pytest.mark.parametrize(
    "raw",
    [
        b"",  # hung up before answering
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 2000 Huh\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"HTTP/1.1 200 OK\r\n folded\r\n\r\n",
        # digits to str.isdigit that int() refuses (a ValueError, not a LeanPostError, before)
        "HTTP/1.1 \u00b200 OK\r\nContent-Length: 0\r\n\r\n".encode("latin-1"),
        "HTTP/1.1 200 OK\r\nContent-Length: \u00b2\r\n\r\nab".encode("latin-1"),
        b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nab",
        # chunk sizes int(_, 16) reads but HTTP does not have: they were taken
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\n" + b"a" * 16 + b"\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+2\r\nab\r\n0\r\n\r\n",
        # a chunk-size line over the line limit was cut, its first part read as the last chunk
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"0" * 1100 + b"2\r\nab\r\n0\r\n\r\n",
        # endless trailers
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + b"T: 1\r\n" * 200 + b"\r\n",
        # the connection changes protocol: no HTTP answer follows
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n",
    ],
)
def test_malformed_answers_raise_with_a_reason(raw: bytes) -> None:
    with pytest.raises(LeanPostError) as caught:
        read_answer(io.BytesIO(raw))
    assert str(caught.value)


def test_the_request_is_written_as_http_client_writes_it() -> None:
    raw = request_bytes("h:6443", "/api/x?y=1", {"Accept": "application/json", "User-Agent": "u"}, b"{}")
    assert raw == (
        b"POST /api/x?y=1 HTTP/1.1\r\nHost: h:6443\r\nAccept-Encoding: identity\r\n"
        b"Accept: application/json\r\nUser-Agent: u\r\nContent-Length: 2\r\n\r\n{}"
    )
    given = request_bytes("h", "/", {"host": "other", "accept-encoding": "gzip", "Content-Length": "9"}, b"")
    assert given.count(b"ost:") == 1 and b"identity" not in given and given.count(b"Length") == 1


@pytest.mark.parametrize(
    ("target", "headers", "error"),
    [
        ("/b", {"Authorization": "Bearer t\n"}, ValueError),  # a token file's newline
        ("/b", {"Authorization": "Bearer t\r\nX-Evil: 1"}, ValueError),
        ("/b", {"X\r\nEvil": "1"}, ValueError),
        ("/b", {"X:": "1"}, ValueError),
        ("/b x HTTP/1.1\r\nX-Evil: 1\r\n", {}, http.client.InvalidURL),
        ("/b\x00", {}, http.client.InvalidURL),
    ],
)
def test_a_request_http_client_would_refuse_is_refused_before_it_is_sent(
    make_server: Callable, target: str, headers: dict[str, str], error: type[Exception]
) -> None:
    """Header names, values and the target went out as given: a CR or LF in a value (a token
    read with its newline) split the head, the rest of it and the body became a second request,
    and its answer was left on the kept connection. http.client refuses them with ValueError
    (InvalidURL for the target); so does this, before anything is written."""
    theirs = http.client.HTTPConnection("h")  # nothing is sent: it never connects
    with pytest.raises(error):
        theirs.putrequest("POST", target)
        for name, value in headers.items():
            theirs.putheader(name, value)
    server = make_server(lambda i: (OK, False))
    pool = urllib3.HTTPConnectionPool("127.0.0.1", server.port, maxsize=2)
    with pytest.raises(error):
        post(pool, target, headers, b"{}", 5)
    assert post(pool, "/b", {}, b"{}", 5).status == 201
    assert (server.connections, len(server.requests)) == (1, 1)


def test_header_values_that_are_not_text_are_written_as_http_client_writes_them() -> None:
    """An int or bytes value (http.client's putheader takes both): the check for line breaks
    raised TypeError on them."""
    raw = request_bytes("h", "/", {"X-Int": 5, "X-Bytes": b"v\xe9"}, b"")  # type: ignore[dict-item]
    assert b"X-Int: 5\r\nX-Bytes: v\xe9\r\n" in raw
    with pytest.raises(ValueError):
        request_bytes("h", "/", {"X-Bytes": b"v\r\nX: 1"}, b"")  # type: ignore[dict-item]


def test_host_header() -> None:
    for conn, expected in (
        (urllib3.connection.HTTPSConnection("api.example", 443), "api.example"),
        (urllib3.connection.HTTPSConnection("api.example", 6443), "api.example:6443"),
        (urllib3.connection.HTTPConnection("::1", 8080), "[::1]:8080"),
        (urllib3.connection.HTTPConnection("10.0.0.1", 80), "10.0.0.1"),
    ):
        assert host_header(conn) == expected


@pytest.fixture
def make_server() -> Iterator[Callable[[Callable[[int], tuple[bytes, bool]]], ScriptedHTTPServer]]:
    servers: list[ScriptedHTTPServer] = []

    def make(answer: Callable[[int], tuple[bytes, bool]]) -> ScriptedHTTPServer:
        servers.append(ScriptedHTTPServer(answer))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


OK = b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}"


def test_a_kept_connection_carries_the_next_post(make_server: Callable) -> None:
    server = make_server(lambda i: (OK, False))
    pool = urllib3.HTTPConnectionPool("127.0.0.1", server.port, maxsize=2)
    for _ in range(5):
        assert post(pool, "/b", {}, b"{}", 5).status == 201
    assert (server.connections, len(server.requests)) == (1, 5)


def test_interim_answers_are_skipped_and_the_connection_carries_the_next_post(make_server: Callable) -> None:
    """A 1xx answer came back as the answer (a status of 100 to the caller) and the real one was
    left on the kept connection, to be read as the next POST's answer."""
    early = b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n"
    answers = [early + OK, b"HTTP/1.1 409 Conflict\r\nContent-Length: 2\r\n\r\n{}"]
    server = make_server(lambda i: (answers[i], False))
    pool = urllib3.HTTPConnectionPool("127.0.0.1", server.port, maxsize=2)
    assert post(pool, "/b", {}, b"{}", 5).status == 201
    assert post(pool, "/b", {}, b"{}", 5).status == 409
    assert (server.connections, len(server.requests)) == (1, 2)


def test_a_connection_the_server_dropped_while_idle_is_replaced(make_server: Callable) -> None:
    """The server answers and hangs up each time (without saying so): the pool sees the kept
    connection dropped and the next POST goes on a new one."""
    server = make_server(lambda i: (OK, True))
    pool = urllib3.HTTPConnectionPool("127.0.0.1", server.port, maxsize=2)
    for _ in range(3):
        assert post(pool, "/b", {}, b"{}", 5).status == 201
        threading.Event().wait(0.05)  # the hang-up reaches this side
    assert (server.connections, len(server.requests)) == (3, 3)


def test_connection_close_is_honoured(make_server: Callable) -> None:
    answer = b"HTTP/1.1 201 Created\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    server = make_server(lambda i: (answer, True))
    pool = urllib3.HTTPConnectionPool("127.0.0.1", server.port, maxsize=2)
    assert post(pool, "/b", {}, b"{}", 5).status == 201
    assert post(pool, "/b", {}, b"{}", 5).status == 201
    assert server.connections == 2
    assert all(conn is None or conn.sock is None for conn in list(pool.pool.queue))


def test_a_hang_up_mid_answer_raises_and_the_connection_is_not_kept(make_server: Callable) -> None:
    server = make_server(lambda i: (b"HTTP/1.1 201 Created\r\nContent-Length: 50\r\n\r\n{", True))
    pool = urllib3.HTTPConnectionPool("127.0.0.1", server.port, maxsize=2)
    with pytest.raises(LeanPostError):
        post(pool, "/b", {}, b"{}", 5)
    assert all(conn is None or conn.sock is None for conn in list(pool.pool.queue))


def test_nothing_listening_raises_after_the_connect_attempts() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    pool = urllib3.HTTPConnectionPool("127.0.0.1", port, maxsize=2)
    with pytest.raises(urllib3.exceptions.NewConnectionError):
        post(pool, "/b", {}, b"{}", 2)


@pytest.mark.parametrize(
    ("timeout", "expected"),
    [
        (5, (5.0, 5.0)),
        (0.3, (0.3, 0.3)),
        ((1, 7.5), (1.0, 7.5)),
        ((None, 2), (None, 2.0)),
        ((3, 0), (3.0, None)),
        (None, (None, None)),
        (0, (None, None)),
        (-1, (None, None)),
        (True, (None, None)),  # not a number of seconds, though Python counts it as 1
        ((True, False), (None, None)),
        ((1, 2, 3), (None, None)),  # not a (connect, read) pair
        ([1, 2], (None, None)),
        ("5", (None, None)),
    ],
)
def test_timeouts_read_as_connect_and_read_seconds(timeout: object, expected: tuple) -> None:
    assert timeouts(timeout) == expected
