"""kubegpu as kube-scheduler's extender (scheduler/live/extender.py) against the in-memory
apiserver (tests/support/schedworld.py): filter with per-node reasons, prioritize, bind with the
signed allocation on the node kube-scheduler chose, and the HTTP layer's refusals."""

from __future__ import annotations

import http.client
import json
import random
import socket
import ssl
import uuid
from pathlib import Path
from typing import Any

import pytest

from crishim.advertiser import publication
from kubegpu import allocation as contract
from scheduler.core.rdma import NO_BANDWIDTH, NO_FREE_VFS
from scheduler.core.schedule import Placement, schedule_one
from scheduler.core.topology import load_machine
from scheduler.live.extender import MAX_BODY_BYTES, Extender, ExtenderServer
from scheduler.live.extenderapi import MAX_PRIORITY, ExtenderRequestError, filter_args, scaled_scores
from tests.fixtures.keys import SIGNING
from tests.support.rdmainv import Pf, rdma_inventory
from tests.support.schedworld import KEYS, Feed, World, gpu_id, make_scheduler, node_json, pod_json
from tests.support.tlscerts import Authority


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
    # bestfit: n1 first; n2 scores 0 and n3 cannot take the pod: both left out (kube-scheduler counts 0)
    assert by_host == {"n1": MAX_PRIORITY} and len(scores) == 1
    _, scores = extender.handle("prioritize", args(kube_pod("p", 2), ["n2", "n2"]))
    assert scores == []  # one node (named twice): nothing to tell apart
    _, scores = extender.handle("prioritize", args(kube_pod("plain", 0), ["n1", "n2", "n3"]))
    assert scores == []  # no device asked for: every node 0


def test_choose_answers_the_one_node_kubegpus_own_scheduler_would_pick() -> None:
    world, scheduler, jobs, core, feed, extender = setup(
        node_json("n1", 4), node_json("n2", 4), node_json("n3", 4)
    )
    world.put_pod(pod_json("half", 2, node="n1"))
    world.put_pod(pod_json("full", 4, node="n3"))
    pod = kube_pod("p", 2)
    world.put_pod(pod)
    feed.sync()
    # bestfit: kubegpu's own scheduler puts the pod on n1; choose answers n1 alone, no reasons
    request = scheduler._request("uid-p", pod)
    own = schedule_one(request, scheduler._view(), scheduler.policy, random.Random(0))
    assert isinstance(own, Placement) and own.node == "n1"
    status, result = extender.handle("choose", args(pod, ["n1", "n2", "n3"]))
    assert status == 200 and result["NodeNames"] == ["n1"] and result["Error"] == ""
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}
    # only among kube-scheduler's candidates (it filtered n1 out): n2; a name kubegpu lacks is no choice
    _, result = extender.handle("choose", args(pod, ["n3", "n9", "n2"]))
    assert result["NodeNames"] == ["n2"]
    # the Nodes form is answered in that form
    doc = {"Pod": pod, "Nodes": {"items": [{"metadata": {"name": n}} for n in ("n2", "n1")]}}
    _, result = extender.handle("choose", json.dumps(doc).encode())
    assert result["Nodes"] == {"items": [{"metadata": {"name": "n1"}}]} and "NodeNames" not in result


def test_choose_answers_filters_reasons_where_it_has_no_choice() -> None:
    world, scheduler, jobs, core, feed, extender = setup(node_json("n1", 4), node_json("n2", 4))
    world.put_pod(pod_json("busy", 3, node="n1"))
    world.put_pod(pod_json("all", 4, node="n2"))
    feed.sync()
    cases = [
        (kube_pod("big", 2), ["n1", "n2", "n9"]),  # fits nowhere: every node's reason
        (kube_pod("big", 2), ["n9"]),  # no node kubegpu knows
        (kube_pod("plain", 0), ["n1", "n2", "other"]),  # asks for no device: every node passes
        (kube_pod("bad", 1, annotations={"kubegpu.io/gpu-milli": "1_00"}), ["n1"]),  # invalid
    ]
    for pod, names in cases:
        chosen = extender.handle("choose", args(pod, names))
        assert chosen == extender.handle("filter", args(pod, names)), pod["metadata"]["name"]
    _, result = extender.handle("choose", args(kube_pod("big", 2), ["n1", "n2", "n9"]))
    assert result["NodeNames"] == [] and set(result["FailedNodes"]) == {"n1", "n2", "n9"}
    assert extender.handle("choose", b"not json")[0] == 400


