"""The simulator's machine shapes: GPU model -> links of a shipped machine, and the link-quality report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.core import PodRequest
from scheduler.sim import cli
from scheduler.sim.machines import DEFAULT_SHAPES, MachineError, load_shape, parse_mapping, resolve
from scheduler.sim.protocol import run_once
from scheduler.sim.trace import NodeSpec, with_shapes

SHIPPED = Path(__file__).resolve().parent.parent / "devices" / "topologies"


def test_every_default_shape_is_shipped() -> None:
    for model, name in DEFAULT_SHAPES.items():
        shape = load_shape(name)
        assert shape is not None and shape.name == name, model
        assert (SHIPPED / f"{name}.json").is_file()


def test_nodes_get_the_first_gpus_of_their_shape() -> None:
    shapes = resolve(parse_mapping([]))
    nodes = with_shapes(
        [
            NodeSpec("v8", 96_000, 1, 8, "V100M32"),
            NodeSpec("v4", 32_000, 1, 4, "V100M16"),
            NodeSpec("t2", 104_000, 1, 2, "T4"),
            NodeSpec("one", 8000, 1, 1, "V100M16"),
            NodeSpec("other", 8000, 1, 2, "X9"),
        ],
        shapes,
    )
    v8, v4, t2, one, other = (n.state() for n in nodes)
    assert v8.topology.nvlink_count("v8-gpu0", "v8-gpu3") == 2  # DGX-1 cube mesh
    assert [g.numa for g in v8.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert v8.links().cross[0][4] and not v8.links().cross[0][3]
    assert v4.links().n == 4 and all(v4.links().nvlink[0][j] for j in (1, 2, 3))  # one socket's quad
    assert not t2.links().flat and not t2.links().nvlink[0][1]  # PCIe only, one switch
    assert one.links().flat and other.links().flat  # one GPU; a model without a shape


def test_machine_option_overrides_and_rejects() -> None:
    mapping = parse_mapping(["T4=dgx-a100", "G2=none"])
    assert mapping["T4"] == "dgx-a100" and mapping["G2"] == "none"
    assert resolve(mapping)["G2"] is None
    with pytest.raises(MachineError, match="MODEL=SHAPE"):
        parse_mapping(["T4"])
    with pytest.raises(MachineError, match="no machine shape 'nope'"):
        load_shape("nope")
    small = resolve({"V100M16": "pcie-4gpu"})
    with pytest.raises(MachineError, match="node big: 8 V100M16 GPUs, but machine shape pcie-4gpu has 4"):
        with_shapes([NodeSpec("big", 1, 1, 8, "V100M16")], small)


def test_machine_file_of_ones_own(tmp_path: Path) -> None:
    doc = json.loads((SHIPPED / "rtx8000-4gpu.json").read_text())
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(doc))
    shape = load_shape(str(path))
    assert shape is not None and shape.name == "mine" and shape.gpus == 4
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"gpus": [{"index": 0}, {"index": 1}], "nvlink": [[0]]}))
    with pytest.raises(MachineError, match="nvlink must be a 2x2 matrix"):
        load_shape(str(bad))
    bad.write_text(json.dumps({"gpus": [{"index": 0}, {"index": 1}], "nvlink": [[0, -1], [-1, 0]]}))
    with pytest.raises(MachineError, match=r"nvlink\[0\]\[1\] must be a whole count >= 0, not -1"):
        load_shape(str(bad))
    bad.write_text(json.dumps({"gpus": [{"index": 0}, {"index": 1}], "pcie": [["X", "QPI"], ["QPI", "X"]]}))
    with pytest.raises(MachineError, match=r"pcie\[0\]\[1\]"):
        load_shape(str(bad))
    bad.write_text("[1, 2]")
    with pytest.raises(MachineError, match="not a JSON object"):
        load_shape(str(bad))


def test_run_reports_link_quality() -> None:
    """Two idle DGX-1-shaped nodes and 2-GPU pods: every set is an all-NVLink pair on one socket."""
    shapes = resolve({"V": "dgx1-v100"})
    nodes = with_shapes([NodeSpec(f"n{i}", 64_000, 1 << 20, 8, "V") for i in range(2)], shapes)
    pods = [PodRequest(f"p{i}", cpu_milli=1000, gpu_count=2) for i in range(6)]
    run = run_once(nodes, pods, "fgd", 42, inflation=0)
    summary = run.links.summary()
    assert summary["multi_gpu_pods"] == 6 and summary["all_nvlink_share"] == 1.0
    assert summary["cross_socket_share"] == 0.0
    assert summary["mean_link_score"] >= 230  # (0,3), (1,2), (4,7), (5,6) score 230, (2,3) 250
    flat = run_once([NodeSpec("f", 64_000, 1 << 20, 8, "V")], pods, "fgd", 42, inflation=0)
    assert flat.links.summary()["multi_gpu_pods"] == 0 and flat.links.unknown == 4


def test_cli_machine_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--seed", "42", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    wanted = {"mean_link_score", "all_nvlink_share", "cross_socket_share", "multi_gpu_pods"}
    assert set(doc["links"]) >= wanted
    assert doc["links"]["multi_gpu_pods"] > 0  # the built-in sample has 8-GPU G2 nodes and multi-GPU pods
    assert cli.main(["--seed", "42", "--json", "--no-topology"]) == 0
    assert json.loads(capsys.readouterr().out)["links"]["multi_gpu_pods"] == 0
    assert cli.main(["--seed", "42", "--machine", "G2"]) == 2
    assert "MODEL=SHAPE" in capsys.readouterr().err
    assert cli.main(["--seed", "42", "--machine", "G2=nope"]) == 2
    assert "no machine shape 'nope'" in capsys.readouterr().err
    assert cli.main(["--seed", "42", "--machine", "G2=pcie-4gpu"]) == 2
    assert "machine shape pcie-4gpu has 4" in capsys.readouterr().err
    assert cli.main(["--seed", "42", "--no-topology", "--machine", "G2=none"]) == 2
    assert "exclude each other" in capsys.readouterr().err


TWO = [{"index": 0}, {"index": 1}]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"gpus": TWO, "nvlink": [[0, 2], [0, 0]]}, r"nvlink\[0\]\[1\] != nvlink\[1\]\[0\]"),
        ({"gpus": TWO, "pcie": [["X", "PIX"], ["SYS", "X"]]}, r"pcie\[0\]\[1\] != pcie\[1\]\[0\]"),
        ({"gpus": TWO, "pcie": [["PIX", "PIX"], ["PIX", "X"]]}, r"pcie\[0\]\[0\] must be 'X'"),
        ({"gpus": TWO, "nvlink": [[3, 1], [1, 0]]}, r"nvlink\[0\]\[0\] must be 0"),
        ({"gpus": [{"index": 0}, {"index": 0}]}, r"by index 0..1, got \[0, 0\]"),
        ({"gpus": [{"index": 0}, {"index": 5}]}, r"by index 0..1, got \[0, 5\]"),
        ({"gpus": [{"index": 1}, {"index": 0}]}, r"by index 0..1, got \[1, 0\]"),
        ({"gpus": []}, "non-empty list"),
        ({"gpus": {"index": 0}}, "non-empty list"),
        ({"gpus": [{"index": 0, "numa": "z"}]}, "numa must be an integer"),
        ({"gpus": TWO, "nvlink": [[0, 1.5], [1.5, 0]]}, "whole count"),
        ({"gpus": TWO, "nvlink": [[0, True], [True, 0]]}, "whole count"),
        ({"gpus": TWO, "nvlink": [[0, "2"], ["2", 0]]}, "whole count"),
        ({"gpus": TWO, "nvlink": None}, "2x2 matrix"),
        ({"gpus": TWO, "nvlink": "ab"}, "2x2 matrix"),
    ],
)
def test_odd_machine_files_are_refused_with_the_entry_named(tmp_path: Path, doc: dict, message: str) -> None:
    """A machine file is read by the rules of devices/topologies (as the node agent reads it): no
    silently used half of an asymmetric matrix, no GPU indices that do not match the matrix rows."""
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(MachineError, match=message):
        load_shape(str(path))


def test_cli_refuses_an_odd_machine_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"gpus": TWO, "nvlink": [[0, 2], [0, 0]]}))
    assert cli.main(["--seed", "42", "--machine", f"T4={path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nvlink[0][1] != nvlink[1][0]" in err[0]


def test_every_shipped_file_passes_the_rules() -> None:
    for path in sorted(SHIPPED.glob("*.json")):
        shape = load_shape(str(path))
        assert shape is not None and shape.gpus >= 1
