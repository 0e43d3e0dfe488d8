"""Fuzz the CreateContainer rewrite with random and hostile allocation annotations.

Thousands of annotations (bad JSON, wrong types, huge values, path traversal, ids of other
nodes, deep nesting, unicode), about half of them validly signed so they get past the signature
gate. The expected outcome of each is computed by this file's own reading of docs/allocation.md
(``expected_outcome``), never by the project's ``verify``: the rewriter must refuse exactly the
annotations the rules refuse, with the code the docs name, and grant exactly the devices a valid
one grants. The scrub has its own fuzz (tests/test_crishim_scrub_fuzz.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import string
from pathlib import Path
from typing import Any

import grpc

from crishim.cri import api_pb2
from crishim.intercept import Rejected
from crishim.rewrite import AllocationRewriter, NodeDevices
from devices.registry import load_plugins
from devices.sim import sim_gpu_id
from kubegpu.allocation import ANNOTATION, KeyRing
from tests.fixtures.keys import OTHER_KEY, SIGNING

NODE, UID, CONTAINER = "fuzz-node", "9d7c2a10-0000-4000-8000-000000000001", "app"
CASES = 3000
FORGED = "/dev/kubegpu-sim-forged"
GPUS = [sim_gpu_id(NODE, i) for i in range(8)]  # dgx1-v100: eight GPUs, index i is gpu<i>


# --- the oracle: docs/allocation.md, read independently ------------------------------------------


def _canonical(document: dict[str, Any]) -> bytes:
    rest = {k: v for k, v in document.items() if k != "signature"}
    return json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _is_int(value: Any) -> bool:
    return type(value) is int


def _shape_ok(doc: dict[str, Any]) -> bool:
    """The schema table of docs/allocation.md, rule by rule (version 2 is version 1's rules plus
    ``rdma``, which these documents never carry: without it, ``containers`` may not be empty)."""
    if not _is_int(doc.get("version")) or doc["version"] not in (1, 2) or "rdma" in doc:
        return False
    if not isinstance(doc.get("node"), str) or not doc["node"]:
        return False
    if not isinstance(doc.get("podUID"), str) or not doc["podUID"]:
        return False
    containers = doc.get("containers")
    if not isinstance(containers, dict) or not 1 <= len(containers) <= 64:
        return False
    users: dict[str, list[tuple[str, int | None]]] = {}
    for name, entry in containers.items():
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name) or not isinstance(entry, dict):
            return False
        devices = entry.get("devices")
        if not isinstance(devices, list) or not 1 <= len(devices) <= 64:
            return False
        device_id = re.compile(r"[A-Za-z0-9][A-Za-z0-9_:-]{0,127}")
        if any(not isinstance(d, str) or not device_id.fullmatch(d) for d in devices):
            return False
        if len(set(devices)) != len(devices):
            return False
        shares = entry.get("shares", {})
        if not isinstance(shares, dict):
            return False
        for device, share in shares.items():
            if device not in devices or not isinstance(share, dict):
                return False
            milli, memory = share.get("milli"), share.get("memoryMiB", 0)
            if not _is_int(milli) or not 1 <= milli <= 1000:
                return False
            if not _is_int(memory) or not 0 <= memory <= 1 << 30:
                return False
        for device in devices:
            share = shares.get(device)
            users.setdefault(device, []).append((name, share["milli"] if share else None))
    for holders in users.values():
        if len(holders) > 1 and (any(m is None for _, m in holders) or sum(m for _, m in holders) > 1000):
            return False
    return True


def expected_outcome(annotation: str) -> tuple[str, list[str]]:
    """("invalid" | "precondition" | "granted", devices granted to CONTAINER)."""
    if len(annotation.encode("utf-8", "surrogatepass")) > 64 * 1024:
        return "invalid", []
    try:
        doc = json.loads(annotation)
    except (ValueError, RecursionError):
        return "invalid", []
    if not isinstance(doc, dict) or not isinstance(doc.get("signature"), str) or not doc["signature"]:
        return "invalid", []
    if doc.get("keyId") != "k1":
        return "invalid", []
    try:
        SIGNING["k1"].public_key().verify(base64.b64decode(doc["signature"], validate=True), _canonical(doc))
    except Exception:  # noqa: BLE001 - any failure to verify is a refusal
        return "invalid", []
    if not _shape_ok(doc):
        return "invalid", []
    if doc["node"] != NODE or doc["podUID"] != UID:
        return "precondition", []
    entry = doc["containers"].get(CONTAINER)
    if entry is None:
        return "granted", []
    if any(d not in GPUS for d in entry["devices"]):
        return "precondition", []
    return "granted", list(entry["devices"])


# --- the generator ------------------------------------------------------------------------------


def sign_any(document: dict[str, Any], key: Any = None) -> str:
    document = dict(document, keyId="k1")
    document["signature"] = base64.b64encode((key or SIGNING["k1"]).sign(_canonical(document))).decode()
    return json.dumps(document, ensure_ascii=False)


HOSTILE_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    10**30,
    1.5,
    1.0,
    "",
    "x" * 5000,
    "../../../etc/shadow",
    "/dev/sda",
    "GPU-0/../../x",
    "\x00",
    "ü",
    "GPU-1\n",
    "app\n",
    "Ａpp",
    [],
    {},
    [[[[[]]]]],
    {"a": {"b": {}}},
    "GPU-" + "f" * 200,
    "rdma0;rm -rf /",
    " GPU-1",
]


def random_document(rng: random.Random) -> dict[str, Any]:
    def device() -> Any:
        roll = rng.random()
        if roll < 0.5:
            return rng.choice(GPUS)
        if roll < 0.6:
            return sim_gpu_id("other-node", rng.randrange(8))
        if roll < 0.65:
            return rng.choice(GPUS) + rng.choice(["\n", " ", "\u00a0", "/.."])
        if roll < 0.8:
            return rng.choice(HOSTILE_VALUES)
        return "".join(rng.choice(string.printable) for _ in range(rng.randrange(1, 40)))

    containers: dict[Any, Any] = {}
    for _ in range(rng.randrange(0, 4)):
        odd_names = [CONTAINER, "other", "", "A_B", "../x", 7, "app\n"]
        name = CONTAINER if rng.random() < 0.6 else rng.choice(odd_names)
        entry: dict[str, Any] = {"devices": [device() for _ in range(rng.randrange(0, 5))]}
        if rng.random() < 0.3 and entry["devices"]:
            entry["shares"] = {
                str(entry["devices"][0]): {
                    "milli": rng.choice([1, 500, 1000, 0, 2000, "5", None, True, 1.0]),
                    "memoryMiB": rng.choice([0, 4096, -1, 10**12, 1 << 30, True]),
                }
            }
        if rng.random() < 0.1:
            entry = rng.choice(HOSTILE_VALUES)
        containers[name if isinstance(name, str) else str(name)] = entry
    document: dict[str, Any] = {
        "version": rng.choice([1, 1, 1, 2, "1", None, True, 1.0]),
        "node": rng.choice([NODE, NODE, NODE, "other", "", None, 5]),
        "podUID": rng.choice([UID, UID, UID, "other-uid", "", ["x"]]),
        "containers": containers if rng.random() < 0.95 else rng.choice(HOSTILE_VALUES),
    }
    if rng.random() < 0.1:
        del document[rng.choice(list(document))]
    return document


def random_annotation(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.08:
        return "".join(rng.choice(string.printable) for _ in range(rng.randrange(0, 200)))
    if roll < 0.1:
        return "[" * rng.randrange(1, 50000)
    if roll < 0.12:
        return json.dumps({"pad": "é" * rng.choice([20000, 40000])}, ensure_ascii=False)
    if roll < 0.2:  # valid, and decided by the node: another node or pod, unknown devices, nothing here
        containers = {rng.choice([CONTAINER, "other"]): {"devices": rng.sample(GPUS, rng.randrange(1, 3))}}
        if rng.random() < 0.3:
            containers[CONTAINER] = {"devices": [sim_gpu_id("other-node", 0)]}
        return sign_any(
            {
                "version": 1,
                "node": rng.choice([NODE, NODE, "node-b"]),
                "podUID": rng.choice([UID, UID, "another-pod"]),
                "containers": containers,
            }
        )
    if roll < 0.45:  # valid but for one random perturbation, signed: exercises the rules past the gate
        document: dict[str, Any] = {
            "version": 1,
            "node": NODE,
            "podUID": UID,
            "containers": {CONTAINER: {"devices": rng.sample(GPUS, rng.randrange(1, 4))}},
        }
        if rng.random() < 0.5:
            perturbed = random_document(rng)
            key = rng.choice(list(perturbed))
            document[key] = perturbed[key]
        return sign_any(document)
    document = random_document(rng)
    if roll < 0.65:
        return sign_any(document)
    if roll < 0.7:
        return sign_any(document, OTHER_KEY)  # a key the node does not know under this id
    if roll < 0.75:  # a valid signature, then the document changed or the signature mangled
        signed = json.loads(sign_any(document))
        if rng.random() < 0.5:
            signed["node"] = "tampered"
        else:
            signed["signature"] = rng.choice(["é", "AAAA", signed["signature"][:-4], "☃" * 88])
        return json.dumps(signed, ensure_ascii=False)
    return json.dumps(dict(document, keyId=rng.choice(["k1", "k9", None]), signature="AAAA"), default=str)


def make_request(annotation: str) -> api_pb2.CreateContainerRequest:
    request = api_pb2.CreateContainerRequest(pod_sandbox_id="sb")
    request.sandbox_config.metadata.name, request.sandbox_config.metadata.namespace = "fuzz", "default"
    request.sandbox_config.metadata.uid = UID
    request.sandbox_config.annotations[ANNOTATION] = annotation
    request.config.metadata.name = CONTAINER
    request.config.envs.add(key="NVIDIA_VISIBLE_DEVICES", value=b"all")
    request.config.devices.add(host_path=FORGED, container_path="/dev/forged")
    return request


def test_hostile_annotations(tmp_path: Path) -> None:
    plugins = load_plugins(["sim"], {"node_name": NODE, "topology": "dgx1-v100", "state_dir": str(tmp_path)})
    node_devices = NodeDevices(plugins, sysfs_root=None)
    node_devices.discover()
    assert sorted(node_devices.devices) == sorted(GPUS)
    dev_dir = tmp_path / "dev" / "kubegpu-sim"
    rewriter = AllocationRewriter(NODE, node_devices, KeyRing(None, {"k1": SIGNING["k1"].public_key()}))
    rewriter.rebuilt.set()
    rng = random.Random(20261126)
    outcomes = {"invalid": 0, "precondition": 0, "granted": 0, "nothing": 0}

    async def run() -> None:
        for case in range(CASES):
            annotation = random_annotation(rng)
            want, granted = expected_outcome(annotation)
            request = make_request(annotation)
            try:
                rewritten, completion = await rewriter.create_container(request)
            except Rejected as rejected:
                code = {
                    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
                    "precondition": grpc.StatusCode.FAILED_PRECONDITION,
                }.get(want)
                assert rejected.code is code, (case, annotation[:300], rejected.message)
                assert "pod default/fuzz" in rejected.message
                outcomes[want] += 1
                continue
            assert want == "granted", (case, annotation[:300])
            paths = sorted(d.host_path for d in rewritten.config.devices)
            assert FORGED in paths  # not a managed device node (it does not even exist): untouched
            paths.remove(FORGED)
            env = {kv.key: kv.value.decode() for kv in rewritten.config.envs}
            if granted:
                indices = sorted(GPUS.index(g) for g in granted)
                assert paths == sorted(str(dev_dir / f"gpu{i}") for i in indices), (case, paths)
                assert env["NVIDIA_VISIBLE_DEVICES"].split(",") == granted
                assert completion is not None
                completion(None, False)  # release, so the next case starts from an empty ledger
                outcomes["granted"] += 1
            else:
                assert paths == [] and env["NVIDIA_VISIBLE_DEVICES"] == "void", (case, paths, env)
                assert completion is None
                outcomes["nothing"] += 1
            assert not rewriter.ledger.holdings()

    asyncio.run(run())
    assert sum(outcomes.values()) == CASES
    # The generator must exercise every outcome, or this test proves little.
    assert outcomes["invalid"] > CASES // 4 and outcomes["granted"] > CASES // 10, outcomes
    assert outcomes["precondition"] > CASES // 50 and outcomes["nothing"] > CASES // 100, outcomes
