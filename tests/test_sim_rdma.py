"""The simulator's RDMA columns (docs/simulator.md "RDMA interfaces"): the node list's ``rdma_nics`` and
the pod list's ``rdma_interfaces`` / ``rdma_bandwidth`` fed to the scheduling core's RDMA filter and VF
choice (``NodeState.nics``, ``PodRequest.rdma``), and the report of what became of the RDMA pods."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest

from scheduler.core.rdma import NO_RDMA, RdmaRequest
from scheduler.core.state import ClusterState
from scheduler.sim import cli
from scheduler.sim.protocol import run_once
from scheduler.sim.runner import run_experiment
from scheduler.sim.trace import (
    DEFAULT_NODES,
    DEFAULT_PODS,
    NicSpec,
    TraceError,
    load_nodes,
    load_pods,
    parse_rdma,
)

NODE_HEADER = ["sn", "cpu_milli", "memory_mib", "gpu", "model"]
POD_HEADER = ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"]


def write(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def nodes_csv(path: Path, nics: list[str], gpus: int = 8) -> Path:
    rows = [[f"n{i}", 96000, 393216, gpus, "V100M32", cell] for i, cell in enumerate(nics)]
    return write(path, [*NODE_HEADER, "rdma_nics"], rows)


def pods_csv(path: Path, count: int, rdma: tuple[str, str] | None) -> Path:
    """``count`` one-GPU pods, each with the RDMA cells ``rdma`` (no RDMA columns when None)."""
    header = POD_HEADER + (["rdma_interfaces", "rdma_bandwidth"] if rdma else [])
    rows = [[f"p{i:03d}", 1000, 4096, 1, 1000, *(rdma or ())] for i in range(count)]
    return write(path, header, rows)


def test_the_columns_are_parsed_and_reach_the_core(tmp_path: Path) -> None:
    nodes = load_nodes(nodes_csv(tmp_path / "nodes.csv", ["2x100Gbps/4", "", "1x12.5Gbps/1"]))
    assert [n.nics for n in nodes] == [NicSpec(2, 100_000, 4), None, NicSpec(1, 12_500, 1)]
    nics = nodes[0].state().nics
    assert sorted(nics.pfs) == ["n0-nic0", "n0-nic1"]
    assert nics.free_vfs() == 8 and {pf.rate_mbps for pf in nics.pfs.values()} == {100_000}
    assert nics.pfs["n0-nic1"].gpus == frozenset(f"n0-gpu{j}" for j in range(4, 8))
    assert not nodes[1].state().nics
    pods = write(
        tmp_path / "pods.csv",
        [*POD_HEADER, "rdma_interfaces", "rdma_bandwidth"],
        [
            ["a", 1000, 1024, 1, 1000, "2", "25Gbps-50Gbps"],
            ["b", 1000, 1024, 1, 1000, "1", ""],
            ["c", 1000, 1024, 1, 1000, "0", "10Gbps"],
            ["d", 1000, 1024, 1, 1000, "", ""],
            ["e", 1000, 1024, 0, 0, "3", "500Mbps"],
        ],
    )
    assert [p.rdma for p in load_pods(pods)] == [
        RdmaRequest(2, 25_000, 50_000),
        RdmaRequest(1, 0, 0),
        NO_RDMA,
        NO_RDMA,
        RdmaRequest(3, 500, 0),
    ]
    assert all(p.rdma == NO_RDMA for p in load_pods(DEFAULT_PODS))
    assert all(n.nics is None for n in load_nodes(DEFAULT_NODES))


@pytest.mark.parametrize(
    "cell",
    [
        "2x100/8",
        "0x100Gbps/8",
        "2x100Gbps/0",
        "2x100Gbps/257",
        "2x25Gbps-50Gbps/4",
        "2x0Gbps/4",
        "2x100GBps/4",
        "x",
        "2x100Gbps",
        "\uff12x100Gbps/8",
        "65x100Gbps/1",
    ],
)
def test_a_bad_nic_cell_is_refused_naming_the_row(tmp_path: Path, cell: str) -> None:
    path = nodes_csv(tmp_path / "nodes.csv", ["1x100Gbps/2", cell])
    with pytest.raises(TraceError, match=r"nodes\.csv:3: column rdma_nics: "):
        load_nodes(path)


@pytest.mark.parametrize(
    "cells",
    [
        ("33", ""),
        ("-1", ""),
        ("1.5", ""),
        ("two", ""),
        ("", "25Gbps"),
        ("2", "25GBps"),
        ("2", "50Gbps-25Gbps"),
        ("2", "-25Gbps"),
        ("1", "20000Gbps"),
    ],
)
def test_a_bad_request_cell_is_refused_naming_the_row(tmp_path: Path, cells: tuple[str, str]) -> None:
    path = write(
        tmp_path / "pods.csv",
        [*POD_HEADER, "rdma_interfaces", "rdma_bandwidth"],
        [["ok", 1000, 1024, 1, 1000, "1", "10Gbps"], ["bad", 1000, 1024, 1, 1000, *cells]],
    )
    with pytest.raises(TraceError, match=r"pods\.csv:3: pod 'bad': column rdma_"):
        load_pods(path)


@pytest.mark.parametrize(
    ("nics", "bandwidth", "per_node", "why"),
    [
        ("1x100Gbps/2", "60Gbps", 1, "failed_bandwidth"),  # one PF fits one 60 Gbit/s interface
        ("1x100Gbps/2", "10Gbps", 2, "failed_vfs"),  # two VFs per node
    ],
)
def test_rdma_as_the_binding_constraint_places_fewer_pods(
    tmp_path: Path, nics: str, bandwidth: str, per_node: int, why: str
) -> None:
    nodes = load_nodes(nodes_csv(tmp_path / "nodes.csv", [nics] * 4))
    plain = load_pods(pods_csv(tmp_path / "plain.csv", 16, None))
    asking = load_pods(pods_csv(tmp_path / "rdma.csv", 16, ("1", bandwidth)))
    without = run_once(nodes, plain, "fgd-reserve", 42, inflation=0)
    with_rdma = run_once(nodes, asking, "fgd-reserve", 42, inflation=0)
    assert without.placed == 16 and without.rdma is None
    assert with_rdma.placed == 4 * per_node < without.placed
    stats = with_rdma.rdma
    assert stats is not None
    doc = stats.summary()
    assert (doc["pods"], doc["placed"], doc[why], doc["failed_other"]) == (
        16,
        4 * per_node,
        16 - 4 * per_node,
        0,
    )
    assert doc["interfaces_placed"] == 4 * per_node


def test_a_pf_never_holds_more_than_its_line_rate_nor_a_vf_two_pods(tmp_path: Path) -> None:
    """The built-in sample with NICs on every node and RDMA asked by a third of the pods: at the end
    of each seed's run every PF's reservations (recounted from the placed pods' grants) are within its
    line rate and every VF is held by at most one pod."""
    with open(DEFAULT_NODES, newline="") as f:
        rows = list(csv.DictReader(f))
    node_path = write(
        tmp_path / "nodes.csv",
        [*NODE_HEADER, "rdma_nics"],
        [[r[c] for c in NODE_HEADER] + [("2x100Gbps/4", "1x50Gbps/2")[i % 2]] for i, r in enumerate(rows)],
    )
    with open(DEFAULT_PODS, newline="") as f:
        pods = list(csv.DictReader(f))
    asks = [("1", "25Gbps-40Gbps"), ("2", "30Gbps"), ("4", "10Gbps")]
    pod_path = write(
        tmp_path / "pods.csv",
        [*POD_HEADER, "rdma_interfaces", "rdma_bandwidth"],
        [
            [r[c] for c in POD_HEADER] + list(asks[i % 3] if i % 3 == 0 else ("", ""))
            for i, r in enumerate(pods)
        ]
        + [[f"z{i}", 1000, 1024, 0, 0, *asks[i % 3]] for i in range(60)],
    )
    finals: list[ClusterState] = []
    for seed in (42, 43):
        result = run_once(
            load_nodes(node_path), load_pods(pod_path), "fgd-reserve", seed, observe=finals.append
        )
        assert result.rdma is not None and result.rdma.placed > 0
        assert result.rdma.failed_vfs + result.rdma.failed_bandwidth > 0  # RDMA did bind
        assert result.rdma.peak_pf_load_pct <= 100.0
    for cluster in finals:
        for node in cluster.nodes:
            reserved: Counter[str] = Counter()
            held: Counter[str] = Counter()
            for alloc in node.allocations.values():
                for grant in alloc.rdma:
                    reserved[grant.pf] += grant.min_mbps
                    held[grant.id] += 1
                    assert node.nics.pf_of[grant.id] == grant.pf
            assert all(n == 1 for n in held.values())
            for pf in node.nics.pfs.values():
                assert reserved[pf.id] == pf.reserved_mbps <= pf.rate_mbps


def test_the_experiment_and_cli_report_the_rdma_pods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node_path = nodes_csv(tmp_path / "nodes.csv", ["1x100Gbps/2"] * 4)
    pod_path = pods_csv(tmp_path / "rdma.csv", 16, ("1", "60Gbps"))
    exp = run_experiment(
        load_nodes(node_path), load_pods(pod_path), "fgd-reserve", seeds=(42, 43), inflation=0
    )
    doc = exp.to_json()
    assert doc["rdma"]["pods"] == 32 and doc["rdma"]["placed"] == 8 and doc["rdma"]["failed_bandwidth"] == 24
    assert [r["rdma"]["placed"] for r in doc["runs"]] == [4, 4]
    args = ["--nodes", str(node_path), "--pods", str(pod_path), "--seed", "42", "--inflation", "0"]
    assert cli.main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["rdma"]
    assert (out["pods"], out["placed"], out["failed_bandwidth"], out["peak_pf_load_pct"]) == (16, 4, 12, 60.0)
    assert cli.main(args) == 0
    assert "RDMA pods (all seeds): 16 arrived, 4 placed" in capsys.readouterr().out
    plain = run_experiment(
        load_nodes(node_path),
        load_pods(pods_csv(tmp_path / "plain.csv", 4, None)),
        "fgd-reserve",
        seeds=(42,),
    )
    assert "rdma" not in plain.to_json()


@pytest.mark.parametrize(
    "cell",
    ["2", "0032", " 2\t", "0", "000", "33", "1_0", "\u0663", "+1", "-1", "2.0", "0x2", "2\n", "9" * 30],
)
def test_trace_rdma_count_reads_as_the_live_annotation(cell: str) -> None:
    # The simulator once refused "0032" (at most three characters) where the live scheduler reads 32.
    from scheduler.live.podspec import PodSpecError, rdma_request

    try:
        live: int | None = rdma_request({"kubegpu.io/rdma-interfaces": cell}).count
    except PodSpecError:
        live = None
    try:
        sim: int | None = parse_rdma(cell, "").count
    except ValueError:
        sim = None
    assert sim == live
