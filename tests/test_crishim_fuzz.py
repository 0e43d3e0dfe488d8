"""Fuzz the CreateContainer rewrite with random and hostile allocation annotations.

Thousands of annotations (bad JSON, wrong types, huge values, path traversal, ids of other
nodes, deep nesting), half of them validly signed so they get past the signature gate. For each:
the rewriter either refuses with INVALID_ARGUMENT/FAILED_PRECONDITION, or the container gets
only device nodes and visibility of devices its (valid) allocation grants. Nothing else.
"""

from __future__ import annotations

import asyncio
import json
import random
import string
from pathlib import Path
from typing import Any

import grpc

from crishim.cri import api_pb2
from crishim.intercept import Rejected
from crishim.rewrite import AllocationRewriter, KeyRing, NodeDevices
from devices.plugin import edits_for, load_plugins
from devices.sim import sim_gpu_id
from kubegpu.allocation import ANNOTATION, AllocationError, canonical_bytes, verify

NODE, UID, CONTAINER = "fuzz-node", "9d7c2a10-0000-4000-8000-000000000001", "app"
KEYS = {"k1": b"fuzz-signing-key-0123456789abcdef"}
CASES = 3000


def sign_any(document: dict[str, Any]) -> str:
    import base64
    import hashlib
    import hmac

    document = dict(document, keyId="k1")
    document["signature"] = base64.b64encode(
        hmac.new(KEYS["k1"], canonical_bytes(document), hashlib.sha256).digest()
    ).decode()
    return json.dumps(document)


HOSTILE_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    10**30,
    1.5,
    "",
    "x" * 5000,
    "../../../etc/shadow",
    "/dev/sda",
    "GPU-0/../../x",
    "\x00",
    "ü",
    [],
    {},
    [[[[[]]]]],
    {"a": {"b": {}}},
    "GPU-" + "f" * 200,
    "rdma0;rm -rf /",
    " GPU-1",
]


def random_document(rng: random.Random, gpus: list[str]) -> dict[str, Any]:
    def device() -> Any:
        roll = rng.random()
        if roll < 0.5:
            return rng.choice(gpus)
        if roll < 0.6:
            return sim_gpu_id("other-node", rng.randrange(8))
        if roll < 0.8:
            return rng.choice(HOSTILE_VALUES)
        return "".join(rng.choice(string.printable) for _ in range(rng.randrange(1, 40)))

    containers: dict[Any, Any] = {}
    for _ in range(rng.randrange(0, 4)):
        name = CONTAINER if rng.random() < 0.6 else rng.choice([CONTAINER, "other", "", "A_B", "../x", 7])
        entry: dict[str, Any] = {"devices": [device() for _ in range(rng.randrange(0, 5))]}
        if rng.random() < 0.3 and entry["devices"]:
            entry["shares"] = {
                str(entry["devices"][0]): {
                    "milli": rng.choice([1, 500, 1000, 0, 2000, "5", None]),
                    "memoryMiB": rng.choice([0, 4096, -1, 10**12]),
                }
            }
        if rng.random() < 0.1:
            entry = rng.choice(HOSTILE_VALUES)
        containers[name if isinstance(name, str) else str(name)] = entry
    document: dict[str, Any] = {
        "version": rng.choice([1, 1, 1, 2, "1", None]),
        "node": rng.choice([NODE, NODE, NODE, "other", "", None, 5]),
        "podUID": rng.choice([UID, UID, UID, "other-uid", "", ["x"]]),
        "containers": containers if rng.random() < 0.95 else rng.choice(HOSTILE_VALUES),
    }
    if rng.random() < 0.1:
        del document[rng.choice(list(document))]
    return document


def random_annotation(rng: random.Random, gpus: list[str]) -> str:
    roll = rng.random()
    if roll < 0.1:
        return "".join(rng.choice(string.printable) for _ in range(rng.randrange(0, 200)))
    if roll < 0.15:
        return "[" * rng.randrange(1, 50000)
    if roll < 0.45:  # valid but for one random perturbation, signed: exercises the rules past the gate
        document = {
            "version": 1,
            "node": NODE,
            "podUID": UID,
            "containers": {CONTAINER: {"devices": rng.sample(gpus, rng.randrange(1, 4))}},
        }
        if rng.random() < 0.5:
            perturbed = random_document(rng, gpus)
            key = rng.choice(list(perturbed))
            document[key] = perturbed[key]
        return sign_any(document)
    document = random_document(rng, gpus)
    if roll < 0.7:
        return sign_any(document)
    return json.dumps(dict(document, keyId=rng.choice(["k1", "k9", None]), signature="AAAA"), default=str)


def make_request(annotation: str) -> api_pb2.CreateContainerRequest:
    request = api_pb2.CreateContainerRequest(pod_sandbox_id="sb")
    request.sandbox_config.metadata.name, request.sandbox_config.metadata.namespace = "fuzz", "default"
    request.sandbox_config.metadata.uid = UID
    request.sandbox_config.annotations[ANNOTATION] = annotation
    request.config.metadata.name = CONTAINER
    request.config.envs.add(key="NVIDIA_VISIBLE_DEVICES", value=b"all")
    request.config.devices.add(host_path="/dev/kubegpu-sim-forged", container_path="/dev/forged")
    return request


def test_hostile_annotations(tmp_path: Path) -> None:
    plugins = load_plugins(["sim"], {"node_name": NODE, "topology": "dgx1-v100", "state_dir": str(tmp_path)})
    node_devices = NodeDevices(plugins, sysfs_root=None)
    node_devices.discover()
    gpus = sorted(node_devices.devices)
    rewriter = AllocationRewriter(NODE, node_devices, KeyRing(None, KEYS))
    rewriter.rebuilt.set()
    rng = random.Random(20261126)
    outcomes = {"accepted": 0, "rejected": 0, "granted": 0}

    async def run() -> None:
        for _ in range(CASES):
            annotation = random_annotation(rng, gpus)
            request = make_request(annotation)
            try:
                rewritten, completion = await rewriter.create_container(request)
            except Rejected as rejected:
                assert rejected.code in (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    grpc.StatusCode.FAILED_PRECONDITION,
                )
                assert "pod default/fuzz" in rejected.message
                outcomes["rejected"] += 1
                continue
            outcomes["accepted"] += 1
            try:
                granted = list(verify(annotation, KEYS).containers[CONTAINER].devices)
            except (AllocationError, KeyError):
                granted = []
            allowed = edits_for(plugins, [node_devices.devices[g] for g in granted]) if granted else None
            allowed_paths = {n.host_path for n in allowed.device_nodes} if allowed else set()
            got_paths = {d.host_path for d in rewritten.config.devices}
            assert got_paths <= allowed_paths | {"/dev/kubegpu-sim-forged"} - node_devices.managed_host_paths
            env = {kv.key: kv.value.decode() for kv in rewritten.config.envs}
            visible = env["NVIDIA_VISIBLE_DEVICES"]
            assert visible == "void" or set(visible.split(",")) <= set(granted)
            if granted:
                outcomes["granted"] += 1
                assert completion is not None
                completion(None)  # release, so the next case starts from an empty ledger

    asyncio.run(run())
    assert sum(outcomes.values()) >= CASES
    # The generator must exercise both sides of the gate, or this test proves little.
    assert outcomes["rejected"] > CASES // 3 and outcomes["granted"] > CASES // 10, outcomes
