"""The JSON reflector: events from watch lines, and a re-list when the watch is too old (410)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from scheduler.live.reflector import Reflector, WatchExpired, parse_events


def line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode()


def test_parse_events_and_errors() -> None:
    events = list(
        parse_events(
            iter(
                [
                    line("ADDED", {"metadata": {"name": "a"}}),
                    b"",
                    b"  ",
                    line("BOOKMARK", {"metadata": {"resourceVersion": "9"}}),
                ]
            )
        )
    )
    assert [k for k, _ in events] == ["ADDED", "BOOKMARK"]
    with pytest.raises(WatchExpired):
        list(parse_events(iter([line("ERROR", {"code": 410, "message": "too old resource version"})])))
    with pytest.raises(ApiException):
        list(parse_events(iter([line("ERROR", {"code": 500, "message": "boom"})])))


class FakeResponse:
    def __init__(self, body: bytes) -> None:
        self.data = body
        self.released = False

    def stream(self, amount: int, decode_content: bool = True) -> Any:
        # split at odd places: lines must be reassembled across chunks
        for start in range(0, len(self.data), 7):
            yield self.data[start : start + 7]

    def release_conn(self) -> None:
        self.released = True


class Recorder:
    def __init__(self, stop: threading.Event) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.stop = stop

    def replace(self, items: list[dict[str, Any]], resource_version: str) -> None:
        self.calls.append(("replace", [i["metadata"]["name"] for i in items]))

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self.calls.append((event_type, obj["metadata"]["name"]))


def test_relists_after_410_and_resumes_from_the_last_version() -> None:
    stop = threading.Event()
    recorder = Recorder(stop)
    requests: list[dict[str, Any]] = []
    responses = [
        FakeResponse(
            json.dumps(
                {"metadata": {"resourceVersion": "1"}, "items": [{"metadata": {"name": "a"}}]}
            ).encode()
        ),
        FakeResponse(
            b"\n".join(
                [
                    line("ADDED", {"metadata": {"name": "b", "resourceVersion": "2"}}),
                    line("ERROR", {"code": 410, "message": "expired"}),
                ]
            )
        ),
        FakeResponse(
            json.dumps(
                {"metadata": {"resourceVersion": "5"}, "items": [{"metadata": {"name": "c"}}]}
            ).encode()
        ),
        FakeResponse(line("DELETED", {"metadata": {"name": "c", "resourceVersion": "6"}})),
    ]

    def list_call(**kwargs: Any) -> FakeResponse:
        requests.append(kwargs)
        if len(requests) == len(responses):
            stop.set()
        return responses[len(requests) - 1]

    Reflector("pods", list_call, recorder).run(stop)
    assert recorder.calls == [("replace", ["a"]), ("ADDED", "b"), ("replace", ["c"]), ("DELETED", "c")]
    assert [r.get("resource_version") for r in requests] == [None, "1", None, "5"]
    assert all(r.released for r in responses)
