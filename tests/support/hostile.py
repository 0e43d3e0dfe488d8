"""What a broken or hostile node agent can write on its Node: inventory annotations, heartbeats and
allocatable counts, adversarial by design and at random (seeded, so a failure reproduces).

``adversarial(valid)`` lists named cases, one per class of bad input (docs/errors.md);
``random_inventory(valid, rng)`` mutates a valid inventory document at random places. Both start
from a valid document so that each case is wrong in one way and right in every other.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

FUTURE = "2999-01-01T00:00:00Z"


@dataclass(frozen=True)
class Case:
    """One write: the annotations to set (None deletes) and, optionally, allocatable counts."""

    name: str
    inventory: str | None
    heartbeat: str | None = None  # None: a fresh one
    allocatable: dict[str, str] = field(default_factory=dict)


def _doc(valid: str) -> dict[str, Any]:
    return json.loads(valid)


def _edit(valid: str, change: Any) -> str:
    doc = _doc(valid)
    change(doc)
    return json.dumps(doc)


def _gpu(doc: dict[str, Any]) -> dict[str, Any]:
    return next(d for d in doc["devices"] if d["kind"] == "gpu")


def adversarial(valid: str) -> Iterator[Case]:
    """Each class of bad input once (``valid`` is a good inventory annotation with >= 2 GPUs)."""
    doc = _doc(valid)
    gpus = [d["id"] for d in doc["devices"] if d["kind"] == "gpu"]
    a, b = gpus[0], gpus[1]

    def setter(path: str, value: Any) -> Any:
        def change(d: dict[str, Any]) -> None:
            _gpu(d)[path] = value

        return change

    # not an inventory at all
    for name, text in [
        ("empty", ""),
        ("not-json", "{"),
        ("json-null", "null"),
        ("json-list", "[]"),
        ("json-string", '"inventory"'),
        ("json-number", "1e999"),
        ("nan-literal", '{"version": 1, "devices": NaN}'),
        ("deep-nesting", "[" * 20000 + "]" * 20000),
        ("huge-integer", '{"version": 1, "devices": [], "x": ' + "9" * 5000 + "}"),
        ("not-utf8-escape", '{"version": 1, "devices": [{"id": "\\udc80", "kind": "gpu", "index": 0}]}'),
        ("binary", "\x00\x01\x02\x7f"),
    ]:
        yield Case(name, text)
    yield Case("missing", None)
    yield Case("version-0", _edit(valid, lambda d: d.update(version=0)))
    yield Case("version-string", _edit(valid, lambda d: d.update(version="1")))
    yield Case("version-missing", _edit(valid, lambda d: d.pop("version")))
    yield Case("devices-object", _edit(valid, lambda d: d.update(devices={"a": 1})))
    yield Case("device-string", _edit(valid, lambda d: d["devices"].append("gpu")))
    yield Case("device-no-id", _edit(valid, lambda d: _gpu(d).pop("id")))
    yield Case("device-empty-id", _edit(valid, setter("id", "")))
    yield Case("device-control-id", _edit(valid, setter("id", "GPU-\n\x1b[31m")))
    yield Case("device-long-id", _edit(valid, setter("id", "G" * 50_000)))
    yield Case("device-id-list", _edit(valid, setter("id", [a])))
    yield Case("kind-unknown", _edit(valid, setter("kind", "tpu")))
    yield Case("kind-list", _edit(valid, setter("kind", ["gpu"])))
    yield Case("index-negative", _edit(valid, setter("index", -1)))
    yield Case("index-huge", _edit(valid, setter("index", 10**18)))
    yield Case("index-float", _edit(valid, setter("index", 1.5)))
    yield Case("index-bool", _edit(valid, setter("index", True)))
    yield Case("index-string", _edit(valid, setter("index", "0")))
    yield Case("memory-negative", _edit(valid, setter("memoryMiB", -16384)))
    yield Case("memory-absurd", _edit(valid, setter("memoryMiB", 10**30)))
    yield Case("memory-string", _edit(valid, setter("memoryMiB", "16Gi")))
    yield Case("numa-negative", _edit(valid, setter("numa", -7)))
    yield Case("healthy-string", _edit(valid, setter("healthy", "false")))
    yield Case("model-object", _edit(valid, setter("model", {"name": "H100"})))
    yield Case("attributes-list", _edit(valid, setter("attributes", ["sharing", "mps"])))
    yield Case("attributes-many", _edit(valid, setter("attributes", {f"k{i}": "v" for i in range(500)})))
    yield Case("duplicate-id", _edit(valid, lambda d: d["devices"].append(dict(_gpu(d)))))
    yield Case("duplicate-index", _edit(valid, lambda d: d["devices"].append({**_gpu(d), "id": "GPU-twin"})))
    many = [
        {"id": f"GPU-{i:05d}", "kind": "gpu", "index": i, "model": "X", "memoryMiB": 1} for i in range(600)
    ]
    yield Case("too-many-devices", _edit(valid, lambda d: d.update(devices=many, topology={})))
    yield Case("topology-list", _edit(valid, lambda d: d.update(topology=[])))
    yield Case("nvlink-not-list", _edit(valid, lambda d: d["topology"].update(nvlink={"a": 1})))
    yield Case(
        "nvlink-unknown-device", _edit(valid, lambda d: d["topology"].update(nvlink=[[a, "GPU-ghost", 2]]))
    )
    yield Case("nvlink-self", _edit(valid, lambda d: d["topology"].update(nvlink=[[a, a, 2]])))
    yield Case("nvlink-negative", _edit(valid, lambda d: d["topology"].update(nvlink=[[a, b, -4]])))
    yield Case("nvlink-absurd", _edit(valid, lambda d: d["topology"].update(nvlink=[[a, b, 10**12]])))
    yield Case("nvlink-twice", _edit(valid, lambda d: d["topology"].update(nvlink=[[a, b, 1], [b, a, 4]])))
    yield Case("nvlink-short", _edit(valid, lambda d: d["topology"].update(nvlink=[[a, b]])))
    yield Case("nvlink-unhashable", _edit(valid, lambda d: d["topology"].update(nvlink=[[[a], {}, 1]])))
    matrix = [[0] * 3 for _ in range(3)]
    yield Case("nvlink-matrix", _edit(valid, lambda d: d["topology"].update(nvlink=matrix)))
    yield Case("pcie-unknown-relation", _edit(valid, lambda d: d["topology"].update(pcie=[[a, b, "FAST"]])))
    yield Case(
        "pcie-unknown-device", _edit(valid, lambda d: d["topology"].update(pcie=[[a, "ghost", "PIX"]]))
    )
    yield Case("pcie-relation-list", _edit(valid, lambda d: d["topology"].update(pcie=[[a, b, ["PIX"]]])))
    yield Case("nic-gpus-unknown", _edit(valid, lambda d: d["topology"].update(nicGpus={"mlx5_9": [a]})))
    yield Case("nic-gpus-not-list", _edit(valid, lambda d: d["topology"].update(nicGpus={"mlx5_0": a})))
    # the annotation is fine; something else the node writes is not
    yield Case("heartbeat-future", valid, heartbeat=FUTURE)
    yield Case("allocatable-cpu", valid, allocatable={"cpu": "1e15"})
    yield Case("allocatable-memory", valid, allocatable={"memory": "1e30"})
    yield Case("allocatable-pods", valid, allocatable={"pods": "1e9"})
    yield Case("allocatable-gpus", valid, allocatable={"nvidia.com/gpu": "1e12"})
    # figures that are no quantity at all, or beyond int64 milli-units (never a zero or no limit)
    yield Case("allocatable-cpu-infinite", valid, allocatable={"cpu": "Infinity"})
    yield Case("allocatable-memory-nan", valid, allocatable={"memory": "NaN"})
    yield Case("allocatable-memory-beyond-int64", valid, allocatable={"memory": "1e40"})
    yield Case("allocatable-pods-unreadable", valid, allocatable={"pods": "lots"})
    yield Case("allocatable-gpus-infinite", valid, allocatable={"nvidia.com/gpu": "Infinity"})


_JUNK: list[Any] = [
    None,
    True,
    False,
    -1,
    0,
    2**63,
    -(2**63) - 1,
    1.5,
    1e308,
    "",
    "x" * 300,
    "\x00",
    [],
    {},
    [[]],
]


def _mutate(node: Any, rng: random.Random) -> Any:
    """``node`` with one value somewhere inside replaced, removed or duplicated."""
    if isinstance(node, dict) and node and rng.random() < 0.8:
        key = rng.choice(sorted(node))
        roll = rng.random()
        if roll < 0.15:
            node.pop(key)
        elif roll < 0.6:
            node[key] = _mutate(node[key], rng)
        else:
            node[key] = copy.deepcopy(rng.choice(_JUNK))
        return node
    if isinstance(node, list) and node and rng.random() < 0.8:
        k = rng.randrange(len(node))
        roll = rng.random()
        if roll < 0.15:
            node.pop(k)
        elif roll < 0.3:
            node.append(copy.deepcopy(node[k]))
        elif roll < 0.7:
            node[k] = _mutate(node[k], rng)
        else:
            node[k] = copy.deepcopy(rng.choice(_JUNK))
        return node
    return copy.deepcopy(rng.choice(_JUNK))


def random_inventory(valid: str, rng: random.Random) -> str:
    """A valid inventory mutated at one to three random places (sometimes text-level damage)."""
    if rng.random() < 0.1:
        cut = rng.randrange(len(valid))
        return valid[:cut] + rng.choice(["", "}", "]", ",", '"', "\\"]) + valid[cut + 1 :]
    doc = _doc(valid)
    for _ in range(rng.randint(1, 3)):
        doc = _mutate(doc, rng)
    return json.dumps(doc)
