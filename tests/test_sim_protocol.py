"""The simulator: trace loading, the protocol on tiny hand-made traces, the curve, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scheduler.core import PodRequest
from scheduler.sim import cli
from scheduler.sim.protocol import allocation_curve, arrival_order, run_once
from scheduler.sim.runner import parse_seeds, run_experiment
from scheduler.sim.trace import DEFAULT_NODES, DEFAULT_PODS, NodeSpec, TraceError, load_nodes, load_pods
from tests.fixtures.common import missing_component

OPENB = Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"


def write(path: Path, text: str) -> Path:
    path.write_text(text.strip() + "\n")
    return path


def test_loads_the_openb_format(tmp_path: Path) -> None:
    nodes = load_nodes(write(tmp_path / "n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,8000,1024,2,T4"))
    assert nodes == [NodeSpec("n0", 8000, 1024, 2, "T4")]
    pods = load_pods(
        write(
            tmp_path / "p.csv",
            """
name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos
a,1000,100,1,250,,LS
b,2000,200,2,1000,V100M16|A10,BE
c,3000,300,0,0,,BE
""",
        )
    )
    assert [(p.name, p.gpu_count, p.gpu_milli, p.is_share) for p in pods] == [
        ("a", 1, 250, True),
        ("b", 2, 1000, False),
        ("c", 0, 0, False),
    ]
    assert pods[1].gpu_models == frozenset({"V100M16", "A10"}) and pods[0].gpu_models == frozenset()
    with pytest.raises(TraceError, match="missing column"):
        load_pods(write(tmp_path / "bad.csv", "name,cpu_milli\na,1"))
    with pytest.raises(TraceError, match=r"bad2.csv:2: column cpu_milli"):
        load_nodes(write(tmp_path / "bad2.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,lots,1,1,T4"))


def test_builtin_default_is_shipped_and_small() -> None:
    nodes, pods = load_nodes(DEFAULT_NODES), load_pods(DEFAULT_PODS)
    capacity = sum(n.gpus for n in nodes) * 1000
    assert 20 <= len(nodes) <= 100 and 100 <= len(pods) <= 1000
    assert 0.9 < sum(p.total_gpu_milli for p in pods) / capacity <= 1.0


def tiny() -> tuple[list[NodeSpec], list[PodRequest]]:
    """2 one-GPU nodes and shares of 500, 500 and a whole GPU: exactly the capacity."""
    nodes = [NodeSpec("n0", 10_000, 10_000, 1, "G"), NodeSpec("n1", 10_000, 10_000, 1, "G")]
    pods = [
        PodRequest("a", cpu_milli=1000, gpu_count=1, gpu_milli=500),
        PodRequest("b", cpu_milli=1000, gpu_count=1, gpu_milli=500),
        PodRequest("c", cpu_milli=1000, gpu_count=1),
    ]
    return nodes, pods


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_tiny_trace_known_answer(seed: int) -> None:
    """Best fit packs the two halves onto one GPU in every order, so everything fits (100%);
    with inflation 1.0 nothing is added (the next clone would pass 100%)."""
    nodes, pods = tiny()
    result = run_once(nodes, pods, "bestfit", seed, inflation=1.0)
    assert (result.pods, result.placed, result.allocated_milli, result.capacity_milli) == (3, 3, 2000, 2000)
    assert result.alloc_pct_at_100 == 100.0
    assert result.curve[100] == 100.0 and min(result.curve) in (24, 49)  # first pod: 500 or 1000 milli


def test_cpu_can_strand_a_gpu() -> None:
    """One node, 2 GPUs, 4 CPUs; two 1-GPU pods of 3 CPUs: the second one does not fit (50%)."""
    nodes = [NodeSpec("n", 4000, 10_000, 2, "G")]
    pods = [PodRequest(f"p{i}", cpu_milli=3000, gpu_count=1) for i in range(2)]
    for policy in ("random", "bestfit", "fgd", "fgd-align", "fgd-reserve"):
        result = run_once(nodes, pods, policy, 42, inflation=1.0)
        assert (result.placed, result.allocated_milli) == (1, 1000), policy
        assert result.at(100) == 50.0


def test_arrival_order_shuffles_and_inflates() -> None:
    pods = [
        PodRequest(f"p{i:02d}", cpu_milli=100, gpu_count=1, gpu_milli=100 * (1 + i % 9)) for i in range(20)
    ]
    pods += [PodRequest(f"cpu{i}", cpu_milli=100) for i in range(5)]
    capacity = 10_000  # the trace asks for 9,800
    order = arrival_order(pods, 42, capacity, 1.3)
    assert sorted(p.name for p in order[:25]) == sorted(p.name for p in pods)  # originals first, shuffled
    assert [p.name for p in order[:25]] != sorted(p.name for p in pods)
    clones = order[25:]
    assert clones and all("-clone-" in p.name for p in clones)
    assert len({p.uid for p in order}) == len(order)
    total = sum(p.total_gpu_milli for p in order)
    assert total <= 13_000
    assert arrival_order(pods, 42, capacity, 1.3) == order
    assert arrival_order(pods, 43, capacity, 1.3) != order
    cut = arrival_order(pods, 42, 5000, 1.0)  # above the target: random pods dropped
    assert sum(p.total_gpu_milli for p in cut) <= 5000 and len(cut) < len(pods)
    cpu_only = [PodRequest("c", cpu_milli=1)]
    assert arrival_order(cpu_only, 1, capacity) == cpu_only


def test_curve_buckets_by_rounded_arrival_percent() -> None:
    arrived = np.array([100, 240, 260, 1000, 1290, 1300])
    allocated = np.array([100, 200, 250, 900, 900, 950])
    curve = allocation_curve(arrived, allocated, 1000)
    assert curve[10] == 10.0
    assert curve[24] == 20.0 and curve[26] == 25.0
    assert curve[25] == 22.5  # no event rounds to 25: the events at 24..26
    assert curve[100] == 90.0 and curve[129] == 90.0 and curve[130] == 95.0
    assert 50 not in curve


def test_parse_seeds() -> None:
    assert parse_seeds("42-51") == list(range(42, 52))
    assert parse_seeds("1,3,5-6") == [1, 3, 5, 6]
    with pytest.raises(ValueError):
        parse_seeds("9-3")


def test_experiment_json_shape() -> None:
    nodes, pods = tiny()
    exp = run_experiment(nodes, pods, "fgd", seeds=[1, 2], inflation=1.0)
    doc = exp.to_json()
    wanted = {"policy", "runs", "mean_alloc_pct_at_100", "mean_alloc_pct_at_130", "links", "seconds"}
    assert set(doc) == wanted
    assert [r["seed"] for r in doc["runs"]] == [1, 2]
    assert set(doc["runs"][0]) == {"seed", "alloc_pct_at_100", "alloc_pct_at_130", "curve", "links"}
    assert doc["mean_alloc_pct_at_100"] == 100.0


def test_cli_module_is_light_and_agrees_with_the_core() -> None:
    import subprocess
    import sys

    from scheduler.core.policies import DEFAULT_POLICY
    from scheduler.sim.protocol import INFLATION, MAX_INFLATION

    assert (cli.DEFAULT_POLICY, cli.INFLATION) == (DEFAULT_POLICY, INFLATION)
    assert cli.MAX_INFLATION == MAX_INFLATION
    code = "import sys, scheduler.sim.cli; sys.exit('numpy' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1]).returncode == 0
    )


def test_cli_default_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--seed", "42", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["policy"] == "fgd-reserve" and len(doc["runs"]) == 1
    assert 90 < doc["mean_alloc_pct_at_130"] <= 100


def test_cli_report_list_and_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["simulate", "--policy", "bestfit", "--seeds", "42-43"]) == 0
    out = capsys.readouterr().out
    assert "policy bestfit" in out and "built-in sample" in out and "mean" in out and "130% arrived" in out
    assert cli.main(["--list-policies"]) == 0
    listed = capsys.readouterr().out
    assert "fgd-reserve" in listed and "(default)" in listed and "gpuclustering" in listed
    assert cli.main(["--policy", "nope"]) == 2
    assert cli.main(["--nodes", str(DEFAULT_NODES)]) == 2
    assert cli.main(["--nodes", str(tmp_path / "none.csv"), "--pods", str(DEFAULT_PODS)]) == 2
    assert "kubegpu simulate:" in capsys.readouterr().err


def test_cli_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "curve.png"
    assert cli.main(["--seed", "42", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_openb_sample_runs() -> None:
    """A 1-in-10 sample of openb nodes and pods (not a full run: the benchmark does those)."""
    if not OPENB.is_dir():
        missing_component(f"the openb trace ({OPENB})")
    nodes = load_nodes(OPENB / "openb_node_list_gpu_node.csv")[::10]
    pods = load_pods(OPENB / "openb_pod_list_default.csv")[::10]
    result = run_once(nodes, pods, "fgd", 42)
    assert result.placed > 0 and 80 < result.alloc_pct_at_130 <= 100


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e9"])
def test_cli_refuses_an_inflation_that_never_ends_or_means_nothing(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """NaN and infinity never reach the target (the inflation loop would not end), 1e9 would fill the
    memory with clones; each is one stderr line and exit 2."""
    assert cli.main(["--seed", "42", "--inflation", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--inflation" in err[0] and "Traceback" not in err[0], err
    with pytest.raises(ValueError, match="inflation must be in"):
        arrival_order([PodRequest("p", gpu_count=1)], 42, 1000, float(value))


def test_inflation_0_is_the_trace_once() -> None:
    pods = [PodRequest(f"p{i}", gpu_count=1) for i in range(5)]
    order = arrival_order(pods, 42, 1000, 0)
    assert sorted(p.name for p in order) == [p.name for p in pods]


def test_cli_json_has_null_for_points_a_run_never_reaches(capsys: pytest.CaptureFixture[str]) -> None:
    """Inflated to 110%, a run has no value at 130% arrived: null in the JSON (NaN is not JSON)."""
    assert cli.main(["--seed", "42", "--inflation", "1.1", "--json"]) == 0
    out = capsys.readouterr().out
    assert "NaN" not in out
    doc = json.loads(out)
    assert doc["mean_alloc_pct_at_130"] is None and doc["runs"][0]["alloc_pct_at_130"] is None
    assert isinstance(doc["mean_alloc_pct_at_100"], float)


@pytest.mark.parametrize(
    ("row", "column", "why"),
    [
        ("a,-4000,100,1,1000", "cpu_milli", "below 0"),
        ("a,1000,-1,1,1000", "memory_mib", "below 0"),
        ("a,1000,100,-1,1000", "num_gpu", "below 0"),
        ("a,inf,100,1,1000", "cpu_milli", "not a number"),
        ("a,1000,nan,1,1000", "memory_mib", "not a number"),
    ],
)
def test_a_pod_asking_below_nothing_or_no_number_is_refused_by_row(
    tmp_path: Path, row: str, column: str, why: str
) -> None:
    """A negative request would add capacity to the node the pod runs on (and make the LP bound and the
    forced pods wrong); an infinite one raised OverflowError out of the loader."""
    path = write(tmp_path / "p.csv", f"name,cpu_milli,memory_mib,num_gpu,gpu_milli\nok,1,1,0,0\n{row}")
    with pytest.raises(TraceError, match=rf"p.csv:3: column {column}: {why}"):
        load_pods(path)


def test_a_negative_share_is_still_a_whole_gpu_and_negative_nodes_are_refused(tmp_path: Path) -> None:
    """gpu_milli out of range means whole GPUs (the FGD converter's rule), below 0 included; a node of
    negative capacity is refused by row."""
    pods = load_pods(write(tmp_path / "p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,1,-5"))
    assert (pods[0].gpu_count, pods[0].gpu_milli) == (1, 1000)
    with pytest.raises(TraceError, match=r"n.csv:2: column gpu: below 0"):
        load_nodes(write(tmp_path / "n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,8000,1024,-2,T4"))
