"""The simulator's utilisation column (docs/simulator.md "Live utilisation"): the node list's
``gpu_util`` fed to the scheduling core as live readings, the same term the live scheduler uses
(the ``utilization`` policy, ``utilizationWeight``), and the report of its effect (GPU placed on hot
nodes with the readings and with them ignored)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from scheduler.core.request import PodRequest
from scheduler.sim import cli
from scheduler.sim.protocol import HOT_THRESHOLD, run_once
from scheduler.sim.runner import run_experiment
from scheduler.sim.trace import DEFAULT_NODES, DEFAULT_PODS, NodeSpec, TraceError, build_cluster, load_nodes


def node_list(path: Path, rows: list[tuple[str, str]]) -> Path:
    """A node list of 8-GPU V100 nodes named by ``rows`` (name, gpu_util cell)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model", "gpu_util"])
        for name, util in rows:
            writer.writerow([name, 96000, 393216, 8, "V100M32", util])
    return path


def test_the_column_is_read_as_a_percent_and_an_empty_cell_is_unknown(tmp_path: Path) -> None:
    nodes = load_nodes(node_list(tmp_path / "n.csv", [("a", "92.5"), ("b", ""), ("c", "0")]))
    assert [n.utilization for n in nodes] == [92.5, None, 0.0]
    assert all(n.utilization is None for n in load_nodes(DEFAULT_NODES))  # no column: unknown


@pytest.mark.parametrize("cell", ["101", "-1", "x", "nan", "inf", "1e3"])
def test_a_value_that_is_not_a_percent_is_refused_naming_the_row(tmp_path: Path, cell: str) -> None:
    path = node_list(tmp_path / "n.csv", [("a", "10"), ("b", cell)])
    with pytest.raises(TraceError, match=rf"n.csv:3: column gpu_util: not a percent from 0 to 100: '{cell}'"):
        load_nodes(path)


def test_the_values_reach_the_core_as_the_live_schedulers_readings() -> None:
    """Every GPU of the node gets the value; a node without one stays unknown (100 % busy)."""
    hot = NodeSpec("hot", 96000, 393216, 4, "V100M32", utilization=90.0)
    unknown = NodeSpec("unknown", 96000, 393216, 4, "V100M32")
    cluster = build_cluster([hot, unknown])
    for spec in (hot, unknown):
        cluster.set_live(spec.name, spec.live())
    assert list(cluster.node_util) == [90.0, 100.0]
    assert set(hot.live()) == {"hot-gpu0", "hot-gpu1", "hot-gpu2", "hot-gpu3"} and unknown.live() == {}


def two_nodes() -> tuple[list[NodeSpec], list[PodRequest]]:
    """A hot and a cool node alike, and pods that fill half of the GPUs."""
    nodes = [
        NodeSpec("hot", 96000, 393216, 8, "V100M32", utilization=95.0),
        NodeSpec("cool", 96000, 393216, 8, "V100M32", utilization=10.0),
    ]
    pods = [
        PodRequest(f"p{i}", cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=1000) for i in range(8)
    ]
    return nodes, pods


@pytest.mark.parametrize(
    ("policy", "weight"), [("utilization", 0.0), ("fgd-reserve", 1.0), ("bestfit", 0.1), ("spread", 1.0)]
)
def test_with_the_readings_the_pods_go_to_the_cool_node_while_it_has_room(policy: str, weight: float) -> None:
    nodes, pods = two_nodes()
    for seed in (1, 2, 3):
        run = run_once(nodes, pods, policy, seed, inflation=0, utilization_weight=weight)
        assert run.placed == 8 and run.hot is not None
        assert (run.hot.hot_nodes, run.hot.hot_gpus, run.hot.gpus) == (1, 8, 16)
        assert run.hot.hot_placed_milli == 0 and run.hot.hot_placed_pct == 0.0


