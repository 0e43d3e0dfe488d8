"""The signed allocation annotation: round trip, tampering, keys, and the shape rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubegpu.allocation import (
    Allocation,
    AllocationError,
    ContainerAllocation,
    Share,
    canonical_bytes,
    load_keys,
    sign,
    verify,
)

KEYS = {"k1": b"0123456789abcdef0123456789abcdef", "k2": b"fedcba9876543210fedcba9876543210"}


def example() -> Allocation:
    return Allocation(
        node="gpu-node-1",
        pod_uid="11111111-2222-3333-4444-555555555555",
        containers={
            "train": ContainerAllocation(devices=("GPU-a", "GPU-b")),
            "infer": ContainerAllocation(devices=("GPU-c",), shares={"GPU-c": Share(250, 4096)}),
        },
    )


def resign(document: dict, key: bytes = KEYS["k1"]) -> str:
    """Re-sign a modified document correctly, to test shape rules past the signature check."""
    import base64
    import hashlib
    import hmac

    document = dict(document)
    document["signature"] = base64.b64encode(
        hmac.new(key, canonical_bytes(document), hashlib.sha256).digest()
    ).decode()
    return json.dumps(document)


def test_round_trip() -> None:
    value = sign(example(), "k1", KEYS["k1"])
    assert verify(value, KEYS) == example()
    assert "/" not in json.dumps(json.loads(value)["containers"])  # no host paths


def test_key_rotation_accepts_any_known_key() -> None:
    assert verify(sign(example(), "k2", KEYS["k2"]), KEYS) == example()
    with pytest.raises(AllocationError, match="unknown key id 'k2'"):
        verify(sign(example(), "k2", KEYS["k2"]), {"k1": KEYS["k1"]})


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.__setitem__("node", "other-node"),
        lambda d: d.__setitem__("podUID", "x"),
        lambda d: d["containers"]["train"]["devices"].append("GPU-z"),
        lambda d: d["containers"]["infer"]["shares"]["GPU-c"].__setitem__("milli", 1000),
        lambda d: d.__setitem__("keyId", "k2"),
    ],
)
def test_any_change_breaks_the_signature(mutate) -> None:  # type: ignore[no-untyped-def]
    document = json.loads(sign(example(), "k1", KEYS["k1"]))
    mutate(document)
    with pytest.raises(AllocationError, match="does not verify"):
        verify(json.dumps(document), KEYS)


def test_unsigned_and_garbage() -> None:
    document = example().to_document()
    with pytest.raises(AllocationError, match="unsigned"):
        verify(json.dumps(document), KEYS)
    for garbage in ("", "{", "[]", "null", '"x"', "1e999999", "[" * 100000):
        with pytest.raises(AllocationError):
            verify(garbage, KEYS)
    with pytest.raises(AllocationError, match="more than"):
        verify("x" * 70000, KEYS)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"version": 2}, "unsupported allocation version"),
        ({"node": ""}, "no node name"),
        ({"containers": {}}, "no containers"),
        ({"containers": {"Bad_Name": {"devices": ["GPU-a"]}}}, "invalid container name"),
        ({"containers": {"c": {"devices": ["../../etc/passwd"]}}}, "invalid device id"),
        ({"containers": {"c": {"devices": ["/dev/nvidia0"]}}}, "invalid device id"),
        ({"containers": {"c": {"devices": ["GPU-a", "GPU-a"]}}}, "listed twice"),
        ({"containers": {"c": {"devices": [1]}}}, "invalid device id"),
        ({"containers": {"c": {"devices": ["GPU-a"], "shares": {"GPU-b": {"milli": 5}}}}}, "unlisted"),
        ({"containers": {"c": {"devices": ["GPU-a"], "shares": {"GPU-a": {"milli": 0}}}}}, "milli"),
        ({"containers": {"c": {"devices": ["GPU-a"], "shares": {"GPU-a": {"milli": True}}}}}, "milli"),
        ({"containers": {"a": {"devices": ["GPU-a"]}, "b": {"devices": ["GPU-a"]}}}, "given whole"),
        (
            {"containers": {
                "a": {"devices": ["GPU-a"], "shares": {"GPU-a": {"milli": 600}}},
                "b": {"devices": ["GPU-a"], "shares": {"GPU-a": {"milli": 600}}},
            }},
            "add up",
        ),
    ],
)
def test_shape_rules(patch: dict, message: str) -> None:
    document = json.loads(sign(example(), "k1", KEYS["k1"]))
    document.update(patch)
    with pytest.raises(AllocationError, match=message):
        verify(resign(document), KEYS)


def test_shares_within_one_gpu_are_fine() -> None:
    allocation = Allocation("n", "u", {
        "a": ContainerAllocation(("GPU-a",), {"GPU-a": Share(500)}),
        "b": ContainerAllocation(("GPU-a",), {"GPU-a": Share(500)}),
    })
    assert verify(sign(allocation, "k1", KEYS["k1"]), KEYS) == allocation


def test_load_keys_from_a_secret_volume(tmp_path: Path) -> None:
    (tmp_path / "..2026_11_26").mkdir()
    (tmp_path / "..data").symlink_to(tmp_path / "..2026_11_26")
    (tmp_path / "k1").write_bytes(KEYS["k1"] + b"\n")
    (tmp_path / "short").write_bytes(b"tooshort")
    assert load_keys(tmp_path) == {"k1": KEYS["k1"]}
    assert load_keys(tmp_path / "missing") == {}