def test_two_pods_chosen_before_either_binds_never_share_a_device() -> None:
    """kube-scheduler runs choose for the next pod while the last one's bind is in flight: both
    may be told the same node; the second bind then books other devices or is refused (retried),
    and the retry's choose sees the first pod's devices taken."""
    world, scheduler, jobs, core, feed, extender = setup(node_json("n1", 4), node_json("n2", 4))
    world.put_pod(pod_json("busy", 2, node="n1"))
    a, b = kube_pod("a", 2), kube_pod("b", 2)
    world.put_pod(a)
    world.put_pod(b)
    feed.sync()
    assert extender.handle("choose", args(a, ["n1", "n2"]))[1]["NodeNames"] == ["n1"]
    assert extender.handle("choose", args(b, ["n1", "n2"]))[1]["NodeNames"] == ["n1"]
    for name, expected in (("a", ""), ("b", "cannot take the pod now")):
        body = {"PodName": name, "PodNamespace": "ns", "PodUID": f"uid-{name}", "Node": "n1"}
        assert expected in extender.handle("bind", json.dumps(body).encode())[1]["Error"]
    assert extender.handle("choose", args(b, ["n1", "n2"]))[1]["NodeNames"] == ["n2"]
    body = {"PodName": "b", "PodNamespace": "ns", "PodUID": "uid-b", "Node": "n2"}
    assert extender.handle("bind", json.dumps(body).encode()) == (200, {"Error": ""})
    feed.sync()
    assert (world.node_of("a"), world.node_of("b")) == ("n1", "n2") and not world.double_booked()


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
        b"[" * 100_000 + b"]" * 100_000,  # nested beyond any parser's depth (json: RecursionError, a 500)
        b'{"Pod": NaN}',
        b'{"Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}, "NodeNames": ["\xff"]}',
        b"\xef\xbb\xbf{}",  # a byte-order mark
    ],
)
def test_malformed_requests_get_400_with_a_reason(body: bytes) -> None:
    *_, extender = setup(node_json("n1", 4))
    status, answer = extender.handle("filter", body)
    assert status == 400 and answer["Error"].startswith("bad filter request")


def test_scaled_scores_and_args() -> None:
    import numpy as np

    assert scaled_scores(np.array([1.0, 3.0, 2.0])) == [0, 10, 5]
    assert scaled_scores(np.array([4.0, 4.0])) == [0, 0]  # all equal: a constant decides nothing
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


