"""Run time of policies side by side on openb traces and mixes (issue 26: the default at most 1.3x FGD).

    OPENB_TRACES=../shared/traces/openb .venv/bin/python bench/policy_runtime.py \\
        [--workloads default,cpu050,multigpu20,gpushare40] [--policies fgd,fgd-reserve] \\
        [--seed 42] [--repeats 3] [--json] [--variants]

One run is the simulator's protocol (``run_once``: the seed's arrival order inflated to 130% of the
GPU capacity, one try per pod), timed in CPU seconds of this process (``time.process_time``, so
other work on the machine slows it less than wall time). Every repeat runs each workload with every
policy, one after the other in this one process, the policy order reversed every other repeat (A B,
B A, ...), so that machine noise falls on all alike. Prints per workload the median run time of each
policy and its ratio to the first policy's median, then the median of those ratios over the
workloads (``--json``: the same as one JSON object). Workloads are bench/simulate_openb.py's: a
shared trace or a mix of bench/openb_mixes.json. ``--variants``: bench/placement_variants.py's names are
policies too (registered in this process only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduler.core import policies as core_policies  # noqa: E402
from scheduler.sim.protocol import run_once  # noqa: E402
from tests.support.benchscript import bench_module  # noqa: E402


def register_variants() -> None:
    """Make bench/placement_variants.py's names policies (``--variants``), in this process only."""
    variants = bench_module("placement_variants.py", "placement_variants_runtime")
    core_policies.POLICIES.update(variants.VARIANTS)


def summary(seconds: Mapping[tuple[str, str], Sequence[float]], policies: Sequence[str]) -> dict:
    """Per workload: each policy's median seconds and its ratio to the first policy's; and per policy
    the median of its ratios over the workloads. ``seconds``: (workload, policy) -> the runs' times."""
    workloads = list(dict.fromkeys(w for w, _ in seconds))
    out: dict = {"workloads": {}, "median_ratio": {}}
    ratios: dict[str, list[float]] = {p: [] for p in policies}
    for workload in workloads:
        medians = {p: statistics.median(seconds[workload, p]) for p in policies}
        base = medians[policies[0]]
        row = {}
        for p in policies:
            ratio = medians[p] / base if base else float("nan")
            ratios[p].append(ratio)
            row[p] = {
                "median_s": round(medians[p], 3),
                "ratio": round(ratio, 3),
                "runs": len(seconds[workload, p]),
            }
        out["workloads"][workload] = row
    out["median_ratio"] = {p: round(statistics.median(r), 3) for p, r in ratios.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="default,cpu050,multigpu20,gpushare40")
    parser.add_argument("--policies", default="fgd,fgd-reserve", help="the first is the reference")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--variants", action="store_true", help="bench/placement_variants.py's names too")
    args = parser.parse_args(argv)
    if args.variants:
        register_variants()
    bench = bench_module("simulate_openb.py", "simulate_openb_runtime")
    workloads = [w for w in args.workloads.split(",") if w]
    policies = [p for p in args.policies.split(",") if p]
    seconds: dict[tuple[str, str], list[float]] = {(w, p): [] for w in workloads for p in policies}
    for repeat in range(args.repeats):
        for workload in workloads:
            nodes, pods = bench.load_workload(workload)
            for policy in policies if repeat % 2 == 0 else policies[::-1]:
                start = time.process_time()
                run_once(nodes, pods, policy, args.seed)
                seconds[workload, policy].append(time.process_time() - start)
                if not args.json:
                    print(
                        f"repeat {repeat}: {workload} {policy} {seconds[workload, policy][-1]:.3f} s",
                        flush=True,
                    )
    out = summary(seconds, policies)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"| workload | {' | '.join(f'{p} s (x {policies[0]})' for p in policies)} |")
    print(f"|---|{'---|' * len(policies)}")
    for workload, row in out["workloads"].items():
        cells = " | ".join(f"{row[p]['median_s']:.2f} ({row[p]['ratio']:.2f}x)" for p in policies)
        print(f"| {workload} | {cells} |")
    print(
        "median ratio over the workloads: "
        + ", ".join(f"{p} {r:.2f}x" for p, r in out["median_ratio"].items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
