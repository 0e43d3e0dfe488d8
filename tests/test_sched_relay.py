"""A standby extender relays to the leader (scheduler/live/relay.py): where a replica says it
listens, which URL a standby takes from the Lease (pure), the Lease annotation's lifecycle on an
in-memory Lease API, and the relay's bounded answers against local HTTP servers."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry

from scheduler.live import relay as relay_module
from scheduler.live.leader import LeaseRecord
from scheduler.live.relay import (
    ANNOTATION,
    RELAYED_HEADER,
    Relay,
    advertised_url,
    leader_annotation,
    leader_url,
)
from tests.test_sched_leader import T0, FakeClock, FakeLeases, fake_elector, held


def test_advertised_url_prefers_the_flag_then_pod_ip_then_a_named_listening_host() -> None:
    assert (
        advertised_url("10.0.0.9:9000", "0.0.0.0:8888", False, {"POD_IP": "10.1.1.1"})
        == "http://10.0.0.9:9000"
    )
    assert advertised_url(None, "0.0.0.0:8888", True, {"POD_IP": "10.1.1.1"}) == "https://10.1.1.1:8888"
    assert advertised_url(None, "0.0.0.0:8888", False, {"POD_IP": "fd00::5"}) == "http://[fd00::5]:8888"
    assert advertised_url(None, "127.0.0.1:8888", False, {}) == "http://127.0.0.1:8888"
    assert advertised_url(None, "0.0.0.0:8888", False, {}) is None  # nobody can reach "0.0.0.0"
    assert advertised_url(None, "127.0.0.1:0", False, {}) is None  # the port is not known yet


def test_leader_url_only_for_another_fresh_holder_that_wrote_it() -> None:
    record = held("a", T0)
    ours = leader_annotation("a", "http://10.0.0.1:8888")
    assert leader_url(record, ours, "b", T0) == "http://10.0.0.1:8888"
    assert leader_url(record, ours, "a", T0) is None  # the holder itself never relays
    assert leader_url(record, ours, "b", T0 + timedelta(seconds=16)) is None  # expired
    assert leader_url(LeaseRecord(), ours, "b", T0) is None  # released
    assert leader_url(held("c", T0), ours, "b", T0) is None  # left by a former holder
    assert leader_url(None, ours, "b", T0) is None
    for bad in (
        "",
        "{",
        "[]",
        '{"holder":"a"}',
        '{"holder":"a","url":"ftp://x"}',
        '{"holder":"a","url":"http://x:99999"}',
    ):
        assert leader_url(record, {ANNOTATION: bad}, "b", T0) is None, bad


def test_the_holder_writes_its_annotation_and_drops_it_on_release() -> None:
    api, clock = FakeLeases(), FakeClock()
    mine = leader_annotation("a", "http://10.0.0.1:8888")
    a = fake_elector(api, "a", clock)
    a.annotations = dict(mine)
    b = fake_elector(api, "b", clock)
    b.annotations = leader_annotation("b", "http://10.0.0.2:8888")
    a.step()
    api.leases[("ns", "lease")]["metadata"].setdefault("annotations", {})["other"] = "kept"
    clock.advance(2)
    a.step()  # a renewal keeps others' annotations
    assert api.leases[("ns", "lease")]["metadata"]["annotations"] == {**mine, "other": "kept"}
    b.step()
    assert leader_url(b.observed, b.observed_annotations, "b", clock.now) == "http://10.0.0.1:8888"
    assert a.release()
    assert api.leases[("ns", "lease")]["metadata"]["annotations"] == {"other": "kept"}
    b.step()  # takes the released lease: its own URL replaces nothing stale
    assert json.loads(api.leases[("ns", "lease")]["metadata"]["annotations"][ANNOTATION])["holder"] == "b"


class Answering(BaseHTTPRequestHandler):
    """A leader stand-in: echoes the relayed request; on /slow it answers only after 20 s."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/slow":
            time.sleep(20)  # far past the relay's bound: the relay gives up first
        answer = json.dumps({"path": self.path, "body": body.decode(), "by": self.headers[RELAYED_HEADER]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer.encode())


@pytest.fixture
def leader() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_relay_passes_the_request_and_the_answer_through(leader: str) -> None:
    relay = Relay(lambda: None, "b", CollectorRegistry())
    status, kind, answer = relay.relay(leader, "/filter", b'{"x":1}')
    assert (status, kind) == (200, "application/json")
    assert json.loads(answer) == {"path": "/filter", "body": '{"x":1}', "by": "b"}


def test_the_relay_answers_503_within_its_bound(leader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_module, "RELAY_TIMEOUT_SECONDS", 1.0)
    relay = Relay(lambda: None, "b", CollectorRegistry())
    status, _, answer = relay.relay(leader, "/slow", b"{}")
    assert status == 503 and "timed out" in json.loads(answer)["Error"], answer
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    status, _, answer = relay.relay(f"http://127.0.0.1:{port}", "/bind", b"{}")
    assert status == 503 and "ConnectionRefusedError" in json.loads(answer)["Error"]
