"""kubegpu as kube-scheduler's extender (scheduler/live/extender.py) against the in-memory
apiserver (tests/support/schedworld.py): filter with per-node reasons, prioritize, bind with the
signed allocation on the node kube-scheduler chose, and the HTTP layer's refusals."""

from __future__ import annotations

import http.client
import json
import uuid
from typing import Any

import pytest

from scheduler.live.extender import MAX_BODY_BYTES, Extender, ExtenderServer
from scheduler.live.extenderapi import MAX_PRIORITY, ExtenderRequestError, filter_args, scaled_scores
from tests.support.schedworld import Feed, World, make_scheduler, node_json, pod_json


def setup(*nodes: dict[str, Any]) -> tuple[World, Any, Any, Any, Feed, Extender]:
    world = World()
    for node in nodes:
        world.put_node(node)
    scheduler, jobs, core, _clock = make_scheduler(world, name="default-scheduler")
    feed = Feed(world, scheduler)
    feed.relist()
    return world, scheduler, jobs, core, feed, Extender(scheduler)


def kube_pod(name: str, gpus: int, **kw: Any) -> dict[str, Any]:
    return pod_json(name, gpus, scheduler="default-scheduler", **kw)


def args(pod: dict[str, Any], names: list[str]) -> bytes:
    return json.dumps({"Pod": pod, "NodeNames": names}).encode()


def test_filter_names_each_failed_node_and_passes_what_fits() -> None:
    world, scheduler, jobs, core, feed, extender = setup(node_json("n1", 4), node_json("n2", 4))
    world.put_pod(pod_json("busy", 3, node="n1"))
    pod = kube_pod("p", 2)
    world.put_pod(pod)
    feed.sync()
    status, result = extender.handle("filter", args(pod, ["n1", "n2", "n9"]))
    assert status == 200 and result["NodeNames"] == ["n2"] and result["Error"] == ""
    assert set(result["FailedNodes"]) == {"n1", "n9"}
    assert "nvidia.com/gpu" in result["FailedNodes"]["n1"] or "GPU" in result["FailedNodes"]["n1"]
    assert result["FailedNodes"]["n9"] == "node not usable by kubegpu"


def test_a_pod_without_devices_passes_every_node_and_a_malformed_one_none() -> None:
    world, scheduler, jobs, core, feed, extender = setup(node_json("n1", 4))
    plain = kube_pod("plain", 0)
    _, result = extender.handle("filter", args(plain, ["n1", "other"]))
    assert result["NodeNames"] == ["n1", "other"] and not result["FailedNodes"]
    bad = kube_pod("bad", 1, annotations={"kubegpu.io/gpu-milli": "1_00"})
    _, result = extender.handle("filter", args(bad, ["n1"]))
    assert (
        result["NodeNames"] == [] and "invalid kubegpu request" in result["FailedAndUnresolvableNodes"]["n1"]
    )


def test_prioritize_scores_feasible_nodes_from_zero_to_ten() -> None:
    world, scheduler, jobs, core, feed, extender = setup(
        node_json("n1", 4), node_json("n2", 4), node_json("n3", 4)
    )
    world.put_pod(pod_json("half", 2, node="n1"))
    world.put_pod(pod_json("full", 4, node="n3"))
    feed.sync()
    status, scores = extender.handle("prioritize", args(kube_pod("p", 2), ["n1", "n2", "n3"]))
    assert status == 200
    by_host = {s["Host"]: s["Score"] for s in scores}
    assert by_host["n3"] == 0 and all(0 <= v <= MAX_PRIORITY for v in by_host.values())
    assert by_host["n1"] != by_host["n2"] and max(by_host.values()) == MAX_PRIORITY  # bestfit: n1 first


def test_bind_places_exact_devices_on_the_chosen_node_and_never_twice() -> None:
    world, scheduler, jobs, core, feed, extender = setup(node_json("n1", 4), node_json("n2", 4))
    for name in ("a", "b", "c"):
        world.put_pod(kube_pod(name, 2))
    feed.sync()
    for name in ("a", "b"):
        body = {"PodName": name, "PodNamespace": "ns", "PodUID": f"uid-{name}", "Node": "n2"}
        status, answer = extender.handle("bind", json.dumps(body).encode())
        assert (status, answer) == (200, {"Error": ""}), answer
    assert world.node_of("a") == world.node_of("b") == "n2"
    assert not set(world.devices_of("a")) & set(world.devices_of("b")) and len(world.devices_of("a")) == 2
    full = {"PodName": "c", "PodNamespace": "ns", "PodUID": "uid-c", "Node": "n2"}
    _, answer = extender.handle("bind", json.dumps(full).encode())
    assert "cannot take the pod now" in answer["Error"] and world.node_of("c") is None
    assert not scheduler.cache.assumed or all(u in ("uid-a", "uid-b") for u in scheduler.cache.assumed)
    again = {"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": "n1"}
    feed.sync()
    _, answer = extender.handle("bind", json.dumps(again).encode())
    assert "bound already" in answer["Error"]
    missing = {"PodName": "zz", "PodNamespace": "ns", "PodUID": "uid-zz", "Node": "n1"}
    assert "not known yet" in extender.handle("bind", json.dumps(missing).encode())[1]["Error"]
    assert not world.double_booked()


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"Pod": {}}',
        b'{"Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}, "NodeNames": "n1"}',
        b'{"Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}}',
    ],
)
def test_malformed_requests_get_400_with_a_reason(body: bytes) -> None:
    *_, extender = setup(node_json("n1", 4))
    status, answer = extender.handle("filter", body)
    assert status == 400 and answer["Error"].startswith("bad filter request")


