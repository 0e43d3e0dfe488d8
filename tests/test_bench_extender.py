"""bench/extender_throughput.py: its pure parts (kube-scheduler's config with the shipped extender
stanza, the round order, medians and the JSON's headline), without an apiserver; and one tiny real
run against a real kube-apiserver, kube-scheduler with ``kubegpu extender``, kubegpu's scheduler and
a plain kube-scheduler (marked ``apiserver``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from kubegpu.devenv.controlplane import BinariesMissing, find_binaries
from tests.fixtures.common import missing_component
from tests.support.benchscript import bench_module

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "extender_throughput.py"
HEADLINE = {
    "extender_pods_per_second",
    "kubegpu_pods_per_second",
    "plain_pods_per_second",
    "ratio_extender_plain",
}


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return bench_module(BENCH.name, "extender_throughput_bench")


def test_kube_scheduler_gets_the_shipped_stanza_pointed_at_the_extender(bench: ModuleType) -> None:
    shipped = yaml.safe_load((ROOT / "deploy" / "extender" / "kube-scheduler-config.yaml").read_text())
    config = bench.extender_scheduler_config(shipped, 4321, 100)
    (stanza,) = config["extenders"]
    (original,) = shipped["extenders"]
    assert stanza == {**original, "urlPrefix": "http://127.0.0.1:4321"}
    assert original["urlPrefix"].startswith("http://kubegpu-extender")  # the shipped file is untouched
    assert config["profiles"] == [{"schedulerName": "bench-extender"}]
    assert config["clientConnection"] == {"qps": 100, "burst": 100}
    assert stanza["filterVerb"] == "choose" and "prioritizeVerb" not in stanza
    (scored,) = bench.extender_scheduler_config(shipped, 4321, 100, bench.SCORED)["extenders"]
    assert scored == {**stanza, "filterVerb": "filter", "prioritizeVerb": "prioritize", "weight": 5}


def test_round_order_interleaves_every_kind(bench: ModuleType) -> None:
    e, k, p = bench.KINDS
    assert bench.round_order(2) == [(0, e), (0, k), (0, p), (1, p), (1, k), (1, e)]


def test_the_json_headline_is_the_issues_shape_with_medians(bench: ModuleType) -> None:
    def rounds(*rates: float) -> list[dict[str, object]]:
        return [{"pods_per_second": r, "pods": 10, "bound": 10, "cpu_seconds": {"etcd": 1.0}} for r in rates]

    summaries = {
        bench.EXTENDER: bench.kind_summary(rounds(60.0, 80.0, 70.0)),
        bench.KUBEGPU: bench.kind_summary(rounds(120.0, 110.0)),
        bench.PLAIN: bench.kind_summary(rounds(100.0)),
    }
    doc = json.loads(json.dumps(bench.headline(summaries)))
    assert HEADLINE <= set(doc)
    assert (doc["extender_pods_per_second"], doc["kubegpu_pods_per_second"]) == (70.0, 115.0)
    assert doc["ratio_extender_plain"] == 0.7 and doc["ratio_kubegpu_plain"] == 1.15
    assert doc["targets_met"] == {"ratio_extender_plain_at_least_0_7": True, "every_pod_bound": True}
    assert summaries[bench.EXTENDER]["pods_per_second_range"] == [60.0, 80.0]
    assert summaries[bench.EXTENDER]["cpu_seconds"] == {"etcd": 3.0}


def test_histogram_means_are_sum_over_count_in_ms_per_labelled_series(bench: ModuleType) -> None:
    text = "\n".join(
        [
            "# TYPE req_seconds histogram",
            'req_seconds_bucket{verb="filter",le="0.01"} 3',
            'req_seconds_bucket{verb="filter",le="+Inf"} 4',
            'req_seconds_count{verb="filter"} 4',
            'req_seconds_sum{verb="filter"} 0.01',
            'req_seconds_bucket{verb="bind",le="+Inf"} 0',
            'req_seconds_count{verb="bind"} 0',
            'req_seconds_sum{verb="bind"} 0',
            "# TYPE other_seconds histogram",
            'other_seconds_bucket{le="+Inf"} 1',
            "other_seconds_count 1",
            "other_seconds_sum 2",
            "",
        ]
    )
    assert bench.histogram_means_ms(text, ["req_seconds"]) == {"req_seconds{verb=filter}": 2.5}
    assert bench.histogram_means_ms(text, ["other_seconds"]) == {"other_seconds{}": 2000.0}


def test_sizes_that_cannot_fit_are_refused(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--nodes", "1", "--pods", "9"])
    assert "do not fit" in capsys.readouterr().err
    quick, full = bench.parse_args(["--quick"]), bench.parse_args([])
    assert (quick.nodes, quick.pods, full.nodes, full.pods) == (50, 200, 500, 1000)


@pytest.mark.apiserver
@pytest.mark.parametrize("verbs", ["shipped", "scored"])
def test_a_tiny_real_run_prints_the_documented_json(tmp_path: Path, verbs: str) -> None:
    """4 nodes, 8 one-GPU pods a round, one round of each kind: every pod bound by each, the
    extender kind through kubegpu's choose and bind (``--verbs scored``: filter, prioritize and
    bind); nothing of the run is left in the temporary directory (the extender's keys,
    configuration and log were, once)."""
    try:
        find_binaries()
    except BinariesMissing as exc:
        missing_component(str(exc))
    argv = ["--json", "--nodes", "4", "--pods", "8", "--rounds", "1", "--verbs", verbs]
    result = subprocess.run(
        [sys.executable, str(BENCH), *argv],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    doc = json.loads(result.stdout)
    assert HEADLINE <= set(doc) and doc["extender_verbs"] == verbs
    for kind in ("extender", "kubegpu", "plain"):
        (only,) = doc["detail"][kind]["per_round"]
        assert only["bound"] == only["pods"] == 8, only
    # a bind answered 200 with an Error ("not known yet; retry") is retried by kube-scheduler: at least 8
    calls = doc["extender_calls"]
    assert calls.get("bind 200", 0) >= 8, calls
    called = ("choose", "bind") if verbs == "shipped" else ("filter", "prioritize", "bind")
    assert {c.split()[0] for c in calls} == set(called), calls
    assert doc["kube_scheduler"].endswith("v1.37.2")
    latency = doc["mean_latency_ms"]
    for verb in called:
        assert latency["kubegpu_extender"][f"kubegpu_extender_request_duration_seconds{{verb={verb}}}"] > 0
    for kind in ("extender", "plain"):
        assert latency["kube_scheduler"][kind]["scheduler_scheduling_algorithm_duration_seconds{}"] > 0
