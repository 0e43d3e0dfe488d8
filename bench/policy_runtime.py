"""Run time of policies side by side on openb traces and mixes (issue 26: the default at most 1.3x FGD).

    OPENB_TRACES=../shared/traces/openb .venv/bin/python bench/policy_runtime.py \\
        [--workloads default,cpu050,multigpu20,gpushare40] [--policies fgd,fgd-reserve] \\
        [--seed 42] [--repeats 3] [--json] [--variants] [--instructions]

One run is the simulator's protocol (``run_once``: the seed's arrival order inflated to 130% of the
GPU capacity, one try per pod), timed in CPU seconds of this process (``time.process_time``, so
other work on the machine slows it less than wall time). Every repeat runs each workload with every
policy, one after the other in this one process, the policy order reversed every other repeat (A B,
B A, ...), so that machine noise falls on all alike. Prints per workload the median run time of each
policy and its ratio to the first policy's median, then the median of those ratios over the
workloads (``--json``: the same as one JSON object). Workloads are bench/simulate_openb.py's: a
shared trace or a mix of bench/openb_mixes.json, or ``builtin`` (the simulator's built-in trace, every
tenth node and pod: small, for a quick check). ``--variants``: bench/placement_variants.py's names are
policies too (registered in this process only).

``--instructions``: instead of seconds, the instructions one run executes, counted by valgrind's
cachegrind (``I refs``, no cache simulation), which other work on the machine does not change: per
workload one child process loads it and stops, and one per policy loads it and runs once; a run's
count is its child's less the load-only child's. Each child runs once without valgrind first, so that
none counts compiling bytecode. Then deterministic (``PYTHONHASHSEED=0``, numpy's BLAS on one thread:
the same count every time, seen), so one repeat. Slow (about 40x a run's time, plus 15 s a
child). Counts are not time: the default's larger tables also miss the cache more
(docs/performance.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduler.core import policies as core_policies  # noqa: E402
from scheduler.sim.protocol import run_once  # noqa: E402
from tests.support.benchscript import bench_module  # noqa: E402


def register_variants() -> None:
    """Make bench/placement_variants.py's names policies (``--variants``), in this process only."""
    variants = bench_module("placement_variants.py", "placement_variants_runtime")
    core_policies.POLICIES.update(variants.VARIANTS)


BUILTIN = "builtin"  # the simulator's built-in trace, every BUILTIN_STEP-th node and pod
BUILTIN_STEP = 10
_I_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


@functools.cache
def _simulate_openb() -> ModuleType:
    """bench/simulate_openb.py, loaded once (its traces and mixes are cached in the module)."""
    return bench_module("simulate_openb.py", "simulate_openb_runtime")


def load(workload: str) -> tuple:
    """(nodes, pods) of ``workload``: ``BUILTIN`` or bench/simulate_openb.py's (a shared trace or a mix)."""
    if workload == BUILTIN:
        from scheduler.sim.trace import DEFAULT_NODES, DEFAULT_PODS, load_nodes, load_pods

        return load_nodes(DEFAULT_NODES)[::BUILTIN_STEP], load_pods(DEFAULT_PODS)[::BUILTIN_STEP]
    return _simulate_openb().load_workload(workload)


def instruction_count(stderr: str) -> int:
    """The ``I refs`` total of cachegrind's summary in ``stderr``; ValueError when there is none."""
    found = _I_REFS.search(stderr)
    if found is None:
        raise ValueError(f"no cachegrind 'I refs' line in: {stderr[-500:]!r}")
    return int(found.group(1).replace(",", ""))


def child_command(workload: str, policy: str, seed: int, variants: bool) -> list[str]:
    """The child that loads ``workload`` and, unless ``policy`` is empty, runs it once with ``seed``."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        workload,
        policy,
        "--seed",
        str(seed),
    ]
    return command + (["--variants"] if variants else [])


def warm_bytecode(workloads: Sequence[str], policies: Sequence[str], seed: int, variants: bool) -> None:
    """Run each child once without valgrind, so that every module it imports has its bytecode cached
    (a child that compiles modules counts the compiling: tens of millions of instructions)."""
    for workload in workloads:
        for policy in policies:
            subprocess.run(child_command(workload, policy, seed, variants), capture_output=True, check=False)


def child_instructions(workload: str, policy: str, seed: int, variants: bool, valgrind: str) -> int:
    """Instructions of a child (under cachegrind) that loads ``workload`` and, unless ``policy`` is
    empty, runs it once with ``seed``."""
    command = [valgrind, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    command += child_command(workload, policy, seed, variants)
    env = {
        **os.environ,
        "PYTHONHASHSEED": "0",
        "PYTHONMALLOC": "malloc",
        # one thread: numpy's OpenBLAS threads spin while they wait, millions of instructions that vary
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{workload} {policy or '(load only)'}: exit {done.returncode}: {done.stderr[-800:]}"
        )
    return instruction_count(done.stderr)


def instructions(
    workloads: Sequence[str], policies: Sequence[str], seed: int, variants: bool, valgrind: str
) -> dict:
    """Per workload, each policy's run in instructions (its child's count less the load-only child's)
    and its ratio to the first policy's; the median ratio per policy over the workloads."""
    warm_bytecode(workloads, policies, seed, variants)
    counts: dict[tuple[str, str], list[float]] = {}
    for workload in workloads:
        base = child_instructions(workload, "", seed, variants, valgrind)
        for policy in policies:
            counts[workload, policy] = [child_instructions(workload, policy, seed, variants, valgrind) - base]
    out = summary(counts, policies)
    for workload in workloads:
        for policy in policies:
            row = out["workloads"][workload][policy]
            row["instructions"] = int(row.pop("median_s"))
            del row["runs"]
    return out


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
    parser.add_argument("--instructions", action="store_true", help="count instructions (cachegrind) instead")
    parser.add_argument("--valgrind", default="valgrind", help="the valgrind executable (--instructions)")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "POLICY"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.variants:
        register_variants()
    if args.child:  # --instructions' child: load, and run once unless the policy is empty
        nodes, pods = load(args.child[0])
        if args.child[1]:
            run_once(nodes, pods, args.child[1], args.seed)
        return 0
    workloads = [w for w in args.workloads.split(",") if w]
    policies = [p for p in args.policies.split(",") if p]
    if args.instructions:
        valgrind = shutil.which(args.valgrind)
        if valgrind is None:
            print(f"--instructions needs valgrind ({args.valgrind!r} not found)", file=sys.stderr)
            return 2
        out = instructions(workloads, policies, args.seed, args.variants, valgrind)
        print(json.dumps(out))
        if not args.json:
            print(f"| workload | {' | '.join(f'{p} instructions (x {policies[0]})' for p in policies)} |")
            print(f"|---|{'---|' * len(policies)}")
            for workload, row in out["workloads"].items():
                cells = " | ".join(
                    f"{row[p]['instructions'] / 1e9:.2f} G ({row[p]['ratio']:.3f}x)" for p in policies
                )
                print(f"| {workload} | {cells} |")
        return 0
    seconds: dict[tuple[str, str], list[float]] = {(w, p): [] for w in workloads for p in policies}
    for repeat in range(args.repeats):
        for workload in workloads:
            nodes, pods = load(workload)
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