def test_kube_schedulers_connection_is_kept_alive_between_verbs() -> None:
    """HTTP/1.0 answers closed the connection after each verb: kube-scheduler's client opened a new
    TCP connection, and the server a new thread, for every filter and prioritize (most of the
    extender's CPU per pod). Answers are HTTP/1.1 now and one connection carries the verbs; one
    whose body cannot be delimited is closed."""
    world, scheduler, jobs, core, feed, extender = setup(node_json("n1", 4))
    server = ExtenderServer(extender, "127.0.0.1:0", lambda: (True, "synced"))
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            stream = sock.makefile("rb")
            for verb in ("filter", "prioritize", "filter"):
                body = args(kube_pod("p", 1), ["n1"])
                head = f"POST /{verb} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
                sock.sendall(head.encode() + body)
                status = stream.readline()
                assert status.startswith(b"HTTP/1.1 200"), status
                length = 0
                while (line := stream.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    assert not (name.lower() == "connection" and "close" in value.lower())
                    if name.lower() == "content-length":
                        length = int(value)
                answer = json.loads(stream.read(length))  # the same socket answers the next verb too
                # one node: filter passes it; prioritize has nothing to tell apart (every node 0)
                assert answer == ([] if verb == "prioritize" else {**answer, "NodeNames": ["n1"]})
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\n\r\n{}")
            answer = sock.makefile("rb").read()  # returns: the server closed the connection
            assert answer.startswith(b"HTTP/1.1 411")
    finally:
        server.stop()


def test_a_body_the_extender_does_not_read_never_becomes_the_next_request() -> None:
    """A GET with a body (a Content-Length, a chunked Transfer-Encoding) left the body unread on
    a kept-alive connection: the server read it as the next request (a request smuggled past a
    proxy that saw one). Such a connection is closed after its answer; so is a POST whose body
    ended before its Content-Length (the client hung up: nothing to answer)."""
    world, scheduler, jobs, core, feed, extender = setup(node_json("n1", 4))
    server = ExtenderServer(extender, "127.0.0.1:0", lambda: (True, "synced"))
    server.start()
    smuggled = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    try:
        for head in (
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(smuggled),
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
        ):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                sock.sendall(head + smuggled)
                answer = sock.makefile("rb").read()  # returns: the server closed the connection
            assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1 ") == 1, answer[:300]
            assert b"Connection: close" in answer
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{}")
            sock.shutdown(socket.SHUT_WR)
            assert sock.makefile("rb").read() == b""  # no answer to a cut body, and closed
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
    stanza is the one tests/test_extender_api.py runs kube-scheduler with (but its URL), with the
    verbs docs/extender.md names."""
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
    # kubegpu picks the node (choose), binds and narrows preemption; nothing left for prioritize
    assert (ours["filterVerb"], ours["bindVerb"], ours["preemptVerb"]) == ("choose", "bind", "preempt")
    assert "prioritizeVerb" not in ours and ours["nodeCacheCapable"] is True and ours["ignorable"] is False


# --- preempt ----------------------------------------------------------------------------------------

RTX8000 = Path(__file__).resolve().parents[1] / "devices" / "topologies" / "rtx8000-4gpu.json"
NVLINK_PAIR = {"kubegpu.io/topology": "nvlink=require"}


def bridged_node(name: str) -> dict[str, Any]:
    """4 GPUs with NVLink bridges on the pairs (0,3) and (1,2) only."""
    inventory = publication(load_machine(RTX8000, prefix=f"GPU-{name}-")).inventory
    return node_json(name, [(gpu_id(name, i), True) for i in range(4)], inventory=inventory)


def holder(name: str, node: str, gpus: list[int], priority: int, milli: int = 0, **kw: Any) -> dict[str, Any]:
    """A pod of ``priority`` bound to ``node`` holding these GPUs (a share of ``milli`` if given)."""
    pod = kube_pod(name, 0 if milli else len(gpus), priority=priority, node=node, **kw)
    devices = tuple(gpu_id(node, i) for i in gpus)
    shares = {d: contract.Share(milli) for d in devices} if milli else {}
    allocation = contract.Allocation(
        node, pod["metadata"]["uid"], {"app": contract.ContainerAllocation(devices, shares)}
    )
    pod["metadata"]["annotations"][contract.ANNOTATION] = contract.sign(allocation, "k1", SIGNING["k1"])
    return pod


def preempt(extender: Extender, pod: dict[str, Any], proposals: dict[str, tuple[list[str], int]]) -> Any:
    body = {
        "Pod": pod,
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": f"uid-{n}"} for n in names], "NumPDBViolations": violations}
            for node, (names, violations) in proposals.items()
        },
    }
    status, answer = extender.handle("preempt", json.dumps(body).encode())
    assert status == 200, answer
    return {
        node: ([p["UID"].removeprefix("uid-") for p in v["Pods"]], v["NumPDBViolations"])
        for node, v in answer["NodeNameToMetaVictims"].items()
    }


def test_preempt_drops_a_node_whose_proposed_victims_free_no_nvlink_pair() -> None:
    """kube-scheduler, counting GPUs, proposes the two least important pods of each full node. On
    x they hold GPUs 0 and 1, which no NVLink bridge joins: evicting them would not let the pod in,
    so x is dropped. On y they hold 0 and 3, a bridged pair: y stays with exactly those victims."""
    world, scheduler, jobs, core, feed, extender = setup(bridged_node("x"), bridged_node("y"))
    for node, priorities in (("x", (100, 110, 300, 310)), ("y", (200, 300, 310, 210))):
        for i, priority in enumerate(priorities):
            world.put_pod(holder(f"{node}{i}", node, [i], priority))
    pod = kube_pod("high", 2, priority=1000, annotations=NVLINK_PAIR)
    world.put_pod(pod)
    feed.sync()
    answer = preempt(extender, pod, {"x": (["x0", "x1"], 0), "y": (["y0", "y3"], 0)})
    assert answer == {"y": (["y0", "y3"], 0)}
    # a pod that wants any two GPUs: both proposals free two, both stay whole
    plain = kube_pod("plain", 2, priority=1000)
    world.put_pod(plain)
    feed.sync()
    answer = preempt(extender, plain, {"x": (["x0", "x1"], 0), "y": (["y0", "y3"], 0)})
    assert answer == {"x": (["x0", "x1"], 0), "y": (["y0", "y3"], 0)}


def test_preempt_narrows_to_the_victims_kubegpus_view_needs() -> None:
    """One GPU is wanted. Of the proposal {w1 (whole GPU 1), s (a share of GPU 2, which a more
    important share also holds)}, evicting s frees no GPU: only w1 is returned. A proposal of s
    alone cannot help and the node is dropped; one where the pod fits without evicting anyone in
    kubegpu's view (kube-scheduler wants the room for its own reasons) is kept whole, its count too."""
    world, scheduler, jobs, core, feed, extender = setup(node_json("n1", 4), node_json("n2", 4))
    world.put_pod(holder("w0", "n1", [0], 900))
    world.put_pod(holder("w1", "n1", [1], 100))
    world.put_pod(holder("s", "n1", [2], 50, milli=500))
    world.put_pod(holder("t", "n1", [2], 2000, milli=500))
    world.put_pod(holder("w3", "n1", [3], 900))
    world.put_pod(holder("free", "n2", [0], 10))
    pod = kube_pod("high", 1, priority=1000)
    world.put_pod(pod)
    feed.sync()
    assert preempt(extender, pod, {"n1": (["w1", "s"], 0)}) == {"n1": (["w1"], 0)}
    assert preempt(extender, pod, {"n1": (["s"], 0)}) == {}
    assert preempt(extender, pod, {"n2": (["free"], 3)}) == {"n2": (["free"], 3)}
    # nodes kubegpu does not know, and empty proposals, are dropped; kube-scheduler's order of
    # victims is kept where the proposal stays whole
    assert preempt(extender, pod, {"n9": (["w1"], 0), "n1": ([], 0)}) == {}
    assert preempt(extender, pod, {"n1": (["w3", "w1"], 0)}) == {"n1": (["w1"], 0)}


def test_preempt_counts_pdb_violations_for_what_it_returns() -> None:
    """w1 is covered by a budget that allows no disruption, w3 is not: of the proposal {w1, w3}
    (one GPU wanted) w3 goes, with no violation, though kube-scheduler counted one for the pair."""
    world, scheduler, jobs, core, feed, extender = setup(node_json("n1", 4))
    for i in range(4):
        world.put_pod(holder(f"w{i}", "n1", [i], 100 + i, labels={"app": "db"} if i == 1 else {}))
    pod = kube_pod("high", 1, priority=1000)
    world.put_pod(pod)
    feed.sync()
    scheduler.replace_budgets(
        [
            {
                "metadata": {"name": "keep-db", "namespace": "ns"},
                "spec": {"selector": {"matchLabels": {"app": "db"}}},
                "status": {"disruptionsAllowed": 0},
            }
        ]
    )
    assert preempt(extender, pod, {"n1": (["w3", "w1"], 1)}) == {"n1": (["w3"], 0)}
    two = kube_pod("two", 2, priority=1000)
    world.put_pod(two)
    feed.sync()
    assert preempt(extender, two, {"n1": (["w3", "w1"], 1)}) == {"n1": (["w3", "w1"], 1)}
    assert preempt(extender, two, {"n1": (["w1", "w2", "w3"], 1)}) == {"n1": (["w3", "w2"], 0)}


def test_preempt_for_a_share_and_for_pods_kubegpu_has_no_word_on() -> None:
    """A share needs room on one GPU: of {a (half of GPU 0), b (half of GPU 1)} evicting one will do
    (the least important). A pod asking for no device keeps every proposal; an invalid one gets
    none; a victim kubegpu does not see on the node stays (it cannot judge it)."""
    world, scheduler, jobs, core, feed, extender = setup(node_json("n1", 2))
    world.put_pod(holder("a", "n1", [0], 10, milli=600))
    world.put_pod(holder("b", "n1", [1], 20, milli=600))
    share = kube_pod("share", 0, priority=1000, annotations={"kubegpu.io/gpu-milli": "500"})
    plain = kube_pod("plain", 0, priority=1000)
    bad = kube_pod("bad", 1, priority=1000, annotations={"kubegpu.io/gpu-milli": "1_00"})
    for pod in (share, plain, bad):
        world.put_pod(pod)
    feed.sync()
    assert preempt(extender, share, {"n1": (["b", "a"], 0)}) == {"n1": (["a"], 0)}
    assert preempt(extender, plain, {"n1": (["b"], 2), "n5": (["x"], 0)}) == {
        "n1": (["b"], 2),
        "n5": (["x"], 0),
    }
    assert preempt(extender, bad, {"n1": (["a"], 0)}) == {}
    assert preempt(extender, share, {"n1": (["b", "a", "ghost"], 0)}) == {"n1": (["a", "ghost"], 0)}


def test_preempt_reads_both_forms_and_refuses_malformed_ones() -> None:
    world, scheduler, jobs, core, feed, extender = setup(node_json("n1", 1))
    world.put_pod(holder("low", "n1", [0], 1))
    pod = kube_pod("high", 1, priority=1000)
    world.put_pod(pod)
    feed.sync()
    whole = {
        "Pod": pod,
        "NodeNameToVictims": {"n1": {"Pods": [world.find("ns", "low")], "NumPDBViolations": 0}},
    }
    status, answer = extender.handle("preempt", json.dumps(whole).encode())
    assert (status, answer) == (
        200,
        {"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-low"}], "NumPDBViolations": 0}}},
    )
    assert extender.handle("preempt", json.dumps({"Pod": pod, "NodeNameToMetaVictims": None}).encode()) == (
        200,
        {"NodeNameToMetaVictims": {}},
    )
    for victims in (
        {"n1": {"Pods": [{"UID": ""}]}},
        {"n1": {"Pods": {"UID": "u"}}},
        {"n1": {"Pods": [{"UID": "u"}, {"UID": "u"}]}},
        {"n1": {"Pods": [], "NumPDBViolations": -1}},
        {"n1": {"Pods": [], "NumPDBViolations": True}},
        ["n1"],
    ):
        status, answer = extender.handle(
            "preempt", json.dumps({"Pod": pod, "NodeNameToMetaVictims": victims}).encode()
        )
        assert status == 400 and answer["Error"].startswith("bad preempt request"), victims