def test_scaled_scores_and_args() -> None:
    import numpy as np

    assert scaled_scores(np.array([1.0, 3.0, 2.0])) == [0, 10, 5]
    assert scaled_scores(np.array([4.0, 4.0])) == [10, 10]
    with pytest.raises(ExtenderRequestError):
        filter_args({"Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}, "NodeNames": [""]})
    nodes = {
        "Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}},
        "Nodes": {"items": [{"metadata": {"name": "n1"}}]},
    }
    assert filter_args(nodes).node_names == ("n1",) and not filter_args(nodes).names_only


def test_the_http_server_answers_and_refuses_as_documented() -> None:
    world, scheduler, jobs, core, feed, extender = setup(node_json("n1", 4))
    ready = [True]
    server = ExtenderServer(
        extender, "127.0.0.1:0", lambda: (ready[0], "synced" if ready[0] else "not leading")
    )
    server.start()
    try:

        def post(path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            conn.request("POST", path, body=body, headers=headers or {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            conn.close()
            return response.status, json.loads(data) if data else {}

        status, result = post("/filter", args(kube_pod("p", 1), ["n1"]))
        assert status == 200 and result["NodeNames"] == ["n1"]
        assert post("/nope", b"{}")[0] == 404
        assert post("/filter", b"{")[0] == 400
        big = {"Content-Length": str(MAX_BODY_BYTES + 1)}
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.putrequest("POST", "/filter")
        for key, value in big.items():
            conn.putheader(key, value)
        conn.endheaders()
        assert conn.getresponse().status == 413
        conn.close()
        ready[0] = False
        assert post("/filter", args(kube_pod("p", 1), ["n1"]))[0] == 503
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        assert 'kubegpu_extender_request_duration_seconds_count{verb="filter"}' in text
    finally:
        server.stop()


def test_the_live_scheduler_and_its_extender_share_one_account() -> None:
    """One replica serving both its own pods and kube-scheduler's (extenderAddress): a device the
    scheduler assumed for its pod, Binding still in flight, is not given to the extender's pod."""
    world = World()
    world.put_node(node_json("n1", 4))
    scheduler, jobs, core, clock = make_scheduler(world, name="kubegpu")
    feed = Feed(world, scheduler)
    feed.relist()
    extender = Extender(scheduler)
    world.put_pod(pod_json("ours", 2))
    for name, gpus in (("theirs", 2), ("late", 1)):
        world.put_pod(kube_pod(name, gpus))
    feed.sync()
    while scheduler.schedule_next(0):
        pass
    assert jobs.binds() and world.node_of("ours") is None  # assumed, its Binding not sent yet
    theirs = {"PodName": "theirs", "PodNamespace": "ns", "PodUID": "uid-theirs", "Node": "n1"}
    assert extender.handle("bind", json.dumps(theirs).encode()) == (200, {"Error": ""})
    late = {"PodName": "late", "PodNamespace": "ns", "PodUID": "uid-late", "Node": "n1"}
    assert "cannot take the pod now" in extender.handle("bind", json.dumps(late).encode())[1]["Error"]
    jobs.run_all()
    feed.sync()
    assert world.node_of("ours") == world.node_of("theirs") == "n1"
    assert not set(world.devices_of("ours")) & set(world.devices_of("theirs"))
    assert not world.double_booked()


def test_the_shipped_extender_manifests_load() -> None:
    """deploy/extender: the scheduler config validates with the extender on, and kube-scheduler's
    stanza is the one tests/test_extender_api.py runs kube-scheduler with (but its URL)."""
    from pathlib import Path

    import yaml

    from scheduler.live.config import load_config, validate
    from tests.test_extender_api import extender_config

    deploy = Path(__file__).resolve().parents[1] / "deploy" / "extender"
    config_map, service = yaml.safe_load_all((deploy / "kubegpu-scheduler-config.yaml").read_text())
    path = Path("/tmp") / f"kubegpu-extender-{uuid.uuid4().hex}.yaml"
    try:
        path.write_text(config_map["data"]["scheduler.yaml"])
        config = load_config(path)
    finally:
        path.unlink()
    validate(config)
    assert config.extender_address == "0.0.0.0:8888"
    assert service["spec"]["ports"][0]["port"] == 8888
    shipped = yaml.safe_load((deploy / "kube-scheduler-config.yaml").read_text())
    tested = extender_config("default-scheduler", 8888)
    assert shipped["profiles"] == tested["profiles"]
    (ours,), (theirs,) = shipped["extenders"], tested["extenders"]
    assert ours["urlPrefix"].endswith(":8888") and {k: v for k, v in ours.items() if k != "urlPrefix"} == {
        k: v for k, v in theirs.items() if k != "urlPrefix"
    }
