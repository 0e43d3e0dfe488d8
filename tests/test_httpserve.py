"""kubegpu/httpserve.py's ThreadReusingHTTPServer: a thread per connection in service, threads
kept for the next connection instead of one started per connection, and none lost or leaked
(every connection answered, idle threads ended after their idle time and by ``server_close``)."""

from __future__ import annotations

import queue
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from kubegpu.httpserve import MetricsServer, ThreadReusingHTTPServer, bound_server
from tests.support.echohttp import EchoHandler, echo_server


def _connection_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "http-connection")


def _wait(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.fixture
def server() -> Iterator[ThreadReusingHTTPServer]:
    with echo_server() as http_server:
        yield http_server


def _get(port: int, path: str, requests: int = 1) -> list[bytes]:
    """``requests`` GETs on one kept-alive connection; the bodies."""
    bodies = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        stream = sock.makefile("rb")
        for _ in range(requests):
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert stream.readline().startswith(b"HTTP/1.1 200")
            length = 0
            while (line := stream.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            bodies.append(stream.read(length))
    return bodies


def test_connections_one_after_another_are_served_by_one_thread(server: ThreadReusingHTTPServer) -> None:
    port = server.server_address[1]
    for i in range(20):
        assert _get(port, f"/{i}") == [f"/{i}".encode()]
        _wait(lambda: server._idle == 1)  # the thread is back, waiting for the next connection
    assert server.threads_started == 1


def test_connections_at_once_each_get_a_thread(server: ThreadReusingHTTPServer) -> None:
    port = server.server_address[1]
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(6)]
    try:
        _wait(lambda: server.threads_started == 6)
        for i, sock in enumerate(held):  # each one is served while the others stay open
            sock.sendall(f"GET /{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert sock.makefile("rb").readline().startswith(b"HTTP/1.1 200")
    finally:
        for sock in held:
            sock.close()
    _wait(lambda: server._idle == 6)
    assert _get(port, "/again") == [b"/again"] and server.threads_started == 6


@pytest.mark.parametrize("idle_seconds", [60.0, 0.0005])
def test_many_clients_at_random_are_all_answered(
    server: ThreadReusingHTTPServer, idle_seconds: float
) -> None:
    """Connections of random lengths from 16 clients at once: every request answered (no hand-off
    lost between a thread going idle and a new connection, also when idle threads time out all the
    time, racing the hand-offs), and, kept idle, far fewer threads than connections."""
    server.idle_seconds = idle_seconds
    port = server.server_address[1]
    rng = random.Random(3)
    plan = [(f"/{i}", rng.randint(1, 4)) for i in range(400)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda job: _get(port, job[0], job[1]), plan))
    assert answers == [[path.encode()] * n for path, n in plan]
    assert server.threads_started <= 64 or idle_seconds < 1


def test_idle_threads_end_after_their_idle_time() -> None:
    http_server = bound_server("127.0.0.1:0", EchoHandler)
    http_server.idle_seconds = 0.2
    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    try:
        before = _connection_threads()
        port = http_server.server_address[1]
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda i: _get(port, f"/{i}", 2), range(8)))
        _wait(lambda: _connection_threads() == before and http_server._idle == 0)
        assert _get(port, "/later") == [b"/later"]  # a new thread serves the next one
    finally:
        http_server.shutdown()
        http_server.server_close()


def test_server_close_ends_the_idle_threads() -> None:
    before = _connection_threads()
    http_server = bound_server("127.0.0.1:0", EchoHandler)
    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    port = http_server.server_address[1]
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda i: _get(port, f"/{i}"), range(6)))
    _wait(lambda: http_server._idle == http_server.threads_started)
    assert _connection_threads() > before
    http_server.shutdown()
    http_server.server_close()
    _wait(lambda: _connection_threads() == before)


def test_metrics_server_still_serves_its_probes() -> None:
    metrics = MetricsServer("127.0.0.1:0", lambda: b"m 1\n", {"/healthz": lambda: (True, "ok")})
    metrics.start()
    try:
        with socket.create_connection(("127.0.0.1", metrics.port), timeout=5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            assert sock.makefile("rb").read().endswith(b"ok\n")
    finally:
        metrics.stop()


def test_a_connection_handed_off_as_the_idle_thread_times_out_is_taken() -> None:
    """The race the hand-off must survive: an idle thread's wait times out and, before it takes
    the lock to leave, a connection is handed to it (it was still counted idle). It must serve
    that connection, not leave it in the queue with no thread for it."""
    http_server = ThreadReusingHTTPServer(("127.0.0.1", 0), EchoHandler)  # not serving: driven by hand
    real = http_server._handoff

    class Racing:
        def get(self, timeout: float) -> object:
            http_server.process_request("conn", ("10.0.0.1", 1))  # arrives just after the timeout
            raise queue.Empty

        def get_nowait(self) -> object:
            return real.get_nowait()

        def put(self, item: object) -> None:
            real.put(item)

    http_server._handoff = Racing()  # type: ignore[assignment]
    try:
        assert http_server._next_connection() == ("conn", ("10.0.0.1", 1))
        assert http_server._idle == 0 and http_server.threads_started == 0  # handed off, no new thread

        class Quiet(Racing):
            def get(self, timeout: float) -> object:
                raise queue.Empty

        http_server._handoff = Quiet()  # type: ignore[assignment]
        assert http_server._next_connection() is None and http_server._idle == 0  # timed out: leaves
    finally:
        http_server.server_close()


def test_server_close_racing_an_idle_thread_that_times_out_loses_no_connection() -> None:
    """The other race: an idle thread's wait times out while ``server_close`` runs; it takes the
    lock after ``server_close`` counted it (and set the idle count to 0) but before its wake-up
    reached the queue. It left by counting itself out again: the idle count went to -1, and a
    connection accepted after that (``serve_forever`` still running) was put in the queue for a
    thread that did not exist."""
    http_server = ThreadReusingHTTPServer(("127.0.0.1", 0), EchoHandler)  # not serving: driven by hand
    real = http_server._handoff
    counted, woken = threading.Event(), threading.Event()
    closer = threading.Thread(target=http_server.server_close)

    class Racing:
        def get(self, timeout: float) -> object:
            closer.start()  # server_close runs now ...
            assert counted.wait(5)  # ... and has counted this thread, not yet woken it
            raise queue.Empty

        def get_nowait(self) -> object:
            return real.get_nowait()

        def put(self, item: object) -> None:
            if item is None and threading.current_thread() is closer:
                counted.set()
                assert woken.wait(5)
            real.put(item)

    http_server._handoff = Racing()  # type: ignore[assignment]
    served: list[object] = []
    done = threading.Event()
    http_server.finish_request = lambda request, address: served.append(request)  # type: ignore[method-assign]
    http_server.shutdown_request = lambda request: done.set()  # type: ignore[method-assign]
    try:
        assert http_server._next_connection() is None  # it leaves
        woken.set()
        closer.join(5)
        assert http_server._idle == 0
        http_server.process_request("late", ("10.0.0.1", 1))  # accepted as the server closed
        assert done.wait(5) and served == ["late"]  # a thread served it
    finally:
        woken.set()
        http_server.server_close()
