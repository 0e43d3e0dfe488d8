"""Version 2 of the allocation contract: the pod's RDMA interfaces, signed as the rest; what a node
that reads only version 1 does with it; and the shape rules of the new part."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kubegpu.allocation import (
    Allocation,
    AllocationError,
    ContainerAllocation,
    RdmaInterface,
    canonical_bytes,
    sign,
    verify,
)
from tests.fixtures.common import missing_component
from tests.fixtures.keys import SIGNING, public

KEYS = public()
ROOT = Path(__file__).resolve().parent.parent
# the last commit whose shim reads version 1 only (kubegpu/allocation.py before version 2)
VERSION_1_COMMIT = "4d9596d2011df52ae44af07d92b15397534f6123"


def with_vfs() -> Allocation:
    return Allocation(
        "n1",
        "uid-1",
        {"train": ContainerAllocation(("GPU-a",))},
        rdma=(
            RdmaInterface("mlx5_0-vf0", "mlx5_0", 100_000),
            RdmaInterface("mlx5_1-vf3", "mlx5_1", 25_000, 50_000),
        ),
    )


def test_a_pod_with_vfs_is_written_in_version_2_and_round_trips() -> None:
    value = sign(with_vfs(), "k1", SIGNING["k1"])
    doc = json.loads(value)
    assert doc["version"] == 2
    assert doc["rdma"] == [
        {"device": "mlx5_0-vf0", "pf": "mlx5_0", "minMbps": 100_000},
        {"device": "mlx5_1-vf3", "pf": "mlx5_1", "minMbps": 25_000, "maxMbps": 50_000},
    ]
    back = verify(value, KEYS)
    assert back == with_vfs()
    assert back.all_devices() == {"GPU-a", "mlx5_0-vf0", "mlx5_1-vf3"}


def test_a_pod_without_vfs_is_still_written_in_version_1() -> None:
    plain = Allocation("n1", "uid-1", {"train": ContainerAllocation(("GPU-a",))})
    assert json.loads(sign(plain, "k1", SIGNING["k1"]))["version"] == 1


def test_a_pod_with_only_vfs_needs_no_container_entry() -> None:
    only = Allocation("n1", "uid-1", {}, rdma=(RdmaInterface("mlx5_0-vf0", "mlx5_0"),))
    assert verify(sign(only, "k1", SIGNING["k1"]), KEYS) == only


def test_the_bandwidth_is_signed() -> None:
    doc = json.loads(sign(with_vfs(), "k1", SIGNING["k1"]))
    doc["rdma"][0]["minMbps"] = 1
    with pytest.raises(AllocationError, match="does not verify"):
        verify(json.dumps(doc), KEYS)


def resign(doc: dict) -> str:
    import base64

    doc = {k: v for k, v in doc.items() if k != "signature"}
    doc["keyId"] = "k1"
    doc["signature"] = base64.b64encode(SIGNING["k1"].sign(canonical_bytes(doc))).decode()
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"version": 1}, "allocation version 1 cannot carry rdma \\(version 2 can\\)"),
        ({"version": 3}, "unsupported allocation version 3 \\(this node reads versions 1, 2\\)"),
        ({"rdma": {}}, "rdma is not a list"),
        ({"rdma": ["mlx5_0-vf0"]}, "rdma\\[0\\] is not an object"),
        ({"rdma": [{"device": "../x", "pf": "p"}]}, "rdma\\[0\\]: invalid device id '../x'"),
        ({"rdma": [{"device": "v", "pf": ""}]}, "rdma\\[0\\]: invalid pf id ''"),
        ({"rdma": [{"device": "v", "pf": "p", "minMbps": -1}]}, "minMbps must be a whole number"),
        ({"rdma": [{"device": "v", "pf": "p", "minMbps": 1.5}]}, "minMbps must be a whole number"),
        ({"rdma": [{"device": "v", "pf": "p", "minMbps": True}]}, "minMbps must be a whole number"),
        ({"rdma": [{"device": "v", "pf": "p", "maxMbps": 10**9}]}, "maxMbps must be a whole number"),
        ({"rdma": [{"device": "v", "pf": "p", "minMbps": 2, "maxMbps": 1}]}, "minMbps 2 is above maxMbps 1"),
        ({"rdma": [{"device": "p", "pf": "p"}]}, "its own PF"),
        ({"rdma": [{"device": "v", "pf": "p"}, {"device": "v", "pf": "q"}]}, "lists a VF twice"),
        ({"rdma": [{"device": "GPU-a", "pf": "p"}]}, "RDMA VF GPU-a is also a container's device"),
        ({"rdma": [{"device": f"v{k}", "pf": "p"} for k in range(33)]}, "more than 32"),
        ({"rdma": [], "containers": {}}, "allocation has no containers"),
    ],
)
def test_shape_rules_of_the_rdma_part(patch: dict, message: str) -> None:
    doc = json.loads(sign(with_vfs(), "k1", SIGNING["k1"]))
    doc.update(patch)
    with pytest.raises(AllocationError, match=message):
        verify(resign(doc), KEYS)


def version_1_module(tmp_path: Path) -> ModuleType:
    """kubegpu/allocation.py as shipped before version 2, from the repository's history."""
    try:
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{VERSION_1_COMMIT}:kubegpu/allocation.py"],
            capture_output=True,
            check=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        missing_component(f"the version-1 shim's source from git history: {error}")
    path = tmp_path / "allocation_v1.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("allocation_v1", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["allocation_v1"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["allocation_v1"]
    assert module.VERSION == 1
    return module


def test_a_node_that_reads_only_version_1_refuses_version_2_by_name(tmp_path: Path) -> None:
    """A shim not yet upgraded verifies the signature, then refuses the version by name: the
    container is refused with that reason (crishim.rewrite turns it into INVALID_ARGUMENT), never
    started without its interfaces. A pod without VFs stays version 1, which it still accepts."""
    old = version_1_module(tmp_path)
    with pytest.raises(old.AllocationError, match="^unsupported allocation version '2'$"):
        old.verify(sign(with_vfs(), "k1", SIGNING["k1"]), KEYS)
    plain = Allocation("n1", "uid-1", {"train": ContainerAllocation(("GPU-a",))})
    assert old.verify(sign(plain, "k1", SIGNING["k1"]), KEYS).containers["train"].devices == ("GPU-a",)
