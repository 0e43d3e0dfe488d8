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


# --------------------------------------------------------------------------- the HAMi kind (no binary)


def test_kube_scheduler_gets_hamis_chart_stanza_for_profile_bench_hami(bench: ModuleType) -> None:
    hami = bench.hami_peer
    config = hami.scheduler_config(4321, 100)
    (stanza,) = config["extenders"]
    assert config["profiles"] == [{"schedulerName": "bench-hami"}]
    assert config["clientConnection"] == {"qps": 100, "burst": 100}
    assert stanza["urlPrefix"] == "http://127.0.0.1:4321" and stanza["enableHTTPS"] is False
    assert (stanza["filterVerb"], stanza["bindVerb"], stanza["nodeCacheCapable"]) == ("filter", "bind", True)
    assert "prioritizeVerb" not in stanza and stanza["httpTimeout"] == "30s"
    assert {"name": "nvidia.com/gpu", "ignoredByScheduler": True} in stanza["managedResources"]
    assert all(r["ignoredByScheduler"] for r in stanza["managedResources"])
    args = hami.scheduler_args(Path("/bin/hami"), 4321, 4322, Path("/tmp/dc.yaml"), 100)
    assert args[0] == "/bin/hami"
    for flag in (
        "--http_bind=127.0.0.1:4321",
        "--scheduler-name=bench-hami",
        "--metrics-bind-address=127.0.0.1:4322",
        "--device-config-file=/tmp/dc.yaml",
        "--leader-elect=false",
        "--node-scheduler-policy=binpack",
        "--kube-qps=100",
        "--kube-burst=100",
    ):
        assert flag in args, flag
    assert "--node-scheduler-policy=spread" in hami.scheduler_args(Path("h"), 1, 2, Path("c"), 1, "spread")
    nvidia = yaml.safe_load(yaml.safe_dump(hami.device_config()))["nvidia"]
    assert nvidia["resourceCountName"] == "nvidia.com/gpu" and nvidia["deviceSplitCount"] == 10


