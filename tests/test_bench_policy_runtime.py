"""bench/policy_runtime.py: its summary (medians per workload and policy, ratios to the first policy) and
its instruction counts under the real valgrind."""

from __future__ import annotations

import pytest

from scheduler.core import policies as core_policies
from tests.fixtures.common import require_executable
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


@pytest.fixture
def valgrind() -> str:
    """The real valgrind (apt's, ``make deps``)."""
    return require_executable("valgrind")


def test_instruction_count_reads_cachegrinds_summary_and_refuses_output_without_it() -> None:
    bench = bench_module("policy_runtime.py", "policy_runtime_bench")
    stderr = "==7== Cachegrind, a high-precision tracing profiler\n==7== I   refs:      2,457,945,113\n"
    assert bench.instruction_count(stderr) == 2_457_945_113
    with pytest.raises(ValueError, match="no cachegrind"):
        bench.instruction_count("==7== ERROR SUMMARY: 0 errors\n")


def test_instructions_are_each_childs_count_less_the_load_only_childs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bench = bench_module("policy_runtime.py", "policy_runtime_bench")
    counts = {
        ("a", ""): 100,
        ("a", "fgd"): 300,
        ("a", "ours"): 350,
        ("b", ""): 10,
        ("b", "fgd"): 110,
        ("b", "ours"): 140,
    }
    monkeypatch.setattr(bench, "child_instructions", lambda w, p, seed, variants, valgrind: counts[w, p])
    monkeypatch.setattr(bench, "warm_bytecode", lambda *args: None)
    out = bench.instructions(["a", "b"], ["fgd", "ours"], 42, False, "valgrind")
    assert out["workloads"]["a"] == {
        "fgd": {"ratio": 1.0, "instructions": 200},
        "ours": {"ratio": 1.25, "instructions": 250},
    }
    assert out["workloads"]["b"]["ours"] == {"ratio": 1.3, "instructions": 130}
    assert out["median_ratio"] == {"fgd": 1.0, "ours": 1.275}


def test_instructions_of_one_run_twice_agree_and_a_run_costs_some(valgrind: str) -> None:
    """The real valgrind (apt's, ``make deps``): the same run counted twice gives the same count (seen:
    to the instruction; a run of the small built-in sample is about 30 million, one on an openb trace
    7 to 9 billion), and a run counts instructions beyond the load-only child's."""
    bench = bench_module("policy_runtime.py", "policy_runtime_bench")
    bench.warm_bytecode([bench.BUILTIN], ["fgd"], 42, False)
    base = bench.child_instructions(bench.BUILTIN, "", 42, False, valgrind)
    first = bench.child_instructions(bench.BUILTIN, "fgd", 42, False, valgrind)
    second = bench.child_instructions(bench.BUILTIN, "fgd", 42, False, valgrind)
    assert first - base > 1_000_000  # a run of a few hundred pods on a hundred nodes
    assert abs(first - second) < 10_000


def test_instructions_name_the_child_that_failed(valgrind: str) -> None:
    bench = bench_module("policy_runtime.py", "policy_runtime_bench")
    with pytest.raises(RuntimeError, match="no-such-policy"):
        bench.instructions([bench.BUILTIN], ["no-such-policy"], 42, False, valgrind)