# --- TLS --------------------------------------------------------------------------------------------


def https_get(port: int, ca: Path, path: str = "/healthz", timeout: float = 5) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_client_that_never_finishes_its_tls_handshake_stalls_no_one_else(tmp_path: Path) -> None:
    """The TLS handshake runs in each connection's own thread, under the read timeout: a client
    that connects and sends nothing (or garbage) does not keep kube-scheduler's calls waiting."""
    *_, extender = setup(node_json("n1", 4))
    served = Authority(tmp_path, "served").issue("extender")
    server = ExtenderServer(
        extender, "127.0.0.1:0", lambda: (True, "ready"), (str(served.cert), str(served.key))
    )
    server.start()
    idle = socket.create_connection(("127.0.0.1", server.port))
    garbage = socket.create_connection(("127.0.0.1", server.port))
    garbage.sendall(b"GET / HTTP/1.1\r\n\r\n")  # plain HTTP to the HTTPS port
    try:
        assert https_get(server.port, served.ca) == 200
        with pytest.raises(ssl.SSLCertVerificationError):  # another CA: refused, not trusted
            https_get(server.port, Authority(tmp_path, "other").path)
        assert https_get(server.port, served.ca) == 200
    finally:
        idle.close()
        garbage.close()
        server.stop()


# --- RDMA interfaces through the extender ---------------------------------------------------------


