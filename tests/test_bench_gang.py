"""bench/gang_throughput.py: its pure parts (pods and PodGroups as the APIs take them, the arrival
order, the whole/partial group accounting, medians and the JSON's headline), without an apiserver;
and one tiny real run against a real kube-apiserver, kubegpu and kube-scheduler (marked
``apiserver``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kubegpu.devenv.controlplane import BinariesMissing, find_binaries
from scheduler.live.podgroups import KUBE_API, PLUGINS_API, GroupRef, group_ref, parse_group
from tests.fixtures.common import missing_component
from tests.support.benchscript import bench_module

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "gang_throughput.py"
HEADLINE = {
    "gang_pods_per_second",
    "plain_pods_per_second",
    "ratio",
    "groups",
    "groups_placed_whole",
    "partial_groups_seen",
    "kube_scheduler_gang_pods_per_second",
    "ratio_vs_kube_scheduler_gang",
}


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return bench_module(BENCH.name, "gang_throughput_bench")


def test_members_join_their_group_in_the_api_asked_and_plain_pods_join_none(bench: ModuleType) -> None:
    kube = bench.member_pod("ns", "g-m00", "s", "g", bench.KUBE_API)
    plugins = bench.member_pod("ns", "g-m01", "s", "g", bench.PLUGINS_API)
    plain = bench.member_pod("ns", "g-m02", "s", None, None)
    assert [group_ref(p) for p in (kube, plugins, plain)] == [
        GroupRef(KUBE_API, "ns", "g"),
        GroupRef(PLUGINS_API, "ns", "g"),
        None,
    ]
    for pod in (kube, plugins, plain):
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {"nvidia.com/gpu": "1"} and pod["spec"]["schedulerName"] == "s"
    with pytest.raises(ValueError):
        bench.member_pod("ns", "x", "s", "g", "example.com")


@pytest.mark.parametrize("api", [KUBE_API, PLUGINS_API])
def test_pod_groups_ask_every_member_as_the_scheduler_parses_them(bench: ModuleType, api: str) -> None:
    body = bench.pod_group(api, "g", 8)
    body["metadata"]["namespace"] = "ns"
    spec = parse_group(api, body)
    assert spec.gang and spec.min_member == 8 and str(spec.ref) == "ns/g"


def test_arrival_orders(bench: ModuleType) -> None:
    assert bench.arrival_order(2, 3, False) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert bench.arrival_order(2, 3, True) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]


def test_sizes_that_cannot_all_fit_are_refused(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.size_problem(500, 200, 8) is None
    assert bench.size_problem(500, 500, 8) is None  # exactly every GPU
    assert "4008 GPUs" in bench.size_problem(500, 501, 8)
    assert bench.size_problem(0, 1, 8)
    with pytest.raises(SystemExit) as refused:
        bench.parse_args(["--nodes", "1", "--groups", "2"])
    assert refused.value.code == 2 and "16 GPUs" in capsys.readouterr().err
    quick = bench.parse_args(["--quick"])
    assert (quick.nodes, quick.groups) == (50, 20)
    full = bench.parse_args([])
    assert (full.nodes, full.groups, full.group_size) == (500, 200, 8)


def group_of(groups: int, size: int) -> dict[str, str]:
    return {f"g{g}-m{m}": f"g{g}" for g in range(groups) for m in range(size)}


def test_groups_bound_one_after_another_are_whole_and_never_two_partial_at_once(bench: ModuleType) -> None:
    members = group_of(3, 4)
    binds = [(name, float(i)) for i, name in enumerate(members)]
    account = bench.account_groups(binds, members, 4, {"g0": 4, "g1": 4, "g2": 4})
    assert account == bench.GroupAccount(3, 3, 0, 0, 1, 3.0, 3.0)


def test_interleaved_binds_count_the_most_groups_partial_at_one_moment(bench: ModuleType) -> None:
    members = group_of(3, 2)
    order = ["g0-m0", "g1-m0", "g2-m0", "g0-m1", "g1-m1", "g2-m1"]
    account = bench.account_groups([(n, i / 10) for i, n in enumerate(order)], members, 2, dict.fromkeys(
        ("g0", "g1", "g2"), 2
    ))
    assert (account.whole, account.partial, account.max_partial_at_once) == (3, 0, 3)
    assert account.max_spread_seconds == 0.3 and account.median_spread_seconds == 0.3


def test_a_group_left_short_of_its_minimum_is_partial_whichever_account_shows_it(bench: ModuleType) -> None:
    members = group_of(4, 3)
    binds = [(n, 1.0) for n in ("g0-m0", "g0-m1", "g0-m2", "g1-m0", "g1-m1", "g3-m0", "g3-m1", "g3-m2")]
    listed = {"g0": 3, "g1": 2, "g3": 2}  # g3: the list, taken after, has a member unbound again
    account = bench.account_groups(binds, members, 3, listed)
    assert (account.groups, account.whole, account.partial, account.unbound) == (4, 1, 2, 1)
    assert account.max_partial_at_once == 2  # g1 (left short) and g3 while it was binding
    # a bind the watch missed but the list shows (the list is taken once the binds settled)
    account = bench.account_groups(binds[:2], members, 3, {"g0": 3})
    assert (account.whole, account.partial, account.unbound) == (0, 1, 3)
    # a member the watch saw bound that the list no longer shows bound
    account = bench.account_groups([("g0-m0", 1.0)], members, 3, {})
    assert (account.whole, account.partial, account.unbound) == (0, 1, 3)
    # pods of no group, and extras beyond the minimum, do not change the account
    more = [*binds, ("stray", 2.0), ("g0-m3", 2.0)]
    assert bench.account_groups(more, {**members, "g0-m3": "g0"}, 3, listed).whole == 1


def test_bound_per_group_counts_pods_with_a_node(bench: ModuleType) -> None:
    pods = [
        {"metadata": {"name": "g0-m0"}, "spec": {"nodeName": "n"}},
        {"metadata": {"name": "g0-m1"}, "spec": {}},
        {"metadata": {"name": "g1-m0"}, "spec": {"nodeName": "n"}},
        {"metadata": {"name": "other"}, "spec": {"nodeName": "n"}},
    ]
    assert bench.bound_per_group(pods, group_of(2, 2)) == {"g0": 1, "g1": 1}


def test_round_order_interleaves_every_kind(bench: ModuleType) -> None:
    order = bench.round_order(2)
    assert order == [(0, bench.GANG), (0, bench.PLAIN), (0, bench.KUBE_GANG),
                     (1, bench.KUBE_GANG), (1, bench.PLAIN), (1, bench.GANG)]


def entry(pods_per_second: float, groups: dict[str, Any] | None, whole: int = 0) -> dict[str, Any]:
    return {
        "pods": 16,
        "bound": 16,
        "pods_per_second": pods_per_second,
        "groups_per_second": (whole / 2.0) if groups else None,
        "groups": groups,
        "cpu_seconds": {"kube-apiserver": 1.0},
        "kubegpu_threads_cpu_seconds": {"bind": 0.5},
    }


def account_json(bench: ModuleType, whole: int, partial: int, at_once: int) -> dict[str, Any]:
    return bench.GroupAccount(2, whole, partial, 2 - whole - partial, at_once, 0.2, 0.1).as_json()


def test_the_json_headline_is_the_issues_shape_with_medians(bench: ModuleType) -> None:
    summaries = {
        bench.GANG: bench.kind_summary(
            [entry(90.0, account_json(bench, 2, 0, 1), 2), entry(80.0, account_json(bench, 1, 1, 2), 1),
             entry(120.0, account_json(bench, 2, 0, 1), 2)]
        ),
        bench.PLAIN: bench.kind_summary([entry(100.0, None), entry(110.0, None), entry(50.0, None)]),
        bench.KUBE_GANG: bench.kind_summary(
            [entry(60.0, account_json(bench, 2, 0, 3), 2), entry(45.0, account_json(bench, 2, 0, 1), 2)]
        ),
    }
    doc = json.loads(json.dumps(bench.headline(summaries)))
    assert HEADLINE <= set(doc)
    assert doc["gang_pods_per_second"] == 90.0 and doc["plain_pods_per_second"] == 100.0
    assert doc["ratio"] == 0.9 and doc["kube_scheduler_gang_pods_per_second"] == 52.5
    assert doc["ratio_vs_kube_scheduler_gang"] == round(90.0 / 52.5, 3)
    assert (doc["groups"], doc["groups_placed_whole"], doc["partial_groups_seen"]) == (6, 5, 1)
    assert doc["max_partial_groups_at_once"] == 2 and doc["kube_scheduler_max_partial_groups_at_once"] == 3
    assert doc["gang_groups_per_second"] == 1.0 and doc["kube_scheduler_gang_groups_per_second"] == 1.0
    assert doc["targets_met"] == {
        "ratio_at_least_0_8": True,
        "every_group_whole": False,
        "no_partial_group": False,
        "ahead_of_kube_scheduler_gang": True,
    }
    gang = summaries[bench.GANG]
    assert gang["pods_per_second_range"] == [80.0, 120.0] and gang["cpu_seconds"] == {"kube-apiserver": 3.0}


@pytest.mark.apiserver
def test_a_tiny_real_run_prints_the_documented_json() -> None:
    """4 nodes, 3 groups of 8, one round of each kind: every group whole under both schedulers."""
    try:
        find_binaries()
    except BinariesMissing as exc:
        missing_component(str(exc))
    result = subprocess.run(
        [sys.executable, str(BENCH), "--json", "--nodes", "4", "--groups", "3", "--rounds", "1"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    assert HEADLINE <= set(doc)
    assert (doc["groups"], doc["groups_placed_whole"], doc["partial_groups_seen"]) == (3, 3, 0)
    assert (doc["kube_scheduler_groups"], doc["kube_scheduler_groups_placed_whole"]) == (3, 3)
    assert doc["kube_scheduler_partial_groups_seen"] == 0
    assert doc["gang_pods_per_second"] > 0 and doc["plain_pods_per_second"] > 0
    assert doc["kube_scheduler_gang_pods_per_second"] > 0
    assert doc["kube_scheduler"].endswith("v1.37.2")
    for kind in ("kubegpu-gang", "kubegpu-plain", "kube-scheduler-gang"):
        (only,) = doc["detail"][kind]["per_round"]
        assert only["bound"] == only["bound_listed"] == 24
