"""Benchmark: what placement rules (node affinity, pod anti-affinity, spread) cost a decision.

One ``ClusterState`` of ``--nodes`` 8-GPU nodes in 10 zones, each node labelled with its zone and
hostname; ``--pods`` one-GPU pods scheduled with ``schedule_one`` + ``assume`` (the live
scheduler's loop, no I/O), the policy ``bestfit``. Cases, each on a fresh cluster:

- ``no-view``: the simulator's path, no placement view at all (the baseline);
- ``plain``: a placement view kept up to date, pods without rules (what every live decision pays);
- ``node-affinity``: every pod requires ``zone NotIn [z0]``;
- ``anti-affinity``: every pod refuses pods of its app (10 apps) on its host (required);
- ``spread``: every pod spreads its app over the zones (``maxSkew`` 1, DoNotSchedule);
- ``preferred``: preferred pod affinity to its app by zone plus ScheduleAnyway spreading.

Each case starts from cold GPU-set memos (the link matrices built before timing) and runs
``--repeat`` times, interleaved with the other cases; the loop's CPU time is measured (pods per
CPU second: steadier than wall time on a shared machine), and the median is reported with its
ratio to the ``no-view`` median of the same run. Prints a table, then one JSON object
(only the JSON object with ``--json``).

Usage: ``python bench/placement_rules.py [--nodes N] [--pods N] [--repeat N] [--json]``
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.core import (  # noqa: E402
    ClusterState,
    GpuState,
    NodeState,
    Placement,
    PodRequest,
    schedule_one,
    topology,  # noqa: E402
)
from scheduler.core.placement import placement_of  # noqa: E402
from scheduler.core.policies import make_policy  # noqa: E402

ZONE, HOST = "topology.kubernetes.io/zone", "kubernetes.io/hostname"
APPS = 10


def cluster(nodes: int, view: bool) -> ClusterState:
    states = [
        NodeState(
            f"n{i}",
            96_000,
            786_432,
            [GpuState(g, f"n{i}-g{g}") for g in range(8)],
            labels={ZONE: f"z{i % 10}", HOST: f"n{i}"},
        )
        for i in range(nodes)
    ]
    c = ClusterState(states)
    if view:
        c.enable_placement()
    return c


def rules(case: str, app: str) -> dict[str, Any]:
    select = {"matchLabels": {"app": app}}
    if case == "node-affinity":
        term = {"matchExpressions": [{"key": ZONE, "operator": "NotIn", "values": ["z0"]}]}
        return {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            }
        }
    if case == "anti-affinity":
        anti = [{"labelSelector": select, "topologyKey": HOST}]
        return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": anti}}}
    if case == "spread":
        rule = {
            "maxSkew": 1,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": select,
        }
        return {"topologySpreadConstraints": [rule]}
    if case == "preferred":
        weighted = [{"weight": 50, "podAffinityTerm": {"labelSelector": select, "topologyKey": ZONE}}]
        rule = {
            "maxSkew": 1,
            "topologyKey": HOST,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": select,
        }
        return {
            "affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": weighted}},
            "topologySpreadConstraints": [rule],
        }
    return {}


def requests(case: str, pods: int) -> list[PodRequest]:
    out = []
    for k in range(pods):
        app = f"app{k % APPS}"
        doc = {
            "metadata": {"name": f"p{k}", "namespace": "bench", "uid": f"u{k}", "labels": {"app": app}},
            "spec": rules(case, app),
        }
        placement = None if case == "no-view" else placement_of(doc)
        out.append(PodRequest(f"bench/p{k}", uid=f"u{k}", cpu_milli=1000, gpu_count=1, placement=placement))
    return out


def run_case(case: str, nodes: int, pods: int, seed: int) -> dict[str, float]:
    topology._SHARED.clear()  # every case starts with cold GPU-set memos, built before the clock
    c = cluster(nodes, view=case != "no-view")
    for node in c.nodes:
        node.links()
    policy = make_policy("bestfit")
    policy.bind(c, [], random.Random(seed))
    rng = random.Random(seed)
    batch = requests(case, pods)
    placed = 0
    start = time.process_time()  # CPU time of this (single-threaded) loop: steadier on a busy machine
    for pod in batch:
        result = schedule_one(pod, c, policy, rng)
        if isinstance(result, Placement):
            c.assume(result.allocation, pod.placement.facts if pod.placement else None)
            placed += 1
    seconds = time.process_time() - start
    return {"pods_per_cpu_second": pods / seconds, "placed": placed}


CASES = ["no-view", "plain", "node-affinity", "anti-affinity", "spread", "preferred"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.nodes < 1 or args.pods < 1 or args.repeat < 1:
        print("--nodes, --pods and --repeat must be positive", file=sys.stderr)
        return 2
    samples: dict[str, list[float]] = {case: [] for case in CASES}
    placed: dict[str, int] = {}
    for _ in range(args.repeat):  # interleaved, so machine noise hits every case alike
        for case in CASES:
            result = run_case(case, args.nodes, args.pods, args.seed)
            samples[case].append(result["pods_per_cpu_second"])
            placed[case] = int(result["placed"])
    base = statistics.median(samples["no-view"])
    report = {
        "nodes": args.nodes,
        "pods": args.pods,
        "repeat": args.repeat,
        "cases": {
            case: {
                "median_pods_per_cpu_second": round(statistics.median(values), 1),
                "ratio_to_no_view": round(statistics.median(values) / base, 3),
                "placed": placed[case],
            }
            for case, values in samples.items()
        },
    }
    if not args.json:
        print(f"{'case':<15} {'pods/CPU s (median)':>20} {'vs no-view':>11} {'placed':>7}")
        for case, row in report["cases"].items():
            rate, ratio = row["median_pods_per_cpu_second"], row["ratio_to_no_view"]
            print(f"{case:<15} {rate:>20} {ratio:>11} {row['placed']:>7}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