def nic_node(name: str, vfs: int = 2, rate: float = 100) -> dict[str, Any]:
    """2 GPUs and one PF of ``rate`` Gbit/s with ``vfs`` VFs on their PCIe switch."""
    inventory = rdma_inventory(name, [0, 0], [Pf("mlx5_0", rate, 0, (0, 1), vfs)])
    return node_json(name, 2, inventory=publication(inventory).inventory)


def rdma(count: int, bandwidth: str = "") -> dict[str, str]:
    wanted = {"kubegpu.io/rdma-interfaces": str(count)}
    return {**wanted, "kubegpu.io/rdma-bandwidth": bandwidth} if bandwidth else wanted


def vf_holder(name: str, node: str, gpus: list[int], vfs: list[int], priority: int) -> dict[str, Any]:
    """A pod bound to ``node`` holding these GPUs and VFs of mlx5_0 (a version-2 allocation)."""
    pod = kube_pod(name, len(gpus), priority=priority, node=node, annotations=rdma(len(vfs)))
    devices = tuple(gpu_id(node, i) for i in gpus)
    allocation = contract.Allocation(
        node,
        pod["metadata"]["uid"],
        {"app": contract.ContainerAllocation(devices)} if devices else {},
        rdma=tuple(contract.RdmaInterface(f"mlx5_0-vf{k}", "mlx5_0") for k in vfs),
    )
    pod["metadata"]["annotations"][contract.ANNOTATION] = contract.sign(allocation, "k1", SIGNING["k1"])
    return pod