def test_ignored_readings_and_no_weight_leave_the_placement_to_the_policy() -> None:
    """``spread`` alone (least allocated) alternates between the nodes whatever the readings say;
    ``utilization`` with the readings ignored is static score and least allocated: the same."""
    nodes, pods = two_nodes()
    for policy, weight, readings in (
        ("spread", 0.0, True),
        ("spread", 1.0, False),
        ("utilization", 0.0, False),
    ):
        run = run_once(nodes, pods, policy, 1, inflation=0, utilization_weight=weight, readings=readings)
        assert run.hot is not None and run.hot.hot_placed_milli == 4000 and run.hot.hot_placed_pct == 50.0
        # GPU x events: after event k (0-based) the hot node holds k // 2 + (k % 2) ... of k + 1 GPUs
        assert 0 < run.hot.hot_milli_events < run.hot.milli_events == sum(1000 * (k + 1) for k in range(8))


def test_the_experiment_reports_the_effect_with_and_without_the_readings(tmp_path: Path) -> None:
    nodes, pods = two_nodes()
    exp = run_experiment(nodes, pods, "spread", seeds=[1, 2], inflation=0, utilization_weight=1.0)
    assert len(exp.blind_runs) == 2
    doc = exp.to_json()["utilization"]
    assert doc["weight"] == 1.0 and doc["hot_threshold_pct"] == HOT_THRESHOLD
    assert (doc["hot_nodes"], doc["hot_gpu_pct"]) == (1, 50.0)
    assert doc["with_readings"]["hot_placed_pct"] == doc["with_readings"]["hot_gpu_time_pct"] == 0.0
    assert (
        doc["without_readings"]["hot_placed_pct"] == 50.0 and doc["without_readings"]["placed_gpus"] == 16.0
    )
    assert exp.to_json()["runs"][0]["hot"]["hot_placed_gpus"] == 0.0


def test_a_trace_without_the_column_runs_once_per_seed_and_reports_as_before() -> None:
    nodes = load_nodes(DEFAULT_NODES)[:10]
    pods = [
        PodRequest(f"p{i}", cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=500) for i in range(30)
    ]
    exp = run_experiment(nodes, pods, "utilization", seeds=[1], inflation=1.0, utilization_weight=2.0)
    assert exp.blind_runs == () and exp.runs[0].hot is None and "utilization" not in exp.to_json()
    assert "hot" not in exp.to_json()["runs"][0]


def sample_with_column(tmp_path: Path) -> Path:
    """The built-in sample's nodes, every fourth one at 95 %, the others at 20 %."""
    rows = list(csv.DictReader(open(DEFAULT_NODES, newline="")))
    path = tmp_path / "nodes.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*rows[0], "gpu_util"])
        writer.writeheader()
        for i, row in enumerate(rows):
            writer.writerow({**row, "gpu_util": "95" if i % 4 == 0 else "20"})
    return path


def test_cli_reports_the_effect_on_the_built_in_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = str(sample_with_column(tmp_path))
    args = ["--nodes", nodes, "--pods", str(DEFAULT_PODS), "--seeds", "42-43"]
    assert cli.main([*args, "--utilization-weight", "0.1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["utilization"]
    with_, without = doc["with_readings"], doc["without_readings"]
    # the readings keep the GPU placed off the hot nodes while the others have room
    assert with_["hot_gpu_time_pct"] < without["hot_gpu_time_pct"]
    assert cli.main([*args, "--policy", "utilization", "--hot-threshold", "90"]) == 0
    out = capsys.readouterr().out
    assert "live utilisation (gpu_util):" in out and "busier than 90%" in out and "readings ignored" in out
    for bad in (["--utilization-weight", "-1"], ["--utilization-weight", "1001"], ["--hot-threshold", "101"]):
        assert cli.main([*args, *bad]) == 2
        assert bad[0] in capsys.readouterr().err
    broken = node_list(tmp_path / "bad.csv", [("a", "hot")])
    assert cli.main(["--nodes", str(broken), "--pods", str(DEFAULT_PODS), "--seed", "42"]) == 2
    assert "bad.csv:2: column gpu_util" in capsys.readouterr().err


def test_the_cli_limits_agree_with_the_core() -> None:
    from scheduler.live.config import MAX_UTILIZATION_WEIGHT

    assert (cli.MAX_UTILIZATION_WEIGHT, cli.HOT_THRESHOLD) == (MAX_UTILIZATION_WEIGHT, HOT_THRESHOLD)