def test_nodes_get_the_register_annotation_in_the_device_plugins_format(bench: ModuleType) -> None:
    """Go's json.Marshal of []DeviceInfo: field order id, index, count, devmem, devcore, type, numa,
    mode, health; omitempty drops index 0 and NUMA node 0."""
    hami = bench.hami_peer
    assert hami.register_annotation("n1", gpus=2) == (
        '[{"id":"GPU-n1-0","count":10,"devmem":81559,"devcore":100,"type":"NVIDIA H100 80GB HBM3",'
        '"mode":"hami-core","health":true},'
        '{"id":"GPU-n1-1","index":1,"count":10,"devmem":81559,"devcore":100,"type":"NVIDIA H100 80GB HBM3",'
        '"numa":1,"mode":"hami-core","health":true}]'
    )
    annotations = hami.node_annotations("gpu-0007")
    assert set(annotations) == {"hami.io/node-nvidia-register"}
    devices = json.loads(annotations["hami.io/node-nvidia-register"])
    assert [d["id"] for d in devices] == [f"GPU-gpu-0007-{i}" for i in range(8)]
    assert [d.get("numa", 0) for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_the_stand_in_reads_the_lock_and_erases_devices_as_the_device_plugin_does(bench: ModuleType) -> None:
    hami = bench.hami_peer
    lock = "2026-11-29T08:00:00Z,bench-ext-hami,c0-00001"
    assert hami.parse_lock(lock) == ("bench-ext-hami", "c0-00001")
    assert hami.parse_lock("2026-11-29T08:00:00Z") is None  # the legacy form names no pod
    assert hami.lock_is_owned_by(lock, "bench-ext-hami", "c0-00001")
    assert not hami.lock_is_owned_by(lock, "bench-ext-hami", "c0-00002")
    assert hami.lock_is_owned_by("2026-11-29T08:00:00Z", "any", "pod")
    one = "GPU-gpu-0001-3,NVIDIA,81559,0:;"  # one container, one GPU, as HAMi's filter writes it
    assert hami.erased_devices(one) == ";;" and hami.all_allocated(";;")
    assert not hami.all_allocated(one)
    two = "GPU-a,NVIDIA,1,0:;GPU-b,NVIDIA,1,0:;"
    assert hami.erased_devices(two) == ";GPU-b,NVIDIA,1,0:;;"
    # DecodePodDevices keeps the empty entry after the last ";", so each re-encoding adds one, in Go too
    assert hami.erased_devices(hami.erased_devices(two)) == ";;;;"
    assert not hami.all_allocated(hami.erased_devices(two))


def test_the_stand_ins_patch_bodies_are_the_device_plugins(bench: ModuleType) -> None:
    hami = bench.hami_peer
    assert hami.pod_annotation_patch({"hami.io/bind-phase": "success"}) == (
        b'{"metadata":{"annotations":{"hami.io/bind-phase":"success"}}}'
    )
    assert hami.pod_annotation_patch({"hami.io/vgpu-devices-to-allocate": ";;"}) == (
        b'{"metadata":{"annotations":{"hami.io/vgpu-devices-to-allocate":";;"}}}'
    )
    release = hami.lock_release_patch("4711")
    assert release == b'{"metadata":{"annotations":{"hami.io/mutex.lock":null},"resourceVersion":"4711"}}'
    assert json.loads(release)["metadata"]["annotations"] == {"hami.io/mutex.lock": None}


def test_the_stand_in_takes_bound_pods_in_phase_allocating_only(bench: ModuleType) -> None:
    hami = bench.hami_peer

    def pod(node: str | None, phase: str | None) -> dict[str, object]:
        annotations = {"hami.io/bind-phase": phase} if phase else {}
        return {"metadata": {"annotations": annotations}, "spec": {"nodeName": node} if node else {}}

    assert hami.wants_allocate(pod("gpu-0001", "allocating"))
    assert not hami.wants_allocate(pod(None, "allocating"))
    assert not hami.wants_allocate(pod("gpu-0001", "success"))
    assert not hami.wants_allocate(pod("gpu-0001", None))


def test_the_stand_ins_retries_and_report_follow_hamis_backoff(bench: ModuleType) -> None:
    import random

    hami = bench.hami_peer
    delays = hami.retry_delays(random.Random(3))
    assert len(delays) == 4
    for delay, base in zip(delays, (0.1, 0.2, 0.4, 0.8), strict=True):
        assert base <= delay <= 1.5 * base
    report = hami.latency_summary({"allocated": 3, "released": 3, "errors": 0}, [0.03, 0.01, 0.02])
    assert report == {"allocated": 3, "released": 3, "errors": 0, "mean_ms": 20.0, "p50_ms": 20.0} | {
        "p99_ms": 30.0,
        "max_ms": 30.0,
    }
    assert hami.latency_summary({"released": 0}, []) == {"released": 0}


def test_the_hami_kind_is_on_only_with_its_binary_and_joins_the_headline(bench: ModuleType) -> None:
    assert bench.bench_kinds(None) == bench.KINDS and bench.HAMI not in bench.KINDS
    kinds = bench.bench_kinds("/some/hami-scheduler")
    assert kinds == (*bench.KINDS, bench.HAMI)
    e, k, p, h = kinds
    assert bench.round_order(2, kinds) == [(0, e), (0, k), (0, p), (0, h), (1, h), (1, p), (1, k), (1, e)]
    assert bench.parse_args([]).hami_binary is None

    def rounds(rate: float, bound: int = 10) -> list[dict[str, object]]:
        return [{"pods_per_second": rate, "pods": 10, "bound": bound, "cpu_seconds": {}}]

    three = {
        bench.EXTENDER: bench.kind_summary(rounds(70.0)),
        bench.KUBEGPU: bench.kind_summary(rounds(110.0)),
        bench.PLAIN: bench.kind_summary(rounds(100.0)),
    }
    without = bench.headline(three)
    assert not {k for k in without if "hami" in k}
    with_hami = bench.headline({**three, bench.HAMI: bench.kind_summary(rounds(5.0, bound=9))})
    assert (with_hami["hami_pods_per_second"], with_hami["ratio_hami_plain"]) == (5.0, 0.05)
    assert with_hami["hami_every_pod_bound"] is False
    assert with_hami["targets_met"] == without["targets_met"]  # kubegpu's targets, not HAMi's