def test_a_pod_asking_only_rdma_interfaces_is_filtered_scored_and_bound_with_its_vfs() -> None:
    world, scheduler, jobs, core, feed, extender = setup(nic_node("nic"), node_json("bare", 2))
    pod = kube_pod("vfs", 0, annotations=rdma(1, "50Gbps"))
    world.put_pod(pod)
    feed.sync()
    _, result = extender.handle("filter", args(pod, ["nic", "bare"]))
    assert result["NodeNames"] == ["nic"]
    assert result["FailedNodes"] == {"bare": NO_FREE_VFS}
    _, scores = extender.handle("prioritize", args(pod, ["nic", "bare"]))
    # one node can take it: every passing node scores the same, so all score 0 and none is listed
    # (kube-scheduler counts a node left out as 0); "bare" is never scored above 0
    assert {s["Host"]: s["Score"] for s in scores} == {}
    bind = {"PodName": "vfs", "PodNamespace": "ns", "PodUID": "uid-vfs", "Node": "bare"}
    _, answer = extender.handle("bind", json.dumps(bind).encode())
    assert f"1 {NO_FREE_VFS}" in answer["Error"] and world.node_of("vfs") is None
    _, answer = extender.handle("bind", json.dumps({**bind, "Node": "nic"}).encode())
    assert answer == {"Error": ""}
    jobs.run_all()
    raw = world.find("ns", "vfs")["metadata"]["annotations"][contract.ANNOTATION]  # type: ignore[index]
    assert json.loads(raw)["version"] == contract.RDMA_VERSION
    granted = contract.verify(raw, KEYS)
    assert [(r.pf, r.min_mbps) for r in granted.rdma] == [("mlx5_0", 50_000)]
    # the VF and the bandwidth are booked: a second 60G interface no longer fits the 100G PF
    more = kube_pod("more", 0, annotations=rdma(1, "60Gbps"))
    world.put_pod(more)
    feed.sync()
    _, result = extender.handle("filter", args(more, ["nic"]))
    assert result["NodeNames"] == [] and result["FailedNodes"] == {"nic": NO_BANDWIDTH}


def test_gpus_with_rdma_bind_vfs_beside_them_and_impossible_or_malformed_asks_fail_every_node() -> None:
    world, scheduler, jobs, core, feed, extender = setup(nic_node("nic"), node_json("bare", 2))
    both = kube_pod("both", 1, annotations=rdma(2))
    many = kube_pod("many", 0, annotations=rdma(3))  # more interfaces than any node has
    typo = kube_pod("typo", 0, annotations=rdma(1, "25GB/s"))
    for pod in (both, many, typo):
        world.put_pod(pod)
    feed.sync()
    _, result = extender.handle("filter", args(both, ["bare", "nic"]))
    assert result["NodeNames"] == ["nic"] and result["FailedNodes"] == {"bare": NO_FREE_VFS}
    bind = {"PodName": "both", "PodNamespace": "ns", "PodUID": "uid-both", "Node": "nic"}
    assert extender.handle("bind", json.dumps(bind).encode())[1] == {"Error": ""}
    jobs.run_all()
    granted = contract.verify(world.find("ns", "both")["metadata"]["annotations"][contract.ANNOTATION], KEYS)  # type: ignore[index]
    assert sorted(r.device for r in granted.rdma) == ["mlx5_0-vf0", "mlx5_0-vf1"]
    _, result = extender.handle("filter", args(many, ["bare", "nic"]))
    assert result["NodeNames"] == [] and result["FailedNodes"] == {"bare": NO_FREE_VFS, "nic": NO_FREE_VFS}
    _, result = extender.handle("filter", args(typo, ["bare", "nic"]))
    why = result["FailedAndUnresolvableNodes"]["nic"]
    assert result["NodeNames"] == [] and why.startswith(
        "invalid kubegpu request: annotation kubegpu.io/rdma-bandwidth: '25GB/s' is not a bandwidth"
    )


