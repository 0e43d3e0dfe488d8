"""bench/policy_runtime.py's summary: medians per workload and policy, ratios to the first policy."""

from __future__ import annotations

import pytest

from scheduler.core import policies as core_policies
from tests.support.benchscript import bench_module


def test_summary_takes_medians_and_ratios_to_the_first_policy() -> None:
    bench = bench_module("policy_runtime.py", "policy_runtime_bench")
    seconds = {
        ("a", "fgd"): [1.0, 3.0, 2.0],
        ("a", "ours"): [3.0, 2.6, 9.0],
        ("b", "fgd"): [2.0, 2.0],
        ("b", "ours"): [2.4, 2.2],
    }
    out = bench.summary(seconds, ["fgd", "ours"])
    assert out["workloads"]["a"]["fgd"] == {"median_s": 2.0, "ratio": 1.0, "runs": 3}
    assert out["workloads"]["a"]["ours"] == {"median_s": 3.0, "ratio": 1.5, "runs": 3}
    assert out["workloads"]["b"]["ours"]["ratio"] == 1.15  # median of 2.4 and 2.2 over 2.0
    assert out["median_ratio"] == {"fgd": 1.0, "ours": 1.325}  # median of 1.5 and 1.15


def test_variants_become_policies_in_this_process_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core_policies, "POLICIES", dict(core_policies.POLICIES))
    bench = bench_module("policy_runtime.py", "policy_runtime_bench")
    assert "guard1ns-need1" not in core_policies.POLICIES  # importing the bench registers nothing
    bench.register_variants()
    assert core_policies.make_policy("guard1ns-need1").name == "fgd-reserve"
