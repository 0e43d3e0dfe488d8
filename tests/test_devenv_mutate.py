"""The mutation runner's report (kubegpu/devenv/mutate.py): mutants counted per module."""

from __future__ import annotations

from kubegpu.devenv.mutate import module_of, per_module


def test_a_mutants_module_is_read_from_its_name() -> None:
    assert module_of("scheduler.live.queue.xǁSchedulingQueueǁupdate__mutmut_3") == "scheduler.live.queue"
    assert module_of("scheduler.live.podspec.x__cpu_memory__mutmut_1") == "scheduler.live.podspec"
    assert module_of("kubegpu.allocation.x_verify__mutmut_12") == "kubegpu.allocation"


def test_the_report_has_one_line_per_module_with_its_statuses() -> None:
    statuses = {
        "killed": ["a.b.x_f__mutmut_1", "a.b.xǁCǁm__mutmut_2", "a.c.x_g__mutmut_1"],
        "survived": ["a.b.x_f__mutmut_3"],
        "no tests": ["a.c.x_h__mutmut_1"],
        "timeout": ["a.c.x_h__mutmut_2"],
    }
    assert per_module(statuses) == [
        "  a.b: 3 mutants, killed 2 (66.7%); survived 1",
        "  a.c: 3 mutants, killed 1 (33.3%); no tests 1, timeout 1",
    ]