def test_preempt_keeps_only_proposals_that_free_the_vfs_the_pod_needs() -> None:
    """nic's two GPUs and two VFs are held: g0 and g1 hold a GPU each, v both VFs. kube-scheduler,
    counting GPUs, proposes g0: that frees no VF, so the node is dropped. With v proposed too the
    node stays, and of {g1, g0, v} only the cheaper GPU holder and v are needed."""
    world, scheduler, jobs, core, feed, extender = setup(nic_node("nic"))
    world.put_pod(vf_holder("g0", "nic", [0], [], 100))
    world.put_pod(vf_holder("g1", "nic", [1], [], 200))
    world.put_pod(vf_holder("v", "nic", [], [0, 1], 150))
    pod = kube_pod("high", 1, priority=1000, annotations=rdma(1))
    world.put_pod(pod)
    feed.sync()
    assert preempt(extender, pod, {"nic": (["g0"], 0)}) == {}
    assert preempt(extender, pod, {"nic": (["g0", "v"], 0)}) == {"nic": (["g0", "v"], 0)}
    assert preempt(extender, pod, {"nic": (["g1", "g0", "v"], 0)}) == {"nic": (["v", "g0"], 0)}
    vfs_only = kube_pod("vfs-only", 0, priority=1000, annotations=rdma(2))
    world.put_pod(vfs_only)
    feed.sync()
    assert preempt(extender, vfs_only, {"nic": (["g0", "g1", "v"], 0)}) == {"nic": (["v"], 0)}


def test_the_extenders_tend_loop_is_not_woken_by_pod_events() -> None:
    """``kubegpu extender`` runs ``Scheduler.tend`` in its main thread (no scheduling loop). It
    waited on the scheduler's condition, notified at every pod event and Binding, so each pod woke
    it twice for nothing (a thread switch taking the GIL and the lock from the verbs). It now waits
    by the clock: pod events do not end its wait; stopping does."""
    import threading
    import time

    world, scheduler, jobs, core, feed, extender = setup(node_json("n1", 8))
    scheduler.leading.set()
    returns: list[bool] = []
    started = threading.Event()

    def loop() -> None:
        while not scheduler.stop_event.is_set():
            started.set()
            scheduler.tend(60.0)
            returns.append(scheduler.stop_event.is_set())

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    assert started.wait(10)
    for i in range(20):
        world.put_pod(kube_pod(f"p{i}", 1))
        feed.sync()  # an ADDED event each: a pending pod of this profile
    for _ in range(200):  # up to 2 s for the loop thread to get the GIL and return, if it was woken
        if returns:
            break
        time.sleep(0.01)
    assert scheduler.queue and returns == []
    scheduler.stop_event.set()
    thread.join(10)
    assert returns == [True]  # the one return: the stop


def test_the_startup_heap_is_frozen_out_of_full_collections() -> None:
    """``freeze_startup_heap`` (called once the first lists are in): the objects alive then are
    out of the cyclic collector's generations, so a full collection afterwards scans only newer
    ones; objects freed by reference counting still go. In a process of its own (it changes the
    interpreter's collector)."""
    import subprocess
    import sys

    script = (
        "import gc, weakref\n"
        "import scheduler.live.main as m\n"
        "class Held: pass\n"
        "held = [Held() for _ in range(1000)]\n"
        "probe = weakref.ref(held[0])\n"
        "before = len(gc.get_objects())\n"
        "m.freeze_startup_heap('t')\n"
        "assert gc.get_freeze_count() >= before * 0.9, (gc.get_freeze_count(), before)\n"
        "assert len(gc.get_objects()) < 1000, len(gc.get_objects())\n"
        "del held\n"
        "assert probe() is None  # frozen, yet freed with its last reference\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
